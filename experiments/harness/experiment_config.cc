#include "experiments/harness/experiment_config.h"

#include <filesystem>
#include <set>

#include "common/config.h"
#include "common/strings.h"
#include "policy/holder_set.h"

namespace kvf::experiments {

namespace fs = std::filesystem;

namespace {

// Paths in the file are relative to the file; they become absolute because the harness hands
// them to processes that resolve paths against their own config copies.
std::string resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty()) return path;
  fs::path p(path);
  if (p.is_relative()) p = fs::absolute(fs::path(base_dir) / p);
  return p.lexically_normal().string();
}

// A path field: `${NAME}` expanded, then resolved against the file's folder. A path built from
// a variable must exist, so a wrong KVF_TRACES_DIR is reported here with the field's line
// rather than later by the trace reader.
void getPath(config::ConfigMap& m, std::string_view key, const std::string& base_dir,
             const PathVariables& variables, std::string* out) {
  std::string raw;
  m.get(key, &raw);
  if (raw.empty()) return;
  auto expanded = expandPathVariables(raw, variables);
  if (!expanded.ok()) {
    m.fail(key, std::string(expanded.status().message()));
    return;
  }
  *out = resolve(base_dir, *expanded);
  if (*expanded != raw && !fs::exists(*out)) {
    m.fail(key, strCat(raw, " is ", *out, ", which does not exist"));
  }
}

void parseReplay(config::ConfigMap& m, ReplayOptions* out, uint64_t* salt) {
  m.getEnum("dispatch", &out->dispatch,
            {{"timestamp", DispatchMode::kTimestamp}, {"session", DispatchMode::kSession}});
  m.get("time_scale", &out->time_scale, 0.001, 1000.0);
  m.get("warmup_s", &out->warmup_s, 0.0, 1e9);
  m.get("max_in_flight", &out->max_in_flight, 0, int64_t{1} << 30);
  double timeout_s = static_cast<double>(out->timeout.count()) / 1000.0;
  m.get("timeout_s", &timeout_s, 0.1, 86400.0);
  out->timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  m.get("model", &out->model);
  m.get("salt", salt, 0, UINT64_MAX);
  m.rejectUnknownKeys();
}

// A `router:` section (the experiment's or an arm's): a map without the keys the harness sets.
bool checkRouterSection(config::ConfigMap& m, const YAML::Node& router) {
  if (!router.IsMap()) {
    m.fail("router", "expected a map of router settings");
    return false;
  }
  bool ok = true;
  for (const char* reserved : {"listen", "instances", "policy", "decision_log"}) {
    if (router[reserved]) {
      m.fail("router", strCat("'", reserved, "' is set by the harness, not the experiment"));
      ok = false;
    }
  }
  return ok;
}

void parseExperiment(config::ConfigMap& root, ExperimentConfig* out, const std::string& dir,
                     const PathVariables& variables) {
  root.require("name");
  root.get("name", &out->name);
  root.get("output_dir", &out->output_dir);
  root.require("trace");
  if (auto t = root.map("trace")) {
    t->require("path");
    getPath(*t, "path", dir, variables, &out->trace.path);
    t->get("format", &out->trace.format);
    t->get("start_s", &out->trace.start_s, 0.0, 1e9);
    t->get("duration_s", &out->trace.duration_s, 0.0, 1e9);
    t->get("limit", &out->trace.limit, 0, int64_t{1} << 40);
    t->get("max_input_tokens", &out->trace.max_input_tokens, 0, int64_t{1} << 40);
    t->get("conversation_rate", &out->trace.conversation_rate, 1e-9, 1e6);
    t->get("seed", &out->trace.seed, 0, UINT64_MAX);
    t->rejectUnknownKeys();
  }
  if (auto l = root.map("load")) {
    double utilisation = 0;
    l->get("utilisation", &utilisation, 0.001, 100.0);
    if (utilisation > 0) out->load.utilisation = utilisation;
    l->get("decode_batch", &out->load.decode_batch, 1, 4096);
    l->rejectUnknownKeys();
  }
  if (auto s = root.map("split")) {
    std::string by = "session";
    s->get("by", &by);
    if (by != "session") s->fail("by", "only 'session' is supported");
    out->split.enabled = true;
    s->get("validate_fraction", &out->split.validate_fraction, 0.0, 1.0);
    s->get("seed", &out->split.seed, 0, UINT64_MAX);
    s->getEnum("half", &out->split.half,
               {{"validate", SplitConfig::Half::kValidate}, {"tune", SplitConfig::Half::kTune}});
    s->rejectUnknownKeys();
  }
  if (auto r = root.map("replay")) parseReplay(*r, &out->replay, &out->salt);
  if (auto c = root.map("cluster")) {
    c->get("engines", &out->cluster.engines, 1, policy::kMaxInstances);
    c->require("engine_config");
    getPath(*c, "engine_config", dir, variables, &out->cluster.engine_config);
    c->get("engine_time_scale", &out->cluster.engine_time_scale, 0.001, 1000.0);
    c->get("startup_timeout_s", &out->cluster.startup_timeout_s, 1.0, 3600.0);
    c->get("workers", &out->cluster.workers);
    c->rejectUnknownKeys();
  } else {
    root.fail("cluster", "is required");
  }
  if (auto router = root.raw("router")) {
    if (checkRouterSection(root, *router)) out->router = *router;
  }
  root.get("repetitions", &out->repetitions, 1, 1000);
  std::set<std::string> names;
  for (auto& a : root.mapList("arms")) {
    ArmConfig arm;
    a.require("name");
    a.get("name", &arm.name);
    if (!arm.name.empty() && arm.name.find_first_of("/ \t") != std::string::npos) {
      a.fail("name", "must not contain '/' or spaces");
    }
    if (!names.insert(arm.name).second) a.fail("name", strCat("duplicate arm '", arm.name, "'"));
    a.require("policy");
    if (auto p = a.raw("policy")) arm.policy = *p;
    if (auto r = a.raw("router")) {
      if (checkRouterSection(a, *r)) arm.router = *r;
    }
    a.get("routers", &arm.routers, 1, 64);
    a.get("kv_connector", &arm.kv_connector);
    if (arm.kv_connector != "kvfabric" && arm.kv_connector != "nixl") {
      a.fail("kv_connector", "must be kvfabric or nixl");
    } else if (arm.kv_connector != "kvfabric" && !out->cluster.workers) {
      a.fail("kv_connector", "needs cluster.workers: true");
    }
    a.rejectUnknownKeys();
    out->arms.push_back(std::move(arm));
  }
  if (out->arms.empty()) root.fail("arms", "at least one arm is required");
  if (auto sim = root.raw("sim")) out->sim = *sim;
  if (auto sweep = root.raw("sweep")) out->sweep = *sweep;
}

}  // namespace

absl::StatusOr<std::string> expandPathVariables(const std::string& text,
                                                const PathVariables& variables) {
  std::string out;
  size_t at = 0;
  while (true) {
    size_t open = text.find("${", at);
    if (open == std::string::npos) break;
    size_t close = text.find('}', open);
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(strCat("unterminated '${' in \"", text, "\""));
    }
    std::string name = text.substr(open + 2, close - open - 2);
    if (name != kTracesDirVariable) {
      return absl::InvalidArgumentError(
          strCat("unknown variable ${", name, "}; paths may use ${", kTracesDirVariable, "} only"));
    }
    auto value = variables.find(name);
    if (value == variables.end() || value->second.empty()) {
      return absl::InvalidArgumentError(
          strCat("${", name, "} is not set: set ", name,
                 " to the folder that holds the optional trace sets (data/traces/README.md)"));
    }
    out += text.substr(at, open - at);
    out += value->second;
    at = close + 1;
  }
  return out + text.substr(at);
}

absl::StatusOr<ExperimentConfig> loadExperimentConfig(const std::string& path,
                                                      const PathVariables& variables) {
  std::string dir = fs::path(path).parent_path().string();
  auto parsed = config::parseFile<ExperimentConfig>(
      path, [&](config::ConfigMap& root, ExperimentConfig* out) {
        parseExperiment(root, out, dir, variables);
      });
  if (!parsed.ok()) return parsed.status();
  parsed->source = path;
  if (parsed->output_dir.empty()) parsed->output_dir = "experiments/results/" + parsed->name;
  return parsed;
}

void mergeYaml(YAML::Node base, const YAML::Node& over) {
  for (const auto& kv : over) {
    auto key = kv.first.as<std::string>();
    if (kv.second.IsMap() && base[key] && base[key].IsMap()) {
      mergeYaml(base[key], kv.second);
    } else {
      base[key] = YAML::Clone(kv.second);
    }
  }
}

YAML::Node armRouter(const ExperimentConfig& config, const ArmConfig& arm) {
  YAML::Node out =
      config.router.IsMap() ? YAML::Clone(config.router) : YAML::Node(YAML::NodeType::Map);
  if (arm.router.IsMap()) mergeYaml(out, arm.router);
  return out;
}

}  // namespace kvf::experiments
