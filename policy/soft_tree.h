// The cache index's soft entries: what the router routed and no event has announced yet
// (predicted, short TTL) or ever will (approximate: an instance without KV events). Each routed
// prompt is a chain of block hashes from its first block, so the soft entries form a tree of
// those chains: a node is a run of blocks that every chain through it shares, with the
// instances that claim the run and each claim's expiry (the latest of the chains that made it).
// A routed prompt costs one walk along the tree (sequential compares, one lookup per node it
// passes) and one expiry record, where a table of per-block entries took a random slot per
// block to write and another to expire; a 750-block prompt passes a few nodes.
//
// Claims are prefix-closed: a chain claims every node on its path, so an instance that claims a
// node claims its parent, with an expiry at least as late. Expiry walks from a chain's last node
// towards the root and stops at the first claim still live. A node without claims has no
// children left and is freed.
//
// Blocks are placed by position: a hash names the node it starts (children are found through
// one map from a run's first hash), and a lookup follows a prompt from its first block. Our
// chained hashes make a hash's position unique; a hash that would start a second node (a 64-bit
// collision, or a caller passing unchained hashes) ends the chain there instead. Pure and
// single-threaded, like CacheIndex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "common/clock.h"
#include "common/flat_u64_map.h"
#include "policy/block_hash.h"
#include "policy/holder_set.h"

namespace kvf::policy {

class SoftTree {
 public:
  // max_blocks: at most this many distinct blocks in the tree; a chain that reaches the bound
  // is claimed only as far as the blocks already there and the room left.
  explicit SoftTree(size_t max_blocks, uint64_t salt = processSalt());

  // Claims `hashes` (a prompt's block chain from its first block) for `instance` until
  // `expiry`; `queue` (0 or 1) names the expiry queue, one per TTL, so each stays in order.
  // Returns how many leading blocks are claimed.
  size_t add(int instance, std::span<const BlockHash> hashes, Nanos expiry, int queue);
  // Drops the claims whose expiry is at or before `now`.
  void expire(Nanos now);
  // Drops every claim of `instance` (its queued records go stale).
  void clearInstance(int instance);

  // Follows a prompt's hashes from its first block: next(h) gives the instances claiming the
  // next block, none once the prompt leaves the tree (and from then on). listed() stays valid
  // until the tree next changes.
  class Cursor {
   public:
    explicit Cursor(const SoftTree& tree) : tree_(&tree) {}
    // The claimants below kWordInstances of the next block; listed() gives the others.
    InstanceMask next(BlockHash hash) {
      if (pos_ == end_) [[unlikely]]
        return descend(hash);
      if (*pos_ != hash) return leave();
      ++pos_;
      return word_;
    }
    // The claimants at kWordInstances and past of the block next() last gave, ascending.
    std::span<const ListedInstance> listed() const { return listed_; }

   private:
    static constexpr uint32_t kOut = ~uint32_t{0};
    // At the end of node_'s run: on to the child that starts with `hash`, if any.
    InstanceMask descend(BlockHash hash) {
      if (node_ == kOut) return 0;
      const uint32_t* child = tree_->starts_.find(hash.value);
      if (child == nullptr || tree_->nodes_[*child].parent != node_) return leave();
      const Node& n = tree_->nodes_[*child];
      node_ = *child;
      pos_ = n.blocks.data() + 1;  // the first block is the map's key
      end_ = n.blocks.data() + n.blocks.size();
      word_ = n.holders;
      listed_ = n.listed;
      return word_;
    }
    InstanceMask leave() {
      node_ = kOut;
      pos_ = end_ = nullptr;
      listed_ = {};
      return 0;
    }
    const SoftTree* tree_;
    uint32_t node_ = kRoot;
    const BlockHash* pos_ = nullptr;  // node_'s next block, up to end_
    const BlockHash* end_ = nullptr;
    InstanceMask word_ = 0;
    std::span<const ListedInstance> listed_;
  };

  // (block, instance) claims, distinct blocks, and claims expired so far (blocks x instances).
  uint64_t claims() const { return claims_; }
  uint64_t blocks() const { return blocks_; }
  uint64_t expired() const { return expired_; }
  // Nodes in use (the root excluded): tests and diagnostics.
  size_t nodes() const { return nodes_.size() - 1 - free_.size(); }

 private:
  static constexpr uint32_t kRoot = 0;
  struct Claim {
    int32_t instance;
    Nanos expiry;
  };
  struct Node {
    std::vector<BlockHash> blocks;  // empty only for the root and for free nodes
    uint32_t parent = kRoot;
    uint32_t children = 0;
    uint32_t generation = 0;               // bumped when freed: older records naming it are stale
    InstanceMask holders = 0;              // claimants below kWordInstances
    std::vector<ListedInstance> listed;    // the others, ascending
    absl::InlinedVector<Claim, 2> claims;  // one per holder
  };
  struct Record {
    Nanos expiry;
    uint32_t node;  // the chain's last node (a split keeps this id on the deeper part)
    uint32_t generation;
    int32_t instance;
  };
  // Records in expiry order: a ring of a power-of-two size, doubled when full.
  class RecordQueue {
   public:
    bool empty() const { return head_ == tail_; }
    const Record& front() const { return ring_[head_ & mask_]; }
    void pop() { ++head_; }
    void push(const Record& r);

   private:
    std::vector<Record> ring_;
    uint64_t mask_ = 0;
    uint64_t head_ = 0;
    uint64_t tail_ = 0;
  };

  uint32_t newNode(uint32_t parent, std::span<const BlockHash> blocks);
  uint32_t splitHead(uint32_t id, size_t at);
  // `instance`'s claim on `n`, or null.
  static Claim* findClaim(Node& n, int instance);
  void claim(uint32_t id, int instance, Nanos expiry);
  // Drops the claim `c` of node `n`.
  void dropClaim(Node& n, Claim* c);
  // Frees `id` if nothing claims it and it has no children, then its parent the same way.
  void freeIfUnused(uint32_t id);

  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;
  FlatU64Map<uint32_t> starts_;  // a node's first hash (its value) -> the node
  RecordQueue queues_[2];
  size_t max_blocks_;
  uint64_t claims_ = 0;
  uint64_t blocks_ = 0;
  uint64_t expired_ = 0;
};

}  // namespace kvf::policy
