#include "experiments/replay/completion_client.h"

#include <boost/asio/steady_timer.hpp>
#include <boost/json.hpp>

#include "common/json.h"
#include "common/sse.h"
#include "common/strings.h"

namespace kvf::experiments {

namespace bj = boost::json;

std::string completionBody(const CompletionCall& call) {
  std::string body;
  body.reserve(call.prompt.size() * 7 + 256);
  body += "{\"model\":";
  body += bj::serialize(bj::string(call.model));
  body += ",\"prompt\":[";
  for (size_t i = 0; i < call.prompt.size(); ++i) {
    if (i > 0) body.push_back(',');
    body += std::to_string(call.prompt[i]);
  }
  body += strCat("],\"max_tokens\":", call.max_tokens, ",\"min_tokens\":", call.max_tokens,
                 ",\"ignore_eos\":true,\"stream\":true,",
                 "\"stream_options\":{\"include_usage\":true}");
  if (!call.session_id.empty()) body += ",\"user\":" + bj::serialize(bj::string(call.session_id));
  body += "}";
  return body;
}

namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t parseInt(std::string_view s, int64_t fallback) {
  if (s.empty()) return fallback;
  try {
    return std::stoll(std::string(s));
  } catch (...) {
    return fallback;
  }
}

// Applies one SSE data payload to the outcome. Returns false when the stream reported an error.
bool applyEvent(const std::string& data, std::chrono::steady_clock::time_point start,
                double* last_token_s, CompletionOutcome* out) {
  auto parsed = json::parse(data);
  if (!parsed.ok() || !parsed->is_object()) {
    out->error = "malformed stream event: " + data.substr(0, 200);
    return false;
  }
  const bj::object& obj = parsed->as_object();
  if (const bj::value* err = obj.if_contains("error")) {
    out->error = "stream error: " + bj::serialize(*err);
    return false;
  }
  if (const bj::value* usage = obj.if_contains("usage"); usage && usage->is_object()) {
    const bj::object& u = usage->as_object();
    out->prompt_tokens = json::getIntOr(u, "prompt_tokens", out->prompt_tokens).value_or(-1);
    if (const bj::value* d = u.if_contains("prompt_tokens_details"); d && d->is_object()) {
      const bj::object& details = d->as_object();
      out->cached_tokens = json::getIntOr(details, "cached_tokens", -1).value_or(-1);
      out->cpu_cached_tokens = json::getIntOr(details, "kvf_cpu_cached_tokens", 0).value_or(0);
      out->disk_cached_tokens = json::getIntOr(details, "kvf_disk_cached_tokens", 0).value_or(0);
    }
  }
  const bj::value* choices = obj.if_contains("choices");
  if (!choices || !choices->is_array() || choices->as_array().empty()) return true;
  const bj::value& choice = choices->as_array()[0];
  if (!choice.is_object()) return true;
  const bj::value* text = choice.as_object().if_contains("text");
  bool has_token = text && text->is_string() && !text->as_string().empty();
  if (!has_token) return true;
  double now = secondsSince(start);
  if (out->ttft_s < 0) {
    out->ttft_s = now;
  } else {
    out->itl_s.push_back(now - *last_token_s);
  }
  *last_token_s = now;
  ++out->output_tokens;
  return true;
}

asio::awaitable<void> readStream(http::ResponseStream& stream,
                                 std::chrono::steady_clock::time_point start,
                                 CompletionOutcome* out) {
  sse::Parser parser;
  double last_token_s = 0;
  bool done = false;
  bool failed = false;
  while (!done && !failed) {
    auto piece = co_await stream.next();
    if (!piece.ok()) {
      out->error = std::string(piece.status().message());
      co_return;
    }
    if (!piece->has_value()) break;
    auto fed = parser.feed(**piece, [&](sse::Event&& e) {
      if (failed || done) return;
      if (e.data == "[DONE]") {
        done = true;
      } else if (e.event == "error" || !applyEvent(e.data, start, &last_token_s, out)) {
        if (out->error.empty()) out->error = "stream error: " + e.data.substr(0, 300);
        failed = true;
      }
    });
    if (!fed.ok()) {
      out->error = std::string(fed.message());
      co_return;
    }
  }
  if (failed) co_return;
  if (!done) {
    out->error = "stream ended without [DONE]";
    co_return;
  }
  out->e2e_s = secondsSince(start);
  if (out->output_tokens >= 2) {
    out->tpot_s = (out->e2e_s - out->ttft_s) / static_cast<double>(out->output_tokens - 1);
  }
  out->ok = true;
}

}  // namespace

asio::awaitable<absl::StatusOr<std::string>> discoverModel(http::HttpClient& client) {
  http::ClientRequest request;
  request.target = "/v1/models";
  auto response = co_await client.request(request);
  if (!response.ok()) co_return response.status();
  if (response->status != 200) {
    co_return absl::UnavailableError(strCat("GET /v1/models answered ", response->status));
  }
  auto body = json::parseObject(response->body);
  if (!body.ok()) co_return body.status();
  const bj::value* data = body->if_contains("data");
  if (data && data->is_array() && !data->as_array().empty() && data->as_array()[0].is_object()) {
    auto id = json::getString(data->as_array()[0].as_object(), "id");
    if (id.ok()) co_return std::string(*id);
  }
  co_return absl::UnavailableError("GET /v1/models lists no model");
}

asio::awaitable<CompletionOutcome> runCompletion(http::HttpClient& client,
                                                 const CompletionCall& call) {
  CompletionOutcome out;
  http::ClientRequest request;
  request.method = "POST";
  request.target = "/v1/completions";
  request.body = completionBody(call);
  request.read_timeout = call.timeout;
  request.headers.emplace_back("X-Request-Id", call.request_id);
  if (!call.session_id.empty()) request.headers.emplace_back("X-Session-Id", call.session_id);

  auto start = std::chrono::steady_clock::now();
  // The whole call is bounded: a timer cancels the stream if it runs past the timeout. Its
  // state is shared so a handler already queued when the call ends touches nothing freed.
  struct Watch {
    std::shared_ptr<http::ResponseStream> stream;
    bool timed_out = false;
  };
  auto watch = std::make_shared<Watch>();
  asio::steady_timer deadline(co_await asio::this_coro::executor, call.timeout);
  deadline.async_wait([watch](const boost::system::error_code& ec) {
    if (ec) return;
    watch->timed_out = true;
    if (watch->stream) watch->stream->cancel();
  });
  auto opened = co_await client.open(request);
  if (!opened.ok()) {
    deadline.cancel();
    out.error = std::string(opened.status().message());
    co_return out;
  }
  watch->stream = std::shared_ptr<http::ResponseStream>(std::move(*opened));
  http::ResponseStream& stream = *watch->stream;
  out.http_status = stream.status();
  out.instance = std::string(stream.header("x-kvf-instance"));
  out.decision = std::string(stream.header("x-kvf-decision"));
  out.reason = std::string(stream.header("x-kvf-reason"));
  out.predicted_cached_tokens = parseInt(stream.header("x-kvf-predicted-cached-tokens"), -1);
  if (out.http_status != 200) {
    auto body = co_await stream.readAll(64 * 1024);
    deadline.cancel();
    out.error = strCat("HTTP ", out.http_status, ": ", body.ok() ? body->substr(0, 500) : "");
    co_return out;
  }
  co_await readStream(stream, start, &out);
  deadline.cancel();
  if (watch->timed_out) {
    out.ok = false;
    out.error = strCat("timed out after ", call.timeout.count(), " ms");
  }
  co_return out;
}

}  // namespace kvf::experiments
