// Test helper: a real etcd (Debian's /usr/bin/etcd) as a child process on loopback, on client
// and peer ports it picks, with its own data dir under the test's temp folder. stop() kills it
// (SIGKILL unless asked for SIGTERM), start() brings it back on the same ports and data, so a
// test can take etcd away and restore it. Each start logs to its own file in the data dir's
// folder. The child dies with the test; test thread only.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/process.h"
#include "common/strings.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvf::testing {

class EtcdServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  explicit EtcdServer(const std::string& name) : dir_(freshTempDir(name + "_etcd")) {
    if (!std::filesystem::exists(kBinary)) {
      throw std::runtime_error("etcd is not installed (scripts/setup installs etcd-server)");
    }
    auto client = pickFreePort();
    auto peer = pickFreePort();
    if (!client.ok() || !peer.ok()) throw std::runtime_error("no free port for etcd");
    client_port_ = *client;
    peer_port_ = *peer;
  }

  std::string endpoint() const { return strCat("http://127.0.0.1:", client_port_); }
  uint16_t port() const { return client_port_; }
  std::string logPath() const { return (dir_ / strCat("etcd-", starts_, ".log")).string(); }

  // Starts etcd and waits until it serves its v3 gateway; throws when it does not in time.
  void start(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::string peer = strCat("http://127.0.0.1:", peer_port_);
    ++starts_;
    ProcessOptions options;
    options.log_path = logPath();
    options.truncate_log = true;
    process_ = startChild(
        {kBinary, "--name", "kvf-test", "--data-dir", (dir_ / "data").string(),
         "--listen-client-urls", endpoint(), "--advertise-client-urls", endpoint(),
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster",
         "kvf-test=" + peer, "--initial-cluster-state", "new", "--logger", "zap"},
        std::move(options));
    if (!waitForLog(*process_, "serving client traffic", timeout)) {
      throw std::runtime_error("etcd did not start; see " + logPath());
    }
  }

  // SIGKILL (or SIGTERM with `graceful`) and wait until it has exited.
  void stop(bool graceful = false) {
    if (!process_) return;
    if (graceful) {
      process_->stop(std::chrono::seconds(10));
    } else {
      process_->kill();
    }
    process_.reset();
  }

  bool running() const { return process_ != nullptr; }

 private:
  std::filesystem::path dir_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  int starts_ = 0;
  std::unique_ptr<Process> process_;
};

}  // namespace kvf::testing
