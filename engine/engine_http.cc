// EngineServer construction and the HTTP handlers; the step loop and metrics are in
// engine_server.cc.
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
using detail::steadyNanos;

namespace {

// kv_transfer_params are echoed back as given (vLLM does), except a receiver's: those name a
// peer's internal worker URL and were consumed here; kv_transfer_result reports the outcome.
std::optional<bj::value> echoedTransferParams(const std::optional<bj::value>& params) {
  if (params && params->is_object() && params->as_object().contains("source")) {
    return std::nullopt;
  }
  return params;
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

EngineServer::EngineServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineServer::~EngineServer() {
  if (!impl_) return;
  impl_->shutdownCore();
  if (impl_->publisher) impl_->publisher->stop();
}

void EngineServer::Impl::shutdownCore() {
  if (!core_thread.joinable()) return;
  asio::post(core_ioc, [this] {
    stopping = true;
    step_timer.cancel();
    wake_timer.cancel();
    lease_timer.cancel();
  });
  core_work.reset();
  core_ioc.stop();
  core_thread.join();
}

absl::StatusOr<std::unique_ptr<EngineServer>> EngineServer::create(asio::io_context& ioc,
                                                                   EngineConfig config) {
  auto impl = std::make_unique<Impl>(ioc, std::move(config));
  const EngineConfig& c = impl->config;
  if (c.kv_events.enabled) {
    worker::PublisherOptions po;
    po.endpoint = c.kv_events.endpoint;
    po.replay_endpoint = c.kv_events.replay_endpoint;
    po.topic = c.kv_events.topic;
    po.buffer_batches = static_cast<size_t>(c.kv_events.buffer_batches);
    KVF_ASSIGN_OR_RETURN(impl->publisher, worker::KvEventPublisher::create(po));
  }
  KVF_ASSIGN_OR_RETURN(impl->core, EngineCore::create(c, &impl->step_events));
  impl->limits.served_model_name = c.served_model_name;
  impl->limits.vocab_size = impl->core->vocabSize();
  impl->limits.max_model_len = impl->core->maxModelLen();
  http::ServerOptions so;
  so.host = c.host;
  so.port = static_cast<uint16_t>(c.port);
  so.max_body_bytes = static_cast<size_t>(c.max_body_bytes);
  so.max_connections = static_cast<size_t>(c.max_connections);
  so.max_connections_per_client = static_cast<size_t>(c.max_connections_per_client);
  KVF_ASSIGN_OR_RETURN(impl->http, http::HttpServer::create(ioc, so));
  impl->registerMetrics();
  if (c.worker.port > 0) KVF_RETURN_IF_ERROR(impl->createPush());
  impl->registerRoutes();
  return std::unique_ptr<EngineServer>(new EngineServer(std::move(impl)));
}

void EngineServer::start() {
  impl_->wall_origin = steadyNanos();
  impl_->http->start();
  asio::co_spawn(impl_->core_ioc, impl_->stepLoop(), asio::detached);
  if (impl_->worker_http) {
    impl_->worker_http->start();
    asio::co_spawn(impl_->core_ioc, impl_->leaseLoop(), asio::detached);
  }
  impl_->core_thread = std::thread([impl = impl_.get()] { impl->core_ioc.run(); });
  asio::post(impl_->ioc,
             [nice = impl_->config.io_thread_nice] { lowerCallingThreadPriority(nice); });
}

void EngineServer::stop() {
  Impl& s = *impl_;
  s.shutdownCore();
  s.http->stop();
  if (s.worker_http) s.worker_http->stop();
  for (auto& [id, p] : s.pending) {
    p->done = true;
    p->finish_reason = "abort";
    p->signal.cancel();
  }
  s.pending.clear();
  if (s.publisher) s.publisher->stop();
}

uint16_t EngineServer::port() const { return impl_->http->port(); }
uint16_t EngineServer::workerPort() const {
  return impl_->worker_http ? impl_->worker_http->port() : 0;
}
std::string EngineServer::workerUrl() const { return impl_->workerUrl(); }
std::string EngineServer::kvEventsEndpoint() const {
  return impl_->publisher ? impl_->publisher->endpoint() : std::string();
}
std::string EngineServer::kvReplayEndpoint() const {
  return impl_->publisher ? impl_->publisher->replayEndpoint() : std::string();
}
const EngineConfig& EngineServer::config() const { return impl_->config; }

void EngineServer::Impl::registerRoutes() {
  using http::Request;
  using http::ResponseWriter;
  http->route("POST", "/v1/completions",
              [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                co_await handleApi(ApiKind::kCompletion, r, w);
              });
  http->route("POST", "/v1/chat/completions",
              [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                co_await handleApi(ApiKind::kChat, r, w);
              });
  http->route("POST", "/tokenize",
              [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                co_await handleTokenize(r, w);
              });
  http->route("GET", "/v1/models",
              [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                co_await handleModels(r, w);
              });
  http->route("POST", "/reset_prefix_cache",
              [this](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
                auto reset = [this]() -> asio::awaitable<bool> {
                  bool ok = core->pool().resetPrefixCache();
                  std::vector<worker::KvEvent> events = step_events.take();
                  if (publisher) publisher->publish(std::move(events), detail::unixSeconds());
                  publishStats();
                  co_return ok;
                };
                bool ok = co_await asio::co_spawn(core_ioc, reset, asio::use_awaitable);
                if (!ok) {
                  co_await w.sendError(409, "cannot reset the prefix cache while requests run");
                  co_return;
                }
                std::string empty;
                co_await w.send(200, "text/plain", std::move(empty));
              });
  http->route("GET", "/health", [](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
    std::string empty;  // named: GCC 12 mishandles temporaries inside co_await
    co_await w.send(200, "text/plain", std::move(empty));
  });
  http->route("GET", "/metrics",
              [this](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
                std::string text = registry.exposition();
                co_await w.send(200, metrics::kExpositionContentType, std::move(text));
              });
}

asio::awaitable<void> EngineServer::Impl::handleApi(ApiKind kind, const http::Request& req,
                                                    http::ResponseWriter& w) {
  auto parsed = parseApiRequest(kind, req.body, limits);
  if (!parsed.ok()) {
    co_await w.sendStatus(parsed.status());
    co_return;
  }
  std::string id = strCat(kind == ApiKind::kCompletion ? "cmpl-" : "chatcmpl-", config.instance_id,
                          "-", next_request++);
  RequestSpec spec;
  spec.id = id;
  spec.prompt = std::move(parsed->prompt);
  spec.sampling = parsed->sampling;
  if (parsed->kv_transfer) {
    absl::Status st = applyKvTransfer(*parsed->kv_transfer, spec);
    if (!st.ok()) {
      co_await w.sendStatus(st);
      co_return;
    }
  }
  CompletionSummary summary;
  summary.id = id;
  summary.model = config.served_model_name;
  summary.created = static_cast<int64_t>(std::time(nullptr));
  summary.prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  absl::Status valid = core->validate(spec);
  if (!valid.ok()) {
    co_await w.sendStatus(valid);
    co_return;
  }
  auto p = std::make_shared<Pending>(ioc.get_executor());
  pending[id] = p;
  if (spec.remote_kv) {
    FetchOptions fo;
    fo.source = parsed->kv_transfer->source;
    fo.lease_id = parsed->kv_transfer->lease_id;
    fo.deadline_ms = parsed->kv_transfer->deadline_ms;
    fetch_options[id] = std::move(fo);
  }
  Nanos arrival = engineNow(steadyNanos());
  asio::post(core_ioc, [this, spec = std::move(spec), arrival, p]() mutable {
    absl::Status added = core->add(std::move(spec), arrival);
    if (!added.ok()) {
      // validate() accepted it, so this is a bug; answer instead of hanging the client.
      log::error("engine core rejected a validated request", "error", std::string(added.message()));
      asio::post(ioc, [p] {
        p->done = true;
        p->finish_reason = "abort";
        p->signal.cancel();
      });
      return;
    }
    publishStats();
    if (idle) wake_timer.cancel();
  });
  if (parsed->stream) {
    co_await streamResponse(kind, *parsed, summary, p, id, w);
    co_return;
  }
  while (!p->done) co_await p->signal.async_wait(kAwait);
  summary.output = p->tokens;
  summary.cached_tokens = p->cached_tokens;
  summary.finish_reason = p->finish_reason;
  summary.kv_transfer_result = p->kv_transfer_result;
  fetch_options.erase(id);
  std::optional<bj::value> params = echoedTransferParams(parsed->kv_transfer_params);
  if (p->lease_id) params = leaseParams(*p);
  std::string body = completionBody(kind, summary, params);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> EngineServer::Impl::streamResponse(ApiKind kind, ParsedRequest& parsed,
                                                         CompletionSummary& summary,
                                                         std::shared_ptr<Pending> p,
                                                         const std::string& id,
                                                         http::ResponseWriter& w) {
  http::Headers headers = {{"Cache-Control", "no-cache"}};
  parsed.kv_transfer_params = echoedTransferParams(parsed.kv_transfer_params);
  absl::Status st = co_await w.beginStream(200, "text/event-stream", headers);
  size_t sent = 0;
  bool first = true;
  bool finish_sent = false;
  while (st.ok() && !finish_sent) {
    while (!p->done && sent == p->tokens.size()) co_await p->signal.async_wait(kAwait);
    while (st.ok() && (sent < p->tokens.size() || (p->done && !finish_sent))) {
      std::string text = sent < p->tokens.size() ? tokenText(p->tokens[sent++]) : std::string();
      bool last = p->done && sent == p->tokens.size();
      if (last) {
        summary.kv_transfer_result = p->kv_transfer_result;
        if (p->lease_id) parsed.kv_transfer_params = leaseParams(*p);  // offload, streamed
      }
      std::string chunk =
          streamChunk(kind, summary, text, first, last ? &p->finish_reason : nullptr,
                      parsed.kv_transfer_params);
      first = false;
      finish_sent = last;
      st = co_await w.writeEvent(chunk);
    }
  }
  if (st.ok() && parsed.include_usage) {
    summary.output = p->tokens;
    summary.cached_tokens = p->cached_tokens;
    std::string chunk = usageChunk(kind, summary);
    st = co_await w.writeEvent(chunk);
  }
  if (st.ok()) st = co_await w.writeEvent("[DONE]");
  if (st.ok()) st = co_await w.endStream();
  if (!st.ok() && !p->done) {
    // The client went away: free its blocks instead of generating for nobody.
    asio::post(core_ioc, [this, id] {
      core->abort(id);
      publishStats();
    });
    pending.erase(id);
    aborted->inc();
  }
}

asio::awaitable<void> EngineServer::Impl::handleTokenize(const http::Request& req,
                                                         http::ResponseWriter& w) {
  auto tokens = parseTokenizeRequest(req.body, limits);
  if (!tokens.ok()) {
    co_await w.sendStatus(tokens.status());
    co_return;
  }
  bj::object o;
  o["count"] = tokens->size();
  o["max_model_len"] = limits.max_model_len;
  bj::array arr;
  arr.reserve(tokens->size());
  for (TokenId t : *tokens) arr.push_back(t);
  o["tokens"] = std::move(arr);
  std::string body = bj::serialize(o);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> EngineServer::Impl::handleModels(const http::Request&,
                                                       http::ResponseWriter& w) {
  bj::object model;
  model["id"] = config.served_model_name;
  model["object"] = "model";
  model["created"] = static_cast<int64_t>(std::time(nullptr));
  model["owned_by"] = "kvfabric";
  model["root"] = config.profile.model.name;
  model["max_model_len"] = limits.max_model_len;
  bj::object o;
  o["object"] = "list";
  o["data"] = bj::array{std::move(model)};
  std::string body = bj::serialize(o);
  co_await w.sendJson(200, std::move(body));
}

}  // namespace kvf::engine
