// GPU tests of the device pool (label `gpu`): an engine core whose KV pool lives in device
// memory, with its G1 <-> G2 copies on the DeviceCopier's streams (DeviceTiers). Evicted
// prefixes come back from host memory and from disk, every onboarded block checked on the
// device byte for byte against its hash (the check is shown to fail on a damaged host slot),
// the copies are gathered, and nothing is lost under a small host budget over a disk. Skips
// without a CUDA device, except the no-device case.
#include <cuda_runtime_api.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include <gtest/gtest.h>

#include "engine/device_payload.h"
#include "engine/device_tiers.h"
#include "engine/engine_core.h"
#include "engine/virtual_run.h"
#include "tests/engine/engine_test_util.h"
#include "tests/testing/cuda_device.h"
#include "tests/testing/temp_dir.h"
#include "worker/tiers/tier_config.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::engine {
namespace {

using testing::makeConfig;
using testing::promptOf;
using testing::spec;

constexpr int kBlock = 16;
constexpr int64_t kPoolBlocks = 32;
constexpr size_t kPayload = 4096;

EngineConfig deviceConfig(const std::string& tiers_yaml) {
  EngineConfig c = makeConfig(kBlock, kPoolBlocks, 8192);
  c.cache.payload_bytes_per_block = kPayload;
  c.cache.payload_memory = PayloadLocation::kDevice;
  if (!tiers_yaml.empty()) {
    auto tiers = worker::parseTierConfigText(tiers_yaml, "tiers");
    EXPECT_TRUE(tiers.ok()) << tiers.status();
    if (tiers.ok()) c.tiers = *tiers;
  }
  EXPECT_TRUE(finalizeEngineConfig(&c).ok());
  return c;
}

// An engine core over a device pool and (with `tiers:`) DeviceTiers.
struct DeviceCore {
  explicit DeviceCore(const EngineConfig& c, worker::KvEventSink* sink = nullptr) {
    auto m = DevicePayload::create(kPayload * kPoolBlocks, kPayload);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return;
    memory = *m;
    std::unique_ptr<DeviceTiers> owned;
    if (c.tiers) {
      DeviceTiersOptions o;
      o.live.store = *c.tiers;
      o.live.block_size = c.cache.block_size;
      auto t = DeviceTiers::create(std::move(o), memory);
      EXPECT_TRUE(t.ok()) << t.status();
      if (!t.ok()) return;
      owned = std::move(*t);
      tiers = owned.get();
    }
    auto made = EngineCore::create(c, sink, std::move(owned), memory);
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) core = std::move(*made);
  }
  // The offloads in flight become visible once their copies are done (a later step's poll).
  void settle() {
    if (tiers != nullptr) {
      EXPECT_TRUE(tiers->copier().drain().ok());
    }
  }
  VirtualOutcome serve(const std::string& id, int blocks, int salt) {
    VirtualOutcome out =
        runToCompletion(*core, spec(id, promptOf(blocks * kBlock + 5, salt), 2), &now);
    EXPECT_TRUE(out.finished) << "request " << id << " did not finish";
    return out;
  }
  std::shared_ptr<DevicePayload> memory;
  DeviceTiers* tiers = nullptr;
  std::unique_ptr<EngineCore> core;
  Nanos now = 0;
};

// Serves A (10 blocks), then `fillers` prompts of 20 blocks (A leaves the 32-block pool), then A
// again: what the second A saw.
VirtualOutcome evictAndRepeat(DeviceCore& d, int fillers) {
  VirtualOutcome first = d.serve("a1", 10, 1);
  EXPECT_EQ(first.cached_tokens, 0);
  for (int i = 0; i < fillers; ++i) d.serve("f" + std::to_string(i), 20, 100 + i);
  d.settle();
  return d.serve("a2", 10, 1);
}

TEST(DeviceTiersTest, WithoutADeviceTheDevicePoolIsAClearError) {
  if (kvf::testing::whyNoCudaDevice().empty()) GTEST_SKIP() << "a device is present";
  auto m = DevicePayload::create(kPayload * 4, kPayload);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_NE(m.status().message().find("payload_memory"), std::string::npos) << m.status();
}

TEST(DeviceTiersTest, TheDevicePoolWritesAndChecksItsBlocksOnTheDevice) {
  KVF_SKIP_WITHOUT_CUDA_DEVICE();
  DeviceCore d(deviceConfig(""));
  ASSERT_NE(d.core, nullptr);
  VirtualOutcome first = d.serve("a1", 10, 1);
  EXPECT_EQ(first.cached_tokens, 0);
  VirtualOutcome again = d.serve("a2", 10, 1);
  EXPECT_EQ(again.cached_tokens, 10 * kBlock);  // a G1 hit
  KvPool& pool = d.core->pool();
  EXPECT_FALSE(pool.payloadOnHost());
  KvPool::PayloadAudit audit = pool.auditPayloads();
  EXPECT_GE(audit.cached_blocks, 10);
  EXPECT_EQ(audit.corrupt_blocks, 0);
  EXPECT_GE(d.memory->stats().writes, 10u);
  EXPECT_EQ(d.memory->stats().write_errors, 0u);
  // The check reads the device: one damaged byte of one cached block is seen.
  BlockIndex victim = 0;
  while (!pool.hashOf(victim)) ++victim;
  ASSERT_EQ(cudaMemset(pool.payload(victim).data() + 7, 0x5a, 1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pool.auditPayloads().corrupt_blocks, 1);
  EXPECT_FALSE(pool.verifyPayload(victim, *pool.hashOf(victim)));
}

TEST(DeviceTiersTest, AnEvictedPrefixComesBackFromHostMemoryThroughTheCopier) {
  KVF_SKIP_WITHOUT_CUDA_DEVICE();
  worker::VectorEventSink pool_events;
  DeviceCore d(deviceConfig("host: {capacity_mib: 4}\n"), &pool_events);
  ASSERT_NE(d.core, nullptr);
  VirtualOutcome again = evictAndRepeat(d, 3);
  EXPECT_EQ(again.cached_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_disk_tokens, 0);
  EXPECT_EQ(d.core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(d.core->pool().auditPayloads().corrupt_blocks, 0);
  const DeviceTiersStats& ts = d.tiers->stats();
  EXPECT_EQ(ts.onboard_copier_blocks, 10u);
  EXPECT_EQ(ts.onboard_bounce_blocks, 0u);
  EXPECT_EQ(ts.offload_via_host, 0u);
  EXPECT_EQ(ts.offload_copy_errors, 0u);
  EXPECT_EQ(d.tiers->live().offloadTimeouts(), 0u);
  // The copies were gathered: one call per offload batch and per onboard chunk of 8 blocks.
  const worker::DeviceCopierStats& cs = d.tiers->copier().stats();
  EXPECT_GE(cs.offload_blocks, 10u);
  EXPECT_EQ(cs.onboard_blocks, 10u);
  EXPECT_EQ(cs.onboard_batches, 1u);
  EXPECT_LT(cs.offload_batches, cs.offload_blocks);
  if (cs.batch_fallbacks == 0) {
    EXPECT_GT(cs.batched_calls, 0u);
    EXPECT_EQ(cs.per_block_copies, 0u);
  } else {
    ADD_FAILURE() << "the runtime refused cudaMemcpyBatchAsync: per-block copies ("
                  << cs.per_block_copies << ")";
  }
  // Every block the pool evicted reached host memory (one CPU store per GPU removal).
  size_t gpu_removed = 0;
  for (const worker::KvEvent& e : pool_events.events()) {
    if (const auto* r = std::get_if<worker::BlockRemoved>(&e))
      gpu_removed += r->block_hashes.size();
  }
  size_t cpu_stored = 0;
  for (const worker::KvEvent& e : d.tiers->takeEvents()) {
    if (const auto* s = std::get_if<worker::BlockStored>(&e)) {
      EXPECT_EQ(s->medium, "CPU");
      cpu_stored += s->block_hashes.size();
    }
  }
  EXPECT_GT(gpu_removed, 0u);
  EXPECT_EQ(cpu_stored, gpu_removed);
}

TEST(DeviceTiersTest, TheCpuStoresOfEvictedBlocksGoOutWithTheirGpuRemovals) {
  KVF_SKIP_WITHOUT_CUDA_DEVICE();
  worker::VectorEventSink pool_events;
  DeviceCore d(deviceConfig("host: {capacity_mib: 4}\n"), &pool_events);
  ASSERT_NE(d.core, nullptr);
  d.serve("a1", 10, 1);
  // No drain: taking the tiers' events (as the engine does after each step) is enough.
  size_t cpu_stored = 0;
  for (int i = 0; i < 4; ++i) {
    d.serve("f" + std::to_string(i), 20, 100 + i);
    for (const worker::KvEvent& e : d.tiers->takeEvents()) {
      if (const auto* s = std::get_if<worker::BlockStored>(&e))
        cpu_stored += s->block_hashes.size();
    }
    size_t gpu_removed = 0;
    for (const worker::KvEvent& e : pool_events.events()) {
      if (const auto* r = std::get_if<worker::BlockRemoved>(&e)) {
        gpu_removed += r->block_hashes.size();
      }
    }
    EXPECT_EQ(cpu_stored, gpu_removed) << "after filler " << i;
  }
  EXPECT_GT(cpu_stored, 0u);
}

TEST(DeviceTiersTest, ADamagedHostSlotIsCaughtOnTheDeviceAndRecomputed) {
  KVF_SKIP_WITHOUT_CUDA_DEVICE();
  DeviceCore d(deviceConfig("host: {capacity_mib: 4}\n"));
  ASSERT_NE(d.core, nullptr);
  d.serve("a1", 10, 1);
  for (int i = 0; i < 3; ++i) d.serve("f" + std::to_string(i), 20, 100 + i);
  d.settle();
  // One byte of every host slot: the copier moves raw bytes, so only the device check sees it.
  std::span<std::byte> arena = d.tiers->live().store().host().arena();
  for (size_t off = 0; off < arena.size(); off += kPayload) arena[off + 11] ^= std::byte{0x80};
  VirtualOutcome again = d.serve("a2", 10, 1);
  EXPECT_GT(d.core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(again.cached_tokens, 0);  // the first block failed: everything is recomputed
  EXPECT_EQ(d.core->pool().auditPayloads().corrupt_blocks, 0);  // nothing damaged was cached
}

TEST(DeviceTiersTest, ASmallHostBudgetOverADiskLosesNothing) {
  KVF_SKIP_WITHOUT_CUDA_DEVICE();
  std::filesystem::path dir = kvf::testing::freshTempDir("device-tiers-disk");
  // 256 host slots under 16 fillers of 20 blocks: host memory turns over, A is on disk only.
  worker::VectorEventSink pool_events;
  DeviceCore d(deviceConfig("host: {capacity_mib: 1}\ndisk: {dir: " + dir.string() +
                            ", capacity_mib: 64, file_mib: 1}\n"),
               &pool_events);
  ASSERT_NE(d.core, nullptr);
  VirtualOutcome again = evictAndRepeat(d, 16);
  EXPECT_EQ(again.cached_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_disk_tokens, 10 * kBlock);
  EXPECT_EQ(d.core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(d.core->pool().auditPayloads().corrupt_blocks, 0);
  // The last request's own evictions may still be copying: committed once the copies are done.
  d.settle();
  worker::TierStats st = d.tiers->live().store().stats();
  EXPECT_EQ(st.disk_onboarded, 10u);
  for (size_t r = 0; r < worker::kDropReasonCount; ++r) EXPECT_EQ(st.dropped[r], 0u) << r;
  EXPECT_EQ(d.tiers->live().offloadTimeouts(), 0u);
  EXPECT_EQ(d.tiers->stats().onboard_bounce_blocks, 10u);
  EXPECT_EQ(d.tiers->stats().onboard_no_bounce, 0u);
  EXPECT_EQ(d.tiers->stats().offload_copy_errors, 0u);
  // Every block the pool evicted (each once: distinct prompts) entered host memory, through the
  // copier or, while every slot waited for the disk, read back and offloaded with backpressure.
  size_t gpu_removed = 0;
  for (const worker::KvEvent& e : pool_events.events()) {
    if (const auto* r = std::get_if<worker::BlockRemoved>(&e))
      gpu_removed += r->block_hashes.size();
  }
  EXPECT_GT(gpu_removed, 256u);
  EXPECT_EQ(st.host_stored, gpu_removed);
}

}  // namespace
}  // namespace kvf::engine
