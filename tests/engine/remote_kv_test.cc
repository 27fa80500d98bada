// EngineCore remote-KV (KV push receiver) and remote-decode lease scenarios, checked by hand:
// block counts, cached tokens, events, free blocks and modelled TTFT.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "engine/engine_core.h"
#include "tests/engine/engine_test_util.h"

namespace kvf::engine {
namespace {

constexpr int kBs = 16;

EngineConfig makeConfig(int64_t blocks) { return testing::makeConfig(kBs, blocks, 8192); }

using testing::promptOf;
using testing::spec;

RequestSpec remoteSpec(std::string id, std::vector<TokenId> prompt,
                       std::vector<BlockHash> hashes = {}) {
  RequestSpec s = spec(std::move(id), std::move(prompt), 2);
  s.remote_kv = RemoteKvSpec{"http://c", std::move(hashes)};
  return s;
}

struct Recorder : worker::KvEventSink {
  void onBlockStored(worker::BlockStored s) override {
    for (auto h : s.block_hashes) stored.push_back(h);
  }
  void onBlockRemoved(worker::BlockRemoved r) override {
    for (auto h : r.block_hashes) removed.push_back(h);
  }
  void onAllBlocksCleared() override {}
  std::vector<BlockHash> stored, removed;
};

struct Outcome {
  std::map<std::string, RequestOutput> last;
  std::vector<RemoteKvFetch> fetches;
};

// Steps until no step has work; collects outputs and fetches.
Outcome run(EngineCore& core, Nanos* now) {
  Outcome o;
  for (int i = 0; i < 10000 && core.hasWork(); ++i) {
    StepResult r = core.step(*now);
    for (auto& f : r.remote_kv_fetches) o.fetches.push_back(f);
    *now += r.duration;
    for (auto& out : r.outputs) o.last[out.id] = out;
  }
  return o;
}

// The holder: computes `prompt` once and keeps its blocks cached; returns its block hashes.
std::vector<BlockHash> holderHashes(const std::vector<TokenId>& prompt) {
  Recorder rec;
  auto core = EngineCore::create(makeConfig(100), &rec);
  EXPECT_TRUE(core.ok());
  Nanos now = 0;
  EXPECT_TRUE((*core)->add(spec("h", prompt, 1), 0).ok());
  run(**core, &now);
  return rec.stored;
}

TEST(RemoteKvTest, PushedBlocksBecomeCachedAndPrefillCoversOnlyTheRest) {
  auto prompt = promptOf(120, 1);  // 7 full blocks (112 tokens) + 8
  auto c_hashes = holderHashes(promptOf(100, 1));
  ASSERT_EQ(c_hashes.size(), 6u);  // C holds 6 blocks (96 tokens) of the common prefix
  Recorder rec;
  auto core = EngineCore::create(makeConfig(100), &rec);
  ASSERT_TRUE(core.ok());
  EngineCore& d = **core;
  ASSERT_TRUE(d.add(remoteSpec("a", prompt), 0).ok());
  ASSERT_TRUE(d.add(spec("b", promptOf(40, 9), 1), 0).ok());  // arrives after a
  StepResult s1 = d.step(0);
  // a waits aside with 7 landing blocks (at most (120-1)/16 = 7 from outside); b runs.
  ASSERT_EQ(s1.remote_kv_fetches.size(), 1u);
  const RemoteKvFetch& f = s1.remote_kv_fetches[0];
  EXPECT_EQ(f.id, "a");
  EXPECT_EQ(f.source, "http://c");
  ASSERT_EQ(f.hashes.size(), 7u);
  EXPECT_EQ(std::vector<BlockHash>(f.hashes.begin(), f.hashes.begin() + 6), c_hashes);
  EXPECT_EQ(f.blocks.size(), 7u);
  EXPECT_EQ(f.local_hit_tokens, 0);
  EXPECT_EQ(f.remaining_tokens, 8);
  ASSERT_EQ(s1.outputs.size(), 1u);
  EXPECT_EQ(s1.outputs[0].id, "b");
  EXPECT_EQ(d.stats().num_waiting_for_remote_kv, 1);
  Nanos now = s1.duration;
  run(d, &now);  // b finishes; a does not count as work
  EXPECT_FALSE(d.hasWork());
  int64_t free_before = d.pool().numFreeBlocks();
  EXPECT_EQ(free_before, 100 - 7);

  // C pushed the 6 blocks it held; the 7th landing block is returned.
  rec.stored.clear();
  ASSERT_TRUE(d.completeRemoteKv("a", 6, now).ok());
  EXPECT_EQ(rec.stored, c_hashes);  // BlockStored for exactly the pushed blocks
  EXPECT_EQ(d.pool().numFreeBlocks(), 100 - 6);
  EXPECT_TRUE(d.hasWork());
  Nanos arrival = now;
  StepResult s2 = d.step(now);
  ASSERT_EQ(s2.outputs.size(), 1u);
  EXPECT_EQ(s2.num_scheduled_tokens, 120 - 96);
  EXPECT_EQ(s2.outputs[0].cached_tokens, 96);
  EXPECT_EQ(s2.outputs[0].remote_kv_tokens, 96);
  BatchEntry e{24, 96};
  EXPECT_EQ(s2.duration, d.timing().stepDuration({&e, 1}));
  now = arrival + s2.duration;
  run(d, &now);
  EXPECT_EQ(d.stats().remote_kv_tokens, 96u);
  EXPECT_EQ(d.stats().prefix_cache_hits, 0u);  // pushed tokens are not local hits

  // A later request hits the migrated blocks locally.
  ASSERT_TRUE(d.add(spec("c", prompt, 1), now).ok());
  StepResult s3 = d.step(now);
  ASSERT_EQ(s3.outputs.size(), 1u);
  EXPECT_EQ(s3.outputs[0].cached_tokens, 112);  // 6 pushed + the 7th computed by a
  EXPECT_TRUE(s3.remote_kv_fetches.empty());
}

TEST(RemoteKvTest, LayerwisePushOverlapsTheTransferWithTheFirstStep) {
  auto prompt = promptOf(2000, 11);  // 124 fetchable blocks, 16 tokens left to compute
  auto core = EngineCore::create(makeConfig(400), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& d = **core;
  ASSERT_TRUE(d.add(remoteSpec("a", prompt), 0).ok());
  ASSERT_EQ(d.step(0).remote_kv_fetches.size(), 1u);
  const TimingModel& t = d.timing();
  BatchEntry e{16, 1984};
  const Nanos compute = t.stepDuration({&e, 1});
  const Nanos transfer = t.transferDuration(1984);  // 1984 x 96 KiB at 200 Gbps ~ 7.8 ms
  const int layers = t.profile().model.num_layers;
  // The data is usable at 1 ms (layer by layer); the whole KV is there at `transfer`.
  ASSERT_TRUE(d.completeRemoteKv("a", 124, 1'000'000, transfer).ok());
  StepResult s = d.step(1'000'000);
  EXPECT_EQ(s.num_scheduled_tokens, 16);
  EXPECT_EQ(s.duration, std::max(compute, transfer + compute / layers - 1'000'000));
  // A transfer longer than the step decides the step's end.
  ASSERT_TRUE(d.add(remoteSpec("b", promptOf(2000, 12)), 0).ok());
  ASSERT_EQ(d.step(0).remote_kv_fetches.size(), 1u);  // a finishes its decode meanwhile
  const Nanos slow = 10 * compute;
  ASSERT_TRUE(d.completeRemoteKv("b", 124, 0, slow).ok());
  StepResult s2 = d.step(0);
  ASSERT_EQ(s2.outputs.size(), 1u);
  EXPECT_GE(s2.duration, slow);
  EXPECT_LE(s2.duration, slow + compute);
  // Only the first step waits.
  StepResult s3 = d.step(s2.duration);
  EXPECT_LT(s3.duration, compute);
}

TEST(RemoteKvTest, LocalHitsAreCountedFirst) {
  auto prompt = promptOf(200, 2);  // 12 full blocks, at most 12 from outside
  auto core = EngineCore::create(makeConfig(100), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& d = **core;
  Nanos now = 0;
  ASSERT_TRUE(d.add(spec("warm", promptOf(40, 2), 1), 0).ok());  // caches 2 blocks
  run(d, &now);
  ASSERT_TRUE(d.add(remoteSpec("a", prompt), now).ok());
  StepResult s = d.step(now);
  ASSERT_EQ(s.remote_kv_fetches.size(), 1u);
  EXPECT_EQ(s.remote_kv_fetches[0].local_hit_tokens, 32);
  EXPECT_EQ(s.remote_kv_fetches[0].hashes.size(), 10u);  // blocks 2..11
  ASSERT_TRUE(d.completeRemoteKv("a", 10, now).ok());
  StepResult s2 = d.step(now);
  ASSERT_EQ(s2.outputs.size(), 1u);
  EXPECT_EQ(s2.outputs[0].cached_tokens, 192);
  EXPECT_EQ(s2.outputs[0].remote_kv_tokens, 160);
  EXPECT_EQ(s2.num_scheduled_tokens, 8);
}

TEST(RemoteKvTest, FullyLocalOrMismatchedRunIsAnOrdinaryAdmission) {
  auto core = EngineCore::create(makeConfig(100), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& d = **core;
  Nanos now = 0;
  ASSERT_TRUE(d.add(spec("warm", promptOf(64, 3), 1), 0).ok());
  run(d, &now);
  // All 3 fetchable blocks ((64-1)/16) are local: nothing to fetch.
  ASSERT_TRUE(d.add(remoteSpec("a", promptOf(64, 3)), now).ok());
  StepResult s = d.step(now);
  EXPECT_TRUE(s.remote_kv_fetches.empty());
  EXPECT_EQ(s.outputs.at(0).cached_tokens, 48);
  run(d, &now);
  // Hashes that are not this prompt's (another hashing) are never fetched.
  ASSERT_TRUE(d.add(remoteSpec("b", promptOf(64, 4), testing::hashList({1, 2, 3})), now).ok());
  s = d.step(now);
  EXPECT_TRUE(s.remote_kv_fetches.empty());
  EXPECT_EQ(s.num_scheduled_tokens, 64);
}

TEST(RemoteKvTest, FailureFallsBackAndQuarantinesLandingBlocksWhileWritesMayArrive) {
  auto prompt = promptOf(200, 5);
  auto core = EngineCore::create(makeConfig(20), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& d = **core;
  ASSERT_TRUE(d.add(remoteSpec("a", prompt), 0).ok());
  StepResult s = d.step(0);
  ASSERT_EQ(s.remote_kv_fetches.size(), 1u);
  std::set<BlockIndex> landing(s.remote_kv_fetches[0].blocks.begin(),
                               s.remote_kv_fetches[0].blocks.end());
  ASSERT_EQ(landing.size(), 12u);
  EXPECT_EQ(d.pool().numFreeBlocks(), 8);
  // The deadline passed while the peer may still write: the 12 blocks stay out of use.
  ASSERT_TRUE(d.failRemoteKv("a", 0, /*writes_may_arrive=*/true).ok());
  EXPECT_EQ(d.stats().remote_kv_blocks_quarantined, 12u);
  EXPECT_EQ(d.pool().numFreeBlocks(), 8);
  EXPECT_FALSE(d.completeRemoteKv("a", 12, 0).ok());  // a late success changes nothing
  // The fallback needs 13 blocks but only 8 are free: it waits, and never gets a landing block.
  StepResult blocked = d.step(0);
  EXPECT_TRUE(blocked.empty());
  EXPECT_TRUE(d.releaseRemoteKvLanding("a"));
  EXPECT_FALSE(d.releaseRemoteKvLanding("a"));
  EXPECT_EQ(d.stats().remote_kv_blocks_quarantined, 0u);
  Nanos now = 0;
  auto o = run(d, &now);
  EXPECT_EQ(o.last.at("a").cached_tokens, 0);
  EXPECT_EQ(o.last.at("a").remote_kv_tokens, 0);
  EXPECT_EQ(o.last.at("a").output_tokens, 2);
  EXPECT_EQ(d.stats().remote_kv_failures, 1u);
  EXPECT_EQ(d.pool().numFreeBlocks(), 20);
}

TEST(RemoteKvTest, FailureWithNoPossibleWriteReusesLandingBlocksAtOnce) {
  auto core = EngineCore::create(makeConfig(20), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& d = **core;
  ASSERT_TRUE(d.add(remoteSpec("a", promptOf(200, 6)), 0).ok());
  ASSERT_EQ(d.step(0).remote_kv_fetches.size(), 1u);
  ASSERT_TRUE(d.failRemoteKv("a", 0, /*writes_may_arrive=*/false).ok());
  EXPECT_EQ(d.pool().numFreeBlocks(), 20);
  StepResult s = d.step(0);
  EXPECT_EQ(s.num_scheduled_tokens, 200);
  EXPECT_EQ(s.outputs.at(0).cached_tokens, 0);
}

TEST(RemoteKvTest, AbortWhileWaitingQuarantinesUntilReleased) {
  auto core = EngineCore::create(makeConfig(20), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& d = **core;
  ASSERT_TRUE(d.add(remoteSpec("a", promptOf(100, 7)), 0).ok());
  ASSERT_EQ(d.step(0).remote_kv_fetches.size(), 1u);
  EXPECT_TRUE(d.abort("a"));
  EXPECT_EQ(d.pool().numFreeBlocks(), 20 - 6);
  EXPECT_FALSE(d.completeRemoteKv("a", 6, 0).ok());
  EXPECT_TRUE(d.releaseRemoteKvLanding("a"));
  EXPECT_EQ(d.pool().numFreeBlocks(), 20);
}

TEST(RemoteKvTest, RemoteDecodeLeasePinsPromptBlocksUntilReleasedOrExpired) {
  auto core = EngineCore::create(makeConfig(30), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& p = **core;
  RequestSpec s = spec("p1", promptOf(100, 8), 1);
  s.remote_decode_lease = 1'000'000'000;
  ASSERT_TRUE(p.add(s, 0).ok());
  Nanos now = 0;
  auto o = run(p, &now);
  const RequestOutput& out = o.last.at("p1");
  ASSERT_TRUE(out.lease_id.has_value());
  EXPECT_EQ(*out.lease_id, "p1");
  ASSERT_EQ(out.lease_block_hashes.size(), 6u);  // 100 / 16 full prompt blocks
  EXPECT_EQ(p.pool().numFreeBlocks(), 30 - 6);
  EXPECT_EQ(p.stats().num_leases, 1);
  // Pinned blocks survive pressure that evicts everything else.
  ASSERT_TRUE(p.add(spec("big", promptOf(380, 9), 1), now).ok());
  run(p, &now);
  EXPECT_EQ(p.pinLeadingRun(out.lease_block_hashes).size(), 6u);
  p.unpin(out.lease_block_hashes);
  EXPECT_EQ(p.nextLeaseExpiry(), out.first_token_time + 1'000'000'000);
  EXPECT_EQ(p.expireLeases(*p.nextLeaseExpiry() - 1), 0);
  EXPECT_EQ(p.expireLeases(*p.nextLeaseExpiry()), 1);
  EXPECT_EQ(p.pool().numFreeBlocks(), 30);
  EXPECT_FALSE(p.releaseLease("p1"));
  EXPECT_EQ(p.stats().leases_expired, 1u);

  ASSERT_TRUE(p.add(s, now).ok());
  run(p, &now);
  EXPECT_EQ(p.pool().numFreeBlocks(), 30 - 6);
  EXPECT_TRUE(p.releaseLease("p1"));
  EXPECT_EQ(p.pool().numFreeBlocks(), 30);
}

TEST(RemoteKvTest, HolderPinsOnlyTheLeadingCachedRun) {
  auto core = EngineCore::create(makeConfig(30), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& c = **core;
  Nanos now = 0;
  ASSERT_TRUE(c.add(spec("a", promptOf(64, 10), 1), 0).ok());
  run(c, &now);
  auto hashes = holderHashes(promptOf(64, 10));
  ASSERT_EQ(hashes.size(), 4u);
  std::vector<BlockHash> want = {hashes[0], hashes[1], BlockHash(42), hashes[2]};
  auto pinned = c.pinLeadingRun(want);
  ASSERT_EQ(pinned.size(), 2u);
  EXPECT_EQ(c.pool().refCount(pinned[0]), 1);
  c.unpin(std::span<const BlockHash>(want.data(), 2));
  EXPECT_EQ(c.pool().refCount(pinned[0]), 0);
}

TEST(RemoteKvTest, PinnedRunSurvivesEvictionPressureUntilUnpinned) {
  auto core = EngineCore::create(makeConfig(10), nullptr);
  ASSERT_TRUE(core.ok());
  EngineCore& c = **core;
  Nanos now = 0;
  ASSERT_TRUE(c.add(spec("a", promptOf(64, 13), 1), 0).ok());  // 4 cached blocks, all free
  run(c, &now);
  auto hashes = holderHashes(promptOf(64, 13));
  auto pinned = c.pinLeadingRun(hashes);  // a push is in flight
  ASSERT_EQ(pinned.size(), 4u);
  EXPECT_EQ(c.pool().numFreeBlocks(), 6);
  // A request needing every free block evicts nothing that is pinned.
  ASSERT_TRUE(c.add(spec("b", promptOf(90, 14), 1), now).ok());
  run(c, &now);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(c.pool().hashOf(pinned[i]), hashes[i]);
  c.unpin(hashes);
  EXPECT_EQ(c.pool().numFreeBlocks(), 10);
  // Unpinned, the same pressure evicts them.
  ASSERT_TRUE(c.add(spec("c", promptOf(159, 15), 1), now).ok());
  run(c, &now);
  EXPECT_TRUE(c.pool().findCachedPrefix(hashes).empty());
}

TEST(RemoteKvTest, ValidationNamesTheField) {
  auto core = EngineCore::create(makeConfig(30), nullptr);
  ASSERT_TRUE(core.ok());
  RequestSpec s = remoteSpec("a", promptOf(40, 1), std::vector<BlockHash>(3, BlockHash(1)));
  auto st = (*core)->validate(s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("kv_transfer_params.block_hashes"), std::string::npos);
  s.remote_kv->source.clear();
  s.remote_kv->block_hashes.clear();
  st = (*core)->validate(s);
  EXPECT_NE(std::string(st.message()).find("kv_transfer_params.source"), std::string::npos);
}

}  // namespace
}  // namespace kvf::engine
