// Clean interruption (interrupt.hpp): a sigwait() thread instead of a signal handler, so that the
// clean-up may use the file system library and stdio.
#include "golden/interrupt.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

namespace moecheck::interrupt {

namespace {

struct Registry {
  std::mutex m;
  std::map<uint64_t, std::string> paths;  // registration order
  std::map<uint64_t, int> groups;         // process groups of spawned children (ChildGroup)
  uint64_t next = 1;
  std::string stage;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the watcher may use it during exit
  return *r;
}

[[noreturn]] void clean_up_and_exit(int sig) {
  Registry& r = registry();
  r.m.lock();  // held until _Exit: nothing is registered after the clean-up
  std::string removed;
  // Children first, so that none of them writes into a scratch path after it is removed.
  for (const auto& [id, pgid] : r.groups) {
    if (::kill(-pgid, SIGKILL) != 0) continue;  // already gone
    removed += "  killed the process group " + std::to_string(pgid) + " (a backend command)\n";
    int status = 0;
    ::waitpid(pgid, &status, 0);  // the leader gone: its writes are over (returns at once when already reaped)
  }
  for (auto it = r.paths.rbegin(); it != r.paths.rend(); ++it) {
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(it->second, ec))) continue;
    std::filesystem::remove_all(it->second, ec);
    removed += "  removed " + it->second + (ec ? " (failed: " + ec.message() + ")" : "") + "\n";
  }
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  const std::string where = r.stage.empty() ? "" : " during " + r.stage;
  std::fflush(stdout);
  std::fprintf(stderr, "\nmoecheck: interrupted by %s%s; exit %d\n%s", name, where.c_str(), 128 + sig,
               removed.empty() ? "  no temporary files to remove\n" : removed.c_str());
  std::fflush(stderr);
  std::_Exit(128 + sig);
}

}  // namespace

void install() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;  // keep the default action
  registry();
  std::thread([set] {
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    clean_up_and_exit(sig);
  }).detach();
}

ScratchPath::ScratchPath(std::string path) : path_(std::move(path)) {
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.m);
  id_ = r.next++;
  r.paths.emplace(id_, path_);
}

ScratchPath::~ScratchPath() { release(); }

void ScratchPath::release() {
  if (!id_) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.m);
  r.paths.erase(id_);
  id_ = 0;
}

void ChildGroup::lock() { registry().m.lock(); }

void ChildGroup::unlock(int pid) {
  Registry& r = registry();
  if (pid > 0) {
    id_ = r.next++;
    r.groups.emplace(id_, pid);
  }
  r.m.unlock();
}

void ChildGroup::release() {
  if (!id_) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.m);
  r.groups.erase(id_);
  id_ = 0;
}

void set_stage(std::string where) {
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.m);
  r.stage = std::move(where);
}

}  // namespace moecheck::interrupt
