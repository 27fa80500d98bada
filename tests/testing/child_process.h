// Test conveniences over kvf::Process (common/process.h) for multi-process tests: start a child
// with its output in a log file or on pipes, wait for a log marker with a deadline, read
// key=value fields of a log line, and find the binaries (KVF_SOURCE_DIR / KVF_BIN_DIR). The
// children die with the test thread and get SIGKILL (whole group) when destroyed; a child that
// cannot start throws std::runtime_error, which fails the test. Test thread only.
#pragma once

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"

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

inline std::unique_ptr<Process> startChild(const std::vector<std::string>& argv,
                                           ProcessOptions options) {
  options.destroy_grace = std::chrono::milliseconds(0);
  auto p = Process::spawn(argv, std::move(options));
  if (!p.ok()) throw std::runtime_error("cannot start a child: " + p.status().ToString());
  return std::move(*p);
}

// Starts `argv` with stdout and stderr in `log_path` (truncated first).
inline std::unique_ptr<Process> startLogged(const std::vector<std::string>& argv,
                                            const std::string& log_path) {
  ProcessOptions options;
  options.log_path = log_path;
  options.truncate_log = true;
  return startChild(argv, std::move(options));
}

// Starts `argv` with stdin and stdout on pipes (writeLine / readLine); stderr is the test's.
inline std::unique_ptr<Process> startPiped(const std::vector<std::string>& argv) {
  ProcessOptions options;
  options.pipe_stdin = true;
  options.pipe_stdout = true;
  return startChild(argv, std::move(options));
}

inline std::string readLog(const Process& p) { return readFile(p.logPath()); }

// Waits until the child's log contains `marker`; false on timeout or once the child exited
// without writing it.
inline bool waitForLog(Process& p, const std::string& marker, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool exited = !p.running();  // checked first: an exit right after the marker still counts
    if (readLog(p).find(marker) != std::string::npos) return true;
    if (exited || std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The value after " key=" in the first log line containing `marker`; empty if there is none.
inline std::string logValue(const Process& p, const std::string& marker, const std::string& key) {
  std::string text = readLog(p);
  size_t line = text.find(marker);
  if (line == std::string::npos) return {};
  size_t end = text.find('\n', line);
  std::string l = text.substr(line, end == std::string::npos ? std::string::npos : end - line);
  size_t at = l.find(" " + key + "=");
  if (at == std::string::npos) return {};
  at += key.size() + 2;
  return l.substr(at, l.find(' ', at) - at);
}

}  // namespace kvf::testing
