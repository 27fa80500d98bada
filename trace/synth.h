// Synthetic agentic traces: sessions that start with a system prompt from a shared, Zipf-popular
// pool, grow their context every turn (previous output + new tool/user tokens), pause for think
// time, and occasionally break their own prefix (context edits, compaction, context limit).
// Sessions arrive as a Poisson or bursty (on/off) process. The default config reproduces the
// statistics of seed 003 §2.3 (see docs/traces.md). Deterministic for a seed; single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "trace/request.h"

namespace kvf::trace {

// A log-normal distribution given by its median and sigma (of the underlying normal), clamped.
struct LogNormalSpec {
  double median = 1;
  double sigma = 0;
  double min = 0;
  double max = 1e12;
};

struct SynthConfig {
  uint64_t seed = 1;
  int64_t requests = 50000;  // exact number of requests generated
  int32_t block_size = 512;
  enum class Arrivals { kPoisson, kBursty };
  Arrivals arrivals = Arrivals::kPoisson;
  double sessions_per_s = 1.0;  // long-run mean session arrival rate
  // kBursty: on/off modulated Poisson; during "on" the rate is burst_factor x the "off" rate;
  // on/off durations are exponential with these means. The long-run mean stays sessions_per_s.
  double burst_factor = 8;
  double burst_on_s = 30;
  double burst_off_s = 120;

  double single_turn_share = 0.3;
  // Turns of a multi-turn session: 2 + X with mean multi_turn_mean_turns; X is geometric when
  // multi_turn_sigma is 0, else log-normal with that sigma (a heavier tail of long sessions).
  double multi_turn_mean_turns = 6.57;
  double multi_turn_sigma = 1.15;
  int32_t max_turns = 500;

  int32_t system_prompts = 256;  // size of the shared prompt pool
  double system_prompt_zipf = 0.5;
  LogNormalSpec system_prompt_tokens{7000, 0.8, 512, 60000};
  LogNormalSpec first_turn_tokens{700, 2.4, 16, 150000};  // new tokens in turn 1
  LogNormalSpec turn_tokens{550, 1.85, 1, 100000};        // new tokens in a later turn
  LogNormalSpec output_tokens{80, 1.9, 1, 16384};
  LogNormalSpec think_time_s{4, 1.2, 0, 3600};
  // The client sees the response after base + output_tokens x per_token seconds.
  double response_base_s = 1.0;
  double response_per_token_s = 0.02;
  // Per later turn: probability that the session rewrites part of its own history (the prefix
  // breaks at a uniform point of the history after the system prompt; the rest is re-sent as
  // new tokens).
  double prefix_break_prob = 0.6;
  int64_t max_context_tokens = 200000;  // beyond this the history is compacted
  LogNormalSpec compaction_tokens{6000, 0.5, 256, 40000};
};

// Parses a YAML config (every key optional; unknown keys and out-of-range values rejected).
absl::StatusOr<SynthConfig> loadSynthConfig(const std::string& path);
absl::StatusOr<SynthConfig> parseSynthConfig(std::string_view yaml, std::string_view source);

// Generates config.requests requests in arrival order, calling `emit` for each; stops early and
// returns its error if `emit` fails.
absl::Status synthesize(const SynthConfig& config,
                        const std::function<absl::Status(const Request&)>& emit);

}  // namespace kvf::trace
