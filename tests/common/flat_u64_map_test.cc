#include "common/flat_u64_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <utility>

namespace kvf {
namespace {

struct Value {
  uint32_t a = 0;
  uint32_t b = 0;
};

// Random inserts, updates through pointers, erases by key and by value pointer, against
// std::unordered_map. Keys share their top bits (so with salt 1 they share a home slot and form
// long probe runs that wrap around the array end) and include 0, which lives outside the array.
TEST(FlatU64MapTest, AgreesWithUnorderedMapUnderClusteredKeys) {
  for (uint64_t salt : {uint64_t{1}, processSalt()}) {
    FlatU64Map<Value> map(salt);
    std::unordered_map<uint64_t, uint32_t> ref;
    std::mt19937_64 rng(salt);
    auto key = [&] {
      uint64_t k = rng() % 3000;
      return rng() % 4 == 0 ? k : (~uint64_t{0} << 54) | k;  // clustered at the top slots
    };
    for (int step = 0; step < 200000; ++step) {
      uint64_t k = key();
      switch (rng() % 4) {
        case 0: {
          auto [v, inserted] = map.tryEmplace(k, Value{static_cast<uint32_t>(step), 7});
          ASSERT_EQ(inserted, ref.try_emplace(k, static_cast<uint32_t>(step)).second);
          ASSERT_EQ(v->a, ref[k]);
          break;
        }
        case 1:
          ASSERT_EQ(map.erase(k), ref.erase(k) == 1);
          break;
        case 2:
          if (Value* v = map.find(k)) {
            ASSERT_TRUE(ref.contains(k));
            if (rng() % 2) {
              map.eraseValue(v);
              ref.erase(k);
            } else {
              v->a = ref[k] = static_cast<uint32_t>(step);
            }
          } else {
            ASSERT_FALSE(ref.contains(k));
          }
          break;
        default: {
          const Value* v = std::as_const(map).find(k);
          ASSERT_EQ(v != nullptr, ref.contains(k));
          if (v) {
            ASSERT_EQ(v->a, ref[k]);
          }
        }
      }
      ASSERT_EQ(map.size(), ref.size());
    }
    size_t seen = 0;
    map.forEach([&](uint64_t k, const Value& v) {
      ++seen;
      ASSERT_TRUE(ref.contains(k));
      EXPECT_EQ(v.a, ref[k]);
    });
    EXPECT_EQ(seen, ref.size());
    EXPECT_LE(map.size() * 2, map.capacity());
  }
}

// The array doubles exactly when the next insertion would use more than max_load_eighths / 8 of
// it, and a move keeps that bound.
TEST(FlatU64MapTest, GrowsAtItsMaxLoad) {
  for (int eighths : {2, 4, 6}) {
    FlatU64Map<Value> map(processSalt(), eighths);
    size_t capacity = 0;
    for (uint64_t k = 1; k <= 20000; ++k) {
      map.tryEmplace(k * 0x9e3779b97f4a7c15ULL, Value{});
      if (map.capacity() != capacity) {
        // Grown by this insertion: the one before it filled the old array to its bound.
        if (capacity != 0) {
          EXPECT_EQ(map.size() - 1, capacity / 8 * eighths) << eighths;
        }
        capacity = map.capacity();
      }
      ASSERT_LE(map.size() * 8, map.capacity() * eighths) << eighths;
    }
    FlatU64Map<Value> moved = std::move(map);
    for (uint64_t k = 20001; k <= 40000; ++k) moved.tryEmplace(k * 0x9e3779b97f4a7c15ULL, Value{});
    EXPECT_LE(moved.size() * 8, moved.capacity() * eighths) << eighths;
    EXPECT_GT(moved.size() * 8 * 2, moved.capacity() * eighths) << eighths;  // not grown early
  }
}

TEST(FlatU64MapTest, ClearAndMoveKeepItUsable) {
  FlatU64Map<Value> a;
  for (uint64_t k = 0; k < 5000; ++k) a.tryEmplace(k * 0x9e3779b97f4a7c15ULL, Value{1, 2});
  FlatU64Map<Value> b = std::move(a);
  EXPECT_EQ(b.size(), 5000u);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(a.find(0), nullptr);
  EXPECT_TRUE(a.tryEmplace(0, Value{}).second);
  EXPECT_NE(b.find(3 * 0x9e3779b97f4a7c15ULL), nullptr);
  b.clear();
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.capacity(), 0u);
  EXPECT_EQ(b.find(0), nullptr);
  EXPECT_TRUE(b.tryEmplace(42, Value{}).second);
}

}  // namespace
}  // namespace kvf
