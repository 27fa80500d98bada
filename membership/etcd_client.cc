#include "membership/etcd_client.h"

#include <boost/url/parse.hpp>

#include "common/http_client.h"
#include "common/status.h"
#include "common/strings.h"

namespace kvf::membership {
namespace {

// Transport failures and "no leader / not ready" answers are worth trying elsewhere.
bool tryNextEndpoint(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

}  // namespace

absl::StatusOr<HostPort> parseHostPortUrl(std::string_view endpoint) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(strCat("URL \"", endpoint, "\" ", why));
  };
  auto url =
      boost::urls::parse_absolute_uri(boost::core::string_view(endpoint.data(), endpoint.size()));
  if (!url) return bad("is not a URL (want http://host:port)");
  if (url->scheme() != "http") {
    return bad("must use http:// (TLS endpoints are not supported; see docs/router.md)");
  }
  if (!url->has_port() || url->port_number() == 0) return bad("needs a port");
  if (url->host().empty()) return bad("needs a host");
  if (!url->encoded_path().empty() && url->encoded_path() != "/") return bad("must have no path");
  if (url->has_query() || url->has_fragment() || url->has_userinfo()) {
    return bad("must be http://host:port only");
  }
  std::string host(url->encoded_host_address());
  // An IPv6 literal goes to the resolver without its brackets.
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{std::move(host), url->port_number()};
}

absl::Status validateEndpoint(std::string_view endpoint) {
  return parseHostPortUrl(endpoint).status();
}

// ---------------------------------------------------------------------------------------------

WatchStream::WatchStream(std::unique_ptr<http::ResponseStream> stream, std::string endpoint,
                         size_t max_message_bytes)
    : stream_(std::move(stream)), endpoint_(std::move(endpoint)), lines_(max_message_bytes) {}

WatchStream::~WatchStream() = default;

void WatchStream::cancel() { stream_->cancel(); }

asio::awaitable<absl::StatusOr<WatchMessage>> WatchStream::next() {
  for (;;) {
    if (auto line = lines_.next()) co_return decodeWatchMessage(*line);
    auto piece = co_await stream_->next();
    if (!piece.ok()) co_return piece.status();
    if (!piece->has_value()) {
      co_return absl::UnavailableError(strCat("etcd ", endpoint_, " ended the watch stream"));
    }
    KVF_CO_RETURN_IF_ERROR(lines_.feed(**piece));
  }
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<EtcdClient>> EtcdClient::create(asio::any_io_executor executor,
                                                               EtcdClientOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoints");
  std::vector<Endpoint> endpoints;
  for (const std::string& url : options.endpoints) {
    KVF_ASSIGN_OR_RETURN(HostPort hp, parseHostPortUrl(url));
    http::ClientOptions http_options;
    http_options.connect_timeout = options.request_timeout;
    http_options.write_timeout = options.request_timeout;
    http_options.read_timeout = options.request_timeout;
    http_options.max_idle_connections = 4;
    http_options.max_body_bytes = options.max_response_bytes;
    std::string trimmed = url;
    while (!trimmed.empty() && trimmed.back() == '/') trimmed.pop_back();
    endpoints.push_back(
        {trimmed, http::HttpClient::create(executor, hp.host, hp.port, http_options)});
  }
  return std::shared_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(endpoints)));
}

EtcdClient::EtcdClient(EtcdClientOptions options, std::vector<Endpoint> endpoints)
    : options_(std::move(options)), endpoints_(std::move(endpoints)) {}

EtcdClient::~EtcdClient() = default;

asio::awaitable<absl::StatusOr<std::string>> EtcdClient::call(std::string_view path,
                                                              std::string body) {
  absl::Status last;
  for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
    Endpoint& endpoint = endpoints_[current_];
    http::ClientRequest request;
    request.method = "POST";
    request.target = std::string(path);
    request.body = body;
    // Hold the HTTP client: the frame may outlive a rotation.
    std::shared_ptr<http::HttpClient> http = endpoint.http;
    auto response = co_await http->request(std::move(request));
    if (response.ok() && response->status == 200) co_return std::move(response->body);
    last = response.ok() ? decodeError(response->status, response->body)
                         : annotate(response.status(), strCat("etcd ", endpoint.url));
    if (!tryNextEndpoint(last)) co_return last;
    if (!response.ok()) http->closeIdle();
    rotate();
  }
  co_return last;
}

asio::awaitable<absl::StatusOr<ResponseHeader>> EtcdClient::put(std::string key, std::string value,
                                                                int64_t lease) {
  KVF_CO_ASSIGN_OR_RETURN(std::string body,
                          co_await call("/v3/kv/put", encodePut(key, value, lease)));
  co_return decodeHeaderResponse(body);
}

asio::awaitable<absl::StatusOr<RangeResult>> EtcdClient::range(std::string key,
                                                               std::string range_end, int64_t limit,
                                                               int64_t revision) {
  KVF_CO_ASSIGN_OR_RETURN(
      std::string body,
      co_await call("/v3/kv/range", encodeRange(key, range_end, limit, revision)));
  co_return decodeRange(body);
}

asio::awaitable<absl::StatusOr<ResponseHeader>> EtcdClient::deleteRange(std::string key,
                                                                        std::string range_end) {
  KVF_CO_ASSIGN_OR_RETURN(std::string body,
                          co_await call("/v3/kv/deleterange", encodeDeleteRange(key, range_end)));
  co_return decodeHeaderResponse(body);
}

asio::awaitable<absl::StatusOr<LeaseGrantResult>> EtcdClient::leaseGrant(int64_t ttl_seconds) {
  KVF_CO_ASSIGN_OR_RETURN(std::string body,
                          co_await call("/v3/lease/grant", encodeLeaseGrant(ttl_seconds)));
  co_return decodeLeaseGrant(body);
}

asio::awaitable<absl::StatusOr<LeaseKeepAliveResult>> EtcdClient::leaseKeepAlive(int64_t id) {
  KVF_CO_ASSIGN_OR_RETURN(std::string body,
                          co_await call("/v3/lease/keepalive", encodeLeaseId(id)));
  co_return decodeLeaseKeepAlive(body);
}

asio::awaitable<absl::Status> EtcdClient::leaseRevoke(int64_t id) {
  auto body = co_await call("/v3/lease/revoke", encodeLeaseId(id));
  if (absl::IsNotFound(body.status())) co_return absl::OkStatus();
  co_return body.status();
}

asio::awaitable<absl::StatusOr<std::unique_ptr<WatchStream>>> EtcdClient::watch(
    std::string key, std::string range_end, int64_t start_revision,
    std::chrono::milliseconds idle_timeout) {
  std::string body = encodeWatchCreate(key, range_end, start_revision, /*progress_notify=*/true,
                                       /*prev_kv=*/false);
  absl::Status last;
  for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
    Endpoint& endpoint = endpoints_[current_];
    http::ClientRequest request;
    request.method = "POST";
    request.target = "/v3/watch";
    request.body = body;
    request.read_timeout = idle_timeout;
    std::shared_ptr<http::HttpClient> http = endpoint.http;
    auto opened = co_await http->open(std::move(request));
    if (opened.ok() && (*opened)->status() == 200) {
      co_return std::unique_ptr<WatchStream>(
          new WatchStream(std::move(*opened), endpoint.url, options_.max_watch_message_bytes));
    }
    if (opened.ok()) {
      auto error_body = co_await (*opened)->readAll(64 * 1024);
      last = decodeError((*opened)->status(), error_body.ok() ? *error_body : "");
    } else {
      last = annotate(opened.status(), strCat("etcd ", endpoint.url));
      http->closeIdle();
    }
    if (!tryNextEndpoint(last)) co_return last;
    rotate();
  }
  co_return last;
}

}  // namespace kvf::membership
