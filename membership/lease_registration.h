// Keeps one key registered in etcd under a lease for as long as its owner lives: grants a
// lease, puts the key with it, refreshes the lease every third of its TTL, and registers again
// (new lease, same key and value) when etcd says the lease is gone. While etcd is unreachable
// it keeps retrying with the lease it has: etcd extends every lease when it comes back, so a
// short outage does not drop the key. stop() revokes the lease, which deletes the key at once;
// a registrant that dies without stop() disappears when the TTL runs out. Owned by the process
// that registers (kvf-engine, kvf-register); start(), stop() and the getters run on the
// executor given to create().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <boost/asio/steady_timer.hpp>

#include "common/http.h"
#include "common/log.h"
#include "membership/etcd_client.h"

namespace kvf::membership {

struct RegistrationOptions {
  std::string key;
  std::string value;
  int64_t lease_ttl_s = 10;
  // Pause before retrying after etcd failed or refused (capped at a third of the TTL).
  std::chrono::milliseconds retry_interval{500};
};

class LeaseRegistration : public std::enable_shared_from_this<LeaseRegistration> {
 public:
  static std::shared_ptr<LeaseRegistration> create(asio::any_io_executor executor,
                                                   std::shared_ptr<EtcdClient> etcd,
                                                   RegistrationOptions options);
  // Starts registering in the background. Call once.
  void start();
  // Stops keeping the lease alive and revokes it (bounded by the client's request timeout).
  // OK also when nothing was registered yet.
  asio::awaitable<absl::Status> stop();

  // The key is in etcd under a lease that the last keep-alive confirmed.
  bool registered() const { return lease_id_ != 0 && alive_; }
  int64_t leaseId() const { return lease_id_; }
  int64_t registrations() const { return registrations_; }  // grants + puts that succeeded

 private:
  LeaseRegistration(asio::any_io_executor executor, std::shared_ptr<EtcdClient> etcd,
                    RegistrationOptions options);
  asio::awaitable<void> run();
  asio::awaitable<absl::Status> registerOnce();
  asio::awaitable<void> pause(std::chrono::milliseconds d);

  std::shared_ptr<EtcdClient> etcd_;
  RegistrationOptions options_;
  boost::asio::steady_timer timer_;
  int64_t lease_id_ = 0;
  bool alive_ = false;
  bool stopped_ = false;
  int64_t registrations_ = 0;
  log::RateLimitedLog failure_log_;
};

}  // namespace kvf::membership
