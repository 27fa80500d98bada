// Fuzz target: YAML config loading (common/config.h) through the parsers that use it: the
// router's config, the engine's config (with its profile file) and an engine profile on its own.
// Input: byte 0 picks the parser, the rest is the YAML text. Property: every input yields a
// config or an error naming the problem, never a crash or an exception escaping.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/config.h"
#include "engine/engine_config.h"
#include "engine/timing_model.h"
#include "router/core/config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace fs = std::filesystem;

// The profile that engine configs in the corpus name (`profile: p.yaml`).
constexpr std::string_view kProfile = R"(name: fuzz
kv_cache_tokens: 65536
model:
  name: fuzz-model
  num_layers: 4
  hidden_size: 512
  num_attention_heads: 8
  num_kv_heads: 2
  head_dim: 64
  total_params: 1.0e8
  active_params: 1.0e8
  dtype_bytes: 2
  vocab_size: 32000
  max_model_len: 8192
gpu:
  name: fuzz-gpu
  peak_flops: 1.0e14
  hbm_bytes_per_s: 1.0e12
)";

// A private directory holding the profile; engine configs resolve relative paths against it.
const std::string& baseDir() {
  // Never destroyed, so the cleanup registered with atexit can still read it.
  static const std::string& dir = *new std::string([] {
    fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string pattern = (base / "kvf-config-fuzz-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    std::FILE* f = std::fopen((fs::path(pattern) / "p.yaml").c_str(), "wb");
    if (f == nullptr) std::abort();
    std::fwrite(kProfile.data(), 1, kProfile.size(), f);
    std::fclose(f);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(baseDir(), ec);
    });
    return pattern;
  }());
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto in = kvf::fuzz::splitInput(data, size);
  if (!in) return 0;
  std::string_view text = in->rest;
  switch (in->choice % 3) {
    case 0: {
      auto config = kvf::router::parseRouterConfig(text, "fuzz.yaml");
      KVF_FUZZ_CHECK(config.ok() || !config.status().message().empty(), "error without a message");
      break;
    }
    case 1: {
      // The engine reads the profile file its config names: keep it away from devices and
      // FIFOs (reading one would block, which is not a finding).
      for (std::string_view special : {"/dev", "/proc", "/sys", "/run", "/tmp", "/var"}) {
        if (text.find(special) != std::string_view::npos) return 0;
      }
      auto config = kvf::engine::parseEngineConfig(text, "fuzz.yaml", baseDir());
      KVF_FUZZ_CHECK(config.ok() || !config.status().message().empty(), "error without a message");
      break;
    }
    default: {
      auto profile = kvf::config::parseText<kvf::engine::Profile>(text, "fuzz.yaml",
                                                                  kvf::engine::parseProfile);
      KVF_FUZZ_CHECK(profile.ok() || !profile.status().message().empty(),
                     "error without a message");
      break;
    }
  }
  return 0;
}
