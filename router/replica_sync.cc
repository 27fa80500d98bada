#include "router/replica_sync.h"

#include <chrono>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <zmq.hpp>

#include "common/log.h"
#include "common/strings.h"
#include "router/replica_wire.h"

namespace kvf::router {
namespace {

int64_t unixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string_view outcomeName(PeerLoadTable::Outcome outcome) {
  switch (outcome) {
    case PeerLoadTable::Outcome::kApplied:
      return "applied";
    case PeerLoadTable::Outcome::kGap:
      return "gap";
    case PeerLoadTable::Outcome::kAwaitingResync:
      return "awaiting_resync";
    case PeerLoadTable::Outcome::kDuplicate:
      return "duplicate";
    case PeerLoadTable::Outcome::kSelf:
      return "self";
    case PeerLoadTable::Outcome::kTooManyPeers:
      return "too_many_peers";
    case PeerLoadTable::Outcome::kTooLarge:
      return "too_large";
  }
  return "unknown";
}

// A new epoch per process: a restarted replica's sequence starts over without being taken for
// replays of the old one.
uint64_t randomEpoch() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

constexpr PeerLoadTable::Outcome kOutcomes[] = {
    PeerLoadTable::Outcome::kApplied,        PeerLoadTable::Outcome::kGap,
    PeerLoadTable::Outcome::kAwaitingResync, PeerLoadTable::Outcome::kDuplicate,
    PeerLoadTable::Outcome::kSelf,           PeerLoadTable::Outcome::kTooManyPeers,
    PeerLoadTable::Outcome::kTooLarge,
};

}  // namespace

struct ReplicaSync::Metrics {
  metrics::Gauge* peers_up;
  metrics::Gauge* staleness;
  metrics::Counter* gaps;
  metrics::Counter* expired;
  metrics::Counter* sent;
  metrics::Counter* send_failed;
  std::map<PeerLoadTable::Outcome, metrics::Counter*> received;
  metrics::Counter* rejected_signature;
  metrics::Counter* rejected_malformed;
  metrics::Counter* rejected_clock_skew;
};

absl::StatusOr<std::shared_ptr<ReplicaSync>> ReplicaSync::create(
    asio::io_context& ioc, std::shared_ptr<zmq::context_t> zmq, const ReplicasConfig& config,
    std::string key, RoutingCore& core, const Clock& clock, metrics::Registry& registry) {
  if (key.empty()) {
    return absl::InvalidArgumentError(
        "replicas: needs worker_token (or KVF_WORKER_TOKEN): it signs the replicas' messages");
  }
  std::shared_ptr<ReplicaSync> sync(
      new ReplicaSync(ioc, std::move(zmq), config, std::move(key), core, clock, registry));
  try {
    sync->pub_ = std::make_unique<zmq::socket_t>(*sync->zmq_, zmq::socket_type::pub);
    sync->pub_->set(zmq::sockopt::linger, 0);
    sync->pub_->set(zmq::sockopt::sndhwm, 1000);
    sync->pub_->bind(config.publish);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        strCat("replicas.publish \"", config.publish, "\": cannot bind: ", e.what()));
  }
  return sync;
}

ReplicaSync::ReplicaSync(asio::io_context& ioc, std::shared_ptr<zmq::context_t> zmq,
                         ReplicasConfig config, std::string key, RoutingCore& core,
                         const Clock& clock, metrics::Registry& registry)
    : ioc_(ioc),
      zmq_(std::move(zmq)),
      config_(std::move(config)),
      key_(std::move(key)),
      core_(core),
      clock_(clock),
      table_(config_.id, config_.peer_timeout, PeerLoadLimits{.max_peers = config_.max_peers}),
      publisher_(config_.id, randomEpoch()) {
  auto& r = registry;
  metrics_ = std::make_unique<Metrics>();
  Metrics& m = *metrics_;
  m.peers_up = &r.gauge("kvfabric_router_replica_peers_up",
                        "Peer router replicas heard from within peer_timeout");
  m.staleness = &r.gauge("kvfabric_router_replica_staleness_seconds",
                         "Longest time since a live peer replica was last heard");
  m.gaps = &r.counter("kvfabric_router_replica_gaps_total",
                      "Sequence gaps in peers' messages (each waits for the peer's snapshot)");
  m.expired = &r.counter("kvfabric_router_replica_peers_expired_total",
                         "Peers dropped with their load after peer_timeout of silence");
  m.sent = &r.counter("kvfabric_router_replica_messages_sent_total",
                      "Load messages published (deltas and snapshots)");
  m.send_failed = &r.counter("kvfabric_router_replica_send_failures_total",
                             "Load messages the PUB socket would not take");
  for (PeerLoadTable::Outcome outcome : kOutcomes) {
    m.received[outcome] = &r.counter("kvfabric_router_replica_messages_received_total",
                                     "Authenticated peer messages by what became of them",
                                     {{"outcome", std::string(outcomeName(outcome))}});
  }
  auto rejected = [&](std::string_view reason) {
    return &r.counter("kvfabric_router_replica_messages_rejected_total",
                      "Peer messages refused before use, by reason",
                      {{"reason", std::string(reason)}});
  };
  m.rejected_signature = rejected("signature");
  m.rejected_malformed = rejected("malformed");
  m.rejected_clock_skew = rejected("clock_skew");
}

ReplicaSync::~ReplicaSync() { stop(); }

void ReplicaSync::start() {
  receiver_ = std::thread([this] { receive(); });
  asio::co_spawn(ioc_, publishLoop(shared_from_this()), asio::detached);
  log::info("replica sync started", "id", config_.id, "publish", config_.publish, "peers",
            config_.peers.size());
}

void ReplicaSync::stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_ = true;
  if (receiver_.joinable()) receiver_.join();
  pub_.reset();
}

void ReplicaSync::receive() {
  log::RateLimitedLog rejected_log;
  try {
    zmq::socket_t sub(*zmq_, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(config_.max_message_bytes));
    sub.set(zmq::sockopt::rcvhwm, 1000);
    sub.set(zmq::sockopt::subscribe, "");
    for (const std::string& peer : config_.peers) sub.connect(peer);
    std::weak_ptr<ReplicaSync> weak = weak_from_this();
    while (!stop_.load()) {
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> parts;
      for (;;) {
        zmq::message_t msg;
        if (!sub.recv(msg, zmq::recv_flags::dontwait)) break;
        const bool more = msg.more();
        if (parts.size() < 3) parts.push_back(std::move(msg));
        if (!more) break;
      }
      if (parts.size() != 2) {
        metrics_->rejected_malformed->inc();
        continue;
      }
      auto message =
          decodeReplicaMessage(key_, parts[0].to_string_view(), parts[1].to_string_view());
      if (!message.ok()) {
        (message.status().code() == absl::StatusCode::kPermissionDenied
             ? metrics_->rejected_signature
             : metrics_->rejected_malformed)
            ->inc();
        rejected_log.warn("replica message refused", "error",
                          std::string(message.status().message()));
        continue;
      }
      const int64_t skew = unixNanos() - message->sent_unix_ns;
      if (skew > config_.max_clock_skew || skew < -config_.max_clock_skew) {
        metrics_->rejected_clock_skew->inc();
        rejected_log.warn("replica message refused: send time off", "replica", message->replica,
                          "skew_s", nanosToSeconds(skew));
        continue;
      }
      asio::post(ioc_, [weak, m = std::move(*message)]() mutable {
        if (auto self = weak.lock(); self && !self->stop_.load()) self->onMessage(std::move(m));
      });
    }
  } catch (const zmq::error_t& e) {
    log::error("replica receiver stopped", "error", e.what());
  }
}

void ReplicaSync::onMessage(ReplicaMessage message) {
  const uint64_t gaps = table_.gaps();
  PeerLoadTable::Outcome outcome = table_.apply(message, clock_.now());
  metrics_->received[outcome]->inc();
  if (table_.gaps() != gaps) {
    metrics_->gaps->inc();
    log::warn("replica message gap; waiting for the peer's snapshot", "replica", message.replica,
              "seq", message.seq);
  }
  // A gap keeps the peer's last figures, but a restart (new epoch) drops them: fold whenever
  // the table may have changed.
  if (outcome == PeerLoadTable::Outcome::kApplied || outcome == PeerLoadTable::Outcome::kGap ||
      outcome == PeerLoadTable::Outcome::kAwaitingResync) {
    fold();
  }
  metrics_->peers_up->set(static_cast<double>(table_.peersUp()));
}

void ReplicaSync::fold() {
  for (int slot = 0; slot < core_.slotEnd(); ++slot) {
    const InstanceState& s = core_.instance(slot);
    if (s.present) core_.setPeerLoad(slot, table_.total(s.id));
  }
}

// `self` keeps the object alive while the loop waits.
asio::awaitable<void> ReplicaSync::publishLoop([[maybe_unused]] std::shared_ptr<ReplicaSync> self) {
  asio::steady_timer timer(ioc_);
  const std::chrono::nanoseconds period(config_.sync_interval);
  for (;;) {
    timer.expires_after(period);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (stop_.load()) co_return;  // the router may be gone: touch nothing
    publishOnce(clock_.now());
  }
}

void ReplicaSync::publishOnce(Nanos now) {
  if (size_t dropped = table_.expire(now); dropped > 0) {
    metrics_->expired->inc(static_cast<double>(dropped));
    log::warn("peer replicas silent past peer_timeout; their load dropped", "peers", dropped);
    fold();
  }
  metrics_->peers_up->set(static_cast<double>(table_.peersUp()));
  metrics_->staleness->set(nanosToSeconds(table_.maxSilence(now)));
  std::map<std::string, InFlightLoad> own;
  for (int slot = 0; slot < core_.slotEnd(); ++slot) {
    const InstanceState& s = core_.instance(slot);
    if (s.present) own.emplace(s.id, core_.ownLoad(slot));
  }
  ReplicaMessage message;
  if (now - last_snapshot_ >= config_.snapshot_interval) {
    publisher_.snapshot(own, unixNanos(), &message);
    last_snapshot_ = now;
  } else if (!publisher_.delta(own, unixNanos(), &message)) {
    return;
  }
  std::string payload = encodeReplicaMessage(message);
  std::string mac = signReplicaPayload(key_, payload);
  try {
    // PUB never blocks: past its high-water mark it drops, and the peers see a gap.
    if (pub_->send(zmq::buffer(payload), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
        pub_->send(zmq::buffer(mac), zmq::send_flags::dontwait)) {
      metrics_->sent->inc();
      return;
    }
  } catch (const zmq::error_t&) {
  }
  metrics_->send_failed->inc();
}

std::string ReplicaSync::statusJson() const {
  const Nanos now = clock_.now();
  boost::json::object out;
  out["id"] = config_.id;
  out["publish"] = config_.publish;
  out["seq"] = publisher_.lastSeq();
  out["gaps"] = table_.gaps();
  out["expired"] = table_.expired();
  boost::json::array peers;
  for (const PeerLoadTable::PeerView& p : table_.peers()) {
    boost::json::object peer;
    peer["id"] = p.id;
    peer["epoch"] = p.epoch;
    peer["seq"] = p.seq;
    peer["synced"] = p.synced;
    peer["silent_s"] = nanosToSeconds(now - p.last_heard);
    peer["running"] = p.load.running;
    peer["pending_prefill_tokens"] = p.load.pending_prefill_tokens;
    peer["ongoing_tokens"] = p.load.ongoing_tokens;
    peers.push_back(std::move(peer));
  }
  out["peers"] = std::move(peers);
  return boost::json::serialize(out);
}

}  // namespace kvf::router
