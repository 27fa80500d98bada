// Engine cores over the KV tiers for the tier tests: the live engine's (LiveTiers, real payload
// bytes) and the simulator's (AccountedTiers, block accounting), from a config with `tiers:`.
// Header-only; failures are reported as test failures and a null core.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "engine/accounted_tiers.h"
#include "engine/engine_core.h"
#include "engine/live_tiers.h"

namespace kvf::engine::testing {

inline std::unique_ptr<EngineCore> liveCore(const EngineConfig& c, worker::KvEventSink* sink,
                                            LiveTiers** tiers_out = nullptr) {
  LiveTiersOptions o;
  o.store = *c.tiers;
  o.block_size = c.cache.block_size;
  auto tiers = LiveTiers::create(o);
  EXPECT_TRUE(tiers.ok()) << tiers.status();
  if (!tiers.ok()) return nullptr;
  if (tiers_out != nullptr) *tiers_out = tiers->get();
  auto core = EngineCore::create(c, sink, std::move(*tiers));
  EXPECT_TRUE(core.ok()) << core.status();
  return core.ok() ? std::move(*core) : nullptr;
}

inline std::unique_ptr<EngineCore> accountedCore(const EngineConfig& c) {
  auto core = EngineCore::create(c, nullptr, std::make_unique<AccountedTiers>(*c.tiers));
  EXPECT_TRUE(core.ok()) << core.status();
  return core.ok() ? std::move(*core) : nullptr;
}

// Overwrites every byte of the disk tier's slab files in `dir` (headers and payloads alike).
inline void corruptSlabFiles(const std::filesystem::path& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".kvf") continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string junk(4096, '\xab');
    for (size_t off = 0; off < std::filesystem::file_size(entry.path()); off += junk.size()) {
      f.seekp(static_cast<std::streamoff>(off));
      f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    }
  }
}

}  // namespace kvf::engine::testing
