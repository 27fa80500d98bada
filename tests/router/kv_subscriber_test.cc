// KvSubscriber against two publishers: the C++ fake and an independent Python one
// (/usr/bin/python3 with pyzmq + msgpack) in vLLM's format: gaps recovered through the replay
// socket, restarts and unrecoverable gaps reported as resets, events applied to a CacheIndex.
#include "router/kv_subscriber.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <thread>

#include <zmq.hpp>

#include "policy/block_hash.h"
#include "tests/fakes/fake_kv_publisher.h"

namespace kvf::router {
namespace {

using namespace std::chrono_literals;

class Collector {
 public:
  KvSubscriber::Sink sink() {
    return [this](KvUpdate&& u) {
      std::lock_guard lock(mu_);
      updates_.push_back(std::move(u));
    };
  }
  // Waits until `pred(updates)` holds (or 10 s pass); returns whether it held.
  template <class P>
  bool waitFor(P pred) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(mu_);
        if (pred(updates_)) return true;
      }
      std::this_thread::sleep_for(2ms);
    }
    return false;
  }
  std::vector<KvUpdate> take() {
    std::lock_guard lock(mu_);
    return std::move(updates_);
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return updates_.size();
  }

 private:
  std::mutex mu_;
  std::vector<KvUpdate> updates_;
};

std::vector<uint64_t> batchSeqs(const std::vector<KvUpdate>& updates) {
  std::vector<uint64_t> seqs;
  for (const auto& u : updates) {
    if (u.kind == KvUpdate::Kind::kBatch) seqs.push_back(u.seq);
  }
  return seqs;
}

std::vector<uint64_t> iotaSeqs(uint64_t n) {
  std::vector<uint64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Publishes empty batches until the subscriber has delivered one (ZMQ drops messages sent
// before the subscription is in place); replay fills in whatever was missed.
uint64_t probeUntilConnected(fakes::FakeKvPublisher& pub, Collector& c) {
  uint64_t sent = 0;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (c.size() == 0 && std::chrono::steady_clock::now() < deadline) {
    pub.publish({});
    ++sent;
    std::this_thread::sleep_for(20ms);
  }
  return sent;
}

TEST(KvSubscriberTest, GapIsRecoveredThroughReplayInOrder) {
  fakes::FakeKvPublisher pub;
  Collector c;
  KvEventsConfig config{pub.endpoint(), pub.replayEndpoint(), ""};
  KvSubscriber sub(std::make_shared<zmq::context_t>(1), config, c.sink());
  uint64_t sent = probeUntilConnected(pub, c);
  ASSERT_TRUE(c.waitFor([&](auto& u) { return u.size() >= 1; }));
  fakes::FakeKvEvent stored;
  stored.hashes = {1};
  stored.token_ids.assign(16, 3);
  pub.publish({stored}, /*drop=*/true);  // lost on the wire, kept for replay
  pub.publish({});
  uint64_t total = sent + 2;
  ASSERT_TRUE(c.waitFor([&](auto& u) { return batchSeqs(u).size() >= total; }));
  auto updates = c.take();
  EXPECT_EQ(batchSeqs(updates), iotaSeqs(total));
  for (const auto& u : updates) EXPECT_EQ(u.kind, KvUpdate::Kind::kBatch);
  EXPECT_GE(sub.stats().replayed.load(), 1u);
  EXPECT_EQ(sub.stats().unrecovered_gaps.load(), 0u);
  // The recovered batch carries the dropped BlockStored.
  bool found = false;
  for (const auto& u : updates) {
    if (u.seq == sent && u.batch.events.size() == 1) found = true;
  }
  EXPECT_TRUE(found);
}

TEST(KvSubscriberTest, RestartAndUnrecoverableGapReset) {
  fakes::FakeKvPublisher pub;
  Collector c;
  // No replay endpoint: a gap cannot be recovered.
  KvEventsConfig config{pub.endpoint(), "", ""};
  KvSubscriber sub(std::make_shared<zmq::context_t>(1), config, c.sink());
  probeUntilConnected(pub, c);
  c.take();
  pub.publish({}, /*drop=*/true);
  pub.publish({});
  ASSERT_TRUE(c.waitFor([](auto& u) { return u.size() >= 2; }));
  auto gap = c.take();
  EXPECT_EQ(gap[0].kind, KvUpdate::Kind::kReset);
  EXPECT_EQ(gap[0].reason, "unrecovered_gap");
  EXPECT_EQ(gap[1].kind, KvUpdate::Kind::kBatch);

  pub.restart();
  fakes::FakeKvEvent cleared;
  cleared.kind = fakes::FakeKvEvent::Kind::kCleared;
  pub.publish({cleared});
  ASSERT_TRUE(c.waitFor([](auto& u) { return u.size() >= 2; }));
  auto restart = c.take();
  EXPECT_EQ(restart[0].kind, KvUpdate::Kind::kReset);
  EXPECT_EQ(restart[0].reason, "restart");
  EXPECT_EQ(restart[1].seq, 0u);
  ASSERT_EQ(restart[1].batch.events.size(), 1u);
  EXPECT_EQ(restart[1].batch.events[0].kind, KvEventKind::kAllBlocksCleared);
  EXPECT_EQ(sub.stats().restarts.load(), 1u);
}

// A restarted engine's first batch went out before the subscription reached it (ZMQ drops
// what a PUB sends to no subscriber): the restart is seen on its second batch, and the first
// still comes from the replay socket instead of being reported lost (late_join).
TEST(KvSubscriberTest, RestartWhoseFirstBatchWasMissedIsReplayed) {
  fakes::FakeKvPublisher pub;
  Collector c;
  KvEventsConfig config{pub.endpoint(), pub.replayEndpoint(), ""};
  KvSubscriber sub(std::make_shared<zmq::context_t>(1), config, c.sink());
  probeUntilConnected(pub, c);
  for (int i = 0; i < 3; ++i) pub.publish({});
  ASSERT_TRUE(c.waitFor([](auto& u) { return batchSeqs(u).size() >= 4; }));
  c.take();

  pub.restart();
  fakes::FakeKvEvent stored;
  stored.hashes = {7};
  stored.token_ids.assign(16, 5);
  pub.publish({stored}, /*drop=*/true);  // seq 0: missed on the wire, kept for replay
  pub.publish({});                       // seq 1
  ASSERT_TRUE(c.waitFor([](auto& u) { return u.size() >= 3; }));
  auto updates = c.take();
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].kind, KvUpdate::Kind::kReset);
  EXPECT_EQ(updates[0].reason, "restart");
  EXPECT_EQ(batchSeqs(updates), (std::vector<uint64_t>{0, 1}));
  ASSERT_EQ(updates[1].batch.events.size(), 1u);  // the missed BlockStored
  EXPECT_EQ(sub.stats().late_joins.load(), 0u);
  EXPECT_EQ(sub.stats().lost_batches.load(), 0u);
  EXPECT_EQ(sub.stats().restarts.load(), 1u);
}

// A child process speaking line commands over pipes.
class PythonPublisher {
 public:
  explicit PythonPublisher(const char* arg = nullptr) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe");
    std::string script = std::string(getenv("KVF_SOURCE_DIR") ? getenv("KVF_SOURCE_DIR") : ".") +
                         "/tests/router/kv_publisher.py";
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      alarm(60);  // never outlive the test
      if (arg != nullptr) {
        execl("/usr/bin/python3", "python3", script.c_str(), "--ranks", arg, nullptr);
      }
      execl("/usr/bin/python3", "python3", script.c_str(), nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~PythonPublisher() {
    if (to_) {
      fputs("quit\n", to_);
      fclose(to_);
    }
    if (from_) fclose(from_);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::string line() {
    char buf[256];
    if (!fgets(buf, sizeof buf, from_)) return "";
    return buf;
  }
  void send(const std::string& command) {
    fputs((command + "\n").c_str(), to_);
    fflush(to_);
    line();  // "sent N"
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

TEST(KvSubscriberTest, PythonVllmFormatPublisherFeedsTheIndex) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  PythonPublisher py;
  int pub_port = 0, replay_port = 0;
  std::string ports = py.line();
  ASSERT_EQ(sscanf(ports.c_str(), "%d %d", &pub_port, &replay_port), 2)
      << "python publisher failed to start (python3-zmq / python3-msgpack missing?): " << ports;
  Collector c;
  KvEventsConfig config{"tcp://127.0.0.1:" + std::to_string(pub_port),
                        "tcp://127.0.0.1:" + std::to_string(replay_port), ""};
  KvSubscriber sub(std::make_shared<zmq::context_t>(1), config, c.sink());
  auto deadline = std::chrono::steady_clock::now() + 10s;
  uint64_t sent = 0;
  while (c.size() == 0 && std::chrono::steady_clock::now() < deadline) {
    py.send("probe");
    ++sent;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GT(c.size(), 0u);
  // Blocks 0-1 stored (map encoding, bytes hashes), blocks 2-3 chained on block 1 (lost on
  // the wire and replayed), then block 1 evicted.
  py.send("store 0 2 - 101 102");
  py.send("drop");
  py.send("store 32 2 102 103 104");
  py.send("remove 102");
  sent += 3;
  ASSERT_TRUE(c.waitFor([&](auto& u) { return batchSeqs(u).size() >= sent; }));
  auto updates = c.take();
  EXPECT_EQ(batchSeqs(updates), iotaSeqs(sent));
  EXPECT_GE(sub.stats().replayed.load(), 1u);

  policy::CacheIndex index;
  auto apply = [&](std::vector<KvUpdate>& batch) {
    for (auto& u : batch) {
      for (auto& e : u.batch.events) {
        if (e.kind == KvEventKind::kBlockStored) {
          EXPECT_TRUE(index.storeBlocks(0, e.stored));
        }
        if (e.kind == KvEventKind::kBlockRemoved) index.removeBlocks(0, e.removed);
      }
    }
  };
  apply(updates);
  std::vector<policy::TokenId> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 0);
  auto hashes = policy::hashTokenBlocks(tokens, 16);
  std::vector<uint32_t> matched(1);
  index.matchLengths(hashes, matched);
  EXPECT_EQ(matched[0], 1u);  // block 1 was removed: the leading run stops there
  EXPECT_EQ(index.instanceBlocks(0), 3u);
  EXPECT_FALSE(index.exactHolders(hashes[3]).empty());  // the replayed store was applied

  // The older array encoding with integer hashes: block 1 comes back under new engine hashes.
  py.send("store_array 0 2 - 201 202");
  ASSERT_TRUE(c.waitFor([&](auto& u) { return batchSeqs(u).size() >= 1; }));
  auto more = c.take();
  apply(more);
  index.matchLengths(hashes, matched);
  EXPECT_EQ(matched[0], 4u);
}

// A stream first seen past seq 0, whose replay buffer no longer reaches back, says what history
// it lost; an undecodable batch resets the stream instead of advancing it silently; an unknown
// event type is skipped and counted, the rest of its batch kept (bytes from the fixtures'
// independent encoder).
TEST(KvSubscriberTest, LateJoinUndecodableBatchAndUnknownEvents) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  PythonPublisher py;
  int pub_port = 0, replay_port = 0;
  ASSERT_EQ(sscanf(py.line().c_str(), "%d %d", &pub_port, &replay_port), 2);
  Collector c;
  KvEventsConfig config{"tcp://127.0.0.1:" + std::to_string(pub_port),
                        "tcp://127.0.0.1:" + std::to_string(replay_port), ""};
  KvSubscriber sub(std::make_shared<zmq::context_t>(1), config, c.sink());
  py.send("seq 1000");  // batches 0-999 were published before anyone listened
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (c.size() == 0 && std::chrono::steady_clock::now() < deadline) {
    py.send("probe");
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(c.waitFor([](auto& u) { return u.size() >= 2; }));
  auto first = c.take();
  ASSERT_EQ(first[0].kind, KvUpdate::Kind::kReset);
  EXPECT_EQ(first[0].reason, "late_join");
  EXPECT_EQ(first[0].lost_batches, 1000u);
  EXPECT_EQ(sub.stats().late_joins.load(), 1u);

  py.send("garbage");
  ASSERT_TRUE(c.waitFor([](auto& u) { return !u.empty(); }));
  auto bad = c.take();
  ASSERT_EQ(bad[0].kind, KvUpdate::Kind::kReset);
  EXPECT_EQ(bad[0].reason, "undecodable");
  EXPECT_FALSE(bad[0].error.empty());

  py.send("fixture unknown_event_type_map");
  ASSERT_TRUE(c.waitFor([](auto& u) { return !u.empty(); }));
  auto unknown = c.take();
  ASSERT_EQ(unknown[0].kind, KvUpdate::Kind::kBatch);
  EXPECT_EQ(unknown[0].batch.skipped_events, 1u);
  EXPECT_EQ(unknown[0].batch.events.size(), 2u);
  EXPECT_EQ(sub.stats().decode_errors.load(), 1u);
}

}  // namespace
}  // namespace kvf::router
