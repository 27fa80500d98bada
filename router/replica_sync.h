// Router replicas' load exchange, the shell around router/core/peer_load.h (docs/router.md
// "Replicas"). Every sync_interval the io thread publishes this replica's in-flight load per
// instance on a ZMQ PUB socket (a delta, or a snapshot every snapshot_interval), drops peers
// silent for peer_timeout, and updates the metrics. A receiver thread reads the peers' messages
// from one SUB socket, checks their signature, size and send time, and posts them to the io
// thread, which applies them and folds the peers' load into the routing core.
// Threading: create, start, stop and statusJson on the io thread; the receiver thread touches
// only its socket, atomics and asio::post.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "router/core/config.h"
#include "router/core/peer_load.h"
#include "router/core/routing_core.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace kvf::router {

class ReplicaSync : public std::enable_shared_from_this<ReplicaSync> {
 public:
  // Binds `config.publish` (an error names the endpoint) and connects to the peers. `key`:
  // replicaLoadKey(worker_token), non-empty. `core`, `clock` and `registry` must outlive the
  // object's use on the io thread (stop() before they go).
  static absl::StatusOr<std::shared_ptr<ReplicaSync>> create(
      asio::io_context& ioc, std::shared_ptr<zmq::context_t> zmq, const ReplicasConfig& config,
      std::string key, RoutingCore& core, const Clock& clock, metrics::Registry& registry);
  ~ReplicaSync();
  ReplicaSync(const ReplicaSync&) = delete;
  ReplicaSync& operator=(const ReplicaSync&) = delete;

  // Starts the receiver thread and the publishing loop.
  void start();
  // Stops both (joins the thread); the peers' load is left folded in as it was.
  void stop();
  // {id, publish, epoch, seq, gaps, expired, peers: [{id, epoch, seq, synced, silent_s,
  // running, pending_prefill_tokens, ongoing_tokens}]}
  std::string statusJson() const;

 private:
  ReplicaSync(asio::io_context& ioc, std::shared_ptr<zmq::context_t> zmq, ReplicasConfig config,
              std::string key, RoutingCore& core, const Clock& clock, metrics::Registry& registry);
  void receive();                          // the receiver thread
  void onMessage(ReplicaMessage message);  // io thread
  asio::awaitable<void> publishLoop(std::shared_ptr<ReplicaSync> self);
  void publishOnce(Nanos now);
  void fold();  // the table's sums into the core, every present slot

  asio::io_context& ioc_;
  std::shared_ptr<zmq::context_t> zmq_;
  ReplicasConfig config_;
  std::string key_;
  RoutingCore& core_;
  const Clock& clock_;
  PeerLoadTable table_;
  ReplicaLoadPublisher publisher_;
  std::unique_ptr<zmq::socket_t> pub_;
  Nanos last_snapshot_ = 0;
  std::atomic<bool> stop_{false};
  bool stopped_ = false;
  std::thread receiver_;

  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace kvf::router
