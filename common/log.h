// Logging on spdlog with `key=value` context: kvf::log::info("upstream failed", "instance", id).
// Arguments after the message come in key/value pairs. Safe from any thread; spdlog's default
// logger writes to stderr. RateLimitedLog makes a degraded path log once per interval.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

namespace kvf::log {

// Sets the global level from a name ("trace", "debug", "info", "warn", "error", "off").
// Returns false if the name is unknown.
bool setLevel(std::string_view level);

// Configures the default logger: pattern with timestamp and level, named process tag.
void init(std::string_view process_name, std::string_view level = "info");

namespace detail {

template <class V>
void appendValue(std::string& out, const V& value) {
  if constexpr (std::is_convertible_v<const V&, std::string_view>) {
    std::string_view s = value;
    bool quote = s.empty() || s.find_first_of(" =\"") != std::string_view::npos;
    if (quote) {
      out.push_back('"');
      for (char c : s) {
        if (c == '"' || c == '\\') out.push_back('\\');
        out.push_back(c);
      }
      out.push_back('"');
    } else {
      out.append(s);
    }
  } else {
    fmt::format_to(std::back_inserter(out), "{}", value);
  }
}

inline void appendPairs(std::string&) {}

template <class K, class V, class... Rest>
void appendPairs(std::string& out, const K& key, const V& value, const Rest&... rest) {
  static_assert(sizeof...(Rest) % 2 == 0, "log context comes in key/value pairs");
  out.push_back(' ');
  out.append(std::string_view(key));
  out.push_back('=');
  appendValue(out, value);
  appendPairs(out, rest...);
}

template <class... KV>
void write(spdlog::level::level_enum level, std::string_view message, const KV&... kv) {
  if (!spdlog::should_log(level)) return;
  std::string line(message);
  appendPairs(line, kv...);
  spdlog::log(level, "{}", line);
}

}  // namespace detail

template <class... KV>
void debug(std::string_view m, const KV&... kv) {
  detail::write(spdlog::level::debug, m, kv...);
}
template <class... KV>
void info(std::string_view m, const KV&... kv) {
  detail::write(spdlog::level::info, m, kv...);
}
template <class... KV>
void warn(std::string_view m, const KV&... kv) {
  detail::write(spdlog::level::warn, m, kv...);
}
template <class... KV>
void error(std::string_view m, const KV&... kv) {
  detail::write(spdlog::level::err, m, kv...);
}

// Logs at most once per interval (the rest are counted and reported with the next line).
// One instance per degraded path; thread-safe.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(std::chrono::milliseconds interval = std::chrono::seconds(5))
      : interval_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(interval).count()) {}

  template <class... KV>
  void warn(std::string_view m, const KV&... kv) {
    uint64_t suppressed = 0;
    if (!admit(&suppressed)) return;
    if (suppressed > 0) {
      detail::write(spdlog::level::warn, m, kv..., "suppressed", suppressed);
    } else {
      detail::write(spdlog::level::warn, m, kv...);
    }
  }

 private:
  bool admit(uint64_t* suppressed);

  int64_t interval_ns_;
  std::atomic<int64_t> next_ns_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace kvf::log
