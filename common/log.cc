#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace kvf::log {

bool setLevel(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (parsed == spdlog::level::off && level != "off") return false;
  spdlog::set_level(parsed);
  return true;
}

void init(std::string_view process_name, std::string_view level) {
  spdlog::drop(std::string(process_name));
  auto logger = spdlog::stderr_color_mt(std::string(process_name));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n %v");
  spdlog::set_default_logger(logger);
  setLevel(level);
}

bool RateLimitedLog::admit(uint64_t* suppressed) {
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now < next || !next_ns_.compare_exchange_strong(next, now + interval_ns_)) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

}  // namespace kvf::log
