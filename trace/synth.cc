#include "trace/synth.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <random>

#include "common/config.h"
#include "common/status.h"

namespace kvf::trace {

namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double exponential(double mean) { return -std::log1p(-uniform()) * mean; }
  double normal() { return normal_(gen_); }
  double logNormal(const LogNormalSpec& d) {
    double v = d.median * std::exp(d.sigma * normal());
    return std::clamp(v, d.min, d.max);
  }
  int64_t tokens(const LogNormalSpec& d) { return std::llround(logNormal(d)); }

 private:
  std::mt19937_64 gen_;
  std::normal_distribution<double> normal_;
};

struct Session {
  int64_t number = 0;
  int32_t prompt = 0;
  int32_t turns = 0;  // planned
  int32_t turn = 0;   // emitted so far
  size_t prompt_blocks = 0;
  std::vector<HashId> blocks;  // full blocks of the context
  int64_t tokens = 0;          // context length (full blocks + partial tail)
  int64_t last_output = 0;
  std::string last_id;
  Nanos next_think = -1;  // think time before the next turn
};

struct Event {
  Nanos at;
  int64_t seq;
  size_t slot;
  bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

class Generator {
 public:
  explicit Generator(const SynthConfig& c) : c_(c), rng_(c.seed) { buildPromptPool(); }

  absl::Status run(const std::function<absl::Status(const Request&)>& emit);

 private:
  void buildPromptPool();
  int32_t pickPrompt();
  int32_t pickTurns();
  double nextSessionGap();
  void append(Session& s, int64_t n) {
    s.tokens += n;
    auto full = static_cast<size_t>(s.tokens / c_.block_size);
    while (s.blocks.size() < full) s.blocks.push_back(next_id_++);
  }
  void truncate(Session& s, size_t keep_blocks) {
    s.blocks.resize(keep_blocks);
    s.tokens = static_cast<int64_t>(keep_blocks) * c_.block_size;
  }
  void advanceContext(Session& s);
  Request makeRequest(Session& s, Nanos at);

  const SynthConfig& c_;
  Rng rng_;
  HashId next_id_ = 1;
  std::vector<std::vector<HashId>> prompt_blocks_;
  std::vector<int64_t> prompt_tokens_;
  std::vector<double> prompt_cdf_;
  bool burst_on_ = false;
  double phase_left_s_ = 0;
};

void Generator::buildPromptPool() {
  double total = 0;
  for (int32_t k = 0; k < c_.system_prompts; ++k) {
    int64_t tokens = rng_.tokens(c_.system_prompt_tokens);
    std::vector<HashId> ids(static_cast<size_t>(tokens / c_.block_size));
    for (auto& id : ids) id = next_id_++;
    prompt_blocks_.push_back(std::move(ids));
    prompt_tokens_.push_back(tokens);
    total += 1.0 / std::pow(static_cast<double>(k + 1), c_.system_prompt_zipf);
    prompt_cdf_.push_back(total);
  }
  for (double& v : prompt_cdf_) v /= total;
}

int32_t Generator::pickPrompt() {
  double u = rng_.uniform();
  auto it = std::upper_bound(prompt_cdf_.begin(), prompt_cdf_.end(), u);
  return static_cast<int32_t>(std::min<ptrdiff_t>(it - prompt_cdf_.begin(),
                                                  static_cast<ptrdiff_t>(prompt_cdf_.size()) - 1));
}

int32_t Generator::pickTurns() {
  if (rng_.uniform() < c_.single_turn_share) return 1;
  // 2 + geometric on {0, 1, ...} with mean (multi_turn_mean_turns - 2).
  double extra_mean = c_.multi_turn_mean_turns - 2;
  if (c_.multi_turn_sigma > 0) {
    double median = extra_mean / std::exp(c_.multi_turn_sigma * c_.multi_turn_sigma / 2);
    double x = median * std::exp(c_.multi_turn_sigma * rng_.normal());
    return static_cast<int32_t>(std::min<double>(2 + std::floor(x + 0.5), c_.max_turns));
  }
  double p = 1.0 / (1.0 + extra_mean);
  int32_t turns = 2;
  if (extra_mean > 0) {
    turns += static_cast<int32_t>(std::floor(std::log1p(-rng_.uniform()) / std::log1p(-p)));
  }
  return std::min(turns, c_.max_turns);
}

double Generator::nextSessionGap() {
  if (c_.arrivals == SynthConfig::Arrivals::kPoisson) {
    return rng_.exponential(1.0 / c_.sessions_per_s);
  }
  // On/off modulated Poisson with the same long-run mean rate.
  double cycle = c_.burst_on_s + c_.burst_off_s;
  double off_rate = c_.sessions_per_s * cycle / (c_.burst_factor * c_.burst_on_s + c_.burst_off_s);
  double gap = 0;
  while (true) {
    if (phase_left_s_ <= 0) {
      burst_on_ = !burst_on_;
      phase_left_s_ = rng_.exponential(burst_on_ ? c_.burst_on_s : c_.burst_off_s);
    }
    double rate = burst_on_ ? off_rate * c_.burst_factor : off_rate;
    double next = rng_.exponential(1.0 / rate);
    if (next <= phase_left_s_) {
      phase_left_s_ -= next;
      return gap + next;
    }
    gap += phase_left_s_;  // memoryless: redraw in the next phase
    phase_left_s_ = 0;
  }
}

void Generator::advanceContext(Session& s) {
  if (s.turn == 0) {
    const auto& prompt = prompt_blocks_[static_cast<size_t>(s.prompt)];
    s.blocks = prompt;
    s.prompt_blocks = prompt.size();
    s.tokens = prompt_tokens_[static_cast<size_t>(s.prompt)];
    append(s, rng_.tokens(c_.first_turn_tokens));
    return;
  }
  if (rng_.uniform() < c_.prefix_break_prob && s.blocks.size() > s.prompt_blocks) {
    // Rewrite the history from a uniform point on: same length, new content.
    auto span = s.blocks.size() - s.prompt_blocks;
    size_t keep = s.prompt_blocks + static_cast<size_t>(rng_.uniform() * static_cast<double>(span));
    int64_t before = s.tokens;
    truncate(s, keep);
    append(s, before - s.tokens);
  }
  append(s, s.last_output + rng_.tokens(c_.turn_tokens));
  if (s.tokens > c_.max_context_tokens) {
    truncate(s, s.prompt_blocks);
    append(s, rng_.tokens(c_.compaction_tokens));
  }
}

Request Generator::makeRequest(Session& s, Nanos at) {
  advanceContext(s);
  ++s.turn;
  Request r;
  r.arrival = at;
  r.input_length = s.tokens;
  r.output_length = rng_.tokens(c_.output_tokens);
  r.block_size = c_.block_size;
  r.hash_ids = s.blocks;
  if (s.tokens % c_.block_size != 0) r.hash_ids.push_back(next_id_++);  // partial tail block
  r.session_id = strCat("s", s.number);
  r.turn = s.turn;
  r.id = strCat(r.session_id, "#", s.turn);
  r.parent_id = s.last_id;
  r.think_time = s.turn > 1 ? s.next_think : -1;
  r.type = "synthetic";
  s.last_output = r.output_length;
  s.last_id = r.id;
  return r;
}

absl::Status Generator::run(const std::function<absl::Status(const Request&)>& emit) {
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue;
  std::vector<Session> slots;
  std::vector<size_t> free_slots;
  int64_t planned = 0, emitted = 0, seq = 0, sessions = 0;
  double next_session_s = 0;
  while (emitted < c_.requests) {
    Nanos next_new = secondsToNanos(next_session_s);
    if (planned < c_.requests && (queue.empty() || next_new <= queue.top().at)) {
      Session s;
      s.number = sessions++;
      s.prompt = pickPrompt();
      s.turns = static_cast<int32_t>(std::min<int64_t>(pickTurns(), c_.requests - planned));
      planned += s.turns;
      size_t slot = slots.size();
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
        slots[slot] = std::move(s);
      } else {
        slots.push_back(std::move(s));
      }
      queue.push({next_new, seq++, slot});
      next_session_s += nextSessionGap();
      continue;
    }
    Event ev = queue.top();
    queue.pop();
    Session& s = slots[ev.slot];
    Request r = makeRequest(s, ev.at);
    KVF_RETURN_IF_ERROR(emit(r));
    ++emitted;
    if (s.turn < s.turns) {
      double think = rng_.logNormal(c_.think_time_s);
      double response =
          c_.response_base_s + c_.response_per_token_s * static_cast<double>(r.output_length);
      s.next_think = secondsToNanos(think);
      queue.push({ev.at + secondsToNanos(response + think), seq++, ev.slot});
    } else {
      s = Session{};
      free_slots.push_back(ev.slot);
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

void parseLogNormal(config::ConfigMap& root, std::string_view key, LogNormalSpec* out) {
  auto m = root.map(key);
  if (!m) return;
  m->get("median", &out->median, 0.0, 1e9);
  m->get("sigma", &out->sigma, 0.0, 10.0);
  m->get("min", &out->min, 0.0, 1e12);
  m->get("max", &out->max, 0.0, 1e12);
  if (out->min > out->max) m->fail("min", "must be <= max");
  m->rejectUnknownKeys();
}

void parseSynth(config::ConfigMap& root, SynthConfig* c) {
  *c = SynthConfig{};
  root.get("seed", &c->seed, 0, ~uint64_t{0});
  root.get("requests", &c->requests, 1, int64_t{1} << 40);
  root.get("block_size", &c->block_size, 1, 1 << 20);
  if (auto a = root.map("arrivals")) {
    a->getEnum(
        "process", &c->arrivals,
        {{"poisson", SynthConfig::Arrivals::kPoisson}, {"bursty", SynthConfig::Arrivals::kBursty}});
    a->get("sessions_per_s", &c->sessions_per_s, 1e-9, 1e9);
    a->get("burst_factor", &c->burst_factor, 1.0, 1e6);
    a->get("burst_on_s", &c->burst_on_s, 1e-6, 1e9);
    a->get("burst_off_s", &c->burst_off_s, 1e-6, 1e9);
    a->rejectUnknownKeys();
  }
  if (auto s = root.map("sessions")) {
    s->get("single_turn_share", &c->single_turn_share, 0.0, 1.0);
    s->get("multi_turn_mean_turns", &c->multi_turn_mean_turns, 2.0, 1e6);
    s->get("multi_turn_sigma", &c->multi_turn_sigma, 0.0, 5.0);
    s->get("max_turns", &c->max_turns, 2, 1 << 20);
    s->rejectUnknownKeys();
  }
  if (auto p = root.map("system_prompts")) {
    p->get("count", &c->system_prompts, 1, 1 << 24);
    p->get("zipf", &c->system_prompt_zipf, 0.0, 10.0);
    parseLogNormal(*p, "tokens", &c->system_prompt_tokens);
    p->rejectUnknownKeys();
  }
  parseLogNormal(root, "first_turn_tokens", &c->first_turn_tokens);
  parseLogNormal(root, "turn_tokens", &c->turn_tokens);
  parseLogNormal(root, "output_tokens", &c->output_tokens);
  parseLogNormal(root, "think_time_s", &c->think_time_s);
  if (auto r = root.map("response")) {
    r->get("base_s", &c->response_base_s, 0.0, 1e6);
    r->get("per_token_s", &c->response_per_token_s, 0.0, 1e3);
    r->rejectUnknownKeys();
  }
  root.get("prefix_break_prob", &c->prefix_break_prob, 0.0, 1.0);
  root.get("max_context_tokens", &c->max_context_tokens, 1, int64_t{1} << 40);
  parseLogNormal(root, "compaction_tokens", &c->compaction_tokens);
}

}  // namespace

absl::StatusOr<SynthConfig> loadSynthConfig(const std::string& path) {
  return config::parseFile<SynthConfig>(path, parseSynth);
}

absl::StatusOr<SynthConfig> parseSynthConfig(std::string_view yaml, std::string_view source) {
  return config::parseText<SynthConfig>(yaml, source, parseSynth);
}

absl::Status synthesize(const SynthConfig& config,
                        const std::function<absl::Status(const Request&)>& emit) {
  if (config.block_size < 1 || config.requests < 0 || config.system_prompts < 1 ||
      !(config.sessions_per_s > 0) || config.multi_turn_mean_turns < 2) {
    return absl::InvalidArgumentError("invalid synth config (see docs/traces.md for ranges)");
  }
  Generator generator(config);
  return generator.run(emit);
}

}  // namespace kvf::trace
