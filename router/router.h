// The router: an OpenAI-compatible proxy in front of engine instances, the Asio shell around
// the routing core (router/core/routing_core.h). It parses each request, has the core match it
// against the cache index and pick an instance, forwards the request (streaming passed through
// chunk by chunk), retries connection failures on the next-best instance, runs health checks,
// KV-event subscribers and KV-move orchestration, and reports what happened back to the core.
// Threading: the core and every piece of routing state live on the one io_context thread that
// runs the router; KV-event subscriber threads post their updates to it.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "policy/cache_index.h"
#include "policy/policy.h"
#include "router/core/config.h"
#include "router/core/decision_log.h"
#include "router/core/routing_core.h"
#include "router/kv_transfer.h"
#include "router/request_parse.h"

namespace boost::json {
class object;
}  // namespace boost::json

namespace kvf::http {
class ResponseStream;
}  // namespace kvf::http

namespace zmq {
class context_t;
}  // namespace zmq

namespace kvf::router {

class EtcdMembership;
class ReplicaSync;
struct Instance;
struct KvUpdate;
struct RequestContext;

class Router : public std::enable_shared_from_this<Router> {
 public:
  // Binds the listener, opens the decision log, starts KV-event subscribers and health checks.
  // `clock` must outlive the router. The io_context must be run by exactly one thread.
  static absl::StatusOr<std::shared_ptr<Router>> create(asio::io_context& ioc, RouterConfig config,
                                                        const Clock& clock);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  uint16_t port() const;
  // Stops accepting, health checks and subscribers. Call from the io thread or after it ended.
  void stop();

  metrics::Registry& registry() { return registry_; }
  // Completion requests being handled now (parsed, routed or awaiting their upstream).
  int64_t requestsInFlight() const { return *in_flight_; }
  const policy::CacheIndex& index() const { return core_->index(); }

 private:
  friend class EtcdMembership;  // adds and removes the instances registered in etcd

  Router(asio::io_context& ioc, RouterConfig config, const Clock& clock);
  absl::Status init();
  void registerRoutes();
  // `admit_now` false: the instance takes no requests until a health check passed.
  absl::StatusOr<std::shared_ptr<Instance>> addInstance(const InstanceConfig& config,
                                                        bool admit_now = true);
  void removeInstance(const std::shared_ptr<Instance>& instance);
  std::shared_ptr<Instance> findInstance(std::string_view id) const;

  // Routing and forwarding (proxy.cc).
  asio::awaitable<void> handleCompletion(ApiKind kind, const http::Request& request,
                                         http::ResponseWriter& writer);
  bool decide(RequestContext& ctx);
  // Whether `model` names a LoRA adapter (config lora_adapters).
  bool isLoraAdapter(std::string_view model) const;
  // Overload control: a request the core queues waits here (its coroutine suspended, nothing
  // blocked) until drainQueue() lets it go; false when it was shed (the 429 with Retry-After
  // and an OpenAI-style body is sent).
  asio::awaitable<bool> admit(RequestContext& ctx, http::ResponseWriter& writer);
  // Wakes every queued request the core lets go now: after a first byte, an end, an engine's
  // load report.
  void drainQueue();
  // Replaces a text prompt by the engine's token ids (POST /tokenize); false when unavailable.
  asio::awaitable<bool> tokenize(RequestContext& ctx, const http::Request& request);
  // kRetry: the attempt failed before any byte reached the client (no connection, or its
  // instance stalled); kClientGone: the client left, nothing more is sent.
  enum class ForwardResult { kDone, kRetry, kClientGone };
  asio::awaitable<ForwardResult> forward(RequestContext& ctx, const http::Request& request,
                                         std::optional<std::string> body,
                                         http::ResponseWriter& writer);
  // Passes an SSE response through; its head goes to the client with the first body bytes, so
  // an attempt whose instance stalls before them can still be retried.
  asio::awaitable<ForwardResult> forwardStream(RequestContext& ctx, http::ResponseStream& upstream,
                                               http::ResponseWriter& writer,
                                               const http::Headers& headers);
  // An attempt failed before the client got a byte: counted, retried when the caller may.
  ForwardResult failedBeforeFirstByte(RequestContext& ctx, std::string_view kind,
                                      const absl::Status& error);
  void finishRequest(RequestContext& ctx);
  // The prefill on the chosen instance is over (first bytes arrived, or the attempt ended):
  // its pending prefill tokens and the offload cap are released.
  void endPrefillPhase(RequestContext& ctx);
  // Writes the attempt's predicted entries once the engine has answered (once per attempt),
  // off the client's critical path.
  void predictHeld(RequestContext& ctx);
  // Usage and transfer outcome from an engine response body or SSE event, for the closed loop.
  void applyResponseReport(RequestContext& ctx, std::string_view body);

  // KV push and prefill offload (migration.cc).
  // The body for the decode instance: the client's (its kv_transfer_params stripped), plus
  // {source} for a push-migrate, or P's params once the offload's prefill succeeded.
  // The body to send upstream; nullopt: the client's body as it is (forwarded without a copy).
  asio::awaitable<std::optional<std::string>> upstreamBody(RequestContext& ctx,
                                                           const http::Request& request);
  // The first leg on ctx.peer (the prefill half of an offload; in the NIXL dialect also the
  // holder's leg of a migration); false when D must prefill locally. kvfabric: `params` gets
  // D's params; NIXL (`nixl_params` given): `*nixl_params` gets P's object, unchanged.
  asio::awaitable<bool> remotePrefill(RequestContext& ctx, const http::Request& request,
                                      KvTransferParams* params,
                                      std::optional<boost::json::value>* nixl_params = nullptr);
  // The x-kvf-transfer-auth header for `params` sent with x-request-id `request_id` (""
  // without a worker token: the params go unsigned). The JSON form signs a NIXL leg's object
  // exactly as it is sent.
  std::string signTransfer(const KvTransferParams& params, const std::string& request_id) const;
  std::string signTransfer(const boost::json::value& params, const std::string& request_id) const;
  // Counts the transfer outcome of a finished push-migrate / offload attempt.
  void recordTransferOutcome(const RequestContext& ctx);
  void recordUpstreamFailure(Instance& instance, std::string_view kind);
  void recordUpstreamSuccess(Instance& instance);
  bool admitted(const Instance& instance) const;

  // Stall detection and retry rules (lifecycle.cc). An attempt registers with its instance while it
  // waits on it.
  void beginAttempt(RequestContext& ctx);
  void endAttempt(RequestContext& ctx);
  void noteAlive(Instance& instance);  // a byte, a response head or a health answer came
  asio::awaitable<void> stallWatch(std::shared_ptr<bool> stop);
  // Marks the instance stalled and cancels its attempts in flight.
  void declareStalled(Instance& instance, Nanos now);
  // The client of `ctx` left: cancels what the request waits on (shared by every path).
  void onClientGone(RequestContext& ctx);
  // Whether a failed attempt may be retried: the client is there and the deadline not passed.
  bool mayRetry(const RequestContext& ctx);

  // Health checks (health.cc).
  asio::awaitable<void> healthLoop(std::shared_ptr<Instance> instance);
  // KV events (kv_events.cc).
  void startKvSubscribers(const std::shared_ptr<Instance>& instance);
  // `stream`: the data-parallel rank the update came from.
  void applyKvUpdate(int slot, uint64_t generation, int stream, KvUpdate& update);
  // The instance's index, tiers and groups start empty (re-admission after an ejection).
  void resetKvInstance(Instance& instance, std::string_view reason);
  void setKvState(Instance& instance, size_t state);
  void updateTierGauges(Instance& instance);
  void learnKvCapacity(Instance& instance, std::string_view metrics_body);
  // Once per health interval: silent event stream, unpredicted hits.
  void checkKvEvents(Instance& instance);
  void kvEventsJson(const Instance& instance, boost::json::object* out) const;

  // Admin API and plain endpoints (admin.cc).
  asio::awaitable<void> handleAdmin(const http::Request& request, http::ResponseWriter& writer);
  asio::awaitable<void> handleModels(http::ResponseWriter& writer);
  std::string instancesJson() const;
  // POST /admin/match: what the router predicts each instance would report cached for a
  // completion or chat body, without routing it.
  absl::StatusOr<std::string> matchJson(const http::Request& request);

  void registerInstanceMetrics(const std::shared_ptr<Instance>& instance);
  // kvfabric_router_decisions_total{policy, mode, reason} for `decision`, looked up in the
  // registry once per (mode, reason) and cached: the hot path takes no lock or allocation.
  metrics::Counter& decisionCounter(const policy::Decision& decision);

  asio::io_context& ioc_;
  RouterConfig config_;
  std::string transfer_key_;  // signs kv_transfer_params (protocol/transfer_auth.h)
  const Clock& clock_;
  metrics::Registry registry_;
  std::unique_ptr<http::HttpServer> server_;
  std::unique_ptr<DecisionLog> log_;
  std::unique_ptr<EtcdMembership> membership_;  // membership.source: etcd
  std::shared_ptr<ReplicaSync> replicas_;       // replicas: load exchange with peer routers
  std::shared_ptr<zmq::context_t> zmq_;
  std::unique_ptr<RoutingCore> core_;
  std::vector<std::shared_ptr<Instance>> slots_;  // index = the core's slot
  uint64_t next_generation_ = 1;
  uint64_t next_request_ = 1;
  std::string request_prefix_;  // random per process: request ids stay unique across restarts
  int64_t learned_max_model_len_ = 0;  // from an engine's /v1/models (max_model_len)
  // Shared with every request's coroutine frame: a frame still suspended when the router is
  // destroyed (shutdown, tests) is destroyed later by its io_context and must not touch it.
  std::shared_ptr<int64_t> in_flight_ = std::make_shared<int64_t>(0);
  std::array<uint64_t, 3> decisions_by_mode_ = {};  // indexed by policy::Mode
  struct DecisionCounter {
    policy::Mode mode;
    std::string_view reason;  // a static string (policy::Decision::reason)
    metrics::Counter* counter;
  };
  std::vector<DecisionCounter> decision_counters_;
  bool stopped_ = false;
  // Requests waiting in the core's queue, by ticket: the flag and timer their coroutine waits on.
  struct QueuedWait;
  std::unordered_map<uint64_t, QueuedWait*> queued_;
  uint64_t next_ticket_ = 1;
  std::shared_ptr<bool> stall_watch_stop_ = std::make_shared<bool>(false);

  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace kvf::router
