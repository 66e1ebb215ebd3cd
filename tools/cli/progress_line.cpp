// The progress line (contract: progress_line.hpp).
#include "tools/cli/progress_line.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace moecheck::cli {

Progress::Progress(bool enabled, std::string label)
    : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), label_(std::move(label)), t0_(std::chrono::steady_clock::now()) {
  if (enabled_) ticker_ = std::thread([this] { tick(); });
}

void Progress::update(int64_t done, int64_t total, int64_t failed, const std::string& what) {
  std::lock_guard<std::mutex> l(m_);
  done_ = done, total_ = total, failed_ = failed, what_ = what;
  if (enabled_ && tty_) draw_locked();
}

void Progress::say(const std::string& line) {
  std::lock_guard<std::mutex> l(m_);
  if (enabled_ && tty_) std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  std::cout << line << std::endl;
  if (enabled_ && tty_) draw_locked();
}

void Progress::stop() {
  {
    std::lock_guard<std::mutex> l(m_);
    if (stopped_) return;
    stopped_ = true;
  }
  cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  if (enabled_ && tty_) std::fputs("\r\033[K", stderr);
}

void Progress::draw_locked() {
  const std::string total = total_ > 0 ? fmt::format("/{}", total_) : "";
  std::fprintf(stderr, "%s%s: case %lld%s, %.1f s, %lld failed%s%s%s", tty_ ? "\r\033[K" : "", label_.c_str(),
               static_cast<long long>(done_), total.c_str(), seconds(), static_cast<long long>(failed_),
               what_.empty() ? "" : "  ", tty_ ? what_.substr(0, 60).c_str() : what_.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

void Progress::tick() {
  std::unique_lock<std::mutex> l(m_);
  while (!stopped_) {
    cv_.wait_for(l, std::chrono::seconds(tty_ ? 1 : 10));
    if (!stopped_ && done_ + failed_ >= 0) draw_locked();
  }
}

}  // namespace moecheck::cli
