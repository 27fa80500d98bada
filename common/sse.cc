#include "common/sse.h"

#include "common/strings.h"

namespace kvf::sse {

namespace {
void appendLines(std::string& out, std::string_view data) {
  size_t start = 0;
  while (true) {
    size_t end = data.find('\n', start);
    std::string_view line = data.substr(start, end == std::string_view::npos ? end : end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out += "data: ";
    out += line;
    out += '\n';
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  out += '\n';
}
}  // namespace

std::string formatData(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  appendLines(out, data);
  return out;
}

std::string formatEvent(std::string_view event, std::string_view data) {
  std::string out = strCat("event: ", event, "\n");
  appendLines(out, data);
  return out;
}

absl::Status Parser::feed(std::string_view bytes, const std::function<void(Event&&)>& on_event) {
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {
      last_was_cr_ = false;  // the LF of a CRLF pair
      continue;
    }
    last_was_cr_ = (c == '\r');
    if (c == '\n' || c == '\r') {
      processLine(line_, on_event);
      line_.clear();
      continue;
    }
    line_.push_back(c);
    if (line_.size() + current_.data.size() > max_event_bytes_) {
      return absl::ResourceExhaustedError(
          strCat("SSE event larger than ", max_event_bytes_, " bytes"));
    }
  }
  return absl::OkStatus();
}

void Parser::processLine(std::string_view line, const std::function<void(Event&&)>& on_event) {
  if (line.empty()) {
    if (has_data_) {
      on_event(std::move(current_));
    }
    current_ = Event{};
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) current_.data.push_back('\n');
    current_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    current_.event.assign(value);
  } else if (field == "id") {
    current_.id.assign(value);
  }
}

}  // namespace kvf::sse
