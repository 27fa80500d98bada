// Queued-time prefetch (tiers.prefetch.mode: queued): a request waiting behind others has its
// disk-only prefix promoted into host memory and onboards it from there at admission, in the
// live engine (real bytes, checked) and in the simulator's accounting (modelled time), within
// the budget, and without loss when a promoted block leaves before it is used.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine_core.h"
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
constexpr int kPrefixBlocks = 10;

RequestSpec request(const std::string& id, int blocks, int salt, int64_t max_tokens = 2) {
  return spec(id, promptOf(blocks * kBlock + 5, salt), max_tokens);
}

// Host memory of 256 slots over a disk tier; `prefetch` is the tiers.prefetch mapping.
EngineConfig prefetchConfig(const std::filesystem::path& dir, const std::string& prefetch) {
  EngineConfig c = makeConfig(kBlock, kPoolBlocks, 8192);
  c.cache.payload_bytes_per_block = kPayload;
  std::string yaml = "host: {capacity_mib: 1, pin: off}\ndisk: {dir: " + dir.string() +
                     ", capacity_mib: 64, file_mib: 1}\nprefetch: " + prefetch + "\n";
  auto tiers = worker::parseTierConfigText(yaml, "tiers");
  EXPECT_TRUE(tiers.ok()) << tiers.status();
  if (tiers.ok()) c.tiers = *tiers;
  EXPECT_TRUE(finalizeEngineConfig(&c).ok());
  return c;
}

void serve(EngineCore& core, RequestSpec s, Nanos& now) {
  const std::string id = s.id;
  EXPECT_TRUE(runToCompletion(core, std::move(s), &now).finished) << id;
}

// Serves prompt A once, then `fillers` prompts of 20 blocks: with 16, A's blocks have left host
// memory (256 slots) and sit on disk only; with 3, they are in host memory.
void placePrefix(EngineCore& core, int fillers, Nanos& now) {
  serve(core, request("a1", kPrefixBlocks, 1), now);
  for (int i = 0; i < fillers; ++i) serve(core, request("f" + std::to_string(i), 20, 100 + i), now);
}

// Queues three 25-block blockers (one runs at a time in the 32-block pool, and A's onboard
// waits for the last to finish) and A again behind them, all at `now`.
void queueBehindBlockers(EngineCore& core, Nanos now) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(core.add(request("b" + std::to_string(i), 25, 200 + i, 8), now).ok());
  }
  ASSERT_TRUE(core.add(request("a2", kPrefixBlocks, 1), now).ok());
}

// Steps until no work is left; `settle` runs before every step (the test lets live reads land
// there). The outputs that finished, by id.
std::map<std::string, RequestOutput> drain(EngineCore& core, Nanos& now,
                                           const std::function<void()>& settle = {}) {
  std::map<std::string, RequestOutput> done;
  StepResult r;
  for (int i = 0; i < 100000; ++i) {
    if (!core.hasWork()) {
      std::optional<Nanos> ready = core.nextOnboardReady();
      if (!ready) break;
      now = std::max(now, *ready);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!core.onboardsCopied() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
    }
    if (settle) settle();
    core.step(now, &r);
    now += r.duration;
    for (const RequestOutput& o : r.outputs) {
      if (o.finish) done[o.id] = o;
    }
  }
  return done;
}

// Waits until the live tiers have no promotion read in flight (bounded).
void waitPromotions(const LiveTiers& tiers) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tiers.promotionsInFlight() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(tiers.promotionsInFlight(), 0u);
}

struct LiveRun {
  explicit LiveRun(const std::string& name, const std::string& prefetch = "{mode: queued}")
      : dir(kvf::testing::freshTempDir(name)) {
    core = liveCore(prefetchConfig(dir, prefetch), nullptr, &tiers);
  }
  std::filesystem::path dir;
  LiveTiers* tiers = nullptr;
  std::unique_ptr<EngineCore> core;
  Nanos now = 0;
};

// The keys of the blocks the tiers stored in host memory since the last call (promotions, when
// nothing else ran).
std::vector<worker::BlockHash> hostStores(LiveTiers& tiers) {
  std::vector<worker::BlockHash> keys;
  for (const worker::KvEvent& e : tiers.takeEvents()) {
    const auto* s = std::get_if<worker::BlockStored>(&e);
    if (s != nullptr && s->medium == "CPU") {
      keys.insert(keys.end(), s->block_hashes.begin(), s->block_hashes.end());
    }
  }
  return keys;
}

TEST(QueuedPrefetchTest, AQueuedDiskPrefixIsPromotedAndOnboardsFromHostMemoryWithItsBytes) {
  LiveRun live("prefetch-live");
  ASSERT_NE(live.core, nullptr);
  placePrefix(*live.core, 16, live.now);
  // Host memory full of blocks still waiting for the disk keeps its margin: no promotion.
  ASSERT_TRUE(live.tiers->store().flush(std::chrono::seconds(10)));
  const worker::TierStats before = live.tiers->store().stats();
  queueBehindBlockers(*live.core, live.now);
  auto done = drain(*live.core, live.now, [&] { waitPromotions(*live.tiers); });
  ASSERT_TRUE(done.contains("a2"));
  const RequestOutput& a2 = done["a2"];
  EXPECT_EQ(a2.tier_tokens, kPrefixBlocks * kBlock);
  EXPECT_EQ(a2.tier_disk_tokens, 0);  // from host memory: promoted while it waited
  SchedulerStats st = live.core->stats();
  EXPECT_EQ(st.prefetch.promoted, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(st.prefetch.used, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(st.prefetch.wasted, 0u);
  worker::TierStats after = live.tiers->store().stats();
  EXPECT_EQ(after.disk_promoted - before.disk_promoted, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(after.host_onboarded - before.host_onboarded, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(after.disk_onboarded, before.disk_onboarded);
  EXPECT_EQ(live.core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(live.core->pool().auditPayloads().corrupt_blocks, 0);
  for (size_t r = 0; r < worker::kDropReasonCount; ++r) EXPECT_EQ(after.dropped[r], 0u) << r;
}

TEST(QueuedPrefetchTest, AdmissionModeReadsTheSameQueuedPrefixFromDisk) {
  LiveRun live("prefetch-admission", "{mode: admission}");
  ASSERT_NE(live.core, nullptr);
  placePrefix(*live.core, 16, live.now);
  queueBehindBlockers(*live.core, live.now);
  auto done = drain(*live.core, live.now);
  ASSERT_TRUE(done.contains("a2"));
  EXPECT_EQ(done["a2"].tier_disk_tokens, kPrefixBlocks * kBlock);
  EXPECT_EQ(live.core->stats().prefetch.promoted, 0u);
  EXPECT_EQ(live.tiers->store().stats().disk_promoted, 0u);
}

TEST(QueuedPrefetchTest, PromotionStopsAtTheBudgetAndCountsTheRest) {
  // 256 host slots x 0.02 = 5 blocks may wait for use.
  LiveRun live("prefetch-budget", "{mode: queued, budget_fraction: 0.02}");
  ASSERT_NE(live.core, nullptr);
  placePrefix(*live.core, 16, live.now);
  ASSERT_TRUE(live.tiers->store().flush(std::chrono::seconds(10)));
  queueBehindBlockers(*live.core, live.now);
  SchedulerStats queued = live.core->stats();
  EXPECT_EQ(queued.prefetch.promoted, 5u);
  EXPECT_EQ(queued.prefetch.skippedBy(PrefetchSkip::kBudget), 5u);
  auto done = drain(*live.core, live.now, [&] { waitPromotions(*live.tiers); });
  ASSERT_TRUE(done.contains("a2"));
  EXPECT_EQ(done["a2"].tier_tokens, kPrefixBlocks * kBlock);
  EXPECT_EQ(done["a2"].tier_disk_tokens, 5 * kBlock);  // the rest came from disk at admission
  EXPECT_EQ(live.core->stats().prefetch.used, 5u);
  EXPECT_EQ(live.core->onboardPayloadMismatches(), 0u);
}

TEST(QueuedPrefetchTest, APromotedBlockEvictedBeforeUseIsCountedAsWastedAndNothingIsLost) {
  LiveRun live("prefetch-evicted");
  ASSERT_NE(live.core, nullptr);
  placePrefix(*live.core, 16, live.now);
  ASSERT_TRUE(live.tiers->store().flush(std::chrono::seconds(10)));
  hostStores(*live.tiers);  // what came before
  queueBehindBlockers(*live.core, live.now);
  waitPromotions(*live.tiers);
  std::vector<worker::BlockHash> promoted = hostStores(*live.tiers);
  ASSERT_EQ(promoted.size(), static_cast<size_t>(kPrefixBlocks));
  // Host memory lets them all go again before the request is admitted; their disk copies stay.
  for (worker::BlockHash h : promoted) {
    EXPECT_TRUE(live.tiers->store().host().drop(h.value(), worker::DropReason::kRemoved));
  }
  auto done = drain(*live.core, live.now);
  ASSERT_TRUE(done.contains("a2"));
  EXPECT_EQ(done["a2"].tier_tokens, kPrefixBlocks * kBlock);
  EXPECT_EQ(done["a2"].tier_disk_tokens, kPrefixBlocks * kBlock);
  SchedulerStats st = live.core->stats();
  EXPECT_EQ(st.prefetch.used, 0u);
  EXPECT_EQ(st.prefetch.wasted, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(live.core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(live.tiers->store().stats().droppedBy(worker::DropReason::kCorrupt), 0u);
}

TEST(QueuedPrefetchTest, ACorruptDiskBlockIsNeverPromotedAndTheRequestRecomputes) {
  LiveRun live("prefetch-corrupt");
  ASSERT_NE(live.core, nullptr);
  placePrefix(*live.core, 16, live.now);
  ASSERT_TRUE(live.tiers->store().flush(std::chrono::seconds(10)));
  testing::corruptSlabFiles(live.dir);
  queueBehindBlockers(*live.core, live.now);
  waitPromotions(*live.tiers);
  EXPECT_EQ(live.tiers->store().stats().disk_promoted, 0u);
  EXPECT_GE(live.tiers->store().stats().droppedBy(worker::DropReason::kCorrupt), 1u);
  auto done = drain(*live.core, live.now);
  ASSERT_TRUE(done.contains("a2"));
  EXPECT_EQ(done["a2"].tier_tokens, 0);
  EXPECT_EQ(live.core->onboardPayloadMismatches(), 0u);
  EXPECT_EQ(live.core->pool().auditPayloads().corrupt_blocks, 0);
}

TEST(QueuedPrefetchTest, ConcurrentPromotionAndEvictionOfTheSameBlocksLoseNothing) {
  auto dir = kvf::testing::freshTempDir("prefetch-race");
  EngineConfig c = prefetchConfig(dir, "{mode: queued}");
  LiveTiersOptions o;
  o.store = *c.tiers;
  auto created = LiveTiers::create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  LiveTiers& tiers = **created;
  auto offloadRange = [&](uint64_t first, uint64_t n) {
    for (uint64_t k = first; k < first + n; ++k) {
      worker::BlockHash h(k);
      std::vector<std::byte> bytes(kPayload);
      worker::fillBlockPayload(h, bytes);
      std::span<const std::byte> span(bytes);
      tiers.offload({&h, 1}, {&span, 1});
    }
  };
  offloadRange(1, 200);
  offloadRange(1000, 300);  // 1..200 leave host memory: on disk only
  ASSERT_TRUE(tiers.store().flush(std::chrono::seconds(10)));
  std::vector<worker::BlockHash> want;
  for (uint64_t k = 1; k <= 200; ++k) want.emplace_back(k);
  ASSERT_EQ(tiers.lookup(want).disk, 200u);
  size_t started = 0;
  for (worker::BlockHash h : want) started += tiers.promote(h) == PromoteOutcome::kStarted ? 1 : 0;
  EXPECT_GT(started, 0u);
  offloadRange(5000, 600);  // turns host memory over while the promotions land
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tiers.promotionsInFlight() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(tiers.promotionsInFlight(), 0u);
  // Every block is still held (host or disk) and reads back with its own bytes.
  ASSERT_EQ(tiers.lookup(want).size(), 200u);
  std::vector<std::vector<std::byte>> dst(200, std::vector<std::byte>(kPayload));
  std::vector<std::span<std::byte>> spans(dst.begin(), dst.end());
  std::unique_ptr<TierOnboard> copy = tiers.onboard(want, spans);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!copy->done() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(copy->done());
  ASSERT_EQ(copy->readyPrefix(), 200u);
  for (size_t i = 0; i < 200; ++i) {
    EXPECT_TRUE(worker::verifyBlockPayload(want[i], dst[i])) << "block " << i;
  }
  worker::TierStats st = tiers.store().stats();
  EXPECT_EQ(st.disk_promoted, started);
  for (size_t r = 0; r < worker::kDropReasonCount; ++r) EXPECT_EQ(st.dropped[r], 0u) << r;
}

// The simulator's modelled TTFT of A queued behind the blockers, with its prefix placed by
// `fillers` (16: disk only; 3: host memory) and the given prefetch mode.
Nanos simulatedTtft(int fillers, const std::string& prefetch, double disk_read_gbps = 0,
                    PrefetchStats* stats = nullptr) {
  EngineConfig c = prefetchConfig("/tmp/kvf-sim-unused", prefetch);
  if (disk_read_gbps > 0) c.profile.disk.read_gbps = disk_read_gbps;
  auto core = accountedCore(c);
  if (core == nullptr) return -1;
  Nanos now = 0;
  placePrefix(*core, fillers, now);
  queueBehindBlockers(*core, now);
  const Nanos queued_at = now;
  auto done = drain(*core, now);
  if (stats != nullptr) *stats = core->stats().prefetch;
  EXPECT_TRUE(done.contains("a2"));
  EXPECT_EQ(done["a2"].tier_tokens, kPrefixBlocks * kBlock);
  return done["a2"].first_token_time - queued_at;
}

TEST(QueuedPrefetchTest, SimulatedTtftOfAQueuedDiskPrefixDropsWithPrefetchButNotBelowAHostHit) {
  PrefetchStats queued_stats;
  const Nanos admission = simulatedTtft(16, "{mode: admission}");
  const Nanos queued = simulatedTtft(16, "{mode: queued}", 0, &queued_stats);
  const Nanos host_hit = simulatedTtft(3, "{mode: admission}");
  EXPECT_LT(queued, admission);
  EXPECT_GE(queued, host_hit);
  EXPECT_EQ(queued_stats.promoted, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(queued_stats.used, static_cast<uint64_t>(kPrefixBlocks));
}

TEST(QueuedPrefetchTest, AQueuedHostPrefixIsTouchedNotPromoted) {
  PrefetchStats stats;
  const Nanos queued = simulatedTtft(3, "{mode: queued}", 0, &stats);
  EXPECT_EQ(queued, simulatedTtft(3, "{mode: admission}"));
  EXPECT_EQ(stats.touched, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(stats.promoted, 0u);
}

TEST(QueuedPrefetchTest, APromotionStillRunningAtAdmissionIsChargedAsADiskRead) {
  // A disk this slow has read nothing by the time the blockers are done.
  PrefetchStats stats;
  const Nanos admission = simulatedTtft(16, "{mode: admission}", 1e-4);
  const Nanos queued = simulatedTtft(16, "{mode: queued}", 1e-4, &stats);
  EXPECT_EQ(queued, admission);
  EXPECT_EQ(stats.used, 0u);
  EXPECT_EQ(stats.late, static_cast<uint64_t>(kPrefixBlocks));
  EXPECT_EQ(stats.wasted, static_cast<uint64_t>(kPrefixBlocks));
}

TEST(QueuedPrefetchTest, PrefetchConfigIsValidated) {
  auto bad = worker::parseTierConfigText(
      "host: {capacity_mib: 1}\ndisk: {dir: /tmp/x, capacity_mib: 4}\n"
      "prefetch: {mode: eager, budget_fraction: 2}\n",
      "tiers");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prefetch.mode"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("prefetch.budget_fraction"), std::string::npos);
  auto no_disk =
      worker::parseTierConfigText("host: {capacity_mib: 1}\nprefetch: {mode: queued}\n", "tiers");
  ASSERT_FALSE(no_disk.ok());
  EXPECT_NE(no_disk.status().message().find("prefetch"), std::string::npos);
}

}  // namespace
}  // namespace kvf::engine
