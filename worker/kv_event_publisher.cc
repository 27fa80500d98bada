#include "worker/kv_event_publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"

namespace kvf::worker {
namespace {

absl::Status zmqError(std::string_view what) {
  return absl::InternalError(strCat(what, ": ", zmq_strerror(zmq_errno())));
}

std::string lastEndpoint(void* socket) {
  std::array<char, 256> buf{};
  size_t len = buf.size();
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf.data(), &len) != 0) return {};
  return std::string(buf.data());
}

// Sends one multipart message without blocking; false when ZMQ refused it.
bool sendParts(void* socket, const std::vector<std::string_view>& parts) {
  for (size_t i = 0; i < parts.size(); ++i) {
    int flags = ZMQ_DONTWAIT | (i + 1 < parts.size() ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, parts[i].data(), parts[i].size(), flags) < 0) return false;
  }
  return true;
}

log::RateLimitedLog bad_replay_log;
log::RateLimitedLog drop_log;

}  // namespace

KvEventPublisher::KvEventPublisher(PublisherOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::create(
    PublisherOptions options) {
  if (options.buffer_batches == 0) return absl::InvalidArgumentError("buffer_batches must be > 0");
  if (options.buffer_bytes == 0) return absl::InvalidArgumentError("buffer_bytes must be > 0");
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(options)));
  KVF_RETURN_IF_ERROR(p->bind());
  p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  return p;
}

absl::Status KvEventPublisher::bind() {
  context_ = zmq_ctx_new();
  if (context_ == nullptr) return zmqError("zmq_ctx_new");
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError(strCat("eventfd: ", std::strerror(errno)));
  int linger = 0;
  pub_ = zmq_socket(context_, ZMQ_PUB);
  if (pub_ == nullptr) return zmqError("zmq_socket(PUB)");
  zmq_setsockopt(pub_, ZMQ_LINGER, &linger, sizeof(linger));
  int hwm = 100000;
  zmq_setsockopt(pub_, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  if (zmq_bind(pub_, options_.endpoint.c_str()) != 0) {
    return zmqError(strCat("binding kv_events endpoint ", options_.endpoint));
  }
  bound_endpoint_ = lastEndpoint(pub_);
  if (!options_.replay_endpoint.empty()) {
    router_ = zmq_socket(context_, ZMQ_ROUTER);
    if (router_ == nullptr) return zmqError("zmq_socket(ROUTER)");
    zmq_setsockopt(router_, ZMQ_LINGER, &linger, sizeof(linger));
    int router_hwm = static_cast<int>(options_.buffer_batches + 16);
    zmq_setsockopt(router_, ZMQ_SNDHWM, &router_hwm, sizeof(router_hwm));
    if (zmq_bind(router_, options_.replay_endpoint.c_str()) != 0) {
      return zmqError(strCat("binding kv_events replay endpoint ", options_.replay_endpoint));
    }
    bound_replay_endpoint_ = lastEndpoint(router_);
  }
  return absl::OkStatus();
}

KvEventPublisher::~KvEventPublisher() {
  stop();
  if (pub_ != nullptr) zmq_close(pub_);
  if (router_ != nullptr) zmq_close(router_);
  if (context_ != nullptr) zmq_ctx_term(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void KvEventPublisher::publish(std::vector<KvEvent> events, double timestamp_s) {
  if (events.empty()) return;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    if (queue_.size() >= options_.max_queued_batches) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      drop_log.warn("kv event queue full, dropping batch", "queued", queue_.size());
      return;
    }
    queue_.push_back(Pending{std::move(events), timestamp_s});
  }
  wake();
}

void KvEventPublisher::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void KvEventPublisher::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) {
    wake();
    thread_.join();
  }
}

void KvEventPublisher::run() {
  std::vector<KvEvent> cleared;
  cleared.emplace_back(AllBlocksCleared{});
  sendBatch(Pending{std::move(cleared), 0.0});
  for (;;) {
    zmq_pollitem_t items[2] = {};
    items[0].fd = wake_fd_;
    items[0].events = ZMQ_POLLIN;
    int count = 1;
    if (router_ != nullptr) {
      items[1].socket = router_;
      items[1].events = ZMQ_POLLIN;
      count = 2;
    }
    if (zmq_poll(items, count, -1) < 0 && zmq_errno() != EINTR) break;
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t drained = 0;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof(drained));
    }
    std::deque<Pending> work;
    bool stopping = false;
    {
      std::lock_guard lock(mu_);
      work.swap(queue_);
      stopping = stopping_;
    }
    for (auto& pending : work) sendBatch(std::move(pending));
    if (count == 2 && (items[1].revents & ZMQ_POLLIN)) serveReplay();
    if (stopping) break;
  }
}

void KvEventPublisher::sendBatch(Pending pending) {
  double ts = pending.timestamp_s;
  if (ts <= 0) {
    ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  protocol::KvEventBatch batch;
  batch.ts = ts;
  batch.events = std::move(pending.events);
  std::string payload = protocol::encodeEventBatch(batch);
  uint64_t seq = next_seq_++;
  std::string seq_bytes = protocol::encodeSeq(seq);
  if (!sendParts(pub_, {options_.topic, seq_bytes, payload})) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    drop_log.warn("kv event send failed", "seq", seq, "error", zmq_strerror(zmq_errno()));
  } else {
    published_.fetch_add(1, std::memory_order_relaxed);
  }
  // The encoder grows its string by doubling: kept as it is, a batch held up to twice the bytes
  // that buffer_bytes counts (28.5 MB of heap for 17 MB counted at a soaking engine's peak).
  payload.shrink_to_fit();
  uint64_t buffered = buffered_bytes_.load(std::memory_order_relaxed) + payload.size();
  replay_buffer_.emplace_back(seq, std::move(payload));
  // The newest batch always stays (a single batch over buffer_bytes is still replayable).
  while (replay_buffer_.size() > 1 &&
         (replay_buffer_.size() > options_.buffer_batches || buffered > options_.buffer_bytes)) {
    const size_t bytes = replay_buffer_.front().second.size();
    if (replay_buffer_.size() <= options_.buffer_batches) {
      trimmed_batches_.fetch_add(1, std::memory_order_relaxed);
      trimmed_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    }
    buffered -= bytes;
    replay_buffer_.pop_front();
  }
  buffered_bytes_.store(buffered, std::memory_order_relaxed);
}

// Reads every queued replay request. A request is [identity, "", start_seq(8B)]; anything
// else (wrong frame count or sizes) is dropped: the peer is not trusted.
void KvEventPublisher::serveReplay() {
  constexpr size_t kMaxFrames = 8;
  constexpr size_t kMaxFrameBytes = 256;
  for (;;) {
    std::vector<std::string> frames;
    bool more = true;
    bool any = false;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, router_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        break;
      }
      any = true;
      more = zmq_msg_more(&msg) != 0;
      if (frames.size() < kMaxFrames) {
        size_t n = std::min(zmq_msg_size(&msg), kMaxFrameBytes);
        frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), n);
      }
      zmq_msg_close(&msg);
    }
    if (!any) return;
    std::optional<uint64_t> start;
    if (frames.size() == 3 && frames[1].empty()) start = protocol::decodeSeq(frames[2]);
    if (!start) {
      bad_replay_log.warn("malformed kv event replay request", "frames", frames.size());
      continue;
    }
    replays_.fetch_add(1, std::memory_order_relaxed);
    const std::string& id = frames[0];
    for (const auto& [seq, payload] : replay_buffer_) {
      if (seq < *start) continue;
      std::string seq_bytes = protocol::encodeSeq(seq);
      if (!sendParts(router_, {id, "", seq_bytes, payload})) break;
    }
    std::string end = protocol::encodeSeq(protocol::kReplayEndSeq);
    sendParts(router_, {id, "", end, ""});
  }
}

}  // namespace kvf::worker
