#include "policy/soft_tree.h"

#include <algorithm>

namespace kvf::policy {

SoftTree::SoftTree(size_t max_blocks, uint64_t salt)
    : nodes_(1), starts_(salt), max_blocks_(max_blocks) {}

void SoftTree::RecordQueue::push(const Record& r) {
  if (tail_ - head_ == ring_.size()) {
    std::vector<Record> bigger(std::max<size_t>(256, 2 * ring_.size()));
    const uint64_t mask = bigger.size() - 1;
    for (uint64_t seq = head_; seq < tail_; ++seq) bigger[seq & mask] = ring_[seq & mask_];
    ring_ = std::move(bigger);
    mask_ = mask;
  }
  ring_[tail_++ & mask_] = r;
}

size_t SoftTree::add(int instance, std::span<const BlockHash> hashes, Nanos expiry, int queue) {
  uint32_t node = kRoot;
  size_t i = 0;
  while (i < hashes.size()) {
    if (const uint32_t* found = starts_.find(hashes[i].value)) {
      const uint32_t child = *found;
      const std::vector<BlockHash>& run = nodes_[child].blocks;
      if (nodes_[child].parent != node) break;  // the hash starts a run elsewhere
      const size_t n = std::min(run.size(), hashes.size() - i);
      size_t same = 1;  // the first block is the map's key
      while (same < n && run[same] == hashes[i + same]) ++same;
      uint32_t id = child;
      if (same < run.size()) {
        if (starts_.contains(run[same].value)) break;  // the split would start a second run there
        id = splitHead(child, same);
      }
      claim(id, instance, expiry);
      node = id;
      i += same;
      continue;
    }
    const size_t room = max_blocks_ > blocks_ ? max_blocks_ - blocks_ : 0;
    const size_t take = std::min(hashes.size() - i, room);
    if (take == 0) break;
    node = newNode(node, hashes.subspan(i, take));
    claim(node, instance, expiry);
    i += take;
  }
  if (node != kRoot) {
    queues_[queue & 1].push(Record{expiry, node, nodes_[node].generation, instance});
  }
  return i;
}

uint32_t SoftTree::newNode(uint32_t parent, std::span<const BlockHash> blocks) {
  uint32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[id];
  n.blocks.assign(blocks.begin(), blocks.end());
  n.parent = parent;
  n.children = 0;
  n.holders = 0;
  n.listed.clear();
  n.claims.clear();
  ++nodes_[parent].children;
  starts_.tryEmplace(blocks.front().value, id);
  blocks_ += blocks.size();
  return id;
}

// Node `id` keeps its blocks from `at` on (so records naming it still name a chain's last node)
// and a new parent takes the ones before, with the same claims: every chain through `id` passes
// through both.
uint32_t SoftTree::splitHead(uint32_t id, size_t at) {
  const uint32_t parent = nodes_[id].parent;
  // A copy: newNode may grow nodes_, and the blocks must not be read from a moved node.
  const std::vector<BlockHash> head(nodes_[id].blocks.begin(),
                                    nodes_[id].blocks.begin() + static_cast<ptrdiff_t>(at));
  const uint32_t h = newNode(parent, head);
  blocks_ -= at;              // the same blocks, now in two nodes
  --nodes_[parent].children;  // `h` replaces `id` under the parent
  Node& tail = nodes_[id];
  Node& top = nodes_[h];
  tail.blocks.erase(tail.blocks.begin(), tail.blocks.begin() + static_cast<ptrdiff_t>(at));
  top.children = 1;
  top.holders = tail.holders;
  top.listed = tail.listed;
  top.claims = tail.claims;
  tail.parent = h;
  *starts_.find(top.blocks.front().value) = h;
  starts_.tryEmplace(tail.blocks.front().value, id);
  return h;
}

SoftTree::Claim* SoftTree::findClaim(Node& n, int instance) {
  if (!HolderView{n.holders, n.listed}.contains(instance)) return nullptr;
  for (Claim& c : n.claims) {
    if (c.instance == instance) return &c;
  }
  return nullptr;
}

void SoftTree::claim(uint32_t id, int instance, Nanos expiry) {
  Node& n = nodes_[id];
  if (Claim* c = findClaim(n, instance)) {
    c->expiry = std::max(c->expiry, expiry);
    return;
  }
  if (instance < kWordInstances) {
    n.holders |= instanceBit(instance);
  } else {
    const auto listed_id = static_cast<ListedInstance>(instance);
    n.listed.insert(std::lower_bound(n.listed.begin(), n.listed.end(), listed_id), listed_id);
  }
  n.claims.push_back(Claim{instance, expiry});
  claims_ += n.blocks.size();
}

void SoftTree::dropClaim(Node& n, Claim* c) {
  if (c->instance < kWordInstances) {
    n.holders &= ~instanceBit(c->instance);
  } else {
    n.listed.erase(std::lower_bound(n.listed.begin(), n.listed.end(),
                                    static_cast<ListedInstance>(c->instance)));
  }
  n.claims.erase(n.claims.begin() + (c - n.claims.data()));
  claims_ -= n.blocks.size();
}

void SoftTree::freeIfUnused(uint32_t id) {
  while (id != kRoot) {
    Node& n = nodes_[id];
    if (n.holders != 0 || !n.listed.empty() || n.children != 0) return;
    const uint32_t parent = n.parent;
    starts_.erase(n.blocks.front().value);
    blocks_ -= n.blocks.size();
    n.blocks.clear();
    n.listed.clear();
    n.claims.clear();
    ++n.generation;
    free_.push_back(id);
    --nodes_[parent].children;
    id = parent;
  }
}

void SoftTree::expire(Nanos now) {
  for (RecordQueue& queue : queues_) {
    while (!queue.empty() && queue.front().expiry <= now) {
      const Record r = queue.front();
      queue.pop();
      if (nodes_[r.node].generation != r.generation) continue;  // freed since
      // From the chain's last node up: a claim still live here is live above it too.
      uint32_t id = r.node;
      while (id != kRoot) {
        Node& n = nodes_[id];
        Claim* c = findClaim(n, r.instance);
        if (c == nullptr || c->expiry > now) break;
        expired_ += n.blocks.size();
        dropClaim(n, c);
        const uint32_t parent = n.parent;
        freeIfUnused(id);
        id = parent;
      }
    }
  }
}

void SoftTree::clearInstance(int instance) {
  for (uint32_t id = 1; id < nodes_.size(); ++id) {
    Node& n = nodes_[id];  // a free node has no holders, so no claim
    if (Claim* c = findClaim(n, instance)) dropClaim(n, c);
  }
  // An unclaimed node's subtree is unclaimed too: freeing from each leaf frees all of it.
  for (uint32_t id = 1; id < nodes_.size(); ++id) {
    if (!nodes_[id].blocks.empty()) freeIfUnused(id);
  }
}

}  // namespace kvf::policy
