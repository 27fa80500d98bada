// vLLM KV events: our encoder and decoder round-trip every field in both layouts, and the decoder
// reads what an independent encoder following vLLM's structs writes (vllm_kv_events.py), which
// our encoder reproduces byte for byte where the hashes are integers.
#include "protocol/kv_events.h"

#include <gtest/gtest.h>
#include <msgpuck.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>

namespace kvf::protocol {
namespace {

EngineBlockHash H(uint64_t v) { return EngineBlockHash(v); }

std::string fromHex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

// The msgpack bytes of the tuple ("img-7", "salt").
std::string imageKey() {
  char buf[32];
  char* p = mp_encode_array(buf, 2);
  p = mp_encode_str(p, "img-7", 5);
  p = mp_encode_str(p, "salt", 4);
  return std::string(buf, p);
}

// What full_events() of vllm_kv_events.py holds, with integer hashes 21, 22 (parent 20).
KvEventBatch fullBatch() {
  BlockStored s;
  s.block_hashes = {H(21), H(22)};
  s.parent_block_hash = H(20);
  for (TokenId t = 100; t < 116; ++t) s.token_ids.push_back(t);
  s.token_ids.insert(s.token_ids.end(), 15, 200000);
  s.token_ids.push_back(4294967295u);
  s.block_size = 16;
  s.medium = "GPU";
  s.lora_name = "adapter-1";
  s.extra_keys = std::vector<std::optional<std::string>>{imageKey(), std::nullopt};
  s.group_idx = 1;
  s.kv_cache_spec_kind = "sliding_window";
  s.kv_cache_spec_sliding_window = 4096;
  BlockRemoved r;
  r.block_hashes = {H(22)};
  r.medium = "CPU";
  r.group_idx = 1;
  KvEventBatch b;
  b.ts = 1700000000.25;
  b.events = {s, r, AllBlocksCleared{}};
  b.data_parallel_rank = 2;
  return b;
}

// minimal_events(): the fields every event carries.
KvEventBatch minimalBatch() {
  BlockStored s;
  s.block_hashes = {H(11), H(12)};
  s.token_ids.assign(32, 5);
  s.block_size = 16;
  BlockRemoved r;
  r.block_hashes = {H(12)};
  KvEventBatch b;
  b.ts = 2.5;
  b.events = {s, r, AllBlocksCleared{}};
  return b;
}

std::map<std::string, std::string> vllmFixtures() {
  std::string source = std::getenv("KVF_SOURCE_DIR") ? std::getenv("KVF_SOURCE_DIR")
                                                     : std::filesystem::current_path().string();
  std::string cmd = "/usr/bin/python3 " + source + "/tests/protocol/vllm_kv_events.py";
  std::map<std::string, std::string> out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[65536];
  while (fgets(line, sizeof(line), pipe) != nullptr) {
    std::string_view l(line);
    size_t space = l.find(' ');
    if (space == std::string_view::npos) continue;
    std::string_view hex = l.substr(space + 1);
    while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r')) hex.remove_suffix(1);
    out[std::string(l.substr(0, space))] = fromHex(hex);
  }
  pclose(pipe);
  return out;
}

TEST(KvEventsTest, RoundTripsEveryFieldInBothLayouts) {
  for (KvEventLayout layout : {KvEventLayout::kArray, KvEventLayout::kMap}) {
    for (const KvEventBatch& batch : {fullBatch(), minimalBatch()}) {
      auto back = decodeEventBatch(encodeEventBatch(batch, layout));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, batch) << "layout " << static_cast<int>(layout);
    }
  }
  // A field set after unset ones in the array layout: the unset ones are written as nil.
  KvEventBatch sparse;
  BlockStored s;
  s.block_hashes = {H(1)};
  s.token_ids.assign(4, 1);
  s.block_size = 4;
  s.medium.reset();
  s.kv_cache_spec_sliding_window = 128;
  sparse.events = {s};
  auto back = decodeEventBatch(encodeEventBatch(sparse));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, sparse);
}

TEST(KvEventsTest, DecodesVllmLayoutsAndEncodesThemByteForByte) {
  auto fixtures = vllmFixtures();
  ASSERT_EQ(fixtures.size(), 5u) << "tests/protocol/vllm_kv_events.py did not run";
  struct Case {
    const char* name;
    KvEventBatch want;
    std::optional<KvEventLayout> same_bytes;  // our encoder writes exactly these bytes
  };
  std::vector<Case> cases = {{"map_int_full", fullBatch(), KvEventLayout::kMap},
                             {"array_int_full", fullBatch(), KvEventLayout::kArray},
                             {"map_int_minimal", minimalBatch(), KvEventLayout::kMap},
                             {"array_int_legacy", minimalBatch(), KvEventLayout::kArray}};
  for (const Case& c : cases) {
    auto batch = decodeEventBatch(fixtures[c.name]);
    ASSERT_TRUE(batch.ok()) << c.name << ": " << batch.status();
    EXPECT_EQ(*batch, c.want) << c.name;
    if (c.same_bytes) {
      EXPECT_EQ(encodeEventBatch(c.want, *c.same_bytes), fixtures[c.name]) << c.name;
    }
  }
  // sha256 hashes (bytes) reduce to the same 64 bits wherever they appear.
  auto bytes = decodeEventBatch(fixtures["map_bytes_full"]);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const auto& stored = std::get<BlockStored>(bytes->events[0]);
  const auto& removed = std::get<BlockRemoved>(bytes->events[1]);
  EXPECT_EQ(stored.block_hashes[0], engineHashFromBytes(std::string(32, '\x01')));
  EXPECT_EQ(stored.block_hashes[1], engineHashFromBytes(std::string(32, '\x02')));
  EXPECT_EQ(stored.parent_block_hash, engineHashFromBytes(std::string(32, '\x03')));
  EXPECT_EQ(removed.block_hashes[0], stored.block_hashes[1]);
  EXPECT_EQ(stored.lora_name, "adapter-1");
  EXPECT_EQ(bytes->data_parallel_rank, 2);
}

TEST(KvEventsTest, RejectsMalformedOversizedAndOutOfRangeInput) {
  std::string good = encodeEventBatch(fullBatch(), KvEventLayout::kMap);
  for (size_t n = 0; n < good.size(); n += 7) {
    EXPECT_FALSE(decodeEventBatch(std::string_view(good).substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(decodeEventBatch(good + "x").ok());  // trailing bytes
  KvEventLimits tight;
  tight.max_tokens = 8;
  auto limited = decodeEventBatch(good, tight);
  ASSERT_FALSE(limited.ok());
  EXPECT_NE(std::string(limited.status().message()).find("token_ids"), std::string::npos);
  tight = {};
  tight.max_extra_key_bytes = 4;
  EXPECT_FALSE(decodeEventBatch(good, tight).ok());
  // A token id wider than 32 bits is refused with the field and its value.
  char buf[256];
  char* p = mp_encode_array(buf, 2);
  p = mp_encode_double(p, 1.0);
  p = mp_encode_array(p, 1);
  p = mp_encode_array(p, 5);
  p = mp_encode_str(p, "BlockStored", 11);
  p = mp_encode_array(p, 1);
  p = mp_encode_uint(p, 1);
  p = mp_encode_nil(p);
  p = mp_encode_array(p, 1);
  p = mp_encode_uint(p, uint64_t{1} << 32);
  p = mp_encode_uint(p, 1);
  auto wide = decodeEventBatch(std::string(buf, p));
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(std::string(wide.status().message()).find("token_ids[0]"), std::string::npos)
      << wide.status();
}

// An array or map header announcing 2^31 entries or more wrapped msgpuck's own well-formedness
// check (an int count), so 5 bytes passed as a whole batch and decoding read past them (found by
// the kv_event fuzz target; ASan: heap-buffer-overflow).
TEST(KvEventsTest, HugeAnnouncedCountsAreRejectedNotRead) {
  const std::string headers[] = {
      std::string("\xdf\x6d\x6f\x7e\x04", 5),                           // map32, 1.8e9 pairs
      std::string("\xdd\x80\x00\x00\x00", 5),                           // array32, 2^31 items
      std::string("\x92\xcb\0\0\0\0\0\0\0\0\xdd\xff\xff\xff\xff", 15),  // [0.0, array32 of 2^32-1]
      std::string("\xdc\x00\x05\x01", 4),                               // array16 of 5 with 1 item
  };
  for (const std::string& payload : headers) {
    auto decoded = decodeEventBatch(payload);
    EXPECT_FALSE(decoded.ok()) << payload.size();
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(KvEventsTest, RandomMutationsNeverCrash) {
  std::string good = encodeEventBatch(fullBatch(), KvEventLayout::kMap);
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string bad = good;
    for (int k = 0; k < 3; ++k) bad[rng() % bad.size()] = static_cast<char>(rng());
    auto batch = decodeEventBatch(bad);
    if (batch.ok()) {
      EXPECT_LE(batch->events.size(), KvEventLimits{}.max_events);
    }
  }
}

TEST(KvEventsTest, SeqFramesAreEightByteBigEndian) {
  EXPECT_EQ(encodeSeq(0x0102030405060708ULL), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_EQ(decodeSeq(encodeSeq(42)), 42u);
  EXPECT_EQ(decodeSeq("short"), std::nullopt);
  EXPECT_EQ(encodeSeq(kReplayEndSeq), std::string(8, '\xff'));
}

}  // namespace
}  // namespace kvf::protocol
