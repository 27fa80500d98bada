// Test helper: waits for a condition by polling it with a deadline (never a bare sleep). Test
// thread only; `condition` runs on the calling thread.
#pragma once

#include <chrono>
#include <thread>

namespace kvf::testing {

// True as soon as `condition()` is; false once `timeout` passed without it.
template <class F>
bool eventually(F condition, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every = std::chrono::milliseconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(every);
  }
}

}  // namespace kvf::testing
