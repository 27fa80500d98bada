#include "common/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <utility>

#include "common/strings.h"

extern char** environ;

namespace kvf {

std::string ExitStatus::toString() const {
  if (signal == 0) return strCat("exit ", code);
  const char* what = ::strsignal(signal);
  return strCat("signal ", signal, " (", what != nullptr ? what : "unknown", ")");
}

std::ostream& operator<<(std::ostream& out, const ExitStatus& status) {
  return out << status.toString();
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxLineBytes = 1 << 20;  // a longer stdout line is returned in pieces

// An owned file descriptor (closed on destruction).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

absl::Status errnoError(const std::string& what) {
  return absl::InternalError(strCat(what, ": ", std::strerror(errno)));
}

// Moves a new close-on-exec descriptor above stdin/stdout/stderr, so that setting up the
// child's 0, 1 and 2 can never overwrite it (only possible when we run with one of them closed).
UniqueFd aboveStdio(int fd) {
  if (fd < 0 || fd > STDERR_FILENO) return UniqueFd(fd);
  UniqueFd low(fd);
  return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1));
}

absl::Status makePipe(UniqueFd& read_end, UniqueFd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errnoError("pipe");
  read_end = aboveStdio(fds[0]);
  write_end = aboveStdio(fds[1]);
  if (read_end.get() < 0 || write_end.get() < 0) return errnoError("pipe");
  return absl::OkStatus();
}

// Everything the forked child needs, prepared before fork(): after it the child may only make
// async-signal-safe calls (this process may have other threads).
struct ChildSetup {
  std::vector<char*> argv;
  char** envp = nullptr;
  pid_t parent = 0;
  bool own_group = true;
  bool die_with_parent = true;
  int stdin_fd = -1;   // becomes the child's fd 0
  int stdout_fd = -1;  // becomes fd 1 (-1: inherited)
  int stderr_fd = -1;  // becomes fd 2 (-1: inherited)
  int report_fd = -1;  // close-on-exec: gets errno if the child fails before exec
};

// Makes `fd` the child's `target` descriptor, without close-on-exec.
bool installFd(int fd, int target) {
  if (fd < 0) return true;
  if (fd == target) return ::fcntl(fd, F_SETFD, 0) == 0;
  return ::dup2(fd, target) == target;
}

[[noreturn]] void failChild(int report_fd) {
  int err = errno;
  [[maybe_unused]] ssize_t n = ::write(report_fd, &err, sizeof(err));
  ::_exit(127);
}

[[noreturn]] void runChild(const ChildSetup& s) {
  if (s.die_with_parent) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) failChild(s.report_fd);
    if (::getppid() != s.parent) ::_exit(127);  // the parent died before prctl took effect
  }
  if (s.own_group && ::setpgid(0, 0) != 0) failChild(s.report_fd);
  if (!installFd(s.stdin_fd, STDIN_FILENO) || !installFd(s.stdout_fd, STDOUT_FILENO) ||
      !installFd(s.stderr_fd, STDERR_FILENO)) {
    failChild(s.report_fd);
  }
  // No descriptor of ours (sockets, other children's pipes) leaks into the program.
  ::close_range(STDERR_FILENO + 1, ~0U, CLOSE_RANGE_CLOEXEC);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);  // a signal blocked in our thread stays deliverable
  ::execve(s.argv[0], s.argv.data(), s.envp);
  failChild(s.report_fd);
}

// The child's end of each standard stream, opened in the parent.
struct ChildFds {
  UniqueFd in, out, err;
};

absl::Status openChildFds(const ProcessOptions& o, ChildFds& child, UniqueFd& stdin_pipe,
                          UniqueFd& stdout_pipe) {
  if (o.pipe_stdin) {
    if (auto st = makePipe(child.in, stdin_pipe); !st.ok()) return st;
    // Our end never blocks: writeLine() waits with a deadline instead.
    if (::fcntl(stdin_pipe.get(), F_SETFL, O_NONBLOCK) != 0) return errnoError("fcntl");
  } else {
    child.in = aboveStdio(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (child.in.get() < 0) return errnoError("open /dev/null");
  }
  if (!o.log_path.empty()) {
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (o.truncate_log ? O_TRUNC : O_APPEND);
    child.err = aboveStdio(::open(o.log_path.c_str(), flags, 0644));
    if (child.err.get() < 0) return errnoError(strCat("cannot open ", o.log_path));
  }
  if (o.pipe_stdout) return makePipe(stdout_pipe, child.out);
  if (child.err.get() >= 0) {
    child.out = aboveStdio(::fcntl(child.err.get(), F_DUPFD_CLOEXEC, 0));
    if (child.out.get() < 0) return errnoError("dup");
  }
  return absl::OkStatus();
}

// Waits for the child's report: end of file once exec succeeded, or the errno of the failure.
absl::Status awaitExec(int report_fd, pid_t pid, const std::string& path) {
  int err = 0;
  ssize_t n;
  do {
    n = ::read(report_fd, &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  if (n == 0) return absl::OkStatus();
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof(err))) return absl::InternalError("child setup failed");
  std::string message = strCat(path, ": ", std::strerror(err));
  if (err == ENOENT || err == EACCES || err == ENOEXEC || err == ENOTDIR) {
    return absl::NotFoundError(strCat("not an executable: ", message));
  }
  return absl::InternalError(strCat("cannot start ", message));
}

// Blocks SIGPIPE in this thread for its lifetime and discards the one a write to a closed pipe
// raises, so the write fails with EPIPE instead of killing the process.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    ::sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    ::pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      timespec zero{};
      while (::sigtimedwait(&set_, nullptr, &zero) == SIGPIPE) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t set_, old_;
  bool was_pending_ = false;
};

// Milliseconds until `deadline` for poll(): never negative, rounded up.
int pollMillis(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Process>> Process::spawn(const std::vector<std::string>& argv,
                                                        ProcessOptions options) {
  if (argv.empty() || argv[0].empty()) return absl::InvalidArgumentError("empty command");
  ChildFds child;
  UniqueFd stdin_pipe, stdout_pipe, report_read, report_write;
  if (auto st = openChildFds(options, child, stdin_pipe, stdout_pipe); !st.ok()) return st;
  if (auto st = makePipe(report_read, report_write); !st.ok()) return st;

  ChildSetup setup;
  for (const auto& a : argv) setup.argv.push_back(const_cast<char*>(a.c_str()));
  setup.argv.push_back(nullptr);
  setup.envp = environ;
  setup.parent = ::getpid();
  setup.own_group = options.own_group;
  setup.die_with_parent = options.die_with_parent;
  setup.stdin_fd = child.in.get();
  setup.stdout_fd = child.out.get();
  setup.stderr_fd = child.err.get();
  setup.report_fd = report_write.get();
  pid_t pid = ::fork();
  if (pid < 0) return errnoError("fork");
  if (pid == 0) runChild(setup);

  report_write.reset();
  child = ChildFds{};
  if (auto st = awaitExec(report_read.get(), pid, argv[0]); !st.ok()) return st;
  std::string name = argv[0].substr(argv[0].rfind('/') + 1);
  return std::unique_ptr<Process>(new Process(pid, std::move(name), std::move(options),
                                              stdin_pipe.release(), stdout_pipe.release()));
}

Process::Process(pid_t pid, std::string name, ProcessOptions options, int stdin_fd, int stdout_fd)
    : pid_(pid),
      name_(std::move(name)),
      options_(std::move(options)),
      stdin_fd_(stdin_fd),
      stdout_fd_(stdout_fd) {}

Process::~Process() {
  stop(options_.destroy_grace);
  closeStdin();
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

bool Process::pollExit(bool block) {
  if (status_) return true;
  siginfo_t info{};
  // WNOWAIT leaves the child a zombie: its pid, and so its process group id, cannot be reused
  // until reap(), which makes signalling the group safe until then.
  int flags = WEXITED | WNOWAIT | (block ? 0 : WNOHANG);
  int r;
  while ((r = ::waitid(P_PID, static_cast<id_t>(pid_), &info, flags)) != 0 && errno == EINTR) {
  }
  if (r != 0) {  // ECHILD: reaped elsewhere (SIGCHLD ignored); the status is lost
    status_ = ExitStatus::exited(-1);
    reaped_ = true;
    return true;
  }
  if (info.si_pid == 0) return false;  // still running
  status_ = info.si_code == CLD_EXITED ? ExitStatus::exited(info.si_status)
                                       : ExitStatus::killedBy(info.si_status);
  return true;
}

void Process::signalGroup(int sig) {
  if (reaped_) return;
  if (options_.own_group) ::kill(-pid_, sig);
  ::kill(pid_, sig);  // also when the child has left its group
}

ExitStatus Process::reap() {
  if (!reaped_) {
    if (options_.own_group) ::kill(-pid_, SIGKILL);  // whatever the child left behind
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  return *status_;
}

bool Process::running() { return !pollExit(false); }

std::optional<ExitStatus> Process::wait(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  auto nap = std::chrono::milliseconds(1);
  while (!pollExit(false)) {
    auto now = Clock::now();
    if (now >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::milliseconds(20));
  }
  return status_;
}

ExitStatus Process::stop(std::chrono::milliseconds grace) {
  if (!pollExit(false) && grace.count() > 0) {
    signalGroup(SIGTERM);
    wait(grace);
  }
  if (!pollExit(false)) {
    signalGroup(SIGKILL);
    pollExit(true);
  }
  return reap();
}

absl::Status Process::writeLine(std::string_view line, std::chrono::milliseconds timeout) {
  if (stdin_fd_ < 0) {
    return absl::FailedPreconditionError(strCat(name_, ": stdin is not a pipe or was closed"));
  }
  std::string data = strCat(line, "\n");
  auto deadline = Clock::now() + timeout;
  SigpipeGuard no_sigpipe;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(stdin_fd_, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd pfd{stdin_fd_, POLLOUT, 0};
      if (::poll(&pfd, 1, pollMillis(deadline)) == 0) {
        return absl::DeadlineExceededError(strCat(name_, " does not read its stdin"));
      }
    } else if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(strCat("write to ", name_, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

void Process::closeStdin() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
}

std::optional<std::string> Process::readLine(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (stdout_fd_ >= 0) {
    size_t nl = out_buffer_.find('\n');
    if (nl != std::string::npos || out_buffer_.size() >= kMaxLineBytes) {
      size_t len = std::min(nl, kMaxLineBytes);
      std::string line = out_buffer_.substr(0, len);
      out_buffer_.erase(0, len == nl ? len + 1 : len);
      return line;
    }
    if (out_eof_) {
      if (out_buffer_.empty()) return std::nullopt;
      return std::exchange(out_buffer_, {});
    }
    pollfd pfd{stdout_fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, pollMillis(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return std::nullopt;  // timed out
    char chunk[4096];
    ssize_t n = r > 0 ? ::read(stdout_fd_, chunk, sizeof(chunk)) : -1;
    if (n > 0) {
      out_buffer_.append(chunk, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      out_eof_ = true;  // end of output (or a broken pipe: nothing more will come)
    }
  }
  return std::nullopt;
}

std::optional<std::string> Process::readUntil(std::string_view prefix,
                                              std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto line = readLine(std::max(left, std::chrono::milliseconds(0)));
    if (!line || line->starts_with(prefix)) return line;
  }
}

namespace {

// Lowest port of the kernel's ephemeral range: ports picked below it cannot collide with the
// source port of an outgoing connection (which the kernel takes from that range).
int ephemeralLow() {
  int low = 32768, high = 60999;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

bool canBind(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<uint16_t> pickFreePort() {
  thread_local std::mt19937 rng(
      static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(std::random_device{}()) ^
      static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id())));
  int high = ephemeralLow() - 1;
  int low = std::min(10000, high - 1000);
  std::uniform_int_distribution<int> pick(low, high);
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto port = static_cast<uint16_t>(pick(rng));
    if (canBind(port)) return port;
  }
  return absl::UnavailableError("cannot find a free port below the ephemeral range");
}

}  // namespace kvf
