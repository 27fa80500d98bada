#include "tests/fakes/fake_kv_publisher.h"

#include <msgpuck.h>

namespace kvf::fakes {
namespace {

class Encoder {
 public:
  void array(uint32_t n) { grow(5), end_ = mp_encode_array(end_, n), commit(); }
  void map(uint32_t n) { grow(5), end_ = mp_encode_map(end_, n), commit(); }
  void uint(uint64_t v) { grow(9), end_ = mp_encode_uint(end_, v), commit(); }
  void dbl(double v) { grow(9), end_ = mp_encode_double(end_, v), commit(); }
  void nil() { grow(1), end_ = mp_encode_nil(end_), commit(); }
  void str(std::string_view s) {
    grow(5 + s.size()), end_ = mp_encode_str(end_, s.data(), static_cast<uint32_t>(s.size())),
                        commit();
  }
  void bin(std::string_view s) {
    grow(5 + s.size()), end_ = mp_encode_bin(end_, s.data(), static_cast<uint32_t>(s.size())),
                        commit();
  }
  std::string take() { return std::move(out_); }

 private:
  void grow(size_t n) {
    size_t used = out_.size();
    out_.resize(used + n);
    end_ = out_.data() + used;
  }
  void commit() { out_.resize(static_cast<size_t>(end_ - out_.data())); }

  std::string out_;
  char* end_ = nullptr;
};

void hash(Encoder& e, uint64_t h, bool bytes) {
  if (!bytes) return e.uint(h);
  std::string b(32, '\0');
  for (int i = 0; i < 8; ++i) b[24 + i] = static_cast<char>((h >> (8 * (7 - i))) & 0xff);
  e.bin(b);
}

void event(Encoder& e, const FakeKvEvent& ev, const EncodeOptions& o) {
  auto hashes = [&] {
    e.array(static_cast<uint32_t>(ev.hashes.size()));
    for (uint64_t h : ev.hashes) hash(e, h, o.bytes_hashes);
  };
  auto parent = [&] { ev.parent ? hash(e, *ev.parent, o.bytes_hashes) : e.nil(); };
  auto tokens = [&] {
    e.array(static_cast<uint32_t>(ev.token_ids.size()));
    for (uint32_t t : ev.token_ids) e.uint(t);
  };
  switch (ev.kind) {
    case FakeKvEvent::Kind::kStored:
      if (o.map_events) {
        e.map(7), e.str("type"), e.str("BlockStored"), e.str("block_hashes"), hashes();
        e.str("parent_block_hash"), parent(), e.str("token_ids"), tokens();
        e.str("block_size"), e.uint(ev.block_size), e.str("lora_id"), e.nil();
        e.str("medium"), e.str("GPU");
      } else {
        e.array(7), e.str("BlockStored"), hashes(), parent(), tokens(), e.uint(ev.block_size);
        e.nil(), e.str("GPU");
      }
      break;
    case FakeKvEvent::Kind::kRemoved:
      if (o.map_events) {
        e.map(3), e.str("type"), e.str("BlockRemoved"), e.str("block_hashes"), hashes();
        e.str("medium"), e.str("GPU");
      } else {
        e.array(3), e.str("BlockRemoved"), hashes(), e.str("GPU");
      }
      break;
    case FakeKvEvent::Kind::kCleared:
      if (o.map_events) {
        e.map(1), e.str("type"), e.str("AllBlocksCleared");
      } else {
        e.array(1), e.str("AllBlocksCleared");
      }
      break;
  }
}

std::string seqFrame(uint64_t seq) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) out[i] = static_cast<char>(seq & 0xff);
  return out;
}

}  // namespace

std::string encodeBatch(const std::vector<FakeKvEvent>& events, const EncodeOptions& options,
                        double ts) {
  Encoder e;
  e.array(3);
  e.dbl(ts);
  e.array(static_cast<uint32_t>(events.size()));
  for (const auto& ev : events) event(e, ev, options);
  e.nil();
  return e.take();
}

FakeKvPublisher::FakeKvPublisher(std::string topic)
    : topic_(std::move(topic)),
      pub_(context_, zmq::socket_type::pub),
      router_(context_, zmq::socket_type::router) {
  pub_.set(zmq::sockopt::linger, 0);
  pub_.bind("tcp://127.0.0.1:*");
  pub_endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
  router_.set(zmq::sockopt::linger, 0);
  router_.bind("tcp://127.0.0.1:*");
  replay_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  replay_thread_ = std::thread([this] { serveReplay(); });
}

FakeKvPublisher::~FakeKvPublisher() {
  stop_ = true;
  replay_thread_.join();
}

uint64_t FakeKvPublisher::publish(const std::vector<FakeKvEvent>& events, bool drop) {
  std::lock_guard lock(mu_);
  uint64_t seq = next_seq_++;
  std::string payload = encodeBatch(events, options, 1.0);
  buffer_[seq] = payload;
  if (!drop) {
    std::string seq_bytes = seqFrame(seq);
    pub_.send(zmq::buffer(topic_), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(payload), zmq::send_flags::none);
  }
  return seq;
}

void FakeKvPublisher::restart() {
  std::lock_guard lock(mu_);
  next_seq_ = 0;
  buffer_.clear();
}

void FakeKvPublisher::serveReplay() {
  while (!stop_) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(20));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> parts;
    for (;;) {
      zmq::message_t m;
      if (!router_.recv(m, zmq::recv_flags::dontwait)) break;
      bool more = m.more();
      parts.push_back(std::move(m));
      if (!more) break;
    }
    if (parts.size() != 3 || parts[2].size() != 8) continue;
    uint64_t start = 0;
    for (size_t i = 0; i < 8; ++i)
      start = (start << 8) | static_cast<const uint8_t*>(parts[2].data())[i];
    std::string identity(static_cast<const char*>(parts[0].data()), parts[0].size());
    std::lock_guard lock(mu_);
    auto send = [&](uint64_t seq, const std::string& payload) {
      std::string seq_bytes = seqFrame(seq);
      router_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      router_.send(zmq::message_t(), zmq::send_flags::sndmore);
      router_.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      router_.send(zmq::buffer(payload), zmq::send_flags::none);
    };
    for (auto it = buffer_.lower_bound(start); it != buffer_.end(); ++it)
      send(it->first, it->second);
    send(~uint64_t{0}, "");
  }
}

}  // namespace kvf::fakes
