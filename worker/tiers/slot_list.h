// An intrusive doubly linked list of slot indices (LRU orders, the dirty queue), with its links
// in an array the list owns: O(1) push, remove and move-to-front without allocation. Not
// thread-safe; the tier that owns it guards it with its own lock.
#pragma once

#include <cstdint>
#include <vector>

namespace kvf::worker {

class SlotList {
 public:
  static constexpr int32_t kNone = -1;

  explicit SlotList(size_t slots) : links_(slots) {}

  bool empty() const { return head_ == kNone; }
  size_t size() const { return size_; }
  bool contains(int32_t slot) const { return links_[slot].in; }
  int32_t front() const { return head_; }
  int32_t back() const { return tail_; }
  int32_t next(int32_t slot) const { return links_[slot].next; }  // towards the back
  int32_t prev(int32_t slot) const { return links_[slot].prev; }  // towards the front

  void pushFront(int32_t slot) {
    Link& l = links_[slot];
    l = {kNone, head_, true};
    if (head_ != kNone) links_[head_].prev = slot;
    head_ = slot;
    if (tail_ == kNone) tail_ = slot;
    ++size_;
  }

  void pushBack(int32_t slot) {
    Link& l = links_[slot];
    l = {tail_, kNone, true};
    if (tail_ != kNone) links_[tail_].next = slot;
    tail_ = slot;
    if (head_ == kNone) head_ = slot;
    ++size_;
  }

  // No-op when `slot` is not in the list.
  void remove(int32_t slot) {
    Link& l = links_[slot];
    if (!l.in) return;
    if (l.prev != kNone) links_[l.prev].next = l.next;
    if (l.next != kNone) links_[l.next].prev = l.prev;
    if (head_ == slot) head_ = l.next;
    if (tail_ == slot) tail_ = l.prev;
    l = {};
    --size_;
  }

  void moveToFront(int32_t slot) {
    remove(slot);
    pushFront(slot);
  }

 private:
  struct Link {
    int32_t prev = kNone;
    int32_t next = kNone;
    bool in = false;
  };
  std::vector<Link> links_;
  int32_t head_ = kNone;
  int32_t tail_ = kNone;
  size_t size_ = 0;
};

}  // namespace kvf::worker
