#include "membership/etcd_codec.h"

#include <charconv>
#include <limits>

#include "absl/strings/escaping.h"
#include "common/json.h"
#include "common/status.h"
#include "common/strings.h"

namespace kvf::membership {
namespace {

namespace bj = boost::json;

std::string base64(std::string_view bytes) {
  return absl::Base64Escape(absl::string_view(bytes.data(), bytes.size()));
}

bj::string_view jsonView(const std::string& s) { return bj::string_view(s.data(), s.size()); }

// A proto int64/uint64 as the gateway writes it: a decimal string, or a number from a gateway
// that writes numbers. Absent or null: `fallback`.
template <class T>
absl::StatusOr<T> integerField(const bj::object& obj, std::string_view key, T fallback = 0) {
  auto it = obj.find(bj::string_view(key.data(), key.size()));
  if (it == obj.end() || it->value().is_null()) return fallback;
  const bj::value& v = it->value();
  T out = 0;
  if (v.is_string()) {
    std::string_view s(v.as_string().data(), v.as_string().size());
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty()) return out;
  } else if (v.is_int64() && (std::is_signed_v<T> || v.as_int64() >= 0)) {
    return static_cast<T>(v.as_int64());
  } else if (v.is_uint64() &&
             v.as_uint64() <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return static_cast<T>(v.as_uint64());
  }
  return absl::InvalidArgumentError(strCat("etcd response: \"", key, "\" is not an integer"));
}

absl::StatusOr<bool> boolField(const bj::object& obj, std::string_view key) {
  auto it = obj.find(bj::string_view(key.data(), key.size()));
  if (it == obj.end() || it->value().is_null()) return false;
  if (!it->value().is_bool()) {
    return absl::InvalidArgumentError(strCat("etcd response: \"", key, "\" is not a boolean"));
  }
  return it->value().as_bool();
}

absl::StatusOr<std::string> stringField(const bj::object& obj, std::string_view key) {
  auto it = obj.find(bj::string_view(key.data(), key.size()));
  if (it == obj.end() || it->value().is_null()) return std::string();
  if (!it->value().is_string()) {
    return absl::InvalidArgumentError(strCat("etcd response: \"", key, "\" is not a string"));
  }
  return std::string(it->value().as_string());
}

absl::StatusOr<std::string> bytesField(const bj::object& obj, std::string_view key) {
  KVF_ASSIGN_OR_RETURN(std::string text, stringField(obj, key));
  std::string out;
  if (!absl::Base64Unescape(absl::string_view(text.data(), text.size()), &out)) {
    return absl::InvalidArgumentError(strCat("etcd response: \"", key, "\" is not base64"));
  }
  return out;
}

// The object at `key`; nullptr when absent or null, an error when it is something else.
absl::StatusOr<const bj::object*> objectField(const bj::object& obj, std::string_view key) {
  auto it = obj.find(bj::string_view(key.data(), key.size()));
  if (it == obj.end() || it->value().is_null()) return nullptr;
  if (!it->value().is_object()) {
    return absl::InvalidArgumentError(strCat("etcd response: \"", key, "\" is not an object"));
  }
  return &it->value().as_object();
}

absl::StatusOr<ResponseHeader> decodeHeader(const bj::object& response) {
  ResponseHeader h;
  KVF_ASSIGN_OR_RETURN(const bj::object* o, objectField(response, "header"));
  if (o == nullptr) return absl::InvalidArgumentError("etcd response: no \"header\"");
  KVF_ASSIGN_OR_RETURN(h.cluster_id, integerField<uint64_t>(*o, "cluster_id"));
  KVF_ASSIGN_OR_RETURN(h.member_id, integerField<uint64_t>(*o, "member_id"));
  KVF_ASSIGN_OR_RETURN(h.revision, integerField<int64_t>(*o, "revision"));
  KVF_ASSIGN_OR_RETURN(h.raft_term, integerField<uint64_t>(*o, "raft_term"));
  return h;
}

absl::StatusOr<KeyValue> decodeKeyValue(const bj::object& o) {
  KeyValue kv;
  KVF_ASSIGN_OR_RETURN(kv.key, bytesField(o, "key"));
  KVF_ASSIGN_OR_RETURN(kv.value, bytesField(o, "value"));
  KVF_ASSIGN_OR_RETURN(kv.create_revision, integerField<int64_t>(o, "create_revision"));
  KVF_ASSIGN_OR_RETURN(kv.mod_revision, integerField<int64_t>(o, "mod_revision"));
  KVF_ASSIGN_OR_RETURN(kv.version, integerField<int64_t>(o, "version"));
  KVF_ASSIGN_OR_RETURN(kv.lease, integerField<int64_t>(o, "lease"));
  return kv;
}

absl::StatusOr<std::vector<const bj::object*>> objectList(const bj::object& obj,
                                                          std::string_view key) {
  std::vector<const bj::object*> out;
  auto it = obj.find(bj::string_view(key.data(), key.size()));
  if (it == obj.end() || it->value().is_null()) return out;
  if (!it->value().is_array()) {
    return absl::InvalidArgumentError(strCat("etcd response: \"", key, "\" is not an array"));
  }
  for (const bj::value& v : it->value().as_array()) {
    if (!v.is_object()) {
      return absl::InvalidArgumentError(strCat("etcd response: \"", key, "\" holds a non-object"));
    }
    out.push_back(&v.as_object());
  }
  return out;
}

absl::StatusOr<EventType> eventType(const bj::object& o) {
  auto it = o.find("type");
  if (it == o.end() || it->value().is_null()) return EventType::kPut;  // the default, omitted
  const bj::value& v = it->value();
  if ((v.is_string() && v.as_string() == "PUT") || (v.is_int64() && v.as_int64() == 0)) {
    return EventType::kPut;
  }
  if ((v.is_string() && v.as_string() == "DELETE") || (v.is_int64() && v.as_int64() == 1)) {
    return EventType::kDelete;
  }
  return absl::InvalidArgumentError("etcd response: unknown event \"type\"");
}

absl::StatusOr<WatchEvent> decodeEvent(const bj::object& o) {
  WatchEvent e;
  KVF_ASSIGN_OR_RETURN(e.type, eventType(o));
  KVF_ASSIGN_OR_RETURN(const bj::object* kv, objectField(o, "kv"));
  if (kv == nullptr) return absl::InvalidArgumentError("etcd response: event without \"kv\"");
  KVF_ASSIGN_OR_RETURN(e.kv, decodeKeyValue(*kv));
  KVF_ASSIGN_OR_RETURN(const bj::object* prev, objectField(o, "prev_kv"));
  if (prev != nullptr) {
    KVF_ASSIGN_OR_RETURN(e.prev_kv, decodeKeyValue(*prev));
  }
  return e;
}

// A streamed reply's payload: the object under "result"; an "error" becomes its status.
absl::StatusOr<bj::object> streamResult(std::string_view text) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(text, 32));
  if (o.contains("error")) return decodeError(0, text);
  auto it = o.find("result");
  if (it == o.end() || !it->value().is_object()) {
    return absl::InvalidArgumentError("etcd stream message without \"result\"");
  }
  return std::move(it->value().as_object());
}

}  // namespace

std::string prefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::string encodePut(std::string_view key, std::string_view value, int64_t lease) {
  bj::object o;
  o["key"] = jsonView(base64(key));
  o["value"] = jsonView(base64(value));
  if (lease != 0) o["lease"] = std::to_string(lease);
  return bj::serialize(o);
}

std::string encodeRange(std::string_view key, std::string_view range_end, int64_t limit,
                        int64_t revision) {
  bj::object o;
  o["key"] = jsonView(base64(key));
  if (!range_end.empty()) o["range_end"] = jsonView(base64(range_end));
  if (limit > 0) o["limit"] = std::to_string(limit);
  if (revision > 0) o["revision"] = std::to_string(revision);
  return bj::serialize(o);
}

std::string encodeDeleteRange(std::string_view key, std::string_view range_end) {
  bj::object o;
  o["key"] = jsonView(base64(key));
  if (!range_end.empty()) o["range_end"] = jsonView(base64(range_end));
  return bj::serialize(o);
}

std::string encodeLeaseGrant(int64_t ttl_seconds) {
  bj::object o;
  o["TTL"] = std::to_string(ttl_seconds);
  return bj::serialize(o);
}

std::string encodeLeaseId(int64_t id) {
  bj::object o;
  o["ID"] = std::to_string(id);
  return bj::serialize(o);
}

std::string encodeWatchCreate(std::string_view key, std::string_view range_end,
                              int64_t start_revision, bool progress_notify, bool prev_kv) {
  bj::object create;
  create["key"] = jsonView(base64(key));
  if (!range_end.empty()) create["range_end"] = jsonView(base64(range_end));
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  if (progress_notify) create["progress_notify"] = true;
  if (prev_kv) create["prev_kv"] = true;
  bj::object o;
  o["create_request"] = std::move(create);
  return bj::serialize(o);
}

absl::StatusOr<ResponseHeader> decodeHeaderResponse(std::string_view body) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 32));
  return decodeHeader(o);
}

absl::StatusOr<RangeResult> decodeRange(std::string_view body) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 32));
  RangeResult r;
  KVF_ASSIGN_OR_RETURN(r.header, decodeHeader(o));
  KVF_ASSIGN_OR_RETURN(auto kvs, objectList(o, "kvs"));
  for (const bj::object* kv : kvs) {
    KVF_ASSIGN_OR_RETURN(KeyValue decoded, decodeKeyValue(*kv));
    r.kvs.push_back(std::move(decoded));
  }
  KVF_ASSIGN_OR_RETURN(r.more, boolField(o, "more"));
  KVF_ASSIGN_OR_RETURN(r.count, integerField<int64_t>(o, "count"));
  return r;
}

absl::StatusOr<LeaseGrantResult> decodeLeaseGrant(std::string_view body) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 32));
  LeaseGrantResult r;
  KVF_ASSIGN_OR_RETURN(r.header, decodeHeader(o));
  KVF_ASSIGN_OR_RETURN(r.id, integerField<int64_t>(o, "ID"));
  KVF_ASSIGN_OR_RETURN(r.ttl, integerField<int64_t>(o, "TTL"));
  KVF_ASSIGN_OR_RETURN(std::string error, stringField(o, "error"));
  if (!error.empty()) return absl::FailedPreconditionError("etcd lease grant: " + error);
  if (r.id == 0 || r.ttl <= 0) {
    return absl::InvalidArgumentError("etcd lease grant: no lease ID or TTL in the response");
  }
  return r;
}

absl::StatusOr<LeaseKeepAliveResult> decodeLeaseKeepAlive(std::string_view body) {
  // The reply is one streamed message, possibly with a trailing newline.
  while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.remove_suffix(1);
  KVF_ASSIGN_OR_RETURN(bj::object o, streamResult(body));
  LeaseKeepAliveResult r;
  KVF_ASSIGN_OR_RETURN(r.header, decodeHeader(o));
  KVF_ASSIGN_OR_RETURN(r.id, integerField<int64_t>(o, "ID"));
  KVF_ASSIGN_OR_RETURN(r.ttl, integerField<int64_t>(o, "TTL"));
  return r;
}

absl::StatusOr<WatchMessage> decodeWatchMessage(std::string_view line) {
  KVF_ASSIGN_OR_RETURN(bj::object o, streamResult(line));
  WatchMessage m;
  // A cancel for a compacted revision has a header without a revision; tolerate no header.
  if (o.contains("header")) {
    KVF_ASSIGN_OR_RETURN(m.header, decodeHeader(o));
  }
  KVF_ASSIGN_OR_RETURN(m.watch_id, integerField<int64_t>(o, "watch_id"));
  KVF_ASSIGN_OR_RETURN(m.created, boolField(o, "created"));
  KVF_ASSIGN_OR_RETURN(m.canceled, boolField(o, "canceled"));
  KVF_ASSIGN_OR_RETURN(m.compact_revision, integerField<int64_t>(o, "compact_revision"));
  KVF_ASSIGN_OR_RETURN(m.cancel_reason, stringField(o, "cancel_reason"));
  KVF_ASSIGN_OR_RETURN(m.fragment, boolField(o, "fragment"));
  KVF_ASSIGN_OR_RETURN(auto events, objectList(o, "events"));
  for (const bj::object* e : events) {
    KVF_ASSIGN_OR_RETURN(WatchEvent decoded, decodeEvent(*e));
    m.events.push_back(std::move(decoded));
  }
  return m;
}

absl::Status decodeError(int http_status, std::string_view body) {
  std::string message;
  int64_t code = 0;
  auto parsed = json::parseObject(body, 16);
  if (parsed.ok()) {
    const bj::object& o = *parsed;
    auto error = o.find("error");
    if (error != o.end() && error->value().is_object()) {  // a streamed error
      const bj::object& e = error->value().as_object();
      message = stringField(e, "message").value_or("");
      code = integerField<int64_t>(e, "grpc_code").value_or(0);
    } else {
      message = stringField(o, "message").value_or("");
      if (message.empty()) message = stringField(o, "error").value_or("");
      code = integerField<int64_t>(o, "code").value_or(0);
    }
  }
  if (message.empty()) {
    message = strCat("HTTP ", http_status, ": ", body.substr(0, 200));
  }
  message = "etcd: " + message;
  if (code > 0 && code <= 16) return absl::Status(static_cast<absl::StatusCode>(code), message);
  if (http_status == 404) return absl::NotFoundError(message);
  if (http_status == 400) return absl::InvalidArgumentError(message);
  if (http_status == 401 || http_status == 403) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

absl::Status LineSplitter::feed(std::string_view bytes) {
  if (start_ > 0 && start_ == buffer_.size()) {
    buffer_.clear();
    start_ = 0;
  }
  // Only the new bytes need checking: what was buffered before passed this check already.
  size_t from = buffer_.rfind('\n');
  from = from == std::string::npos || from < start_ ? start_ : from + 1;
  buffer_.append(bytes);
  for (size_t pos = from;;) {
    size_t newline = buffer_.find('\n', pos);
    size_t end = newline == std::string::npos ? buffer_.size() : newline;
    if (end - pos > max_) {
      return absl::ResourceExhaustedError(strCat("etcd watch message exceeds ", max_, " bytes"));
    }
    if (newline == std::string::npos) return absl::OkStatus();
    pos = newline + 1;
  }
}

std::optional<std::string> LineSplitter::next() {
  for (;;) {
    size_t newline = buffer_.find('\n', start_);
    if (newline == std::string::npos) {
      if (start_ > 0) {
        buffer_.erase(0, start_);
        start_ = 0;
      }
      return std::nullopt;
    }
    std::string line = buffer_.substr(start_, newline - start_);
    start_ = newline + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    return line;
  }
}

}  // namespace kvf::membership
