#include "policy/soft_tree.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvf::policy {
namespace {

constexpr InstanceMask kI0 = 1, kI1 = 2, kI2 = 4;

// A chain of block hashes with these values.
std::vector<BlockHash> H(std::initializer_list<uint64_t> values) {
  std::vector<BlockHash> out;
  for (uint64_t v : values) out.push_back(BlockHash{v});
  return out;
}

// The claim masks a cursor gives along `chain`.
std::vector<InstanceMask> walk(const SoftTree& tree, std::initializer_list<uint64_t> chain) {
  SoftTree::Cursor cursor(tree);
  std::vector<InstanceMask> out;
  for (BlockHash h : H(chain)) out.push_back(cursor.next(h));
  return out;
}

// The same with every claimant, listed ones (slot 63 and past) included.
std::vector<HolderSet> walkSets(const SoftTree& tree, std::initializer_list<uint64_t> chain) {
  SoftTree::Cursor cursor(tree);
  std::vector<HolderSet> out;
  for (BlockHash h : H(chain)) {
    const InstanceMask word = cursor.next(h);
    out.emplace_back(HolderView{word, cursor.listed()});
  }
  return out;
}

using Masks = std::vector<InstanceMask>;

TEST(SoftTreeTest, ChainsShareTheirCommonPrefixAndBranchAfterIt) {
  SoftTree tree(100);
  EXPECT_EQ(tree.add(0, H({1, 2, 3, 4}), 10, 0), 4u);
  EXPECT_EQ(tree.add(1, H({1, 2, 5}), 10, 0), 3u);
  EXPECT_EQ(tree.nodes(), 3u);  // [1 2] [3 4] [5]
  EXPECT_EQ(tree.blocks(), 5u);
  EXPECT_EQ(tree.claims(), 7u);
  EXPECT_EQ(walk(tree, {1, 2, 3, 4}), (Masks{kI0 | kI1, kI0 | kI1, kI0, kI0}));
  EXPECT_EQ(walk(tree, {1, 2, 5, 6}), (Masks{kI0 | kI1, kI0 | kI1, kI1, 0}));
  // A prompt that leaves the tree stays out of it, even where a later hash is a node's first.
  EXPECT_EQ(walk(tree, {1, 9, 5}), (Masks{kI0 | kI1, 0, 0}));
  EXPECT_EQ(walk(tree, {5}), (Masks{0}));  // [5] is not a first block
}

TEST(SoftTreeTest, AChainEndingInsideARunSplitsIt) {
  SoftTree tree(100);
  tree.add(0, H({1, 2, 3, 4}), 10, 0);
  tree.add(1, H({1, 2}), 20, 0);
  EXPECT_EQ(tree.nodes(), 2u);
  EXPECT_EQ(walk(tree, {1, 2, 3, 4}), (Masks{kI0 | kI1, kI0 | kI1, kI0, kI0}));
  // The first chain's record still names its last node: both of its runs expire at 10.
  tree.expire(10);
  EXPECT_EQ(walk(tree, {1, 2, 3, 4}), (Masks{kI1, kI1, 0, 0}));
  EXPECT_EQ(tree.nodes(), 1u);
  EXPECT_EQ(tree.expired(), 4u);
  tree.expire(20);
  EXPECT_EQ(tree.nodes(), 0u);
  EXPECT_EQ(tree.blocks(), 0u);
  EXPECT_EQ(tree.claims(), 0u);
}

TEST(SoftTreeTest, ExpiryStopsAtAClaimALaterChainRefreshed) {
  SoftTree tree(100);
  tree.add(0, H({1, 2, 3, 4}), 10, 0);
  tree.add(0, H({1, 2, 5}), 20, 0);
  tree.expire(10);  // [3 4] goes; [1 2] was routed again until 20
  EXPECT_EQ(walk(tree, {1, 2, 3}), (Masks{kI0, kI0, 0}));
  EXPECT_EQ(walk(tree, {1, 2, 5}), (Masks{kI0, kI0, kI0}));
  EXPECT_EQ(tree.blocks(), 3u);
  tree.add(0, H({1, 2, 5}), 15, 1);  // an earlier expiry does not shorten it
  tree.expire(19);
  EXPECT_EQ(walk(tree, {1, 2, 5}), (Masks{kI0, kI0, kI0}));
  tree.expire(20);
  EXPECT_EQ(tree.nodes(), 0u);
  EXPECT_EQ(tree.expired(), 5u);
}

TEST(SoftTreeTest, ClearingAnInstanceLeavesTheOthersAndStaleRecordsDoNothing) {
  SoftTree tree(100);
  tree.add(0, H({1, 2, 3}), 10, 0);
  tree.add(1, H({1, 2}), 50, 0);
  tree.add(0, H({7, 8}), 10, 0);
  tree.clearInstance(0);
  EXPECT_EQ(walk(tree, {1, 2, 3}), (Masks{kI1, kI1, 0}));
  EXPECT_EQ(tree.nodes(), 1u);
  EXPECT_EQ(tree.claims(), 2u);
  // Freed nodes are reused; the cleared chains' records (due at 10) must not touch them.
  tree.add(2, H({9, 10}), 100, 0);
  tree.add(2, H({11}), 100, 0);
  tree.expire(10);
  EXPECT_EQ(walk(tree, {9, 10}), (Masks{kI2, kI2}));
  EXPECT_EQ(walk(tree, {11}), (Masks{kI2}));
  EXPECT_EQ(tree.expired(), 0u);
  tree.expire(100);
  EXPECT_EQ(tree.nodes(), 0u);
}

TEST(SoftTreeTest, BlocksAreBoundedAndChainsAreCutToFit) {
  SoftTree tree(3);
  EXPECT_EQ(tree.add(0, H({1, 2, 3, 4}), 10, 0), 3u);
  EXPECT_EQ(tree.add(1, H({1, 2, 3, 4}), 10, 0), 3u);  // what is there
  EXPECT_EQ(tree.add(1, H({6}), 10, 0), 0u);
  EXPECT_EQ(tree.blocks(), 3u);
  EXPECT_EQ(walk(tree, {1, 2, 3, 4}), (Masks{kI0 | kI1, kI0 | kI1, kI0 | kI1, 0}));
}

// Our chained hashes place a hash at one position; hashes that do not (a caller's own numbers,
// or a 64-bit collision) end the chain where it would need a second node for the same first
// hash, and nothing else changes.
TEST(SoftTreeTest, AHashAlreadyStartingAnotherRunEndsTheChain) {
  SoftTree tree(100);
  tree.add(0, H({1, 2, 3}), 10, 0);
  tree.add(1, H({3, 4}), 10, 0);                    // 3 now starts a run at the root
  EXPECT_EQ(tree.add(2, H({1, 2, 5}), 10, 0), 0u);  // split at 3: refused
  EXPECT_EQ(walk(tree, {1, 2, 3}), (Masks{kI0, kI0, kI0}));
  EXPECT_EQ(walk(tree, {3, 4}), (Masks{kI1, kI1}));
  tree.add(0, H({7, 8}), 10, 0);
  tree.add(0, H({7, 9}), 10, 0);  // [7] [8] [9]: 8 starts a run below 7
  EXPECT_EQ(tree.add(1, H({8, 1}), 10, 0), 0u);
  EXPECT_EQ(walk(tree, {8}), (Masks{0}));
  tree.expire(10);
  EXPECT_EQ(tree.nodes(), 0u);
  EXPECT_EQ(tree.blocks(), 0u);
  EXPECT_EQ(tree.claims(), 0u);
}

// Instances past the word (63 .. 1,023) claim, split, expire and clear like the others.
TEST(SoftTreeTest, ListedInstancesClaimSplitAndExpire) {
  SoftTree tree(100);
  tree.add(1023, H({1, 2, 3, 4}), 10, 0);
  tree.add(63, H({1, 2}), 20, 0);
  tree.add(5, H({1, 2, 3}), 30, 0);
  tree.add(700, H({1, 2, 3}), 30, 0);
  using Sets = std::vector<HolderSet>;
  EXPECT_EQ(walkSets(tree, {1, 2, 3, 4}),
            (Sets{{5, 63, 700, 1023}, {5, 63, 700, 1023}, {5, 700, 1023}, {1023}}));
  EXPECT_EQ(tree.claims(), 4u + 2u + 3u + 3u);
  tree.expire(10);
  EXPECT_EQ(walkSets(tree, {1, 2, 3, 4}), (Sets{{5, 63, 700}, {5, 63, 700}, {5, 700}, {}}));
  tree.clearInstance(700);
  tree.expire(20);
  EXPECT_EQ(walkSets(tree, {1, 2, 3}), (Sets{{5}, {5}, {5}}));
  tree.expire(30);
  EXPECT_EQ(tree.nodes(), 0u);
  EXPECT_EQ(tree.claims(), 0u);
}

}  // namespace
}  // namespace kvf::policy
