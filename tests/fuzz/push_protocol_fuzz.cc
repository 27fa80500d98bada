// Fuzz target: the KV push control API's wire format (protocol/push.h) as a hostile peer
// could send it: GET /kv/info answers, POST /kv/push requests and their answers, POST /kv/claim
// requests and their grants, and the NixlConnector side channel's POST /kv/nixl/meta requests
// and answers. Input: byte 0
// picks the message kind, the rest is the JSON body. Properties: every count within the limits,
// and what parses serializes to a body that parses back to the same message.
#include <cstdint>
#include <string_view>

#include "protocol/push.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace kvf::protocol;

void checkRequest(const PushRequest& a, const PushRequest& b) {
  KVF_FUZZ_CHECK(a.request_id == b.request_id && a.receiver_url == b.receiver_url &&
                     a.block_hashes == b.block_hashes && a.receiver_address == b.receiver_address &&
                     a.rkey == b.rkey && a.block_addrs == b.block_addrs &&
                     a.block_bytes == b.block_bytes && a.landing_id == b.landing_id &&
                     a.deadline_ms == b.deadline_ms && a.lease_id == b.lease_id,
                 "push request changed in a round trip");
}

void checkResponse(const PushResponse& a, const PushResponse& b) {
  KVF_FUZZ_CHECK(a.pushed_hashes == b.pushed_hashes && a.checksums == b.checksums &&
                     a.missing_hashes == b.missing_hashes && a.pushed_bytes == b.pushed_bytes &&
                     a.put_issued == b.put_issued && a.error == b.error &&
                     a.elapsed_us == b.elapsed_us,
                 "push response changed in a round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto in = kvf::fuzz::splitInput(data, size);
  if (!in) return 0;
  std::string_view body = in->rest;
  PushLimits limits;
  limits.max_blocks = 1024;  // small, so the fuzzer reaches the bound
  switch (in->choice % 7) {
    case 0: {
      auto request = parsePushRequest(body, limits);
      if (!request.ok()) return 0;
      KVF_FUZZ_CHECK(request->block_hashes.size() <= limits.max_blocks, "hashes past the limit");
      KVF_FUZZ_CHECK(request->block_addrs.size() <= limits.max_blocks, "addrs past the limit");
      auto again = parsePushRequest(serializePushRequest(*request), limits);
      KVF_FUZZ_CHECK(again.ok(), "a parsed push request does not parse after serializing");
      checkRequest(*request, *again);
      break;
    }
    case 1: {
      auto response = parsePushResponse(body, limits);
      if (!response.ok()) return 0;
      KVF_FUZZ_CHECK(response->pushed_hashes.size() <= limits.max_blocks, "pushed past the limit");
      auto again = parsePushResponse(serializePushResponse(*response), limits);
      KVF_FUZZ_CHECK(again.ok(), "a parsed push response does not parse after serializing");
      checkResponse(*response, *again);
      break;
    }
    case 3: {
      auto claim = parseLandingClaim(body);
      if (!claim.ok()) return 0;
      KVF_FUZZ_CHECK(claim->landing_id != 0, "a claim of landing 0 parsed");
      auto again = parseLandingClaim(serializeLandingClaim(*claim));
      KVF_FUZZ_CHECK(again.ok() && again->landing_id == claim->landing_id,
                     "landing claim changed in a round trip");
      break;
    }
    case 4: {
      auto grant = parseLandingGrant(body, limits);
      if (!grant.ok()) return 0;
      KVF_FUZZ_CHECK(!grant->block_addrs.empty() && grant->block_addrs.size() <= limits.max_blocks,
                     "grant addresses empty or past the limit");
      auto again = parseLandingGrant(serializeLandingGrant(*grant), limits);
      KVF_FUZZ_CHECK(again.ok(), "a parsed grant does not parse after serializing");
      KVF_FUZZ_CHECK(again->landing_id == grant->landing_id &&
                         again->transport_address == grant->transport_address &&
                         again->rkey == grant->rkey && again->block_addrs == grant->block_addrs &&
                         again->block_bytes == grant->block_bytes,
                     "landing grant changed in a round trip");
      break;
    }
    case 5: {  // NixlConnector side channel: a reader's metadata request
      auto request = parseNixlMetaRequest(body, limits);
      if (!request.ok()) return 0;
      KVF_FUZZ_CHECK(request->block_ids.size() <= limits.max_blocks, "ids past the limit");
      auto again = parseNixlMetaRequest(serializeNixlMetaRequest(*request), limits);
      KVF_FUZZ_CHECK(again.ok() && again->remote_request_id == request->remote_request_id &&
                         again->block_ids == request->block_ids,
                     "nixl meta request changed in a round trip");
      break;
    }
    case 6: {  // ... and the holder's answer
      auto meta = parseNixlMetaResponse(body, limits);
      if (!meta.ok()) return 0;
      KVF_FUZZ_CHECK(meta->block_hashes.size() == meta->block_ids.size() &&
                         meta->checksums.size() == meta->block_ids.size(),
                     "nixl meta arrays differ in length");
      auto again = parseNixlMetaResponse(serializeNixlMetaResponse(*meta), limits);
      KVF_FUZZ_CHECK(again.ok() && again->block_ids == meta->block_ids &&
                         again->block_hashes == meta->block_hashes &&
                         again->checksums == meta->checksums && again->rkey == meta->rkey,
                     "nixl meta response changed in a round trip");
      break;
    }
    default: {
      auto info = parseWorkerInfo(body, limits);
      if (!info.ok()) return 0;
      auto again = parseWorkerInfo(serializeWorkerInfo(*info), limits);
      KVF_FUZZ_CHECK(again.ok(), "a parsed worker info does not parse after serializing");
      KVF_FUZZ_CHECK(again->instance_id == info->instance_id &&
                         again->transport_address == info->transport_address &&
                         again->transports == info->transports &&
                         again->block_size == info->block_size &&
                         again->block_bytes == info->block_bytes,
                     "worker info changed in a round trip");
      break;
    }
  }
  return 0;
}
