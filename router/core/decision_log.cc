#include "router/core/decision_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <boost/json.hpp>

#include "common/strings.h"

namespace kvf::router {

std::string decisionToJson(const DecisionRecord& r) {
  namespace bj = boost::json;
  bj::object o;
  o["ts"] = r.ts;
  o["request_id"] = r.request_id;
  o["session"] = r.session;
  o["policy"] = r.policy;
  o["instance"] = r.instance;
  o["mode"] = r.mode;
  o["reason"] = r.reason;
  o["class"] = r.request_class;
  o["attempt"] = r.attempt;
  bj::array excluded;
  for (const std::string& id : r.excluded) excluded.emplace_back(id);
  o["excluded"] = std::move(excluded);
  o["prompt_tokens"] = r.prompt_tokens;
  o["predicted_cached_tokens"] = r.predicted_cached_tokens;
  if (r.actual_cached_tokens) {
    o["actual_cached_tokens"] = *r.actual_cached_tokens;
  } else {
    o["actual_cached_tokens"] = nullptr;
  }
  o["status"] = r.status;
  o["duration_s"] = r.duration_s;
  if (r.ttft_s) {
    o["ttft_s"] = *r.ttft_s;
  } else {
    o["ttft_s"] = nullptr;
  }
  auto numbers = [](const std::vector<std::pair<std::string, double>>& list) {
    bj::object out;
    for (const auto& [key, value] : list) {
      if (std::isnan(value)) {
        out[key] = nullptr;
      } else {
        out[key] = value;
      }
    }
    return out;
  };
  o["scores"] = numbers(r.scores);
  if (r.scores_omitted > 0) o["scores_omitted"] = r.scores_omitted;
  auto stringOrNull = [](const std::string& s) { return s.empty() ? bj::value() : bj::value(s); };
  o["source"] = stringOrNull(r.source);
  o["predicted_costs"] = numbers(r.predicted_costs);
  o["offload_prefill"] = stringOrNull(r.offload_prefill);
  if (std::isnan(r.peer_leg_s)) {
    o["peer_leg_s"] = nullptr;
  } else {
    o["peer_leg_s"] = r.peer_leg_s;
  }
  o["kv_connector"] = stringOrNull(r.kv_connector);
  if (r.transfer_status.empty()) {
    o["transfer"] = nullptr;
  } else {
    o["transfer"] = bj::object{{"status", r.transfer_status},
                               {"pushed_tokens", r.pushed_tokens},
                               {"pushed_bytes", r.pushed_bytes}};
  }
  if (std::isnan(r.move_s)) {
    o["move"] = nullptr;
  } else {
    double local = std::numeric_limits<double>::quiet_NaN();
    double chosen = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [key, value] : r.predicted_costs) {
      if (key == "local") local = value;
      if (key == "chosen") chosen = value;
    }
    const double predicted_gain = local - chosen;
    o["move"] = numbers({{"model_s", r.move_model_s},
                         {"predicted_s", r.move_s},
                         {"measured_s", r.move_measured_s},
                         {"predicted_gain_s", predicted_gain},
                         {"realised_gain_s", predicted_gain - (r.move_measured_s - r.move_s)}});
  }
  return bj::serialize(o);
}

absl::StatusOr<std::unique_ptr<DecisionLog>> DecisionLog::open(const std::string& path,
                                                               size_t keep_recent) {
  std::FILE* file = nullptr;
  if (!path.empty()) {
    file = std::fopen(path.c_str(), "a");
    if (file == nullptr) {
      return absl::InvalidArgumentError(
          strCat("decision_log: cannot open \"", path, "\": ", std::strerror(errno)));
    }
  }
  return std::unique_ptr<DecisionLog>(new DecisionLog(file, keep_recent));
}

DecisionLog::~DecisionLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void DecisionLog::write(DecisionRecord record) {
  if (file_ != nullptr) {
    std::string line = decisionToJson(record);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
  ++written_;
  if (keep_recent_ == 0) return;
  recent_.push_back(std::move(record));
  while (recent_.size() > keep_recent_) recent_.pop_front();
}

std::vector<std::string> DecisionLog::recent() const {
  std::vector<std::string> out;
  out.reserve(recent_.size());
  for (const DecisionRecord& record : recent_) out.push_back(decisionToJson(record));
  return out;
}

}  // namespace kvf::router
