#include "experiments/replay/replayer.h"

#include <unistd.h>
#include <algorithm>

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

Replayer::Replayer(std::shared_ptr<http::HttpClient> client, ReplayOptions options,
                   PromptBuilder prompt, ResultLog* log)
    : client_(std::move(client)),
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
  ++progress_.in_flight;
  CompletionOutcome outcome = co_await runCompletion(*client_, call);
  --progress_.in_flight;
  ++progress_.done;
  if (!outcome.ok) {
    ++progress_.errors;
    log::warn("request failed", "id", request.id, "error", outcome.error);
  }
  RequestResult result;
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

void assignMissingIds(std::vector<trace::Request>* requests) {
  for (size_t i = 0; i < requests->size(); ++i) {
    if ((*requests)[i].id.empty()) (*requests)[i].id = strCat("r", i);
  }
}

absl::Status replayTrace(const std::vector<trace::Request>& requests, const std::string& host,
                         uint16_t port, const ReplayOptions& options,
                         const trace::TokenSynthOptions& synth_options, ResultLog* log) {
  KVF_ASSIGN_OR_RETURN(trace::TokenSynthesizer synth,
                       trace::TokenSynthesizer::create(synth_options));
  std::unordered_map<std::string, uint64_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index.emplace(requests[i].id, i);
  PromptBuilder prompt = [&](const trace::Request& r) { return synth.prompt(r, index.at(r.id)); };
  asio::io_context ioc;
  http::ClientOptions client_options;
  client_options.max_idle_connections = 4096;
  client_options.read_timeout = options.timeout;
  auto client = http::HttpClient::create(ioc.get_executor(), host, port, client_options);
  Replayer replayer(client, options, prompt, log);
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
  if (options_.model.empty() && !todo.empty()) {
    auto model = co_await discoverModel(*client_);
    if (!model.ok()) co_return annotate(model.status(), "discovering the served model");
    options_.model = *model;
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
