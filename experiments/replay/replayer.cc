#include "experiments/replay/replayer.h"

#include <unistd.h>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <unordered_map>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"

namespace kvf::experiments {

namespace {
constexpr auto kPoll = std::chrono::milliseconds(5);
}

absl::StatusOr<std::vector<EndpointAddress>> parseEndpointList(std::string_view urls) {
  std::vector<EndpointAddress> out;
  size_t start = 0;
  while (start <= urls.size()) {
    size_t comma = std::min(urls.find(',', start), urls.size());
    std::string url(urls.substr(start, comma - start));
    start = comma + 1;
    url.erase(0, url.find_first_not_of(' '));
    url.erase(url.find_last_not_of(' ') + 1);
    while (!url.empty() && url.back() == '/') url.pop_back();
    std::string rest = url.rfind("http://", 0) == 0 ? url.substr(7) : url;
    size_t colon = rest.rfind(':');
    if (url.empty() || colon == std::string::npos || colon == 0 ||
        rest.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          strCat("--url: URL ", out.size() + 1, " must be http://host:port, got '", url, "'"));
    }
    int port = 0;
    auto [end, ec] = std::from_chars(rest.data() + colon + 1, rest.data() + rest.size(), port);
    if (ec != std::errc() || end != rest.data() + rest.size() || port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(strCat("--url: bad port in '", url, "'"));
    }
    for (const auto& e : out) {
      if (e.url == url) return absl::InvalidArgumentError(strCat("--url: '", url, "' given twice"));
    }
    out.push_back({url, rest.substr(0, colon), static_cast<uint16_t>(port)});
  }
  return out;
}

Replayer::Replayer(std::shared_ptr<http::HttpClient> client, ReplayOptions options,
                   PromptBuilder prompt, ResultLog* log)
    : Replayer(std::vector<ReplayEndpoint>{{"", std::move(client)}}, std::move(options),
               std::move(prompt), log) {}

Replayer::Replayer(std::vector<ReplayEndpoint> endpoints, ReplayOptions options,
                   PromptBuilder prompt, ResultLog* log)
    : endpoints_(std::move(endpoints)),
      options_(std::move(options)),
      prompt_(std::move(prompt)),
      log_(log) {}

Nanos Replayer::now() const { return SteadyClock().now(); }

Nanos Replayer::traceToWall(Nanos arrival) const {
  double scaled = static_cast<double>(arrival - trace_origin_) / options_.time_scale;
  return start_wall_ + static_cast<Nanos>(scaled);
}

asio::awaitable<void> Replayer::waitUntil(Nanos t) {
  Nanos delta = t - now();
  if (delta <= 0) co_return;
  asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::nanoseconds(delta));
  co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
}

asio::awaitable<void> Replayer::waitForSlot() {
  if (options_.max_in_flight <= 0) co_return;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (progress_.in_flight >= options_.max_in_flight) {
    timer.expires_after(kPoll);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

asio::awaitable<void> Replayer::sendOne(const trace::Request& request, Nanos sent_at) {
  CompletionCall call;
  call.request_id = request.id;
  call.session_id = request.session_id;
  call.model = options_.model;
  call.prompt = prompt_(request);
  call.max_tokens = std::max<int64_t>(request.output_length, 1);
  call.timeout = options_.timeout;
  const ReplayEndpoint& endpoint = endpoints_[next_endpoint_++ % endpoints_.size()];
  ++progress_.in_flight;
  CompletionOutcome outcome = co_await runCompletion(*endpoint.client, call);
  --progress_.in_flight;
  ++progress_.done;
  if (!outcome.ok) {
    ++progress_.errors;
    log::warn("request failed", "id", request.id, "endpoint", endpoint.url, "error", outcome.error);
  }
  RequestResult result;
  result.endpoint = endpoint.url;
  result.request_id = request.id;
  result.session_id = request.session_id;
  result.turn = request.turn;
  result.arrival_s = nanosToSeconds(request.arrival);
  result.sent_s = nanosToSeconds(sent_at - start_wall_);
  result.input_length = request.input_length;
  result.output_length = request.output_length;
  result.outcome = std::move(outcome);
  absl::Status s = log_->append(result);
  if (!s.ok() && log_status_.ok()) log_status_ = s;
}

asio::awaitable<void> Replayer::runSession(std::vector<const trace::Request*> turns) {
  Nanos previous_end = 0;
  for (const trace::Request* r : turns) {
    Nanos at = traceToWall(r->arrival);
    if (previous_end > 0) {
      Nanos think = r->think_time > 0 ? r->think_time : 0;
      at = std::max(
          at, previous_end + static_cast<Nanos>(static_cast<double>(think) / options_.time_scale));
    }
    co_await waitUntil(at);
    co_await waitForSlot();
    co_await sendOne(*r, now());
    previous_end = now();
  }
}

std::string formatProgress(const ReplayProgress& p, double elapsed_s) {
  double rate = elapsed_s > 0 ? static_cast<double>(p.done) / elapsed_s : 0;
  int64_t left = p.total - p.done;
  std::string eta = rate > 0 ? fmt::format("{:.0f}s", static_cast<double>(left) / rate) : "?";
  return fmt::format("done {}/{}  in flight {}  errors {}  {:.2f} req/s  elapsed {:.0f}s  ETA {}",
                     p.done, p.total, p.in_flight, p.errors, rate, elapsed_s, eta);
}

asio::awaitable<void> Replayer::reportProgress() {
  // On a terminal the line is redrawn every second; in a log, a line is written every 10 s.
  bool tty = ::isatty(STDERR_FILENO) != 0;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  int ticks = 0;
  while (!finished_) {
    timer.expires_after(std::chrono::seconds(1));
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    ++ticks;
    if (!options_.progress || (!tty && ticks % 10 != 0)) continue;
    std::string line = formatProgress(progress_, nanosToSeconds(now() - start_wall_));
    std::fprintf(stderr, tty ? "\r%s   " : "%s\n", line.c_str());
    std::fflush(stderr);
  }
  if (options_.progress && tty) std::fprintf(stderr, "\n");
}

asio::awaitable<absl::Status> Replayer::checkEndpoints() {
  // One endpoint: asked only when the model is not given (as before). Several: every one is
  // asked, so a dead or mistyped replica URL stops the replay before it sends anything instead
  // of failing every n-th request.
  if (endpoints_.size() == 1 && !options_.model.empty()) co_return absl::OkStatus();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    auto model = co_await discoverModel(*endpoints_[i].client);
    if (!model.ok()) {
      if (endpoints_.size() == 1)
        co_return annotate(model.status(), "discovering the served model");
      co_return absl::UnavailableError(
          strCat("endpoint ", i + 1, " of ", endpoints_.size(), " (", endpoints_[i].url,
                 ") does not answer GET /v1/models: ", std::string(model.status().message())));
    }
    if (options_.model.empty()) options_.model = *model;
  }
  co_return absl::OkStatus();
}

void assignMissingIds(std::vector<trace::Request>* requests) {
  for (size_t i = 0; i < requests->size(); ++i) {
    if ((*requests)[i].id.empty()) (*requests)[i].id = strCat("r", i);
  }
}

absl::Status replayTrace(const std::vector<trace::Request>& requests,
                         const std::vector<EndpointAddress>& addresses,
                         const ReplayOptions& options,
                         const trace::TokenSynthOptions& synth_options, ResultLog* log) {
  if (addresses.empty()) return absl::InvalidArgumentError("replay: no endpoint");
  KVF_ASSIGN_OR_RETURN(trace::TokenSynthesizer synth,
                       trace::TokenSynthesizer::create(synth_options));
  std::unordered_map<std::string, uint64_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index.emplace(requests[i].id, i);
  PromptBuilder prompt = [&](const trace::Request& r) { return synth.prompt(r, index.at(r.id)); };
  asio::io_context ioc;
  http::ClientOptions client_options;
  client_options.max_idle_connections = 4096;
  client_options.read_timeout = options.timeout;
  std::vector<ReplayEndpoint> endpoints;
  for (const auto& a : addresses) {
    // One endpoint keeps its results as they were (no endpoint field).
    endpoints.push_back(
        {addresses.size() > 1 ? a.url : "",
         http::HttpClient::create(ioc.get_executor(), a.host, a.port, client_options)});
  }
  Replayer replayer(std::move(endpoints), options, prompt, log);
  auto done = asio::co_spawn(ioc, replayer.run(requests), asio::use_future);
  ioc.run();
  return done.get();
}

asio::awaitable<absl::Status> Replayer::run(std::vector<trace::Request> requests) {
  std::stable_sort(
      requests.begin(), requests.end(),
      [](const trace::Request& a, const trace::Request& b) { return a.arrival < b.arrival; });
  if (options_.limit > 0 && static_cast<int64_t>(requests.size()) > options_.limit) {
    requests.resize(static_cast<size_t>(options_.limit));
  }
  std::vector<const trace::Request*> todo;
  for (const auto& r : requests) {
    if (log_->done().count(r.id)) {
      ++progress_.skipped;
    } else {
      todo.push_back(&r);
    }
  }
  progress_.total = static_cast<int64_t>(todo.size());
  if (!todo.empty()) {
    absl::Status reachable = co_await checkEndpoints();
    if (!reachable.ok()) co_return reachable;
  }
  start_wall_ = now();
  trace_origin_ = todo.empty() ? 0 : todo.front()->arrival;
  auto executor = co_await asio::this_coro::executor;
  asio::co_spawn(executor, reportProgress(), asio::detached);

  if (options_.dispatch == DispatchMode::kTimestamp) {
    for (const trace::Request* r : todo) {
      co_await waitUntil(traceToWall(r->arrival));
      co_await waitForSlot();
      asio::co_spawn(executor, sendOne(*r, now()), asio::detached);
    }
  } else {
    std::map<std::string, std::vector<const trace::Request*>> sessions;
    std::vector<std::string> order;
    for (const trace::Request* r : todo) {
      std::string key = r->session_id.empty() ? "#" + r->id : r->session_id;
      auto [it, inserted] = sessions.try_emplace(key);
      if (inserted) order.push_back(key);
      it->second.push_back(r);
    }
    for (const auto& key : order) {
      asio::co_spawn(executor, runSession(std::move(sessions[key])), asio::detached);
    }
  }
  asio::steady_timer timer(executor);
  while (progress_.done < progress_.total) {
    timer.expires_after(kPoll);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  finished_ = true;
  co_return log_status_;
}

}  // namespace kvf::experiments
