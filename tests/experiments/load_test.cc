// Offered utilisation and the held-out split (experiments/harness/load.h): the work model
// against the profile's own anchors, scaling a real trace to a target utilisation, the split's
// determinism, disjointness, fraction and unbroken sessions, and the experiment file's keys.
#include "experiments/harness/load.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "experiments/harness/experiment_config.h"
#include "experiments/harness/harness.h"
#include "tests/testing/temp_dir.h"
#include "trace/reader.h"

namespace kvf::experiments {
namespace {

namespace fs = std::filesystem;
using kvf::testing::freshTempDir;

std::string sourceDir() {
  const char* src = std::getenv("KVF_SOURCE_DIR");
  return src != nullptr ? src : ".";
}

engine::TimingModel h20Model() {
  auto profile = engine::loadProfile(sourceDir() + "/engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  EXPECT_TRUE(profile.ok()) << profile.status();
  return engine::TimingModel(*profile);
}

std::vector<trace::Request> mooncake(const std::string& name) {
  auto requests = trace::readAll(sourceDir() + "/data/traces/mooncake/" + name, {});
  EXPECT_TRUE(requests.ok()) << requests.status();
  return *requests;
}

// The work of one request is the profile's claimed figures: a cold prefill of the anchor prompt
// takes anchor tokens / anchor rate, and a decode at batch 1 costs the anchor TPOT per token.
TEST(Load, WorkModelReproducesTheProfileAnchors) {
  engine::TimingModel model = h20Model();
  const auto& a = model.profile().anchors;
  trace::Request prefill;
  prefill.input_length = a.prefill_prompt_tokens;
  double expected_prefill = static_cast<double>(a.prefill_prompt_tokens) / a.prefill_tokens_per_s;
  EXPECT_NEAR(requestWorkSeconds(model, prefill, a.prefill_chunk_tokens, a.tpot_batch),
              expected_prefill, 0.05 * expected_prefill);
  trace::Request decode;
  decode.input_length = a.tpot_context_tokens;
  decode.output_length = 2;  // mean context = input + 1 ~ the anchor context
  double with_decode = requestWorkSeconds(model, decode, a.prefill_chunk_tokens, a.tpot_batch);
  double prefill_only = requestWorkSeconds(model, {.input_length = a.tpot_context_tokens},
                                           a.prefill_chunk_tokens, a.tpot_batch);
  EXPECT_NEAR(with_decode - prefill_only, 2 * a.tpot_s, 0.05 * 2 * a.tpot_s);
  // A larger reference batch shares each step's fixed cost: decode per token gets cheaper.
  EXPECT_LT(requestWorkSeconds(model, decode, a.prefill_chunk_tokens, 32), with_decode);
}

TEST(Load, ScalingReachesTheTargetUtilisation) {
  engine::TimingModel model = h20Model();
  for (const char* name : {"conversation_trace.jsonl", "synthetic_trace.jsonl"}) {
    for (double target : {0.3, 0.9, 1.2}) {
      std::vector<trace::Request> requests = mooncake(name);
      WorkModel work{.model = &model, .chunk_tokens = 8192, .decode_batch = 32, .engines = 8};
      auto factor = scaleToUtilisation(&requests, target, work);
      ASSERT_TRUE(factor.ok()) << factor.status();
      // Measured here from the scaled arrivals: summed work over (span x engines).
      double total = 0;
      Nanos first = INT64_MAX, last = INT64_MIN;
      for (const auto& r : requests) {
        total += requestWorkSeconds(model, r, 8192, 32);
        first = std::min(first, r.arrival);
        last = std::max(last, r.arrival);
      }
      double measured = total / (static_cast<double>(last - first) / 1e9) / 8;
      EXPECT_NEAR(measured, target, 0.01 * target) << name;
      // Without session ids every timestamp scales by the same factor (nothing stays grouped).
      std::vector<trace::Request> original = mooncake(name);
      for (size_t i = 0; i < requests.size(); i += 97) {
        double expected = *factor * static_cast<double>(original[i].arrival - original[0].arrival);
        EXPECT_NEAR(static_cast<double>(requests[i].arrival - requests[0].arrival), expected, 2.0);
      }
      // The replay and engine time scales enter as trace seconds per modelled second.
      work.trace_per_modelled = 4;
      std::vector<trace::Request> again = mooncake(name);
      ASSERT_TRUE(scaleToUtilisation(&again, target, work).ok());
      EXPECT_NEAR(offeredLoad(again, work).utilisation, target, 0.01 * target);
      EXPECT_NEAR(offeredLoad(again, {.model = &model, .engines = 8}).utilisation, target / 4,
                  0.01 * target);
    }
  }
}

trace::Request turn(const std::string& session, double at_s, int64_t input = 2000) {
  trace::Request r;
  r.session_id = session;
  r.id = session + "#" + std::to_string(at_s);
  r.arrival = secondsToNanos(at_s);
  r.input_length = input;
  r.output_length = 100;
  r.block_size = 512;
  return r;
}

TEST(Load, ScalingMovesSessionStartsAndKeepsTurnOffsets) {
  engine::TimingModel model = h20Model();
  std::vector<trace::Request> requests;
  for (int s = 0; s < 20; ++s) {
    for (int t = 0; t < 3; ++t)
      requests.push_back(turn("s" + std::to_string(s), s * 100.0 + t * 7.0));
  }
  std::vector<trace::Request> original = requests;
  WorkModel work{.model = &model, .engines = 2};
  double before = offeredLoad(requests, work).utilisation;
  auto factor = scaleToUtilisation(&requests, 3 * before, work);
  ASSERT_TRUE(factor.ok()) << factor.status();
  EXPECT_LT(*factor, 1.0);
  EXPECT_NEAR(offeredLoad(requests, work).utilisation, 3 * before, 0.01 * before);
  for (size_t i = 0; i < requests.size(); i += 3) {
    EXPECT_EQ(requests[i + 2].arrival - requests[i].arrival, secondsToNanos(14));
  }
  // A target no start times can reach (every session at once still spans 14 s) is an error.
  auto unreachable = scaleToUtilisation(&original, 1e6, work);
  ASSERT_FALSE(unreachable.ok());
  EXPECT_NE(unreachable.status().message().find("out of reach"), std::string::npos);
}

TEST(Load, SplitIsDeterministicDisjointAndKeepsSessionsWhole) {
  std::vector<trace::Request> requests = mooncake("conversation_trace.jsonl");
  std::map<std::string, int> per_session;
  for (const auto& r : requests) per_session[sessionKey(r)]++;
  SplitConfig split{.enabled = true, .validate_fraction = 0.5, .seed = 3};
  SplitHalves a = splitBySession(requests, split);
  SplitHalves b = splitBySession(requests, split);
  EXPECT_EQ(a.tune.size() + a.validate.size(), requests.size());
  ASSERT_EQ(a.validate.size(), b.validate.size());
  for (size_t i = 0; i < a.validate.size(); ++i) EXPECT_EQ(a.validate[i].id, b.validate[i].id);
  std::set<std::string> tune_keys, validate_keys;
  for (const auto& r : a.tune) tune_keys.insert(sessionKey(r));
  for (const auto& r : a.validate) validate_keys.insert(sessionKey(r));
  for (const auto& key : validate_keys) EXPECT_EQ(tune_keys.count(key), 0u) << key;  // never cut
  // The fraction is of sessions: exactly round(0.5 x sessions) of them.
  EXPECT_EQ(static_cast<int64_t>(validate_keys.size()), a.validate_sessions);
  EXPECT_EQ(a.validate_sessions, std::llround(0.5 * static_cast<double>(per_session.size())));
  EXPECT_EQ(static_cast<int64_t>(tune_keys.size()), a.tune_sessions);
  // Sessions are the first two blocks of a chain: one shared system block does not tie them.
  EXPECT_GT(per_session.size(), requests.size() / 2);
  // Another seed draws another split; 0.2 keeps a fifth of the sessions.
  SplitHalves c = splitBySession(requests, {.enabled = true, .validate_fraction = 0.5, .seed = 4});
  std::set<std::string> c_keys;
  for (const auto& r : c.validate) c_keys.insert(sessionKey(r));
  EXPECT_NE(c_keys, validate_keys);
  SplitHalves d = splitBySession(requests, {.enabled = true, .validate_fraction = 0.2, .seed = 3});
  EXPECT_EQ(d.validate_sessions, std::llround(0.2 * static_cast<double>(per_session.size())));
}

TEST(Load, SessionIdsDefineSessionsWhenPresent) {
  std::vector<trace::Request> requests;
  for (int s = 0; s < 40; ++s) {
    for (int t = 0; t < 4; ++t) requests.push_back(turn("c" + std::to_string(s), s + t));
  }
  SplitHalves halves = splitBySession(requests, {.enabled = true, .validate_fraction = 0.25});
  EXPECT_EQ(halves.validate_sessions, 10);
  EXPECT_EQ(halves.validate.size(), 40u);
  std::map<std::string, int> count;
  for (const auto& r : halves.validate) count[r.session_id]++;
  for (const auto& [session, n] : count) EXPECT_EQ(n, 4) << session;
}

TEST(Load, ExperimentFileAndHarnessApplyLoadAndSplit) {
  fs::path dir = freshTempDir("kvf_exp_load");
  std::string src = sourceDir();
  {
    std::ofstream f(dir / "exp.yaml");
    f << "name: load\ntrace: {path: " << src << "/data/traces/mooncake/synthetic_trace.jsonl}\n"
      << "load: {utilisation: 0.6}\nsplit: {by: session, validate_fraction: 0.5, seed: 2}\n"
      << "cluster: {engines: 8, engine_config: " << src << "/engine/configs/engine.yaml}\n"
      << "output_dir: " << (dir / "out").string() << "\n"
      << "arms: [{name: rr, policy: {kind: round_robin}}]\n";
  }
  auto config = loadExperimentConfig((dir / "exp.yaml").string());
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->load.utilisation.has_value());
  EXPECT_DOUBLE_EQ(*config->load.utilisation, 0.6);
  EXPECT_TRUE(config->split.enabled);
  Harness harness(*config, "/nonexistent");
  ASSERT_TRUE(harness.prepareTrace().ok());
  auto record = readLoadRecord((dir / "out" / "load.yaml").string());
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_NEAR(record->load.utilisation, 0.6, 0.006);
  EXPECT_EQ(record->split, "validate");
  EXPECT_EQ(record->load.requests, static_cast<int64_t>(harness.requests().size()));
  EXPECT_LT(harness.requests().size(), mooncake("synthetic_trace.jsonl").size());

  std::ofstream(dir / "bad.yaml") << "name: bad\ntrace: {path: x}\nsplit: {by: turn}\n"
                                  << "cluster: {engine_config: y}\narms: [{name: a, policy: {}}]\n";
  auto bad = loadExperimentConfig((dir / "bad.yaml").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("by"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace kvf::experiments
