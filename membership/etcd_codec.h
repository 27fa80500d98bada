// The JSON of etcd's v3 gRPC gateway (grpc-gateway over api/etcdserverpb/rpc.proto): request
// bodies for the KV, lease and watch calls kvfabric uses, and the decoding of their responses.
// Keys and values are bytes, so base64 in JSON; 64-bit integers are JSON strings (numbers are
// accepted too); fields at their default value are omitted by the gateway (a PUT event has no
// "type", a lease that is gone answers a keep-alive without "TTL"). Pure functions, no I/O;
// safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvf::membership {

struct ResponseHeader {
  uint64_t cluster_id = 0;
  uint64_t member_id = 0;
  int64_t revision = 0;  // the store's revision when the request was served
  uint64_t raft_term = 0;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  // 0: no lease
};

struct RangeResult {
  ResponseHeader header;
  std::vector<KeyValue> kvs;
  bool more = false;  // a limit cut the result short
  int64_t count = 0;  // keys in the whole range
};

struct LeaseGrantResult {
  ResponseHeader header;
  int64_t id = 0;
  int64_t ttl = 0;  // seconds granted
};

struct LeaseKeepAliveResult {
  ResponseHeader header;
  int64_t id = 0;
  int64_t ttl = 0;  // seconds left after the refresh; 0: the lease no longer exists
};

enum class EventType { kPut, kDelete };

struct WatchEvent {
  EventType type = EventType::kPut;
  KeyValue kv;  // a delete carries the key and its mod_revision only
  std::optional<KeyValue> prev_kv;
};

// One message of a watch stream. created: the watch is registered (no events); canceled: the
// server ended it (compact_revision > 0: start_revision was compacted away, the watcher must
// list again); neither and no events: a progress notification up to header.revision.
struct WatchMessage {
  ResponseHeader header;
  int64_t watch_id = 0;
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;
  std::string cancel_reason;
  bool fragment = false;
  std::vector<WatchEvent> events;
};

// The end of the range that holds every key starting with `prefix` (etcd's "prefix + 1"):
// the prefix with its last byte below 0xff incremented and what follows dropped. A prefix of
// only 0xff bytes (or empty) gives "\0", which etcd reads as "every key >= key".
std::string prefixRangeEnd(std::string_view prefix);

// Request bodies.
std::string encodePut(std::string_view key, std::string_view value, int64_t lease);
// `limit` 0: no limit; `revision` 0: the latest.
std::string encodeRange(std::string_view key, std::string_view range_end, int64_t limit,
                        int64_t revision);
std::string encodeDeleteRange(std::string_view key, std::string_view range_end);
std::string encodeLeaseGrant(int64_t ttl_seconds);
// For /v3/lease/keepalive and /v3/lease/revoke: {"ID": id}.
std::string encodeLeaseId(int64_t id);
std::string encodeWatchCreate(std::string_view key, std::string_view range_end,
                              int64_t start_revision, bool progress_notify, bool prev_kv);

// Responses. Each returns InvalidArgument naming the field when the JSON is malformed or a
// field has the wrong type; unknown fields are ignored (newer servers add fields).
absl::StatusOr<ResponseHeader> decodeHeaderResponse(std::string_view body);  // put, delete
absl::StatusOr<RangeResult> decodeRange(std::string_view body);
absl::StatusOr<LeaseGrantResult> decodeLeaseGrant(std::string_view body);
// The gateway streams keep-alive replies: {"result": {...}}, or {"error": {...}} in the stream.
absl::StatusOr<LeaseKeepAliveResult> decodeLeaseKeepAlive(std::string_view body);
// One line of a watch stream: {"result": {...}}; an {"error": ...} line gives its status.
absl::StatusOr<WatchMessage> decodeWatchMessage(std::string_view line);

// The status an etcd gateway error response stands for: {"error": "...", "message": "...",
// "code": <gRPC code>} as unary calls write it, or {"error": {"grpc_code": ..., "message": ...}}
// as streams write it. The gRPC code becomes the Status code (Abseil shares gRPC's numbering);
// a body that is neither falls back to the HTTP status.
absl::Status decodeError(int http_status, std::string_view body);

// Splits a watch stream's bytes into newline-delimited messages; a message longer than
// `max_message_bytes` is an error (a hostile or broken server cannot grow the buffer).
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_message_bytes) : max_(max_message_bytes) {}
  // Appends bytes; ResourceExhausted when an unfinished message exceeds the bound.
  absl::Status feed(std::string_view bytes);
  // The next complete message (without its newline; blank lines skipped), or nullopt.
  std::optional<std::string> next();
  size_t buffered() const { return buffer_.size() - start_; }

 private:
  size_t max_;
  std::string buffer_;
  size_t start_ = 0;
};

}  // namespace kvf::membership
