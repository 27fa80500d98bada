// A client for etcd's v3 API through its JSON gateway (POST /v3/kv/*, /v3/lease/*, /v3/watch)
// on the project's HTTP client (Boost.Beast). Debian packages no C++ etcd client, and the
// gateway is served by every etcd >= 3.4 on its client port, so no gRPC stack is needed.
// Calls go to one endpoint at a time; a transport failure or an "unavailable" answer moves to
// the next endpoint and retries there once per endpoint. Every call is bounded by the request
// timeout and every response by a size limit. Threading: an EtcdClient and its WatchStreams
// are used from one executor (the one given to create()).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http.h"
#include "membership/etcd_codec.h"

namespace kvf::http {
class HttpClient;
class ResponseStream;
}  // namespace kvf::http

namespace kvf::membership {

struct EtcdClientOptions {
  std::vector<std::string> endpoints;  // http://host:port, tried in order
  std::chrono::milliseconds request_timeout{2000};
  size_t max_response_bytes = 16u << 20;
  size_t max_watch_message_bytes = 4u << 20;
};

struct HostPort {
  std::string host;  // an IPv6 literal without its brackets
  uint16_t port = 0;
};

// Parses "http://host:port" (no path, query or user info; https is not supported);
// InvalidArgument naming the URL otherwise.
absl::StatusOr<HostPort> parseHostPortUrl(std::string_view url);
absl::Status validateEndpoint(std::string_view endpoint);

// One open watch. Messages arrive in revision order; destroying it closes the connection.
class WatchStream {
 public:
  ~WatchStream();
  // The next message. Unavailable / DeadlineExceeded when the stream broke or stayed silent past
  // `idle_timeout`; InvalidArgument for a malformed message; Cancelled after cancel().
  asio::awaitable<absl::StatusOr<WatchMessage>> next();
  // Closes the connection; a pending next() completes with an error.
  void cancel();
  const std::string& endpoint() const { return endpoint_; }

 private:
  friend class EtcdClient;
  WatchStream(std::unique_ptr<http::ResponseStream> stream, std::string endpoint,
              size_t max_message_bytes);

  std::unique_ptr<http::ResponseStream> stream_;
  std::string endpoint_;
  LineSplitter lines_;
};

class EtcdClient {
 public:
  static absl::StatusOr<std::shared_ptr<EtcdClient>> create(asio::any_io_executor executor,
                                                            EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  asio::awaitable<absl::StatusOr<ResponseHeader>> put(std::string key, std::string value,
                                                      int64_t lease);
  // Keys in [key, range_end) (range_end empty: the key alone) at `revision` (0: latest), at most
  // `limit` (0: all).
  asio::awaitable<absl::StatusOr<RangeResult>> range(std::string key, std::string range_end,
                                                     int64_t limit, int64_t revision);
  asio::awaitable<absl::StatusOr<ResponseHeader>> deleteRange(std::string key,
                                                              std::string range_end);
  asio::awaitable<absl::StatusOr<LeaseGrantResult>> leaseGrant(int64_t ttl_seconds);
  // ttl 0 in the result: the lease is gone (expired or revoked).
  asio::awaitable<absl::StatusOr<LeaseKeepAliveResult>> leaseKeepAlive(int64_t id);
  // OK also when the lease was already gone.
  asio::awaitable<absl::Status> leaseRevoke(int64_t id);
  // Opens a watch on [key, range_end) from `start_revision` (with progress notifications);
  // returns once the gateway answered with the stream's headers. Its first message is normally
  // "created"; a compacted start_revision answers "canceled" instead. `idle_timeout` bounds the
  // silence between messages.
  asio::awaitable<absl::StatusOr<std::unique_ptr<WatchStream>>> watch(
      std::string key, std::string range_end, int64_t start_revision,
      std::chrono::milliseconds idle_timeout);

  // The endpoint the next call goes to first.
  const std::string& endpoint() const { return endpoints_[current_].url; }

 private:
  struct Endpoint {
    std::string url;
    std::shared_ptr<http::HttpClient> http;
  };
  EtcdClient(EtcdClientOptions options, std::vector<Endpoint> endpoints);
  // POSTs `body` to `path`, moving on to the next endpoint after a transport failure or an
  // Unavailable answer; the 200 response's body, or the error the last endpoint gave.
  asio::awaitable<absl::StatusOr<std::string>> call(std::string_view path, std::string body);
  void rotate() { current_ = (current_ + 1) % endpoints_.size(); }

  EtcdClientOptions options_;
  std::vector<Endpoint> endpoints_;
  size_t current_ = 0;
};

}  // namespace kvf::membership
