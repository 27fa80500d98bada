#include "common/config.h"

#include <gtest/gtest.h>

namespace kvf::config {
namespace {

enum class Mode { kFast, kSlow };

struct Upstream {
  std::string host = "127.0.0.1";
  int port = 0;
};

struct ServerConfig {
  int port = 8000;
  double ratio = 0.5;
  bool verbose = false;
  std::string name = "default";
  Mode mode = Mode::kFast;
  std::vector<Upstream> upstreams;
  std::vector<double> weights;
  int limits_max = 10;
};

void parseServer(ConfigMap& root, ServerConfig* out) {
  root.get("port", &out->port, 1, 65535);
  root.get("ratio", &out->ratio, 0.0, 1.0);
  root.get("verbose", &out->verbose);
  root.get("name", &out->name);
  root.getEnum("mode", &out->mode, {{"fast", Mode::kFast}, {"slow", Mode::kSlow}});
  root.get("weights", &out->weights, 0.0, 10.0);
  for (auto& item : root.mapList("upstreams")) {
    Upstream u;
    item.require("port");
    item.get("host", &u.host);
    item.get("port", &u.port, 1, 65535);
    item.rejectUnknownKeys();
    out->upstreams.push_back(u);
  }
  if (auto limits = root.map("limits")) {
    limits->get("max", &out->limits_max, 1, 100);
    limits->rejectUnknownKeys();
  }
}

absl::StatusOr<ServerConfig> parse(std::string_view text) {
  return parseText<ServerConfig>(text, "test.yaml", parseServer);
}

TEST(Config, DefaultsWhenAbsent) {
  auto c = parse("{}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->port, 8000);
  EXPECT_EQ(c->ratio, 0.5);
  EXPECT_EQ(c->mode, Mode::kFast);
}

TEST(Config, ParsesEveryType) {
  auto c = parse(R"(
port: 9000
ratio: 0.25
verbose: true
name: router-a
mode: slow
weights: [1, 2.5]
upstreams:
  - {host: 10.0.0.1, port: 8001}
  - port: 8002
limits:
  max: 42
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->port, 9000);
  EXPECT_DOUBLE_EQ(c->ratio, 0.25);
  EXPECT_TRUE(c->verbose);
  EXPECT_EQ(c->name, "router-a");
  EXPECT_EQ(c->mode, Mode::kSlow);
  ASSERT_EQ(c->weights.size(), 2u);
  EXPECT_DOUBLE_EQ(c->weights[1], 2.5);
  ASSERT_EQ(c->upstreams.size(), 2u);
  EXPECT_EQ(c->upstreams[0].host, "10.0.0.1");
  EXPECT_EQ(c->upstreams[1].port, 8002);
  EXPECT_EQ(c->limits_max, 42);
}

TEST(Config, ErrorsNameFieldPathAndLine) {
  auto c = parse(R"(port: 70000
upstreams:
  - host: a
    port: 1
  - host: b
    prot: 2
limits:
  max: many
)");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  std::string m(c.status().message());
  EXPECT_NE(m.find("test.yaml:1:7: port: value 70000 is out of range [1, 65535]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("upstreams[1].port: is required"), std::string::npos) << m;
  EXPECT_NE(m.find("test.yaml:6:5: upstreams[1].prot: unknown key"), std::string::npos) << m;
  EXPECT_NE(m.find("limits.max: expected an integer, got \"many\""), std::string::npos) << m;
  EXPECT_NE(m.find("4 problems"), std::string::npos) << m;
}

TEST(Config, RejectsUnknownTopLevelKeyAndBadEnum) {
  auto c = parse("portt: 1\nmode: medium\n");
  ASSERT_FALSE(c.ok());
  std::string m(c.status().message());
  EXPECT_NE(m.find("portt: unknown key"), std::string::npos) << m;
  EXPECT_NE(m.find("mode: must be one of: fast, slow (got \"medium\")"), std::string::npos) << m;
}

TEST(Config, RejectsWrongShapes) {
  auto c = parse("limits: [1, 2]\nweights: {a: 1}\nratio: -0.1\nverbose: maybe\n");
  ASSERT_FALSE(c.ok());
  std::string m(c.status().message());
  EXPECT_NE(m.find("limits: expected a map, got a list"), std::string::npos) << m;
  EXPECT_NE(m.find("weights: expected a list, got a map"), std::string::npos) << m;
  EXPECT_NE(m.find("ratio: value -0.1 is out of range [0, 1]"), std::string::npos) << m;
  EXPECT_NE(m.find("verbose: expected true or false"), std::string::npos) << m;
}

TEST(Config, InvalidYamlReportsPosition) {
  auto c = parse("port: [1,\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("test.yaml:"), std::string::npos);
}

TEST(Config, MissingFileIsNotFound) {
  auto c = parseFile<ServerConfig>("/nonexistent/kvf.yaml", parseServer);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

TEST(Config, NonMapRootIsAnError) {
  auto c = parse("- 1\n- 2\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("<root>: expected a map"), std::string::npos);
}

}  // namespace
}  // namespace kvf::config
