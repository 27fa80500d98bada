// The fixture of the worker agent's tests (agent_test.cc, tier_push_test.cc): two agents (holder
// C, receiver D) on one agent thread, each in front of a FakeEngineAdapter, over one FakeFabric;
// C may have lower tiers (a real TieredStore) that pushes are also served from. Test thread only.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/fake_engine_adapter.h"
#include "tests/fakes/fake_transport.h"
#include "tests/testing/io_thread.h"
#include "worker/agent.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::worker::agent_testing {

using fakes::FakeEngineAdapter;
using fakes::FakeFabric;
using Fault = FakeFabric::Fault;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBlockSize = 16;
constexpr uint64_t kBlockBytes = 512;
constexpr uint64_t kBlocks = 64;

// A deadline or a wait a loaded machine (ctest -j2 beside sanitizer builds) always meets: for
// fetches whose outcome, not their deadline, is under test, and for polls of what must happen.
constexpr milliseconds kAmple{20'000};
// Bounds the outcome's time of a fetch whose short deadline is under test only to catch one
// that hangs (this is no timing test): that deadline plus several seconds for a loaded machine.
constexpr Nanos kBound = 10'000'000'000;

inline BlockHash H(uint64_t i) { return BlockHash(1000 + i); }

inline std::vector<BlockHash> hashes(size_t n) {
  std::vector<BlockHash> out;
  for (size_t i = 0; i < n; ++i) out.push_back(H(i));
  return out;
}

struct Node {
  std::unique_ptr<TieredStore> tiers;  // first: the engine's pins in it go before it does
  std::string name;
  std::unique_ptr<FakeEngineAdapter> engine;
  std::unique_ptr<WorkerAgent> agent;
};

// Two agents (holder C, receiver D) on one agent thread, over one fabric.
class AgentTest : public ::testing::Test {
 protected:
  void TearDown() override { teardown(); }

  void teardown() {
    for (auto& n : nodes_) {
      if (n->agent) runOnIo([&] { n->agent->stop(); });
    }
    io_->stop();
    for (auto& n : nodes_) n->engine.reset();  // engine threads stop before the agents go
    nodes_.clear();
  }

  template <class Fn>
  void runOnIo(Fn fn) {
    io_->run([&]() -> asio::awaitable<bool> {
      fn();
      co_return true;
    });
  }

  // `tiers`: the node's lower tiers, which its pushes also serve; `bounce_bytes`: its agent's
  // bounce region for disk blocks.
  Node& node(const std::string& name, const std::string& token = "s3cret",
             std::chrono::milliseconds lease_check = milliseconds(20),
             std::unique_ptr<TieredStore> tiers = nullptr, uint64_t bounce_bytes = 1 << 20) {
    auto n = std::make_unique<Node>();
    n->name = name;
    n->engine = std::make_unique<FakeEngineAdapter>(kBlockSize, kBlockBytes, kBlocks);
    n->tiers = std::move(tiers);
    if (n->tiers != nullptr) n->engine->attachTiers(*n->tiers);
    AgentOptions o;
    o.push_bounce_bytes = bounce_bytes;
    o.instance_id = name;
    o.token = token;
    o.lease_check_interval = lease_check;
    auto agent = io_->run([&]() -> asio::awaitable<absl::StatusOr<std::unique_ptr<WorkerAgent>>> {
      auto a = WorkerAgent::create(io_->context(), *n->engine, fabric_->context(name), o, nullptr);
      if (a.ok()) (*a)->start();
      co_return a;
    });
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (agent.ok()) n->agent = std::move(*agent);
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }

  // C holds the first `held` of `n` hashes, in scattered blocks.
  static void holdOn(Node& c, size_t held) {
    for (size_t i = 0; i < held; ++i)
      c.engine->store(H(i), static_cast<BlockIndex>((i * 7) % kBlocks));
  }

  // D fetches hashes [0, n) from `source` into blocks 40.., waits (up to its deadline plus
  // kAmple) for the outcome and then up to `wait` for the release. A test that expects no
  // release yet (quarantine) passes a short `wait`: load can only make it miss a premature one.
  FakeEngineAdapter::FetchRecord fetch(Node& d, const std::string& source, const std::string& id,
                                       size_t n, milliseconds deadline, milliseconds wait = kAmple,
                                       const std::string& lease = "") {
    RemoteKvFetch f;
    f.id = id;
    f.source = source;
    f.lease_id = lease;
    f.hashes = hashes(n);
    for (size_t i = 0; i < n; ++i) f.blocks.push_back(static_cast<BlockIndex>(40 + i));
    f.deadline = deadline;
    d.engine->expectFetch(id, f.hashes, f.blocks);
    started_ = Clock::now();
    d.agent->fetch(std::move(f));
    if (!d.engine->waitCompleted(id, deadline + kAmple).completed.has_value()) {
      return d.engine->record(id);
    }
    return d.engine->waitReleased(id, wait);
  }
  // C holds `n` blocks; transport operation `nth` of D's fetch of them gets `fault`.
  FakeEngineAdapter::FetchRecord faultedFetch(Node& c, Node& d, size_t n, uint64_t nth, Fault fault,
                                              milliseconds delay, milliseconds deadline,
                                              milliseconds wait) {
    holdOn(c, n);
    fabric_->resetOperations();
    fabric_->inject(nth, fault, delay);
    return fetch(d, c.agent->url(), "f1", n, deadline, wait);
  }
  double secondsSinceFetch() const {
    return std::chrono::duration<double>(Clock::now() - started_).count();
  }

  static void expectNoViolations(Node& n, const FakeEngineAdapter::FetchRecord& r) {
    EXPECT_TRUE(r.violations.empty()) << r.violations.front();
    EXPECT_TRUE(n.engine->record("<pins>").violations.empty());
    EXPECT_TRUE(n.engine->record("<engine thread>").violations.empty());
  }
  // Every pin undone: the pool's and the lower tiers' runs.
  static bool waitPinsZero(Node& c, milliseconds timeout) {
    auto none = [&] { return c.engine->totalPins() == 0 && c.engine->pinnedTierRuns() == 0; };
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (none()) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return none();
  }

  // Beast-style: for each fault, fails, delays past the deadline or corrupts the n-th transport
  // operation of one fetch of `n_blocks` from a fresh C (set up by `make_holder`, which returns
  // it), for every n the fetch reaches (at least `min_ops` when nothing fails).
  void everyOperationFaulted(const std::function<Node&()>& make_holder, size_t n_blocks,
                             uint64_t min_ops) {
    for (Fault fault : {Fault::kFail, Fault::kDelay, Fault::kCorrupt}) {
      for (uint64_t n = 1;; ++n) {
        SCOPED_TRACE(::testing::Message() << "fault " << static_cast<int>(fault) << " at op " << n);
        teardown();
        fabric_ = std::make_unique<FakeFabric>();
        io_ = std::make_unique<testing::IoThread>();  // a fresh agent thread for this run
        Node& c = make_holder();
        Node& d = node("D");
        fabric_->resetOperations();
        // The delay leaves the agent thread a second's lag past the 150 ms deadline before a
        // delayed write or notice could still make the fetch succeed.
        fabric_->inject(n, fault, milliseconds(1200));
        auto r = fetch(d, c.agent->url(), "f1", n_blocks, milliseconds(150), milliseconds(0));
        ASSERT_TRUE(r.completed.has_value());
        if (r.completed->writes_may_arrive) {
          // Quarantined: C may still write (its put failed or its notice was lost, and it lives).
          fabric_->kill("C");
        }
        r = d.engine->waitReleased("f1", kAmple);
        EXPECT_TRUE(r.released);
        EXPECT_LT(r.completed->elapsed, kBound) << r.completed->reason;
        ASSERT_TRUE(fabric_->waitIdle(kAmple));
        EXPECT_TRUE(d.engine->markersIntact());
        EXPECT_TRUE(waitPinsZero(c, kAmple));
        expectNoViolations(d, r);
        if (fabric_->operations() < n) {  // the fault was never reached: a clean fetch
          EXPECT_FALSE(r.failed);
          EXPECT_EQ(r.completed->landed, n_blocks);
          EXPECT_GE(n, min_ops);
          break;
        }
        // A delay or a corruption only matters to the bytes and the notice; a failure anywhere.
        const std::string op = fabric_->operationLog().at(n - 1);
        const bool applies = fault == Fault::kFail || op.starts_with("write") ||
                             (fault == Fault::kDelay && op.starts_with("notice"));
        EXPECT_EQ(r.failed, applies) << op << ": " << r.completed->reason;
        if (!applies) {
          EXPECT_EQ(r.completed->landed, n_blocks) << op;
        }
        ASSERT_LT(n, 30u);
      }
    }
  }

  // The agent thread's io_context outlives the fabric: a landing still open when a test ends
  // stays in the fabric (as a peer's write may still arrive) with the receiver's callback, which
  // holds a timer of that io_context.
  std::unique_ptr<testing::IoThread> io_ = std::make_unique<testing::IoThread>();
  std::unique_ptr<FakeFabric> fabric_ = std::make_unique<FakeFabric>();
  std::vector<std::unique_ptr<Node>> nodes_;
  Clock::time_point started_;
};

}  // namespace kvf::worker::agent_testing
