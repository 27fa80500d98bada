// kvf-register: registers one engine instance (e.g. a stock vLLM) in etcd under a lease and
// keeps the lease alive, so routers watching the prefix admit it, and drop it when this process
// dies (the lease runs out) or stops (SIGTERM revokes the lease at once). Optionally registers
// only once the instance's /health answers, and withdraws while it keeps failing.
#include <csignal>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/cli.h"
#include "common/http_client.h"
#include "common/log.h"
#include "common/strings.h"
#include "membership/lease_registration.h"
#include "membership/membership_config.h"

ABSL_FLAG(std::string, etcd_endpoints, "",
          "Comma-separated etcd client URLs, http://host:port (the v3 JSON gateway on etcd's "
          "client port). Required.");
ABSL_FLAG(std::string, prefix, std::string(kvf::membership::kDefaultPrefix),
          "Key prefix the routers watch; the instance is registered at <prefix><id>.");
ABSL_FLAG(int64_t, lease_ttl_s, 10,
          "Lease time to live in seconds (2-3600): how long a dead registrant stays listed.");
ABSL_FLAG(double, request_timeout_s, 2, "Timeout of each call to etcd, in seconds.");
ABSL_FLAG(std::string, id, "",
          "Instance id (letters, digits, . _ : -; at most 128 bytes), unique among the "
          "instances under the prefix. Required.");
ABSL_FLAG(std::string, url, "",
          "The instance's OpenAI-compatible server as routers reach it, http://host:port. "
          "Required.");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "The instance's KV-event ZMQ PUB endpoint as routers connect to it, e.g. "
          "tcp://10.0.0.5:5557 (vLLM's --kv-events-config endpoint); empty: none.");
ABSL_FLAG(std::string, kv_replay_endpoint, "",
          "The instance's KV-event replay (ZMQ ROUTER) endpoint; empty: none.");
ABSL_FLAG(std::string, kv_topic, "",
          "KV-event topic the instance publishes on (vLLM's default is the empty topic; "
          "leave empty to use the router's default).");
ABSL_FLAG(std::string, worker_url, "",
          "The instance's kvfabric worker control server (http://host:port) for KV push; "
          "empty: none.");
ABSL_FLAG(bool, wait_healthy, true,
          "Register only once GET <url>/health answers 200 (checked every "
          "--health_interval_s).");
ABSL_FLAG(double, health_interval_s, 1, "Seconds between health checks.");
ABSL_FLAG(int, deregister_after_failures, 0,
          "With --wait_healthy: revoke the registration after this many consecutive failed "
          "health checks, and register again once the instance is healthy; 0: never withdraw.");
ABSL_FLAG(std::string, log_level, "info", "Log level: trace, debug, info, warn, error, off.");

namespace kvf::membership {
namespace {

namespace asio = boost::asio;

struct Options {
  EtcdConfig etcd;
  InstanceRecord record;
  bool wait_healthy = true;
  std::chrono::milliseconds health_interval{1000};
  int deregister_after = 0;
};

// Every problem with the flags, one per line; empty when they are fine.
std::string readFlags(Options* o) {
  std::vector<std::string> problems;
  for (absl::string_view e :
       absl::StrSplit(absl::GetFlag(FLAGS_etcd_endpoints), ',', absl::SkipWhitespace())) {
    o->etcd.endpoints.emplace_back(e.data(), e.size());
    absl::Status s = validateEndpoint(o->etcd.endpoints.back());
    if (!s.ok()) problems.push_back("--etcd_endpoints: " + std::string(s.message()));
  }
  if (o->etcd.endpoints.empty()) problems.push_back("--etcd_endpoints is required");
  o->etcd.prefix = absl::GetFlag(FLAGS_prefix);
  if (o->etcd.prefix.empty()) problems.push_back("--prefix must not be empty");
  o->etcd.lease_ttl_s = absl::GetFlag(FLAGS_lease_ttl_s);
  if (o->etcd.lease_ttl_s < 2 || o->etcd.lease_ttl_s > 3600) {
    problems.push_back("--lease_ttl_s must be in [2, 3600]");
  }
  o->etcd.request_timeout_s = absl::GetFlag(FLAGS_request_timeout_s);
  if (!(o->etcd.request_timeout_s >= 0.01 && o->etcd.request_timeout_s <= 600)) {
    problems.push_back("--request_timeout_s must be in [0.01, 600]");
  }
  InstanceRecord& r = o->record;
  r.id = absl::GetFlag(FLAGS_id);
  if (absl::Status s = validateInstanceId(r.id); !s.ok()) {
    problems.push_back("--id: " + std::string(s.message()));
  }
  r.url = absl::GetFlag(FLAGS_url);
  if (absl::Status s = validateEndpoint(r.url); !s.ok()) {
    problems.push_back("--url: must be http://host:port (" + std::string(s.message()) + ")");
  }
  r.kv_events_endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  r.kv_replay_endpoint = absl::GetFlag(FLAGS_kv_replay_endpoint);
  r.kv_topic = absl::GetFlag(FLAGS_kv_topic);
  if (r.kv_events_endpoint.empty() && !r.kv_replay_endpoint.empty()) {
    problems.push_back("--kv_replay_endpoint needs --kv_events_endpoint");
  }
  r.worker_url = absl::GetFlag(FLAGS_worker_url);
  if (!r.worker_url.empty()) {
    if (absl::Status s = validateEndpoint(r.worker_url); !s.ok()) {
      problems.push_back("--worker_url: must be http://host:port");
    }
  }
  o->wait_healthy = absl::GetFlag(FLAGS_wait_healthy);
  double interval = absl::GetFlag(FLAGS_health_interval_s);
  if (!(interval >= 0.01 && interval <= 3600)) {
    problems.push_back("--health_interval_s must be in [0.01, 3600]");
  }
  o->health_interval = std::chrono::milliseconds(static_cast<int64_t>(interval * 1000));
  o->deregister_after = absl::GetFlag(FLAGS_deregister_after_failures);
  if (o->deregister_after < 0) problems.push_back("--deregister_after_failures must be >= 0");
  if (o->deregister_after > 0 && !o->wait_healthy) {
    problems.push_back("--deregister_after_failures needs --wait_healthy");
  }
  return strJoin(problems, "; ");
}

class Registrant {
 public:
  Registrant(asio::io_context& ioc, Options options, std::shared_ptr<EtcdClient> etcd,
             std::shared_ptr<http::HttpClient> instance)
      : ioc_(ioc),
        options_(std::move(options)),
        etcd_(std::move(etcd)),
        instance_(std::move(instance)),
        timer_(ioc) {}

  asio::awaitable<void> run() {
    int failures = 0;
    bool ever_checked = false;
    while (!stopping_) {
      if (!options_.wait_healthy) {
        if (!registration_) startRegistration();
        co_return;
      }
      bool healthy = co_await healthCheck();
      if (stopping_) co_return;
      failures = healthy ? 0 : failures + 1;
      if (healthy && !registration_) {
        log::info("instance healthy; registering", "id", options_.record.id, "url",
                  options_.record.url);
        startRegistration();
      } else if (!healthy && !registration_ && !ever_checked) {
        log::info("waiting for the instance's /health", "url", options_.record.url);
      } else if (!healthy && registration_ && options_.deregister_after > 0 &&
                 failures >= options_.deregister_after) {
        log::warn("instance unhealthy; withdrawing its registration", "id", options_.record.id,
                  "failures", failures);
        auto registration = std::move(registration_);
        co_await registration->stop();
      }
      ever_checked = true;
      timer_.expires_after(options_.health_interval);
      co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }

  // Revokes the lease, then stops the io_context.
  asio::awaitable<void> shutdown() {
    stopping_ = true;
    timer_.cancel();
    if (registration_) {
      auto registration = std::move(registration_);
      co_await registration->stop();
    }
    ioc_.stop();
  }

 private:
  void startRegistration() {
    RegistrationOptions r;
    r.key = instanceKey(options_.etcd.prefix, options_.record.id);
    r.value = encodeInstanceRecord(options_.record);
    r.lease_ttl_s = options_.etcd.lease_ttl_s;
    registration_ = LeaseRegistration::create(ioc_.get_executor(), etcd_, std::move(r));
    registration_->start();
  }

  asio::awaitable<bool> healthCheck() {
    http::ClientRequest check;
    check.method = "GET";
    check.target = "/health";
    check.read_timeout = options_.health_interval;
    auto response = co_await instance_->request(std::move(check));
    co_return response.ok() && response->status == 200;
  }

  asio::io_context& ioc_;
  Options options_;
  std::shared_ptr<EtcdClient> etcd_;
  std::shared_ptr<http::HttpClient> instance_;
  asio::steady_timer timer_;
  std::shared_ptr<LeaseRegistration> registration_;
  bool stopping_ = false;
};

int run() {
  Options options;
  std::string problems = readFlags(&options);
  if (!problems.empty()) cli::failUsage("kvf-register", problems);
  asio::io_context ioc(1);
  auto etcd = EtcdClient::create(ioc.get_executor(), clientOptions(options.etcd));
  auto instance_url = parseHostPortUrl(options.record.url);
  if (!etcd.ok() || !instance_url.ok()) {
    // Both were validated with the flags; a failure here is still a bad command line.
    cli::failUsage("kvf-register",
                   std::string((etcd.ok() ? instance_url.status() : etcd.status()).message()));
  }
  http::ClientOptions http_options;
  http_options.connect_timeout = options.health_interval;
  auto instance = http::HttpClient::create(ioc.get_executor(), instance_url->host,
                                           instance_url->port, http_options);
  Registrant registrant(ioc, std::move(options), *etcd, instance);
  asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (ec) return;
    log::info("shutting down: revoking the lease");
    asio::co_spawn(ioc, registrant.shutdown(), asio::detached);
  });
  asio::co_spawn(ioc, registrant.run(), asio::detached);
  ioc.run();
  return 0;
}

}  // namespace
}  // namespace kvf::membership

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-register: registers an engine instance (e.g. a stock vLLM) in etcd under a lease\n"
      "and keeps it alive, so kvf-router instances with `membership: {source: etcd}` admit it\n"
      "(after their first health check) and drop it when the lease ends\n"
      "(docs/configuration.md, \"Membership in etcd\").\n\n"
      "Usage: kvf-register --etcd_endpoints http://127.0.0.1:2379 --id vllm-0 \\\n"
      "         --url http://10.0.0.5:8000 [--kv_events_endpoint tcp://10.0.0.5:5557] \\\n"
      "         [--worker_url http://10.0.0.5:9000] [--lease_ttl_s 10]\n\n"
      "SIGINT or SIGTERM revoke the lease and stop it. Exit status: 0 stopped by a signal, 2 a\n"
      "bad command line.");
  if (!args.empty()) {
    kvf::cli::failUsage("kvf-register", "unexpected argument '" + args[0] + "'");
  }
  kvf::log::init("kvf-register", absl::GetFlag(FLAGS_log_level));
  return kvf::membership::run();
}
