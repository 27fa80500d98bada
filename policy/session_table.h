// Bounded, expiring session -> instance memory used by session-aware policies (linear pins,
// hybrid hysteresis). Deterministic: expiry and eviction depend only on the times passed in.
// Single-threaded, owned by one policy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"

namespace kvf::policy {

class SessionTable {
 public:
  SessionTable(Nanos ttl, size_t max_sessions) : ttl_(ttl), max_sessions_(max_sessions) {}

  // The instance remembered for `session` if it was used within the TTL.
  std::optional<int> get(std::string_view session, Nanos now) const;
  // Remembers (or refreshes) `session` -> `instance`. Over capacity, expired entries go first,
  // then the least recently used tenth.
  void put(std::string_view session, int instance, Nanos now);
  // Forgets every session pinned to `instance` (removed from the cluster).
  void forgetInstance(int instance);
  size_t size() const { return sessions_.size(); }

 private:
  struct Entry {
    int instance;
    Nanos last_used;
  };
  void evict(Nanos now);

  Nanos ttl_;
  size_t max_sessions_;
  absl::flat_hash_map<std::string, Entry> sessions_;
};

}  // namespace kvf::policy
