// Engine cores over the KV tiers for the tier tests: the live engine's (LiveTiers, real payload
// bytes) and the simulator's (AccountedTiers, block accounting), from a config with `tiers:`.
// Header-only; failures are reported as test failures and a null core.
#pragma once

#include <memory>
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

}  // namespace kvf::engine::testing
