// Mirrors every key under a prefix in etcd and reports changes: lists the prefix at one
// revision, then watches from the next revision, so no change between the two is missed. It
// lists again (and reports only the difference) when the watch's start revision was compacted
// away, when etcd cancels the watch, and when etcd went back in time or changed cluster (a
// restored or replaced store). A broken watch resumes from the last revision seen. While etcd
// is unreachable the mirror keeps its last contents and up() is false; nothing is reported
// removed until etcd itself says so. A probe (a one-key range) every probe_interval tells
// whether etcd answers, because an idle watch carries no traffic.
// Owned by one component; every method and callback runs on the executor given to create().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <boost/asio/steady_timer.hpp>

#include "common/clock.h"
#include "common/http.h"
#include "common/log.h"
#include "membership/etcd_client.h"

namespace kvf::membership {

struct WatcherOptions {
  std::string prefix;
  std::chrono::milliseconds probe_interval{1000};
  std::chrono::milliseconds retry_min{100};  // backoff after a failed list or watch
  std::chrono::milliseconds retry_max{2000};
  // Silence after which a watch is reopened (etcd's progress notifications come every 10 min
  // by default, so a healthy idle watch is never cut by this).
  std::chrono::milliseconds watch_idle_timeout{std::chrono::minutes(15)};
  int64_t page_size = 500;  // keys per range call while listing
  size_t max_keys = 4096;   // a larger prefix is refused (a runaway writer cannot exhaust us)
};

struct WatcherCallbacks {
  // A key appeared or its value changed (also for keys found by a list).
  std::function<void(const std::string& key, const std::string& value)> on_put;
  // A key was deleted (its lease expired or was revoked, or it is gone from a new list).
  std::function<void(const std::string& key)> on_delete;
};

class PrefixWatcher : public std::enable_shared_from_this<PrefixWatcher> {
 public:
  static std::shared_ptr<PrefixWatcher> create(asio::any_io_executor executor,
                                               std::shared_ptr<EtcdClient> etcd,
                                               WatcherOptions options, WatcherCallbacks callbacks,
                                               const Clock& clock);
  void start();
  // No callback runs after stop().
  void stop();

  // The watch is established and the last probe answered.
  bool up() const { return up_; }
  // When etcd last answered (a list, a watch message or a probe); 0 before the first time.
  Nanos lastContact() const { return last_contact_; }
  int64_t revision() const { return revision_; }
  const std::map<std::string, std::string>& members() const { return members_; }
  int64_t lists() const { return lists_; }
  int64_t watchRestarts() const { return watch_restarts_; }

 private:
  PrefixWatcher(asio::any_io_executor executor, std::shared_ptr<EtcdClient> etcd,
                WatcherOptions options, WatcherCallbacks callbacks, const Clock& clock);
  asio::awaitable<void> watchLoop();
  asio::awaitable<void> probeLoop();
  asio::awaitable<absl::Status> list();
  // Reads one watch stream until it ends; sets need_list_ when a new list is required.
  asio::awaitable<void> follow(WatchStream& stream);
  void apply(const WatchEvent& event);
  void contact();
  void down(std::string_view what, const absl::Status& status);
  // The watch must start over from a list: the current stream is closed.
  void restartFromList(std::string_view why);

  std::shared_ptr<EtcdClient> etcd_;
  WatcherOptions options_;
  WatcherCallbacks callbacks_;
  const Clock& clock_;
  std::string range_end_;
  boost::asio::steady_timer watch_timer_;
  boost::asio::steady_timer probe_timer_;
  WatchStream* stream_ = nullptr;  // the open watch, owned by watchLoop()'s frame
  std::map<std::string, std::string> members_;
  int64_t revision_ = 0;  // every change up to here is in members_
  uint64_t cluster_id_ = 0;
  bool need_list_ = true;
  bool watching_ = false;
  bool up_ = false;
  bool stopped_ = false;
  Nanos last_contact_ = 0;
  int64_t lists_ = 0;
  int64_t watch_restarts_ = 0;
  log::RateLimitedLog failure_log_;
};

}  // namespace kvf::membership
