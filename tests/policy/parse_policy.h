// Test helper for tests/policy/: a PolicyConfig from the YAML of a `policy:` section, parsed as
// the router parses it (built-in registry); a parse error fails the calling test.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "common/config.h"
#include "policy/registry.h"

namespace kvf::policy {

inline absl::StatusOr<PolicyConfig> tryParsePolicy(std::string_view text) {
  return config::parseText<PolicyConfig>(
      text, "<test>", [](config::ConfigMap& m, PolicyConfig* out) { parsePolicyConfig(m, out); });
}

inline PolicyConfig parsePolicy(std::string_view text) {
  auto c = tryParsePolicy(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : PolicyConfig{};
}

inline PolicyConfig configFor(std::string_view kind) {
  return parsePolicy("kind: " + std::string(kind));
}

}  // namespace kvf::policy
