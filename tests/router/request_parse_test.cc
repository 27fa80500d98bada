#include "router/request_parse.h"

#include "common/json.h"
#include "router/fast_parse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace kvf::router {
namespace {

http::Request post(std::string body, std::string session = {}) {
  http::Request r;
  r.method = "POST";
  r.body = std::move(body);
  if (!session.empty()) r.headers.emplace_back("X-Session-Id", session);
  return r;
}

TEST(RequestParseTest, TokenPromptWithHeaderSession) {
  auto p = parseRequest(ApiKind::kCompletions,
                        post(R"({"model":"m","prompt":[1,2,3],"stream":true,"max_tokens":5,
                                 "user":"body-user"})",
                             "hdr-session"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->has_token_ids);
  EXPECT_EQ(p->token_ids, (std::vector<policy::TokenId>{1, 2, 3}));
  EXPECT_EQ(p->prompt_tokens, 3);
  EXPECT_TRUE(p->stream);
  EXPECT_EQ(p->max_tokens, 5);
  EXPECT_EQ(p->session, "hdr-session");  // the header wins over the body's user
}

TEST(RequestParseTest, TextPromptAndChatUseBodyUser) {
  auto text =
      parseRequest(ApiKind::kCompletions, post(R"({"model":"m","prompt":"abcdefgh","user":"u1"})"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->has_token_ids);
  EXPECT_EQ(text->prompt_tokens, 2);
  EXPECT_EQ(text->session, "u1");
  auto chat = parseRequest(ApiKind::kChat,
                           post(R"({"model":"m","messages":[{"role":"system","content":"be brief"},
               {"role":"user","content":[{"type":"text","text":"hi"}]}]})"));
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->text, "<|system|>be brief<|user|>hi");
  // No max_tokens: vLLM decides (the rest of the context for chat), see effectiveMaxTokens().
  EXPECT_FALSE(chat->max_tokens_given);
}

TEST(RequestParseTest, BatchPromptsRouteByFirstAndCountAll) {
  auto p = parseRequest(ApiKind::kCompletions, post(R"({"model":"m","prompt":[[1,2],[3,4,5]]})"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->token_ids, (std::vector<policy::TokenId>{1, 2}));
  EXPECT_EQ(p->prompt_tokens, 5);
}

TEST(RequestParseTest, BadInputNamesTheField) {
  auto err = [](ApiKind kind, std::string body) {
    auto p = parseRequest(kind, post(std::move(body)));
    EXPECT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(p.status().message());
  };
  EXPECT_NE(err(ApiKind::kCompletions, "{nope").find("JSON"), std::string::npos);
  EXPECT_NE(err(ApiKind::kCompletions, R"({"prompt":[1]})").find("model"), std::string::npos);
  EXPECT_NE(err(ApiKind::kCompletions, R"({"model":3,"prompt":[1]})").find("model"),
            std::string::npos);
  EXPECT_NE(err(ApiKind::kCompletions, R"({"model":"m"})").find("prompt"), std::string::npos);
  EXPECT_NE(err(ApiKind::kCompletions, R"({"model":"m","prompt":[1,-2]})").find("prompt[1]"),
            std::string::npos);
  EXPECT_NE(
      err(ApiKind::kCompletions, R"({"model":"m","prompt":[1],"stream":"yes"})").find("stream"),
      std::string::npos);
  EXPECT_NE(
      err(ApiKind::kChat, R"({"model":"m","messages":[{"content":"x"}]})").find("messages[0].role"),
      std::string::npos);
  EXPECT_NE(err(ApiKind::kChat, R"({"model":"m","messages":"hi"})").find("messages"),
            std::string::npos);
}

// The single-pass path must read exactly what the DOM path reads, and hand every other shape
// (and every invalid body) to the DOM path, which owns the error messages.
TEST(RequestParseTest, SinglePassAgreesWithDomPath) {
  const std::vector<std::string> handled = {
      R"({"model":"m","prompt":[1,2,3]})",
      R"({"model":"m","prompt":[0,4294967295],"stream":false,"max_tokens":0,"user":"u"})",
      R"( {"extra":{"prompt":"x","model":1,"a":[[1],{"b\t":null}]},"model":"m","prompt":[7],
           "stream":true,"max_tokens":16777216,"user":null,"logprobs":-1.5e-3,
           "stop":["\n","\u00e9\"\\\/"],"n":0,"t":true,"f":false} )"
      "\n",
      R"({"prompt":[5,6],"max_tokens":null,"stream":null,"model":"m","n":[1,2]})",
  };
  for (const std::string& body : handled) {
    auto fast = fastParseTokenCompletion(body);
    ASSERT_TRUE(fast.has_value()) << body;
    auto dom = parseRequestDom(ApiKind::kCompletions, post(body));
    ASSERT_TRUE(dom.ok()) << body << ": " << dom.status();
    EXPECT_EQ(fast->model, dom->model) << body;
    EXPECT_EQ(fast->stream, dom->stream) << body;
    EXPECT_EQ(fast->max_tokens, dom->max_tokens) << body;
    EXPECT_EQ(fast->session, dom->session) << body;
    EXPECT_EQ(fast->token_ids, dom->token_ids) << body;
    EXPECT_EQ(fast->prompt_tokens, dom->prompt_tokens) << body;
    EXPECT_TRUE(fast->has_token_ids);
  }
  const std::vector<std::string> declined = {
      "{nope",
      R"({"model":"m","prompt":[1]} x)",
      R"([1,2])",
      R"({"model":"m","prompt":"text"})",
      R"({"model":"m","prompt":[[1,2],[3]]})",
      R"({"model":"m","prompt":[1,[2]]})",
      R"({"model":"m","prompt":[]})",
      R"({"model":"m","prompt":[1,-2]})",
      R"({"model":"m","prompt":[1,4294967296]})",
      R"({"model":"m","prompt":[1,2.0]})",
      R"({"model":"m","prompt":[1,"2"]})",
      R"({"model":"m","prompt":[1,null]})",
      R"({"prompt":[1]})",
      R"({"model":null,"prompt":[1]})",
      R"({"model":3,"prompt":[1]})",
      R"({"model":"m","model":"n","prompt":[1]})",
      R"({"model":"m","prompt":[1],"prompt":[2]})",
      R"({"model":"m","prompt":[1],"stream":"yes"})",
      R"({"model":"m","prompt":[1],"max_tokens":-1})",
      R"({"model":"m","prompt":[1],"max_tokens":2.0})",
      R"({"model":"m","prompt":[1],"max_tokens":16777217})",
      R"({"model":"m","prompt":[1],"max_tokens":9223372036854775807})",
      R"({"model":"m","prompt":[1],"user":5})",
      R"({"model":"m","prompt":[1],"user":{"id":1}})",
      // Left to the DOM path: valid bodies with escaped or non-ASCII text in a field we read
      // or nesting deeper than the scanner follows, and invalid JSON of every kind (bad
      // escapes, leading zeros, trailing or missing commas, bad literals, unterminated strings,
      // control characters in strings).
      R"({"model":"m\"q","prompt":[1]})",
      "{\"model\":\"m\xc3\xa9\",\"prompt\":[1]}",
      R"({"model":"m","prompt":[1],"stop":"\u00e9\u00e9","x":"\u00"})",
      R"({"model":"m","prompt":[1],"x":01})",
      R"({"model":"m","prompt":[1],"x":[1,]})",
      R"({"model":"m","prompt":[1],})",
      R"({"model":"m","prompt":[1] "x":1})",
      R"({"model":"m","prompt":[1],"x":tru})",
      R"({"model":"m","prompt":[1],"x":"a)",
      "{\"model\":\"m\",\"prompt\":[1],\"x\":\"a\tb\"}",
      R"({"model":"m","prompt":[1],"x":)" + std::string(40, '[') + std::string(40, ']') + "}",
      std::string(70, '[') + std::string(70, ']'),
      // Nesting past json::parse's bound (64) is refused by both paths.
      R"({"model":"m","prompt":[1],"x":)" + std::string(70, '[') + std::string(70, ']') + "}",
  };
  for (const std::string& body : declined) {
    EXPECT_FALSE(fastParseTokenCompletion(body).has_value()) << body;
  }
  // Declined bodies still get the DOM path's answers through parseRequest.
  auto escaped = parseRequest(ApiKind::kCompletions, post(R"({"model":"m\"q","prompt":[1,2]})"));
  ASSERT_TRUE(escaped.ok());
  EXPECT_EQ(escaped->model, "m\"q");
  EXPECT_EQ(escaped->token_ids, (std::vector<policy::TokenId>{1, 2}));
  EXPECT_EQ(
      parseRequest(ApiKind::kCompletions, post(R"({"model":"m","prompt":[1],"max_tokens":2.0})"))
          ->max_tokens,
      2);
  EXPECT_FALSE(parseRequest(ApiKind::kCompletions, post(R"({"model":"m","prompt":[1,-2]})")).ok());
  std::string deep =
      R"({"model":"m","prompt":[1],"x":)" + std::string(70, '[') + std::string(70, ']') + "}";
  EXPECT_FALSE(parseRequest(ApiKind::kCompletions, post(deep)).ok());
}

// Client numbers are bounded where they are read: the router adds prompt and output tokens per
// instance (ongoing_tokens), and max_tokens 2^63-1 overflowed that sum (UBSan aborted; release
// builds corrupted load accounting).
TEST(RequestParseTest, ClientTokenCountsAreBoundedWithTheFieldNamed) {
  struct Case {
    ApiKind kind;
    std::string body;
    std::string field;  // empty: accepted
  };
  std::string huge = "9223372036854775807";
  std::vector<Case> cases = {
      {ApiKind::kCompletions, R"({"model":"m","prompt":[1,2],"max_tokens":)" + huge + "}",
       "max_tokens"},
      {ApiKind::kCompletions, R"({"model":"m","prompt":"text","max_tokens":)" + huge + "}",
       "max_tokens"},
      {ApiKind::kCompletions, R"({"model":"m","prompt":[1],"max_tokens":16777217})", "max_tokens"},
      {ApiKind::kCompletions, R"({"model":"m","prompt":[1],"max_tokens":-1})", "max_tokens"},
      {ApiKind::kCompletions, R"({"model":"m","prompt":[1],"max_tokens":1e300})", "max_tokens"},
      {ApiKind::kCompletions, R"({"model":"m","prompt":[1],"max_tokens":16777216})", ""},
      {ApiKind::kChat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":)" + huge + "}",
       "max_tokens"},
      {ApiKind::kChat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":)" +
           huge + "}",
       "max_completion_tokens"},
      {ApiKind::kChat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":9})", ""},
  };
  for (const Case& c : cases) {
    auto p = parseRequest(c.kind, post(c.body));
    if (c.field.empty()) {
      EXPECT_TRUE(p.ok()) << c.body << ": " << p.status();
      continue;
    }
    ASSERT_FALSE(p.ok()) << c.body << " was accepted with max_tokens " << p->max_tokens;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.field), std::string::npos) << p.status();
  }
}

// The read-ahead reserves for the bytes that arrived, not for the Content-Length announced: a
// client announcing 32 MiB and sending the start of a prompt held 32 MiB of token ids.
TEST(RequestParseTest, ReadAheadReservesForWhatArrivedNotTheAnnouncedLength) {
  PromptReadAhead ahead(16);
  std::string start = R"({"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,)";
  ahead.onBody(start, 32u << 20);
  ASSERT_NE(ahead.prefetch(), nullptr);
  EXPECT_GE(ahead.prefetch()->ids().size(), 9u);
  EXPECT_LE(ahead.prefetch()->ids().capacity() * sizeof(policy::TokenId), 4096u);
}

// Token ids of every length, at every alignment against the end of the body (the scanner reads
// 8 bytes at a time where it can), and the bounds of a token id.
TEST(RequestParseTest, SinglePassReadsTokenIdsOfEveryLength) {
  std::vector<policy::TokenId> ids = {0,        7,        10,        99,         100,
                                      12345,    999999,   1000000,   9999999,    10000000,
                                      12345678, 99999999, 100000000, 4294967295u};
  for (size_t shift = 0; shift < ids.size(); ++shift) {
    std::string body = R"({"model":"m","prompt":[)";
    for (size_t i = 0; i < ids.size(); ++i) {
      body += std::to_string(ids[(i + shift) % ids.size()]);
      body += i + 1 < ids.size() ? (i % 2 ? ", " : ",") : "";
    }
    body += "]}";
    auto fast = fastParseTokenCompletion(body);
    ASSERT_TRUE(fast.has_value()) << body;
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(fast->token_ids[i], ids[(i + shift) % ids.size()]) << body;
    }
  }
  for (std::string bad : {"4294967296", "00", "012", "1.5", "1e3", "-0", "99999999999"}) {
    std::string body = R"({"model":"m","prompt":[1,)" + bad + R"(,2,3,4,5,6,7,8]})";
    EXPECT_FALSE(fastParseTokenCompletion(body).has_value()) << body;
  }
}

// Random edits of a valid body: whenever the single-pass path accepts one, the DOM path must
// accept it too and read the same fields.
TEST(RequestParseTest, SinglePassNeverAcceptsWhatTheDomPathReadsDifferently) {
  const std::string base =
      R"({"model":"m","prompt":[12,0,345],"stream":false,"max_tokens":7,"user":"u",)"
      R"("stop":["\n"],"x":{"y":[1.5e3,-2,true,null]}})";
  const std::string alphabet = "{}[]:,\"\\0123456789-+.eE tfnulrsa\x01\xc3";
  std::mt19937 rng(11);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string body = base;
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      size_t at = rng() % (body.size() + 1);
      char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          if (at < body.size()) body[at] = c;
          break;
        case 1:
          body.insert(body.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          if (at < body.size()) body.erase(at, 1);
      }
    }
    auto fast = fastParseTokenCompletion(body);
    if (!fast) continue;
    ++accepted;
    auto dom = parseRequestDom(ApiKind::kCompletions, post(body));
    ASSERT_TRUE(dom.ok()) << body << ": " << dom.status();
    ASSERT_EQ(fast->model, dom->model) << body;
    ASSERT_EQ(fast->stream, dom->stream) << body;
    ASSERT_EQ(fast->max_tokens, dom->max_tokens) << body;
    ASSERT_EQ(fast->session, dom->session) << body;
    ASSERT_EQ(fast->token_ids, dom->token_ids) << body;
  }
  EXPECT_GT(accepted, 100);  // the edits must leave enough valid bodies to compare
}

TEST(RequestParseTest, SinglePassLeavesHugeExponentsToTheDomPath) {
  // An unknown key's number whose exponent overflows the DOM parser: the scanner must not
  // accept a body the DOM path refuses.
  const std::string body = R"({"model":"m","prompt":[2],"m^o_tokens":9246744e73709551614})";
  EXPECT_FALSE(fastParseTokenCompletion(body).has_value());
  EXPECT_FALSE(parseRequestDom(ApiKind::kCompletions, post(body)).ok());
  // An ordinary exponent is still read in a single pass.
  EXPECT_TRUE(fastParseTokenCompletion(R"({"model":"m","prompt":[2],"x":1.5e300})").has_value());
}

// A long token-id body with ids of mixed lengths and the given separator.
std::string longTokenBody(std::mt19937& rng, size_t count, std::string_view sep,
                          std::vector<policy::TokenId>* ids) {
  std::string body = R"({"model":"m","stream":false,"prompt":[)";
  for (size_t i = 0; i < count; ++i) {
    uint64_t pick = rng() % 10;
    policy::TokenId id = pick == 0   ? static_cast<policy::TokenId>(rng() % 10)
                         : pick == 1 ? static_cast<policy::TokenId>(rng())  // up to 10 digits
                         : pick == 2 ? static_cast<policy::TokenId>(rng() % 100000000)
                                     : static_cast<policy::TokenId>(rng() % 100000);
    ids->push_back(id);
    body += std::to_string(id);
    if (i + 1 < count) body += sep;
  }
  body += R"(],"max_tokens":3,"user":"u"})";
  return body;
}

// Long arrays go through the 64-byte windows: every separator style, every id length, and the
// same ids when the body is fed in pieces (a body still arriving) before the final parse.
TEST(RequestParseTest, LongPromptsReadAlikeWholeAndInPieces) {
  std::mt19937 rng(5);
  for (std::string_view sep : {",", ", ", " , ", ",\n  "}) {
    for (size_t count : {1u, 30u, 2000u}) {
      std::vector<policy::TokenId> ids;
      std::string body = longTokenBody(rng, count, sep, &ids);
      auto whole = fastParseTokenCompletion(body);
      ASSERT_TRUE(whole.has_value()) << body.substr(0, 200);
      ASSERT_EQ(whole->token_ids, ids);
      EXPECT_EQ(whole->max_tokens, 3);
      for (int trial = 0; trial < 20; ++trial) {
        TokenPromptPrefetch prefetch(body.size());
        size_t got = 0;
        bool located = false;  // the prompt's '[' was in view of a feed
        while (got < body.size()) {
          got = std::min(body.size(), got + 1 + rng() % (trial < 10 ? 9 : 4000));
          if (got == body.size()) break;
          prefetch.feed(std::string_view(body).substr(0, got));
          located = located || got > body.find('[');
        }
        EXPECT_LE(prefetch.ids().size(), ids.size());
        auto pieces = fastParseTokenCompletion(body, &prefetch);
        ASSERT_TRUE(pieces.has_value());
        EXPECT_EQ(pieces->token_ids, ids);
        EXPECT_EQ(pieces->session, "u");
        EXPECT_EQ(prefetch.used(), located);
      }
    }
  }
}

// Random edits of long bodies, read whole and in pieces: whenever the single-pass path accepts
// one, the DOM path must read the same ids; both ways must agree with each other.
TEST(RequestParseTest, LongPromptEditsAgreeWithDomPathWholeAndInPieces) {
  std::mt19937 rng(17);
  const std::string alphabet = ",,,  ]]0123456789-.e\n\"[{";
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<policy::TokenId> ids;
    std::string body = longTokenBody(rng, 60, trial % 2 ? "," : ", ", &ids);
    for (int edits = 1 + static_cast<int>(rng() % 2); edits > 0; --edits) {
      size_t at = 30 + rng() % (body.size() - 60);
      char c = alphabet[rng() % alphabet.size()];
      if (rng() % 2) {
        body[at] = c;
      } else {
        body.insert(body.begin() + static_cast<std::ptrdiff_t>(at), c);
      }
    }
    auto whole = fastParseTokenCompletion(body);
    TokenPromptPrefetch prefetch(body.size());
    for (size_t got = 1 + rng() % 50; got < body.size(); got += 1 + rng() % 50) {
      prefetch.feed(std::string_view(body).substr(0, got));
    }
    auto pieces = fastParseTokenCompletion(body, &prefetch);
    ASSERT_EQ(whole.has_value(), pieces.has_value()) << body;
    if (!whole) continue;
    ++accepted;
    ASSERT_EQ(whole->token_ids, pieces->token_ids) << body;
    auto dom = parseRequestDom(ApiKind::kCompletions, post(body));
    ASSERT_TRUE(dom.ok()) << body << ": " << dom.status();
    ASSERT_EQ(whole->token_ids, dom->token_ids) << body;
  }
  EXPECT_GT(accepted, 300);
}

// A prefetch never decides validity: an invalid array seen in pieces still declines, and a
// body whose prompt comes after a member it cannot skip is read by the final parse alone.
TEST(RequestParseTest, PrefetchLeavesValidityToTheFinalParse) {
  std::string bad = R"({"model":"m","prompt":[1,2,03,4]})";
  TokenPromptPrefetch prefetch(bad.size());
  for (size_t got = 1; got < bad.size(); ++got) prefetch.feed(std::string_view(bad).substr(0, got));
  EXPECT_FALSE(fastParseTokenCompletion(bad, &prefetch).has_value());
  std::string escaped = R"({"x\"y":1,"model":"m","prompt":[1,2,3],"x":1})";
  TokenPromptPrefetch skip(escaped.size());
  skip.feed(std::string_view(escaped).substr(0, escaped.size() - 3));
  EXPECT_TRUE(skip.ids().empty());
  EXPECT_FALSE(fastParseTokenCompletion(escaped, &skip).has_value());  // the DOM path's
  std::string dup = R"({"model":"m","prompt":[1,2],"prompt":[3]})";
  TokenPromptPrefetch twice(dup.size());
  twice.feed(std::string_view(dup).substr(0, dup.size() - 2));
  EXPECT_FALSE(fastParseTokenCompletion(dup, &twice).has_value());
  EXPECT_FALSE(twice.used());
}

// The single pass tells whether the client sent its own kv_transfer_params (the router strips
// them), so the body need not be searched; nested members of that name do not count.
TEST(RequestParseTest, SinglePassReportsClientKvTransferParams) {
  auto with = fastParseTokenCompletion(R"({"model":"m","prompt":[1],"kv_transfer_params":{}})");
  ASSERT_TRUE(with.has_value());
  EXPECT_TRUE(with->has_kv_transfer_params);
  auto nested =
      fastParseTokenCompletion(R"({"model":"m","prompt":[1],"x":{"kv_transfer_params":1}})");
  ASSERT_TRUE(nested.has_value());
  EXPECT_FALSE(nested->has_kv_transfer_params);
  auto dom = parseRequest(ApiKind::kCompletions, post(R"({"model":"m\"","prompt":[1]})"));
  ASSERT_TRUE(dom.ok());
  EXPECT_FALSE(dom->has_kv_transfer_params);
}

// Every parse path decodes the key as the engine's JSON parser does: an escaped spelling is
// the same member and must be reported (a text search for the key misses it).
TEST(RequestParseTest, EscapedKvTransferParamsKeyIsReportedOnEveryPath) {
  const char* bodies[] = {
      R"({"model":"m","prompt":[1],"kv_transfer\u005fparams":{}})",
      R"({"model":"m","prompt":"text","kv\u005Ftransfer_params":{"source":"http://x:1"}})",
      R"({"model":"m","prompt":[[1,2]],"\u006bv_transfer_params":null})",
  };
  for (const char* body : bodies) {
    auto parsed = parseRequest(ApiKind::kCompletions, post(body));
    ASSERT_TRUE(parsed.ok()) << body;
    EXPECT_TRUE(parsed->has_kv_transfer_params) << body;
  }
  auto chat =
      parseRequest(ApiKind::kChat, post(R"({"model":"m","messages":[{"role":"user",)"
                                        R"("content":"x"}],"kv_transfer_param\u0073":{}})"));
  ASSERT_TRUE(chat.ok());
  EXPECT_TRUE(chat->has_kv_transfer_params);
}

TEST(RequestParseTest, SinglePassAppliesSessionHeaderAndBound) {
  auto p = parseRequest(ApiKind::kCompletions,
                        post(R"({"model":"m","prompt":[1],"user":"body"})", "hdr"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->session, "hdr");
  std::string long_user = R"({"model":"m","prompt":[1],"user":")" + std::string(300, 'u') + "\"}";
  EXPECT_FALSE(parseRequest(ApiKind::kCompletions, post(long_user)).ok());
}

TEST(RequestParseTest, HashesFollowTheDomain) {
  ParsedRequest tokens;
  tokens.has_token_ids = true;
  tokens.token_ids.assign(40, 7);
  EXPECT_EQ(requestHashes(tokens, 16).size(), 2u);
  ParsedRequest text;
  text.text.assign(130, 'x');
  EXPECT_EQ(requestHashes(text, 16).size(), 2u);  // 64 bytes per block
}

}  // namespace
}  // namespace kvf::router

namespace kvf::router {
namespace {

std::string tokenBody(std::string extra) {
  std::string body = R"({"model":"m","prompt":[)";
  for (int i = 0; i < 48; ++i) body += (i ? "," : "") + std::to_string(100 + i);
  return body + "]" + extra + "}";
}

// cache_salt and multimodal items are read (by the DOM path: the single pass leaves such
// bodies to it), validated with the field named, and key the prompt's hashes as vLLM keys its
// blocks: a salt changes block 0 and so every block after it.
TEST(RequestParseTest, ExtraKeysAreReadAndKeyTheHashes) {
  auto plain = parseRequest(ApiKind::kCompletions, post(tokenBody("")));
  auto salted = parseRequest(ApiKind::kCompletions, post(tokenBody(R"(,"cache_salt":"t-a")")));
  auto image = parseRequest(
      ApiKind::kCompletions,
      post(tokenBody(R"(,"kvfabric_mm_items":[{"identifier":"abc","offset":20,"length":8}])")));
  ASSERT_TRUE(plain.ok() && salted.ok() && image.ok()) << salted.status() << image.status();
  EXPECT_EQ(salted->extra_keys.cache_salt, "t-a");
  ASSERT_EQ(image->extra_keys.mm_items.size(), 1u);
  EXPECT_EQ(image->extra_keys.mm_items[0].offset, 20);
  auto h_plain = requestHashes(*plain, 16);
  auto h_salted = requestHashes(*salted, 16);
  auto h_image = requestHashes(*image, 16);
  ASSERT_EQ(h_plain.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(h_plain[i], h_salted[i]) << i;
  EXPECT_EQ(h_plain[0], h_image[0]);  // the image starts in block 1
  EXPECT_NE(h_plain[1], h_image[1]);
  EXPECT_NE(h_plain[2], h_image[2]);
  // A LoRA adapter keys every block.
  ParsedRequest lora = *plain;
  lora.extra_keys.lora_name = "sql-lora";
  auto h_lora = requestHashes(lora, 16);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(h_plain[i], h_lora[i]) << i;
  // Text prompts are keyed too.
  auto text = parseRequest(ApiKind::kCompletions,
                           post(R"({"model":"m","prompt":"abcdefghijklmnopqrstuvwxyz0123456789)"
                                R"(abcdefghijklmnopqrstuvwxyz0123456789","cache_salt":"s"})"));
  ASSERT_TRUE(text.ok()) << text.status();
  ParsedRequest unsalted_text = *text;
  unsalted_text.extra_keys = {};
  EXPECT_NE(requestHashes(*text, 4), requestHashes(unsalted_text, 4));

  for (const char* bad : {R"(,"cache_salt":"")", R"(,"cache_salt":7)", R"(,"kvfabric_mm_items":{})",
                          R"(,"kvfabric_mm_items":[{"identifier":"a","offset":-1,"length":1}])",
                          R"(,"kvfabric_mm_items":[{"offset":0,"length":1}])"}) {
    auto p = parseRequest(ApiKind::kCompletions, post(tokenBody(bad)));
    ASSERT_FALSE(p.ok()) << bad;
    std::string message(p.status().message());
    EXPECT_TRUE(message.find("cache_salt") != std::string::npos ||
                message.find("kvfabric_mm_items") != std::string::npos)
        << message;
  }
}

// vLLM's defaults when max_tokens is unset (completions 16, chat the rest of the context),
// the router's default and cap, and the body rewrite that carries them.
TEST(RequestParseTest, EffectiveMaxTokensFollowsVllmAndTheRouterCaps) {
  auto unset = parseRequest(ApiKind::kCompletions, post(R"({"model":"m","prompt":[1,2,3]})"));
  auto chat = parseRequest(ApiKind::kChat,
                           post(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})"));
  auto given = parseRequest(ApiKind::kChat, post(R"({"model":"m","max_completion_tokens":900,
                                                     "messages":[{"role":"user","content":"a"}]})"));
  auto fast = parseRequest(ApiKind::kCompletions,
                           post(R"({"model":"m","prompt":[1,2,3],"max_tokens":40})"));
  ASSERT_TRUE(unset.ok() && chat.ok() && given.ok() && fast.ok());
  EXPECT_FALSE(unset->max_tokens_given);
  EXPECT_FALSE(chat->max_tokens_given);
  EXPECT_TRUE(given->max_tokens_given);
  EXPECT_TRUE(fast->max_tokens_given);
  EXPECT_EQ(effectiveMaxTokens(*unset, ApiKind::kCompletions, 0, 0, 4096), 16);
  EXPECT_EQ(effectiveMaxTokens(*chat, ApiKind::kChat, 0, 0, 4096), 4096 - chat->prompt_tokens);
  EXPECT_EQ(effectiveMaxTokens(*chat, ApiKind::kChat, 0, 1000, 4096), 1000);
  EXPECT_EQ(effectiveMaxTokens(*chat, ApiKind::kChat, 64, 0, 4096), 64);
  EXPECT_EQ(effectiveMaxTokens(*given, ApiKind::kChat, 64, 500, 4096), 500);
  EXPECT_EQ(effectiveMaxTokens(*fast, ApiKind::kCompletions, 64, 0, 0), 40);
  auto rewritten = withMaxTokens(R"({"model":"m","max_completion_tokens":900})", 500);
  ASSERT_TRUE(rewritten.has_value());
  auto obj = json::parseObject(*rewritten);
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ(obj->at("max_tokens"), 500);
  EXPECT_EQ(obj->at("max_completion_tokens"), 500);
}

}  // namespace
}  // namespace kvf::router
