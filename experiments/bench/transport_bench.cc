// kvf-transport-bench: host-memory put bandwidth of transport/ (TransportContext batches) against
// `ucx_perftest -t ucp_put_bw` with the same transport and message size, in the same run, over
// shared memory and TCP on this host; plus the setup cost of the first transfer to a new peer.
// The receiver is a forked child with its own context and progress thread (as in production);
// the parent keeps --inflight batches posted and sleeps on every --reap_group-th completion.
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/strings.h"
#include "transport/transport.h"

ABSL_FLAG(std::string, transports, "shm,tcp", "comma list of transports to measure (shm, tcp)");
ABSL_FLAG(std::string, net_devices, "lo", "UCX_NET_DEVICES for tcp");
ABSL_FLAG(std::string, block_sizes, "16384,65536,262144,1048576,4194304", "block sizes (bytes)");
ABSL_FLAG(std::string, batch_sizes, "1,16,256,1024", "blocks per batch");
ABSL_FLAG(uint64_t, region_mib, 8,
          "source and receiver region (MiB); batches wrap around it. Small (default) keeps the "
          "working set in cache like ucx_perftest's single reused buffer; 256+ measures cold DRAM");
ABSL_FLAG(int, inflight, 8, "batches kept in flight (1 = post, wait, post)");
ABSL_FLAG(int, reap_group, 4,
          "the caller waits for the reap_group-th oldest batch, then reaps (and re-posts) that "
          "many: one caller wakeup per reap_group batches");
ABSL_FLAG(double, seconds_per_point, 0.5, "minimum measuring time per (block, batch) point");
ABSL_FLAG(bool, perftest, true, "run ucx_perftest -t ucp_put_bw as the reference");
ABSL_FLAG(std::string, perftest_bin, "ucx_perftest", "ucx_perftest binary");
ABSL_FLAG(std::string, wait, "block",
          "how the caller waits for its oldest batch: poll (done() in a loop, yielding the core "
          "now and then: NIXL's post-then-check pattern) or block (PutHandle::waitFor)");
ABSL_FLAG(int64_t, busy_poll_us, 2000, "progress threads spin this long after activity");
ABSL_FLAG(int, setup_samples, 5, "fresh sender contexts used to time the first put");
ABSL_FLAG(uint64_t, max_batch_mib, 1024, "skip (block, batch) points whose batch exceeds this");

namespace kt = kvf::transport;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<uint64_t> parseList(const std::string& text, const char* flag) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    try {
      out.push_back(std::stoull(text.substr(start, end - start)));
    } catch (...) {
      kvf::cli::failUsage("kvf-transport-bench",
                          std::string("--") + flag + ": '" + text + "' is not a list of integers");
    }
    start = end + 1;
  }
  return out;
}

std::vector<std::string> splitWords(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

kt::TransportOptions optionsFor(const std::string& transport, const std::string& name) {
  kt::TransportOptions o;
  o.name = name;
  o.transports = transport;
  if (transport != "shm") o.net_devices = absl::GetFlag(FLAGS_net_devices);
  // Over shm the receiver has nothing to do for one-sided puts: spinning would only steal a core.
  bool idle_receiver = transport == "shm" && name == "bench-receiver";
  o.busy_poll = std::chrono::microseconds(idle_receiver ? 0 : absl::GetFlag(FLAGS_busy_poll_us));
  o.default_deadline = std::chrono::seconds(600);  // a 4 GiB batch over loaded TCP is slow
  return o;
}

bool writeAll(int fd, const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return ::write(fd, &n, 4) == 4 && ::write(fd, s.data(), n) == static_cast<ssize_t>(n);
}

bool readAll(int fd, std::string* s) {
  uint32_t n = 0;
  if (::read(fd, &n, 4) != 4 || n > (1u << 20)) return false;
  s->resize(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, s->data() + got, n - got);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

struct Receiver {
  pid_t pid = -1;
  int control = -1;  // closing it tells the child to exit
  std::string address, rkey;
  uint64_t base = 0;
};

// Forks the receiver process: its own context, a UCX-allocated region, progress thread.
Receiver startReceiver(const std::string& transport, uint64_t region_bytes) {
  int up[2], down[2];
  if (::pipe(up) != 0 || ::pipe(down) != 0) std::exit(1);
  Receiver r;
  r.pid = ::fork();
  if (r.pid == 0) {
    ::close(up[0]);
    ::close(down[1]);
    auto ctx = kt::TransportContext::create(optionsFor(transport, "bench-receiver"));
    if (!ctx.ok()) _exit(3);
    auto region = (*ctx)->allocateMemory(region_bytes);
    if (!region.ok()) _exit(4);
    std::memset((*region)->data(), 0, region_bytes);
    writeAll(up[1], (*ctx)->workerAddress());
    writeAll(up[1], (*region)->packedRkey());
    writeAll(up[1], std::to_string((*region)->base()));
    char c;
    while (::read(down[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  ::close(up[1]);
  ::close(down[0]);
  std::string base;
  if (!readAll(up[0], &r.address) || !readAll(up[0], &r.rkey) || !readAll(up[0], &base)) {
    std::fprintf(stderr, "receiver for %s failed to start\n", transport.c_str());
    std::exit(1);
  }
  r.base = std::stoull(base);
  r.control = down[1];
  ::close(up[0]);
  return r;
}

void stopReceiver(Receiver& r) {
  ::close(r.control);
  for (int i = 0; i < 200; ++i) {
    if (::waitpid(r.pid, nullptr, WNOHANG) == r.pid) return;
    ::usleep(10000);
  }
  ::kill(r.pid, SIGKILL);
  ::waitpid(r.pid, nullptr, 0);
}

// Blocks of one batch: source slot i (wrapping), target slots shuffled so that adjacent blocks
// rarely coalesce (each block is its own put, the hard case).
std::vector<kt::BlockCopy> layout(uint64_t block, uint64_t batch, uint64_t region, uint64_t base) {
  uint64_t slots = std::max<uint64_t>(1, region / block);
  std::vector<uint64_t> perm(slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(block * 31 + batch));
  std::vector<kt::BlockCopy> blocks;
  for (uint64_t i = 0; i < batch; ++i) {
    blocks.push_back({(i % slots) * block, base + perm[i % slots] * block, block});
  }
  return blocks;
}

struct Point {
  double gbps = 0;
  double p50_us = 0;
  uint32_t ops = 0;
  uint64_t batches = 0;
};

// Polls a handle until done, as a NIXL-style caller would (post, then check): no wakeup for the
// progress thread to pay. Yields the core every ~1k pauses, so a loaded machine's other threads
// (the progress thread among them) still run.
void awaitByPolling(const kt::PutHandle& handle) {
  for (uint32_t i = 1; !handle.done(); ++i) {
    __builtin_ia32_pause();
    if (i % 1024 == 0) sched_yield();
  }
}

Point measure(kt::TransportContext& ctx, const std::shared_ptr<kt::MemoryRegion>& source,
              const Receiver& r, uint64_t block, uint64_t batch, uint64_t region) {
  kt::PutRequest req;
  req.source = source;
  req.peer_address = r.address;
  req.peer_rkey = r.rkey;
  req.blocks = layout(block, batch, region, r.base);
  Point p;
  std::vector<double> latencies;
  auto budget = std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds_per_point));
  const size_t inflight = static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_inflight)));
  const size_t group =
      std::clamp<size_t>(static_cast<size_t>(absl::GetFlag(FLAGS_reap_group)), 1, inflight);
  const bool poll = absl::GetFlag(FLAGS_wait) == "poll";
  std::deque<std::shared_ptr<kt::PutHandle>> ring;
  auto post = [&] {
    auto handle = ctx.postPut(req, nullptr);
    if (!handle.ok()) {
      std::fprintf(stderr, "post failed: %s\n", std::string(handle.status().message()).c_str());
      std::exit(1);
    }
    ring.push_back(*handle);
  };
  // Waits for the n-th oldest batch (the caller sleeps on that one only: the older ones complete
  // without waking it), then reaps the n oldest.
  auto reap = [&](size_t n, bool record) {
    const kt::PutHandle& last = *ring[n - 1];
    if (poll) {
      awaitByPolling(last);
    } else {
      last.waitFor(std::chrono::seconds(60));
    }
    for (size_t i = 0; i < n; ++i) {
      std::shared_ptr<kt::PutHandle> h = std::move(ring.front());
      ring.pop_front();
      if (!h->waitFor(std::chrono::seconds(60)) || !h->check().ok()) {
        std::fprintf(stderr, "put failed: %s\n", std::string(h->check().message()).c_str());
        std::exit(1);
      }
      auto result = h->result();
      p.ops = result->operations;
      if (record)
        latencies.push_back(std::chrono::duration<double, std::micro>(result->elapsed).count());
    }
  };
  for (int i = 0; i < 2; ++i) {  // warm-up
    post();
    reap(1, false);
  }
  uint64_t bytes = 0;
  Clock::time_point start = Clock::now();
  for (size_t i = 0; i < inflight; ++i) post();
  double secs = 0;
  while (true) {
    size_t n = std::min(group, ring.size());
    reap(n, true);
    bytes += block * batch * n;
    secs = std::chrono::duration<double>(Clock::now() - start).count();
    if (secs >= budget.count() && latencies.size() >= 5) break;
    for (size_t i = 0; i < n; ++i) post();
  }
  while (!ring.empty()) reap(1, false);  // drained, neither counted nor timed
  p.gbps = static_cast<double>(bytes) / secs / 1e9;
  p.batches = latencies.size();
  std::nth_element(latencies.begin(), latencies.begin() + latencies.size() / 2, latencies.end());
  p.p50_us = latencies[latencies.size() / 2];
  return p;
}

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// ucx_perftest's overall put bandwidth (GB/s) at `size` bytes, or -1.
double perftest(const std::string& transport, uint64_t size, double seconds_hint) {
  std::string tls = transport == "shm" ? "shm" : transport;
  std::string env = kvf::strCat("UCX_TLS=", tls, " ");
  if (transport != "shm")
    env += kvf::strCat("UCX_NET_DEVICES=", absl::GetFlag(FLAGS_net_devices), " ");
  // Enough iterations for about seconds_hint at 10 GB/s (shm) or 1 GB/s (tcp), bounded.
  double rate = transport == "shm" ? 10e9 : 1e9;
  uint64_t iters =
      std::clamp<uint64_t>(static_cast<uint64_t>(rate * seconds_hint / size), 200, 200000);
  int port = freePort();
  std::string bin = absl::GetFlag(FLAGS_perftest_bin);
  std::string server = kvf::strCat(env, "timeout 120 ", bin, " -p ", port, " >/dev/null 2>&1 &");
  if (std::system(server.c_str()) != 0) return -1;
  ::usleep(300000);
  std::string client = kvf::strCat(env, "timeout 120 ", bin, " 127.0.0.1 -p ", port,
                                   " -t ucp_put_bw -s ", size, " -n ", iters, " 2>&1");
  FILE* out = ::popen(client.c_str(), "r");
  if (!out) return -1;
  char line[512];
  double mbps = -1;
  while (std::fgets(line, sizeof(line), out)) {
    if (std::strncmp(line, "Final:", 6) != 0) continue;
    double f[7];
    if (std::sscanf(line + 6, "%lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3], &f[4],
                    &f[5], &f[6]) == 7) {
      mbps = f[5];  // overall bandwidth, MiB/s
    }
  }
  ::pclose(out);
  return mbps < 0 ? -1 : mbps * 1048576.0 / 1e9;
}

// Median time of the first put (one 16 KiB block) from a fresh context to the receiver.
double setupCostUs(const std::string& transport, const Receiver& r) {
  std::vector<double> samples;
  std::vector<char> memory(16384, 1);
  for (int i = 0; i < absl::GetFlag(FLAGS_setup_samples); ++i) {
    auto ctx = kt::TransportContext::create(optionsFor(transport, "bench-setup"));
    if (!ctx.ok()) std::exit(1);
    auto region = (*ctx)->registerMemory(memory.data(), memory.size());
    kt::PutRequest req{*region, r.address, r.rkey, {{0, r.base, 16384}}};
    auto t0 = Clock::now();
    auto handle = (*ctx)->postPut(req, nullptr);
    if (!handle.ok() || !(*handle)->waitFor(std::chrono::seconds(10)) || !(*handle)->check().ok()) {
      std::exit(1);
    }
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// All batch sizes of one block size, bracketed by two ucx_perftest runs: the ratio is to their
// mean, so drift of the machine during the points affects both sides alike.
void measureBlock(const std::string& transport, kt::TransportContext& ctx,
                  const std::shared_ptr<kt::MemoryRegion>& source, const Receiver& r,
                  uint64_t block, const std::vector<uint64_t>& batches, uint64_t region) {
  const double seconds = absl::GetFlag(FLAGS_seconds_per_point);
  const bool with_ref = absl::GetFlag(FLAGS_perftest);
  double ref_before = with_ref ? perftest(transport, block, seconds) : -1;
  std::vector<std::pair<uint64_t, Point>> points;
  for (uint64_t batch : batches) {
    if (block * batch > (absl::GetFlag(FLAGS_max_batch_mib) << 20)) {
      points.push_back({batch, Point{}});
      continue;
    }
    std::fprintf(stderr, "measuring %s block=%lu batch=%lu\n", transport.c_str(), block, batch);
    points.push_back({batch, measure(ctx, source, r, block, batch, region)});
  }
  double ref_after = with_ref ? perftest(transport, block, seconds) : -1;
  double ref = ref_before > 0 && ref_after > 0 ? (ref_before + ref_after) / 2
                                               : std::max(ref_before, ref_after);
  std::string ref_text =
      ref > 0 ? fmt::format("{:.2f} ({:.1f} / {:.1f})", ref, ref_before, ref_after) : "n/a";
  std::string block_text =
      block >= 1048576 ? kvf::strCat(block >> 20, " MiB") : kvf::strCat(block >> 10, " KiB");
  for (const auto& [batch, p] : points) {
    if (p.batches == 0) {
      std::printf("| %s | %s | %lu | - | skipped (batch > --max_batch_mib) | | | |\n",
                  transport.c_str(), block_text.c_str(), batch);
      continue;
    }
    std::string ratio = ref > 0 ? fmt::format("{:.2f}", p.gbps / ref) : "n/a";
    std::printf("| %s | %s | %lu | %u | %.2f | %.0f us | %s | %s |\n", transport.c_str(),
                block_text.c_str(), batch, p.ops, p.gbps, p.p50_us, ref_text.c_str(),
                ratio.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-transport-bench: put bandwidth of kvfabric's UCX transport against ucx_perftest\n"
      "(ucp_put_bw) over shm and tcp on this host, and the cost of the first put to a new peer;\n"
      "prints markdown tables (docs/transport.md).\n\n"
      "Usage: kvf-transport-bench [--transports shm,tcp] [--block_sizes ...] [--batch_sizes ...]");
  if (!args.empty()) {
    kvf::cli::failUsage("kvf-transport-bench", "unexpected argument '" + args[0] + "'");
  }
  if (absl::GetFlag(FLAGS_wait) != "poll" && absl::GetFlag(FLAGS_wait) != "block") {
    kvf::cli::failUsage("kvf-transport-bench",
                        "--wait: '" + absl::GetFlag(FLAGS_wait) + "' is not poll or block");
  }
  kvf::log::init("transport-bench", "warn");
  auto blocks = parseList(absl::GetFlag(FLAGS_block_sizes), "block_sizes");
  auto batches = parseList(absl::GetFlag(FLAGS_batch_sizes), "batch_sizes");
  uint64_t region = absl::GetFlag(FLAGS_region_mib) << 20;
  std::printf(
      "| transport | block | blocks/batch | puts/batch | kvf GB/s | batch p50 | "
      "ucx_perftest GB/s (before / after) | ratio |\n|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> setup_lines;
  for (const std::string& transport : splitWords(absl::GetFlag(FLAGS_transports))) {
    Receiver r = startReceiver(transport, region);
    double setup = setupCostUs(transport, r);
    std::vector<char> memory(region, 7);
    auto ctx = kt::TransportContext::create(optionsFor(transport, "bench-sender"));
    if (!ctx.ok()) return 1;
    auto source = (*ctx)->registerMemory(memory.data(), memory.size());
    if (!source.ok()) return 1;
    for (uint64_t block : blocks)
      measureBlock(transport, **ctx, *source, r, block, batches, region);
    stopReceiver(r);
    setup_lines.push_back(fmt::format("| {} | {:.0f} us |", transport, setup));
  }
  std::printf(
      "\n| transport | first put to a new peer (endpoint + rkey + 16 KiB), median |\n"
      "|---|---|\n");
  for (const auto& line : setup_lines) std::printf("%s\n", line.c_str());
  return 0;
}
