#include "tests/fakes/fake_engine.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include <optional>

#include "absl/container/flat_hash_map.h"
#include "common/json.h"

// GCC 12 reports a false -Wmismatched-new-delete on Asio's coroutine frame deallocation for
// the completion handler below (the frame is allocated and freed by Asio's own operators).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace kvf::fakes {
namespace {

namespace bj = boost::json;

// The engine's own block hash (deliberately unlike the router's): FNV-1a over the parent and
// the block's tokens, so the router must map it through token ids.
uint64_t engineHash(uint64_t parent, const uint32_t* tokens, size_t n) {
  uint64_t h = 1469598103934665603ULL ^ parent;
  for (size_t i = 0; i < n; ++i) {
    h ^= tokens[i];
    h *= 1099511628211ULL;
  }
  return h | 1;  // never 0
}

// Text is "tokenized" into one token per `bytes_per_token` bytes (the bytes' FNV hash); chat
// turns' contents are concatenated.
std::vector<uint32_t> promptTokens(bool chat, const bj::object& body, int bytes_per_token) {
  std::vector<uint32_t> tokens;
  auto addText = [&](std::string_view s) {
    const size_t n = static_cast<size_t>(std::max(1, bytes_per_token));
    for (size_t i = 0; i < s.size(); i += n) {
      if (n == 1) {
        tokens.push_back(static_cast<unsigned char>(s[i]));
        continue;
      }
      uint32_t h = 2166136261u;
      for (unsigned char c : s.substr(i, n)) h = (h ^ c) * 16777619u;
      tokens.push_back(h % 100000);
    }
  };
  if (chat) {
    if (const auto* m = body.if_contains("messages"); m && m->is_array()) {
      for (const auto& msg : m->as_array()) {
        if (!msg.is_object()) continue;
        if (const auto* c = msg.as_object().if_contains("content"); c && c->is_string()) {
          addText(c->as_string());
        }
      }
    }
    return tokens;
  }
  const auto* p = body.if_contains("prompt");
  if (p && p->is_string()) addText(p->as_string());
  if (p && p->is_array()) {
    for (const auto& t : p->as_array()) {
      if (t.is_int64()) tokens.push_back(static_cast<uint32_t>(t.as_int64()));
    }
  }
  return tokens;
}

// In-process engines by worker URL, so a receiver can see what its source holds (every fake of
// one test process runs on the same io thread). Engines in other processes are not found.
std::mutex registry_mutex;
absl::flat_hash_map<std::string, FakeEngine*>& registry() {
  static auto* engines = new absl::flat_hash_map<std::string, FakeEngine*>();
  return *engines;
}

}  // namespace

FakeEngine::FakeEngine(asio::io_context& ioc, FakeEngineOptions options)
    : options_(std::move(options)) {
  http::ServerOptions server_options;
  server_options.port = options_.port;
  auto server = http::HttpServer::create(ioc, server_options);
  if (!server.ok()) throw std::runtime_error(std::string(server.status().message()));
  server_ = std::move(*server);
  if (options_.publish_kv_events) publisher_ = std::make_unique<FakeKvPublisher>();
  server_->route(
      "POST", "/v1/completions",
      [this](const http::Request& r, http::ResponseWriter& w) { return completion(false, r, w); });
  server_->route(
      "POST", "/v1/chat/completions",
      [this](const http::Request& r, http::ResponseWriter& w) { return completion(true, r, w); });
  server_->route("POST", "/tokenize",
                 [this](const http::Request& r, http::ResponseWriter& w) -> asio::awaitable<void> {
                   if (tokenize_fails.load()) {
                     co_await w.sendError(500, "tokenizer error (fake)");
                     co_return;
                   }
                   auto body = json::parseObject(r.body);
                   if (!body.ok()) {
                     co_await w.sendStatus(body.status());
                     co_return;
                   }
                   bool chat = body->contains("messages");
                   std::vector<uint32_t> tokens =
                       promptTokens(chat, *body, options_.text_bytes_per_token);
                   bj::object out{{"count", tokens.size()}, {"max_model_len", 131072}};
                   bj::array list;
                   for (uint32_t t : tokens) list.push_back(t);
                   out["tokens"] = std::move(list);
                   std::string text = bj::serialize(out);
                   co_await w.sendJson(200, std::move(text));
                 });
  server_->route("GET", "/health",
                 [this](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                   int status = healthy.load() ? 200 : 503;
                   co_await w.send(status, "text/plain", "");
                 });
  server_->route(
      "GET", "/v1/models",
      [this](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
        std::string body =
            R"({"object":"list","data":[{"id":"fake-model","object":"model","owned_by":")" +
            options_.id + R"("}]})";
        co_await w.sendJson(200, std::move(body));
      });
  server_->route("GET", "/metrics",
                 [this](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                   std::string body =
                       "# TYPE vllm:num_requests_waiting gauge\n"
                       "vllm:num_requests_waiting{model_name=\"fake-model\"} 3\n"
                       "vllm:kv_cache_usage_perc{model_name=\"fake-model\"} 0.25\n"
                       "vllm:num_requests_running{model_name=\"fake-model\"} " +
                       std::to_string(running.load()) + "\n";
                   co_await w.send(200, "text/plain; version=0.0.4", std::move(body));
                 });
  server_->start();
  std::lock_guard lock(registry_mutex);
  registry()[workerUrl()] = this;
}

FakeEngine::~FakeEngine() {
  {
    std::lock_guard lock(registry_mutex);
    registry().erase(workerUrl());
  }
  stop();
}

bool FakeEngine::holds(uint64_t hash) const { return cached_.contains(hash); }

void FakeEngine::stop() {
  if (server_) server_->stop();
}

std::string FakeEngine::workerUrl() const {
  return options_.worker_url.empty() ? url() : options_.worker_url;
}

std::vector<std::string> FakeEngine::receivedBodies() const {
  std::lock_guard lock(bodies_mutex_);
  return bodies_;
}

std::vector<uint64_t> FakeEngine::blockHashes(const std::vector<uint32_t>& tokens) const {
  std::vector<uint64_t> out;
  uint64_t parent = 0;
  for (size_t b = 0; b < tokens.size() / options_.block_size; ++b) {
    parent = engineHash(parent, tokens.data() + b * options_.block_size, options_.block_size);
    out.push_back(parent);
  }
  return out;
}

int64_t FakeEngine::simulatePush(const bj::object& params, const std::vector<uint32_t>& tokens,
                                 int64_t local, bj::object* result) {
  std::vector<uint64_t> prompt = blockHashes(tokens);
  // The blocks wanted: block_hashes if given, else the receiver's own prompt blocks.
  std::optional<absl::flat_hash_set<uint64_t>> offered;
  if (const auto* h = params.if_contains("block_hashes"); h && h->is_array()) {
    offered.emplace();
    for (const auto& v : h->as_array()) {
      if (v.is_uint64()) offered->insert(v.as_uint64());
      if (v.is_int64()) offered->insert(static_cast<uint64_t>(v.as_int64()));
    }
  }
  std::string source;
  if (const auto* s = params.if_contains("source"); s && s->is_string()) source = s->as_string();
  const FakeEngine* holder = nullptr;
  {
    std::lock_guard lock(registry_mutex);
    auto it = registry().find(source);
    if (it != registry().end()) holder = it->second;
  }
  std::string failure = remote_kv_fails.load()       ? "source unreachable (fake)"
                        : holder == nullptr          ? "unknown source " + source
                        : holder->refuse_push.load() ? "source refused the push (fake)"
                                                     : "";
  size_t run = 0;  // the leading run of wanted blocks that the source holds
  while (failure.empty() && run < prompt.size() && (!offered || offered->contains(prompt[run])) &&
         holder->holds(prompt[run])) {
    ++run;
  }
  int64_t pushed = std::max<int64_t>(0, static_cast<int64_t>(run * options_.block_size) - local);
  (*result)["status"] = failure.empty() ? "ok" : "fallback";
  (*result)["pushed_tokens"] = pushed;
  (*result)["pushed_bytes"] = pushed * 1024;
  if (!failure.empty()) (*result)["reason"] = failure;
  return pushed;
}

int64_t FakeEngine::cacheLookupAndInsert(const std::vector<uint32_t>& tokens) {
  size_t bs = options_.block_size;
  size_t blocks = tokens.size() / bs;
  int64_t cached = 0;
  bool prefix = true;
  uint64_t parent = 0;
  FakeKvEvent stored;
  stored.block_size = options_.block_size;
  std::vector<uint64_t> evicted;
  for (size_t b = 0; b < blocks; ++b) {
    uint64_t h = engineHash(parent, tokens.data() + b * bs, bs);
    if (prefix && cached_.contains(h)) {
      cached += static_cast<int64_t>(bs);
    } else {
      prefix = false;
      if (cached_.insert(h).second) {
        if (stored.hashes.empty() && b > 0) stored.parent = parent;
        stored.hashes.push_back(h);
        stored.token_ids.insert(stored.token_ids.end(), tokens.begin() + b * bs,
                                tokens.begin() + (b + 1) * bs);
        fifo_.push_back(h);
      }
    }
    parent = h;
  }
  while (fifo_.size() > options_.capacity_blocks) {
    evicted.push_back(fifo_.front());
    cached_.erase(fifo_.front());
    fifo_.pop_front();
  }
  if (publisher_ && (!stored.hashes.empty() || !evicted.empty())) {
    std::vector<FakeKvEvent> events;
    if (!stored.hashes.empty()) events.push_back(stored);
    if (!evicted.empty()) {
      FakeKvEvent removed;
      removed.kind = FakeKvEvent::Kind::kRemoved;
      removed.hashes = evicted;
      events.push_back(removed);
    }
    publisher_->publish(events);
  }
  return cached;
}

void FakeEngine::clearCache() {
  cached_.clear();
  fifo_.clear();
  if (publisher_) {
    FakeKvEvent cleared;
    cleared.kind = FakeKvEvent::Kind::kCleared;
    publisher_->publish({cleared});
  }
}

asio::awaitable<void> FakeEngine::completion(bool chat, const http::Request& r,
                                             http::ResponseWriter& w) {
  ++requests;
  auto body = json::parseObject(r.body);
  if (!body.ok()) {
    co_await w.sendStatus(body.status());
    co_return;
  }
  {
    std::lock_guard lock(bodies_mutex_);
    bodies_.push_back(r.body);
  }
  if (int status = fail_status.load(); status != 0) {
    co_await w.sendError(status, "engine error (fake)");
    co_return;
  }
  if (int ms = first_byte_delay_ms.load(); ms > 0) {
    asio::steady_timer prefill(co_await asio::this_coro::executor);
    prefill.expires_after(std::chrono::milliseconds(ms));
    w.watchClientGone([&prefill] { prefill.cancel(); });
    ++waiting_first_byte;
    co_await prefill.async_wait(asio::as_tuple(asio::use_awaitable));
    --waiting_first_byte;
    if (w.clientGone()) {
      ++abandoned;
      co_return;
    }
  }
  if (int ms = stall_ms.load(); ms > 0) {
    auto begun = co_await w.beginStream(200, "text/event-stream");
    if (!begun.ok()) co_return;
    asio::steady_timer hang(co_await asio::this_coro::executor);
    hang.expires_after(std::chrono::milliseconds(ms));
    co_await hang.async_wait(asio::as_tuple(asio::use_awaitable));
    co_return;  // no event, no end: the connection closes with the handler
  }
  std::vector<uint32_t> tokens = promptTokens(chat, *body, options_.text_bytes_per_token);
  int64_t cached = cacheLookupAndInsert(tokens);
  bj::object transfer;
  bool remote_decode = false;
  if (const auto* p = body->if_contains("kv_transfer_params"); p && p->is_object()) {
    const bj::object& params = p->as_object();
    if (const auto* d = params.if_contains("do_remote_decode"); d && d->is_bool()) {
      remote_decode = d->as_bool();
    }
    if (const auto* src = params.if_contains("source"); src && src->is_string()) {
      cached += simulatePush(params, tokens, cached, &transfer);
    }
  }
  // As vLLM: the last prompt token is always computed, so a fully cached block-aligned prompt
  // reports one block less.
  int64_t bs = options_.block_size;
  cached = std::min<int64_t>(cached, std::max<int64_t>(0, std::ssize(tokens) - 1) / bs * bs);
  bool stream = false;
  if (const auto* s = body->if_contains("stream"); s && s->is_bool()) stream = s->as_bool();
  int64_t max_tokens = 16;
  if (const auto* m = body->if_contains("max_tokens"); m && m->is_int64())
    max_tokens = m->as_int64();
  int n = static_cast<int>(std::min<int64_t>(options_.output_tokens, max_tokens));
  bj::object usage;
  usage["prompt_tokens"] = tokens.size();
  usage["completion_tokens"] = n;
  usage["total_tokens"] = tokens.size() + static_cast<size_t>(n);
  usage["prompt_tokens_details"] = bj::object{{"cached_tokens", cached}};
  std::string object = chat ? "chat.completion" : "text_completion";
  std::string served_by = options_.id;
  if (remote_decode) {
    asio::steady_timer delay(co_await asio::this_coro::executor);
    delay.expires_after(std::chrono::milliseconds(remote_decode_delay_ms.load()));
    co_await delay.async_wait(asio::as_tuple(asio::use_awaitable));
    if (remote_decode_status.load() != 200) {
      co_await w.sendError(remote_decode_status.load(), "remote decode refused (fake)");
      co_return;
    }
  }
  if (!stream || remote_decode) {
    bj::object out{{"id", "cmpl-fake"}, {"object", object}, {"model", "fake-model"}};
    bj::object choice{{"index", 0}, {"finish_reason", "length"}};
    if (chat) {
      choice["message"] = bj::object{{"role", "assistant"}, {"content", "ok from " + served_by}};
    } else {
      choice["text"] = "ok from " + served_by;
    }
    out["choices"] = bj::array{choice};
    out["usage"] = usage;
    if (!transfer.empty()) out["kv_transfer_result"] = transfer;
    if (remote_decode) {
      bj::object params{{"source", workerUrl()},
                        {"lease_id", "lease-" + std::to_string(++leases_)}};
      if (!remote_decode_bad_params.load()) {
        bj::array hashes;
        for (uint64_t h : blockHashes(tokens)) hashes.push_back(h);
        params["block_hashes"] = std::move(hashes);
      }
      out["kv_transfer_params"] = std::move(params);
    }
    std::string text = bj::serialize(out);
    co_await w.sendJson(200, std::move(text));
    co_return;
  }
  ++running;
  auto s = co_await w.beginStream(200, "text/event-stream");
  asio::steady_timer timer(co_await asio::this_coro::executor);
  bool cut = false;
  for (int i = 0; i < n && s.ok(); ++i) {
    if (cut_stream_after_chunks.load() >= 0 && i >= cut_stream_after_chunks.load()) {
      cut = true;  // no terminating chunk: the connection closes mid-stream
      break;
    }
    timer.expires_after(options_.token_delay);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    bj::object chunk{{"id", "cmpl-fake"}, {"object", object + ".chunk"}, {"model", "fake-model"}};
    bj::object choice{{"index", 0}};
    if (chat) {
      choice["delta"] = bj::object{{"content", "t" + std::to_string(i)}};
    } else {
      choice["text"] = "t" + std::to_string(i);
    }
    chunk["choices"] = bj::array{choice};
    std::string text = bj::serialize(chunk);
    s = co_await w.writeEvent(text);
  }
  bool include_usage = false;
  if (const auto* so = body->if_contains("stream_options"); so && so->is_object()) {
    if (const auto* iu = so->as_object().if_contains("include_usage"); iu && iu->is_bool()) {
      include_usage = iu->as_bool();
    }
  }
  if (cut) s = absl::AbortedError("cut");
  if (s.ok() && include_usage) {
    bj::object last{{"id", "cmpl-fake"}, {"object", object + ".chunk"}, {"choices", bj::array{}}};
    last["usage"] = usage;
    if (!transfer.empty()) last["kv_transfer_result"] = transfer;
    std::string text = bj::serialize(last);
    s = co_await w.writeEvent(text);
  }
  if (s.ok()) s = co_await w.writeEvent("[DONE]");
  if (s.ok()) co_await w.endStream();
  --running;
}

}  // namespace kvf::fakes
