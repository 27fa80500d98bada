// The router's instances from etcd (membership.source: etcd): mirrors the registration prefix
// with a membership::PrefixWatcher and turns its changes into the router's own add / remove
// instance paths. A registered instance takes requests only after its first health check
// passes; a deleted key (lease expired or revoked) removes the instance and its index entries at
// once; while etcd is unreachable the instances stay as they are and the metrics say so.
// Owned by the Router; runs on the router's io thread.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "common/metrics.h"
#include "router/core/config.h"

namespace kvf::membership {
class PrefixWatcher;
}  // namespace kvf::membership

namespace kvf::router {

class Router;

class EtcdMembership {
 public:
  explicit EtcdMembership(Router& router);
  ~EtcdMembership();
  EtcdMembership(const EtcdMembership&) = delete;
  EtcdMembership& operator=(const EtcdMembership&) = delete;

  // Registers the metrics and starts listing and watching.
  absl::Status start();
  void stop();

 private:
  void onPut(const std::string& key, const std::string& value);
  void onDelete(const std::string& key);
  // The instance a registered value describes; InvalidArgument with every problem otherwise.
  absl::StatusOr<InstanceConfig> parseRecord(const std::string& key, const std::string& value);
  void reject(const std::string& key, const absl::Status& why);

  Router& router_;
  std::shared_ptr<membership::PrefixWatcher> watcher_;
  std::map<std::string, std::string> ids_by_key_;  // the instances that came from etcd
  metrics::Counter* added_ = nullptr;
  metrics::Counter* updated_ = nullptr;
  metrics::Counter* removed_ = nullptr;
  metrics::Counter* rejected_ = nullptr;
  log::RateLimitedLog reject_log_;
};

}  // namespace kvf::router
