// Test helpers for multi-process tests that talk HTTP to their children: one blocking request
// through an HttpClient on an IoThread, and the port a kvf-router child logged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/http_client.h"
#include "common/process.h"
#include "tests/testing/child_process.h"
#include "tests/testing/io_thread.h"

namespace kvf::testing {

// Sends one request on `io` and waits for the whole response (IoThread::run's deadline).
inline absl::StatusOr<http::Response> httpCall(IoThread& io, http::HttpClient& client,
                                               std::string method, std::string target,
                                               std::string body = "", http::Headers headers = {}) {
  http::ClientRequest r;
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.headers = std::move(headers);
  return io.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
    co_return co_await client.request(r);
  });
}

// The port in a kvf-router child's "listening on port N" log line; nullopt before it.
inline std::optional<uint16_t> routerPort(const Process& router) {
  static const std::string kMarker = "listening on port ";
  std::string log = readLog(router);
  size_t at = log.find(kMarker);
  if (at == std::string::npos) return std::nullopt;
  return static_cast<uint16_t>(std::stoi(log.substr(at + kMarker.size())));
}

}  // namespace kvf::testing
