#include "experiments/report/prom_text.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "common/strings.h"

namespace kvf::experiments {

namespace {

std::optional<double> parseValue(std::string_view s) {
  if (s == "+Inf" || s == "Inf") return std::numeric_limits<double>::infinity();
  if (s == "-Inf") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// Parses `{a="x",b="y"}` starting at text[*pos] == '{'; advances *pos past '}'.
bool parseLabels(std::string_view text, size_t* pos, std::map<std::string, std::string>* out) {
  size_t i = *pos + 1;
  while (i < text.size() && text[i] != '}') {
    size_t eq = text.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= text.size() || text[eq + 1] != '"') return false;
    std::string key(text.substr(i, eq - i));
    std::string value;
    size_t j = eq + 2;
    for (; j < text.size() && text[j] != '"'; ++j) {
      if (text[j] == '\\' && j + 1 < text.size()) {
        ++j;
        value.push_back(text[j] == 'n' ? '\n' : text[j]);
      } else {
        value.push_back(text[j]);
      }
    }
    if (j >= text.size()) return false;
    (*out)[key] = value;
    i = j + 1;
    if (i < text.size() && text[i] == ',') ++i;
  }
  if (i >= text.size()) return false;
  *pos = i + 1;
  return true;
}

}  // namespace

absl::StatusOr<std::vector<PromSample>> parsePromText(std::string_view text) {
  std::vector<PromSample> out;
  size_t start = 0;
  int line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    PromSample sample;
    size_t pos = line.find_first_of("{ ");
    if (pos == std::string_view::npos) {
      return absl::InvalidArgumentError(strCat("metrics line ", line_no, ": no value"));
    }
    sample.name = std::string(line.substr(0, pos));
    if (line[pos] == '{' && !parseLabels(line, &pos, &sample.labels)) {
      return absl::InvalidArgumentError(strCat("metrics line ", line_no, ": bad labels"));
    }
    std::string_view rest = line.substr(pos);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    std::string_view value_text = rest.substr(0, rest.find(' '));  // a timestamp may follow
    auto value = parseValue(value_text);
    if (!value) {
      return absl::InvalidArgumentError(strCat("metrics line ", line_no, ": bad value"));
    }
    sample.value = *value;
    out.push_back(std::move(sample));
  }
  return out;
}

std::optional<double> sumOf(const std::vector<PromSample>& samples, std::string_view name) {
  std::optional<double> sum;
  for (const auto& s : samples) {
    if (s.name == name) sum = sum.value_or(0) + s.value;
  }
  return sum;
}

}  // namespace kvf::experiments
