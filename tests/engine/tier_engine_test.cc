// The engine core with KV tiers below its pool: evicted prefixes come back from host memory and
// from disk with their bytes checked, the disk's faults (full, slow, corrupt) never lose or
// serve a wrong block, restarts tell the router what the disk holds, and the simulator's block
// accounting serves the same tiers as the live store does.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "engine/accounted_tiers.h"
#include "engine/engine_core.h"
#include "engine/live_tiers.h"
#include "engine/openai_api.h"
#include "engine/virtual_run.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/tier_test_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/block_payload.h"
#include "worker/tiers/tier_config.h"

namespace kvf::engine {
namespace {

using testing::accountedCore;
using testing::liveCore;
using testing::makeConfig;
using testing::promptOf;
using testing::spec;

constexpr int kBlock = 16;
constexpr int64_t kPoolBlocks = 32;
constexpr size_t kPayload = 256;

using Served = VirtualOutcome;

Served serve(EngineCore& core, RequestSpec s, Nanos& now) {
  const std::string id = s.id;
  Served out = runToCompletion(core, std::move(s), &now);
  EXPECT_TRUE(out.finished) << "request " << id << " did not finish";
  return out;
}

// A prompt of `blocks` full blocks and a few more tokens (the last token is always computed).
RequestSpec request(const std::string& id, int blocks, int salt) {
  return spec(id, promptOf(blocks * kBlock + 5, salt), 2);
}

EngineConfig tierConfig(const std::string& tiers_yaml) {
  EngineConfig c = makeConfig(kBlock, kPoolBlocks, 8192);
  c.cache.payload_bytes_per_block = kPayload;
  auto tiers = worker::parseTierConfigText(tiers_yaml, "tiers");
  EXPECT_TRUE(tiers.ok()) << tiers.status();
  if (tiers.ok()) c.tiers = *tiers;
  EXPECT_TRUE(finalizeEngineConfig(&c).ok());
  return c;
}

std::string diskYaml(const std::filesystem::path& dir, int disk_mib,
                     const std::string& extra = "") {
  return "host: {capacity_mib: 1, pin: off}\n"
         "disk: {dir: " +
         dir.string() + ", capacity_mib: " + std::to_string(disk_mib) + ", file_mib: 1" + extra +
         "}\n";
}

// A live core over host memory (256 slots) and a disk tier in a fresh folder.
struct LiveDiskCore {
  LiveDiskCore(const std::string& name, int disk_mib, const std::string& extra = "")
      : dir(kvf::testing::freshTempDir(name)) {
    core = liveCore(tierConfig(diskYaml(dir, disk_mib, extra)), nullptr, &tiers);
  }
  std::filesystem::path dir;
  LiveTiers* tiers = nullptr;
  std::unique_ptr<EngineCore> core;
  Nanos now = 0;
};

// Serves prompt A, then `fillers` other prompts of 20 blocks (A leaves the 32-block pool after
// two), then A again: what the second A saw.
Served evictAndRepeat(EngineCore& core, int fillers, Nanos& now) {
  Served first = serve(core, request("a1", 10, 1), now);
  EXPECT_EQ(first.cached_tokens, 0);
  for (int i = 0; i < fillers; ++i) serve(core, request("f" + std::to_string(i), 20, 100 + i), now);
  return serve(core, request("a2", 10, 1), now);
}

TEST(TierEngineTest, WithoutTiersAnEvictedPrefixIsRecomputed) {
  EngineConfig c = makeConfig(kBlock, kPoolBlocks, 8192);
  auto core = EngineCore::create(c, nullptr);
  ASSERT_TRUE(core.ok());
  Nanos now = 0;
  Served again = evictAndRepeat(**core, 3, now);
  EXPECT_EQ(again.cached_tokens, 0);
}

TEST(TierEngineTest, AccountedTiersServeAnEvictedPrefixFromHostMemory) {
  EngineConfig c = tierConfig("host: {capacity_mib: 1}\n");
  auto core = accountedCore(c);
  ASSERT_NE(core, nullptr);
  Nanos now = 0;
  Served again = evictAndRepeat(*core, 3, now);
  EXPECT_EQ(again.cached_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_disk_tokens, 0);
  EXPECT_EQ(core->stats().tier_host_tokens, 10u * kBlock);
  EXPECT_EQ(core->stats().tier_disk_tokens, 0u);
  // Swap-in finishes before the step that needs it: the first token waits for the onboard.
  EXPECT_GE(again.ttft, core->timing().onboardDuration(10 * kBlock, 0));
}

TEST(TierEngineTest, LiveTiersServeFromHostMemoryWithTheBytesThatWereEvicted) {
  EngineConfig c = tierConfig("host: {capacity_mib: 1, pin: off}\n");
  worker::VectorEventSink pool_events;
  LiveTiers* tiers = nullptr;
  auto core = liveCore(c, &pool_events, &tiers);
  ASSERT_NE(core, nullptr);
  Nanos now = 0;
  Served again = evictAndRepeat(*core, 3, now);
  EXPECT_EQ(again.cached_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_tokens, 10 * kBlock);
  EXPECT_EQ(core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(core->pool().auditPayloads().corrupt_blocks, 0);
  worker::TierStats st = tiers->store().stats();
  EXPECT_EQ(st.host_onboarded, 10u);
  EXPECT_EQ(tiers->offloadTimeouts(), 0u);

  // Events: the pool's are GPU; the tiers' are CPU, as vLLM's OffloadingConnector writes them.
  size_t gpu_removed = 0;
  for (const worker::KvEvent& e : pool_events.events()) {
    if (const auto* r = std::get_if<worker::BlockRemoved>(&e)) {
      EXPECT_EQ(r->medium, "GPU");
      gpu_removed += r->block_hashes.size();
    }
  }
  EXPECT_GT(gpu_removed, 0u);
  size_t cpu_stored = 0;
  for (const worker::KvEvent& e : tiers->takeEvents()) {
    const auto* s = std::get_if<worker::BlockStored>(&e);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->medium, "CPU");
    EXPECT_TRUE(s->token_ids.empty());
    EXPECT_FALSE(s->parent_block_hash.has_value());
    EXPECT_EQ(s->block_size, kBlock);
    cpu_stored += s->block_hashes.size();
  }
  EXPECT_EQ(cpu_stored, gpu_removed);  // every evicted block reached host memory
}

TEST(TierEngineTest, LiveTiersServeFromDiskOnceHostMemoryTurnedOver) {
  LiveDiskCore live("tier-disk", 64);
  ASSERT_NE(live.core, nullptr);
  EngineCore* core = live.core.get();
  LiveTiers* tiers = live.tiers;
  Nanos& now = live.now;
  // 16 fillers of 20 blocks turn the 256-slot host memory over: A is on disk only.
  Served again = evictAndRepeat(*core, 16, now);
  EXPECT_EQ(again.cached_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_tokens, 10 * kBlock);
  EXPECT_EQ(again.tier_disk_tokens, 10 * kBlock);
  EXPECT_EQ(core->stats().tier_disk_tokens, 10u * kBlock);
  EXPECT_EQ(core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(core->pool().auditPayloads().corrupt_blocks, 0);
  worker::TierStats st = tiers->store().stats();
  EXPECT_EQ(st.disk_onboarded, 10u);
  for (size_t r = 0; r < worker::kDropReasonCount; ++r) EXPECT_EQ(st.dropped[r], 0u) << r;
  // A disk-served prefix waits longer than a host-served one would have.
  EXPECT_GE(again.ttft, core->timing().onboardDuration(0, 10 * kBlock));
  bool disk_medium = false;
  for (const worker::KvEvent& e : tiers->takeEvents()) {
    if (const auto* s = std::get_if<worker::BlockStored>(&e)) disk_medium |= s->medium == "DISK";
  }
  EXPECT_TRUE(disk_medium);
}

TEST(TierEngineTest, ACorruptedDiskFileIsDetectedAndTheRequestRecomputes) {
  LiveDiskCore live("tier-corrupt", 64);
  ASSERT_NE(live.core, nullptr);
  EngineCore* core = live.core.get();
  LiveTiers* tiers = live.tiers;
  Nanos& now = live.now;
  const std::filesystem::path& dir = live.dir;
  serve(*core, request("a1", 10, 1), now);
  for (int i = 0; i < 16; ++i) serve(*core, request("f" + std::to_string(i), 20, 100 + i), now);
  ASSERT_TRUE(tiers->store().flush(std::chrono::seconds(10)));
  testing::corruptSlabFiles(dir);
  Served again = serve(*core, request("a2", 10, 1), now);
  EXPECT_EQ(again.tier_tokens, 0);
  EXPECT_EQ(again.cached_tokens, 0);  // recomputed
  EXPECT_EQ(core->stats().tier_onboard_failures, 1u);
  EXPECT_GE(tiers->store().stats().droppedBy(worker::DropReason::kCorrupt), 1u);
  EXPECT_EQ(core->pool().auditPayloads().corrupt_blocks, 0);
  EXPECT_EQ(core->onboardPayloadMismatches(), 0u);  // the store caught it before the engine
}

TEST(TierEngineTest, ASlowDiskIsBackpressureAndLosesNoBlock) {
  LiveDiskCore live("tier-slow", 64, ", fault_io_delay_us: 3000, max_queued_writes: 4");
  ASSERT_NE(live.core, nullptr);
  EngineCore* core = live.core.get();
  LiveTiers* tiers = live.tiers;
  Nanos& now = live.now;
  Served again = evictAndRepeat(*core, 16, now);
  EXPECT_EQ(again.cached_tokens, 10 * kBlock);
  worker::TierStats st = tiers->store().stats();
  EXPECT_GT(tiers->offloadWaits(), 0u);  // evictions waited for the disk
  EXPECT_EQ(tiers->offloadTimeouts(), 0u);
  for (size_t r = 0; r < worker::kDropReasonCount; ++r) EXPECT_EQ(st.dropped[r], 0u) << r;
  ASSERT_TRUE(tiers->store().flush(std::chrono::seconds(30)));
  st = tiers->store().stats();
  // Every block the pool evicted is still held below it.
  EXPECT_EQ(st.host_stored, st.host.resident + st.host_moved_down);
  EXPECT_EQ(st.disk_blocks, st.disk_written);
}

TEST(TierEngineTest, AFullDiskDropsItsOldestBlocksCountedAndKeepsServing) {
  LiveDiskCore live("tier-full", 1);  // 1 MiB: 128 disk slots
  ASSERT_NE(live.core, nullptr);
  EngineCore* core = live.core.get();
  LiveTiers* tiers = live.tiers;
  Nanos& now = live.now;
  Served again = evictAndRepeat(*core, 24, now);
  EXPECT_EQ(again.cached_tokens, 0);  // A was the oldest: dropped by the disk's budget
  worker::TierStats st = tiers->store().stats();
  EXPECT_GT(st.droppedBy(worker::DropReason::kCapacity), 0u);
  EXPECT_EQ(st.droppedBy(worker::DropReason::kLostBeforeWrite), 0u);
  EXPECT_EQ(st.droppedBy(worker::DropReason::kCorrupt), 0u);
  EXPECT_EQ(tiers->offloadTimeouts(), 0u);
  // The most recent filler is still below the pool.
  Served filler = serve(*core, request("f23-again", 20, 100 + 23), now);
  EXPECT_GT(filler.cached_tokens, 0);
}

std::vector<worker::KvEvent> restartEvents(const std::filesystem::path& dir,
                                           const std::string& on_start) {
  EngineConfig c = tierConfig(diskYaml(dir, 64, ", on_start: " + on_start));
  LiveTiersOptions o;
  o.store = *c.tiers;
  auto tiers = LiveTiers::create(o);
  EXPECT_TRUE(tiers.ok()) << tiers.status();
  return tiers.ok() ? (*tiers)->takeEvents() : std::vector<worker::KvEvent>{};
}

TEST(TierEngineTest, ARestartTellsTheRouterWhatTheDiskHolds) {
  auto dir = kvf::testing::freshTempDir("tier-restart");
  std::vector<worker::BlockHash> hashes;
  {
    EngineConfig c = tierConfig(diskYaml(dir, 64));
    LiveTiersOptions o;
    o.store = *c.tiers;
    auto tiers = LiveTiers::create(o);
    ASSERT_TRUE(tiers.ok()) << tiers.status();
    std::vector<std::vector<std::byte>> bytes;
    std::vector<std::span<const std::byte>> spans;
    for (uint64_t k = 1; k <= 40; ++k) {
      hashes.emplace_back(k * 7919);
      bytes.emplace_back(kPayload);
      worker::fillBlockPayload(hashes.back(), bytes.back());
    }
    for (const auto& b : bytes) spans.emplace_back(b);
    (*tiers)->offload(hashes, spans);
    ASSERT_TRUE((*tiers)->store().flush(std::chrono::seconds(10)));
  }
  // rebuild: one DISK BlockStored with every recovered key.
  std::vector<worker::BlockHash> recovered;
  for (const worker::KvEvent& e : restartEvents(dir, "rebuild")) {
    if (const auto* s = std::get_if<worker::BlockStored>(&e)) {
      EXPECT_EQ(s->medium, "DISK");
      recovered.insert(recovered.end(), s->block_hashes.begin(), s->block_hashes.end());
    }
  }
  std::sort(recovered.begin(), recovered.end());
  std::vector<worker::BlockHash> expected = hashes;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(recovered, expected);
  // clear: the router is told everything of this instance is gone.
  std::vector<worker::KvEvent> cleared = restartEvents(dir, "clear");
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<worker::AllBlocksCleared>(cleared[0]));
  // ... and a rebuild after it finds nothing.
  for (const worker::KvEvent& e : restartEvents(dir, "rebuild")) {
    EXPECT_FALSE(std::holds_alternative<worker::BlockStored>(e));
  }
}

TEST(TierEngineTest, ConcurrentOnboardAndEvictionOfTheSameBlocksNeverServeWrongBytes) {
  EngineConfig c = tierConfig("host: {capacity_mib: 1, pin: off}\n");  // 256 slots
  LiveTiersOptions o;
  o.store = *c.tiers;
  auto created = LiveTiers::create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  LiveTiers& tiers = **created;
  auto offloadRange = [&](uint64_t first, uint64_t n) {
    std::vector<worker::BlockHash> hashes;
    std::vector<std::vector<std::byte>> bytes;
    std::vector<std::span<const std::byte>> spans;
    for (uint64_t k = first; k < first + n; ++k) {
      hashes.emplace_back(k);
      bytes.emplace_back(kPayload);
      worker::fillBlockPayload(hashes.back(), bytes.back());
    }
    for (const auto& b : bytes) spans.emplace_back(b);
    tiers.offload(hashes, spans);
  };
  offloadRange(1, 200);
  std::vector<worker::BlockHash> want;
  for (uint64_t k = 1; k <= 200; ++k) want.emplace_back(k);
  std::vector<std::vector<std::byte>> dst(200, std::vector<std::byte>(kPayload));
  std::vector<std::span<std::byte>> spans(dst.begin(), dst.end());
  std::unique_ptr<TierOnboard> copy = tiers.onboard(want, spans);
  offloadRange(1000, 600);  // turns host memory over while the copy runs: the same blocks leave
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!copy->done() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(copy->done());
  for (size_t i = 0; i < copy->readyPrefix(); ++i) {
    EXPECT_TRUE(worker::verifyBlockPayload(want[i], dst[i])) << "block " << i;
  }
  EXPECT_EQ(copy->readyPrefix(), 200u);  // pinned blocks stay until their copy is done
  EXPECT_EQ(tiers.store().stats().droppedBy(worker::DropReason::kCorrupt), 0u);
}

TEST(TierEngineTest, SimulatorAccountingAndLiveStoreServeARepeatedPrefixFromTheSameTier) {
  auto dir = kvf::testing::freshTempDir("tier-agree");
  for (int fillers : {3, 16}) {
    EngineConfig c = tierConfig(diskYaml(dir / std::to_string(fillers), 64));
    auto live = liveCore(c, nullptr);
    auto sim = accountedCore(c);
    ASSERT_NE(live, nullptr);
    ASSERT_NE(sim, nullptr);
    Nanos live_now = 0;
    Nanos sim_now = 0;
    Served a = evictAndRepeat(*live, fillers, live_now);
    Served b = evictAndRepeat(*sim, fillers, sim_now);
    EXPECT_EQ(a.cached_tokens, b.cached_tokens) << fillers;
    EXPECT_EQ(live->stats().tier_host_tokens, sim->stats().tier_host_tokens) << fillers;
    EXPECT_EQ(live->stats().tier_disk_tokens, sim->stats().tier_disk_tokens) << fillers;
    EXPECT_EQ(a.ttft, b.ttft) << fillers;  // the same modelled onboard time
    const bool on_disk = fillers == 16;
    EXPECT_EQ(sim->stats().tier_disk_tokens > 0, on_disk) << fillers;
  }
}

}  // namespace
}  // namespace kvf::engine

namespace kvf::engine {
namespace {

// The simulator's tiers publish what the live ones do: a block entering host memory is a CPU
// store, one written to disk a DISK store, one leaving host memory for disk a CPU removal.
TEST(TierEngineTest, AccountedTiersPublishTheirStoresAndRemovalsByMedium) {
  worker::TieredStoreOptions options;
  options.host.block_bytes = 4096;
  options.host.capacity_bytes = 2 * 4096;  // two host slots
  worker::DiskTierOptions disk;
  disk.capacity_bytes = 64 * worker::diskSlotBytes(4096);
  options.disk = disk;
  AccountedTiers tiers(options);
  std::vector<worker::BlockHash> hashes = {worker::BlockHash(1), worker::BlockHash(2),
                                           worker::BlockHash(3)};
  std::vector<std::span<const std::byte>> none(hashes.size());
  tiers.offload(hashes, none);
  std::vector<worker::KvEvent> events = tiers.takeEvents();
  std::vector<std::string> seen;
  for (const worker::KvEvent& e : events) {
    if (const auto* s = std::get_if<worker::BlockStored>(&e)) {
      for (auto h : s->block_hashes) seen.push_back("+" + *s->medium + std::to_string(h.value()));
    } else if (const auto* r = std::get_if<worker::BlockRemoved>(&e)) {
      for (auto h : r->block_hashes) seen.push_back("-" + *r->medium + std::to_string(h.value()));
    }
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"+DISK1", "+CPU1", "+DISK2", "+CPU2", "+DISK3", "+CPU3",
                                            "-CPU1"}));
  EXPECT_TRUE(tiers.takeEvents().empty());
  // Offloading a block the tiers already hold changes nothing a router sees.
  std::vector<worker::BlockHash> again = {worker::BlockHash(3)};
  std::vector<std::span<const std::byte>> one(1);
  tiers.offload(again, one);
  EXPECT_TRUE(tiers.takeEvents().empty());
}

// The usage block reports the part of the prefix hit that came from each lower tier, and says
// nothing of tiers when none supplied any (vLLM's shape).
TEST(TierEngineTest, UsageReportsTheTiersShareOfTheCachedTokens) {
  CompletionSummary s;
  s.prompt_tokens = 400;
  s.cached_tokens = 320;
  boost::json::object plain = usageJson(s)["prompt_tokens_details"].as_object();
  EXPECT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain["cached_tokens"].as_int64(), 320);
  s.tier_tokens = 256;
  s.tier_disk_tokens = 64;
  boost::json::object tiered = usageJson(s)["prompt_tokens_details"].as_object();
  EXPECT_EQ(tiered["cached_tokens"].as_int64(), 320);
  EXPECT_EQ(tiered["kvf_cpu_cached_tokens"].as_int64(), 192);
  EXPECT_EQ(tiered["kvf_disk_cached_tokens"].as_int64(), 64);
}

// Three requests whose prefixes come back from host memory at once, each needing more than
// the pool has left once the others' onboards hold their blocks: an onboarded request waiting
// for the rest of its blocks while the others hold theirs must not stall the engine (nothing
// runs, so nothing would ever free a block). Every request finishes, in bounded steps.
TEST(TierEngineTest, OnboardedRequestsHoldingBlocksNeverDeadlockThePool) {
  EngineConfig c = tierConfig("host: {capacity_mib: 1}\n");
  auto core = accountedCore(c);
  ASSERT_NE(core, nullptr);
  Nanos now = 0;
  // Prefixes of 12 blocks each, served and then evicted to host memory by a 30-block filler.
  for (int p = 0; p < 3; ++p) serve(*core, request("p" + std::to_string(p), 12, 10 + p), now);
  serve(*core, request("filler", 30, 99), now);
  // Each follow-up: its 12 cached blocks plus 10 new ones (22 of the pool's 32).
  std::vector<std::string> ids;
  for (int p = 0; p < 3; ++p) {
    std::vector<TokenId> prompt = promptOf(12 * kBlock, 10 + p);
    std::vector<TokenId> more = promptOf(10 * kBlock + 5, 50 + p);
    prompt.insert(prompt.end(), more.begin(), more.end());
    ids.push_back("q" + std::to_string(p));
    ASSERT_TRUE(core->add(spec(ids.back(), prompt, 2), now).ok());
  }
  std::set<std::string> finished;
  int64_t onboarded = 0;
  StepResult r;
  for (int i = 0; i < 10'000 && finished.size() < ids.size(); ++i) {
    if (!core->hasWork()) {
      std::optional<Nanos> ready = core->nextOnboardReady();
      ASSERT_TRUE(ready.has_value()) << "nothing runs and nothing is onboarding";
      now = std::max(now, *ready);
    }
    core->step(now, &r);
    now += std::max<Nanos>(r.duration, 1'000'000);
    for (const RequestOutput& o : r.outputs) {
      if (!o.finish) continue;
      finished.insert(o.id);
      onboarded += o.tier_tokens;
    }
  }
  EXPECT_EQ(finished.size(), ids.size()) << "the engine stalled with requests holding blocks";
  EXPECT_GT(onboarded, 0);
}

}  // namespace
}  // namespace kvf::engine
