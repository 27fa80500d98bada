#include <gtest/gtest.h>

#include <array>
#include <cstddef>

#include "worker/block_payload.h"
#include "worker/block_table.h"

namespace kvf::worker {
namespace {

TEST(BlockTableTest, InsertFindEraseAndPins) {
  BlockTable t;
  EXPECT_TRUE(t.insert(BlockHash(42), 3));
  EXPECT_FALSE(t.insert(BlockHash(42), 4));  // first holder wins
  EXPECT_EQ(t.find(BlockHash(42)), std::optional<BlockIndex>(3));
  EXPECT_FALSE(t.find(BlockHash(43)).has_value());
  EXPECT_EQ(t.pin(BlockHash(43)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(t.pin(BlockHash(42)).ok());
  ASSERT_TRUE(t.pin(BlockHash(42)).ok());
  EXPECT_EQ(t.pins(BlockHash(42)), 2u);
  ASSERT_TRUE(t.unpin(BlockHash(42)).ok());
  ASSERT_TRUE(t.unpin(BlockHash(42)).ok());
  EXPECT_EQ(t.unpin(BlockHash(42)).code(), absl::StatusCode::kFailedPrecondition);
  t.erase(BlockHash(42));
  EXPECT_EQ(t.size(), 0u);
}

TEST(BlockPayloadTest, ContentIsAFunctionOfTheHash) {
  std::array<std::byte, 37> a{}, b{};
  fillBlockPayload(BlockHash(7), a);
  fillBlockPayload(BlockHash(7), b);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(verifyBlockPayload(BlockHash(7), a));
  EXPECT_FALSE(verifyBlockPayload(BlockHash(8), a));
  a[36] ^= std::byte{1};  // the tail bytes are checked too
  EXPECT_FALSE(verifyBlockPayload(BlockHash(7), a));
}

}  // namespace
}  // namespace kvf::worker
