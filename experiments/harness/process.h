// Child processes for the experiment harness: spawn with stdout/stderr to a log file, die with
// the harness (PR_SET_PDEATHSIG), stop gracefully with SIGTERM then SIGKILL after a grace
// period. Owned by the thread that spawned it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvf::experiments {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with the given arguments; output goes to `log_path` (appended).
  static absl::StatusOr<std::unique_ptr<ChildProcess>> spawn(const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  ~ChildProcess();  // stops the process (SIGTERM, then SIGKILL after 2 s)

  pid_t pid() const { return pid_; }
  // True while the process has not exited (reaps it if it has).
  bool running();
  // SIGTERM, wait up to `grace`, then SIGKILL and wait. Returns the exit status (or -signal).
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  const std::string& name() const { return name_; }

 private:
  ChildProcess(pid_t pid, std::string name) : pid_(pid), name_(std::move(name)) {}
  pid_t pid_;
  std::string name_;
  bool reaped_ = false;
  int exit_status_ = 0;
};

// A TCP port on 127.0.0.1 that was free a moment ago, chosen at random below the kernel's
// ephemeral range so it cannot clash with outgoing connections' source ports.
absl::StatusOr<uint16_t> pickFreePort();

}  // namespace kvf::experiments
