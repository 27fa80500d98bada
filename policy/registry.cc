#include "policy/registry.h"

#include "common/strings.h"

namespace kvf::policy {

PolicyRegistry::PolicyRegistry(std::span<const PolicyDefinition* const> definitions) {
  for (const PolicyDefinition* d : definitions) {
    absl::Status added = add(*d);
    if (!added.ok()) {
      std::fprintf(stderr, "policy registry: %s\n", std::string(added.message()).c_str());
      std::abort();
    }
  }
}

absl::Status PolicyRegistry::add(const PolicyDefinition& definition) {
  if (definition.name.empty() || definition.create == nullptr) {
    return absl::InvalidArgumentError("a policy needs a name and a create function");
  }
  if (find(definition.name) != nullptr) {
    return absl::AlreadyExistsError(strCat("policy \"", definition.name, "\" already exists"));
  }
  std::shared_ptr<const PolicyParams> defaults;
  if (definition.parse != nullptr) {
    config::ConfigErrors errors{std::string(definition.name)};
    config::ConfigMap empty(YAML::Node(), std::string(definition.name), &errors);
    defaults = definition.parse(empty);
    if (!errors.empty() || defaults == nullptr) {
      return absl::InvalidArgumentError(
          strCat("policy \"", definition.name, "\": its parse of an empty block must succeed"));
    }
  }
  definitions_.push_back(definition);
  defaults_.push_back(std::move(defaults));
  return absl::OkStatus();
}

const PolicyDefinition* PolicyRegistry::find(std::string_view name) const {
  for (const PolicyDefinition& d : definitions_) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

const PolicyParams* PolicyRegistry::defaults(std::string_view name) const {
  for (size_t i = 0; i < definitions_.size(); ++i) {
    if (definitions_[i].name == name) return defaults_[i].get();
  }
  return nullptr;
}

std::string PolicyRegistry::names() const {
  std::string out;
  for (const PolicyDefinition& d : definitions_) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

const PolicyParams* PolicyConfig::find(std::string_view name) const {
  if (auto it = blocks.find(name); it != blocks.end()) return it->second.get();
  const PolicyRegistry& r = registry != nullptr ? *registry : PolicyRegistry::builtin();
  return r.defaults(name);
}

void parsePolicyConfig(config::ConfigMap& map, PolicyConfig* out, const PolicyRegistry& registry) {
  out->registry = &registry;
  if (map.has("kind")) {
    std::string kind;
    map.get("kind", &kind);
    if (registry.find(kind) != nullptr) {
      out->kind = kind;
    } else {
      map.fail("kind", strCat("must be one of: ", registry.names(), " (got \"", kind, "\")"));
    }
  }
  if (auto c = map.map("classify")) {
    c->get("warm_max_new_tokens", &out->classify.warm_max_new_tokens, 1, int64_t{1} << 40);
    c->get("medium_max_new_tokens", &out->classify.medium_max_new_tokens, 1, int64_t{1} << 40);
    if (out->classify.medium_max_new_tokens < out->classify.warm_max_new_tokens) {
      c->fail("medium_max_new_tokens", "must be >= warm_max_new_tokens");
    }
    c->rejectUnknownKeys();
  }
  double ttl_s = nanosToSeconds(out->session_ttl);
  map.get("session_ttl_s", &ttl_s, 0.001, 7 * 86400.0);
  out->session_ttl = secondsToNanos(ttl_s);
  uint64_t max_sessions = out->max_sessions;
  map.get("max_sessions", &max_sessions, 0, uint64_t{1} << 32);
  out->max_sessions = max_sessions;
  parseTierCredit(map, &out->tiers);
  // Every policy's block is read by its policy, whichever kind is chosen: a file that tunes
  // several policies (an experiment's arms) loads unchanged, and a typo in any block is found.
  for (const PolicyDefinition& d : registry.definitions()) {
    auto block = map.map(d.name);
    if (!block) continue;
    if (d.parse != nullptr) out->blocks[std::string(d.name)] = d.parse(*block);
    block->rejectUnknownKeys();
  }
}

std::unique_ptr<Policy> createPolicy(const PolicyConfig& config) {
  const PolicyRegistry& r =
      config.registry != nullptr ? *config.registry : PolicyRegistry::builtin();
  const PolicyDefinition* d = r.find(config.kind);
  return d == nullptr ? nullptr : d->create(config);
}

}  // namespace kvf::policy
