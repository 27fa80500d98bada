#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <random>
#include <variant>

#include "engine/kv_pool.h"
#include "tests/engine/engine_test_util.h"
#include "worker/block_payload.h"

namespace kvf::engine {
namespace {

using testing::hashList;

std::unique_ptr<KvPool> makePool(int64_t blocks, worker::KvEventSink* sink) {
  KvPoolOptions o;
  o.block_size = 4;
  o.num_blocks = blocks;
  o.payload_bytes_per_block = 64;
  auto pool = KvPool::create(o, sink);
  EXPECT_TRUE(pool.ok());
  return std::move(*pool);
}

TEST(KvPoolTest, AllocateReleaseAndCounts) {
  auto pool = makePool(4, nullptr);
  EXPECT_EQ(pool->numFreeBlocks(), 4);
  auto a = pool->allocate(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(pool->numFreeBlocks(), 1);
  EXPECT_DOUBLE_EQ(pool->usage(), 0.75);
  EXPECT_FALSE(pool->allocate(2).has_value());
  EXPECT_EQ(pool->numFreeBlocks(), 1);  // failed allocation changes nothing
  pool->release(*a);
  EXPECT_EQ(pool->numFreeBlocks(), 4);
}

TEST(KvPoolTest, CachedBlocksSurviveReleaseAndAreEvictedLru) {
  worker::VectorEventSink sink;
  auto pool = makePool(3, &sink);
  auto a = pool->allocate(3);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(pool->cacheBlock((*a)[0], BlockHash(100)));
  ASSERT_TRUE(pool->cacheBlock((*a)[1], BlockHash(101)));
  // Block 2 stays uncached; a duplicate hash is refused.
  EXPECT_FALSE(pool->cacheBlock((*a)[2], BlockHash(100)));
  EXPECT_TRUE(worker::verifyBlockPayload(BlockHash(100), pool->payload((*a)[0])));
  EXPECT_FALSE(worker::verifyBlockPayload(BlockHash(101), pool->payload((*a)[0])));
  pool->release(*a);  // order: 100 then 101 at the LRU tail, the uncached one at the head
  std::vector<BlockHash> hashes = hashList({100, 101});
  EXPECT_EQ(pool->findCachedPrefix(hashes).size(), 2u);

  auto b = pool->allocate(2);  // takes the uncached block, then evicts 100 (least recent)
  ASSERT_TRUE(b.has_value());
  ASSERT_EQ(sink.events().size(), 1u);
  auto* removed = std::get_if<worker::BlockRemoved>(&sink.events()[0]);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->block_hashes, hashList({100}));
  EXPECT_TRUE(pool->findCachedPrefix(hashes).empty());  // the chain now misses at block 0
  std::vector<BlockHash> second = hashList({101});
  EXPECT_EQ(pool->findCachedPrefix(second).size(), 1u);
}

// The free queue against a reference written with a doubly linked list (std::list): random
// allocations, releases (cached blocks to the tail, uncached ones to the head), caching and
// references taken on free cached blocks (out of the middle of the queue), long enough for the
// queue's stale entries to be compacted many times. Every allocation must return the same
// blocks in the same order and evict the same hashes.
TEST(KvPoolTest, FreeQueueOrderMatchesALinkedListModel) {
  constexpr int64_t kBlocks = 48;
  worker::VectorEventSink sink;
  auto pool = makePool(kBlocks, &sink);
  std::list<BlockIndex> model;  // eviction order
  std::vector<int> refs(kBlocks, 0);
  std::map<BlockIndex, BlockHash> hash_of;
  std::map<BlockHash, BlockIndex> block_of;
  for (BlockIndex b = 0; b < kBlocks; ++b) model.push_back(b);
  std::vector<std::vector<BlockIndex>> held;  // per "request", in token order
  std::mt19937_64 rng(7);
  uint64_t next_hash = 1;
  size_t evictions = 0, middle_takes = 0;
  // A request's blocks back, tail first: cached ones to the queue's tail, uncached to its head.
  auto release = [&](std::vector<BlockIndex> blocks) {
    std::reverse(blocks.begin(), blocks.end());
    pool->release(blocks);
    for (BlockIndex b : blocks) {
      if (--refs[b] > 0) continue;
      if (hash_of.contains(b)) {
        model.push_back(b);
      } else {
        model.push_front(b);
      }
    }
  };
  for (int step = 0; step < 20000; ++step) {
    int op = static_cast<int>(rng() % 4);
    if (held.size() > 6) op = 1;  // keep most blocks free, so the queue stays busy
    switch (op) {
      case 0: {  // allocate
        auto n = static_cast<int64_t>(1 + rng() % 6);
        auto got = pool->allocate(n);
        ASSERT_EQ(got.has_value(), n <= static_cast<int64_t>(model.size())) << step;
        if (!got) break;
        std::vector<BlockHash> evicted;
        for (int64_t i = 0; i < n; ++i) {
          BlockIndex b = model.front();
          model.pop_front();
          ASSERT_EQ((*got)[static_cast<size_t>(i)], b) << "step " << step;
          refs[b] = 1;
          if (auto it = hash_of.find(b); it != hash_of.end()) {
            evicted.push_back(it->second);
            block_of.erase(it->second);
            hash_of.erase(it);
          }
        }
        if (!evicted.empty()) {
          ASSERT_FALSE(sink.events().empty());
          auto* removed = std::get_if<worker::BlockRemoved>(&sink.events().back());
          ASSERT_NE(removed, nullptr);
          ASSERT_EQ(removed->block_hashes, evicted) << "step " << step;
          evictions += evicted.size();
        }
        held.push_back(*got);
        break;
      }
      case 1:
      case 2: {  // cache some held blocks, then release a request's blocks (tail first)
        if (held.empty()) break;
        size_t k = rng() % held.size();
        std::vector<BlockIndex> blocks = held[k];
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        for (BlockIndex b : blocks) {
          if (rng() % 2 == 0 && !hash_of.contains(b)) {
            BlockHash h(next_hash++);
            ASSERT_TRUE(pool->cacheBlock(b, h));
            hash_of[b] = h;
            block_of[h] = b;
          }
        }
        release(blocks);
        break;
      }
      default: {  // a prefix hit takes a free cached block out of the middle of the queue
        if (hash_of.empty()) break;
        auto it = hash_of.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % hash_of.size()));
        std::vector<BlockHash> one = {it->second};
        auto found = pool->findCachedPrefix(one);
        ASSERT_EQ(found.size(), 1u);
        ASSERT_EQ(found[0], it->first);
        pool->acquire(found);
        if (refs[it->first]++ == 0) {
          model.remove(it->first);
          ++middle_takes;
        }
        held.push_back(found);
      }
    }
    ASSERT_EQ(pool->numFreeBlocks(), static_cast<int64_t>(model.size())) << "step " << step;
  }
  EXPECT_GT(evictions, 1000u);
  EXPECT_GT(middle_takes, 2000u);
  // Prefix hits and releases without allocations in between: the queue's stale entries pile up
  // past the compaction threshold many times; the order must survive it.
  for (auto& blocks : held) release(blocks);
  held.clear();
  ASSERT_FALSE(hash_of.empty());
  for (int i = 0; i < 3000; ++i) {
    auto it = hash_of.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % hash_of.size()));
    std::vector<BlockIndex> one = {it->first};
    pool->acquire(one);
    pool->release(one);
    model.remove(it->first);
    model.push_back(it->first);
  }
  auto all = pool->allocate(kBlocks);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(*all, std::vector<BlockIndex>(model.begin(), model.end()));
}

// A watched lookup stays intact while its blocks keep their hashes: allocations that evict
// other blocks, references taken and dropped, and blocks added to it leave it intact; evicting
// one of its blocks, resetting the prefix cache or starting another watch breaks it.
TEST(KvPoolTest, WatchedPrefixBreaksOnlyWhenOneOfItsBlocksLosesItsHash) {
  auto pool = makePool(6, nullptr);
  auto a = pool->allocate(6);
  ASSERT_TRUE(a.has_value());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pool->cacheBlock((*a)[i], BlockHash(200 + i)));
  pool->release(*a);  // LRU order 200..205: 200 is evicted first
  std::vector<BlockHash> tail = hashList({204, 205});
  std::vector<BlockIndex> found = pool->findCachedPrefix(tail);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_FALSE(pool->watchIntact(0));
  uint64_t id = pool->watchCachedPrefix(std::span<const BlockIndex>(found).first(1));
  EXPECT_TRUE(pool->watchIntact(id));
  pool->extendWatch(id, std::span<const BlockIndex>(found).subspan(1));
  EXPECT_EQ(pool->watchedUnreferenced(), 2);
  auto b = pool->allocate(3);  // evicts 200, 201, 202: none watched
  ASSERT_TRUE(b.has_value());
  pool->acquire(found);
  EXPECT_EQ(pool->watchedUnreferenced(), 0);  // kept as countUnreferenced would count
  pool->acquire(std::span<const BlockIndex>(found).first(1));
  pool->release(std::span<const BlockIndex>(found).first(1));
  EXPECT_EQ(pool->watchedUnreferenced(), pool->countUnreferenced(found));
  pool->release(found);
  EXPECT_EQ(pool->watchedUnreferenced(), 2);
  EXPECT_TRUE(pool->watchIntact(id));
  pool->release(*b);
  auto c = pool->allocate(5);  // the three fresh ones, then 203, then 204 (watched)
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(pool->watchIntact(id));
  EXPECT_EQ(pool->findCachedPrefix(tail).size(), 0u);

  uint64_t second = pool->watchCachedPrefix(pool->findCachedPrefix(hashList({205})));
  EXPECT_NE(second, id);
  EXPECT_TRUE(pool->watchIntact(second));
  uint64_t third = pool->watchCachedPrefix({});
  EXPECT_FALSE(pool->watchIntact(second));  // one watch at a time
  pool->release(*c);
  EXPECT_TRUE(pool->watchIntact(third));
  ASSERT_TRUE(pool->resetPrefixCache());
  EXPECT_FALSE(pool->watchIntact(third));
}

// Blocks of an earlier watch (ended, or replaced) no longer count for the current one: taking
// and dropping references on them leaves its count alone, and evicting them leaves it intact.
TEST(KvPoolTest, BlocksOfAnEarlierWatchDoNotCountForTheNextOne) {
  auto pool = makePool(4, nullptr);
  auto a = pool->allocate(4);
  ASSERT_TRUE(a.has_value());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool->cacheBlock((*a)[i], BlockHash(300 + i)));
  pool->release(*a);  // LRU order 300..303
  std::vector<BlockIndex> old_watch = pool->findCachedPrefix(hashList({300, 301}));
  ASSERT_EQ(old_watch.size(), 2u);
  uint64_t first = pool->watchCachedPrefix(old_watch);
  EXPECT_EQ(pool->watchedUnreferenced(), 2);
  pool->endWatch();
  EXPECT_FALSE(pool->watchIntact(first));
  std::vector<BlockIndex> watch = pool->findCachedPrefix(hashList({303}));
  ASSERT_EQ(watch.size(), 1u);
  uint64_t second = pool->watchCachedPrefix(watch);
  EXPECT_EQ(pool->watchedUnreferenced(), 1);
  pool->acquire(watch);  // 303 leaves the free queue
  EXPECT_EQ(pool->watchedUnreferenced(), 0);
  pool->acquire(old_watch);
  EXPECT_EQ(pool->watchedUnreferenced(), 0);
  pool->release(old_watch);  // back at the LRU tail: 302, 300, 301 are evicted next
  EXPECT_EQ(pool->watchedUnreferenced(), 0);
  auto b = pool->allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(pool->watchIntact(second));
  EXPECT_EQ(pool->findCachedPrefix(hashList({300})).size(), 0u);
  EXPECT_EQ(pool->watchedUnreferenced(), pool->countUnreferenced(watch));
}

TEST(KvPoolTest, AcquireTakesCachedBlockOffTheFreeQueue) {
  auto pool = makePool(2, nullptr);
  auto a = pool->allocate(1);
  ASSERT_TRUE(pool->cacheBlock((*a)[0], BlockHash(7)));
  pool->release(*a);
  EXPECT_EQ(pool->numFreeBlocks(), 2);
  EXPECT_EQ(pool->countUnreferenced(*a), 1);
  pool->acquire(*a);
  EXPECT_EQ(pool->numFreeBlocks(), 1);
  EXPECT_EQ(pool->refCount((*a)[0]), 1);
  auto b = pool->allocate(1);
  ASSERT_TRUE(b.has_value());
  EXPECT_NE((*b)[0], (*a)[0]);
  EXPECT_TRUE(pool->table().contains(BlockHash(7)));
}

TEST(KvPoolTest, PinnedBlocksAreNotEvicted) {
  worker::VectorEventSink sink;
  auto pool = makePool(2, &sink);
  auto a = pool->allocate(2);
  ASSERT_TRUE(pool->cacheBlock((*a)[0], BlockHash(1)));
  ASSERT_TRUE(pool->cacheBlock((*a)[1], BlockHash(2)));
  pool->release(*a);
  ASSERT_TRUE(pool->pin(BlockHash(1)).ok());
  EXPECT_EQ(pool->table().pins(BlockHash(1)), 1u);
  EXPECT_FALSE(pool->allocate(2).has_value());
  auto b = pool->allocate(1);
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(pool->table().contains(BlockHash(1)));
  EXPECT_FALSE(pool->table().contains(BlockHash(2)));
  EXPECT_FALSE(pool->pin(BlockHash(2)).ok());
  ASSERT_TRUE(pool->unpin(BlockHash(1)).ok());
  EXPECT_FALSE(pool->unpin(BlockHash(1)).ok());
  EXPECT_EQ(pool->numFreeBlocks(), 1);
}

// A lookup hint (the blocks an earlier lookup found) gives exactly the plain lookup's answer,
// also when hinted blocks were evicted and their hashes re-cached elsewhere.
TEST(KvPoolTest, PrefixHintGivesThePlainLookup) {
  auto pool = makePool(4, nullptr);
  auto a = pool->allocate(3);
  ASSERT_TRUE(a.has_value());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool->cacheBlock((*a)[i], BlockHash(200 + i)));
  pool->release(*a);
  std::vector<BlockHash> hashes = hashList({200, 201, 202, 203});
  std::vector<BlockIndex> hint = pool->findCachedPrefix(hashes);
  ASSERT_EQ(hint, *a);
  EXPECT_EQ(pool->findCachedPrefix(hashes, hint), hint);
  // Evict everything (the free uncached block first, then LRU), re-cache 200 and 201 in other
  // blocks: the stale hint must not be trusted.
  auto b = pool->allocate(4);
  ASSERT_TRUE(b.has_value());
  ASSERT_TRUE(pool->cacheBlock((*b)[3], BlockHash(200)));
  ASSERT_TRUE(pool->cacheBlock((*b)[2], BlockHash(201)));
  std::vector<BlockIndex> plain = pool->findCachedPrefix(hashes);
  EXPECT_EQ(plain, (std::vector<BlockIndex>{(*b)[3], (*b)[2]}));
  EXPECT_EQ(pool->findCachedPrefix(hashes, hint), plain);
  // A hint longer than the run, and one with an out-of-range index.
  EXPECT_EQ(pool->findCachedPrefix(hashes, plain), plain);
  std::vector<BlockIndex> bad = {(*b)[3], 99};
  EXPECT_EQ(pool->findCachedPrefix(hashes, bad), plain);
  // The last hash cached since the hint was taken extends the run.
  ASSERT_TRUE(pool->cacheBlock((*b)[1], BlockHash(202)));
  EXPECT_EQ(pool->findCachedPrefix(hashes, plain).size(), 3u);
}

// A PayloadMemory in host memory: what the device pool does, with bytes a test can read.
class HostRegion final : public PayloadMemory {
 public:
  explicit HostRegion(size_t bytes) : bytes_(bytes) {}
  std::span<std::byte> region() override { return bytes_; }
  void write(std::span<std::byte> block, worker::BlockHash hash) override {
    ++writes;
    worker::fillBlockPayload(hash, block);
  }
  bool verify(std::span<const std::byte> block, worker::BlockHash hash) override {
    ++verifies;
    return worker::verifyBlockPayload(hash, block);
  }
  std::vector<std::byte> bytes_;
  int writes = 0;
  int verifies = 0;
};

TEST(KvPoolTest, PayloadMemoryTakesEveryWriteAndEveryCheck) {
  KvPoolOptions o;
  o.block_size = 4;
  o.num_blocks = 4;
  o.payload_bytes_per_block = 64;
  auto small = KvPool::create(o, nullptr, std::make_shared<HostRegion>(4 * 64 - 1));
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument) << small.status();

  auto memory = std::make_shared<HostRegion>(4 * 64);
  auto created = KvPool::create(o, nullptr, memory);
  ASSERT_TRUE(created.ok()) << created.status();
  KvPool& pool = **created;
  EXPECT_FALSE(pool.payloadOnHost());
  EXPECT_EQ(pool.payloadRegion().data(), memory->bytes_.data());
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(pool.cacheBlock((*a)[0], BlockHash(7)));
  ASSERT_TRUE(pool.cacheBlock((*a)[1], BlockHash(8)));
  EXPECT_EQ(memory->writes, 2);
  // The block's bytes are where payload() says, in the region.
  EXPECT_EQ(pool.payload((*a)[1]).data(), memory->bytes_.data() + 64 * (*a)[1]);
  EXPECT_TRUE(worker::verifyBlockPayload(BlockHash(8), pool.payload((*a)[1])));
  EXPECT_TRUE(pool.verifyPayload((*a)[0], BlockHash(7)));
  EXPECT_FALSE(pool.verifyPayload((*a)[0], BlockHash(8)));
  EXPECT_EQ(pool.auditPayloads().corrupt_blocks, 0);
  // Damage reaches the audit only through the memory's own check.
  memory->verifies = 0;
  memory->bytes_[64 * (*a)[0] + 3] ^= std::byte{1};
  KvPool::PayloadAudit audit = pool.auditPayloads();
  EXPECT_EQ(audit.cached_blocks, 2);
  EXPECT_EQ(audit.corrupt_blocks, 1);
  EXPECT_EQ(memory->verifies, 2);
}

}  // namespace
}  // namespace kvf::engine
