// Helpers for the KV-tier tests: block payloads that are a function of the key (checked byte for
// byte after a round trip), a listener that records what the tiers reported, and a small file
// system of its own (a tmpfs or ramfs mount, when the test may mount). Single test thread unless
// noted.
#pragma once

#include <sys/mount.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"
#include "worker/block_payload.h"
#include "worker/tiers/tier_types.h"

namespace kvf::worker::testing {

using namespace std::chrono_literals;

// A block's bytes: the worker's deterministic payload of `key`.
inline std::vector<std::byte> payloadOf(BlockKey key, size_t bytes) {
  std::vector<std::byte> out(bytes);
  fillBlockPayload(BlockHash{key}, out);
  return out;
}

inline bool holdsPayloadOf(BlockKey key, std::span<const std::byte> bytes) {
  return verifyBlockPayload(BlockHash{key}, bytes);
}

// Records listener calls; thread-safe.
class RecordingListener final : public TierListener {
 public:
  void onStored(TierId tier, std::span<const BlockKey> keys) override {
    std::lock_guard lock(mu_);
    for (BlockKey k : keys) stored_[static_cast<size_t>(tier)].push_back(k);
  }
  void onRemoved(TierId tier, std::span<const BlockKey> keys) override {
    std::lock_guard lock(mu_);
    for (BlockKey k : keys) removed_[static_cast<size_t>(tier)].push_back(k);
  }
  void onCleared(TierId tier) override {
    std::lock_guard lock(mu_);
    ++cleared_[static_cast<size_t>(tier)];
  }
  std::vector<BlockKey> stored(TierId t) const {
    std::lock_guard lock(mu_);
    return stored_[static_cast<size_t>(t)];
  }
  std::vector<BlockKey> removed(TierId t) const {
    std::lock_guard lock(mu_);
    return removed_[static_cast<size_t>(t)];
  }
  int cleared(TierId t) const {
    std::lock_guard lock(mu_);
    return cleared_[static_cast<size_t>(t)];
  }

 private:
  mutable std::mutex mu_;
  std::vector<BlockKey> stored_[kTierCount];
  std::vector<BlockKey> removed_[kTierCount];
  int cleared_[kTierCount] = {};
};

// A file system of `type` ("tmpfs", "ramfs") mounted on a fresh folder for the test's life.
// mounted() is false where the process may not mount (the test then skips).
class ScratchMount {
 public:
  ScratchMount(const std::string& name, const char* type, const std::string& options)
      : dir_(kvf::testing::freshTempDir(name)) {
    mounted_ = ::mount(type, dir_.c_str(), type, 0, options.c_str()) == 0;
  }
  ~ScratchMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
  bool mounted_ = false;
};

// Polls `done` until it holds or `timeout` passes.
template <class F>
bool eventually(F done, std::chrono::milliseconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace kvf::worker::testing
