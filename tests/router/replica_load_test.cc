// Router replicas' load exchange without sockets: the publisher's deltas and snapshots, the
// peer table's sequencing (gaps wait for a snapshot, restarts start over, silence drops a peer
// and its load, hostile figures are bounded), the routing core folding peers' load into what
// the policy sees, and the signed wire form refusing forged, truncated and oversized messages.
#include <gtest/gtest.h>

#include "router/core/config.h"
#include "router/core/peer_load.h"
#include "router/core/routing_core.h"
#include "router/replica_wire.h"

namespace kvf::router {
namespace {

constexpr Nanos kMs = kNanosPerMilli;

ReplicaMessage message(ReplicaMessage::Kind kind, std::string replica, uint64_t epoch, uint64_t seq,
                       std::vector<ReplicaLoadEntry> entries) {
  ReplicaMessage m;
  m.kind = kind;
  m.replica = std::move(replica);
  m.epoch = epoch;
  m.seq = seq;
  m.entries = std::move(entries);
  return m;
}

TEST(ReplicaLoadPublisherTest, DeltasCarryOnlyChangesAndSumToTheLoad) {
  ReplicaLoadPublisher pub("r0", 7);
  ReplicaMessage m;
  std::map<std::string, InFlightLoad> own{{"e0", {2, 100, 300}}, {"e1", {}}};
  pub.snapshot(own, 1, &m);
  EXPECT_EQ(m.kind, ReplicaMessage::Kind::kSnapshot);
  EXPECT_EQ(m.seq, 1u);
  ASSERT_EQ(m.entries.size(), 1u);      // idle instances are left out
  EXPECT_FALSE(pub.delta(own, 2, &m));  // nothing changed: nothing sent
  own["e0"] = {1, 0, 150};
  own["e1"] = {1, 50, 60};
  ASSERT_TRUE(pub.delta(own, 3, &m));
  EXPECT_EQ(m.seq, 2u);
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries[0].instance, "e0");
  EXPECT_EQ(m.entries[0].load, (InFlightLoad{-1, -100, -150}));
  EXPECT_EQ(m.entries[1].load, (InFlightLoad{1, 50, 60}));
  own.erase("e1");  // a removed instance's load goes back to zero
  ASSERT_TRUE(pub.delta(own, 4, &m));
  ASSERT_EQ(m.entries.size(), 1u);
  EXPECT_EQ(m.entries[0].load, (InFlightLoad{-1, -50, -60}));
}

TEST(PeerLoadTableTest, AppliesInSequenceAndResyncsAfterAGap) {
  PeerLoadTable table("r0", 500 * kMs);
  using K = ReplicaMessage::Kind;
  // A delta before any snapshot is not trusted.
  EXPECT_EQ(table.apply(message(K::kDelta, "r1", 1, 1, {{"e0", {1, 10, 20}}}), 0),
            PeerLoadTable::Outcome::kAwaitingResync);
  EXPECT_EQ(table.total("e0"), InFlightLoad{});
  EXPECT_EQ(table.apply(message(K::kSnapshot, "r1", 1, 2, {{"e0", {3, 30, 60}}}), 1),
            PeerLoadTable::Outcome::kApplied);
  EXPECT_EQ(table.apply(message(K::kDelta, "r1", 1, 3, {{"e0", {-1, -10, -20}}}), 2),
            PeerLoadTable::Outcome::kApplied);
  EXPECT_EQ(table.total("e0"), (InFlightLoad{2, 20, 40}));
  // A replayed message is ignored.
  EXPECT_EQ(table.apply(message(K::kDelta, "r1", 1, 3, {{"e0", {-1, -10, -20}}}), 3),
            PeerLoadTable::Outcome::kDuplicate);
  // Seq 4 lost: 5 is a gap; deltas wait for the next snapshot, the last figures stay.
  EXPECT_EQ(table.apply(message(K::kDelta, "r1", 1, 5, {{"e0", {5, 0, 0}}}), 4),
            PeerLoadTable::Outcome::kGap);
  EXPECT_EQ(table.gaps(), 1u);
  EXPECT_EQ(table.apply(message(K::kDelta, "r1", 1, 6, {{"e0", {5, 0, 0}}}), 5),
            PeerLoadTable::Outcome::kAwaitingResync);
  EXPECT_EQ(table.total("e0"), (InFlightLoad{2, 20, 40}));
  EXPECT_EQ(table.apply(message(K::kSnapshot, "r1", 1, 7, {{"e1", {1, 1, 1}}}), 6),
            PeerLoadTable::Outcome::kApplied);
  EXPECT_EQ(table.total("e0"), InFlightLoad{});  // the snapshot replaced everything
  EXPECT_EQ(table.total("e1"), (InFlightLoad{1, 1, 1}));
}

TEST(PeerLoadTableTest, SumsPeersDropsSilentOnesAndStartsOverOnRestart) {
  PeerLoadTable table("r0", 500 * kMs);
  using K = ReplicaMessage::Kind;
  EXPECT_EQ(table.apply(message(K::kSnapshot, "r0", 1, 1, {{"e0", {9, 9, 9}}}), 0),
            PeerLoadTable::Outcome::kSelf);
  table.apply(message(K::kSnapshot, "r1", 1, 1, {{"e0", {1, 10, 100}}}), 0);
  table.apply(message(K::kSnapshot, "r2", 1, 1, {{"e0", {2, 20, 200}}}), 400 * kMs);
  EXPECT_EQ(table.total("e0"), (InFlightLoad{3, 30, 300}));
  EXPECT_EQ(table.peersUp(), 2u);
  EXPECT_EQ(table.maxSilence(450 * kMs), 450 * kMs);
  // r1 silent past the timeout: dropped with its load, not frozen.
  EXPECT_EQ(table.expire(501 * kMs), 1u);
  EXPECT_EQ(table.total("e0"), (InFlightLoad{2, 20, 200}));
  // r2 restarted (new epoch): its old load died with it; it waits for a snapshot.
  EXPECT_EQ(table.apply(message(K::kDelta, "r2", 2, 1, {{"e0", {1, 0, 0}}}), 600 * kMs),
            PeerLoadTable::Outcome::kAwaitingResync);
  EXPECT_EQ(table.total("e0"), InFlightLoad{});
}

TEST(PeerLoadTableTest, BoundsWhatAHostilePeerCanDo) {
  PeerLoadLimits limits;
  limits.max_peers = 2;
  limits.max_instances = 2;
  limits.max_running = 100;
  PeerLoadTable table("r0", 500 * kMs, limits);
  using K = ReplicaMessage::Kind;
  EXPECT_EQ(table.apply(message(K::kSnapshot, "a", 1, 1, {{"e0", {1 << 30, -5, 0}}}), 0),
            PeerLoadTable::Outcome::kApplied);
  EXPECT_EQ(table.total("e0"), (InFlightLoad{100, 0, 0}));  // clamped to [0, max]
  EXPECT_EQ(table.apply(message(K::kSnapshot, "b", 1, 1,
                                {{"x", {1, 1, 1}}, {"y", {1, 1, 1}}, {"z", {1, 1, 1}}}),
                        0),
            PeerLoadTable::Outcome::kTooLarge);
  table.apply(message(K::kSnapshot, "b", 1, 1, {}), 0);
  EXPECT_EQ(table.apply(message(K::kSnapshot, "c", 1, 1, {}), 0),
            PeerLoadTable::Outcome::kTooManyPeers);
}

TEST(RoutingCorePeerLoadTest, PolicySeesOwnPlusPeersLoad) {
  RouterConfig config;
  config.policy.kind = "least_request";
  auto core = RoutingCore::create(config);
  ASSERT_TRUE(core.ok()) << core.status();
  (*core)->addInstance(0, "e0", false, true);
  (*core)->addInstance(1, "e1", false, true);
  // Peers have three requests on e0: a new one goes to e1 although this replica has none.
  (*core)->setPeerLoad(0, {3, 0, 0});
  RequestRoute route;
  route.prompt_tokens = 10;
  route.hashes_complete = true;
  ASSERT_TRUE((*core)->decide(route, 0));
  EXPECT_EQ(route.instance(), 1);
  // What this replica publishes is its own load only.
  EXPECT_EQ((*core)->ownLoad(1).running, 1);
  EXPECT_EQ((*core)->ownLoad(0).running, 0);
  (*core)->removeInstance(0);
  EXPECT_EQ((*core)->instance(0).peers, InFlightLoad{});
}

TEST(ReplicaWireTest, RoundTripsSignedMessages) {
  const std::string key = replicaLoadKey("cluster-token");
  ASSERT_EQ(key.size(), 32u);
  ReplicaMessage m = message(ReplicaMessage::Kind::kDelta, "r1", 42, 9,
                             {{"e0", {-1, -2048, 7}}, {"e1", {3, 0, 1 << 20}}});
  m.sent_unix_ns = 1'700'000'000'000'000'000;
  const std::string payload = encodeReplicaMessage(m);
  auto back = decodeReplicaMessage(key, payload, signReplicaPayload(key, payload));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->replica, "r1");
  EXPECT_EQ(back->epoch, 42u);
  EXPECT_EQ(back->seq, 9u);
  EXPECT_EQ(back->sent_unix_ns, m.sent_unix_ns);
  ASSERT_EQ(back->entries.size(), 2u);
  EXPECT_EQ(back->entries[0].load, (InFlightLoad{-1, -2048, 7}));
  EXPECT_EQ(back->entries[1].instance, "e1");
}

TEST(ReplicaWireTest, RefusesForgedTruncatedAndOversizedMessages) {
  const std::string key = replicaLoadKey("cluster-token");
  ReplicaMessage m = message(ReplicaMessage::Kind::kSnapshot, "r1", 1, 1, {{"e0", {1, 2, 3}}});
  std::string payload = encodeReplicaMessage(m);
  // Signed with another token, or altered after signing.
  const std::string other = replicaLoadKey("other-token");
  EXPECT_EQ(decodeReplicaMessage(key, payload, signReplicaPayload(other, payload)).status().code(),
            absl::StatusCode::kPermissionDenied);
  std::string altered = payload;
  altered.back() = static_cast<char>(altered.back() ^ 1);
  EXPECT_EQ(decodeReplicaMessage(key, altered, signReplicaPayload(key, payload)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(decodeReplicaMessage("", payload, signReplicaPayload("", payload)).ok());
  // Every truncation, correctly signed (a peer holding the key but sending garbage).
  for (size_t n = 0; n < payload.size(); ++n) {
    std::string cut = payload.substr(0, n);
    EXPECT_EQ(decodeReplicaMessage(key, cut, signReplicaPayload(key, cut)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << n;
  }
  // More entries than the limit.
  ReplicaWireLimits limits;
  limits.max_entries = 1;
  m.entries.push_back({"e1", {1, 1, 1}});
  payload = encodeReplicaMessage(m);
  auto big = decodeReplicaMessage(key, payload, signReplicaPayload(key, payload), limits);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("entries"), std::string_view::npos);
}

TEST(ReplicasConfigTest, ParsesAndValidatesTheBlock) {
  constexpr std::string_view kInstances = "instances: [{id: e0, url: 'http://127.0.0.1:8100'}]\n";
  auto config = parseRouterConfig(
      std::string(kInstances) +
          "replicas: {id: r0, publish: 'tcp://127.0.0.1:7600', peers: ['tcp://127.0.0.1:7601'],"
          " sync_interval_ms: 2, peer_timeout_ms: 300}\n",
      "<test>");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->replicas.enabled());
  EXPECT_EQ(config->replicas.sync_interval, 2 * kMs);
  EXPECT_EQ(config->replicas.snapshot_interval, 100 * kMs);
  EXPECT_EQ(config->replicas.peer_timeout, 300 * kMs);
  EXPECT_FALSE(parseRouterConfig(kInstances, "<test>")->replicas.enabled());  // off by default
  // A timeout no longer than the snapshot interval would drop live peers; unknown keys, a
  // peer equal to our own endpoint and a missing publish are refused, each by field.
  auto bad = parseRouterConfig(
      std::string(kInstances) +
          "replicas: {id: r0, peers: ['tcp://a:1', 'tcp://a:1'], peer_timeout_ms: 100, x: 1}\n",
      "<test>");
  ASSERT_FALSE(bad.ok());
  const std::string message(bad.status().message());
  EXPECT_NE(message.find("replicas.publish"), std::string::npos) << message;
  EXPECT_NE(message.find("replicas.peers"), std::string::npos) << message;
  EXPECT_NE(message.find("replicas.peer_timeout_ms"), std::string::npos) << message;
  EXPECT_NE(message.find("x"), std::string::npos) << message;
}

}  // namespace
}  // namespace kvf::router
