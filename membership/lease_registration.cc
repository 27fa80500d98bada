#include "membership/lease_registration.h"

#include <algorithm>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/status.h"

namespace kvf::membership {

std::shared_ptr<LeaseRegistration> LeaseRegistration::create(asio::any_io_executor executor,
                                                             std::shared_ptr<EtcdClient> etcd,
                                                             RegistrationOptions options) {
  return std::shared_ptr<LeaseRegistration>(
      new LeaseRegistration(std::move(executor), std::move(etcd), std::move(options)));
}

LeaseRegistration::LeaseRegistration(asio::any_io_executor executor,
                                     std::shared_ptr<EtcdClient> etcd, RegistrationOptions options)
    : etcd_(std::move(etcd)), options_(std::move(options)), timer_(std::move(executor)) {}

void LeaseRegistration::start() {
  asio::co_spawn(
      timer_.get_executor(), [self = shared_from_this()] { return self->run(); }, asio::detached);
}

asio::awaitable<void> LeaseRegistration::pause(std::chrono::milliseconds d) {
  timer_.expires_after(d);
  co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
}

asio::awaitable<absl::Status> LeaseRegistration::registerOnce() {
  KVF_CO_ASSIGN_OR_RETURN(LeaseGrantResult lease, co_await etcd_->leaseGrant(options_.lease_ttl_s));
  if (stopped_) {
    // stop() ran during the grant and saw no lease to revoke.
    co_await etcd_->leaseRevoke(lease.id);
    co_return absl::CancelledError("stopped");
  }
  // Known before the put, so that a stop() meanwhile revokes it.
  lease_id_ = lease.id;
  auto put = co_await etcd_->put(options_.key, options_.value, lease.id);
  if (!put.ok()) {
    lease_id_ = 0;
    co_return put.status();
  }
  alive_ = true;
  ++registrations_;
  log::info("registered in etcd", "key", options_.key, "lease", lease.id, "ttl_s", lease.ttl,
            "revision", put->revision, "endpoint", etcd_->endpoint());
  co_return absl::OkStatus();
}

asio::awaitable<void> LeaseRegistration::run() {
  auto self = shared_from_this();
  // Refresh three times per TTL: two refreshes may fail before the lease runs out.
  auto refresh = std::chrono::milliseconds(options_.lease_ttl_s * 1000 / 3);
  auto retry = std::min(options_.retry_interval, refresh);
  while (!stopped_) {
    if (lease_id_ == 0) {
      absl::Status s = co_await registerOnce();
      if (stopped_) break;
      if (!s.ok()) {
        failure_log_.warn("etcd registration failed; retrying", "key", options_.key, "error",
                          std::string(s.message()));
        co_await pause(retry);
        continue;
      }
    }
    co_await pause(alive_ ? refresh : retry);
    if (stopped_) break;
    auto kept = co_await etcd_->leaseKeepAlive(lease_id_);
    if (stopped_) break;
    if (!kept.ok()) {
      // etcd unreachable: keep the lease id, etcd restores leases when it returns.
      alive_ = false;
      failure_log_.warn("etcd lease keep-alive failed; retrying", "key", options_.key, "lease",
                        lease_id_, "error", std::string(kept.status().message()));
      continue;
    }
    if (kept->ttl <= 0) {
      log::warn("etcd lease is gone; registering again", "key", options_.key, "lease", lease_id_);
      lease_id_ = 0;
      alive_ = false;
      continue;
    }
    if (!alive_) {
      // Back after an outage: write the value again in case the key was lost meanwhile (an
      // etcd restored from an older snapshot) while the lease survived.
      auto put = co_await etcd_->put(options_.key, options_.value, lease_id_);
      if (stopped_) break;
      if (!put.ok()) {
        failure_log_.warn("etcd re-put after an outage failed", "key", options_.key, "error",
                          std::string(put.status().message()));
        if (absl::IsNotFound(put.status())) lease_id_ = 0;
        continue;
      }
      alive_ = true;
      log::info("etcd reachable again; registration kept", "key", options_.key, "lease", lease_id_);
    }
  }
}

asio::awaitable<absl::Status> LeaseRegistration::stop() {
  auto self = shared_from_this();
  stopped_ = true;
  timer_.cancel();
  int64_t lease = lease_id_;
  lease_id_ = 0;
  alive_ = false;
  if (lease == 0) co_return absl::OkStatus();
  absl::Status s = co_await etcd_->leaseRevoke(lease);
  if (s.ok()) {
    log::info("etcd lease revoked", "key", options_.key, "lease", lease);
  } else {
    log::warn("etcd lease revoke failed; the key expires with its TTL", "key", options_.key,
              "lease", lease, "error", std::string(s.message()));
  }
  co_return s;
}

}  // namespace kvf::membership
