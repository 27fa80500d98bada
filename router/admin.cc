// Routes: the OpenAI endpoints, /health, /metrics, and the bearer-token admin API
// (list / add / drain / undrain / remove instances, recent decisions).
#include <boost/json.hpp>

#include "common/config.h"
#include "common/http_client.h"
#include "common/json.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/strings.h"
#include "router/fast_parse.h"
#include "router/replica_sync.h"
#include "router/router.h"
#include "router/router_internal.h"

namespace kvf::router {
namespace {

namespace bj = boost::json;

// Constant-time comparison so the token cannot be probed byte by byte through timing.
bool tokenMatches(std::string_view given, std::string_view expected) {
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  }
  return diff == 0;
}

}  // namespace

void Router::registerRoutes() {
  size_t block_size = config_.index.block_size;
  server_->route(
      "POST", "/v1/completions",
      [this](const http::Request& r, http::ResponseWriter& w) {
        return handleCompletion(ApiKind::kCompletions, r, w);
      },
      [block_size](const http::Request&) -> std::shared_ptr<http::BodyObserver> {
        return std::make_shared<PromptReadAhead>(block_size);
      });
  server_->route("POST", "/v1/chat/completions",
                 [this](const http::Request& r, http::ResponseWriter& w) {
                   return handleCompletion(ApiKind::kChat, r, w);
                 });
  server_->route("GET", "/v1/models",
                 [this](const http::Request&, http::ResponseWriter& w) { return handleModels(w); });
  server_->route("GET", "/health",
                 [this](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                   int healthy = 0;
                   for (const auto& i : slots_) healthy += i && admitted(*i) ? 1 : 0;
                   std::string body = strCat("{\"status\":\"", healthy > 0 ? "ok" : "unavailable",
                                             "\",\"healthy_instances\":", healthy, "}");
                   co_await w.sendJson(healthy > 0 ? 200 : 503, std::move(body));
                 });
  server_->route("GET", "/metrics",
                 [this](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                   std::string body = registry_.exposition();
                   co_await w.send(200, metrics::kExpositionContentType, std::move(body));
                 });
  for (const char* method : {"GET", "POST", "DELETE"}) {
    server_->routePrefix(
        method, "/admin/",
        [this](const http::Request& r, http::ResponseWriter& w) { return handleAdmin(r, w); });
  }
}

asio::awaitable<void> Router::handleModels(http::ResponseWriter& writer) {
  // Every instance serves the same model(s); ask the first admitted one.
  for (const auto& instance : slots_) {
    if (!instance || !admitted(*instance)) continue;
    http::ClientRequest request;
    request.method = "GET";
    request.target = "/v1/models";
    std::shared_ptr<Instance> keep = instance;
    auto response = co_await keep->client->request(std::move(request));
    if (response.ok() && response->status == 200) {
      co_await writer.sendJson(200, std::move(response->body));
      co_return;
    }
  }
  co_await writer.sendError(503, "no healthy instance available");
}

std::string Router::instancesJson() const {
  bj::array list;
  for (const auto& i : slots_) {
    if (!i) continue;
    bj::object o;
    o["id"] = i->config.id;
    o["url"] = i->config.url;
    o["slot"] = i->slot;
    o["admitted"] = admitted(*i);
    const InstanceState& state = core_->instance(i->slot);
    o["health_check_ok"] = state.check_healthy;
    o["stalled"] = state.stalled;
    o["requests_in_flight"] = i->attempts.size();
    o["draining"] = state.draining;
    o["circuit_open"] = clock_.now() < state.circuit_open_until;
    o["running"] = state.running;
    o["waiting"] = state.waiting;
    o["pending_prefill_tokens"] = state.pending_prefill_tokens;
    o["kv_usage"] = state.kv_usage;
    bj::object kv;
    kvEventsJson(*i, &kv);
    o["kv_events"] = std::move(kv);
    o["worker_url"] = i->config.worker_url;
    o["index_blocks"] = core_->index().instanceBlocks(i->slot);
    list.push_back(std::move(o));
  }
  bj::object out;
  out["instances"] = std::move(list);
  bj::object modes;
  for (auto mode :
       {policy::Mode::kLocal, policy::Mode::kPushMigrate, policy::Mode::kPrefillOffload}) {
    modes[policy::modeName(mode)] = decisions_by_mode_[static_cast<size_t>(mode)];
  }
  out["decisions_by_mode"] = std::move(modes);
  out["offloads_in_flight"] = core_->policy().offloadsInFlight();
  return bj::serialize(out);
}

absl::StatusOr<std::string> Router::matchJson(const http::Request& request) {
  // A chat body has "messages"; anything else is read as a completion.
  ApiKind kind = request.body.find("\"messages\"") != std::string::npos ? ApiKind::kChat
                                                                        : ApiKind::kCompletions;
  KVF_ASSIGN_OR_RETURN(ParsedRequest parsed, parseRequestDom(kind, request));
  if (isLoraAdapter(parsed.model)) parsed.extra_keys.lora_name = parsed.model;
  const int64_t bs = static_cast<int64_t>(config_.index.block_size);
  std::vector<policy::BlockHash> hashes = requestHashes(parsed, config_.index.block_size);
  core_->index().expire(clock_.now());
  std::vector<uint32_t> matched(slots_.size());
  core_->index().matchLengths(hashes, matched);
  // As decide() predicts: engines recompute the last prompt token, so at most the full blocks
  // of the first prompt_tokens - 1 tokens hit.
  const int64_t cacheable = std::max<int64_t>(0, parsed.prompt_tokens - 1) / bs * bs;
  bj::object instances;
  for (const auto& i : slots_) {
    if (!i) continue;
    int64_t blocks = matched[static_cast<size_t>(i->slot)];
    int64_t tokens = blocks * bs;  // text blocks stand for bs tokens each, approximately
    bj::object o;
    o["matched_blocks"] = blocks;
    o["predicted_cached_tokens"] = std::min(tokens, cacheable);
    instances[i->config.id] = std::move(o);
  }
  bj::object out;
  out["model"] = parsed.model;
  out["lora_adapter"] = !parsed.extra_keys.lora_name.empty();
  out["prompt_tokens"] = parsed.prompt_tokens;
  out["exact_tokens"] = parsed.has_token_ids;
  out["instances"] = std::move(instances);
  return bj::serialize(out);
}

asio::awaitable<void> Router::handleAdmin(const http::Request& request,
                                          http::ResponseWriter& writer) {
  if (config_.admin_token.empty()) {
    co_await writer.sendError(404, "admin API disabled (no admin.token configured)");
    co_return;
  }
  std::string_view auth = request.header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (!auth.starts_with(kBearer) ||
      !tokenMatches(auth.substr(kBearer.size()), config_.admin_token)) {
    http::Headers challenge;
    challenge.emplace_back("www-authenticate", "Bearer");
    std::string body =
        json::errorBody("missing or wrong bearer token", "authentication_error", 401);
    co_await writer.sendJson(401, std::move(body), challenge);
    co_return;
  }
  std::string_view path = request.path;
  if (request.method == "GET" && path == "/admin/instances") {
    co_await writer.sendJson(200, instancesJson());
    co_return;
  }
  if (request.method == "GET" && path == "/admin/replicas") {
    if (!replicas_) {
      co_await writer.sendJson(
          404, json::errorBody("replicas are not configured", "invalid_request_error", 404));
    } else {
      co_await writer.sendJson(200, replicas_->statusJson());
    }
    co_return;
  }
  if (request.method == "GET" && path == "/admin/decisions") {
    std::string body = "{\"decisions\":[" + strJoin(log_->recent(), ",") + "]}";
    co_await writer.sendJson(200, std::move(body));
    co_return;
  }
  if (request.method == "POST" && path == "/admin/match") {
    absl::StatusOr<std::string> body = matchJson(request);
    if (!body.ok()) {
      co_await writer.sendStatus(body.status());
      co_return;
    }
    co_await writer.sendJson(200, std::move(*body));
    co_return;
  }
  if (request.method == "POST" && path == "/admin/instances") {
    auto node = config::parseYaml(request.body, "request body");  // JSON is YAML
    absl::Status status = node.status();
    InstanceConfig instance;
    if (status.ok()) {
      config::ConfigErrors errors("request body");
      config::ConfigMap map(*node, "", &errors);
      parseInstanceConfig(map, &instance);
      status = errors.status();
    }
    if (status.ok()) status = addInstance(instance).status();
    if (!status.ok()) {
      co_await writer.sendStatus(status);
      co_return;
    }
    co_await writer.sendJson(201, instancesJson());
    co_return;
  }
  constexpr std::string_view kPrefix = "/admin/instances/";
  if (path.starts_with(kPrefix)) {
    std::string_view rest = path.substr(kPrefix.size());
    std::string_view id = rest.substr(0, rest.find('/'));
    std::string_view action = rest.size() > id.size() ? rest.substr(id.size() + 1) : "";
    std::shared_ptr<Instance> instance = findInstance(id);
    if (!instance) {
      std::string message = strCat("unknown instance \"", id, "\"");
      co_await writer.sendError(404, message);
      co_return;
    }
    if (request.method == "DELETE" && action.empty()) {
      removeInstance(instance);
      co_await writer.sendJson(200, instancesJson());
      co_return;
    }
    if (request.method == "POST" && (action == "drain" || action == "undrain")) {
      bool draining = action == "drain";
      core_->setDraining(instance->slot, draining);
      log::info("instance drain changed", "instance", instance->config.id, "draining", draining);
      co_await writer.sendJson(200, instancesJson());
      co_return;
    }
  }
  std::string message = strCat("no admin route for ", request.method, " ", path);
  co_await writer.sendError(404, message);
}

}  // namespace kvf::router
