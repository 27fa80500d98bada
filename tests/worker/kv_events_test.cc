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

// Waits (up to 10 s) until `pub` has published `n` batches (seq 0, AllBlocksCleared, included).
bool waitPublished(const KvEventPublisher& pub, uint64_t n) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pub.publishedBatches() < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pub.publishedBatches() == n;
}

// Asks the replay socket for every batch from `start`; returns the replayed seqs (the end
// marker excluded), or fails the test on a malformed answer.
std::vector<uint64_t> replaySeqs(const std::string& endpoint, uint64_t start) {
  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  int timeout_ms = 10000, linger = 0;
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof(linger));
  EXPECT_EQ(zmq_connect(dealer, endpoint.c_str()), 0);
  std::string start_bytes = protocol::encodeSeq(start);
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, start_bytes.data(), start_bytes.size(), 0);
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 1000; ++i) {
    auto parts = recvParts(dealer);
    if (parts.size() != 3u) {
      ADD_FAILURE() << "replay answer of " << parts.size() << " frames";
      break;
    }
    EXPECT_TRUE(parts[0].empty());
    auto seq = protocol::decodeSeq(parts[1]);
    if (!seq.has_value()) {
      ADD_FAILURE() << "replay answer without a seq";
      break;
    }
    if (*seq == protocol::kReplayEndSeq) {
      EXPECT_TRUE(parts[2].empty());
      break;
    }
    seqs.push_back(*seq);
  }
  zmq_close(dealer);
  zmq_ctx_term(ctx);
  return seqs;
}

TEST(KvEventPublisherTest, ReplayReturnsBufferedBatchesThenEndMarker) {
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.buffer_batches = 3;
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status();
  for (uint64_t i = 1; i <= 4; ++i) (*pub)->publish({BlockRemoved{{BlockHash(i)}}}, 1.0);
  ASSERT_TRUE(waitPublished(**pub, 5));  // seq 0 is AllBlocksCleared
  // Buffer of 3: seq 0 and 1 fell out; the batch bound's rotation is not counted as trimming.
  EXPECT_EQ(replaySeqs((*pub)->replayEndpoint(), 0), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ((*pub)->replayRequests(), 1u);
  EXPECT_EQ((*pub)->replayTrimmedBatches(), 0u);
}

TEST(KvEventPublisherTest, ReplayBufferIsBoundedByBytesAndCountsWhatItTrims) {
  // Batches of one BlockStored with 1024 tokens: each encodes to a few KB (tokens >= 65536
  // take 5 bytes in msgpack), so a 12 KB bound keeps only the newest few.
  auto stored = [](uint64_t i) {
    std::vector<uint32_t> tokens(1024);
    for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint32_t>(100000 + t + i);
    return BlockStored{{BlockHash(i)}, std::nullopt, std::move(tokens), 1024};
  };
  const size_t batch_bytes = protocol::encodeEventBatch({1.0, {stored(1)}}).size();
  ASSERT_GT(batch_bytes, 4000u);
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.buffer_batches = 1000;           // far away: only the byte bound trims
  o.buffer_bytes = 3 * batch_bytes;  // the three newest fit, not a fourth
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status();
  for (uint64_t i = 1; i <= 10; ++i) (*pub)->publish({stored(i)}, 1.0);
  ASSERT_TRUE(waitPublished(**pub, 11));
  EXPECT_EQ(replaySeqs((*pub)->replayEndpoint(), 0), (std::vector<uint64_t>{8, 9, 10}));
  // Trimmed: seq 0 (AllBlocksCleared, a few bytes) and seqs 1..7.
  EXPECT_EQ((*pub)->replayTrimmedBatches(), 8u);
  EXPECT_GE((*pub)->replayTrimmedBytes(), 7 * batch_bytes);
  EXPECT_LT((*pub)->replayTrimmedBytes(), 8 * batch_bytes);
  EXPECT_EQ((*pub)->replayBufferBytes(), 3 * batch_bytes);

  // A batch larger than the bound on its own is still kept (the newest always is).
  PublisherOptions tiny = o;
  tiny.buffer_bytes = 16;
  auto small = KvEventPublisher::create(tiny);
  ASSERT_TRUE(small.ok()) << small.status();
  (*small)->publish({stored(1)}, 1.0);
  ASSERT_TRUE(waitPublished(**small, 2));
  EXPECT_EQ(replaySeqs((*small)->replayEndpoint(), 0), (std::vector<uint64_t>{1}));

  PublisherOptions zero = o;
  zero.buffer_bytes = 0;
  EXPECT_FALSE(KvEventPublisher::create(zero).ok());
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
