// YAML configuration loading into plain structs. A config parser walks the document with
// ConfigMap, which tracks the field path of every value, collects every problem (wrong type,
// out of range, unknown key, missing required key) with file:line:column, and turns them into
// one InvalidArgument status. Objects are single-threaded and live only while parsing.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"

namespace kvf::config {

// Parses YAML text; `source` names it in error messages (a file path, "<inline>").
absl::StatusOr<YAML::Node> parseYaml(std::string_view text, std::string_view source);
// Reads and parses a YAML file.
absl::StatusOr<YAML::Node> loadYamlFile(const std::string& path);

// Accumulates problems found while parsing one document.
class ConfigErrors {
 public:
  explicit ConfigErrors(std::string source) : source_(std::move(source)) {}

  void add(const YAML::Mark& mark, std::string_view path, std::string_view message);
  void addAt(std::string_view path, std::string_view message);  // no position known
  bool empty() const { return messages_.empty(); }
  const std::vector<std::string>& messages() const { return messages_; }
  // OK when there were no problems, else InvalidArgument listing every one, one per line.
  absl::Status status() const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::string> messages_;
};

// A view of one YAML mapping at a field path. Getters leave the output untouched when the key
// is absent (the struct's default stays), and record an error when the value is present but
// wrong. rejectUnknownKeys() reports every key that no getter asked for.
class ConfigMap {
 public:
  // `node` may be null/undefined (treated as an empty map); anything else that is not a map is
  // an error.
  ConfigMap(const YAML::Node& node, std::string path, ConfigErrors* errors);

  bool has(std::string_view key) const;
  const std::string& path() const { return path_; }
  ConfigErrors* errors() const { return errors_; }
  YAML::Mark mark() const { return node_.Mark(); }

  void get(std::string_view key, bool* out);
  void get(std::string_view key, std::string* out);
  void get(std::string_view key, int64_t* out, int64_t min, int64_t max);
  void get(std::string_view key, int* out, int min, int max);
  void get(std::string_view key, uint32_t* out, uint32_t min, uint32_t max);
  void get(std::string_view key, uint64_t* out, uint64_t min, uint64_t max);
  void get(std::string_view key, double* out, double min, double max);
  void get(std::string_view key, std::vector<std::string>* out);
  void get(std::string_view key, std::vector<int64_t>* out, int64_t min, int64_t max);
  void get(std::string_view key, std::vector<double>* out, double min, double max);

  // A string value that must be one of `choices`; stores the matching enum value.
  template <class E>
  void getEnum(std::string_view key, E* out,
               std::initializer_list<std::pair<std::string_view, E>> choices) {
    std::string text;
    if (!has(key)) return;
    get(key, &text);
    for (const auto& [name, value] : choices) {
      if (text == name) {
        *out = value;
        return;
      }
    }
    std::string allowed;
    for (const auto& [name, value] : choices) {
      if (!allowed.empty()) allowed += ", ";
      allowed += name;
    }
    fail(key, "must be one of: " + allowed + " (got \"" + text + "\")");
  }

  // Records an error if the key is absent.
  void require(std::string_view key);

  // The raw YAML value at `key` (nullopt when absent), marked as consumed; for values passed on
  // verbatim to another component that validates them itself.
  std::optional<YAML::Node> raw(std::string_view key);

  // A nested mapping (nullopt when absent or not a map; the latter is recorded as an error).
  std::optional<ConfigMap> map(std::string_view key);
  // A sequence of mappings; each element's path is "key[i]".
  std::vector<ConfigMap> mapList(std::string_view key);
  // A mapping whose keys are free-form names (e.g. per-arm settings); visits each entry.
  void forEachEntry(std::string_view key,
                    const std::function<void(const std::string& name, ConfigMap& value)>& visit);

  // Records a custom validation error at `key` (e.g. cross-field constraints).
  void fail(std::string_view key, std::string_view message);
  // Reports every key present in the map that no getter consumed.
  void rejectUnknownKeys();

 private:
  YAML::Node child(std::string_view key) const;
  std::optional<YAML::Node> scalar(std::string_view key);
  std::string childPath(std::string_view key) const;
  template <class T>
  bool readInteger(std::string_view key, T* out, T min, T max);

  YAML::Node node_;
  std::string path_;
  ConfigErrors* errors_;
  std::set<std::string, std::less<>> consumed_;
};

// Convenience: parse a whole YAML file with `parse(ConfigMap& root, T* out)`; returns the
// struct or every error found.
template <class T>
absl::StatusOr<T> parseFile(const std::string& path,
                            const std::function<void(ConfigMap&, T*)>& parse) {
  auto node = loadYamlFile(path);
  if (!node.ok()) return node.status();
  ConfigErrors errors(path);
  ConfigMap root(*node, "", &errors);
  T out{};
  parse(root, &out);
  root.rejectUnknownKeys();
  if (!errors.empty()) return errors.status();
  return out;
}

template <class T>
absl::StatusOr<T> parseText(std::string_view text, std::string_view source,
                            const std::function<void(ConfigMap&, T*)>& parse) {
  auto node = parseYaml(text, source);
  if (!node.ok()) return node.status();
  ConfigErrors errors{std::string(source)};
  ConfigMap root(*node, "", &errors);
  T out{};
  parse(root, &out);
  root.rejectUnknownKeys();
  if (!errors.empty()) return errors.status();
  return out;
}

}  // namespace kvf::config
