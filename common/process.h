// Child processes started from an argv: output to a log file or a pipe, optional piped stdin,
// own process group, death with the parent; bounded waits, stop (SIGTERM, then SIGKILL) and
// kill of the whole group, line I/O on the pipes with deadlines. A Process owns its child: the
// destructor stops it and reaps it, so no child outlives its owner. Not thread-safe: one thread
// at a time (it need not be the thread that spawned it).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvf {

// How a child ended: it either exited with `code` (signal == 0) or was killed by `signal`
// (signal > 0, code == 0). A shell's "128 + signal" is an exit code here, never a signal.
// code -1: the child was reaped behind our back (SIGCHLD ignored), so its status is unknown.
struct ExitStatus {
  int code = 0;
  int signal = 0;

  static ExitStatus exited(int code) { return {code, 0}; }
  static ExitStatus killedBy(int signal) { return {0, signal}; }
  bool success() const { return code == 0 && signal == 0; }
  std::string toString() const;  // "exit 3" or "signal 9 (Killed)"
  friend bool operator==(const ExitStatus&, const ExitStatus&) = default;
};

std::ostream& operator<<(std::ostream& out, const ExitStatus& status);

struct ProcessOptions {
  // Where stdout and stderr go when set (created 0644); inherited from us otherwise.
  std::string log_path;
  bool truncate_log = false;  // false appends to an existing log
  // stdout into a pipe read with readLine(); stderr still goes to log_path (or is inherited).
  bool pipe_stdout = false;
  // stdin from a pipe written with writeLine(); /dev/null otherwise.
  bool pipe_stdin = false;
  // The child leads a new process group: stop() and kill() signal the whole group, so
  // grandchildren (a shell's commands, a wrapper's server) go too.
  bool own_group = true;
  // SIGKILL when the thread that spawned it exits (PR_SET_PDEATHSIG): spawn from a thread that
  // lives as long as the child should (the main or test thread).
  bool die_with_parent = true;
  // The destructor's stop() grace period; zero sends SIGKILL at once.
  std::chrono::milliseconds destroy_grace{2000};
};

class Process {
 public:
  // Starts argv[0] (a path; no PATH search) with the environment of this process. Errors:
  // InvalidArgument (empty argv), NotFound (argv[0] missing or not executable), Internal (the
  // log file, a pipe or fork failed).
  static absl::StatusOr<std::unique_ptr<Process>> spawn(const std::vector<std::string>& argv,
                                                        ProcessOptions options = {});
  ~Process();  // stop(options.destroy_grace), then reap
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }  // argv[0]'s file name
  const std::string& logPath() const { return options_.log_path; }

  // True while the child has not exited.
  bool running();
  // Its exit status once it has exited, or nullopt if still running after `timeout`.
  std::optional<ExitStatus> wait(std::chrono::milliseconds timeout);
  // SIGTERM to the group, up to `grace` for the child to exit, then SIGKILL to the group; reaps
  // it. A child that already exited is only reaped (anything left in its group is killed).
  ExitStatus stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  // SIGKILL to the group now; returns once the child is reaped.
  ExitStatus kill() { return stop(std::chrono::milliseconds(0)); }

  // Writes `line` and a newline to the child's stdin (pipe_stdin) within `timeout`. A child
  // that closed its stdin gives an error, never SIGPIPE.
  absl::Status writeLine(std::string_view line,
                         std::chrono::milliseconds timeout = std::chrono::seconds(5));
  void closeStdin();
  // The next line of the child's stdout (pipe_stdout) without its newline; nullopt on timeout
  // or at the end of the output (a last line without a newline is returned first).
  std::optional<std::string> readLine(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix` and returns it; nullopt as for readLine().
  std::optional<std::string> readUntil(std::string_view prefix, std::chrono::milliseconds timeout);

 private:
  Process(pid_t pid, std::string name, ProcessOptions options, int stdin_fd, int stdout_fd);
  // Records the exit status once the child has exited (leaving it a zombie until reap()).
  bool pollExit(bool block);
  void signalGroup(int sig);  // to the group (own_group) and the child
  ExitStatus reap();          // kills what is left of the group, then reaps the child

  pid_t pid_;
  std::string name_;
  ProcessOptions options_;
  int stdin_fd_;
  int stdout_fd_;
  std::string out_buffer_;  // stdout read but not yet returned as lines
  bool out_eof_ = false;
  std::optional<ExitStatus> status_;  // set once it has exited
  bool reaped_ = false;
};

// A TCP port on 127.0.0.1 that was free a moment ago, chosen at random below the kernel's
// ephemeral range so it cannot clash with outgoing connections' source ports. For a child's
// listening port when the child cannot report the port it bound itself.
absl::StatusOr<uint16_t> pickFreePort();

}  // namespace kvf
