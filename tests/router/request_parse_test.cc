#include "router/request_parse.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(chat->max_tokens, 256);
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
