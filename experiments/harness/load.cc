#include "experiments/harness/load.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <unordered_map>

#include <yaml-cpp/yaml.h>

#include "common/splitmix.h"
#include "common/strings.h"

namespace kvf::experiments {

namespace {

// splitmix64: a seeded, well-mixed 64-bit hash of a session key's FNV-1a digest.
uint64_t mix(uint64_t x) { return splitmix64(x); }

uint64_t keyHash(const std::string& key, uint64_t seed) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  return mix(h ^ mix(seed));
}

// Session key of each request (requests with no key become sessions of their own).
std::vector<std::string> keysOf(const std::vector<trace::Request>& requests) {
  std::vector<std::string> keys;
  keys.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    std::string key = sessionKey(requests[i]);
    if (key.empty())
      key = strCat("request:", requests[i].id.empty() ? std::to_string(i) : requests[i].id);
    keys.push_back(std::move(key));
  }
  return keys;
}

double spanSeconds(const std::vector<trace::Request>& requests) {
  if (requests.empty()) return 0;
  auto [lo, hi] =
      std::minmax_element(requests.begin(), requests.end(),
                          [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
  return static_cast<double>(hi->arrival - lo->arrival) / 1e9;
}

}  // namespace

double requestWorkSeconds(const engine::TimingModel& model, const trace::Request& request,
                          int64_t chunk_tokens, int decode_batch) {
  double work = 0;
  if (request.input_length > 0) {
    double rate =
        model.prefillTokensPerSecond(request.input_length, std::max<int64_t>(1, chunk_tokens));
    if (rate > 0) work += static_cast<double>(request.input_length) / rate;
  }
  if (request.output_length > 0) {
    int batch = std::max(1, decode_batch);
    int64_t context = request.input_length + request.output_length / 2;
    work += static_cast<double>(request.output_length) * model.decodeStepSeconds(batch, context) /
            batch;
  }
  return work;
}

OfferedLoad offeredLoad(const std::vector<trace::Request>& requests, const WorkModel& work) {
  OfferedLoad out;
  out.requests = static_cast<int64_t>(requests.size());
  for (const auto& r : requests) {
    out.work_s += requestWorkSeconds(*work.model, r, work.chunk_tokens, work.decode_batch);
  }
  out.span_s = spanSeconds(requests);
  double modelled_span = out.span_s / work.trace_per_modelled;
  if (modelled_span > 0 && work.engines > 0) {
    out.utilisation = out.work_s / modelled_span / work.engines;
  }
  return out;
}

std::string sessionKey(const trace::Request& request) {
  if (request.hasSession()) return "session:" + request.session_id;
  if (request.hash_ids.empty()) return {};
  std::string key = strCat("chain:", request.hash_ids[0]);
  if (request.hash_ids.size() > 1) key += strCat(",", request.hash_ids[1]);
  return key;
}

SplitHalves splitBySession(std::vector<trace::Request> requests, const SplitConfig& split) {
  std::vector<std::string> keys = keysOf(requests);
  // Distinct sessions in a deterministic order: by seeded hash, ties by key.
  std::map<std::string, uint64_t> sessions;
  for (const auto& key : keys) sessions.emplace(key, 0);
  std::vector<std::pair<uint64_t, std::string>> order;
  order.reserve(sessions.size());
  for (const auto& [key, unused] : sessions) order.emplace_back(keyHash(key, split.seed), key);
  std::sort(order.begin(), order.end());
  auto n_validate = static_cast<size_t>(
      std::llround(split.validate_fraction * static_cast<double>(order.size())));
  std::unordered_map<std::string, bool> is_validate;
  for (size_t i = 0; i < order.size(); ++i) is_validate[order[i].second] = i < n_validate;
  SplitHalves out;
  out.validate_sessions = static_cast<int64_t>(n_validate);
  out.tune_sessions = static_cast<int64_t>(order.size() - n_validate);
  for (size_t i = 0; i < requests.size(); ++i) {
    (is_validate[keys[i]] ? out.validate : out.tune).push_back(std::move(requests[i]));
  }
  return out;
}

absl::StatusOr<double> scaleToUtilisation(std::vector<trace::Request>* requests, double target,
                                          const WorkModel& work) {
  if (!(target > 0)) return absl::InvalidArgumentError("load.utilisation must be > 0");
  if (requests->size() < 2) {
    return absl::InvalidArgumentError("load.utilisation needs a slice of at least 2 requests");
  }
  OfferedLoad base = offeredLoad(*requests, work);
  if (base.work_s <= 0) return absl::InvalidArgumentError("the slice has no modelled work");
  // Per request: its session's start and its offset from it. Only real sessions (session ids)
  // keep their turns' offsets; a request without one (Mooncake) is its own, so its timestamp
  // scales.
  std::vector<std::string> keys;
  keys.reserve(requests->size());
  for (size_t i = 0; i < requests->size(); ++i) {
    const trace::Request& r = (*requests)[i];
    keys.push_back(r.hasSession() ? r.session_id : strCat("\x01request:", i));
  }
  std::unordered_map<std::string, Nanos> start;
  Nanos first = INT64_MAX;
  for (size_t i = 0; i < requests->size(); ++i) {
    Nanos a = (*requests)[i].arrival;
    first = std::min(first, a);
    auto [it, inserted] = start.emplace(keys[i], a);
    if (!inserted) it->second = std::min(it->second, a);
  }
  std::vector<Nanos> session_start(requests->size()), offset(requests->size());
  for (size_t i = 0; i < requests->size(); ++i) {
    session_start[i] = start[keys[i]] - first;
    offset[i] = (*requests)[i].arrival - start[keys[i]];
  }
  auto span_at = [&](double f) {
    Nanos lo = INT64_MAX, hi = INT64_MIN;
    for (size_t i = 0; i < session_start.size(); ++i) {
      Nanos a = static_cast<Nanos>(f * static_cast<double>(session_start[i])) + offset[i];
      lo = std::min(lo, a);
      hi = std::max(hi, a);
    }
    return static_cast<double>(hi - lo) / 1e9;
  };
  auto util_at = [&](double f) {
    double span = span_at(f) / work.trace_per_modelled;
    return span > 0 ? base.work_s / span / work.engines : INFINITY;
  };
  if (util_at(0) < target) {
    return absl::InvalidArgumentError(
        strCat("load.utilisation ", target,
               " is out of reach: with every session starting at once the "
               "slice offers ",
               util_at(0), " (its sessions' own lengths bound the rate)"));
  }
  double lo = 1, hi = 1;  // util_at(lo) >= target >= util_at(hi)
  for (int i = 0; i < 200 && util_at(hi) > target; ++i) hi *= 2;
  for (int i = 0; i < 200 && util_at(lo) < target; ++i) lo /= 2;
  for (int i = 0; i < 100; ++i) {
    double mid = 0.5 * (lo + hi);
    (util_at(mid) >= target ? lo : hi) = mid;
  }
  double f = util_at(lo) - target <= target - util_at(hi) ? lo : hi;
  for (size_t i = 0; i < requests->size(); ++i) {
    (*requests)[i].arrival =
        first + static_cast<Nanos>(f * static_cast<double>(session_start[i])) + offset[i];
  }
  return f;
}

absl::Status writeLoadRecord(const std::string& path, const LoadRecord& r) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "offered_utilisation" << YAML::Value << r.load.utilisation;
  if (r.target) out << YAML::Key << "target_utilisation" << YAML::Value << *r.target;
  out << YAML::Key << "natural_utilisation" << YAML::Value << r.natural_utilisation;
  out << YAML::Key << "arrival_factor" << YAML::Value << r.arrival_factor;
  out << YAML::Key << "requests" << YAML::Value << r.load.requests;
  out << YAML::Key << "work_s" << YAML::Value << r.load.work_s;
  out << YAML::Key << "span_s" << YAML::Value << r.load.span_s;
  out << YAML::Key << "decode_batch" << YAML::Value << r.decode_batch;
  out << YAML::Key << "chunk_tokens" << YAML::Value << r.chunk_tokens;
  out << YAML::Key << "profile" << YAML::Value << r.profile;
  if (!r.split.empty()) {
    out << YAML::Key << "split" << YAML::Value << r.split;
    out << YAML::Key << "split_sessions" << YAML::Value << r.split_sessions;
    out << YAML::Key << "split_total_sessions" << YAML::Value << r.split_total_sessions;
  }
  out << YAML::EndMap;
  std::ofstream file(path);
  file << out.c_str() << "\n";
  return file ? absl::OkStatus() : absl::InternalError(strCat("cannot write ", path));
}

absl::StatusOr<LoadRecord> readLoadRecord(const std::string& path) {
  if (!std::filesystem::exists(path)) return absl::NotFoundError(strCat(path, " is absent"));
  LoadRecord r;
  try {
    YAML::Node n = YAML::LoadFile(path);
    r.load.utilisation = n["offered_utilisation"].as<double>(0);
    if (n["target_utilisation"]) r.target = n["target_utilisation"].as<double>();
    r.natural_utilisation = n["natural_utilisation"].as<double>(0);
    r.arrival_factor = n["arrival_factor"].as<double>(1);
    r.load.requests = n["requests"].as<int64_t>(0);
    r.load.work_s = n["work_s"].as<double>(0);
    r.load.span_s = n["span_s"].as<double>(0);
    r.decode_batch = n["decode_batch"].as<int>(0);
    r.chunk_tokens = n["chunk_tokens"].as<int64_t>(0);
    r.profile = n["profile"].as<std::string>("");
    r.split = n["split"].as<std::string>("");
    r.split_sessions = n["split_sessions"].as<int64_t>(0);
    r.split_total_sessions = n["split_total_sessions"].as<int64_t>(0);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(strCat(path, ": ", e.what()));
  }
  return r;
}

}  // namespace kvf::experiments
