// Every KV-event fixture in tests/fixtures/vllm/kv_events (payloads written by an encoder we did
// not write, from vLLM's struct declarations per format generation) decodes to what its .json
// sidecar says it means. The fixture list is read from the folder, so a new fixture is covered
// without touching this test.
#include <gtest/gtest.h>
#include <msgpuck.h>

#include <boost/json.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "protocol/kv_events.h"

namespace kvf::protocol {
namespace {

namespace bj = boost::json;
namespace fs = std::filesystem;

fs::path fixtureDir() {
  const char* source = std::getenv("KVF_SOURCE_DIR");
  return fs::path(source != nullptr ? source : ".") / "tests/fixtures/vllm/kv_events";
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fromHex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

// {"int": "<decimal>"} (signed or unsigned) or {"bytes": "<hex>"}, as the engine hash we read.
EngineBlockHash sidecarHash(const bj::value& v) {
  const bj::object& o = v.as_object();
  if (const bj::value* i = o.if_contains("int")) {
    std::string s(i->as_string());
    return EngineBlockHash(s.starts_with('-') ? static_cast<uint64_t>(std::stoll(s))
                                              : std::stoull(s));
  }
  return engineHashFromBytes(fromHex(o.at("bytes").as_string()));
}

// A typed sidecar value ({"str"}, {"int"}, {"bytes"}, {"tuple": [...]}) as msgpack, written
// here from the JSON (not from the payload), so equal digests mean equal structure.
void encodeTyped(const bj::value& v, std::string* out) {
  char buf[32];
  const bj::object& o = v.as_object();
  if (const bj::value* s = o.if_contains("str")) {
    std::string_view text = s->as_string();
    out->append(buf, mp_encode_strl(buf, static_cast<uint32_t>(text.size())));
    out->append(text);
  } else if (const bj::value* b = o.if_contains("bytes")) {
    std::string bytes = fromHex(b->as_string());
    out->append(buf, mp_encode_binl(buf, static_cast<uint32_t>(bytes.size())));
    out->append(bytes);
  } else if (const bj::value* i = o.if_contains("int")) {
    int64_t n = std::stoll(std::string(i->as_string()));
    out->append(buf,
                n >= 0 ? mp_encode_uint(buf, static_cast<uint64_t>(n)) : mp_encode_int(buf, n));
  } else {
    const bj::array& items = o.at("tuple").as_array();
    out->append(buf, mp_encode_array(buf, static_cast<uint32_t>(items.size())));
    for (const bj::value& item : items) encodeTyped(item, out);
  }
}

uint64_t sidecarExtraKeyDigest(const bj::value& entry) {
  if (entry.is_null()) return 0;
  std::string packed;
  char buf[8];
  packed.append(buf, mp_encode_array(buf, static_cast<uint32_t>(entry.as_array().size())));
  for (const bj::value& item : entry.as_array()) encodeTyped(item, &packed);
  return extraKeysDigest(packed);
}

template <class T>
std::optional<T> optional(const bj::object& o, std::string_view key) {
  const bj::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(v->as_string());
  } else {
    return static_cast<T>(v->as_int64());
  }
}

std::vector<EngineBlockHash> sidecarHashes(const bj::object& o) {
  std::vector<EngineBlockHash> out;
  for (const bj::value& h : o.at("block_hashes").as_array()) out.push_back(sidecarHash(h));
  return out;
}

void expectStored(const BlockStored& got, const bj::object& want, const std::string& where) {
  EXPECT_EQ(got.block_hashes, sidecarHashes(want)) << where;
  const bj::value& parent = want.at("parent_block_hash");
  EXPECT_EQ(got.parent_block_hash,
            parent.is_null() ? std::nullopt : std::optional(sidecarHash(parent)))
      << where;
  std::vector<TokenId> tokens;
  for (const bj::value& t : want.at("token_ids").as_array()) {
    tokens.push_back(static_cast<TokenId>(t.as_int64()));
  }
  EXPECT_EQ(got.token_ids, tokens) << where;
  EXPECT_EQ(got.block_size, want.at("block_size").as_int64()) << where;
  EXPECT_EQ(got.lora_id, optional<int64_t>(want, "lora_id")) << where;
  EXPECT_EQ(got.medium, optional<std::string>(want, "medium")) << where;
  EXPECT_EQ(got.lora_name, optional<std::string>(want, "lora_name")) << where;
  EXPECT_EQ(got.group_idx, optional<int64_t>(want, "group_idx")) << where;
  EXPECT_EQ(got.kv_cache_spec_kind, optional<std::string>(want, "kv_cache_spec_kind")) << where;
  EXPECT_EQ(got.kv_cache_spec_sliding_window,
            optional<int64_t>(want, "kv_cache_spec_sliding_window"))
      << where;
  EXPECT_EQ(got.locality, optional<std::string>(want, "locality")) << where;
  const bj::value& keys = want.at("extra_keys");
  ASSERT_EQ(got.extra_keys.has_value(), !keys.is_null()) << where;
  if (keys.is_null()) return;
  ASSERT_EQ(got.extra_keys->size(), keys.as_array().size()) << where;
  for (size_t i = 0; i < got.extra_keys->size(); ++i) {
    const auto& entry = (*got.extra_keys)[i];
    uint64_t digest = entry ? extraKeysDigest(*entry) : 0;
    EXPECT_EQ(digest, sidecarExtraKeyDigest(keys.as_array()[i])) << where << " extra_keys[" << i;
    if (entry) {
      EXPECT_NE(digest, 0u) << where;
    }
  }
}

void expectEvent(const KvEvent& got, const bj::object& want, const std::string& where) {
  std::string_view type = want.at("type").as_string();
  if (type == "BlockStored") {
    ASSERT_TRUE(std::holds_alternative<BlockStored>(got)) << where;
    expectStored(std::get<BlockStored>(got), want, where);
  } else if (type == "BlockRemoved") {
    ASSERT_TRUE(std::holds_alternative<BlockRemoved>(got)) << where;
    const auto& removed = std::get<BlockRemoved>(got);
    EXPECT_EQ(removed.block_hashes, sidecarHashes(want)) << where;
    EXPECT_EQ(removed.medium, optional<std::string>(want, "medium")) << where;
    EXPECT_EQ(removed.group_idx, optional<int64_t>(want, "group_idx")) << where;
    EXPECT_EQ(removed.locality, optional<std::string>(want, "locality")) << where;
  } else {
    EXPECT_EQ(type, "AllBlocksCleared") << where;
    EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(got)) << where;
  }
}

TEST(VllmFixturesTest, EveryFixtureDecodesToItsSidecar) {
  std::vector<fs::path> payloads;
  for (const auto& entry : fs::directory_iterator(fixtureDir())) {
    if (entry.path().extension() == ".bin") payloads.push_back(entry.path());
  }
  std::sort(payloads.begin(), payloads.end());
  ASSERT_GE(payloads.size(), 18u) << "fixtures missing under " << fixtureDir();
  for (const fs::path& bin : payloads) {
    std::string name = bin.stem().string();
    SCOPED_TRACE(name);
    fs::path sidecar = bin;
    sidecar.replace_extension(".json");
    auto meaning = bj::parse(readFile(sidecar)).as_object();
    auto batch = decodeEventBatch(readFile(bin));
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_DOUBLE_EQ(batch->ts, meaning.at("ts").to_number<double>());
    EXPECT_EQ(batch->data_parallel_rank, optional<int64_t>(meaning, "data_parallel_rank"));
    const bj::array& events = meaning.at("events").as_array();
    ASSERT_EQ(batch->events.size(), events.size());
    for (size_t i = 0; i < events.size(); ++i) {
      expectEvent(batch->events[i], events[i].as_object(), name + " event " + std::to_string(i));
    }
    EXPECT_EQ(batch->skipped_events, meaning.at("skipped_events").as_array().size());
    EXPECT_EQ(batch->ignored_fields, meaning.at("ignored_fields").as_array().size());
    // What was decoded survives our encoder in both layouts (locality included).
    for (KvEventLayout layout : {KvEventLayout::kArray, KvEventLayout::kMap}) {
      auto again = decodeEventBatch(encodeEventBatch(*batch, layout));
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(*again, *batch) << "layout " << static_cast<int>(layout);
    }
  }
}

// One batch can make the decoder allocate at most its per-batch budgets: many events each under
// the per-event bound no longer add up to a huge batch (a 63 MiB BlockRemoved batch once
// peaked a router at 591 MB).
TEST(VllmFixturesTest, BatchBudgetBoundsManyEventsUnderTheEventLimit) {
  KvEventBatch batch;
  for (int e = 0; e < 3; ++e) {
    BlockRemoved removed;
    for (uint64_t i = 0; i < 400'000; ++i) removed.block_hashes.emplace_back(~i);
    batch.events.push_back(std::move(removed));
  }
  std::string payload = encodeEventBatch(batch);
  KvEventLimits limits;
  ASSERT_LT(400'000u, limits.max_hashes);  // each event alone is within bounds
  auto decoded = decodeEventBatch(payload, limits);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(std::string(decoded.status().message()).find("in one batch"), std::string::npos)
      << decoded.status();
}

// The request side builds the tuple vLLM hashes for a block; its digest equals the digest of the
// entry an engine published for the same block (g5_v0.19.0_mm_offsets: an image at token 5 of
// block 0 covering into block 1, salt "tenant-a" on block 0).
TEST(VllmFixturesTest, RequestExtraKeysMatchPublishedOnes) {
  auto batch = decodeEventBatch(readFile(fixtureDir() / "g5_v0.19.0_mm_offsets.bin"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  const auto& stored = std::get<BlockStored>(batch->events[0]);
  ASSERT_TRUE(stored.extra_keys.has_value());
  ExtraKeyInputs inputs;
  inputs.cache_salt = "tenant-a";
  inputs.mm_items.push_back(
      {"49f5b7d5b90c6176bbe4434dc46f03e8e644cb1af64da9eeddc96b3ae9a8c0bf", 5, 16});
  for (int64_t block = 0; block < 3; ++block) {
    std::optional<std::string> mine = encodeExtraKeys(inputs, block * 16, 16);
    const auto& theirs = (*stored.extra_keys)[static_cast<size_t>(block)];
    ASSERT_EQ(mine.has_value(), theirs.has_value()) << block;
    if (mine) {
      EXPECT_EQ(extraKeysDigest(*mine), extraKeysDigest(*theirs)) << block;
    }
  }
  // A LoRA adapter's name alone, as g4 events give it, is the tuple g5 engines publish.
  ExtraKeyInputs lora;
  lora.lora_name = "sql-lora";
  EXPECT_EQ(extraKeysDigest(*encodeExtraKeys(lora, 32, 16)),
            extraKeysDigest(encodeLoraOnlyExtraKeys("sql-lora")));
  EXPECT_NE(extraKeysDigest(encodeLoraOnlyExtraKeys("sql-lora")),
            extraKeysDigest(encodeLoraOnlyExtraKeys("chat-lora")));
}

}  // namespace
}  // namespace kvf::protocol
