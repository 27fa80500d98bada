#include <gtest/gtest.h>

#include <filesystem>

#include "engine/engine_config.h"
#include "engine/tokenizer.h"

namespace kvf::engine {
namespace {

TEST(EngineConfigTest, ShippedConfigLoadsWithProfileRelativeToTheFile) {
  auto c = loadEngineConfig("engine/configs/engine.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->profile.name, "qwen3-coder-30b-a3b-h20");
  EXPECT_EQ(c->cache.num_gpu_blocks, 281888 / 16);
  EXPECT_EQ(c->served_model_name, "qwen3-coder-30b-a3b");
  EXPECT_EQ(c->scheduler.eos_token_id, 151645);
  EXPECT_EQ(c->scheduler.vocab_size, 151936);
  EXPECT_EQ(c->kv_events.topic, "");  // vLLM's default
  EXPECT_EQ(c->io_thread_nice, 5);
}

TEST(EngineConfigTest, ErrorsNameEveryFieldAndLine) {
  std::string text =
      "profile: ../profiles/llama-3.1-8b-h100.yaml\n"
      "port: 70000\n"
      "io_thread_nice: 20\n"
      "cache:\n  block_size: 0\n  colour: red\n"
      "scheduler: {max_num_seqs: -1}\n";
  auto c = parseEngineConfig(text, "test.yaml", "engine/configs");
  ASSERT_FALSE(c.ok());
  std::string msg(c.status().message());
  for (const char* field :
       {"port", "io_thread_nice", "cache.block_size", "cache.colour", "scheduler.max_num_seqs"}) {
    EXPECT_NE(msg.find(field), std::string::npos) << field << " in " << msg;
  }
  EXPECT_NE(msg.find("test.yaml:2"), std::string::npos) << msg;
}

TEST(EngineConfigTest, OnboardModeIsWholeUnlessLayerwiseIsAsked) {
  const std::string base = "profile: ../profiles/qwen3-coder-30b-a3b-h20.yaml\n";
  auto plain = parseEngineConfig(base, "test.yaml", "engine/configs");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->scheduler.onboard, OnboardMode::kWhole);  // vLLM's OffloadingConnector
  auto layer =
      parseEngineConfig(base + "scheduler: {onboard: layerwise}\n", "test.yaml", "engine/configs");
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(layer->scheduler.onboard, OnboardMode::kLayerwise);
  auto bad =
      parseEngineConfig(base + "scheduler:\n  onboard: per-layer\n", "test.yaml", "engine/configs");
  ASSERT_FALSE(bad.ok());
  std::string msg(bad.status().message());
  EXPECT_NE(msg.find("scheduler.onboard"), std::string::npos) << msg;
  EXPECT_NE(msg.find("whole or layerwise"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test.yaml:3"), std::string::npos) << msg;
}

TEST(EngineConfigTest, PayloadMemoryIsHostUnlessDeviceIsAsked) {
  const std::string base = "profile: ../profiles/qwen3-coder-30b-a3b-h20.yaml\n";
  auto plain = parseEngineConfig(base, "t.yaml", "engine/configs");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->cache.payload_memory, PayloadLocation::kHost);
  auto device =
      parseEngineConfig(base + "cache: {payload_memory: device}\n", "t.yaml", "engine/configs");
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(device->cache.payload_memory, PayloadLocation::kDevice);
  auto bad =
      parseEngineConfig(base + "cache:\n  payload_memory: gpu\n", "t.yaml", "engine/configs");
  ASSERT_FALSE(bad.ok());
  std::string msg(bad.status().message());
  EXPECT_NE(msg.find("cache.payload_memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("host or device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("t.yaml:3"), std::string::npos) << msg;
  // KV push reads and writes the pool's region from the host: refused with a device pool, in
  // the file and once flags have set a worker port.
  auto push = parseEngineConfig(base + "cache: {payload_memory: device}\nworker: {port: 9000}\n",
                                "t.yaml", "engine/configs");
  ASSERT_FALSE(push.ok());
  EXPECT_NE(push.status().message().find("KV push"), std::string::npos) << push.status();
  device->worker.port = 9000;
  EXPECT_EQ(checkPayloadMemory(*device).code(), absl::StatusCode::kInvalidArgument);
  auto empty =
      parseEngineConfig(base + "cache: {payload_memory: device, payload_bytes_per_block: 0}\n",
                        "t.yaml", "engine/configs");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("payload_bytes_per_block"), std::string::npos);
}

TEST(EngineConfigTest, MembershipInEtcd) {
  std::string base = "profile: ../profiles/llama-3.1-8b-h100.yaml\n";
  auto none = parseEngineConfig(base, "t.yaml", "engine/configs");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->membership.enabled);

  auto c = parseEngineConfig(base +
                                 "membership:\n  advertise_host: 10.0.0.5\n"
                                 "  etcd: {endpoints: [\"http://127.0.0.1:2379\"], lease_ttl_s: 5,"
                                 " prefix: /fleet/a/}\n",
                             "t.yaml", "engine/configs");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->membership.enabled);
  EXPECT_EQ(c->membership.advertise_host, "10.0.0.5");
  EXPECT_EQ(c->membership.etcd.lease_ttl_s, 5);
  EXPECT_EQ(c->membership.etcd.prefix, "/fleet/a/");

  auto bad = parseEngineConfig(base +
                                   "membership:\n  etcd: {endpoints: [], lease_ttl_s: 1,"
                                   " probe_interval_s: 1}\n",
                               "t.yaml", "engine/configs");
  ASSERT_FALSE(bad.ok());
  std::string message(bad.status().message());
  EXPECT_NE(message.find("membership.etcd.endpoints"), std::string::npos) << message;
  EXPECT_NE(message.find("membership.etcd.lease_ttl_s"), std::string::npos) << message;
  // A watcher's key, not a registrant's.
  EXPECT_NE(message.find("membership.etcd.probe_interval_s"), std::string::npos) << message;
  EXPECT_FALSE(parseEngineConfig(base + "membership: {}\n", "t.yaml", "engine/configs").ok());
}

TEST(EngineConfigTest, TiersAreOffByDefaultAndTakeThePoolsBlockBytes) {
  const std::string base = "profile: ../profiles/qwen3-coder-30b-a3b-h20.yaml\n";
  auto none = parseEngineConfig(base, "t.yaml", "engine/configs");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->tiers.has_value());
  EXPECT_GT(none->profile.pcie.bandwidth_gbps, 0);
  EXPECT_GT(none->profile.disk.read_gbps, 0);
  auto c = parseEngineConfig(base +
                                 "cache: {payload_bytes_per_block: 512}\n"
                                 "tiers:\n  host: {capacity_mib: 8}\n"
                                 "  disk: {dir: /tmp/kvf-tiers, capacity_mib: 64}\n",
                             "t.yaml", "engine/configs");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->tiers.has_value());
  EXPECT_EQ(c->tiers->host.block_bytes, 512u);
  EXPECT_TRUE(c->tiers->host.has_lower_tier);
  EXPECT_EQ(c->tiers->disk->block_bytes, 512u);
  auto bad = parseEngineConfig(base + "tiers: {host: {capacity_mib: 8, speed: 3}}\n", "t.yaml",
                               "engine/configs");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tiers.host.speed"), std::string::npos) << bad.status();
}

TEST(EngineConfigTest, MissingProfileIsReported) {
  auto c = parseEngineConfig("profile: nope.yaml\n", "t.yaml", "engine/configs");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("nope.yaml"), std::string::npos);
  auto d = parseEngineConfig("port: 1\n", "t.yaml", "");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(std::string(d.status().message()).find("profile"), std::string::npos);
}

TEST(TokenizerTest, DeterministicPiecesInVocabulary) {
  auto a = tokenize("def f(x):\n  return x + 1", 1000);
  auto b = tokenize("def f(x):\n  return x + 1", 1000);
  EXPECT_EQ(a, b);
  // "def", " f", "(", "x", ")", ":", "\n", " ", " return", " x", " ", "+", " 1"
  EXPECT_EQ(a.size(), 13u);
  for (auto t : a) {
    EXPECT_GE(t, kReservedTokenIds);
    EXPECT_LT(t, 1000);
  }
  EXPECT_NE(tokenize("x", 1000), tokenize(" x", 1000));
  EXPECT_TRUE(tokenize("", 1000).empty());
  EXPECT_EQ(applyChatTemplate({{"user", "hi"}}), "<|user|>\nhi\n<|assistant|>\n");
  EXPECT_NE(tokenText(5), tokenText(6));
  EXPECT_EQ(tokenText(5)[0], ' ');
}

}  // namespace
}  // namespace kvf::engine
