// Shared helpers of the engine-core tests: a config on the default profile, deterministic
// prompts and request specs. Header-only; used by one test binary.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine_config.h"
#include "engine/kv_pool.h"
#include "engine/request.h"

namespace kvf::engine::testing {

inline EngineConfig makeConfig(int block_size, int64_t blocks, int64_t budget, int max_seqs = 256) {
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  EXPECT_TRUE(profile.ok()) << profile.status();
  EngineConfig c;
  c.profile = *profile;
  c.cache.block_size = block_size;
  c.cache.num_gpu_blocks = blocks;
  c.scheduler.max_num_batched_tokens = budget;
  c.scheduler.max_num_seqs = max_seqs;
  EXPECT_TRUE(finalizeEngineConfig(&c).ok());
  return c;
}

// Engine block hashes from literal values.
inline std::vector<BlockHash> hashList(std::initializer_list<uint64_t> values) {
  return std::vector<BlockHash>(values.begin(), values.end());
}

inline std::vector<TokenId> promptOf(int n, int salt) {
  std::vector<TokenId> p;
  for (int i = 0; i < n; ++i) p.push_back(1000 + (i * 7 + salt * 131) % 5000);
  return p;
}

inline RequestSpec spec(std::string id, std::vector<TokenId> prompt, int64_t max_tokens) {
  RequestSpec s;
  s.id = std::move(id);
  s.prompt = std::move(prompt);
  s.sampling.max_tokens = max_tokens;
  s.sampling.ignore_eos = true;
  return s;
}

}  // namespace kvf::engine::testing
