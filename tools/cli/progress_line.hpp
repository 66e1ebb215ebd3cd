// The progress line of long commands on stderr: redrawn in place at least every second on a
// terminal (a ticker thread, so a slow step still shows elapsed time), plain lines every 10 s
// otherwise; say() prints a line to stdout without tearing it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace moecheck::cli {

class Progress {
 public:
  Progress(bool enabled, std::string label);
  ~Progress() { stop(); }
  void update(int64_t done, int64_t total, int64_t failed, const std::string& what);
  void say(const std::string& line);
  void stop();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  void draw_locked();
  void tick();
  bool enabled_, tty_;
  std::string label_;
  std::chrono::steady_clock::time_point t0_;
  std::mutex m_;
  std::condition_variable cv_;
  std::thread ticker_;
  bool stopped_ = false;
  int64_t done_ = 0, total_ = 0, failed_ = 0;
  std::string what_;
};

}  // namespace moecheck::cli
