#include "router/kv_event_codec.h"

#include <gtest/gtest.h>

#include <random>

#include "policy/block_hash.h"
#include "tests/fakes/fake_kv_publisher.h"

namespace kvf::router {
namespace {

using fakes::FakeKvEvent;

std::vector<FakeKvEvent> sampleEvents() {
  FakeKvEvent stored;
  stored.hashes = {11, 12};
  stored.parent = 10;
  stored.token_ids.assign(32, 5);
  FakeKvEvent removed;
  removed.kind = FakeKvEvent::Kind::kRemoved;
  removed.hashes = {12};
  FakeKvEvent cleared;
  cleared.kind = FakeKvEvent::Kind::kCleared;
  return {stored, removed, cleared};
}

void expectSample(const KvEventBatch& b, bool bytes) {
  ASSERT_EQ(b.events.size(), 3u);
  const KvEvent& s = b.events[0];
  EXPECT_EQ(s.kind, KvEventKind::kBlockStored);
  ASSERT_EQ(s.stored.engine_hashes.size(), 2u);
  EXPECT_TRUE(s.stored.has_parent);
  EXPECT_EQ(s.stored.token_ids.size(), 32u);
  EXPECT_EQ(s.stored.block_size, 16u);
  EXPECT_EQ(s.medium, "GPU");
  if (!bytes) {
    EXPECT_EQ(s.stored.engine_hashes[0], 11u);
    EXPECT_EQ(s.stored.engine_parent, 10u);
  }
  EXPECT_EQ(b.events[1].kind, KvEventKind::kBlockRemoved);
  ASSERT_EQ(b.events[1].removed.size(), 1u);
  // The same engine hash decodes to the same key in both events (bytes are reduced alike).
  EXPECT_EQ(b.events[1].removed[0], s.stored.engine_hashes[1]);
  EXPECT_EQ(b.events[2].kind, KvEventKind::kAllBlocksCleared);
  EXPECT_DOUBLE_EQ(b.ts, 2.5);
}

TEST(KvEventCodecTest, DecodesArrayAndMapEncodingsWithIntAndBytesHashes) {
  for (bool maps : {false, true}) {
    for (bool bytes : {false, true}) {
      fakes::EncodeOptions o;
      o.map_events = maps;
      o.bytes_hashes = bytes;
      auto batch = decodeKvEventBatch(fakes::encodeBatch(sampleEvents(), o, 2.5));
      ASSERT_TRUE(batch.ok()) << batch.status() << " maps=" << maps << " bytes=" << bytes;
      expectSample(*batch, bytes);
    }
  }
}

TEST(KvEventCodecTest, RejectsMalformedAndOversizedInput) {
  std::string good = fakes::encodeBatch(sampleEvents(), {}, 1.0);
  // Every truncation is rejected, never read past the end.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(decodeKvEventBatch(std::string_view(good).substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(decodeKvEventBatch(good + "x").ok());  // trailing bytes
  KvEventLimits tight;
  tight.max_tokens = 16;
  auto limited = decodeKvEventBatch(good, tight);
  ASSERT_FALSE(limited.ok());
  EXPECT_NE(std::string(limited.status().message()).find("token_ids"), std::string::npos);
  // An unknown tag (a newer engine's event) is skipped and counted; the batch stays.
  FakeKvEvent e;
  std::string bad = fakes::encodeBatch({e, e}, {}, 1.0);
  auto pos = bad.find("BlockStored");
  bad.replace(pos, 11, "BlockFrozen");
  auto unknown = decodeKvEventBatch(bad);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(unknown->skipped_events, 1u);
  ASSERT_EQ(unknown->events.size(), 1u);
  EXPECT_EQ(unknown->events[0].kind, KvEventKind::kBlockStored);
}

TEST(KvEventCodecTest, RandomMutationsNeverCrash) {
  // Byte flips of valid batches in both encodings: each decode either fails cleanly or yields
  // events within the limits (run under ASan/UBSan in the sanitizer build).
  std::mt19937 rng(7);
  for (bool maps : {false, true}) {
    fakes::EncodeOptions o;
    o.map_events = maps;
    o.bytes_hashes = maps;
    std::string good = fakes::encodeBatch(sampleEvents(), o, 1.0);
    for (int trial = 0; trial < 20000; ++trial) {
      std::string bad = good;
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
      auto batch = decodeKvEventBatch(bad);
      if (batch.ok()) {
        EXPECT_LE(batch->events.size(), KvEventLimits{}.max_events);
      }
    }
  }
}

TEST(KvEventCodecTest, SeqFrames) {
  EXPECT_EQ(encodeSeq(0x0102030405060708ULL), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_EQ(decodeSeq(encodeSeq(42)), 42u);
  EXPECT_EQ(decodeSeq("short"), std::nullopt);
}

}  // namespace
}  // namespace kvf::router
