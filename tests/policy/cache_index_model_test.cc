// CacheIndex against a reference model written with ordered std containers straight from the
// documented semantics (exact entries via an engine->ours map, a holder kept while any engine
// hash or copy of one maps to the block; soft entries per (block,
// instance) with the latest expiry routed, independent of the exact ones, at most
// max_soft_entries distinct blocks). Random operations on a few instances, shared prefixes,
// reused engine hashes and both TTLs exercise the index's representation (exact holders in the
// block table, soft claims on the routed chains' tree with splits, branches and several
// holders per node); every holder set, match length and statistic must agree after every
// operation. It runs on a small cluster (instances 0-2 and 63, the first listed one) and on
// 1,024 instances (random ones plus a hot few on both sides of the word/list boundary, so
// blocks gather more listed holders than fit in a holder-table slot).
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "policy/cache_index.h"

namespace kvf::policy {
namespace {

class ModelIndex {
 public:
  explicit ModelIndex(CacheIndexConfig config) : config_(config) {}

  bool storeKeyed(int inst, const std::vector<uint64_t>& engine, std::optional<uint64_t> parent_e,
                  const std::vector<uint64_t>& keys) {
    auto& map = e2o_[inst];
    BlockHash parent = kRootBlockHash;
    if (parent_e) {
      auto it = map.find(*parent_e);
      if (it == map.end()) {
        ++stats_.stored_events_rejected;
        return false;
      }
      parent = it->second;
    }
    for (size_t i = 0; i < engine.size(); ++i) {
      parent = hashBlockKey(parent, keys[i]);
      seen_.insert(parent);  // off the key tree when the parent was a reused engine hash
      auto [it, inserted] = map.try_emplace(engine[i], parent);
      if (inserted) {
        if (map.size() > config_.max_blocks_per_instance) {
          map.erase(it);
          ++stats_.stored_events_rejected;
          if (!own_.contains(inst)) ++stats_.over_capacity;
          return false;
        }
        ++refs_[{parent, inst}];
      } else if (it->second != parent) {
        // A reused engine hash: the old block loses this reference with all its copies.
        release(it->second, inst);
        copies_[inst].erase(engine[i]);
        it->second = parent;
        ++refs_[{parent, inst}];
      } else if (!own_.contains(inst)) {
        ++copies_[inst][engine[i]];  // the same block cached again (own hashes: held once)
      }
    }
    return true;
  }
  // The instance's engine hashes are ours (setEngineHashesAreOurs): a block is held or not,
  // with no count of copies.
  void setOwn(int inst) { own_.insert(inst); }
  void remove(int inst, const std::vector<uint64_t>& engine) {
    auto& map = e2o_[inst];
    for (uint64_t e : engine) {
      auto it = map.find(e);
      if (it == map.end()) {
        ++stats_.removed_unknown;
        continue;
      }
      auto copy = copies_[inst].find(e);
      if (copy != copies_[inst].end()) {
        if (--copy->second == 0) copies_[inst].erase(copy);
        continue;
      }
      release(it->second, inst);
      map.erase(it);
    }
  }
  void clearInstance(int inst) {
    for (auto it = refs_.begin(); it != refs_.end();) {
      it = it->first.second == inst ? refs_.erase(it) : std::next(it);
    }
    e2o_[inst].clear();
    copies_[inst].clear();
    for (auto it = soft_.begin(); it != soft_.end();) {
      it = it->first.second == inst ? eraseSoft(it) : std::next(it);
    }
  }
  void addSoft(int inst, const std::vector<BlockHash>& hashes, Nanos now, bool approximate) {
    Nanos expiry = now + (approximate ? config_.approximate_ttl : config_.predicted_ttl);
    for (size_t i = 0; i < hashes.size(); ++i) {
      BlockHash h = hashes[i];
      seen_.insert(h);
      chains_[h].assign(hashes.begin(), hashes.begin() + static_cast<ptrdiff_t>(i) + 1);
      if (!soft_blocks_.contains(h) && soft_blocks_.size() >= config_.max_soft_entries) break;
      auto [it, fresh] = soft_.try_emplace({h, inst}, expiry);
      if (fresh) {
        ++soft_blocks_[h];
      } else {
        it->second = std::max(it->second, expiry);
      }
      (approximate ? approx_q_ : pred_q_).push_back({expiry, h, inst});
    }
  }
  void expire(Nanos now) {
    for (auto* q : {&pred_q_, &approx_q_}) {
      while (!q->empty() && q->front().expiry <= now) {
        Record r = q->front();
        q->pop_front();
        auto it = soft_.find({r.hash, r.inst});
        if (it == soft_.end() || it->second > now) continue;
        ++stats_.soft_expired;
        eraseSoft(it);
      }
    }
  }
  HolderSet holders(BlockHash h) const {
    HolderSet m = exactHolders(h);
    m |= softHolders(h).view();
    return m;
  }
  HolderSet exactHolders(BlockHash h) const {
    HolderSet m;
    for (auto it = refs_.lower_bound({h, 0}); it != refs_.end() && it->first.first == h; ++it) {
      m.insert(it->first.second);
    }
    return m;
  }
  // Leading blocks of `chain` each of the first out.size() instances holds.
  void matchLengths(std::span<const BlockHash> chain, std::span<uint32_t> out) const {
    std::fill(out.begin(), out.end(), 0u);
    std::vector<HolderSet> held;
    for (BlockHash h : chain) held.push_back(holders(h));
    for (size_t i = 0; i < out.size(); ++i) {
      while (out[i] < held.size() && held[out[i]].contains(static_cast<int>(i))) ++out[i];
    }
  }
  size_t instanceBlocks(int inst) const {
    auto it = e2o_.find(inst);
    return it == e2o_.end() ? 0 : it->second.size();
  }
  CacheIndexStats stats() const {
    CacheIndexStats s = stats_;
    s.exact_entries = refs_.size();
    s.soft_entries = soft_.size();
    s.soft_blocks = soft_blocks_.size();
    s.blocks = 0;
    for (BlockHash h : seen_) s.blocks += !exactHolders(h).empty();
    return s;
  }
  // Every hash stored or routed so far.
  const std::set<BlockHash>& seen() const { return seen_; }
  // Every routed hash, with its chain from the prompt's first block.
  const std::map<BlockHash, std::vector<BlockHash>>& chains() const { return chains_; }

 private:
  using Key = std::pair<BlockHash, int>;
  struct Record {
    Nanos expiry;
    BlockHash hash;
    int inst;
  };
  std::map<Key, Nanos>::iterator eraseSoft(std::map<Key, Nanos>::iterator it) {
    auto b = soft_blocks_.find(it->first.first);
    if (--b->second == 0) soft_blocks_.erase(b);
    return soft_.erase(it);
  }
  // One engine hash fewer maps to `h` on `inst`; the holder goes with the last one.
  void release(BlockHash h, int inst) {
    auto it = refs_.find({h, inst});
    if (it != refs_.end() && --it->second == 0) refs_.erase(it);
  }
  HolderSet softHolders(BlockHash h) const {
    HolderSet m;
    for (auto it = soft_.lower_bound({h, 0}); it != soft_.end() && it->first.first == h; ++it) {
      m.insert(it->first.second);
    }
    return m;
  }

  CacheIndexConfig config_;
  std::map<int, std::map<uint64_t, BlockHash>> e2o_;
  // Per (block, instance): how many engine hashes map to it; an engine hash cached more than
  // once counts its extra copies in copies_ and leaves with its last copy.
  std::map<Key, int> refs_;
  std::map<int, std::map<uint64_t, int>> copies_;
  std::set<int> own_;
  std::map<Key, Nanos> soft_;
  std::map<BlockHash, int> soft_blocks_;  // soft holders per block
  std::map<BlockHash, std::vector<BlockHash>> chains_;
  std::deque<Record> pred_q_, approx_q_;
  std::set<BlockHash> seen_;
  CacheIndexStats stats_;
};

// `most_exact`: the most exact holders any block has had so far.
void expectSame(const CacheIndex& index, const ModelIndex& model, std::span<const int> hot,
                std::mt19937_64& rng, int step, size_t* most_exact) {
  CacheIndexStats a = index.stats(), b = model.stats();
  ASSERT_EQ(a.exact_entries, b.exact_entries) << "step " << step;
  ASSERT_EQ(a.soft_entries, b.soft_entries) << "step " << step;
  ASSERT_EQ(a.stored_events_rejected, b.stored_events_rejected) << "step " << step;
  ASSERT_EQ(a.removed_unknown, b.removed_unknown) << "step " << step;
  ASSERT_EQ(a.over_capacity, b.over_capacity) << "step " << step;
  ASSERT_EQ(a.soft_expired, b.soft_expired) << "step " << step;
  ASSERT_EQ(a.soft_blocks, b.soft_blocks) << "step " << step;
  for (BlockHash h : model.seen()) {
    HolderSet want = model.exactHolders(h);
    ASSERT_EQ(index.exactHolders(h), want) << "step " << step;
    *most_exact = std::max(*most_exact, want.size());
  }
  for (const auto& [h, chain] : model.chains()) {
    ASSERT_EQ(index.holders(chain), model.holders(h)) << "step " << step;
  }
  for (int i : hot) ASSERT_EQ(index.instanceBlocks(i), model.instanceBlocks(i));
  ASSERT_EQ(a.blocks, b.blocks) << "step " << step;
  // Match lengths of a routed chain, for clusters ending before, at and past the word.
  if (model.chains().empty()) return;
  auto pick = model.chains().begin();
  std::advance(pick, static_cast<ptrdiff_t>(rng() % model.chains().size()));
  constexpr size_t kSizes[] = {8, 63, 64, 100, kMaxInstances};
  std::vector<uint32_t> got(kSizes[rng() % std::size(kSizes)]), want(got.size());
  index.matchLengths(pick->second, got);
  model.matchLengths(pick->second, want);
  ASSERT_EQ(got, want) << "step " << step;
}

// Prompts: chains of content keys sharing prefixes (a tree of depth kDepth, fan-out 3).
constexpr int kDepth = 5;

std::vector<uint64_t> randomKeys(std::mt19937_64& rng) {
  std::vector<uint64_t> keys(kDepth);
  for (auto& k : keys) k = rng() % 3;
  return keys;
}

std::vector<BlockHash> chain(const std::vector<uint64_t>& keys) {
  std::vector<BlockHash> out;
  hashKeyBlocks(keys, &out);
  return out;
}

// An engine's hash for our hash `ours` on instance `inst`: instance 1 folds hashes into a few
// values, so it keeps reusing engine hashes for other content; instance 2 hashes as we do
// when `own_hashes` (CacheIndex::setEngineHashesAreOurs, the model still maps them).
uint64_t engineHash(BlockHash ours, int inst, bool own_hashes) {
  if (inst == 2 && own_hashes) return ours.value;
  return inst == 1 ? ours.value % 7 : ours.value ^ 0x5a5a;
}

// Our hashes as an engine that hashes as we do sends them.
std::vector<uint64_t> engineForm(std::span<const BlockHash> ours) {
  std::vector<uint64_t> out;
  for (BlockHash h : ours) out.push_back(h.value);
  return out;
}

// The parameters: engine hashes are ours (instance 2), and the cluster has 1,024 instances.
class CacheIndexModelTest : public testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(CacheIndexModelTest, AgreesWithReferenceModelUnderRandomOperations) {
  const auto [own_hashes, large] = GetParam();
  // Instances 1 and 2 are special (engineHash); large clusters also draw any of the 1,024.
  const std::vector<int> hot =
      large ? std::vector<int>{0, 1, 2, 62, 63, 64, 700, 1023} : std::vector<int>{0, 1, 2, 63};
  CacheIndexConfig config;
  config.block_size = 16;
  config.predicted_ttl = 40;
  config.approximate_ttl = 90;
  config.max_blocks_per_instance = 30;
  config.max_soft_entries = 60;
  for (uint64_t seed : {1u, 2u, 3u}) {
    CacheIndex index(config);
    if (own_hashes) index.setEngineHashesAreOurs(2, true);
    ModelIndex model(config);
    if (own_hashes) model.setOwn(2);
    std::mt19937_64 rng(seed);
    Nanos now = 0;
    size_t most_exact = 0;
    for (int step = 0; step < 4000; ++step) {
      int inst = large && rng() % 2 == 0 ? static_cast<int>(rng() % kMaxInstances)
                                         : hot[rng() % hot.size()];
      auto keys = randomKeys(rng);
      auto ours = chain(keys);
      size_t from = rng() % kDepth, to = from + 1 + rng() % (kDepth - from);
      switch (rng() % 6) {
        case 0:
        case 1: {  // a stored run [from, to) with its parent (engine hash of block from-1)
          std::vector<uint64_t> engine, run_keys(keys.begin() + from, keys.begin() + to);
          for (size_t i = from; i < to; ++i)
            engine.push_back(engineHash(ours[i], inst, own_hashes));
          std::optional<uint64_t> parent;
          if (from > 0) parent = engineHash(ours[from - 1], inst, own_hashes);
          // An own-hash instance's stores also come as hashes alone (storeOwnHashes): the same
          // outcome as deriving them from the keys.
          bool a = own_hashes && inst == 2 && rng() % 2 == 0
                       ? index.storeOwnHashes(inst, engine, parent.has_value(), parent.value_or(0),
                                              config.block_size)
                       : index.storeKeyedBlocks(inst, engine, parent.has_value(),
                                                parent.value_or(0), run_keys, config.block_size);
          bool b = model.storeKeyed(inst, engine, parent, run_keys);
          ASSERT_EQ(a, b) << "step " << step;
          break;
        }
        case 2: {
          std::vector<uint64_t> engine;
          for (size_t i = from; i < to; ++i)
            engine.push_back(engineHash(ours[i], inst, own_hashes));
          index.removeBlocks(inst, engine);
          model.remove(inst, engine);
          break;
        }
        case 3:
        case 4: {
          bool approximate = rng() % 3 == 0;
          std::vector<BlockHash> run(ours.begin(), ours.begin() + to);
          index.addSoft(inst, run, now, approximate);
          model.addSoft(inst, run, now, approximate);
          break;
        }
        default:
          if (rng() % 40 == 0) {  // a restart
            index.clearInstance(inst);
            model.clearInstance(inst);
          } else {
            now += static_cast<Nanos>(rng() % 12);
            index.expire(now);
            model.expire(now);
          }
      }
      expectSame(index, model, hot, rng, step, &most_exact);
    }
    EXPECT_GT(index.stats().soft_expired, 100u);
    // Large clusters reach blocks with more listed holders than a holder-table slot keeps.
    if (large) {
      EXPECT_GE(most_exact, 6u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EngineHashes, CacheIndexModelTest,
                         testing::Combine(testing::Bool(), testing::Bool()), [](const auto& p) {
                           return std::string(std::get<0>(p.param) ? "OwnHashes" : "Mapped") +
                                  (std::get<1>(p.param) ? "1024Instances" : "SmallCluster");
                         });

// An instance declared to hash as we do rejects a store whose hashes are not ours.
TEST(CacheIndexOwnHashesTest, ForeignHashesAreRejected) {
  CacheIndex index;
  index.setEngineHashesAreOurs(0, true);
  std::vector<uint64_t> keys = {5, 6};
  std::vector<BlockHash> ours;
  hashKeyBlocks(keys, &ours);
  std::vector<uint64_t> engine = engineForm(ours);
  std::vector<uint64_t> foreign = {engine[0], engine[1] + 1};
  EXPECT_FALSE(index.storeKeyedBlocks(0, foreign, false, 0, keys, kDefaultBlockSize));
  EXPECT_EQ(index.stats().stored_events_rejected, 1u);
  EXPECT_EQ(index.exactHolders(ours[0]),
            HolderSet{0});  // blocks before the mismatch stay, as mapped
  EXPECT_TRUE(index.storeKeyedBlocks(0, engine, false, 0, keys, kDefaultBlockSize));
  EXPECT_EQ(index.instanceBlocks(0), 2u);
  index.removeBlocks(0, std::vector<uint64_t>{engine[1], 12345});
  EXPECT_EQ(index.stats().removed_unknown, 1u);
  EXPECT_EQ(index.instanceBlocks(0), 1u);
  index.clearInstance(0);
  EXPECT_EQ(index.stats().exact_entries, 0u);
  EXPECT_EQ(index.stats().blocks, 0u);
}

// storeOwnHashes only serves instances declared to hash as we do, with our block size.
TEST(CacheIndexOwnHashesTest, HashesAloneNeedADeclaredInstance) {
  CacheIndex index;
  std::vector<uint64_t> keys = {5, 6};
  std::vector<BlockHash> ours;
  hashKeyBlocks(keys, &ours);
  std::vector<uint64_t> engine = engineForm(ours);
  EXPECT_FALSE(index.storeOwnHashes(0, engine, false, 0, kDefaultBlockSize));  // not declared
  index.setEngineHashesAreOurs(0, true);
  EXPECT_FALSE(index.storeOwnHashes(0, engine, false, 0, kDefaultBlockSize * 2));
  EXPECT_FALSE(index.storeOwnHashes(0, std::span(engine).subspan(1), true, engine[0],
                                    kDefaultBlockSize));  // parent
  EXPECT_EQ(index.stats().stored_events_rejected, 3u);
  EXPECT_EQ(index.stats().blocks, 0u);
  EXPECT_TRUE(index.storeOwnHashes(0, std::span(engine).first(1), false, 0, kDefaultBlockSize));
  EXPECT_TRUE(
      index.storeOwnHashes(0, std::span(engine).subspan(1), true, engine[0], kDefaultBlockSize));
  EXPECT_EQ(index.exactHolders(ours[1]), HolderSet{0});
  EXPECT_EQ(index.instanceBlocks(0), 2u);
  EXPECT_FALSE(index.storeOwnHashes(64, engine, false, 0, kDefaultBlockSize));
  EXPECT_FALSE(index.storeOwnHashes(kMaxInstances, engine, false, 0, kDefaultBlockSize));
}

}  // namespace
}  // namespace kvf::policy
