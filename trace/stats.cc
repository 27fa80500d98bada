#include "trace/stats.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "common/status.h"

namespace kvf::trace {

namespace {

// Nearest-rank percentile of `values` (reordered in place).
int64_t percentile(std::vector<int64_t>& values, double p) {
  if (values.empty()) return 0;
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  size_t k = rank == 0 ? 0 : rank - 1;
  std::nth_element(values.begin(), values.begin() + static_cast<ptrdiff_t>(k), values.end());
  return values[k];
}

LengthSummary summarize(std::vector<int64_t> values) {
  LengthSummary s;
  if (values.empty()) return s;
  double sum = 0;
  int64_t max = 0;
  for (int64_t v : values) {
    sum += static_cast<double>(v);
    max = std::max(max, v);
  }
  s.mean = sum / static_cast<double>(values.size());
  s.max = max;
  s.p50 = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  return s;
}

double ratio(double a, double b) { return b > 0 ? a / b : 0; }

}  // namespace

absl::StatusOr<StatsAccumulator> StatsAccumulator::create(StatsOptions options) {
  int bits = 0;
  for (int n : options.round_robin_instances) {
    if (n < 1) return absl::InvalidArgumentError("round-robin instance counts must be >= 1");
    bits += n;
  }
  if (bits > 64) {
    return absl::InvalidArgumentError(
        strCat("round-robin instance counts sum to ", bits, "; at most 64 are supported"));
  }
  if (!(options.qps_window_s > 0)) return absl::InvalidArgumentError("qps window must be > 0");
  return StatsAccumulator(std::move(options));
}

StatsAccumulator::StatsAccumulator(StatsOptions options) : options_(std::move(options)) {
  int offset = 0;
  for (int n : options_.round_robin_instances) {
    rr_offset_.push_back(offset);
    offset += n;
  }
  rr_hit_blocks_.assign(rr_offset_.size(), 0);
  rr_hit_tokens_.assign(rr_offset_.size(), 0);
  session_requests_.push_back(0);
}

uint32_t StatsAccumulator::sessionIndex(const Request& r) {
  if (r.session_id.empty()) return 0;
  ++requests_with_session_;
  auto [it, inserted] =
      session_ids_.try_emplace(r.session_id, static_cast<uint32_t>(session_requests_.size()));
  if (inserted) session_requests_.push_back(0);
  ++session_requests_[it->second];
  return it->second;
}

void StatsAccumulator::add(const Request& r) {
  const size_t index = inputs_.size();
  if (index == 0) {
    first_ = last_ = max_arrival_ = r.arrival;
  } else if (r.arrival < max_arrival_) {
    ++out_of_order_;
  }
  first_ = std::min(first_, r.arrival);
  max_arrival_ = std::max(max_arrival_, r.arrival);
  inputs_.push_back(r.input_length);
  outputs_.push_back(r.output_length);
  auto window = static_cast<int64_t>(nanosToSeconds(r.arrival) / options_.qps_window_s);
  window_counts_.push_back(window);
  if (std::find(block_sizes_.begin(), block_sizes_.end(), r.block_size) == block_sizes_.end()) {
    block_sizes_.push_back(r.block_size);
  }
  const uint32_t session = sessionIndex(r);

  const size_t configs = rr_offset_.size();
  uint64_t my_bits = 0;
  match_.assign(configs, 1);
  for (size_t k = 0; k < configs; ++k) {
    int n = options_.round_robin_instances[k];
    my_bits |= uint64_t{1} << (rr_offset_[k] + static_cast<int>(index % static_cast<size_t>(n)));
  }
  bool single_match = true;
  PerRequest pr;
  pr.blocks = static_cast<int32_t>(r.hash_ids.size());
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    auto [it, inserted] = blocks_.try_emplace(r.hash_ids[i]);
    BlockInfo& b = it->second;
    const int64_t tokens = r.blockTokens(i);
    if (single_match) {
      if (inserted) {
        single_match = false;
      } else {
        ++pr.hit_blocks;
        pr.hit_tokens += tokens;
        if (session != 0) (b.owner == session ? intra_tokens_ : cross_tokens_) += tokens;
      }
    }
    for (size_t k = 0; k < configs; ++k) {
      if (!match_[k]) continue;
      int n = options_.round_robin_instances[k];
      uint64_t bit =
          uint64_t{1} << (rr_offset_[k] + static_cast<int>(index % static_cast<size_t>(n)));
      if (b.instance_bits & bit) {
        ++rr_hit_blocks_[k];
        rr_hit_tokens_[k] += tokens;
      } else {
        match_[k] = 0;
      }
    }
    b.instance_bits |= my_bits;
    if (inserted) {
      b.owner = session;
    } else if (b.owner != session) {
      b.shared = 1;
    }
  }
  per_request_.push_back(pr);
}

TraceStats StatsAccumulator::finish() const {
  TraceStats s;
  s.requests = static_cast<int64_t>(inputs_.size());
  s.has_sessions = !session_ids_.empty();
  s.sessions = static_cast<int64_t>(session_ids_.size());
  int64_t multi = 0, multi_requests = 0;
  for (size_t i = 1; i < session_requests_.size(); ++i) {
    if (session_requests_[i] >= 2) {
      ++multi;
      multi_requests += session_requests_[i];
    }
  }
  s.multi_turn_share = ratio(static_cast<double>(multi), static_cast<double>(s.sessions));
  s.turns_per_session =
      ratio(static_cast<double>(requests_with_session_), static_cast<double>(s.sessions));
  s.turns_per_multi_turn_session =
      ratio(static_cast<double>(multi_requests), static_cast<double>(multi));
  s.span_s = s.requests > 0 ? nanosToSeconds(max_arrival_ - first_) : 0;
  s.mean_qps = s.span_s > 0 ? static_cast<double>(s.requests) / s.span_s : 0;
  std::vector<int64_t> windows = window_counts_;
  std::sort(windows.begin(), windows.end());
  int64_t peak = 0;
  for (size_t i = 0; i < windows.size();) {
    size_t j = i;
    while (j < windows.size() && windows[j] == windows[i]) ++j;
    peak = std::max(peak, static_cast<int64_t>(j - i));
    i = j;
  }
  s.qps_window_s = options_.qps_window_s;
  s.peak_qps = static_cast<double>(peak) / options_.qps_window_s;
  s.out_of_order = out_of_order_;
  s.input = summarize(inputs_);
  s.output = summarize(outputs_);
  for (int64_t v : inputs_) s.input_tokens += v;
  for (int64_t v : outputs_) s.output_tokens += v;
  s.io_ratio = ratio(static_cast<double>(s.input_tokens), static_cast<double>(s.output_tokens));
  s.prefill_token_share = ratio(static_cast<double>(s.input_tokens),
                                static_cast<double>(s.input_tokens + s.output_tokens));
  s.block_sizes = block_sizes_;
  s.unique_blocks = static_cast<int64_t>(blocks_.size());
  int64_t hit_blocks[2] = {0, 0}, blocks[2] = {0, 0}, hit_tokens[2] = {0, 0}, tokens[2] = {0, 0};
  const size_t half = per_request_.size() / 2;
  for (size_t i = 0; i < per_request_.size(); ++i) {
    const PerRequest& pr = per_request_[i];
    for (int part = 0; part < 2; ++part) {
      if (part == 1 && i < half) continue;
      hit_blocks[part] += pr.hit_blocks;
      blocks[part] += pr.blocks;
      hit_tokens[part] += pr.hit_tokens;
      tokens[part] += inputs_[i];
    }
  }
  s.total_blocks = blocks[0];
  s.hit_all = {ratio(static_cast<double>(hit_blocks[0]), static_cast<double>(blocks[0])),
               ratio(static_cast<double>(hit_tokens[0]), static_cast<double>(tokens[0]))};
  s.hit_last_half = {ratio(static_cast<double>(hit_blocks[1]), static_cast<double>(blocks[1])),
                     ratio(static_cast<double>(hit_tokens[1]), static_cast<double>(tokens[1]))};
  double reused = static_cast<double>(intra_tokens_ + cross_tokens_);
  s.intra_session_reuse = ratio(static_cast<double>(intra_tokens_), reused);
  s.cross_session_reuse = ratio(static_cast<double>(cross_tokens_), reused);
  int64_t shared = 0;
  for (const auto& [id, b] : blocks_) shared += b.shared;
  s.blocks_shared_across_sessions =
      ratio(static_cast<double>(shared), static_cast<double>(blocks_.size()));
  for (size_t k = 0; k < rr_offset_.size(); ++k) {
    s.round_robin.push_back(
        {options_.round_robin_instances[k],
         {ratio(static_cast<double>(rr_hit_blocks_[k]), static_cast<double>(blocks[0])),
          ratio(static_cast<double>(rr_hit_tokens_[k]), static_cast<double>(tokens[0]))}});
  }
  return s;
}

absl::StatusOr<TraceStats> computeStats(RequestReader& reader, const StatsOptions& options,
                                        const std::function<void(int64_t, int64_t)>& progress) {
  KVF_ASSIGN_OR_RETURN(auto acc, StatsAccumulator::create(options));
  Request r;
  int64_t n = 0;
  while (true) {
    KVF_ASSIGN_OR_RETURN(bool more, reader.next(&r));
    if (!more) break;
    acc.add(r);
    if (progress && (++n & 0xFFFF) == 0) progress(reader.bytesRead(), reader.bytesTotal());
  }
  return acc.finish();
}

std::string formatStatsTable(const TraceStats& s) {
  std::string o;
  auto line = [&o](std::string_view name, const std::string& value) {
    fmt::format_to(std::back_inserter(o), "{:<40} {}\n", name, value);
  };
  auto pct = [](double v) { return fmt::format("{:.2f}%", v * 100); };
  auto dist = [](const LengthSummary& d) {
    return fmt::format("mean {:.1f}  p50 {}  p90 {}  p99 {}  max {}", d.mean, d.p50, d.p90, d.p99,
                       d.max);
  };
  line("requests", fmt::format("{}", s.requests));
  if (s.has_sessions) {
    line("sessions", fmt::format("{}", s.sessions));
    line("multi-turn sessions", pct(s.multi_turn_share));
    line("turns per session (all / multi-turn)",
         fmt::format("{:.2f} / {:.2f}", s.turns_per_session, s.turns_per_multi_turn_session));
  } else {
    line("sessions", "none (no session ids in this trace)");
  }
  line("span", fmt::format("{:.1f} s", s.span_s));
  line("mean QPS", fmt::format("{:.3f}", s.mean_qps));
  line(fmt::format("peak QPS ({:g} s window)", s.qps_window_s), fmt::format("{:.3f}", s.peak_qps));
  if (s.out_of_order > 0) line("out-of-order arrivals", fmt::format("{}", s.out_of_order));
  line("input tokens", dist(s.input));
  line("output tokens", dist(s.output));
  line("I/O ratio (input/output tokens)", fmt::format("{:.1f}", s.io_ratio));
  line("prefill token share", pct(s.prefill_token_share));
  line("block size", strJoin(s.block_sizes, ", "));
  line("blocks (total / unique)", fmt::format("{} / {}", s.total_blocks, s.unique_blocks));
  line("unlimited cache hit, block-level", pct(s.hit_all.block));
  line("unlimited cache hit, token-level", pct(s.hit_all.token));
  line("  last 50% of requests, block-level", pct(s.hit_last_half.block));
  line("  last 50% of requests, token-level", pct(s.hit_last_half.token));
  if (s.has_sessions) {
    line("reuse intra-session / cross-session",
         fmt::format("{} / {}", pct(s.intra_session_reuse), pct(s.cross_session_reuse)));
    line("unique blocks shared by >1 session", pct(s.blocks_shared_across_sessions));
  }
  for (const auto& rr : s.round_robin) {
    line(fmt::format("round-robin x{} hit (block / token)", rr.instances),
         fmt::format("{} / {}", pct(rr.hit.block), pct(rr.hit.token)));
  }
  return o;
}

std::string formatStatsJson(const TraceStats& s) {
  auto dist = [](const LengthSummary& d) {
    return fmt::format(R"({{"mean": {}, "p50": {}, "p90": {}, "p99": {}, "max": {}}})", d.mean,
                       d.p50, d.p90, d.p99, d.max);
  };
  auto hit = [](const HitRatio& h) {
    return fmt::format(R"({{"block": {}, "token": {}}})", h.block, h.token);
  };
  std::string rr;
  for (const auto& r : s.round_robin) {
    if (!rr.empty()) rr += ", ";
    rr += fmt::format(R"({{"instances": {}, "hit": {}}})", r.instances, hit(r.hit));
  }
  std::string o = "{";
  fmt::format_to(std::back_inserter(o),
                 R"("requests": {}, "has_sessions": {}, "sessions": {}, "multi_turn_share": {}, )"
                 R"("turns_per_session": {}, "turns_per_multi_turn_session": {}, "span_s": {}, )"
                 R"("mean_qps": {}, "peak_qps": {}, "qps_window_s": {}, "out_of_order": {}, )",
                 s.requests, s.has_sessions, s.sessions, s.multi_turn_share, s.turns_per_session,
                 s.turns_per_multi_turn_session, s.span_s, s.mean_qps, s.peak_qps, s.qps_window_s,
                 s.out_of_order);
  fmt::format_to(std::back_inserter(o),
                 R"("input": {}, "output": {}, "input_tokens": {}, "output_tokens": {}, )"
                 R"("io_ratio": {}, "prefill_token_share": {}, "block_sizes": [{}], )"
                 R"("total_blocks": {}, "unique_blocks": {}, "hit_all": {}, "hit_last_half": {}, )",
                 dist(s.input), dist(s.output), s.input_tokens, s.output_tokens, s.io_ratio,
                 s.prefill_token_share, strJoin(s.block_sizes, ", "), s.total_blocks,
                 s.unique_blocks, hit(s.hit_all), hit(s.hit_last_half));
  fmt::format_to(std::back_inserter(o),
                 R"("intra_session_reuse": {}, "cross_session_reuse": {}, )"
                 R"("blocks_shared_across_sessions": {}, "round_robin": [{}]}})",
                 s.intra_session_reuse, s.cross_session_reuse, s.blocks_shared_across_sessions, rr);
  o += "\n";
  return o;
}

}  // namespace kvf::trace
