// Small string helpers on fmt. Debian's Abseil has its own absl::string_view (not an alias of
// std::string_view), so absl::StrCat/StrJoin cannot take our std::string_views; these can.
// Stateless; safe from any thread.
#pragma once

#include <iterator>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace kvf {

// Concatenates the "{}"-formatting of every argument (numbers in shortest round-trip form).
template <class... Args>
std::string strCat(const Args&... args) {
  std::string out;
  (fmt::format_to(std::back_inserter(out), "{}", args), ...);
  return out;
}

// Joins the "{}"-formatting of each element with `sep`.
template <class Range>
std::string strJoin(const Range& items, std::string_view sep) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out.append(sep);
    first = false;
    fmt::format_to(std::back_inserter(out), "{}", item);
  }
  return out;
}

// ASCII case-insensitive equality.
inline bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace kvf
