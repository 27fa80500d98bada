// The etcd client, LeaseRegistration and PrefixWatcher against a real etcd on loopback, with a
// TCP relay between them and etcd to make etcd unreachable (or replace it) while it keeps
// running: list then watch, re-list after a compaction, a frozen mirror while etcd is away,
// a replaced etcd detected, a lease kept alive, re-registered when lost, and revoked on stop.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/http_client.h"
#include "common/strings.h"
#include "membership/etcd_client.h"
#include "membership/lease_registration.h"
#include "membership/prefix_watcher.h"
#include "tests/testing/etcd_server.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/poll.h"
#include "tests/testing/tcp_relay.h"

namespace kvf::membership {
namespace {

using namespace std::chrono_literals;
using testing::eventually;

class EtcdLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<testing::EtcdServer>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    etcd_->start();
    relay_ = std::make_unique<testing::TcpRelay>(etcd_->port());
    // The test's own writes and reads: etcd syncs each write to disk, which on a loaded machine
    // can take seconds; the clients under test keep the short timeout they are tested with.
    direct_ = client(etcd_->endpoint(), 10s);
  }
  void TearDown() override {
    for (auto& w : watchers_) {
      io_.run([&]() -> asio::awaitable<void> {
        w->stop();
        co_return;
      });
    }
    io_.stop();
  }

  std::shared_ptr<EtcdClient> client(const std::string& endpoint,
                                     std::chrono::milliseconds request_timeout = 1s) {
    EtcdClientOptions options;
    options.endpoints = {endpoint};
    options.request_timeout = request_timeout;
    auto c = EtcdClient::create(io_.executor(), options);
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }

  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0) {
    auto r = io_.run([&]() -> asio::awaitable<absl::StatusOr<ResponseHeader>> {
      co_return co_await direct_->put(key, value, lease);
    });
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->revision : 0;
  }
  void erase(const std::string& key) {
    auto r = io_.run([&]() -> asio::awaitable<absl::StatusOr<ResponseHeader>> {
      co_return co_await direct_->deleteRange(key, "");
    });
    EXPECT_TRUE(r.ok()) << r.status();
  }
  std::optional<KeyValue> get(const std::string& key) {
    auto r = io_.run([&]() -> asio::awaitable<absl::StatusOr<RangeResult>> {
      co_return co_await direct_->range(key, "", 0, 0);
    });
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->kvs.empty()) return std::nullopt;
    return r->kvs[0];
  }
  // POST /v3/kv/compaction (not part of EtcdClient: kvfabric never compacts).
  void compact(int64_t revision) {
    auto http = http::HttpClient::create(io_.executor(), "127.0.0.1", etcd_->port());
    auto r = io_.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
      http::ClientRequest req;
      req.method = "POST";
      req.target = "/v3/kv/compaction";
      req.body = strCat(R"({"revision":")", revision, R"(","physical":true})");
      co_return co_await http->request(std::move(req));
    });
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200) << r->body;
  }

  // A watcher through the relay that records what it reports.
  struct Recorder {
    std::mutex mu;
    std::map<std::string, std::string> members;
    std::vector<std::string> log;  // "put key=value" / "delete key"
    std::map<std::string, std::string> snapshot() {
      std::lock_guard lock(mu);
      return members;
    }
    size_t entries() {
      std::lock_guard lock(mu);
      return log.size();
    }
  };
  std::shared_ptr<PrefixWatcher> watch(Recorder& rec) {
    WatcherOptions options;
    options.prefix = "/m/";
    options.probe_interval = 100ms;
    options.retry_min = 20ms;
    options.retry_max = 200ms;
    options.page_size = 2;  // exercise paging
    WatcherCallbacks callbacks;
    callbacks.on_put = [&rec](const std::string& k, const std::string& v) {
      std::lock_guard lock(rec.mu);
      rec.members[k] = v;
      rec.log.push_back("put " + k + "=" + v);
    };
    callbacks.on_delete = [&rec](const std::string& k) {
      std::lock_guard lock(rec.mu);
      rec.members.erase(k);
      rec.log.push_back("delete " + k);
    };
    auto w = PrefixWatcher::create(io_.executor(), client(relay_->endpoint()), options,
                                   std::move(callbacks), clock_);
    io_.run([&]() -> asio::awaitable<void> {
      w->start();
      co_return;
    });
    watchers_.push_back(w);
    return w;
  }
  template <class T, class F>
  T onIo(F read) {
    return io_.run([&]() -> asio::awaitable<T> { co_return read(); });
  }
  bool up(const std::shared_ptr<PrefixWatcher>& w) {
    return onIo<bool>([&] { return w->up(); });
  }

  SteadyClock clock_;
  testing::IoThread io_;
  std::unique_ptr<testing::EtcdServer> etcd_;
  std::unique_ptr<testing::TcpRelay> relay_;
  std::shared_ptr<EtcdClient> direct_;
  std::vector<std::shared_ptr<PrefixWatcher>> watchers_;
};

using Members = std::map<std::string, std::string>;

TEST_F(EtcdLiveTest, ListsThenWatchesThePrefixOnly) {
  put("/m/a", "1");
  put("/m/b", "2");
  put("/m/c", "3");
  put("/n/outside", "x");
  put("/m", "not under /m/");
  Recorder rec;
  auto w = watch(rec);
  ASSERT_TRUE(eventually([&] { return rec.snapshot().size() == 3; }, 10s));
  EXPECT_EQ(rec.snapshot(), (Members{{"/m/a", "1"}, {"/m/b", "2"}, {"/m/c", "3"}}));
  ASSERT_TRUE(eventually([&] { return up(w); }, 10s));

  put("/m/d", "4");
  put("/m/a", "1b");
  put("/m/a", "1b");  // same value: not reported again
  erase("/m/b");
  put("/n/other", "y");
  ASSERT_TRUE(eventually([&] { return rec.entries() == 6; }, 10s));
  EXPECT_EQ(rec.snapshot(), (Members{{"/m/a", "1b"}, {"/m/c", "3"}, {"/m/d", "4"}}));
  std::lock_guard lock(rec.mu);
  EXPECT_EQ(rec.log[3], "put /m/d=4");
  EXPECT_EQ(rec.log[4], "put /m/a=1b");
  EXPECT_EQ(rec.log[5], "delete /m/b");
}

TEST_F(EtcdLiveTest, KeepsTheMirrorWhileEtcdIsAwayAndRelistsAfterCompaction) {
  put("/m/stays", "s");
  put("/m/goes", "g");
  Recorder rec;
  auto w = watch(rec);
  ASSERT_TRUE(eventually([&] { return up(w) && rec.snapshot().size() == 2; }, 10s));

  relay_->cut();
  ASSERT_TRUE(eventually([&] { return !up(w); }, 5s)) << "the probe must notice";
  // Changes while the watcher cannot see etcd, then a compaction past them: resuming the watch
  // is impossible and only a list can tell what changed.
  erase("/m/goes");
  int64_t last = put("/m/new", "n");
  put("/m/stays", "s");  // rewritten with the same value
  compact(last + 1);
  std::this_thread::sleep_for(500ms);  // several probe periods with etcd away
  EXPECT_EQ(rec.snapshot(), (Members{{"/m/stays", "s"}, {"/m/goes", "g"}}))
      << "nothing may change while etcd is unreachable";
  int64_t lists_before = onIo<int64_t>([&] { return w->lists(); });

  relay_->restore();
  Members expected{{"/m/stays", "s"}, {"/m/new", "n"}};
  ASSERT_TRUE(eventually([&] { return rec.snapshot() == expected && up(w); }, 10s));
  EXPECT_GT(onIo<int64_t>([&] { return w->lists(); }), lists_before);
  {
    std::lock_guard lock(rec.mu);
    EXPECT_EQ(std::count(rec.log.begin(), rec.log.end(), "put /m/stays=s"), 1)
        << "an unchanged key is not reported again after a list";
  }
  // And the watch works again after the list.
  put("/m/after", "a");
  ASSERT_TRUE(eventually([&] { return rec.snapshot().contains("/m/after"); }, 10s));
}

TEST_F(EtcdLiveTest, ResumesFromTheLastRevisionAfterABrokenWatch) {
  Recorder rec;
  auto w = watch(rec);
  ASSERT_TRUE(eventually([&] { return up(w); }, 10s));
  put("/m/a", "1");
  ASSERT_TRUE(eventually([&] { return rec.entries() == 1; }, 10s));
  relay_->cut();
  put("/m/b", "2");
  erase("/m/a");
  relay_->restore();
  ASSERT_TRUE(eventually([&] { return rec.entries() == 3; }, 10s));
  EXPECT_EQ(rec.snapshot(), (Members{{"/m/b", "2"}}));
  EXPECT_EQ(onIo<int64_t>([&] { return w->lists(); }), 1) << "no compaction: resumed, not listed";
  EXPECT_GE(onIo<int64_t>([&] { return w->watchRestarts(); }), 1);
}

TEST_F(EtcdLiveTest, AReplacedEtcdIsListedAgain) {
  put("/m/old", "o");
  Recorder rec;
  auto w = watch(rec);
  ASSERT_TRUE(eventually([&] { return up(w) && rec.snapshot().size() == 1; }, 10s));
  // A fresh etcd (new cluster, revision back at 1) behind the same address.
  testing::EtcdServer fresh("AReplacedEtcdIsListedAgain_fresh");
  fresh.start();
  relay_->setUpstream(fresh.port());
  relay_->cut();
  relay_->restore();
  ASSERT_TRUE(eventually([&] { return rec.snapshot().empty(); }, 10s));
  std::lock_guard lock(rec.mu);
  EXPECT_EQ(rec.log.back(), "delete /m/old");
}

TEST_F(EtcdLiveTest, RegistrationLivesWithItsLeaseAndIsRevokedOnStop) {
  RegistrationOptions options;
  options.key = "/m/engine-0";
  options.value = "v";
  // Refreshed every TTL/3: a 4 s TTL outlives a 2.6 s stall of this process or of etcd (a
  // loaded machine's), where 2 s did not; the checks below wait past it.
  options.lease_ttl_s = 4;
  options.retry_interval = 100ms;
  auto reg = LeaseRegistration::create(io_.executor(), client(relay_->endpoint()), options);
  onIo<int>([&] {
    reg->start();
    return 0;
  });
  ASSERT_TRUE(eventually([&] { return get("/m/engine-0").has_value(); }, 10s));
  int64_t lease = get("/m/engine-0")->lease;
  EXPECT_NE(lease, 0);
  // Kept alive well past its TTL.
  std::this_thread::sleep_for(6500ms);
  ASSERT_TRUE(get("/m/engine-0").has_value());
  EXPECT_EQ(get("/m/engine-0")->lease, lease);

  // Someone revokes the lease (as an expiry would): registered again under a new one.
  ASSERT_TRUE(io_.run([&]() -> asio::awaitable<absl::Status> {
                   co_return co_await direct_->leaseRevoke(lease);
                 })
                  .ok());
  ASSERT_TRUE(eventually(
      [&] {
        auto kv = get("/m/engine-0");
        return kv && kv->lease != lease;
      },
      10s));
  EXPECT_EQ(onIo<int64_t>([&] { return reg->registrations(); }), 2);

  // Unreachable for longer than the TTL: etcd expires the lease; once reachable the
  // registration notices and registers again.
  relay_->cut();
  ASSERT_TRUE(eventually([&] { return !get("/m/engine-0").has_value(); }, 20s));
  relay_->restore();
  ASSERT_TRUE(eventually([&] { return get("/m/engine-0").has_value(); }, 20s));

  // stop() revokes: the key goes at once, not a TTL later.
  auto stopped =
      io_.run([&]() -> asio::awaitable<absl::Status> { co_return co_await reg->stop(); });
  EXPECT_TRUE(stopped.ok()) << stopped;
  EXPECT_FALSE(get("/m/engine-0").has_value());
}

}  // namespace
}  // namespace kvf::membership
