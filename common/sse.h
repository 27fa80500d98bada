// Server-Sent Events: formatting events for a stream and an incremental parser for reading
// one (WHATWG event-stream rules: LF/CRLF/CR line ends, multi-line data, comments, event/id).
// A parser belongs to one stream and one thread.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvf::sse {

struct Event {
  std::string event;  // empty means "message"
  std::string data;   // data lines joined with '\n'
  std::string id;
};

// "data: <line>\n" for each line of `data`, then a blank line.
std::string formatData(std::string_view data);
// The same with an "event:" line first.
std::string formatEvent(std::string_view event, std::string_view data);

class Parser {
 public:
  explicit Parser(size_t max_event_bytes = 64 * 1024 * 1024) : max_event_bytes_(max_event_bytes) {}

  // Consumes bytes (any split); calls `on_event` for each completed event in order. Returns
  // ResourceExhausted if one event grows past the limit (the stream should then be dropped).
  absl::Status feed(std::string_view bytes, const std::function<void(Event&&)>& on_event);

  // Bytes held for an incomplete line or event.
  size_t pending() const { return line_.size() + current_.data.size(); }

 private:
  void processLine(std::string_view line, const std::function<void(Event&&)>& on_event);

  size_t max_event_bytes_;
  std::string line_;
  Event current_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
};

}  // namespace kvf::sse
