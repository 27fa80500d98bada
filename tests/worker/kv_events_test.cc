#include <gtest/gtest.h>
#include <msgpuck.h>
#include <zmq.h>

#include <chrono>
#include <string>
#include <thread>

#include "worker/kv_event_publisher.h"
#include "worker/kv_events.h"

namespace kvf::worker {
namespace {

std::string decodeStr(const char** p) {
  uint32_t len = 0;
  const char* s = mp_decode_str(p, &len);
  return std::string(s, len);
}

TEST(KvEventsTest, EncodesVllmEventBatchLayout) {
  std::vector<KvEvent> events;
  events.emplace_back(BlockStored{{BlockHash(11), BlockHash(12)}, std::nullopt, {1, 2, 3, 4}, 2});
  events.emplace_back(BlockStored{{BlockHash(13)}, BlockHash(12), {5, 6}, 2});
  events.emplace_back(BlockRemoved{{BlockHash(11)}});
  events.emplace_back(AllBlocksCleared{});
  std::string buf = protocol::encodeEventBatch({1700000000.5, events});
  const char* p = buf.data();
  ASSERT_EQ(mp_typeof(*p), MP_ARRAY);
  EXPECT_EQ(mp_decode_array(&p), 2u);
  ASSERT_EQ(mp_typeof(*p), MP_DOUBLE);
  EXPECT_DOUBLE_EQ(mp_decode_double(&p), 1700000000.5);
  EXPECT_EQ(mp_decode_array(&p), 4u);
  // ["BlockStored", [11, 12], nil, [1, 2, 3, 4], 2, nil, "GPU"]
  EXPECT_EQ(mp_decode_array(&p), 7u);
  EXPECT_EQ(decodeStr(&p), "BlockStored");
  EXPECT_EQ(mp_decode_array(&p), 2u);
  EXPECT_EQ(mp_decode_uint(&p), 11u);
  EXPECT_EQ(mp_decode_uint(&p), 12u);
  EXPECT_EQ(mp_typeof(*p), MP_NIL);
  mp_decode_nil(&p);
  EXPECT_EQ(mp_decode_array(&p), 4u);
  for (uint64_t t = 1; t <= 4; ++t) EXPECT_EQ(mp_decode_uint(&p), t);
  EXPECT_EQ(mp_decode_uint(&p), 2u);
  mp_decode_nil(&p);
  EXPECT_EQ(decodeStr(&p), "GPU");
  // second BlockStored has a parent
  EXPECT_EQ(mp_decode_array(&p), 7u);
  EXPECT_EQ(decodeStr(&p), "BlockStored");
  EXPECT_EQ(mp_decode_array(&p), 1u);
  EXPECT_EQ(mp_decode_uint(&p), 13u);
  EXPECT_EQ(mp_decode_uint(&p), 12u);
  mp_next(&p);
  mp_next(&p);
  mp_next(&p);
  mp_next(&p);
  EXPECT_EQ(mp_decode_array(&p), 3u);
  EXPECT_EQ(decodeStr(&p), "BlockRemoved");
  EXPECT_EQ(mp_decode_array(&p), 1u);
  EXPECT_EQ(mp_decode_uint(&p), 11u);
  EXPECT_EQ(decodeStr(&p), "GPU");
  EXPECT_EQ(mp_decode_array(&p), 1u);
  EXPECT_EQ(decodeStr(&p), "AllBlocksCleared");
  EXPECT_EQ(p, buf.data() + buf.size());
}

std::vector<std::string> recvParts(void* socket) {
  std::vector<std::string> parts;
  int more = 1;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) {
      zmq_msg_close(&msg);
      break;
    }
    parts.emplace_back(static_cast<char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  return parts;
}

TEST(KvEventPublisherTest, ReplayReturnsBufferedBatchesThenEndMarker) {
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.buffer_batches = 3;
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status();
  for (uint64_t i = 1; i <= 4; ++i) (*pub)->publish({BlockRemoved{{BlockHash(i)}}}, 1.0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*pub)->publishedBatches() < 5 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ((*pub)->publishedBatches(), 5u);  // seq 0 is AllBlocksCleared

  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  int timeout_ms = 10000, linger = 0;
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof(linger));
  ASSERT_EQ(zmq_connect(dealer, (*pub)->replayEndpoint().c_str()), 0);
  std::string start = protocol::encodeSeq(0);
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, start.data(), start.size(), 0);
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 10; ++i) {
    auto parts = recvParts(dealer);
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_TRUE(parts[0].empty());
    auto seq = protocol::decodeSeq(parts[1]);
    ASSERT_TRUE(seq.has_value());
    if (*seq == protocol::kReplayEndSeq) {
      EXPECT_TRUE(parts[2].empty());
      break;
    }
    seqs.push_back(*seq);
  }
  // Buffer of 3: seq 0 and 1 fell out.
  EXPECT_EQ(seqs, (std::vector<uint64_t>{2, 3, 4}));
  zmq_close(dealer);
  zmq_ctx_term(ctx);
  EXPECT_EQ((*pub)->replayRequests(), 1u);
}

TEST(KvEventPublisherTest, ReqClientGetsTheFirstReplayedBatchAndJunkIsIgnored) {
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status();
  void* ctx = zmq_ctx_new();
  int timeout_ms = 10000, linger = 0;
  // A malformed request (wrong frame count / size) gets no answer and does not kill the server.
  void* junk = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(junk, ZMQ_LINGER, &linger, sizeof(linger));
  ASSERT_EQ(zmq_connect(junk, (*pub)->replayEndpoint().c_str()), 0);
  zmq_send(junk, "abc", 3, 0);
  void* req = zmq_socket(ctx, ZMQ_REQ);
  zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
  zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof(linger));
  ASSERT_EQ(zmq_connect(req, (*pub)->replayEndpoint().c_str()), 0);
  std::string start = protocol::encodeSeq(0);
  zmq_send(req, start.data(), start.size(), 0);
  auto parts = recvParts(req);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(protocol::decodeSeq(parts[0]), std::optional<uint64_t>(0));
  // seq 0 is [AllBlocksCleared]
  const char* p = parts[1].data();
  EXPECT_EQ(mp_decode_array(&p), 2u);
  mp_decode_double(&p);
  EXPECT_EQ(mp_decode_array(&p), 1u);
  EXPECT_EQ(mp_decode_array(&p), 1u);
  EXPECT_EQ(decodeStr(&p), "AllBlocksCleared");
  zmq_close(req);
  zmq_close(junk);
  zmq_ctx_term(ctx);
  EXPECT_EQ((*pub)->replayRequests(), 1u);
}

}  // namespace
}  // namespace kvf::worker
