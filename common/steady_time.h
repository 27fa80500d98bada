// Steady-clock time for Asio code: now in nanoseconds, the steady_timer time point of such a
// value, and the completion token that makes timer waits return their error as a value. Shared by
// the servers that mix modelled deadlines with Asio timers. Header-only; any thread.
#pragma once

#include <chrono>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/clock.h"

namespace kvf {

using Steady = std::chrono::steady_clock;

// co_await timer.async_wait(kAwait): a cancelled wait is an error value, not an exception.
inline constexpr auto kAwait = boost::asio::as_tuple(boost::asio::use_awaitable);

inline Nanos steadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now().time_since_epoch())
      .count();
}

inline Steady::time_point toTimePoint(Nanos steady) {
  return Steady::time_point(
      std::chrono::duration_cast<Steady::duration>(std::chrono::nanoseconds(steady)));
}

}  // namespace kvf
