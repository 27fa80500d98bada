// The etcd gateway codec against the JSON shapes etcd documents (dev-guide/api_grpc_gateway.md)
// and answers (etcd 3.4: defaults omitted, int64 as strings, keys and values base64).
#include "membership/etcd_codec.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "membership/membership_config.h"

namespace kvf::membership {
namespace {

namespace bj = boost::json;

constexpr const char* kHeader =
    R"("header":{"cluster_id":"12585971608760269493","member_id":"13847567121247652255",)"
    R"("revision":"2","raft_term":"3"})";

bj::object parsed(const std::string& text) { return bj::parse(text).as_object(); }

TEST(EtcdCodecTest, PrefixRangeEndIncrementsTheLastByte) {
  EXPECT_EQ(prefixRangeEnd("foo"), "fop");  // etcd's own example: [foo, fop)
  EXPECT_EQ(prefixRangeEnd("/kvfabric/instances/"), "/kvfabric/instances0");
  EXPECT_EQ(prefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(prefixRangeEnd(""), std::string(1, '\0'));
}

TEST(EtcdCodecTest, RequestsUseBase64BytesAndStringInt64s) {
  // The documented put: {"key": "Zm9v", "value": "YmFy"} ("foo", "bar").
  bj::object put = parsed(encodePut("foo", "bar", 0));
  EXPECT_EQ(put.at("key"), "Zm9v");
  EXPECT_EQ(put.at("value"), "YmFy");
  EXPECT_FALSE(put.contains("lease"));
  EXPECT_EQ(parsed(encodePut("foo", "bar", 7587821338341002662)).at("lease"),
            "7587821338341002662");

  // The documented prefix range: {"key": "Zm9v", "range_end": "Zm9w"}.
  bj::object range = parsed(encodeRange("foo", prefixRangeEnd("foo"), 0, 0));
  EXPECT_EQ(range.at("key"), "Zm9v");
  EXPECT_EQ(range.at("range_end"), "Zm9w");
  EXPECT_FALSE(range.contains("limit"));
  bj::object page = parsed(encodeRange("foo", "Zm9w", 500, 42));
  EXPECT_EQ(page.at("limit"), "500");
  EXPECT_EQ(page.at("revision"), "42");

  EXPECT_EQ(parsed(encodeLeaseGrant(10)).at("TTL"), "10");
  EXPECT_EQ(parsed(encodeLeaseId(7587821338341002662)).at("ID"), "7587821338341002662");

  bj::object watch = parsed(encodeWatchCreate("foo", "fop", 17, true, false));
  const bj::object& create = watch.at("create_request").as_object();
  EXPECT_EQ(create.at("key"), "Zm9v");
  EXPECT_EQ(create.at("range_end"), "Zm9w");
  EXPECT_EQ(create.at("start_revision"), "17");
  EXPECT_EQ(create.at("progress_notify"), true);
  EXPECT_FALSE(create.contains("prev_kv"));

  // Bytes that are not text survive.
  bj::object binary = parsed(encodePut(std::string("\0\xff", 2), "", 0));
  EXPECT_EQ(binary.at("key"), "AP8=");
  EXPECT_EQ(binary.at("value"), "");
}

TEST(EtcdCodecTest, DecodesTheDocumentedRangeResponse) {
  std::string body = std::string("{") + kHeader +
                     R"(,"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2",)"
                     R"("version":"1","value":"YmFy"}],"count":"1"})";
  auto r = decodeRange(body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.cluster_id, 12585971608760269493u);
  EXPECT_EQ(r->header.member_id, 13847567121247652255u);
  EXPECT_EQ(r->header.revision, 2);
  EXPECT_EQ(r->header.raft_term, 3u);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "foo");
  EXPECT_EQ(r->kvs[0].value, "bar");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].version, 1);
  EXPECT_EQ(r->kvs[0].lease, 0);
  EXPECT_EQ(r->count, 1);
  EXPECT_FALSE(r->more);

  // An empty range: no kvs, no count (defaults are omitted).
  auto empty = decodeRange(std::string("{") + kHeader + "}");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->kvs.empty());
  EXPECT_EQ(empty->count, 0);

  // A gateway that writes numbers instead of strings is read the same.
  auto numeric = decodeRange(
      R"({"header":{"revision":9},"kvs":[{"key":"Zm9v","mod_revision":9,"lease":5}],"more":true})");
  ASSERT_TRUE(numeric.ok()) << numeric.status();
  EXPECT_EQ(numeric->header.revision, 9);
  EXPECT_EQ(numeric->kvs[0].lease, 5);
  EXPECT_TRUE(numeric->more);
}

TEST(EtcdCodecTest, RejectsMalformedResponsesNamingTheField) {
  EXPECT_FALSE(decodeRange("not json").ok());
  EXPECT_FALSE(decodeRange("{}").ok());  // no header
  auto bad_key = decodeRange(std::string("{") + kHeader + R"(,"kvs":[{"key":"@@@"}]})");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("\"key\""), absl::string_view::npos);
  auto bad_rev = decodeRange(R"({"header":{"revision":"12x"}})");
  ASSERT_FALSE(bad_rev.ok());
  EXPECT_NE(bad_rev.status().message().find("\"revision\""), absl::string_view::npos);
  EXPECT_FALSE(decodeRange(std::string("{") + kHeader + R"(,"kvs":{}})").ok());
  EXPECT_FALSE(decodeRange(std::string("{") + kHeader + R"(,"kvs":[1]})").ok());
  EXPECT_FALSE(decodeHeaderResponse(R"({"header":{"cluster_id":"-1"}})").ok());
}

TEST(EtcdCodecTest, DecodesLeaseGrantAndKeepAlive) {
  auto grant =
      decodeLeaseGrant(std::string("{") + kHeader + R"(,"ID":"2324035617164594437","TTL":"5"})");
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->id, 2324035617164594437);
  EXPECT_EQ(grant->ttl, 5);
  auto refused = decodeLeaseGrant(std::string("{") + kHeader +
                                  R"(,"ID":"1","TTL":"5","error":"too many leases"})");
  EXPECT_FALSE(refused.ok());

  // Keep-alive replies are streamed: {"result": {...}} and a newline.
  auto alive = decodeLeaseKeepAlive(std::string(R"({"result":{)") + kHeader +
                                    R"(,"ID":"2324035617164594437","TTL":"5"}})" + "\n");
  ASSERT_TRUE(alive.ok()) << alive.status();
  EXPECT_EQ(alive->ttl, 5);
  // A lease that is gone answers without TTL (0 is the default, omitted).
  auto gone = decodeLeaseKeepAlive(std::string(R"({"result":{)") + kHeader + R"(,"ID":"1"}})");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->id, 1);
  EXPECT_EQ(gone->ttl, 0);
}

TEST(EtcdCodecTest, DecodesWatchMessages) {
  auto created =
      decodeWatchMessage(std::string(R"({"result":{)") + kHeader + R"(,"created":true}})");
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->created);
  EXPECT_TRUE(created->events.empty());

  // A PUT event has no "type" (PUT is the enum's default); a DELETE carries the key only.
  auto events = decodeWatchMessage(
      std::string(R"({"result":{)") + kHeader +
      R"(,"events":[{"kv":{"key":"Zm9v","create_revision":"2","mod_revision":"2",)"
      R"("version":"1","value":"YmFy","lease":"7"}},{"type":"DELETE","kv":{"key":"Zm9v",)"
      R"("mod_revision":"3"},"prev_kv":{"key":"Zm9v","mod_revision":"2","value":"YmFy"}}]}})");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->events.size(), 2u);
  EXPECT_EQ(events->events[0].type, EventType::kPut);
  EXPECT_EQ(events->events[0].kv.value, "bar");
  EXPECT_EQ(events->events[0].kv.lease, 7);
  EXPECT_EQ(events->events[1].type, EventType::kDelete);
  EXPECT_EQ(events->events[1].kv.key, "foo");
  EXPECT_EQ(events->events[1].kv.mod_revision, 3);
  ASSERT_TRUE(events->events[1].prev_kv.has_value());
  EXPECT_EQ(events->events[1].prev_kv->value, "bar");

  // A start revision that was compacted: canceled at once, with the compact revision and a
  // header without a revision.
  auto compacted = decodeWatchMessage(
      R"({"result":{"header":{"cluster_id":"324952591200643719","member_id":"1","raft_term":"2"},)"
      R"("canceled":true,"compact_revision":"3"}})");
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  EXPECT_TRUE(compacted->canceled);
  EXPECT_EQ(compacted->compact_revision, 3);
  EXPECT_EQ(compacted->header.revision, 0);

  // A progress notification: no events, not created, not canceled.
  auto progress = decodeWatchMessage(R"({"result":{"header":{"revision":"40"},"watch_id":"0"}})");
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_FALSE(progress->created || progress->canceled);
  EXPECT_EQ(progress->header.revision, 40);

  EXPECT_FALSE(decodeWatchMessage(R"({"result":{"events":[{"type":"BOGUS","kv":{}}]}})").ok());
  EXPECT_FALSE(decodeWatchMessage(R"({"result":{"events":[{"type":"DELETE"}]}})").ok());
  EXPECT_FALSE(decodeWatchMessage(R"({"neither":1})").ok());
}

TEST(EtcdCodecTest, ErrorsKeepTheirGrpcCode) {
  // A unary call's error (HTTP 404): {"error", "message", "code"}.
  absl::Status lease =
      decodeError(404, R"({"error":"etcdserver: requested lease not found","message":"etcdserver: )"
                       R"(requested lease not found","code":5})");
  EXPECT_TRUE(absl::IsNotFound(lease)) << lease;
  EXPECT_NE(lease.message().find("requested lease not found"), absl::string_view::npos);
  // A stream's error: {"error": {"grpc_code", "http_code", "message", "http_status"}}.
  absl::Status stream = decodeError(
      0, R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader",)"
         R"("http_status":"Service Unavailable"}})");
  EXPECT_TRUE(absl::IsUnavailable(stream)) << stream;
  auto from_stream = decodeWatchMessage(
      R"({"error":{"grpc_code":11,"message":"etcdserver: mvcc: required revision has been )"
      R"(compacted"}})");
  EXPECT_TRUE(absl::IsOutOfRange(from_stream.status())) << from_stream.status();
  // Not etcd's JSON at all (a proxy's page): the HTTP status decides.
  EXPECT_TRUE(absl::IsUnavailable(decodeError(502, "<html>bad gateway</html>")));
  EXPECT_TRUE(absl::IsInvalidArgument(decodeError(400, "")));
}

TEST(EtcdCodecTest, LineSplitterReassemblesAndBoundsMessages) {
  LineSplitter lines(16);
  ASSERT_TRUE(lines.feed("{\"a\":").ok());
  EXPECT_FALSE(lines.next().has_value());
  ASSERT_TRUE(lines.feed("1}\n\n{\"b\":2}\r\n{\"c\"").ok());
  EXPECT_EQ(lines.next(), "{\"a\":1}");
  EXPECT_EQ(lines.next(), "{\"b\":2}");
  EXPECT_FALSE(lines.next().has_value());
  ASSERT_TRUE(lines.feed(":3}\n").ok());
  EXPECT_EQ(lines.next(), "{\"c\":3}");
  EXPECT_EQ(lines.buffered(), 0u);
  // Too long, whether the newline has arrived or not.
  LineSplitter small(8);
  EXPECT_TRUE(absl::IsResourceExhausted(small.feed("123456789")));
  LineSplitter complete(8);
  EXPECT_TRUE(absl::IsResourceExhausted(complete.feed("ok\n123456789\nok\n")));
  LineSplitter growing(8);
  ASSERT_TRUE(growing.feed("12345").ok());
  EXPECT_TRUE(absl::IsResourceExhausted(growing.feed("6789")));
}

TEST(MembershipConfigTest, RecordsKeysAndEndpoints) {
  InstanceRecord r;
  r.id = "vllm-0";
  r.url = "http://10.0.0.5:8000";
  r.kv_events_endpoint = "tcp://10.0.0.5:5557";
  r.worker_url = "http://10.0.0.5:9000";
  bj::object o = parsed(encodeInstanceRecord(r));
  EXPECT_EQ(o.at("id"), "vllm-0");
  EXPECT_EQ(o.at("url"), "http://10.0.0.5:8000");
  EXPECT_EQ(o.at("kv_events").at("endpoint"), "tcp://10.0.0.5:5557");
  EXPECT_FALSE(o.at("kv_events").as_object().contains("replay_endpoint"));
  EXPECT_EQ(o.at("worker_url"), "http://10.0.0.5:9000");
  EXPECT_FALSE(
      parsed(encodeInstanceRecord({.id = "a", .url = "http://h:1"})).contains("kv_events"));

  EXPECT_EQ(instanceKey("/kvfabric/instances/", "vllm-0"), "/kvfabric/instances/vllm-0");
  EXPECT_TRUE(validateInstanceId("vllm-0.rank:1_a").ok());
  EXPECT_FALSE(validateInstanceId("").ok());
  EXPECT_FALSE(validateInstanceId("a/b").ok());
  EXPECT_FALSE(validateInstanceId("a b").ok());
  EXPECT_FALSE(validateInstanceId(std::string(kMaxIdBytes + 1, 'a')).ok());

  EXPECT_EQ(connectableEndpoint("tcp://*:5557", "10.0.0.5"), "tcp://10.0.0.5:5557");
  EXPECT_EQ(connectableEndpoint("tcp://0.0.0.0:5557", "h"), "tcp://h:5557");
  EXPECT_EQ(connectableEndpoint("tcp://127.0.0.1:5557", "h"), "tcp://127.0.0.1:5557");
  EXPECT_EQ(connectableEndpoint("", "h"), "");

  EXPECT_TRUE(validateEndpoint("http://127.0.0.1:2379").ok());
  EXPECT_TRUE(validateEndpoint("http://etcd-0.etcd:2379/").ok());
  auto v6 = parseHostPortUrl("http://[::1]:2379");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 2379);
  EXPECT_FALSE(validateEndpoint("https://127.0.0.1:2379").ok());
  EXPECT_FALSE(validateEndpoint("http://127.0.0.1").ok());
  EXPECT_FALSE(validateEndpoint("http://127.0.0.1:2379/v3").ok());
  EXPECT_FALSE(validateEndpoint("127.0.0.1:2379").ok());
}

}  // namespace
}  // namespace kvf::membership
