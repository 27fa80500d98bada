// Memory regions (registration, rkey packing, deferred release) and the public facade.
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
        void* base = ptr ? ptr : attr.address;
        const uint64_t bytes = ptr ? length : attr.length;
        std::string rkey = packRemoteKey(reinterpret_cast<uintptr_t>(base), bytes,
                                         std::string_view(static_cast<const char*>(buffer), size));
        ucp_rkey_buffer_release(buffer);
        if (auto own = parseRemoteKey(rkey); !own.ok()) {
          ucp_mem_unmap(context_, memh);
          return absl::InternalError(
              strCat("our own packed rkey does not parse: ", std::string(own.status().message())));
        }
        auto region = std::make_shared<RegionImpl>(self, base, bytes, memh, std::move(rkey));
        regions_.insert(region.get());
        return std::shared_ptr<MemoryRegion>(region);
      });
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
  absl::StatusOr<std::shared_ptr<PutHandle>> postGet(GetRequest request,
                                                     PutCallback done) override {
    return core_->postGet(std::move(request), std::move(done));
  }
  absl::StatusOr<std::shared_ptr<Landing>> expectPut(const std::shared_ptr<MemoryRegion>& region,
                                                     LandingSpec spec,
                                                     LandingCallback done) override {
    return core_->expectPut(region, std::move(spec), std::move(done));
  }
  absl::Status disconnect(const std::string& peer_address) override {
    return core_->disconnect(peer_address);
  }
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
