// The C ABI (worker/kvf_worker.h) over WorkerAgent: an EngineAdapter whose engine thread is
// whichever thread calls kvf_worker_poll() (posted work waits in a queue until then; its tier
// methods go to worker/kvf_worker_tiers.h), an agent thread of its own, and the KV-event
// publisher. Exceptions and statuses stop at this boundary.
#include "worker/kvf_worker.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "common/http.h"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "worker/agent.h"
#include "worker/kv_event_publisher.h"
#include "worker/kvf_worker_tiers.h"

namespace kvf::worker {
namespace {

kvf_status toCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return KVF_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return KVF_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return KVF_ERR_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
      return KVF_ERR_FAILED_PRECONDITION;
    case absl::StatusCode::kUnavailable:
      return KVF_ERR_UNAVAILABLE;
    case absl::StatusCode::kResourceExhausted:
      return KVF_ERR_RESOURCE_EXHAUSTED;
    default:
      return KVF_ERR_INTERNAL;
  }
}

kvf_status report(const absl::Status& s, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) {
    size_t n = std::min(err_len - 1, s.message().size());
    std::memcpy(err, s.message().data(), n);
    err[n] = '\0';
  }
  return toCode(s);
}

kvf_status copyOut(std::string_view text, char* buf, size_t len) {
  if (buf == nullptr || len <= text.size()) return KVF_ERR_RESOURCE_EXHAUSTED;
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  return KVF_OK;
}

std::string orDefault(const char* s, std::string_view fallback) {
  return s != nullptr && *s != '\0' ? std::string(s) : std::string(fallback);
}

std::vector<BlockHash> toHashes(const uint64_t* raw, size_t n) {
  return std::vector<BlockHash>(raw, raw + n);
}

// The engine seen through its callbacks (and its tier table, when it has one); its engine
// thread is the caller of poll().
class CallbackAdapter final : public EngineAdapter {
 public:
  CallbackAdapter(const kvf_worker_callbacks& cb, BlockGeometry g, PayloadRegion r,
                  const std::optional<kvf_worker_tiers>& tiers)
      : cb_(cb), geometry_(g), region_(r) {
    if (tiers.has_value()) tiers_ = std::make_unique<CTierSource>(*tiers, g.block_bytes);
  }

  BlockGeometry geometry() const override { return geometry_; }
  PayloadRegion payloadRegion() const override { return region_; }
  Nanos now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void post(absl::AnyInvocable<void() &&> fn) override {
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  int poll(int timeout_ms) {
    std::deque<absl::AnyInvocable<void() &&>> due;
    {
      std::unique_lock lock(mu_);
      if (queue_.empty() && timeout_ms > 0) {
        cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !queue_.empty(); });
      }
      due.swap(queue_);
    }
    for (auto& fn : due) std::move(fn)();
    return static_cast<int>(due.size());
  }
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    queue_.clear();
  }

  std::vector<BlockIndex> pinLeadingRun(std::span<const BlockHash> hashes) override {
    std::vector<BlockIndex> blocks(hashes.size());
    size_t n = cb_.pin_leading_run(cb_.user, protocol::rawHashes(hashes).data(), hashes.size(),
                                   blocks.data());
    blocks.resize(std::min(n, hashes.size()));
    return blocks;
  }
  void unpin(std::span<const BlockHash> hashes) override {
    cb_.unpin(cb_.user, protocol::rawHashes(hashes).data(), hashes.size());
  }
  PayloadRegion tierRegion() const override { return tiers_ ? tiers_->region() : PayloadRegion{}; }
  TierPushRun pinTierRun(std::span<const BlockHash> hashes,
                         std::span<const std::span<std::byte>> disk_buffers,
                         absl::AnyInvocable<void(size_t) &&> on_disk_read) override {
    if (!tiers_) return EngineAdapter::pinTierRun(hashes, disk_buffers, std::move(on_disk_read));
    return tiers_->pin(hashes, disk_buffers, std::move(on_disk_read));
  }
  void unpinTierRun(uint64_t id) override {
    if (tiers_) tiers_->unpin(id);
  }
  absl::Status tierReadDone(uint64_t read_id, size_t intact) {
    if (!tiers_) return absl::NotFoundError("read_id: this worker has no tiers (config.tiers)");
    return tiers_->readDone(read_id, intact);
  }
  // The agent is gone: reads it waited for are dropped.
  void dropTierReads() {
    if (tiers_) tiers_->dropReads();
  }

  void completeRemoteKv(const RemoteKvOutcome& o) override { done(o); }
  void failRemoteKv(const RemoteKvOutcome& o) override { done(o); }
  void releaseLanding(const std::string& id) override { cb_.release_landing(cb_.user, id.c_str()); }

 private:
  void done(const RemoteKvOutcome& o) {
    kvf_fetch_result r{};
    r.fetch_id = o.id.c_str();
    r.requested = o.requested;
    r.landed = o.landed;
    r.bytes = o.bytes;
    r.writes_may_arrive = o.writes_may_arrive ? 1 : 0;
    r.reason = o.reason.c_str();
    r.elapsed_us = o.elapsed / 1000;
    cb_.fetch_done(cb_.user, &r);
  }

  kvf_worker_callbacks cb_;
  BlockGeometry geometry_;
  PayloadRegion region_;
  std::unique_ptr<CTierSource> tiers_;  // null: no tiers below the pool
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<absl::AnyInvocable<void() &&>> queue_;
  bool closed_ = false;
};

absl::Status validate(const kvf_worker_config* c, const kvf_worker_callbacks* cb) {
  if (cb == nullptr || cb->pin_leading_run == nullptr || cb->unpin == nullptr ||
      cb->fetch_done == nullptr || cb->release_landing == nullptr) {
    return absl::InvalidArgumentError("callbacks: every callback must be set");
  }
  if (c->region == nullptr) return absl::InvalidArgumentError("config.region: NULL");
  if (c->block_size < 1) return absl::InvalidArgumentError("config.block_size: must be positive");
  if (c->block_bytes == 0)
    return absl::InvalidArgumentError("config.block_bytes: must be positive");
  if (c->num_blocks == 0 || c->num_blocks > UINT32_MAX) {
    return absl::InvalidArgumentError("config.num_blocks: must be in [1, 2^32 - 1]");
  }
  if (c->region_bytes / c->block_bytes < c->num_blocks) {
    return absl::InvalidArgumentError(strCat("config.region_bytes: ", c->region_bytes,
                                             " cannot hold ", c->num_blocks, " blocks of ",
                                             c->block_bytes, " bytes"));
  }
  if (c->advertise_url != nullptr && *c->advertise_url != '\0') {
    if (absl::Status s = validateWorkerUrl(c->advertise_url); !s.ok()) {
      return absl::InvalidArgumentError(strCat("config.advertise_url: ", std::string(s.message())));
    }
  }
  if (c->num_peers > 0 && c->peers == nullptr) {
    return absl::InvalidArgumentError(strCat("config.peers: NULL with num_peers ", c->num_peers));
  }
  constexpr size_t kMaxPeers = 4096;
  if (c->num_peers > kMaxPeers) {
    return absl::InvalidArgumentError(
        strCat("config.num_peers: ", c->num_peers, ", at most ", kMaxPeers));
  }
  for (size_t i = 0; i < c->num_peers; ++i) {
    if (c->peers[i] == nullptr) {
      return absl::InvalidArgumentError(strCat("config.peers[", i, "]: NULL"));
    }
    if (absl::Status s = validateWorkerUrl(c->peers[i]); !s.ok()) {
      return absl::InvalidArgumentError(
          strCat("config.peers[", i, "]: ", std::string(s.message())));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// The agent thread, the adapter the agent uses, the agent and the publisher.
struct CWorker {
  std::unique_ptr<CallbackAdapter> adapter;
  asio::io_context ioc{1};
  asio::executor_work_guard<asio::io_context::executor_type> work{asio::make_work_guard(ioc)};
  std::thread thread;
  std::unique_ptr<WorkerAgent> agent;
  std::unique_ptr<KvEventPublisher> publisher;

  // Runs `fn` on the agent thread and waits for it.
  template <class Fn>
  void onAgentThread(Fn fn) {
    std::promise<void> done;
    asio::post(ioc, [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }
  void publish(std::vector<KvEvent> events) {
    double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    publisher->publish(std::move(events), ts);
  }
};

}  // namespace kvf::worker

struct kvf_worker {
  kvf::worker::CWorker impl;
};

using kvf::worker::CWorker;
using kvf::worker::report;

extern "C" {

kvf_status kvf_worker_create(const kvf_worker_config* config, const kvf_worker_callbacks* cb,
                             kvf_worker** out, char* err, size_t err_len) {
  namespace kw = kvf::worker;
  try {
    if (out == nullptr) return report(absl::InvalidArgumentError("out: NULL"), err, err_len);
    *out = nullptr;
    auto full = kw::fullCStruct(config, KVF_WORKER_CONFIG_SIZE_V1, "config");
    if (!full.ok()) return report(full.status(), err, err_len);
    const kvf_worker_config* c = &*full;
    if (absl::Status s = kw::validate(c, cb); !s.ok()) return report(s, err, err_len);
    auto tiers = kw::tierTable(c->tiers, c->block_bytes);
    if (!tiers.ok()) return report(tiers.status(), err, err_len);
    auto w = std::make_unique<kvf_worker>();
    CWorker& cw = w->impl;
    kw::BlockGeometry g{c->block_size, c->block_bytes, c->num_blocks};
    kw::PayloadRegion region{static_cast<std::byte*>(c->region), c->region_bytes};
    cw.adapter = std::make_unique<kw::CallbackAdapter>(*cb, g, region, *tiers);
    if (c->kv_events_endpoint != nullptr && *c->kv_events_endpoint != '\0') {
      kw::PublisherOptions po;
      po.endpoint = c->kv_events_endpoint;
      po.replay_endpoint = kw::orDefault(c->kv_events_replay_endpoint, "");
      po.topic = kw::orDefault(c->kv_events_topic, "");
      auto pub = kw::KvEventPublisher::create(po);
      if (!pub.ok()) return report(pub.status(), err, err_len);
      cw.publisher = std::move(*pub);
    }
    kw::AgentOptions ao;
    ao.instance_id = kw::orDefault(c->instance_id, "worker");
    ao.host = kw::orDefault(c->host, "127.0.0.1");
    ao.port = c->port;
    ao.token = kw::orDefault(c->token, "");
    ao.insecure = c->insecure != 0;
    ao.advertise_url = kw::orDefault(c->advertise_url, "");
    for (size_t i = 0; i < c->num_peers; ++i) ao.peers.emplace_back(c->peers[i]);
    if (c->max_push_blocks > 0) ao.max_push_blocks = c->max_push_blocks;
    if (tiers->has_value() && (*tiers)->disk_buffer_bytes > 0) {
      ao.push_bounce_bytes = (*tiers)->disk_buffer_bytes;
    }
    kvf::transport::TransportOptions to;
    to.name = ao.instance_id;
    to.transports = kw::orDefault(c->transports, "shm");
    to.net_devices = kw::orDefault(c->net_devices, "");
    to.max_blocks_per_put = static_cast<uint32_t>(std::min<uint64_t>(ao.max_push_blocks, 1 << 20));
    auto transport = kvf::transport::TransportContext::create(to);
    if (!transport.ok()) return report(transport.status(), err, err_len);
    cw.thread = std::thread([&ioc = cw.ioc] { ioc.run(); });
    absl::Status created;
    cw.onAgentThread([&] {
      auto agent = kw::WorkerAgent::create(cw.ioc, *cw.adapter, std::move(*transport), ao, nullptr);
      if (!agent.ok()) {
        created = agent.status();
        return;
      }
      cw.agent = std::move(*agent);
      cw.agent->start();
    });
    if (!created.ok()) {
      kvf_worker_destroy(w.release());
      return report(created, err, err_len);
    }
    *out = w.release();
    return KVF_OK;
  } catch (const std::exception& e) {
    return report(absl::InternalError(e.what()), err, err_len);
  }
}

void kvf_worker_destroy(kvf_worker* w) {
  if (w == nullptr) return;
  CWorker& cw = w->impl;
  cw.adapter->close();  // callbacks not yet run are dropped; new ones are refused
  if (cw.thread.joinable()) {
    if (cw.agent) cw.onAgentThread([&] { cw.agent->stop(); });
    cw.work.reset();
    cw.ioc.stop();
    cw.thread.join();
  }
  cw.agent.reset();  // before the adapter it refers to
  cw.adapter->dropTierReads();
  if (cw.publisher) cw.publisher->stop();
  delete w;
}

uint16_t kvf_worker_port(const kvf_worker* w) { return w == nullptr ? 0 : w->impl.agent->port(); }

kvf_status kvf_worker_url(const kvf_worker* w, char* buf, size_t len) {
  if (w == nullptr) return KVF_ERR_INVALID_ARGUMENT;
  return kvf::worker::copyOut(w->impl.agent->url(), buf, len);
}

kvf_status kvf_worker_kv_events_endpoints(const kvf_worker* w, char* pub, size_t pub_len,
                                          char* replay, size_t replay_len) {
  if (w == nullptr) return KVF_ERR_INVALID_ARGUMENT;
  const auto* p = w->impl.publisher.get();
  kvf_status s = kvf::worker::copyOut(p ? p->endpoint() : "", pub, pub_len);
  if (s != KVF_OK) return s;
  return kvf::worker::copyOut(p ? p->replayEndpoint() : "", replay, replay_len);
}

int kvf_worker_poll(kvf_worker* w, int timeout_ms) {
  if (w == nullptr) return -1;
  return w->impl.adapter->poll(timeout_ms);
}

kvf_status kvf_worker_fetch(kvf_worker* w, const char* fetch_id, const char* source_url,
                            const char* lease_id, const uint64_t* hashes, const uint32_t* blocks,
                            size_t n, int64_t deadline_ms, char* err, size_t err_len) {
  try {
    if (w == nullptr) return report(absl::InvalidArgumentError("worker: NULL"), err, err_len);
    if (fetch_id == nullptr || *fetch_id == '\0') {
      return report(absl::InvalidArgumentError("fetch_id: empty"), err, err_len);
    }
    if (source_url == nullptr) {
      return report(absl::InvalidArgumentError("source_url: NULL"), err, err_len);
    }
    if (absl::Status s = kvf::worker::validateWorkerUrl(source_url); !s.ok()) {
      return report(s, err, err_len);
    }
    if (n == 0 || hashes == nullptr || blocks == nullptr) {
      return report(absl::InvalidArgumentError("hashes, blocks: at least one block"), err, err_len);
    }
    if (deadline_ms < 1 || deadline_ms > 60'000) {
      return report(absl::InvalidArgumentError("deadline_ms: must be in [1, 60000]"), err, err_len);
    }
    kvf::worker::RemoteKvFetch f;
    f.id = fetch_id;
    f.source = source_url;
    f.lease_id = lease_id != nullptr ? lease_id : "";
    f.hashes = kvf::worker::toHashes(hashes, n);
    f.blocks.assign(blocks, blocks + n);
    f.deadline = std::chrono::milliseconds(deadline_ms);
    w->impl.agent->fetch(std::move(f));
    return KVF_OK;
  } catch (const std::exception& e) {
    return report(absl::InternalError(e.what()), err, err_len);
  }
}

kvf_status kvf_worker_hold_lease(kvf_worker* w, const char* lease_id, const uint64_t* hashes,
                                 size_t n, int64_t ttl_ms, size_t* pinned, char* err,
                                 size_t err_len) {
  try {
    if (w == nullptr) return report(absl::InvalidArgumentError("worker: NULL"), err, err_len);
    if (lease_id == nullptr || *lease_id == '\0' || std::strlen(lease_id) > 256) {
      return report(absl::InvalidArgumentError("lease_id: 1 to 256 bytes"), err, err_len);
    }
    if (ttl_ms < 1 || (n > 0 && hashes == nullptr)) {
      return report(absl::InvalidArgumentError("ttl_ms, hashes: ttl_ms must be positive"), err,
                    err_len);
    }
    std::vector<kvf::worker::BlockHash> h = kvf::worker::toHashes(hashes, n);
    auto run = w->impl.agent->holdLease(lease_id, h, ttl_ms * 1'000'000);
    if (pinned != nullptr) *pinned = run.size();
    return KVF_OK;
  } catch (const std::exception& e) {
    return report(absl::InternalError(e.what()), err, err_len);
  }
}

kvf_status kvf_worker_tier_read_done(kvf_worker* w, uint64_t read_id, size_t intact) {
  if (w == nullptr) return KVF_ERR_INVALID_ARGUMENT;
  return kvf::worker::toCode(w->impl.adapter->tierReadDone(read_id, intact));
}

static kvf_status publishChecked(kvf_worker* w, std::vector<kvf::worker::KvEvent> events, char* err,
                                 size_t err_len) {
  if (w == nullptr) return report(absl::InvalidArgumentError("worker: NULL"), err, err_len);
  if (!w->impl.publisher) {
    return report(absl::FailedPreconditionError("kv_events_endpoint: no publisher configured"), err,
                  err_len);
  }
  w->impl.publish(std::move(events));
  return KVF_OK;
}

kvf_status kvf_worker_publish_stored(kvf_worker* w, const uint64_t* hashes, size_t n,
                                     int has_parent, uint64_t parent, const uint32_t* token_ids,
                                     size_t num_tokens, char* err, size_t err_len) {
  try {
    if (w == nullptr) return report(absl::InvalidArgumentError("worker: NULL"), err, err_len);
    const int64_t bs = w->impl.adapter->geometry().block_size;
    if (n == 0 || hashes == nullptr) {
      return report(absl::InvalidArgumentError("hashes: at least one"), err, err_len);
    }
    if (num_tokens != n * static_cast<size_t>(bs) || (num_tokens > 0 && token_ids == nullptr)) {
      return report(absl::InvalidArgumentError(kvf::strCat("token_ids: ", num_tokens,
                                                           " tokens for ", n, " blocks of ", bs)),
                    err, err_len);
    }
    kvf::worker::BlockStored e;
    e.block_hashes = kvf::worker::toHashes(hashes, n);
    if (has_parent) e.parent_block_hash = kvf::worker::BlockHash(parent);
    e.token_ids.assign(token_ids, token_ids + num_tokens);
    e.block_size = bs;
    std::vector<kvf::worker::KvEvent> events;
    events.emplace_back(std::move(e));
    return publishChecked(w, std::move(events), err, err_len);
  } catch (const std::exception& e) {
    return report(absl::InternalError(e.what()), err, err_len);
  }
}

kvf_status kvf_worker_publish_removed(kvf_worker* w, const uint64_t* hashes, size_t n, char* err,
                                      size_t err_len) {
  try {
    if (n == 0 || hashes == nullptr) {
      return report(absl::InvalidArgumentError("hashes: at least one"), err, err_len);
    }
    kvf::worker::BlockRemoved e;
    e.block_hashes = kvf::worker::toHashes(hashes, n);
    std::vector<kvf::worker::KvEvent> events;
    events.emplace_back(std::move(e));
    return publishChecked(w, std::move(events), err, err_len);
  } catch (const std::exception& e) {
    return report(absl::InternalError(e.what()), err, err_len);
  }
}

kvf_status kvf_worker_publish_cleared(kvf_worker* w, char* err, size_t err_len) {
  std::vector<kvf::worker::KvEvent> events;
  events.emplace_back(kvf::worker::AllBlocksCleared{});
  return publishChecked(w, std::move(events), err, err_len);
}

const char* kvf_status_name(kvf_status status) {
  switch (status) {
    case KVF_OK:
      return "ok";
    case KVF_ERR_INVALID_ARGUMENT:
      return "invalid_argument";
    case KVF_ERR_NOT_FOUND:
      return "not_found";
    case KVF_ERR_FAILED_PRECONDITION:
      return "failed_precondition";
    case KVF_ERR_UNAVAILABLE:
      return "unavailable";
    case KVF_ERR_RESOURCE_EXHAUSTED:
      return "resource_exhausted";
    case KVF_ERR_INTERNAL:
      return "internal";
  }
  return "unknown";
}

}  // extern "C"
