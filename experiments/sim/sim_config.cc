#include "experiments/sim/sim_config.h"

#include <set>

#include "common/config.h"
#include "common/strings.h"

namespace kvf::experiments::sim {

namespace {

void parseOverheads(config::ConfigMap& m, Overheads* o) {
  m.get("request_ms", &o->request_ms, 0.0, 60'000.0);
  m.get("request_per_ktoken_ms", &o->request_per_ktoken_ms, 0.0, 60'000.0);
  m.get("forward_ms", &o->forward_ms, 0.0, 60'000.0);
  m.get("forward_per_ktoken_ms", &o->forward_per_ktoken_ms, 0.0, 60'000.0);
  m.get("response_ms", &o->response_ms, 0.0, 60'000.0);
  m.get("kv_event_delay_ms", &o->kv_event_delay_ms, 0.0, 3'600'000.0);
  m.get("step_overhead_ms", &o->step_overhead_ms, 0.0, 60'000.0);
  m.get("jitter_ms", &o->jitter_ms, 0.0, 60'000.0);
  m.rejectUnknownKeys();
}

void parseReplicaSim(config::ConfigMap& m, ReplicaSim* r) {
  m.get("count", &r->count, 1, 64);
  m.get("sync", &r->sync);
  m.get("sync_interval_ms", &r->sync_interval_ms, 0.01, 10'000.0);
  m.get("snapshot_interval_ms", &r->snapshot_interval_ms, 0.01, 60'000.0);
  m.get("link_ms", &r->link_ms, 0.0, 10'000.0);
  m.get("peer_timeout_ms", &r->peer_timeout_ms, 1.0, 600'000.0);
  if (r->snapshot_interval_ms < r->sync_interval_ms) {
    m.fail("snapshot_interval_ms", "must be at least sync_interval_ms");
  }
  if (r->peer_timeout_ms <= r->snapshot_interval_ms + r->link_ms) {
    m.fail("peer_timeout_ms", "must be longer than snapshot_interval_ms + link_ms");
  }
  m.rejectUnknownKeys();
}

void parseSim(config::ConfigMap& m, SimOptions* out) {
  if (auto o = m.map("overheads")) parseOverheads(*o, &out->overheads);
  if (auto r = m.map("replicas")) parseReplicaSim(*r, &out->replicas);
  m.get("seed", &out->seed, 0, UINT64_MAX);
  m.get("jobs", &out->jobs, 0, 1024);
  m.get("repetitions", &out->repetitions, 0, 1000);
  m.get("decision_log", &out->decision_log);
  m.get("token_free", &out->token_free);
  if (auto e = m.raw("engine")) {
    if (!e->IsMap()) m.fail("engine", "expected a map of engine config overrides");
    out->engine = *e;
  }
  for (auto& f : m.mapList("failures")) {
    Failure failure;
    double at_s = 0, down_s = 0;
    f.require("instance");
    f.require("at_s");
    f.get("instance", &failure.instance, 0, 63);
    f.getEnum<FailureKind>("kind", &failure.kind,
                           {{"down", FailureKind::kDown},
                            {"error", FailureKind::kError},
                            {"stall", FailureKind::kStall},
                            {"refuse_push", FailureKind::kRefusePush},
                            {"drain", FailureKind::kDrain}});
    f.get("at_s", &at_s, 0.0, 1e9);
    f.get("down_s", &down_s, 0.0, 1e9);
    f.get("status", &failure.status, 400, 599);
    f.rejectUnknownKeys();
    failure.at = secondsToNanos(at_s);
    failure.down_for = secondsToNanos(down_s);
    out->failures.push_back(failure);
  }
  m.rejectUnknownKeys();
}

std::string scalarText(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string(); }

void setPathAt(YAML::Node node, const std::vector<std::string>& parts, size_t i,
               const YAML::Node& value) {
  if (i + 1 == parts.size()) {
    node[parts[i]] = YAML::Clone(value);
    return;
  }
  if (!node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
  setPathAt(node[parts[i]], parts, i + 1, value);
}

std::vector<std::string> splitDots(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    parts.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  return parts;
}

}  // namespace

void setPath(YAML::Node& root, const std::string& path, const YAML::Node& value) {
  std::vector<std::string> parts = splitDots(path);
  setPathAt(root, parts, 0, value);
}

absl::StatusOr<SimOptions> parseSimOptions(const YAML::Node& node, const std::string& source) {
  config::ConfigErrors errors(source);
  config::ConfigMap root(node, "sim", &errors);
  SimOptions out;
  parseSim(root, &out);
  if (!errors.empty()) return errors.status();
  return out;
}

absl::StatusOr<std::vector<Sweep>> parseSweeps(const YAML::Node& node,
                                               const std::vector<ArmConfig>& arms,
                                               const std::string& source) {
  std::vector<Sweep> sweeps;
  if (!node || node.IsNull()) return sweeps;
  // `sweep:` is one map or a list of maps.
  YAML::Node list(YAML::NodeType::Sequence);
  if (node.IsMap()) {
    list.push_back(node);
  } else {
    list.reset(node);
  }
  YAML::Node wrapper;
  wrapper["sweep"] = list;
  config::ConfigErrors errors(source);
  config::ConfigMap root(wrapper, "", &errors);
  std::set<std::string> arm_names;
  for (const auto& a : arms) arm_names.insert(a.name);
  for (auto& m : root.mapList("sweep")) {
    Sweep sweep;
    m.require("param");
    m.require("values");
    m.get("param", &sweep.param);
    static const char* kPrefixes[] = {"policy.", "sim.", "router.", "engine."};
    bool known = false;
    for (const char* p : kPrefixes) known = known || sweep.param.rfind(p, 0) == 0;
    if (!sweep.param.empty() &&
        (!known || sweep.param.find("..") != std::string::npos || sweep.param.back() == '.')) {
      m.fail("param", "must be a dotted path starting with policy., sim., router. or engine.");
    }
    if (auto v = m.raw("values")) {
      if (!v->IsSequence() || v->size() == 0) {
        m.fail("values", "must be a non-empty list of scalars");
      } else {
        for (const auto& item : *v) {
          if (!item.IsScalar() || item.Scalar().find_first_of("/ \t") != std::string::npos) {
            m.fail("values", "every value must be a scalar without '/' or spaces");
            break;
          }
          sweep.values.push_back(item);
        }
      }
    }
    m.get("arms", &sweep.arms);
    for (const auto& name : sweep.arms) {
      if (!arm_names.count(name)) m.fail("arms", strCat("no arm named '", name, "'"));
    }
    m.rejectUnknownKeys();
    sweeps.push_back(std::move(sweep));
  }
  if (!errors.empty()) return errors.status();
  return sweeps;
}

absl::StatusOr<std::vector<SimArm>> expandArms(const ExperimentConfig& config,
                                               const std::vector<Sweep>& sweeps) {
  std::vector<SimArm> out;
  auto base = [&](const ArmConfig& arm) {
    SimArm a;
    a.name = arm.name;
    a.policy = YAML::Clone(arm.policy);
    a.sim = config.sim.IsMap() ? YAML::Clone(config.sim) : YAML::Node(YAML::NodeType::Map);
    a.router = armRouter(config, arm);
    bool has_engine = config.sim.IsMap() && config.sim["engine"] && config.sim["engine"].IsMap();
    a.engine = has_engine ? YAML::Clone(config.sim["engine"]) : YAML::Node(YAML::NodeType::Map);
    return a;
  };
  std::set<std::string> names;
  for (const auto& arm : config.arms) {
    if (arm.kv_connector != "kvfabric") {
      return absl::InvalidArgumentError(
          strCat("arm ", arm.name, ": kv_connector ", arm.kv_connector,
                 ": the simulator models kvfabric's push only (use `kvf-experiment run`)"));
    }
    SimArm sim_arm = base(arm);
    if (arm.routers > 1) {
      // `routers: N` is N routing cores behind client-side round robin, as sim.replicas.count
      // models them; the two must not disagree.
      YAML::Node replicas = sim_arm.sim["replicas"];
      if (replicas && replicas.IsMap() && replicas["count"] &&
          replicas["count"].as<std::string>() != std::to_string(arm.routers)) {
        return absl::InvalidArgumentError(
            strCat("arm ", arm.name, ": routers: ", arm.routers,
                   " disagrees with sim.replicas.count: ", replicas["count"].as<std::string>()));
      }
      sim_arm.sim["replicas"]["count"] = arm.routers;
    }
    out.push_back(std::move(sim_arm));
    names.insert(arm.name);
  }
  for (size_t s = 0; s < sweeps.size(); ++s) {
    const Sweep& sweep = sweeps[s];
    size_t dot = sweep.param.find('.');
    std::string section = sweep.param.substr(0, dot);
    std::string rest = sweep.param.substr(dot + 1);
    std::string leaf = sweep.param.substr(sweep.param.rfind('.') + 1);
    for (const auto& arm : config.arms) {
      if (!sweep.arms.empty() &&
          std::find(sweep.arms.begin(), sweep.arms.end(), arm.name) == sweep.arms.end()) {
        continue;
      }
      for (const auto& value : sweep.values) {
        SimArm a = base(arm);
        YAML::Node& target = section == "policy"   ? a.policy
                             : section == "sim"    ? a.sim
                             : section == "router" ? a.router
                                                   : a.engine;
        if (!target.IsMap()) target = YAML::Node(YAML::NodeType::Map);
        setPath(target, rest, value);
        a.name = strCat(arm.name, "@", leaf, "=", scalarText(value));
        a.sweep_index = static_cast<int>(s);
        a.base_arm = arm.name;
        a.value = scalarText(value);
        if (!names.insert(a.name).second) {
          return absl::InvalidArgumentError(
              strCat(config.source, ": sweep[", s, "] gives a duplicate arm '", a.name, "'"));
        }
        out.push_back(std::move(a));
      }
    }
  }
  return out;
}

}  // namespace kvf::experiments::sim
