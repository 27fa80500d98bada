#include "router/membership.h"

#include <limits>

#include "common/config.h"
#include "common/status.h"
#include "common/strings.h"
#include "membership/prefix_watcher.h"
#include "router/instance.h"
#include "router/router.h"

namespace kvf::router {
namespace {

bool sameInstance(const InstanceConfig& a, const InstanceConfig& b) {
  return a.url == b.url && a.worker_url == b.worker_url &&
         a.kv_events.endpoint == b.kv_events.endpoint &&
         a.kv_events.replay_endpoint == b.kv_events.replay_endpoint &&
         a.kv_events.topic == b.kv_events.topic &&
         a.kv_events.data_parallel_size == b.kv_events.data_parallel_size &&
         a.kv_capacity_blocks == b.kv_capacity_blocks;
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

EtcdMembership::EtcdMembership(Router& router) : router_(router) {}

EtcdMembership::~EtcdMembership() { stop(); }

absl::Status EtcdMembership::start() {
  const membership::EtcdConfig& config = router_.config_.etcd;
  KVF_ASSIGN_OR_RETURN(auto etcd,
                       membership::EtcdClient::create(router_.ioc_.get_executor(),
                                                      membership::clientOptions(config)));
  membership::WatcherOptions options;
  options.prefix = config.prefix;
  options.probe_interval = millis(config.probe_interval_s);
  // Each registered instance is one key: twice the router's capacity bounds a runaway writer.
  options.max_keys = 2 * policy::kMaxInstances;
  membership::WatcherCallbacks callbacks;
  callbacks.on_put = [this](const std::string& key, const std::string& value) {
    onPut(key, value);
  };
  callbacks.on_delete = [this](const std::string& key) { onDelete(key); };
  watcher_ =
      membership::PrefixWatcher::create(router_.ioc_.get_executor(), std::move(etcd),
                                        std::move(options), std::move(callbacks), router_.clock_);

  auto& r = router_.registry_;
  auto changes = [&](std::string_view change) {
    return &r.counter("kvfabric_router_membership_changes_total",
                      "Instances added, updated or removed through etcd",
                      {{"change", std::string(change)}});
  };
  added_ = changes("add");
  updated_ = changes("update");
  removed_ = changes("remove");
  rejected_ = &r.counter("kvfabric_router_membership_rejected_total",
                         "Registered values that were malformed, mismatched or over capacity");
  std::weak_ptr<membership::PrefixWatcher> weak = watcher_;
  auto gauge = [&](std::string_view name, std::string_view help, metrics::MetricType type,
                   auto read) {
    r.callback(name, help, type, {}, [weak, read] {
      auto w = weak.lock();
      return w ? read(*w) : 0.0;
    });
  };
  using membership::PrefixWatcher;
  gauge("kvfabric_router_membership_etcd_up",
        "1 while the etcd watch is established and etcd answers probes; 0: membership frozen",
        metrics::MetricType::kGauge, [](const PrefixWatcher& w) { return w.up() ? 1.0 : 0.0; });
  const Clock& clock = router_.clock_;
  gauge("kvfabric_router_membership_last_sync_age_seconds",
        "Seconds since etcd last answered (+Inf before the first answer)",
        metrics::MetricType::kGauge, [&clock](const PrefixWatcher& w) {
          return w.lastContact() == 0 ? std::numeric_limits<double>::infinity()
                                      : nanosToSeconds(clock.now() - w.lastContact());
        });
  gauge("kvfabric_router_membership_revision", "etcd revision the membership reflects",
        metrics::MetricType::kGauge,
        [](const PrefixWatcher& w) { return static_cast<double>(w.revision()); });
  gauge("kvfabric_router_membership_lists_total",
        "Full lists of the prefix (start, compaction, canceled watch, etcd replaced)",
        metrics::MetricType::kCounter,
        [](const PrefixWatcher& w) { return static_cast<double>(w.lists()); });
  gauge("kvfabric_router_membership_watch_restarts_total",
        "Watch streams that ended and were reopened", metrics::MetricType::kCounter,
        [](const PrefixWatcher& w) { return static_cast<double>(w.watchRestarts()); });
  r.callback("kvfabric_router_membership_instances", "Instances registered through etcd",
             metrics::MetricType::kGauge, {},
             [this] { return static_cast<double>(ids_by_key_.size()); });

  watcher_->start();
  log::info("membership from etcd", "endpoints", strJoin(config.endpoints, ","), "prefix",
            config.prefix);
  return absl::OkStatus();
}

void EtcdMembership::stop() {
  if (watcher_) watcher_->stop();
}

void EtcdMembership::reject(const std::string& key, const absl::Status& why) {
  rejected_->inc();
  reject_log_.warn("etcd registration ignored", "key", key, "error", std::string(why.message()));
}

absl::StatusOr<InstanceConfig> EtcdMembership::parseRecord(const std::string& key,
                                                           const std::string& value) {
  if (value.size() > membership::kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        strCat("value of ", value.size(), " bytes exceeds ", membership::kMaxRecordBytes));
  }
  // The value is JSON, which is YAML: the same parser as `instances:` entries and the admin API.
  KVF_ASSIGN_OR_RETURN(YAML::Node node, config::parseYaml(value, key));
  config::ConfigErrors errors(key);
  config::ConfigMap map(node, "", &errors);
  InstanceConfig instance;
  parseInstanceConfig(map, &instance);
  KVF_RETURN_IF_ERROR(errors.status());
  KVF_RETURN_IF_ERROR(membership::validateInstanceId(instance.id));
  const std::string& prefix = router_.config_.etcd.prefix;
  if (key != membership::instanceKey(prefix, instance.id)) {
    return absl::InvalidArgumentError(
        strCat("id \"", instance.id, "\" does not match its key (want ", prefix, instance.id, ")"));
  }
  return instance;
}

void EtcdMembership::onPut(const std::string& key, const std::string& value) {
  auto parsed = parseRecord(key, value);
  if (!parsed.ok()) {
    reject(key, parsed.status());
    return;
  }
  const InstanceConfig& config = *parsed;
  std::shared_ptr<Instance> existing = router_.findInstance(config.id);
  bool ours = ids_by_key_.contains(key);
  if (existing && !ours) {
    reject(key, absl::AlreadyExistsError(strCat(
                    "instance \"", config.id, "\" is configured statically or by the admin API")));
    return;
  }
  if (existing && sameInstance(existing->config, config)) return;  // a lease renewed its key
  if (existing) {
    router_.removeInstance(existing);
    updated_->inc();
  }
  auto added = router_.addInstance(config, /*admit_now=*/false);
  if (!added.ok()) {
    ids_by_key_.erase(key);
    reject(key, added.status());
    return;
  }
  if (!existing) added_->inc();
  ids_by_key_[key] = config.id;
  log::info("instance registered in etcd; admitted after its first health check", "id", config.id,
            "url", config.url, "key", key);
}

void EtcdMembership::onDelete(const std::string& key) {
  auto it = ids_by_key_.find(key);
  if (it == ids_by_key_.end()) return;
  std::string id = it->second;
  ids_by_key_.erase(it);
  if (auto instance = router_.findInstance(id)) {
    router_.removeInstance(instance);
    removed_->inc();
    log::info("instance left etcd (lease expired or revoked); removed", "id", id, "key", key);
  }
}

}  // namespace kvf::router
