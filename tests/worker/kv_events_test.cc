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
  events.emplace_back(BlockStored{{11, 12}, std::nullopt, {1, 2, 3, 4}, 2});
  events.emplace_back(BlockStored{{13}, 12, {5, 6}, 2});
  events.emplace_back(BlockRemoved{{11}});
  events.emplace_back(AllBlocksCleared{});
  std::string buf = encodeEventBatch(1700000000.5, events);
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

TEST(KvEventsTest, SeqIsBigEndian) {
  EXPECT_EQ(encodeSeq(0x0102), std::string("\0\0\0\0\0\0\x01\x02", 8));
  EXPECT_EQ(decodeSeq(encodeSeq(123456789)), 123456789u);
  EXPECT_FALSE(decodeSeq("abc").has_value());
  EXPECT_EQ(encodeSeq(kReplayEndSeq), std::string(8, '\xff'));
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
  for (uint64_t i = 1; i <= 4; ++i) (*pub)->publish({BlockRemoved{{i}}}, 1.0);
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
  std::string start = encodeSeq(0);
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, start.data(), start.size(), 0);
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 10; ++i) {
    auto parts = recvParts(dealer);
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_TRUE(parts[0].empty());
    auto seq = decodeSeq(parts[1]);
    ASSERT_TRUE(seq.has_value());
    if (*seq == kReplayEndSeq) {
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

}  // namespace
}  // namespace kvf::worker
