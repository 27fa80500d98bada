// The HTTP side of the live engine: the OpenAI-compatible handlers and the requests waiting for
// their tokens (HTTP thread). Remote-KV glue (kv_transfer_params, fetch starts, the transfer
// result) is in engine_remote_kv.cc; the core thread in engine_core_side.cc.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_server_impl.h"
#include "engine/tokenizer.h"

namespace kvf::engine {

namespace bj = boost::json;
using detail::kAwait;
using detail::Pending;
using detail::steadyNanos;

namespace {

// kv_transfer_params are echoed back as given (vLLM does), except a receiver's: those name a
// peer's internal worker URL and were consumed here; kv_transfer_result reports the outcome.
std::optional<bj::value> echoedTransferParams(const std::optional<bj::value>& params) {
  if (params && params->is_object() && params->as_object().contains("source")) {
    return std::nullopt;
  }
  if (params && protocol::isNixlDecodeLeg(*params)) return std::nullopt;  // P's, consumed here
  return params;
}

// The prefix hit as the engine reported it, with the part the lower tiers supplied.
void copyCachedTokens(const Pending& p, CompletionSummary& summary) {
  summary.cached_tokens = p.cached_tokens;
  summary.tier_tokens = p.tier_tokens;
  summary.tier_disk_tokens = p.tier_disk_tokens;
}

// Raises the calling thread's niceness (Linux threads are scheduled individually), which needs no
// privilege. Failure only costs step timing, so it is logged and ignored.
void lowerCallingThreadPriority(int64_t nice) {
  if (nice <= 0) return;
  auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  if (::setpriority(PRIO_PROCESS, tid, static_cast<int>(nice)) != 0) {
    log::warn("cannot lower the HTTP thread's priority", "nice", nice, "errno", errno);
  }
}

}  // namespace

EngineHttpSide::EngineHttpSide(asio::io_context& ioc, EngineShared& shared, EngineCoreSide& core)
    : ioc_(ioc), shared_(shared), core_(core) {}

absl::Status EngineHttpSide::bind() {
  const EngineConfig& c = shared_.config;
  limits_.served_model_name = c.served_model_name;
  limits_.vocab_size = core_.vocabSize();
  limits_.max_model_len = core_.maxModelLen();
  http::ServerOptions so;
  so.host = c.host;
  so.port = static_cast<uint16_t>(c.port);
  so.max_body_bytes = static_cast<size_t>(c.max_body_bytes);
  so.max_connections = static_cast<size_t>(c.max_connections);
  so.max_connections_per_client = static_cast<size_t>(c.max_connections_per_client);
  KVF_ASSIGN_OR_RETURN(server_, http::HttpServer::create(ioc_, so));
  registerRoutes();
  return absl::OkStatus();
}

void EngineHttpSide::connect(worker::WorkerAgent* agent, worker::KvEventPublisher* publisher) {
  agent_ = agent;
  publisher_ = publisher;
}

void EngineHttpSide::start() {
  server_->start();
  asio::post(ioc_, [nice = shared_.config.io_thread_nice] { lowerCallingThreadPriority(nice); });
}

void EngineHttpSide::stop() {
  server_->stop();
  for (auto& [id, p] : pending_) {
    p->done = true;
    p->finish_reason = "abort";
    p->signal.cancel();
  }
  pending_.clear();
}

void EngineHttpSide::registerRoutes() {
  using http::Request;
  using http::ResponseWriter;
  server_->route("POST", "/v1/completions",
                 [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                   co_await handleApi(ApiKind::kCompletions, r, w);
                 });
  server_->route("POST", "/v1/chat/completions",
                 [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                   co_await handleApi(ApiKind::kChat, r, w);
                 });
  server_->route("POST", "/tokenize",
                 [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                   co_await handleTokenize(r, w);
                 });
  server_->route("GET", "/v1/models",
                 [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                   co_await handleModels(r, w);
                 });
  server_->route("POST", "/reset_prefix_cache",
                 [this](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
                   bool ok = co_await core_.resetPrefixCache();
                   if (!ok) {
                     co_await w.sendError(409, "cannot reset the prefix cache while requests run");
                     co_return;
                   }
                   std::string empty;
                   co_await w.send(200, "text/plain", std::move(empty));
                 });
  // Peer-only (the worker token): every cached block's payload checked against its hash, for
  // fault-injection tests and operators who suspect a stray write (docs/engine.md).
  server_->route(
      "GET", "/kv/audit",
      [this](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
        KvPool::PayloadAudit audit = co_await core_.auditPayloads();
        std::string body = strCat("{\"cached_blocks\":", audit.cached_blocks,
                                  ",\"corrupt_blocks\":", audit.corrupt_blocks, "}");
        co_await w.sendJson(200, std::move(body));
      },
      nullptr,
      [this](const Request& head) {
        if (agent_ == nullptr) return absl::NotFoundError("no worker agent: /kv/audit is off");
        return agent_->authorized(head)
                   ? absl::OkStatus()
                   : absl::UnauthenticatedError("missing or wrong bearer token");
      });
  server_->route("GET", "/health", [](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
    std::string empty;  // named: GCC 12 mishandles temporaries inside co_await
    co_await w.send(200, "text/plain", std::move(empty));
  });
  server_->route("GET", "/metrics",
                 [this](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
                   std::string text = shared_.registry.exposition();
                   co_await w.send(200, metrics::kExpositionContentType, std::move(text));
                 });
}

asio::awaitable<void> EngineHttpSide::handleApi(ApiKind kind, const http::Request& req,
                                                http::ResponseWriter& w) {
  auto parsed = parseApiRequest(kind, req.body, limits_);
  if (!parsed.ok()) {
    co_await w.sendStatus(parsed.status());
    co_return;
  }
  const EngineConfig& config = shared_.config;
  std::string id = strCat(kind == ApiKind::kCompletions ? "cmpl-" : "chatcmpl-", config.instance_id,
                          "-", next_request_++);
  RequestSpec spec;
  spec.id = id;
  spec.prompt = std::move(parsed->prompt);
  spec.sampling = parsed->sampling;
  detail::FetchOptions fo;
  std::string nixl_invalid;
  if (parsed->nixl_decode_leg && nixlDialect()) {
    absl::Status st =
        applyNixlDecodeLeg(*parsed->kv_transfer_params, req, spec, &fo, &nixl_invalid);
    if (!st.ok()) {
      co_await w.sendStatus(st);
      co_return;
    }
  } else if (parsed->kv_transfer) {
    absl::Status st = applyKvTransfer(*parsed->kv_transfer, *parsed->kv_transfer_params, req, spec);
    if (!st.ok()) {
      co_await w.sendStatus(st);
      co_return;
    }
  }
  // A remote-decode request counts against the lease bounds until it finishes (its lease, if
  // any, is counted by the agent from then on).
  struct PendingLease {
    int64_t* requests;
    int64_t* blocks;
    int64_t n;
    ~PendingLease() {
      if (n < 0) return;
      *requests -= 1;
      *blocks -= n;
    }
  } pending_lease{&pending_lease_requests_, &pending_lease_blocks_, -1};
  if (spec.remote_decode_lease) {
    pending_lease.n = promptBlocks(spec);
    pending_lease_requests_ += 1;
    pending_lease_blocks_ += pending_lease.n;
  }
  CompletionSummary summary;
  summary.id = id;
  summary.model = config.served_model_name;
  summary.created = static_cast<int64_t>(std::time(nullptr));
  summary.prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  absl::Status valid = core_.validate(spec);
  if (!valid.ok()) {
    co_await w.sendStatus(valid);
    co_return;
  }
  auto p = std::make_shared<Pending>(ioc_.get_executor());
  pending_[id] = p;
  if (spec.remote_kv) {
    if (!fo.nixl) {
      fo.source = parsed->kv_transfer->source;
      fo.lease_id = parsed->kv_transfer->lease_id;
      fo.deadline_ms = parsed->kv_transfer->deadline_ms;
    }
    fetch_options_[id] = std::move(fo);
  }
  if (!nixl_invalid.empty()) {
    KvTransferResult r;
    r.reason = strCat("invalid kv_transfer_params: ", nixl_invalid);
    p->kv_transfer_result = std::move(r);
  }
  const bool remote_decode = parsed->kv_transfer && parsed->kv_transfer->do_remote_decode;
  core_.add(std::move(spec), shared_.engineNow(steadyNanos()), p);
  // As vLLM's server does: a client that disconnects aborts its request, streaming or not, at
  // once (not at the next write), so its blocks and batch slot go to requests someone awaits.
  w.watchClientGone([this, id, p] {
    if (p->done) return;
    core_.abort(id);
    pending_.erase(id);
    fetch_options_.erase(id);
    shared_.m.aborted->inc();
    p->done = true;
    p->finish_reason = "abort";
    p->signal.cancel();
  });
  if (parsed->stream) {
    co_await streamResponse(kind, *parsed, summary, p, id, remote_decode, w);
    co_return;
  }
  while (!p->done) co_await p->signal.async_wait(kAwait);
  if (w.clientGone()) co_return;  // aborted: nobody to answer
  summary.output = p->tokens;
  copyCachedTokens(*p, summary);
  summary.finish_reason = p->finish_reason;
  summary.kv_transfer_result = p->kv_transfer_result;
  fetch_options_.erase(id);
  std::optional<bj::value> params = echoedTransferParams(parsed->kv_transfer_params);
  if (remote_decode) params = holderParams(*p);
  std::string body = completionBody(kind, summary, params);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> EngineHttpSide::streamResponse(ApiKind kind, ParsedRequest& parsed,
                                                     CompletionSummary& summary,
                                                     std::shared_ptr<Pending> p,
                                                     const std::string& id, bool remote_decode,
                                                     http::ResponseWriter& w) {
  http::Headers headers = {{"Cache-Control", "no-cache"}};
  parsed.kv_transfer_params = echoedTransferParams(parsed.kv_transfer_params);
  absl::Status st = co_await w.beginStream(200, "text/event-stream", headers);
  size_t sent = 0;
  bool first = true;
  bool finish_sent = false;
  while (st.ok() && !finish_sent && !w.clientGone()) {
    while (!p->done && sent == p->tokens.size()) co_await p->signal.async_wait(kAwait);
    while (st.ok() && (sent < p->tokens.size() || (p->done && !finish_sent))) {
      std::string text = sent < p->tokens.size() ? tokenText(p->tokens[sent++]) : std::string();
      bool last = p->done && sent == p->tokens.size();
      if (last) {
        summary.kv_transfer_result = p->kv_transfer_result;
        if (remote_decode) parsed.kv_transfer_params = holderParams(*p);  // offload, streamed
      }
      std::string chunk =
          streamChunk(kind, summary, text, first, last ? &p->finish_reason : nullptr,
                      parsed.kv_transfer_params);
      first = false;
      finish_sent = last;
      st = co_await w.writeEvent(chunk);
    }
  }
  if (w.clientGone()) co_return;  // aborted when the client left
  if (st.ok() && parsed.include_usage) {
    summary.output = p->tokens;
    copyCachedTokens(*p, summary);
    std::string chunk = usageChunk(kind, summary);
    st = co_await w.writeEvent(chunk);
  }
  if (st.ok()) st = co_await w.writeEvent("[DONE]");
  if (st.ok()) st = co_await w.endStream();
  if (!st.ok() && !p->done) {
    // The client went away: free its blocks instead of generating for nobody.
    core_.abort(id);
    pending_.erase(id);
    shared_.m.aborted->inc();
  }
}

asio::awaitable<void> EngineHttpSide::handleTokenize(const http::Request& req,
                                                     http::ResponseWriter& w) {
  auto tokens = parseTokenizeRequest(req.body, limits_);
  if (!tokens.ok()) {
    co_await w.sendStatus(tokens.status());
    co_return;
  }
  bj::object o;
  o["count"] = tokens->size();
  o["max_model_len"] = limits_.max_model_len;
  bj::array arr;
  arr.reserve(tokens->size());
  for (TokenId t : *tokens) arr.push_back(t);
  o["tokens"] = std::move(arr);
  std::string body = bj::serialize(o);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> EngineHttpSide::handleModels(const http::Request&, http::ResponseWriter& w) {
  bj::object model;
  model["id"] = shared_.config.served_model_name;
  model["object"] = "model";
  model["created"] = static_cast<int64_t>(std::time(nullptr));
  model["owned_by"] = "kvfabric";
  model["root"] = shared_.config.profile.model.name;
  model["max_model_len"] = limits_.max_model_len;
  bj::object o;
  o["object"] = "list";
  o["data"] = bj::array{std::move(model)};
  std::string body = bj::serialize(o);
  co_await w.sendJson(200, std::move(body));
}

void EngineHttpSide::deliver(const std::vector<RequestOutput>& outputs, Nanos end) {
  for (const RequestOutput& out : outputs) {
    auto it = pending_.find(out.id);
    if (it == pending_.end()) continue;
    Pending& p = *it->second;
    p.tokens.insert(p.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    p.cached_tokens = out.cached_tokens;
    p.tier_tokens = out.tier_tokens;
    p.tier_disk_tokens = out.tier_disk_tokens;
    p.prompt_tokens = out.prompt_tokens;
    if (out.lease_id) {
      p.lease_id = out.lease_id;
      p.lease_block_hashes = out.lease_block_hashes;
      p.lease_blocks = out.lease_blocks;
    }
    if (out.finish) {
      p.done = true;
      p.finish_reason = finishReasonName(*out.finish);
      recordFinished(out, end);
    }
    p.signal.cancel();
    if (out.finish) pending_.erase(it);
  }
}

void EngineHttpSide::recordFinished(const RequestOutput& out, Nanos end) {
  EngineShared::Metrics& m = shared_.m;
  m.success->inc();
  if (out.first_token_time >= 0) {
    m.ttft->observe(nanosToSeconds(out.first_token_time - out.arrival_time));
    if (out.output_tokens > 1) {
      m.tpot->observe(nanosToSeconds(end - out.first_token_time) /
                      static_cast<double>(out.output_tokens - 1));
    }
  }
  m.e2e->observe(nanosToSeconds(end - out.arrival_time));
}

}  // namespace kvf::engine
