#include "router/kv_subscriber.h"

#include <optional>
#include <vector>

#include <zmq.hpp>

#include "common/log.h"

namespace kvf::router {
namespace {

// Receives one multipart message (non-blocking after the poll said it is there).
std::vector<zmq::message_t> recvParts(zmq::socket_t& socket) {
  std::vector<zmq::message_t> parts;
  for (;;) {
    zmq::message_t msg;
    if (!socket.recv(msg, zmq::recv_flags::dontwait)) break;
    bool more = msg.more();
    parts.push_back(std::move(msg));
    if (!more || parts.size() > 16) break;
  }
  return parts;
}

std::string_view view(const zmq::message_t& m) {
  return std::string_view(static_cast<const char*>(m.data()), m.size());
}

// The per-instance sequencing state machine, kept apart from the socket plumbing.
class Sequencer {
 public:
  Sequencer(KvSubscriberStats* stats, const KvSubscriberOptions& options,
            const KvSubscriber::Sink& sink)
      : stats_(stats), options_(options), sink_(sink) {}

  bool started() const { return last_.has_value(); }
  std::optional<uint64_t> last() const { return last_; }

  // Applies a batch if it is the next one (or the first). Returns false if it is ahead
  // (a gap) and was not applied.
  bool offer(uint64_t seq, std::string_view payload, bool allow_gap) {
    restartIfBack(seq);
    if (last_ && seq != *last_ + 1 && !allow_gap) return false;
    deliver(seq, payload);
    return true;
  }

  // Sequence went back: the engine restarted and its cache started empty. The stream then
  // starts over, as on first contact (its first batches may come from the replay socket).
  void restartIfBack(uint64_t seq) {
    if (!last_ || seq > *last_) return;
    ++stats_->restarts;
    reset("restart");
    last_.reset();
  }

  void reset(std::string reason, uint64_t seq = 0, uint64_t lost = 0, std::string error = {}) {
    KvUpdate update;
    update.kind = KvUpdate::Kind::kReset;
    update.reason = std::move(reason);
    update.seq = seq;
    update.lost_batches = lost;
    update.error = std::move(error);
    stats_->lost_batches += lost;
    sink_(std::move(update));
  }

 private:
  void deliver(uint64_t seq, std::string_view payload) {
    if (!last_ && seq > 0) {
      // The first batch this stream gave us is not its first: what came before is lost.
      ++stats_->late_joins;
      reset("late_join", seq, seq);
    }
    last_ = seq;
    auto batch = decodeKvEventBatch(payload, options_.limits);
    if (!batch.ok()) {
      // What the batch changed is unknown: the index of this stream cannot be trusted any more.
      ++stats_->decode_errors;
      std::string error(batch.status().message());
      log_.warn("undecodable KV event batch; index reset", "seq", seq, "error", error);
      reset("undecodable", seq, 1, std::move(error));
      return;
    }
    ++stats_->batches;
    KvUpdate update;
    update.seq = seq;
    update.batch = std::move(*batch);
    sink_(std::move(update));
  }

  KvSubscriberStats* stats_;
  const KvSubscriberOptions& options_;
  const KvSubscriber::Sink& sink_;
  std::optional<uint64_t> last_;
  log::RateLimitedLog log_;
};

// Asks the replay socket for every buffered batch from `from` and feeds them in order.
// Returns true if the sequence is contiguous up to `until` afterwards.
bool replay(zmq::context_t& context, const std::string& endpoint, uint64_t from, uint64_t until,
            Sequencer& seq, KvSubscriberStats& stats, const KvSubscriberOptions& options,
            const std::atomic<bool>& stop) {
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options.max_payload_bytes));
  dealer.connect(endpoint);
  std::string start = encodeSeq(from);
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  auto deadline = std::chrono::steady_clock::now() + options.replay_timeout;
  while (!stop.load() && std::chrono::steady_clock::now() < deadline) {
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(50));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    // ["", seq, payload] (vLLM up to v0.24) or ["", topic, seq, payload] (v0.25 on).
    auto parts = recvParts(dealer);
    if (parts.size() != 3 && parts.size() != 4) continue;
    auto s = decodeSeq(view(parts[parts.size() - 2]));
    if (!s) continue;
    if (*s == kReplayEndSeq) break;
    // Batches at or after `until` also arrive on the SUB socket; they are taken from there.
    if (*s >= until || (seq.last() && *s <= *seq.last())) continue;
    if (!seq.offer(*s, view(parts.back()), false)) continue;  // the buffer no longer reaches back
    ++stats.replayed;
  }
  return seq.last() && *seq.last() + 1 >= until;
}

}  // namespace

KvSubscriber::KvSubscriber(std::shared_ptr<zmq::context_t> context, KvEventsConfig config,
                           Sink sink, KvSubscriberOptions options)
    : context_(std::move(context)),
      config_(std::move(config)),
      sink_(std::move(sink)),
      options_(options),
      thread_([this] { run(); }) {}

KvSubscriber::~KvSubscriber() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void KvSubscriber::run() {
  try {
    zmq::socket_t sub(*context_, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.max_payload_bytes));
    sub.set(zmq::sockopt::rcvhwm, 100000);
    sub.set(zmq::sockopt::subscribe, config_.topic);
    sub.connect(config_.endpoint);
    Sequencer seq(&stats_, options_, sink_);
    // First contact: what the engine still buffers comes from the replay socket at once, so a
    // router (re)started in front of a quiet engine does not wait for its next batch to learn
    // what it caches. Batches the subscription brought meanwhile (queued by the time the
    // replay ends) up to that point are duplicates; past a second, a sequence that goes back is
    // a restart again.
    std::optional<uint64_t> caught_up_to;
    std::chrono::steady_clock::time_point duplicates_until;
    if (!config_.replay_endpoint.empty()) {
      replay(*context_, config_.replay_endpoint, 0, kReplayEndSeq, seq, stats_, options_, stop_);
      caught_up_to = seq.last();
      duplicates_until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
    while (!stop_.load()) {
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      auto parts = recvParts(sub);
      std::optional<uint64_t> s = parts.size() == 3 ? decodeSeq(view(parts[1])) : std::nullopt;
      // The topic is a prefix filter, as the SUB socket's subscription is.
      if (!s || !view(parts[0]).starts_with(config_.topic)) {
        ++stats_.decode_errors;
        continue;
      }
      if (caught_up_to && *s <= *caught_up_to &&
          std::chrono::steady_clock::now() < duplicates_until) {
        continue;  // applied from the catch-up replay
      }
      caught_up_to.reset();
      // A restarted engine's first batches may have gone out before the subscription reached
      // it: seen as a restart first, they are then recovered like any history below.
      seq.restartIfBack(*s);
      // The first batch after (re)connecting may be mid-stream: earlier history, if the engine
      // still buffers it, comes from the replay socket.
      bool behind = seq.last() ? *s > *seq.last() + 1 : *s > 0;
      if (behind && seq.last() && *s > *seq.last()) ++stats_.gaps;
      if (behind && !config_.replay_endpoint.empty()) {
        uint64_t from = seq.last() ? *seq.last() + 1 : 0;
        if (!replay(*context_, config_.replay_endpoint, from, *s, seq, stats_, options_, stop_) &&
            seq.last()) {
          ++stats_.unrecovered_gaps;
          seq.reset("unrecovered_gap", *s, *s - *seq.last() - 1);
        }
      } else if (behind && seq.last()) {
        ++stats_.unrecovered_gaps;
        seq.reset("unrecovered_gap", *s, *s - *seq.last() - 1);
      }
      seq.offer(*s, view(parts[2]), true);
    }
  } catch (const zmq::error_t& e) {
    log::error("KV event subscriber stopped", "endpoint", config_.endpoint, "error", e.what());
  }
}

}  // namespace kvf::router
