// kvf::Process on /bin/sh scripts: exit codes and signals in the one ExitStatus convention,
// stop() escalating to SIGKILL, line I/O with deadlines, log capture, the group kill reaching a
// grandchild, death with the parent, and pickFreePort().
#include "common/process.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/testing/temp_dir.h"

namespace kvf {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::unique_ptr<Process> sh(const std::string& script, ProcessOptions options = {}) {
  auto p = Process::spawn({"/bin/sh", "-c", script}, std::move(options));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

ProcessOptions piped() {
  ProcessOptions o;
  o.pipe_stdin = true;
  o.pipe_stdout = true;
  return o;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// True once `pid` is gone (or a zombie nobody has reaped yet, which runs nothing).
bool gone(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
    size_t paren = stat.rfind(')');
    if (stat.empty() || (paren != std::string::npos && stat.substr(paren + 2, 1) == "Z")) {
      return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
}

TEST(ExitStatus, OneConventionForCodesAndSignals) {
  EXPECT_EQ(ExitStatus::exited(3).toString(), "exit 3");
  EXPECT_EQ(ExitStatus::killedBy(SIGKILL).toString(), "signal 9 (Killed)");
  EXPECT_TRUE(ExitStatus::exited(0).success());
  EXPECT_FALSE(ExitStatus::exited(137).success());
  EXPECT_NE(ExitStatus::exited(128 + SIGKILL), ExitStatus::killedBy(SIGKILL));
}

TEST(Process, ReportsTheExitCode) {
  auto p = sh("exit 3");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->wait(5s), ExitStatus::exited(3));
  EXPECT_FALSE(p->running());
  EXPECT_EQ(p->stop(), ExitStatus::exited(3));  // already exited: only reaped
  EXPECT_EQ(p->name(), "sh");
  // A shell reporting a killed command exits 128 + signal: still an exit code.
  auto q = sh("sh -c 'kill -KILL $$'; exit $?");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->wait(5s), ExitStatus::exited(128 + SIGKILL));
}

TEST(Process, ReportsTheSignalThatKilledIt) {
  auto p = sh("kill -USR1 $$; sleep 30");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->wait(5s), ExitStatus::killedBy(SIGUSR1));
  auto q = sh("sleep 30");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->wait(50ms), std::nullopt);  // still running
  EXPECT_TRUE(q->running());
  EXPECT_EQ(q->kill(), ExitStatus::killedBy(SIGKILL));
  EXPECT_EQ(q->wait(0ms), ExitStatus::killedBy(SIGKILL));
}

// The harness's use: engines logging to one appended file, stopped with SIGTERM.
TEST(Process, StopsAndReportsExitStatus) {
  fs::path dir = testing::freshTempDir("kvf_process_stop");
  ProcessOptions o;
  o.log_path = (dir / "log").string();
  auto sleeper = Process::spawn({"/bin/sleep", "30"}, o);
  ASSERT_TRUE(sleeper.ok()) << sleeper.status();
  EXPECT_TRUE((*sleeper)->running());
  auto start = Clock::now();
  EXPECT_EQ((*sleeper)->stop(2s), ExitStatus::killedBy(SIGTERM));
  EXPECT_LT(Clock::now() - start, 1s);  // it obeyed SIGTERM: no wait for the grace period
  EXPECT_FALSE((*sleeper)->running());
  auto quick = Process::spawn({"/bin/sh", "-c", "echo hello; exit 3"}, o);
  ASSERT_TRUE(quick.ok()) << quick.status();
  while ((*quick)->running()) std::this_thread::sleep_for(5ms);
  EXPECT_EQ((*quick)->stop(), ExitStatus::exited(3));
  EXPECT_EQ(readFile(dir / "log"), "hello\n");
}

TEST(Process, StopEscalatesToSigkillWhenSigtermIsIgnored) {
  auto p = sh("trap '' TERM; echo ready; sleep 30", piped());
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->readLine(5s), "ready");  // the trap is in place
  auto start = Clock::now();
  EXPECT_EQ(p->stop(300ms), ExitStatus::killedBy(SIGKILL));
  auto took = Clock::now() - start;
  EXPECT_GE(took, 300ms);  // the grace period was given
  EXPECT_LT(took, 3s);
}

TEST(Process, ReadsAndWritesLinesWithDeadlines) {
  auto p = sh("echo one; read x; echo \"got $x\"; echo skip; echo 'RESULT ok'; sleep 30", piped());
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->readLine(5s), "one");
  auto start = Clock::now();
  EXPECT_EQ(p->readLine(100ms), std::nullopt);  // the child waits for us: a timeout
  EXPECT_GE(Clock::now() - start, 100ms);
  ASSERT_TRUE(p->writeLine("two").ok());
  EXPECT_EQ(p->readLine(5s), "got two");
  EXPECT_EQ(p->readUntil("RESULT", 5s), "RESULT ok");
  EXPECT_EQ(p->readUntil("NEVER", 100ms), std::nullopt);
}

TEST(Process, ReadLineReturnsTheLastPartialLineThenEnd) {
  auto p = sh("printf 'a\\nb'", piped());
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->readLine(5s), "a");
  EXPECT_EQ(p->readLine(5s), "b");
  EXPECT_EQ(p->readLine(5s), std::nullopt);
  EXPECT_EQ(p->wait(5s), ExitStatus::exited(0));
}

TEST(Process, WritingToAChildThatClosedStdinIsAnErrorNotSigpipe) {
  auto p = sh("exec 0<&-; echo closed; sleep 30", piped());
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->readLine(5s), "closed");
  absl::Status st = p->writeLine("anyone there?");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_TRUE(p->running());  // and we are still alive to check
  auto no_pipe = sh("exit 0");
  ASSERT_NE(no_pipe, nullptr);
  EXPECT_EQ(no_pipe->writeLine("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(no_pipe->readLine(10ms), std::nullopt);
}

TEST(Process, CapturesStdoutAndStderrInTheLog) {
  fs::path dir = testing::freshTempDir("kvf_process_log");
  ProcessOptions o;
  o.log_path = (dir / "log").string();
  for (int i = 0; i < 2; ++i) {  // appended by default
    auto p = sh("echo out; echo err >&2", o);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->wait(5s), ExitStatus::exited(0));
  }
  EXPECT_EQ(readFile(dir / "log"), "out\nerr\nout\nerr\n");
  o.truncate_log = true;
  auto p = sh("echo again", o);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->wait(5s), ExitStatus::exited(0));
  EXPECT_EQ(readFile(dir / "log"), "again\n");
  EXPECT_EQ(p->logPath(), o.log_path);
  // Piped stdout with a log: stdout to the pipe, stderr to the log.
  ProcessOptions both = piped();
  both.log_path = (dir / "err.log").string();
  auto q = sh("echo to-pipe; echo to-log >&2", both);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->readLine(5s), "to-pipe");
  EXPECT_EQ(q->wait(5s), ExitStatus::exited(0));
  EXPECT_EQ(readFile(dir / "err.log"), "to-log\n");
}

TEST(Process, KillAndStopReachGrandchildren) {
  for (bool use_stop : {false, true}) {
    auto p = sh("trap '' TERM; sleep 30 & echo $!; wait", piped());
    ASSERT_NE(p, nullptr);
    auto line = p->readLine(5s);
    ASSERT_TRUE(line.has_value());
    pid_t grandchild = std::stoi(*line);
    ASSERT_FALSE(gone(grandchild, 0ms));
    if (use_stop) {
      EXPECT_EQ(p->stop(100ms), ExitStatus::killedBy(SIGKILL));
    } else {
      EXPECT_EQ(p->kill(), ExitStatus::killedBy(SIGKILL));
    }
    EXPECT_TRUE(gone(grandchild, 5s)) << "grandchild " << grandchild << " survived";
  }
}

TEST(Process, DestructorLeavesNothingRunning) {
  pid_t child = 0, grandchild = 0;
  {
    ProcessOptions o = piped();
    o.destroy_grace = 0ms;
    auto p = sh("sleep 30 & echo $!; wait", o);
    ASSERT_NE(p, nullptr);
    child = p->pid();
    auto line = p->readLine(5s);
    ASSERT_TRUE(line.has_value());
    grandchild = std::stoi(*line);
  }
  EXPECT_TRUE(gone(child, 5s));
  EXPECT_TRUE(gone(grandchild, 5s));
  // A child that exited normally leaves no grandchild behind either.
  {
    auto p = sh("sleep 30 & echo $!", piped());
    ASSERT_NE(p, nullptr);
    auto line = p->readLine(5s);
    ASSERT_TRUE(line.has_value());
    grandchild = std::stoi(*line);
    EXPECT_EQ(p->wait(5s), ExitStatus::exited(0));
    EXPECT_FALSE(gone(grandchild, 0ms));
  }
  EXPECT_TRUE(gone(grandchild, 5s));
}

TEST(Process, DiesWithItsParent) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t middle = ::fork();  // this test binary runs no other threads
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    auto p = Process::spawn({"/bin/sleep", "30"});
    pid_t pid = p.ok() ? (*p)->pid() : -1;
    [[maybe_unused]] ssize_t n = ::write(fds[1], &pid, sizeof(pid));
    ::_exit(0);  // no destructor runs: only PR_SET_PDEATHSIG can end the sleep
  }
  ::close(fds[1]);
  pid_t sleeper = -1;
  ASSERT_EQ(::read(fds[0], &sleeper, sizeof(sleeper)), static_cast<ssize_t>(sizeof(sleeper)));
  ::close(fds[0]);
  ASSERT_GT(sleeper, 0);
  ASSERT_EQ(::waitpid(middle, nullptr, 0), middle);
  EXPECT_TRUE(gone(sleeper, 5s)) << "sleep " << sleeper << " outlived its parent";
}

TEST(Process, SpawnErrorsNameTheProblem) {
  auto missing = Process::spawn({"/nonexistent/bin"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.status().message()).find("/nonexistent/bin"), std::string::npos)
      << missing.status();
  EXPECT_EQ(Process::spawn({"/etc/hostname"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Process::spawn({}).status().code(), absl::StatusCode::kInvalidArgument);
  ProcessOptions o;
  o.log_path = "/nonexistent/dir/log";
  auto bad_log = Process::spawn({"/bin/true"}, o);
  EXPECT_EQ(bad_log.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(bad_log.status().message()).find("/nonexistent/dir/log"),
            std::string::npos);
}

TEST(PickFreePort, ReturnsABindablePortBelowTheEphemeralRange) {
  int low = 32768, high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
  for (int i = 0; i < 5; ++i) {
    auto port = pickFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_LT(*port, low);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(*port);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << *port;
    ::close(fd);
  }
}

}  // namespace
}  // namespace kvf
