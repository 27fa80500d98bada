#include "common/config.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/strings.h"

namespace kvf::config {
namespace {

std::string position(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return strCat(source, ":", mark.line + 1, ":", mark.column + 1);
}

const char* typeName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Null:
      return "null";
    default:
      return "undefined";
  }
}

}  // namespace

absl::StatusOr<YAML::Node> parseYaml(std::string_view text, std::string_view source) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        strCat(position(std::string(source), e.mark), ": invalid YAML: ", e.msg));
  }
}

absl::StatusOr<YAML::Node> loadYamlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(strCat("cannot open config file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parseYaml(buffer.str(), path);
}

void ConfigErrors::add(const YAML::Mark& mark, std::string_view path, std::string_view message) {
  messages_.push_back(strCat(position(source_, mark), ": ", path, ": ", message));
}

void ConfigErrors::addAt(std::string_view path, std::string_view message) {
  messages_.push_back(strCat(source_, ": ", path, ": ", message));
}

absl::Status ConfigErrors::status() const {
  if (messages_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(strCat("invalid configuration (", messages_.size(), " problem",
                                           messages_.size() == 1 ? "" : "s", "):\n  ",
                                           strJoin(messages_, "\n  ")));
}

ConfigMap::ConfigMap(const YAML::Node& node, std::string path, ConfigErrors* errors)
    : node_(node), path_(std::move(path)), errors_(errors) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    errors_->add(node_.Mark(), path_.empty() ? "<root>" : path_,
                 strCat("expected a map, got ", typeName(node_)));
    node_ = YAML::Node(YAML::NodeType::Map);
  }
}

std::string ConfigMap::childPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : strCat(path_, ".", key);
}

YAML::Node ConfigMap::child(std::string_view key) const {
  // const access: the non-const operator[] of yaml-cpp may insert the key.
  const YAML::Node& node = node_;
  return node[std::string(key)];
}

bool ConfigMap::has(std::string_view key) const {
  if (!node_.IsMap()) return false;
  return static_cast<bool>(child(key));
}

void ConfigMap::fail(std::string_view key, std::string_view message) {
  YAML::Mark mark = node_.Mark();
  if (has(key)) mark = child(key).Mark();
  errors_->add(mark, childPath(key), message);
}

void ConfigMap::require(std::string_view key) {
  if (!has(key)) errors_->add(node_.Mark(), childPath(key), "is required");
}

std::optional<YAML::Node> ConfigMap::scalar(std::string_view key) {
  consumed_.emplace(key);
  if (!has(key)) return std::nullopt;
  YAML::Node value = child(key);
  if (!value.IsScalar()) {
    fail(key, strCat("expected a scalar, got ", typeName(value)));
    return std::nullopt;
  }
  return value;
}

void ConfigMap::get(std::string_view key, bool* out) {
  auto value = scalar(key);
  if (!value) return;
  const std::string& s = value->Scalar();
  if (s == "true" || s == "yes" || s == "on") {
    *out = true;
  } else if (s == "false" || s == "no" || s == "off") {
    *out = false;
  } else {
    fail(key, strCat("expected true or false, got \"", s, "\""));
  }
}

void ConfigMap::get(std::string_view key, std::string* out) {
  auto value = scalar(key);
  if (value) *out = value->Scalar();
}

template <class T>
bool ConfigMap::readInteger(std::string_view key, T* out, T min, T max) {
  auto value = scalar(key);
  if (!value) return false;
  const std::string& s = value->Scalar();
  T parsed{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), parsed);
  if (ec == std::errc::result_out_of_range) {
    fail(key, strCat("value ", s, " is out of range [", min, ", ", max, "]"));
    return false;
  }
  if (ec != std::errc() || end != s.data() + s.size()) {
    fail(key, strCat("expected an integer, got \"", s, "\""));
    return false;
  }
  if (parsed < min || parsed > max) {
    fail(key, strCat("value ", s, " is out of range [", min, ", ", max, "]"));
    return false;
  }
  *out = parsed;
  return true;
}

void ConfigMap::get(std::string_view key, int64_t* out, int64_t min, int64_t max) {
  readInteger(key, out, min, max);
}
void ConfigMap::get(std::string_view key, int* out, int min, int max) {
  readInteger(key, out, min, max);
}
void ConfigMap::get(std::string_view key, uint32_t* out, uint32_t min, uint32_t max) {
  readInteger(key, out, min, max);
}
void ConfigMap::get(std::string_view key, uint64_t* out, uint64_t min, uint64_t max) {
  readInteger(key, out, min, max);
}

namespace {
std::optional<double> parseDouble(const std::string& s) {
  double parsed = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), parsed);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(parsed)) {
    return std::nullopt;
  }
  return parsed;
}
}  // namespace

void ConfigMap::get(std::string_view key, double* out, double min, double max) {
  auto value = scalar(key);
  if (!value) return;
  auto parsed = parseDouble(value->Scalar());
  if (!parsed) {
    fail(key, strCat("expected a number, got \"", value->Scalar(), "\""));
  } else if (*parsed < min || *parsed > max) {
    fail(key, strCat("value ", value->Scalar(), " is out of range [", min, ", ", max, "]"));
  } else {
    *out = *parsed;
  }
}

void ConfigMap::get(std::string_view key, std::vector<std::string>* out) {
  consumed_.emplace(key);
  if (!has(key)) return;
  YAML::Node seq = child(key);
  if (!seq.IsSequence()) {
    fail(key, strCat("expected a list, got ", typeName(seq)));
    return;
  }
  out->clear();
  for (size_t i = 0; i < seq.size(); ++i) {
    if (!seq[i].IsScalar()) {
      errors_->add(seq[i].Mark(), strCat(childPath(key), "[", i, "]"), "expected a scalar");
      continue;
    }
    out->push_back(seq[i].Scalar());
  }
}

void ConfigMap::get(std::string_view key, std::vector<int64_t>* out, int64_t min, int64_t max) {
  std::vector<std::string> texts;
  get(key, &texts);
  if (!has(key)) return;
  out->clear();
  YAML::Node seq = child(key);
  for (size_t i = 0; i < texts.size(); ++i) {
    int64_t v = 0;
    auto [end, ec] = std::from_chars(texts[i].data(), texts[i].data() + texts[i].size(), v);
    std::string path = strCat(childPath(key), "[", i, "]");
    if (ec != std::errc() || end != texts[i].data() + texts[i].size()) {
      errors_->add(seq[i].Mark(), path, strCat("expected an integer, got \"", texts[i], "\""));
    } else if (v < min || v > max) {
      errors_->add(seq[i].Mark(), path,
                   strCat("value ", v, " is out of range [", min, ", ", max, "]"));
    } else {
      out->push_back(v);
    }
  }
}

void ConfigMap::get(std::string_view key, std::vector<double>* out, double min, double max) {
  std::vector<std::string> texts;
  get(key, &texts);
  if (!has(key)) return;
  out->clear();
  YAML::Node seq = child(key);
  for (size_t i = 0; i < texts.size(); ++i) {
    auto v = parseDouble(texts[i]);
    std::string path = strCat(childPath(key), "[", i, "]");
    if (!v) {
      errors_->add(seq[i].Mark(), path, strCat("expected a number, got \"", texts[i], "\""));
    } else if (*v < min || *v > max) {
      errors_->add(seq[i].Mark(), path,
                   strCat("value ", texts[i], " is out of range [", min, ", ", max, "]"));
    } else {
      out->push_back(*v);
    }
  }
}

std::optional<YAML::Node> ConfigMap::raw(std::string_view key) {
  consumed_.emplace(key);
  if (!has(key)) return std::nullopt;
  return child(key);
}

std::optional<ConfigMap> ConfigMap::map(std::string_view key) {
  consumed_.emplace(key);
  if (!has(key)) return std::nullopt;
  YAML::Node sub = child(key);
  if (sub.IsNull()) return ConfigMap(YAML::Node(YAML::NodeType::Map), childPath(key), errors_);
  if (!sub.IsMap()) {
    fail(key, strCat("expected a map, got ", typeName(sub)));
    return std::nullopt;
  }
  return ConfigMap(sub, childPath(key), errors_);
}

std::vector<ConfigMap> ConfigMap::mapList(std::string_view key) {
  consumed_.emplace(key);
  std::vector<ConfigMap> out;
  if (!has(key)) return out;
  YAML::Node seq = child(key);
  if (!seq.IsSequence()) {
    fail(key, strCat("expected a list, got ", typeName(seq)));
    return out;
  }
  for (size_t i = 0; i < seq.size(); ++i) {
    out.emplace_back(seq[i], strCat(childPath(key), "[", i, "]"), errors_);
  }
  return out;
}

void ConfigMap::forEachEntry(
    std::string_view key,
    const std::function<void(const std::string& name, ConfigMap& value)>& visit) {
  auto sub = map(key);
  if (!sub) return;
  for (const auto& entry : sub->node_) {
    std::string name = entry.first.Scalar();
    sub->consumed_.insert(name);
    ConfigMap value(entry.second, strCat(sub->path_, ".", name), errors_);
    visit(name, value);
  }
}

void ConfigMap::rejectUnknownKeys() {
  if (!node_.IsMap()) return;
  std::vector<std::string> expected(consumed_.begin(), consumed_.end());
  for (const auto& entry : node_) {
    std::string key = entry.first.Scalar();
    if (consumed_.count(key) == 0) {
      errors_->add(entry.first.Mark(), childPath(key),
                   expected.empty()
                       ? std::string("unknown key")
                       : strCat("unknown key (expected one of: ", strJoin(expected, ", "), ")"));
    }
  }
}

}  // namespace kvf::config
