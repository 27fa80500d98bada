// Test helper for multi-process engine tests: starts build/bin/kvf-engine (or any command)
// with stderr captured to a file, waits for its "ready" log line with a deadline and parses
// the bound addresses, and kills the child (process group) on destruction. Test thread only.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kvf::testing {

inline std::string envOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ChildProcess {
 public:
  // Starts argv[0] with args; stdout and stderr go to `log_path`.
  ChildProcess(const std::vector<std::string>& argv, std::string log_path)
      : log_path_(std::move(log_path)) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      FILE* f = std::freopen(log_path_.c_str(), "w", stderr);
      if (f == nullptr) _exit(127);
      dup2(fileno(stderr), fileno(stdout));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~ChildProcess() { kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string log() const { return readFile(log_path_); }

  // Waits until the log contains `marker`; false on timeout or if the child exited.
  bool waitForLog(const std::string& marker, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (log().find(marker) != std::string::npos) return true;
      if (exited()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // The value after "key=" in the first log line containing `marker`.
  std::string logValue(const std::string& marker, const std::string& key) const {
    std::string text = log();
    size_t line = text.find(marker);
    if (line == std::string::npos) return {};
    size_t end = text.find('\n', line);
    std::string l = text.substr(line, end - line);
    size_t at = l.find(" " + key + "=");
    if (at == std::string::npos) return {};
    at += key.size() + 2;
    return l.substr(at, l.find(' ', at) - at);
  }

  // Waits for exit up to `timeout`; the exit code, or nullopt (still running / killed).
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (exited()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!exited()) return std::nullopt;
    if (WIFEXITED(status_)) return WEXITSTATUS(status_);
    return std::nullopt;
  }

  void kill() {
    if (pid_ <= 0 || reaped_) return;
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
    reaped_ = true;
  }

 private:
  bool exited() {
    if (reaped_) return true;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }

  std::string log_path_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

}  // namespace kvf::testing
