// A small work queue for the reference's per-expert passes: jobs 0..n-1 taken in order by up to
// `threads` threads, each thread with its own scratch state; the first exception stops the jobs
// not yet started and is rethrown to the caller once every thread has finished.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace moecheck {

// job(i, scratch) for i in [0, n); Scratch is default-constructed once per thread.
template <class Scratch, class Job>
void parallel_jobs(size_t n, int threads, Job&& job) {
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    Scratch s;
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        job(i, s);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t count = std::min<size_t>(size_t(std::max(threads, 1)), std::max<size_t>(n, 1));
  for (size_t i = 1; i < count; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace moecheck
