// The policy registry: each routing policy is one file that defines a PolicyDefinition (its
// name, how to parse its own YAML block, how to create it); the built-in ones are listed once,
// in policy/CMakeLists.txt (KVF_BUILTIN_POLICIES), which generates PolicyRegistry::builtin().
// A registry is plain data, read-only once built; the built-in one is a static safe to read
// from any thread. See docs/extending.md ("Adding a routing policy").
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "policy/policy.h"

namespace kvf::policy {

struct PolicyDefinition {
  // The `kind:` value, and the key of the policy's own block in the `policy:` section.
  std::string_view name;
  // Reads the policy's block (`<name>: {...}`; an empty map gives the defaults), reporting bad
  // values through `block` with their field path. The caller rejects unknown keys. Null for a
  // policy without parameters (its block, if any, must be empty).
  std::shared_ptr<const PolicyParams> (*parse)(config::ConfigMap& block) = nullptr;
  // A new policy object for `config` (config.kind == name). Reads its parameters with
  // config.params<P>(name).
  std::unique_ptr<Policy> (*create)(const PolicyConfig& config) = nullptr;
};

// PolicyDefinition::create for a policy class constructed from the config.
template <class P>
std::unique_ptr<Policy> makePolicy(const PolicyConfig& config) {
  return std::make_unique<P>(config);
}

class PolicyRegistry {
 public:
  // The built-in policies, in the order of KVF_BUILTIN_POLICIES.
  static const PolicyRegistry& builtin();

  PolicyRegistry() = default;
  explicit PolicyRegistry(std::span<const PolicyDefinition* const> definitions);

  // Adds a policy; AlreadyExists for a name already registered, InvalidArgument without a
  // name or a create function.
  absl::Status add(const PolicyDefinition& definition);
  // Null when no policy has that name.
  const PolicyDefinition* find(std::string_view name) const;
  // The default parameters of policy `name` (its parse of an empty block); null for an unknown
  // name or a policy without parameters.
  const PolicyParams* defaults(std::string_view name) const;
  // "a, b, c": the registered names, for error messages.
  std::string names() const;
  std::span<const PolicyDefinition> definitions() const { return definitions_; }

 private:
  std::vector<PolicyDefinition> definitions_;
  std::vector<std::shared_ptr<const PolicyParams>> defaults_;  // parallel to definitions_
};

// Reads a `policy:` map: kind (a policy of `registry`), classify{warm_max_new_tokens,
// medium_max_new_tokens}, session_ttl_s, max_sessions, and one block per policy with
// parameters, named after it (linear{...}, hybrid{...}, unified{...}, elastic{...} for the
// built-in ones; see docs/policies.md), each parsed by its policy whatever the kind, so a file
// that carries several blocks loads as before. Unknown keys inside a block are rejected; the
// caller rejects unknown keys of the map itself. `registry` must outlive `out`.
void parsePolicyConfig(config::ConfigMap& map, PolicyConfig* out,
                       const PolicyRegistry& registry = PolicyRegistry::builtin());

// The policy `config.kind` names, from config.registry (the built-in ones when null). Null for
// a kind that registry does not know (parsePolicyConfig has already rejected it).
std::unique_ptr<Policy> createPolicy(const PolicyConfig& config);

}  // namespace kvf::policy
