#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <boost/json.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/sse.h"
#include "engine/engine_server.h"
#include "tests/testing/io_thread.h"

namespace kvf::engine {
namespace {

namespace bj = boost::json;
using http::ClientRequest;
using http::Response;

ClientRequest post(std::string target, std::string body) {
  ClientRequest r;
  r.method = "POST";
  r.target = std::move(target);
  r.body = std::move(body);
  return r;
}

ClientRequest get(std::string target) {
  ClientRequest r;
  r.method = "GET";
  r.target = std::move(target);
  return r;
}

std::string tokenPrompt(int n, int salt) {
  bj::array a;
  for (int i = 0; i < n; ++i) a.push_back(1000 + (i * 13 + salt * 71) % 9000);
  return bj::serialize(a);
}

class EngineServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
    ASSERT_TRUE(profile.ok()) << profile.status();
    EngineConfig c;
    c.profile = *profile;
    c.port = 0;
    c.max_model_len = 512;
    c.time_scale = 50;
    c.cache.num_gpu_blocks = 200;
    c.kv_events.endpoint = "tcp://127.0.0.1:*";
    c.kv_events.replay_endpoint = "tcp://127.0.0.1:*";
    ASSERT_TRUE(finalizeEngineConfig(&c).ok());
    auto server = EngineServer::create(io_.context(), c);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    server_->start();
    client_ = http::HttpClient::create(io_.executor(), "127.0.0.1", server_->port());
  }
  void TearDown() override {
    io_.stop();  // no handler may run while the server is destroyed
    client_.reset();
    server_.reset();
  }

  Response call(ClientRequest request) {
    auto r = io_.run([&]() -> asio::awaitable<absl::StatusOr<Response>> {
      co_return co_await client_->request(request);
    });
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : Response{};
  }

  bj::object callJson(ClientRequest request, int expect_status = 200) {
    Response r = call(std::move(request));
    EXPECT_EQ(r.status, expect_status) << r.body;
    auto obj = json::parseObject(r.body);
    EXPECT_TRUE(obj.ok()) << r.body;
    return obj.ok() ? *obj : bj::object{};
  }

  // Concatenated text, finish reason and usage (if sent) of a streamed response.
  struct Streamed {
    std::string text;
    std::string finish_reason;
    bj::object usage;
    bool done = false;
    int chunks = 0;
  };
  Streamed stream(ClientRequest request, bool chat) {
    Response r = call(std::move(request));
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("content-type"), "text/event-stream");
    Streamed out;
    sse::Parser parser;
    auto st = parser.feed(r.body, [&](sse::Event&& e) {
      if (e.data == "[DONE]") {
        out.done = true;
        return;
      }
      auto obj = json::parseObject(e.data);
      ASSERT_TRUE(obj.ok()) << e.data;
      if (obj->contains("usage") && (*obj)["usage"].is_object()) {
        out.usage = (*obj)["usage"].as_object();
      }
      auto& choices = (*obj)["choices"].as_array();
      if (choices.empty()) return;
      ++out.chunks;
      auto& c = choices[0].as_object();
      if (chat) {
        out.text += std::string(c["delta"].as_object()["content"].as_string());
      } else {
        out.text += std::string(c["text"].as_string());
      }
      if (c["finish_reason"].is_string())
        out.finish_reason = std::string(c["finish_reason"].as_string());
    });
    EXPECT_TRUE(st.ok());
    return out;
  }

  testing::IoThread io_;
  std::unique_ptr<EngineServer> server_;
  std::shared_ptr<http::HttpClient> client_;
};

TEST_F(EngineServerTest, RepeatedPromptReportsCachedTokens) {
  std::string body = R"({"prompt": )" + tokenPrompt(100, 1) + R"(, "max_tokens": 3})";
  bj::object first = callJson(post("/v1/completions", body));
  bj::object second = callJson(post("/v1/completions", body));
  auto cached = [](bj::object& o) {
    return o["usage"].as_object()["prompt_tokens_details"].as_object()["cached_tokens"].as_int64();
  };
  EXPECT_EQ(cached(first), 0);
  EXPECT_EQ(cached(second), 96);  // 6 full blocks of 16; the last token is always computed
  EXPECT_EQ(first["usage"].as_object()["prompt_tokens"].as_int64(), 100);
  // After a reset (vLLM's POST /reset_prefix_cache) the same prompt is cold again.
  EXPECT_EQ(call(post("/reset_prefix_cache", "")).status, 200);
  bj::object third = callJson(post("/v1/completions", body));
  EXPECT_EQ(cached(third), 0);
  EXPECT_EQ(first["choices"].as_array()[0].as_object()["text"],
            second["choices"].as_array()[0].as_object()["text"]);
  Response metrics = call(get("/metrics"));
  EXPECT_NE(metrics.body.find("vllm:prefix_cache_hits_total{model_name=\"Qwen/"),
            std::string::npos);
  EXPECT_NE(metrics.body.find("} 96\n"), std::string::npos) << metrics.body;
  for (const char* name :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total"}) {
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  }
}

TEST_F(EngineServerTest, StreamingAndNonStreamingAgree) {
  std::string prompt = tokenPrompt(40, 2);
  std::string plain = R"({"prompt": )" + prompt + R"(, "max_tokens": 12, "ignore_eos": true})";
  std::string streamed = R"({"prompt": )" + prompt +
                         R"(, "max_tokens": 12, "ignore_eos": true, "stream": true,
                             "stream_options": {"include_usage": true}})";
  bj::object a = callJson(post("/v1/completions", plain));
  Streamed b = stream(post("/v1/completions", streamed), false);
  auto& choice = a["choices"].as_array()[0].as_object();
  EXPECT_EQ(std::string(choice["text"].as_string()), b.text);
  EXPECT_EQ(std::string(choice["finish_reason"].as_string()), b.finish_reason);
  EXPECT_EQ(b.chunks, 12);
  EXPECT_TRUE(b.done);
  EXPECT_EQ(b.usage["completion_tokens"].as_int64(), 12);
  EXPECT_EQ(b.usage["prompt_tokens"], a["usage"].as_object()["prompt_tokens"]);

  std::string chat = R"({"messages": [{"role": "user", "content": "tell me a story"}],
                         "max_tokens": 7, "kv_transfer_params": {"remote_engine_id": "e3"}})";
  bj::object c = callJson(post("/v1/chat/completions", chat));
  EXPECT_EQ(c["kv_transfer_params"].as_object()["remote_engine_id"], "e3");  // echoed
  std::string chat_stream = chat.substr(0, chat.size() - 1) + R"(, "stream": true})";
  Streamed d = stream(post("/v1/chat/completions", chat_stream), true);
  auto& msg = c["choices"].as_array()[0].as_object()["message"].as_object();
  EXPECT_EQ(std::string(msg["content"].as_string()), d.text);
  EXPECT_EQ(d.chunks, 7);
}

TEST_F(EngineServerTest, EveryBadInputAnswers400AndTheServerStaysUp) {
  std::string big_prompt = tokenPrompt(600, 3);  // > max_model_len (512)
  struct Case {
    const char* path;
    std::string body;
    const char* field;  // must appear in the message
  };
  std::vector<Case> cases = {
      {"/v1/completions", "not json", "JSON"},
      {"/v1/completions", "[1, 2]", "object"},
      {"/v1/completions", "{}", "prompt"},
      {"/v1/completions", R"({"prompt": 5})", "prompt"},
      {"/v1/completions", R"({"prompt": []})", "prompt"},
      {"/v1/completions", R"({"prompt": ["a", "b"]})", "prompt"},
      {"/v1/completions", R"({"prompt": [1, "x"]})", "prompt[1]"},
      {"/v1/completions", R"({"prompt": [1, -4]})", "prompt[1]"},
      {"/v1/completions", R"({"prompt": [1, 2.5]})", "prompt[1]"},
      {"/v1/completions", R"({"prompt": [1, 151936]})", "prompt[1]"},
      {"/v1/completions", R"({"prompt": [1, 18446744073709551615]})", "prompt[1]"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": -1})", "max_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 0})", "max_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 1000000000})", "max_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 99999999999999999999})",
       "max_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": "10"})", "max_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 1.5})", "max_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "min_tokens": 20, "max_tokens": 5})", "min_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "ignore_eos": "yes"})", "ignore_eos"},
      {"/v1/completions", R"({"prompt": [1, 2], "stream": "true"})", "stream"},
      {"/v1/completions", R"({"prompt": [1, 2], "stream_options": 3})", "stream_options"},
      {"/v1/completions", R"({"prompt": [1, 2], "n": 2})", "n"},
      {"/v1/completions", R"({"prompt": [1, 2], "temperature": "hot"})", "temperature"},
      {"/v1/completions", R"({"prompt": [1, 2], "kv_transfer_params": "x"})", "kv_transfer_params"},
      {"/v1/completions", R"({"prompt": )" + big_prompt + "}", "prompt"},
      {"/v1/completions", R"({"prompt": "hi", "model": 7})", "model"},
      {"/v1/chat/completions", R"({"prompt": "hi"})", "messages"},
      {"/v1/chat/completions", R"({"messages": "hi"})", "messages"},
      {"/v1/chat/completions", R"({"messages": [{"content": "hi"}]})", "messages[0].role"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 3}]})",
       "messages[0].content"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -2})",
       "max_completion_tokens"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}],
           "max_completion_tokens": 9223372036854775807})",
       "max_completion_tokens"},
      {"/tokenize", R"({"prompt": 3})", "prompt"},
  };
  for (const auto& c : cases) {
    Response r = call(post(c.path, c.body));
    EXPECT_EQ(r.status, 400) << c.path << " " << c.body << " -> " << r.body;
    auto obj = json::parseObject(r.body);
    ASSERT_TRUE(obj.ok()) << r.body;
    std::string message(obj->at("error").as_object().at("message").as_string());
    EXPECT_NE(message.find(c.field), std::string::npos) << c.body << " -> " << message;
  }
  Response unknown = call(post("/v1/completions", R"({"prompt": "hi", "model": "nope"})"));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(call(get("/health")).status, 200);
  bj::object ok =
      callJson(post("/v1/completions", R"({"prompt": "still alive", "max_tokens": 2})"));
  EXPECT_EQ(ok["usage"].as_object()["completion_tokens"].as_int64(), 2);
}

TEST_F(EngineServerTest, TokenizeAndModels) {
  bj::object t = callJson(post("/tokenize", R"({"prompt": "hello world, hello"})"));
  // "hello", " world", ",", " hello": the two "hello" pieces differ by their leading space.
  ASSERT_EQ(t["count"].as_int64(), 4);
  auto& tokens = t["tokens"].as_array();
  EXPECT_NE(tokens[0], tokens[3]);
  bj::object again = callJson(post("/tokenize", R"({"prompt": "hello world, hello"})"));
  EXPECT_EQ(again["tokens"], t["tokens"]);
  EXPECT_EQ(t["max_model_len"].as_int64(), 512);
  bj::object models = callJson(get("/v1/models"));
  EXPECT_EQ(models["data"].as_array()[0].as_object()["id"], "Qwen/Qwen3-Coder-30B-A3B-Instruct");
  // A completion over the same text reports the same prompt length.
  bj::object c =
      callJson(post("/v1/completions", R"({"prompt": "hello world, hello", "max_tokens": 1})"));
  EXPECT_EQ(c["usage"].as_object()["prompt_tokens"].as_int64(), 4);
}

TEST_F(EngineServerTest, ClientDisconnectAbortsTheStreamAndFreesItsBlocks) {
  std::string body = R"({"prompt": )" + tokenPrompt(64, 9) +
                     R"(, "max_tokens": 400, "ignore_eos": true, "stream": true})";
  auto first = io_.run([&]() -> asio::awaitable<absl::StatusOr<std::string>> {
    ClientRequest request = post("/v1/completions", body);  // named, see the GCC 12 pitfall
    auto stream = co_await client_->open(request);
    if (!stream.ok()) co_return stream.status();
    auto chunk = co_await (*stream)->next();
    (*stream)->cancel();  // the client goes away mid-stream
    if (!chunk.ok()) co_return chunk.status();
    co_return chunk->value_or("");
  });
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(first->find("data: "), std::string::npos);
  // The engine notices at its next write, aborts the request and frees its blocks.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string text;
  while (std::chrono::steady_clock::now() < deadline) {
    text = call(get("/metrics")).body;
    if (text.find("kvfabric_engine_requests_aborted_total{model_name=\"Qwen/Qwen3-Coder-30B-A3B-"
                  "Instruct\"} 1") != std::string::npos &&
        text.find(
            "vllm:num_requests_running{model_name=\"Qwen/Qwen3-Coder-30B-A3B-Instruct\"} 0") !=
            std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(
      text.find("kvfabric_engine_requests_aborted_total{model_name=\"Qwen/Qwen3-Coder-30B-A3B-"
                "Instruct\"} 1"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find("vllm:kv_cache_usage_perc{model_name=\"Qwen/Qwen3-Coder-30B-A3B-Instruct\"} 0\n"),
      std::string::npos);
  EXPECT_EQ(call(get("/health")).status, 200);
}

TEST_F(EngineServerTest, MetricsPassPromtoolLintExceptVllmColonNames) {
  if (!std::filesystem::exists("/usr/bin/promtool")) GTEST_SKIP() << "promtool missing";
  callJson(post("/v1/completions", R"({"prompt": "lint me please", "max_tokens": 3})"));
  std::string text = call(get("/metrics")).body;
  std::string path =
      std::filesystem::temp_directory_path() / ("kvf_metrics_" + std::to_string(getpid()) + ".txt");
  {
    std::ofstream out(path);
    out << text;
  }
  std::string cmd = "/usr/bin/promtool check metrics < " + path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  pclose(pipe);
  std::filesystem::remove(path);
  // vLLM's names contain ':' (as vLLM's own do); every other lint problem fails the test.
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    EXPECT_TRUE(line.rfind("vllm:", 0) == 0 &&
                line.find("should not contain ':'") != std::string::npos)
        << line;
  }
}

}  // namespace
}  // namespace kvf::engine
