// Clock interface so time-driven cores (engine scheduler, policies with TTLs) run both live
// and in virtual time. Time is nanoseconds on a monotonic axis with an arbitrary origin.
// SteadyClock is thread-safe; ManualClock is for tests and simulation (single-threaded).
#pragma once

#include <chrono>
#include <cstdint>

namespace kvf {

using Nanos = int64_t;

inline constexpr Nanos kNanosPerMicro = 1000;
inline constexpr Nanos kNanosPerMilli = 1000 * 1000;
inline constexpr Nanos kNanosPerSecond = 1000 * 1000 * 1000;

inline constexpr Nanos secondsToNanos(double s) { return static_cast<Nanos>(s * 1e9); }
inline constexpr double nanosToSeconds(Nanos n) { return static_cast<double>(n) * 1e-9; }
// std::llround(s * 1e9): the nearest nanosecond, halves away from zero, without the library
// call (a simulator's step-duration hot path). Equal to llround for every finite value in
// range: below 2^53 the part after truncation is exact, and above it the value is integral.
inline constexpr Nanos secondsToNanosRounded(double s) {
  double x = s * 1e9;
  auto whole = static_cast<Nanos>(x);
  double frac = x - static_cast<double>(whole);
  return frac >= 0.5 ? whole + 1 : (frac <= -0.5 ? whole - 1 : whole);
}

class Clock {
 public:
  virtual ~Clock() = default;
  // Current time; never decreases.
  virtual Nanos now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  Nanos now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(Nanos start = 0) : now_(start) {}
  Nanos now() const override { return now_; }
  void advance(Nanos delta) { now_ += delta; }
  void set(Nanos t) {
    if (t > now_) now_ = t;
  }

 private:
  Nanos now_;
};

}  // namespace kvf
