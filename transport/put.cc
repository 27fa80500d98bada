// Batched puts (sender) and landings (receiver) on the progress thread, plus the public facade.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "common/log.h"
#include "common/status.h"
#include "transport/core.h"
#include "transport/ucx_status.h"

namespace kvf::transport {
namespace {

constexpr uint32_t kNoticeMagic = 0x4e46564b;  // "KVFN"
constexpr uint32_t kNoticeHasChecksums = 1;

struct NoticeHeader {
  uint32_t magic;
  uint32_t count;
  uint64_t landing_id;
  uint32_t flags;
  uint32_t reserved;
};

struct NoticeBlock {
  uint64_t remote_addr;
  uint64_t length;
  uint64_t checksum;
};

// Sorts by source offset and merges blocks contiguous on both sides into one put.
std::vector<PutOp> coalesce(const std::vector<BlockCopy>& blocks) {
  std::vector<PutOp> ops;
  ops.reserve(blocks.size());
  for (const auto& b : blocks) ops.push_back({b.local_offset, b.remote_addr, b.length});
  std::sort(ops.begin(), ops.end(),
            [](const PutOp& a, const PutOp& b) { return a.local_offset < b.local_offset; });
  std::vector<PutOp> merged;
  merged.reserve(ops.size());
  for (const auto& op : ops) {
    if (!merged.empty()) {
      PutOp& last = merged.back();
      if (last.local_offset + last.length == op.local_offset &&
          last.remote_addr + last.length == op.remote_addr) {
        last.length += op.length;
        continue;
      }
    }
    merged.push_back(op);
  }
  return merged;
}

absl::Status validatePut(const PutRequest& r, const RegionImpl& source, uint32_t max_blocks) {
  if (r.blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (r.blocks.size() > max_blocks) {
    return absl::InvalidArgumentError(
        strCat("blocks: ", r.blocks.size(), " exceeds max_blocks_per_put ", max_blocks));
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

uint64_t randomId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

}  // namespace

uint64_t blockChecksum(const void* data, uint64_t length) { return XXH3_64bits(data, length); }

// ---- MemoryRegion ----------------------------------------------------------------------------

RegionImpl::RegionImpl(std::shared_ptr<Core> core, void* ptr, uint64_t length, ucp_mem_h memh,
                       std::string rkey)
    : core_(std::move(core)), ptr_(ptr), length_(length), memh_(memh), rkey_(std::move(rkey)) {}

RegionImpl::~RegionImpl() {
  ucp_mem_h memh = memh_;
  if (!memh) return;
  auto core = core_;
  RegionImpl* self = this;
  // The progress thread unmaps; if it already stopped, shutdown unmapped every region.
  // Blocks until done so shutdown never sees a dangling pointer in regions_.
  (void)core->call<absl::Status>([core, memh, self] {
    core->regions_.erase(self);
    if (!core->stopped_.load()) ucp_mem_unmap(core->ucpContext(), memh);
    return absl::OkStatus();
  });
}

void RegionImpl::unmapNow() {
  if (memh_) ucp_mem_unmap(core_->ucpContext(), memh_);
  memh_ = nullptr;
}

void RegionImpl::dropUser() {
  if (users_.fetch_sub(1) == 1 && release_requested_ && memh_) {
    core_->regions_.erase(this);
    unmapNow();
    if (release_done_) std::exchange(release_done_, nullptr)();
  }
}

void RegionImpl::release(std::function<void()> done) {
  auto self = shared_from_this();
  bool posted = core_->post([self, done = std::move(done)]() mutable {
    self->release_requested_ = true;
    if (self->users_.load() == 0) {
      self->core_->regions_.erase(self.get());
      self->unmapNow();
      if (done) done();
    } else {
      self->release_done_ = std::move(done);
    }
  });
  if (!posted && done) done();  // context gone: shutdown already unmapped everything
}

absl::StatusOr<std::shared_ptr<MemoryRegion>> Core::registerMemory(void* ptr, uint64_t length) {
  if (ptr == nullptr || length == 0) {
    return absl::InvalidArgumentError("registerMemory: null pointer or zero length");
  }
  return mapMemory(ptr, length);
}

absl::StatusOr<std::shared_ptr<MemoryRegion>> Core::allocateMemory(uint64_t length) {
  if (length == 0) return absl::InvalidArgumentError("allocateMemory: zero length");
  return mapMemory(nullptr, length);
}

absl::StatusOr<std::shared_ptr<MemoryRegion>> Core::mapMemory(void* ptr, uint64_t length) {
  auto self = shared_from_this();
  return call<absl::StatusOr<std::shared_ptr<MemoryRegion>>>(
      [&]() -> absl::StatusOr<std::shared_ptr<MemoryRegion>> {
        ucp_mem_map_params_t params{};
        params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                            UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        params.address = ptr;
        params.length = length;
        // Without an address UCX allocates, from shared memory when a shm transport is on, so
        // peers on the host write into it directly instead of through active messages.
        params.flags = ptr == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
        ucp_mem_h memh = nullptr;
        KVF_RETURN_IF_ERROR(ucsToStatus(ucp_mem_map(context_, &params, &memh), "ucp_mem_map"));
        ucp_mem_attr_t attr{};
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        ucs_status_t status = ucp_mem_query(memh, &attr);
        void* buffer = nullptr;
        size_t size = 0;
        if (status == UCS_OK) status = ucp_rkey_pack(context_, memh, &buffer, &size);
        if (status != UCS_OK) {
          ucp_mem_unmap(context_, memh);
          return ucsToStatus(status, "ucp_mem_query/ucp_rkey_pack");
        }
        std::string rkey(static_cast<const char*>(buffer), size);
        ucp_rkey_buffer_release(buffer);
        auto region = std::make_shared<RegionImpl>(
            self, ptr ? ptr : attr.address, ptr ? length : attr.length, memh, std::move(rkey));
        regions_.insert(region.get());
        return std::shared_ptr<MemoryRegion>(region);
      });
}

// ---- Sender: batched put ---------------------------------------------------------------------

absl::Status Batch::check() const {
  auto r = completion_.value();
  return r.status();
}

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
  auto batch = std::make_shared<Batch>(shared_from_this(), next_id_.fetch_add(1));
  batch->posted_at = clock_.now();
  auto deadline = request.deadline.count() > 0 ? request.deadline : options_.default_deadline;
  batch->deadline_at = batch->posted_at + std::chrono::nanoseconds(deadline).count();
  batch->ops = coalesce(request.blocks);
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
    NoticeHeader header{kNoticeMagic, p.blocks, request.landing_id,
                        p.checksums.empty() ? 0u : kNoticeHasChecksums, 0};
    batch->notice.resize(sizeof(header) + sizeof(NoticeBlock) * p.blocks);
    std::memcpy(batch->notice.data(), &header, sizeof(header));
    auto* out = reinterpret_cast<NoticeBlock*>(batch->notice.data() + sizeof(header));
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

void Core::opStarted(Batch& batch) {
  if (batch.outstanding++ == 0) {
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
    void* req = ucp_put_nbx(peer->ep, source->bytes() + op.local_offset, op.length, op.remote_addr,
                            *rkey_or, &param);
    if (UCS_PTR_IS_ERR(req)) {
      post_error = UCS_PTR_STATUS(req);
      break;
    }
    if (req != nullptr) opStarted(*batch);
  }
  if (post_error != UCS_OK) {
    // The endpoint is unusable; closing it fails every batch on it, this one included.
    closePeer(peer, ucsToStatus(post_error, "ucp_put_nbx"));
    opDone(batch.get());
    return;
  }
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* b = static_cast<Batch*>(user_data);
    b->core_->onFlushDone(b, status);
    b->core_->opDone(b);
  };
  void* req = ucp_ep_flush_nbx(peer->ep, &param);
  if (req == nullptr) {
    onFlushDone(batch.get(), UCS_OK);
  } else if (UCS_PTR_IS_ERR(req)) {
    onFlushDone(batch.get(), UCS_PTR_STATUS(req));
  } else {
    opStarted(*batch);
  }
  opDone(batch.get());
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
    finishBatch(*batch, ucsToStatus(status, "put"));
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
  if (!batch.completion_.complete(result)) return;
  if (result.ok()) {
    stats_.puts_ok.fetch_add(1);
    stats_.bytes_put.fetch_add(result->bytes);
  } else {
    stats_.puts_failed.fetch_add(1);
  }
  std::shared_ptr<Batch> keep = batch.shared_from_this();
  // Still tracked while UCX requests are outstanding (source hold, dead-peer release).
  if (batch.outstanding == 0) untrackBatch(batch);
  if (batch.callback) std::exchange(batch.callback, nullptr)(std::move(result));
}

void Core::cancelBatch(Batch* batch, absl::Status status) {
  // Abandon, don't abort: force-closing a shared-memory endpoint whose peer is alive is undefined
  // behaviour in UCX, and posted puts cannot be recalled one by one. The caller gets `status`
  // now; the puts drain in the background (the source stays held until UCX is done with it) and
  // a late completion notice still resolves the receiver's quarantined landing. disconnect() is
  // the hard stop; a dead peer is detected by peer error mode or its pidfd.
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
    log::warn("transport put missed its deadline", "name", options_.name, "batch", batch->id_);
    cancelBatch(batch, absl::DeadlineExceededError(strCat(
                           "put of ", batch->partial.blocks, " blocks (", batch->partial.bytes,
                           " bytes) did not complete within its deadline")));
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

// ---- Receiver: landings ----------------------------------------------------------------------

void LandingImpl::cancel() {
  auto core = core_;
  core->post([core, self = shared_from_this()] { core->cancelLanding(self.get()); });
}

absl::StatusOr<std::shared_ptr<Landing>> Core::expectPut(
    const std::shared_ptr<MemoryRegion>& region, LandingSpec spec, LandingCallback done) {
  auto target = std::dynamic_pointer_cast<RegionImpl>(region);
  if (!target || target->core_.get() != this) {
    return absl::InvalidArgumentError("region: not a region registered with this context");
  }
  if (spec.blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (spec.blocks.size() > options_.max_blocks_per_put) {
    return absl::InvalidArgumentError(
        strCat("blocks: ", spec.blocks.size(), " exceeds max_blocks_per_put"));
  }
  for (size_t i = 0; i < spec.blocks.size(); ++i) {
    if (spec.blocks[i].length == 0 ||
        !target->contains(spec.blocks[i].remote_addr, spec.blocks[i].length)) {
      return absl::OutOfRangeError(strCat("blocks[", i, "]: [", spec.blocks[i].remote_addr, ", +",
                                          spec.blocks[i].length,
                                          ") is empty or outside the landing region"));
    }
  }
  KVF_RETURN_IF_ERROR(decodePeerAddress(spec.sender_address).status());
  auto landing = std::make_shared<LandingImpl>(shared_from_this(), randomId());
  auto deadline = spec.deadline.count() > 0 ? spec.deadline : options_.default_deadline;
  landing->deadline_at = clock_.now() + std::chrono::nanoseconds(deadline).count();
  landing->region = std::move(target);
  landing->spec = std::move(spec);
  landing->callback = std::move(done);
  return call<absl::StatusOr<std::shared_ptr<Landing>>>(
      [&]() -> absl::StatusOr<std::shared_ptr<Landing>> {
        if (landing->region->releasing()) {
          return absl::FailedPreconditionError("region is being released");
        }
        bool created = false;
        // An endpoint to the sender watches it (peer error mode and/or pidfd).
        KVF_ASSIGN_OR_RETURN(Peer * peer, getPeer(landing->spec.sender_address, &created));
        landing->peer_key = peer->key;
        peer->landings.emplace(landing.get(), landing);
        landings_.emplace(landing->id_, landing);
        landing->region->addUser();
        return std::shared_ptr<Landing>(landing);
      });
}

void Core::finishLanding(LandingImpl& landing, absl::Status status, bool resolved) {
  std::shared_ptr<LandingImpl> keep = landing.shared_from_this();
  // Resolve before completing, so a caller woken by the completion sees resolved().
  if (resolved) resolveLanding(landing);
  if (landing.completion_.complete(status)) {
    if (status.ok()) {
      stats_.landings_ok.fetch_add(1);
    } else {
      stats_.landings_failed.fetch_add(1);
    }
    if (landing.callback) std::exchange(landing.callback, nullptr)(status);
  }
}

void Core::resolveLanding(LandingImpl& landing) {
  if (landing.resolved_.exchange(true)) return;
  std::shared_ptr<LandingImpl> keep = landing.shared_from_this();
  landings_.erase(landing.id_);
  auto it = peers_.find(landing.peer_key);
  if (it != peers_.end()) it->second->landings.erase(&landing);
  landing.region->dropUser();
}

void Core::cancelLanding(LandingImpl* landing) {
  // The sender may still be writing: cancelled but quarantined until it completes or dies.
  finishLanding(*landing, absl::CancelledError("landing cancelled by the receiver"), false);
}

void Core::onNotice(const void* header, size_t header_len, const void* data, size_t len) {
  static log::RateLimitedLog bad_notice;
  NoticeHeader h{};
  if (header_len != sizeof(h)) {
    bad_notice.warn("transport: malformed completion notice", "header_bytes", header_len);
    return;
  }
  std::memcpy(&h, header, sizeof(h));
  if (h.magic != kNoticeMagic || h.count > options_.max_blocks_per_put ||
      len != size_t(h.count) * sizeof(NoticeBlock)) {
    bad_notice.warn("transport: malformed completion notice", "count", h.count, "bytes", len);
    return;
  }
  auto it = landings_.find(h.landing_id);
  if (it == landings_.end()) {
    bad_notice.warn("transport: completion notice for an unknown landing", "id", h.landing_id);
    return;
  }
  std::shared_ptr<LandingImpl> landing = it->second;
  const auto& expected = landing->spec.blocks;
  std::vector<NoticeBlock> blocks(h.count);
  if (len > 0) std::memcpy(blocks.data(), data, len);
  absl::Status status;
  if (blocks.size() != expected.size()) {
    status = absl::DataLossError(
        strCat("sender reported ", blocks.size(), " blocks, expected ", expected.size()));
  }
  for (size_t i = 0; status.ok() && i < blocks.size(); ++i) {
    if (blocks[i].remote_addr != expected[i].remote_addr ||
        blocks[i].length != expected[i].length) {
      status = absl::DataLossError(strCat("block ", i, ": sender wrote [", blocks[i].remote_addr,
                                          ", +", blocks[i].length, "), expected [",
                                          expected[i].remote_addr, ", +", expected[i].length, ")"));
    }
  }
  if (status.ok() && landing->spec.verify_checksums) {
    if (!(h.flags & kNoticeHasChecksums)) {
      status = absl::DataLossError("checksums required but the sender sent none");
    }
    const char* base = landing->region->bytes();
    for (size_t i = 0; status.ok() && i < blocks.size(); ++i) {
      uint64_t got =
          blockChecksum(base + (blocks[i].remote_addr - landing->region->base()), blocks[i].length);
      if (got != blocks[i].checksum) {
        stats_.checksum_mismatches.fetch_add(1);
        status = absl::DataLossError(strCat("block ", i, " at ", blocks[i].remote_addr,
                                            ": checksum mismatch (sender ", blocks[i].checksum,
                                            ", landed ", got, ")"));
      }
    }
  }
  // The notice follows the flush on the same endpoint: every write of the batch has landed.
  finishLanding(*landing, status, true);
}

// ---- Facade ----------------------------------------------------------------------------------

namespace {

class Context final : public TransportContext {
 public:
  explicit Context(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~Context() override { core_->shutdown(); }
  std::string transportsInUse() const override { return core_->tls(); }
  bool supportsCudaMemory() const override { return core_->cudaMemory(); }
  const std::string& workerAddress() const override { return core_->address(); }
  absl::StatusOr<std::shared_ptr<MemoryRegion>> registerMemory(void* ptr,
                                                               uint64_t length) override {
    return core_->registerMemory(ptr, length);
  }
  absl::StatusOr<std::shared_ptr<MemoryRegion>> allocateMemory(uint64_t length) override {
    return core_->allocateMemory(length);
  }
  absl::Status connect(const std::string& peer_address) override {
    return core_->connect(peer_address);
  }
  absl::StatusOr<std::shared_ptr<PutHandle>> postPut(PutRequest request,
                                                     PutCallback done) override {
    return core_->postPut(std::move(request), std::move(done));
  }
  absl::StatusOr<std::shared_ptr<Landing>> expectPut(const std::shared_ptr<MemoryRegion>& region,
                                                     LandingSpec spec,
                                                     LandingCallback done) override {
    return core_->expectPut(region, std::move(spec), std::move(done));
  }
  void disconnect(const std::string& peer_address) override { core_->disconnect(peer_address); }
  TransportStats stats() const override { return core_->stats(); }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransportContext>> TransportContext::create(
    const TransportOptions& options) {
  KVF_ASSIGN_OR_RETURN(auto core, Core::create(options));
  return std::unique_ptr<TransportContext>(new Context(std::move(core)));
}

}  // namespace kvf::transport
