// A reader for the Prometheus text exposition format, for scraped /metrics of engines and the
// router: samples with labels, looked up by name. Pure value code.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvf::experiments {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses every sample line (comments and blank lines are skipped). Malformed lines are errors
// naming the line number.
absl::StatusOr<std::vector<PromSample>> parsePromText(std::string_view text);

// Sum of all samples named `name` (any labels); nullopt when there are none.
std::optional<double> sumOf(const std::vector<PromSample>& samples, std::string_view name);

}  // namespace kvf::experiments
