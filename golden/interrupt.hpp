// Clean interruption. SIGINT and SIGTERM are taken by one watcher thread (not an asynchronous
// handler), which removes every registered scratch path (temporaries of atomic writes, the gate's
// work directory, shrink candidates), prints where the run stopped and ends the process with
// 128 + signal: 130 for SIGINT, 143 for SIGTERM.
//
// Contract: install() runs first in main, before any thread starts, because the signals are
// blocked in the calling thread and every thread inherits that mask. A scratch path is registered
// before it is created and released once it is no longer scratch (renamed into place, or removed
// by its owner). The watcher holds the registry's lock until the process ends, so a path cannot
// be registered after the clean-up; a file created between its registration and the signal is
// removed, one created after the clean-up cannot be (the process ends within microseconds).
// A child process inherits the blocked mask across exec: whoever spawns one must unblock SIGINT
// and SIGTERM in the child before exec (and register what the child writes, or kill it).
// ChildGroup does the latter: a child spawned into a process group of its own is registered
// while it is spawned, and the group is sent SIGKILL on interruption before the scratch paths
// are removed (so nothing of it writes into them afterwards).
#pragma once

#include <cstdint>
#include <string>

namespace moecheck::interrupt {

void install();

// RAII: `path` (a file, or a directory removed with its contents) is removed on interruption
// while this object lives and has not been released.
class ScratchPath {
 public:
  explicit ScratchPath(std::string path);
  ~ScratchPath();
  ScratchPath(const ScratchPath&) = delete;
  ScratchPath& operator=(const ScratchPath&) = delete;
  void release();  // no longer scratch: left alone on interruption
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t id_ = 0;
};

// RAII: spawn() (which starts a child as the leader of a new process group and returns its
// pid, or -1) runs with the registry locked, so an interruption either comes before the child
// exists or finds it registered; the group -pid is sent SIGKILL on interruption while this
// object lives and has not been released.
class ChildGroup {
 public:
  template <class Spawn>
  explicit ChildGroup(Spawn&& spawn) {
    lock();
    try {
      pid_ = spawn();
    } catch (...) {
      unlock(-1);
      throw;
    }
    unlock(pid_);
  }
  ~ChildGroup() { release(); }
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  void release();
  int pid() const { return pid_; }

 private:
  void lock();
  void unlock(int pid);  // registers pid (> 0) and unlocks
  int pid_ = -1;
  uint64_t id_ = 0;
};

// What the run is doing, for the interruption message ("gate: case 17 of 800").
void set_stage(std::string where);

}  // namespace moecheck::interrupt
