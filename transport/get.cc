// Reader side: batched one-sided reads (gets) out of a peer's advertised region, with the put's
// deadline, peer-failure and coalescing machinery (a get is a Batch whose ops read), and the
// remote-key, bounds and checksum checks that let the reader distrust the holder.
#include <string>
#include <vector>

#include "common/log.h"
#include "common/status.h"
#include "transport/core.h"

namespace kvf::transport {

namespace {

absl::Status validateGet(const GetRequest& r, const RegionImpl& destination, uint32_t max_blocks) {
  if (r.blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (r.blocks.size() > max_blocks) {
    return absl::InvalidArgumentError(
        strCat("blocks: ", r.blocks.size(), " exceeds max_blocks_per_put ", max_blocks));
  }
  if (r.peer_rkey.empty()) return absl::InvalidArgumentError("peer_rkey: empty");
  if (r.deadline.count() < 0) return absl::InvalidArgumentError("deadline: negative");
  if (!r.expected_checksums.empty() && r.expected_checksums.size() != r.blocks.size()) {
    return absl::InvalidArgumentError(strCat("expected_checksums: ", r.expected_checksums.size(),
                                             " values for ", r.blocks.size(), " blocks"));
  }
  for (size_t i = 0; i < r.blocks.size(); ++i) {
    const BlockCopy& b = r.blocks[i];
    if (b.length == 0) return absl::InvalidArgumentError(strCat("blocks[", i, "].length: 0"));
    if (b.local_offset > destination.length() ||
        !destination.contains(destination.base() + b.local_offset, b.length)) {
      return absl::OutOfRangeError(strCat("blocks[", i, "]: local range [", b.local_offset, ", +",
                                          b.length, ") is outside the destination region of ",
                                          destination.length(), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<PutHandle>> Core::postGet(GetRequest request, PutCallback done) {
  auto destination = std::dynamic_pointer_cast<RegionImpl>(request.destination);
  if (!destination || destination->core_.get() != this) {
    return absl::InvalidArgumentError("destination: not a region registered with this context");
  }
  KVF_RETURN_IF_ERROR(validateGet(request, *destination, options_.max_blocks_per_put));
  // The holder's key and every remote range are checked before UCX sees the key: a crafted key
  // would make UCX attach memory of the holder's choosing, a range outside the region would read
  // whatever else the holder's process has registered.
  auto remote = checkRemote(request.peer_rkey, request.blocks);
  if (!remote.ok()) {
    stats_.gets_refused.fetch_add(1);
    return remote.status();
  }
  request.peer_rkey = std::move(remote->ucx);  // what UCX unpacks, and the rkey cache's key
  auto batch = newBatch(request.deadline);
  batch->get = true;
  batch->ops = coalesceBlocks(request.blocks);
  PutResult& p = batch->partial;
  p.blocks = static_cast<uint32_t>(request.blocks.size());
  p.operations = static_cast<uint32_t>(batch->ops.size());
  for (const auto& b : request.blocks) p.bytes += b.length;
  batch->expected = std::move(request.expected_checksums);
  if (!batch->expected.empty()) request.compute_checksums = true;
  if (request.compute_checksums) p.checksums.resize(request.blocks.size());
  batch->request.source = std::move(request.destination);
  batch->request.peer_address = std::move(request.peer_address);
  batch->request.peer_rkey = std::move(request.peer_rkey);
  batch->request.blocks = std::move(request.blocks);
  batch->request.deadline = request.deadline;
  batch->callback = std::move(done);
  if (!post([this, batch] { startBatch(batch); })) {
    return absl::FailedPreconditionError("transport context is shut down");
  }
  return std::shared_ptr<PutHandle>(batch);
}

void Core::finishGet(Batch* batch) {
  // Every read completed (the flush is ordered after them): the bytes are in the destination.
  PutResult& p = batch->partial;
  if (!p.checksums.empty()) {
    const char* base = static_cast<const char*>(batch->request.source->data());
    const auto& blocks = batch->request.blocks;
    for (size_t i = 0; i < blocks.size(); ++i) {
      p.checksums[i] = blockChecksum(base + blocks[i].local_offset, blocks[i].length);
      if (!batch->expected.empty() && p.checksums[i] != batch->expected[i]) {
        stats_.checksum_mismatches.fetch_add(1);
        log::warn("transport get read a block whose checksum does not match the holder's", "name",
                  options_.name, "block", i);
        finishBatch(*batch, absl::DataLossError(strCat("get: block ", i, " (remote address ",
                                                       blocks[i].remote_addr,
                                                       ") does not match the holder's checksum")));
        return;
      }
    }
  }
  finishBatch(*batch, p);
}

}  // namespace kvf::transport
