#include "experiments/harness/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "common/strings.h"

namespace kvf::experiments {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::spawn(
    const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  if (::access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(strCat("not an executable: ", argv[0]));
  }
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(strCat("cannot open ", log_path, ": ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return absl::InternalError(strCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: die with the harness, own process group, output to the log.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(log_fd);
  std::string name = argv[0].substr(argv[0].rfind('/') + 1);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, name));
}

ChildProcess::~ChildProcess() { stop(std::chrono::seconds(2)); }

bool ChildProcess::running() {
  if (reaped_) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    return false;
  }
  return r == 0;
}

int ChildProcess::stop(std::chrono::milliseconds grace) {
  if (!running()) return exit_status_;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (running()) {
    ::kill(pid_, SIGKILL);
    while (running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exit_status_;
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
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) ^
                          static_cast<unsigned>(std::random_device{}()));
  int high = ephemeralLow() - 1;
  int low = std::min(10000, high - 1000);
  std::uniform_int_distribution<int> pick(low, high);
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto port = static_cast<uint16_t>(pick(rng));
    if (canBind(port)) return port;
  }
  return absl::UnavailableError("cannot find a free port below the ephemeral range");
}

}  // namespace kvf::experiments
