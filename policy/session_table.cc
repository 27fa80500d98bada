#include "policy/session_table.h"

#include <algorithm>
#include <vector>

namespace kvf::policy {

std::optional<int> SessionTable::get(std::string_view session, Nanos now) const {
  if (session.empty()) return std::nullopt;
  auto it = sessions_.find(std::string(session));
  if (it == sessions_.end() || now - it->second.last_used > ttl_) return std::nullopt;
  return it->second.instance;
}

void SessionTable::put(std::string_view session, int instance, Nanos now) {
  if (session.empty() || max_sessions_ == 0) return;
  auto it = sessions_.find(std::string(session));
  if (it != sessions_.end()) {
    it->second = Entry{instance, now};
    return;
  }
  if (sessions_.size() >= max_sessions_) evict(now);
  sessions_.emplace(std::string(session), Entry{instance, now});
}

void SessionTable::forgetInstance(int instance) {
  absl::erase_if(sessions_, [&](const auto& kv) { return kv.second.instance == instance; });
}

void SessionTable::evict(Nanos now) {
  absl::erase_if(sessions_, [&](const auto& kv) { return now - kv.second.last_used > ttl_; });
  if (sessions_.size() < max_sessions_) return;
  std::vector<Nanos> times;
  times.reserve(sessions_.size());
  for (const auto& [name, entry] : sessions_) times.push_back(entry.last_used);
  size_t cut = std::max<size_t>(1, times.size() / 10);
  std::nth_element(times.begin(), times.begin() + static_cast<ptrdiff_t>(cut - 1), times.end());
  Nanos threshold = times[cut - 1];
  // Ties at the threshold may evict a few more than a tenth; never fewer than one.
  absl::erase_if(sessions_, [&](const auto& kv) { return kv.second.last_used <= threshold; });
}

}  // namespace kvf::policy
