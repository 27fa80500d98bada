// Sender side: batched puts with coalescing, one flush completion, deadlines, notices.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "common/log.h"
#include "common/status.h"
#include "transport/core.h"
#include "transport/remote_key.h"
#include "transport/ucx_status.h"

namespace kvf::transport {

// Sorted by local offset (skipped when already sorted), then adjacent blocks - contiguous on both
// sides - merged in place.
std::vector<PutOp> coalesceBlocks(const std::vector<BlockCopy>& blocks) {
  std::vector<PutOp> ops;
  ops.reserve(blocks.size());
  for (const auto& b : blocks) ops.push_back({b.local_offset, b.remote_addr, b.length});
  auto by_local = [](const PutOp& a, const PutOp& b) { return a.local_offset < b.local_offset; };
  if (!std::is_sorted(ops.begin(), ops.end(), by_local)) {
    std::sort(ops.begin(), ops.end(), by_local);
  }
  size_t out = 0;
  for (size_t i = 1; i < ops.size(); ++i) {
    PutOp& last = ops[out];
    if (last.local_offset + last.length == ops[i].local_offset &&
        last.remote_addr + last.length == ops[i].remote_addr) {
      last.length += ops[i].length;
    } else {
      ops[++out] = ops[i];
    }
  }
  ops.resize(ops.empty() ? 0 : out + 1);
  return ops;
}

// Every remote range must lie inside the region the peer's key describes, and the key must be
// well formed: checked before UCX sees the key (its unpack trusts its input) and before any
// write or read.
absl::StatusOr<RemoteKey> checkRemote(std::string_view peer_rkey,
                                      const std::vector<BlockCopy>& blocks) {
  KVF_ASSIGN_OR_RETURN(RemoteKey key, parseRemoteKey(peer_rkey));
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockCopy& b = blocks[i];
    if (!key.contains(b.remote_addr, b.length)) {
      return absl::OutOfRangeError(strCat("blocks[", i, "]: remote range [", b.remote_addr, ", +",
                                          b.length, ") is outside the peer's region [", key.base,
                                          ", +", key.length, ")"));
    }
  }
  return key;
}

namespace {

absl::Status validatePut(const PutRequest& r, const RegionImpl& source, uint32_t max_blocks) {
  if (r.blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (r.blocks.size() > max_blocks) {
    return absl::InvalidArgumentError(
        strCat("blocks: ", r.blocks.size(), " exceeds max_blocks_per_put ", max_blocks));
  }
  if (!r.notice_prefix.empty() && r.landing_id == 0) {
    return absl::InvalidArgumentError("notice_prefix: set without a landing_id");
  }
  if (r.notice_prefix.size() + r.blocks.size() > max_blocks) {
    return absl::InvalidArgumentError(
        strCat("notice_prefix + blocks: ", r.notice_prefix.size() + r.blocks.size(),
               " exceeds max_blocks_per_put ", max_blocks));
  }
  if (r.peer_rkey.empty()) return absl::InvalidArgumentError("peer_rkey: empty");
  if (r.deadline.count() < 0) return absl::InvalidArgumentError("deadline: negative");
  if (r.checksums == ChecksumMode::kProvided && r.provided_checksums.size() != r.blocks.size()) {
    return absl::InvalidArgumentError(strCat("provided_checksums: ", r.provided_checksums.size(),
                                             " values for ", r.blocks.size(), " blocks"));
  }
  for (size_t i = 0; i < r.blocks.size(); ++i) {
    const BlockCopy& b = r.blocks[i];
    if (b.length == 0) return absl::InvalidArgumentError(strCat("blocks[", i, "].length: 0"));
    if (!source.contains(source.base() + b.local_offset, b.length) ||
        b.local_offset > source.length()) {
      return absl::OutOfRangeError(strCat("blocks[", i, "]: local range [", b.local_offset, ", +",
                                          b.length, ") is outside the source region of ",
                                          source.length(), " bytes"));
    }
    if (b.remote_addr + b.length < b.remote_addr) {
      return absl::OutOfRangeError(strCat("blocks[", i, "]: remote range overflows"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t blockChecksum(const void* data, uint64_t length) { return XXH3_64bits(data, length); }

absl::Status Batch::check() const { return completion_.value().status(); }

absl::StatusOr<PutResult> Batch::result() const { return completion_.value(); }

void Batch::cancel() {
  auto core = core_;
  core->post([core, self = this] {
    core->cancelBatch(self, absl::CancelledError("put cancelled by the caller"));
  });
}

absl::StatusOr<std::shared_ptr<PutHandle>> Core::postPut(PutRequest request, PutCallback done) {
  auto source = std::dynamic_pointer_cast<RegionImpl>(request.source);
  if (!source || source->core_.get() != this) {
    return absl::InvalidArgumentError("source: not a region registered with this context");
  }
  KVF_RETURN_IF_ERROR(validatePut(request, *source, options_.max_blocks_per_put));
  auto remote = checkRemote(request.peer_rkey, request.blocks);
  if (!remote.ok()) {
    stats_.puts_refused.fetch_add(1);
    return remote.status();
  }
  request.peer_rkey = std::move(remote->ucx);  // what UCX unpacks, and the rkey cache's key
  auto batch = newBatch(request.deadline);
  batch->ops = coalesceBlocks(request.blocks);
  PutResult& p = batch->partial;
  p.blocks = static_cast<uint32_t>(request.blocks.size());
  p.operations = static_cast<uint32_t>(batch->ops.size());
  for (const auto& b : request.blocks) p.bytes += b.length;
  if (request.checksums == ChecksumMode::kCompute) {
    p.checksums.reserve(request.blocks.size());
    for (const auto& b : request.blocks) {
      p.checksums.push_back(blockChecksum(source->bytes() + b.local_offset, b.length));
    }
  } else if (request.checksums == ChecksumMode::kProvided) {
    p.checksums = request.provided_checksums;
  }
  if (request.landing_id != 0) {
    const auto& prefix = request.notice_prefix;
    const auto count = static_cast<uint32_t>(prefix.size() + p.blocks);
    NoticeHeader header{kNoticeMagic, count, request.landing_id,
                        p.checksums.empty() ? 0u : kNoticeHasChecksums, 0};
    batch->notice.resize(sizeof(header) + sizeof(NoticeBlock) * count);
    std::memcpy(batch->notice.data(), &header, sizeof(header));
    auto* out = reinterpret_cast<NoticeBlock*>(batch->notice.data() + sizeof(header));
    std::copy(prefix.begin(), prefix.end(), out);
    out += prefix.size();
    for (size_t i = 0; i < request.blocks.size(); ++i) {
      out[i] = {request.blocks[i].remote_addr, request.blocks[i].length,
                p.checksums.empty() ? 0 : p.checksums[i]};
    }
  }
  batch->request = std::move(request);
  batch->callback = std::move(done);
  if (!post([this, batch] { startBatch(batch); })) {
    return absl::FailedPreconditionError("transport context is shut down");
  }
  return std::shared_ptr<PutHandle>(batch);
}

std::shared_ptr<Batch> Core::newBatch(std::chrono::milliseconds deadline) {
  auto batch = std::make_shared<Batch>(shared_from_this(), next_id_.fetch_add(1));
  batch->posted_at = clock_.now();
  if (deadline.count() <= 0) deadline = options_.default_deadline;
  batch->deadline_at = batch->posted_at + std::chrono::nanoseconds(deadline).count();
  return batch;
}

void Core::opStarted(Batch& batch) {
  if (batch.outstanding++ == 0) {
    batch.drained_.store(false, std::memory_order_release);
    batch.self_ref = batch.shared_from_this();
    ++busy_batches_;
  }
}

void Core::opDone(Batch* batch) {
  if (--batch->outstanding != 0) return;
  --busy_batches_;
  if (batch->source_held) {
    batch->source_held = false;
    std::static_pointer_cast<RegionImpl>(batch->request.source)->dropUser();
  }
  batch->drained_.store(true, std::memory_order_release);
  std::shared_ptr<Batch> keep = std::move(batch->self_ref);
  if (batch->completion_.done()) untrackBatch(*batch);
}

void Core::untrackBatch(Batch& batch) {
  auto it = peers_.find(batch.peer_key);
  if (it != peers_.end()) it->second->batches.erase(&batch);
}

void Core::startBatch(const std::shared_ptr<Batch>& batch) {
  auto source = std::static_pointer_cast<RegionImpl>(batch->request.source);
  if (source->releasing()) {
    finishBatch(*batch, absl::FailedPreconditionError("source region is being released"));
    return;
  }
  bool new_peer = false, new_rkey = false;
  auto peer_or = getPeer(batch->request.peer_address, &new_peer);
  if (!peer_or.ok()) {
    finishBatch(*batch, peer_or.status());
    return;
  }
  Peer* peer = *peer_or;
  auto rkey_or = getRkey(*peer, batch->request.peer_rkey, &new_rkey);
  if (!rkey_or.ok()) {
    finishBatch(*batch, rkey_or.status());
    return;
  }
  batch->partial.new_endpoint = new_peer || new_rkey;
  batch->peer_key = peer->key;
  peer->batches.emplace(batch.get(), batch);
  source->addUser();
  batch->source_held = true;
  opStarted(*batch);  // posting guard: the hold outlives the loop even if requests finish early
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = batch.get();
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* b = static_cast<Batch*>(user_data);
    if (status != UCS_OK) b->put_error = status;
    b->core_->opDone(b);
  };
  ucs_status_t post_error = UCS_OK;
  for (const PutOp& op : batch->ops) {
    void* local = source->bytes() + op.local_offset;
    void* req = batch->get
                    ? ucp_get_nbx(peer->ep, local, op.length, op.remote_addr, *rkey_or, &param)
                    : ucp_put_nbx(peer->ep, local, op.length, op.remote_addr, *rkey_or, &param);
    if (UCS_PTR_IS_ERR(req)) {
      post_error = UCS_PTR_STATUS(req);
      break;
    }
    if (req != nullptr) opStarted(*batch);
  }
  if (post_error != UCS_OK) {
    // The endpoint is unusable; closing it fails every batch on it, this one included.
    closePeer(peer, ucsToStatus(post_error, batch->get ? "ucp_get_nbx" : "ucp_put_nbx"));
    opDone(batch.get());
    return;
  }
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* b = static_cast<Batch*>(user_data);
    b->core_->flushed(b->shared_from_this(), status);
  };
  void* req = ucp_ep_flush_nbx(peer->ep, &param);
  if (UCS_PTR_IS_PTR(req)) {
    opStarted(*batch);
    opDone(batch.get());  // the posting guard
    return;
  }
  opStarted(*batch);    // the flush completed inline: account for it as for a callback
  opDone(batch.get());  // the posting guard
  flushed(batch, req == nullptr ? UCS_OK : UCS_PTR_STATUS(req));
}

void Core::flushed(const std::shared_ptr<Batch>& batch, ucs_status_t status) {
  if (batch->get) {
    // Every read is done: drop the destination hold before the caller hears of it, so a
    // completed get is drained() and its destination free to reuse.
    opDone(batch.get());
    onFlushDone(batch.get(), status);
  } else {
    onFlushDone(batch.get(), status);  // may send the notice, which keeps the batch busy
    opDone(batch.get());
  }
}

void Core::onFlushDone(Batch* batch, ucs_status_t status) {
  if (status == UCS_OK) status = batch->put_error;
  if (batch->completion_.done()) {
    // Abandoned (deadline/cancel) but landed after all: tell the receiver, so its quarantined
    // landing resolves instead of waiting for this process to exit.
    if (status == UCS_OK && !batch->notice.empty()) sendNotice(batch);
    return;
  }
  if (status != UCS_OK) {
    finishBatch(*batch, ucsToStatus(status, batch->get ? "get" : "put"));
    return;
  }
  if (batch->get) {
    finishGet(batch);
    return;
  }
  if (batch->notice.empty()) {
    finishBatch(*batch, batch->partial);
    return;
  }
  sendNotice(batch);
}

void Core::sendNotice(Batch* batch) {
  auto it = peers_.find(batch->peer_key);
  if (it == peers_.end()) {
    finishBatch(*batch, absl::UnavailableError("endpoint closed before the completion notice"));
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* b = static_cast<Batch*>(user_data);
    b->core_->onNoticeSent(b, status);
    b->core_->opDone(b);
  };
  param.user_data = batch;
  const char* data = batch->notice.data();
  void* req = ucp_am_send_nbx(it->second->ep, kNoticeAmId, data, sizeof(NoticeHeader),
                              data + sizeof(NoticeHeader),
                              batch->notice.size() - sizeof(NoticeHeader), &param);
  if (req == nullptr) {
    onNoticeSent(batch, UCS_OK);
  } else if (UCS_PTR_IS_ERR(req)) {
    onNoticeSent(batch, UCS_PTR_STATUS(req));
  } else {
    opStarted(*batch);
  }
}

void Core::onNoticeSent(Batch* batch, ucs_status_t status) {
  if (status != UCS_OK) {
    finishBatch(*batch, ucsToStatus(status, "completion notice"));
  } else {
    finishBatch(*batch, batch->partial);
  }
}

void Core::finishBatch(Batch& batch, absl::StatusOr<PutResult> result) {
  if (result.ok()) result->elapsed = std::chrono::nanoseconds(clock_.now() - batch.posted_at);
  if (batch.completion_.done()) return;  // first outcome wins (only this thread completes)
  // Counters first, so a caller woken by the completion sees them.
  if (result.ok()) {
    (batch.get ? stats_.gets_ok : stats_.puts_ok).fetch_add(1);
    (batch.get ? stats_.bytes_got : stats_.bytes_put).fetch_add(result->bytes);
  } else {
    (batch.get ? stats_.gets_failed : stats_.puts_failed).fetch_add(1);
  }
  batch.completion_.complete(result);
  std::shared_ptr<Batch> keep = batch.shared_from_this();
  // Still tracked while UCX requests are outstanding (source hold, dead-peer release).
  if (batch.outstanding == 0) untrackBatch(batch);
  if (batch.callback) std::exchange(batch.callback, nullptr)(std::move(result));
}

void Core::cancelBatch(Batch* batch, absl::Status status) {
  // Abandon, don't abort: force-closing a shared-memory endpoint whose peer is alive is undefined
  // behaviour in UCX, and posted puts cannot be recalled one by one. The caller gets `status`
  // now; the puts drain in the background (the source stays held until UCX is done with it) and
  // a late completion notice still resolves the receiver's quarantined landing. disconnect()
  // closes the endpoint; a dead peer is detected by peer error mode or its pidfd.
  finishBatch(*batch, std::move(status));
}

void Core::checkDeadlines(Nanos now) {
  std::vector<Batch*> late_batches;
  for (auto& [key, peer] : peers_) {
    for (auto& [raw, batch] : peer->batches) {
      if (!batch->completion_.done() && now >= batch->deadline_at) late_batches.push_back(raw);
    }
  }
  for (Batch* batch : late_batches) {
    log::warn("transport transfer missed its deadline", "name", options_.name, "batch", batch->id_);
    cancelBatch(batch, absl::DeadlineExceededError(strCat(
                           batch->get ? "get of " : "put of ", batch->partial.blocks, " blocks (",
                           batch->partial.bytes, " bytes) did not complete within its deadline")));
  }
  std::vector<LandingImpl*> late_landings;
  for (auto& [id, landing] : landings_) {
    if (!landing->completion_.done() && now >= landing->deadline_at) {
      late_landings.push_back(landing.get());
    }
  }
  for (LandingImpl* landing : late_landings) {
    // Quarantined: the sender may still write, so the landing stays unresolved.
    finishLanding(*landing,
                  absl::DeadlineExceededError("no completion notice from the sender in time"),
                  false);
  }
}

Nanos Core::nextDeadline() const {
  Nanos next = std::numeric_limits<Nanos>::max();
  for (const auto& [key, peer] : peers_) {
    for (const auto& [raw, batch] : peer->batches) {
      if (!batch->completion_.done()) next = std::min(next, batch->deadline_at);
    }
  }
  for (const auto& [id, landing] : landings_) {
    if (!landing->completion_.done()) next = std::min(next, landing->deadline_at);
  }
  return next;
}

}  // namespace kvf::transport
