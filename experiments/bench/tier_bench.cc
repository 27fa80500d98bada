// kvf-tier-bench: the KV tiers' own figures. --mode=host: the host tier's copy bandwidth (offload
// into page-locked slots with the checksum, onboard back out) against memcpy on the same buffers.
// --mode=disk: the disk tier's write and read bandwidth through io_uring (experiments/bench/
// tier_bench.sh runs fio with the same file system, block size and queue depth beside it).
// --mode=loss: the seed's loss experiment on a trace (tier_loss.cc).
// --mode=onboard: modelled TTFT of a long prefix from G1, G2, G3 or recomputed (tier_onboard.cc).
#include "experiments/bench/tier_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/strings.h"
#include "worker/block_payload.h"
#include "worker/tiers/disk_format.h"
#include "worker/tiers/tiered_store.h"

ABSL_FLAG(std::string, mode, "host",
          "host: host-tier copy bandwidth vs memcpy; disk: disk-tier write/read bandwidth; "
          "loss: blocks lost and second-pass disk hits, lossless default vs the lossy switch; "
          "device: host tier <-> GPU copy bandwidth, pinned vs pageable, batched vs per-block; "
          "overlap: GEMM slowdown and copy bandwidth with copies under compute; onboard: "
          "modelled TTFT of a long prefix from G1, G2, G3 or recomputed");
ABSL_FLAG(std::string, profile, "engine/profiles/qwen3-coder-30b-a3b-h20.yaml",
          "onboard mode: the hardware/model profile");
ABSL_FLAG(int64_t, prefix_tokens, 25000, "onboard mode: prefix length in tokens");
ABSL_FLAG(std::string, suffix_tokens, "16,1024,4096",
          "onboard mode: new tokens after the prefix, comma-separated (one row group each)");
ABSL_FLAG(std::string, onboard, "whole,layerwise",
          "onboard mode: the engine's scheduler.onboard modes to compare, comma-separated "
          "(whole: the onboard finishes before the first step; layerwise: the step starts at "
          "the first layer and pipelines the rest)");
ABSL_FLAG(uint64_t, block_kib, 0,
          "block payload in KiB (default: 2048 for host and device, 1024 for disk, 64 for loss)");
ABSL_FLAG(uint64_t, host_mib, 1024,
          "host, device and overlap modes: bytes copied per direction and repetition (overlap: "
          "the ring of blocks each direction cycles through)");
ABSL_FLAG(int, repeats, 7,
          "host, disk, device and overlap modes: repetitions (mean and 95% interval reported)");
ABSL_FLAG(std::string, dir, "",
          "disk and loss modes: directory for the disk tier's files (required; emptied first)");
ABSL_FLAG(uint64_t, disk_mib, 2048, "disk mode: bytes written, then read, per repetition");
ABSL_FLAG(uint32_t, qd, 0, "I/Os in flight: disk mode default 16; loss mode default 4 (KVBM's)");
ABSL_FLAG(std::string, read_order, "sequential", "disk mode: sequential or random reads");
ABSL_FLAG(std::string, direct_io, "auto", "disk mode: auto, on or off");
ABSL_FLAG(std::string, trace, "", "loss mode: a Mooncake JSONL trace (required)");
ABSL_FLAG(uint64_t, unique_blocks, 44000,
          "loss mode: the window of the trace, cut where it reaches this many distinct blocks");
ABSL_FLAG(uint64_t, g1_blocks, 1031, "loss mode: the engine pool's blocks (LRU)");
ABSL_FLAG(uint64_t, g2_blocks, 4000, "loss mode: host-tier blocks");
ABSL_FLAG(uint64_t, disk_blocks, 0, "loss mode: disk-tier blocks (0: the window's plus 5%)");
ABSL_FLAG(double, compute_us, 0,
          "loss mode: modelled prefill time of each block no tier holds (the producer's pace; "
          "0: as fast as this machine copies)");
ABSL_FLAG(std::string, arms, "default,lossy",
          "loss mode: arms to run, comma-separated: default (lossless), lossy (eviction "
          "decoupled from the disk write, as in the seed)");
ABSL_FLAG(int, gemm_size, 8192, "overlap mode: m = n = k of each bf16 GEMM");
ABSL_FLAG(int, gemms, 0, "overlap mode: GEMMs per compute run (0: as many as fill --compute_ms)");
ABSL_FLAG(double, compute_ms, 400, "overlap mode: length of a compute run when --gemms is 0");
ABSL_FLAG(uint32_t, batch_blocks, 64, "overlap mode: blocks per copier batch");
ABSL_FLAG(uint32_t, blocks_per_event, 16, "overlap mode: onboard blocks per ready event");
ABSL_FLAG(uint32_t, in_flight, 4, "overlap mode: copier batches in flight per direction");
ABSL_FLAG(bool, json, false,
          "host, disk, device and overlap modes: also print one JSON line of the figures");

namespace kvf::bench {

AlignedBuffer::AlignedBuffer(uint64_t bytes)
    : memory_(static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))),
      size_(bytes) {
  if (memory_ == nullptr) {
    std::fprintf(stderr, "out of memory (%llu bytes)\n", static_cast<unsigned long long>(bytes));
    std::exit(1);
  }
  std::memset(memory_.get(), 0, bytes);
}

Interval meanInterval95(const std::vector<double>& samples) {
  // Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom, then the normal's.
  static constexpr double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                  2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                  2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                  2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  Interval out;
  out.n = samples.size();
  if (samples.empty()) return out;
  out.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(out.n);
  if (out.n < 2) return out;
  double ss = 0;
  for (double s : samples) ss += (s - out.mean) * (s - out.mean);
  double sd = std::sqrt(ss / static_cast<double>(out.n - 1));
  double t = out.n - 1 <= 30 ? kT[out.n - 2] : 1.96;
  out.half_width = t * sd / std::sqrt(static_cast<double>(out.n));
  return out;
}

std::string formatInterval(const Interval& i, int decimals) {
  return fmt::format("{:.{}f} ± {:.{}f}", i.mean, decimals, i.half_width, decimals);
}

Interval ratioInterval95(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(a[i] / b[i]);
  return meanInterval95(r);
}

namespace {

using Clock = std::chrono::steady_clock;
namespace kw = kvf::worker;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

[[noreturn]] void usage(const std::string& message) {
  kvf::cli::failUsage("kvf-tier-bench", message);
}

// Host mode: per repetition, N blocks offloaded (copy + checksum into page-locked slots, with the
// evictions a full tier does) and onboarded back, each timed against memcpy between the very same
// source, slot and destination addresses.
int runHost(uint64_t block, uint64_t total, int repeats, bool json) {
  uint64_t n = std::max<uint64_t>(1, total / block);
  AlignedBuffer src(n * block);
  AlignedBuffer dst(n * block);
  for (uint64_t i = 0; i < n; ++i)
    kw::fillBlockPayload(kw::BlockHash{i}, src.slice(i * block, block));
  kw::TieredStoreOptions o;
  o.host.block_bytes = block;
  o.host.capacity_bytes = n * ((block + 4095) / 4096 * 4096);
  o.onboard_threads = 1;  // one copying thread, like the memcpy it is compared with
  auto store = kw::TieredStore::create(o);
  if (!store.ok()) {
    std::fprintf(stderr, "host tier: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  kw::TieredStore& s = **store;
  std::vector<double> store_gbs, store_memcpy_gbs, onboard_gbs, onboard_memcpy_gbs;
  double gb = static_cast<double>(n * block) / 1e9;
  for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up and is not counted
    std::vector<kw::BlockKey> keys(n);
    for (uint64_t i = 0; i < n; ++i) keys[i] = static_cast<kw::BlockKey>(r) * n + i;
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      if (!s.offload(keys[i], src.slice(i * block, block)).ok()) return 1;
    }
    double store_s = secondsSince(t0);
    std::vector<std::span<std::byte>> slots, outs;
    for (uint64_t i = 0; i < n; ++i) {
      auto pin = s.host().pin(keys[i]);
      if (!pin) return 1;
      slots.push_back({const_cast<std::byte*>(pin->bytes.data()), block});
      s.host().unpin(*pin);
      outs.push_back(dst.slice(i * block, block));
    }
    t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) std::memcpy(slots[i].data(), src.data() + i * block, block);
    double store_memcpy_s = secondsSince(t0);
    t0 = Clock::now();
    auto ticket = s.onboard(keys, outs);
    if (!ticket->waitAll(std::chrono::minutes(5)) || ticket->readyPrefix() != n) return 1;
    double onboard_s = secondsSince(t0);
    t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) std::memcpy(outs[i].data(), slots[i].data(), block);
    double onboard_memcpy_s = secondsSince(t0);
    if (r == 0) continue;
    store_gbs.push_back(gb / store_s);
    store_memcpy_gbs.push_back(gb / store_memcpy_s);
    onboard_gbs.push_back(gb / onboard_s);
    onboard_memcpy_gbs.push_back(gb / onboard_memcpy_s);
  }
  std::printf("host tier: %llu blocks of %llu KiB per direction, memory %s, %d repetitions\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(block >> 10),
              std::string(kw::pinKindName(s.hostPinKind())).c_str(), repeats);
  std::printf("| direction | tier GB/s | memcpy GB/s | tier / memcpy |\n|---|---|---|---|\n");
  std::printf("| offload (copy into page-locked slots) | %s | %s | %s |\n",
              formatInterval(meanInterval95(store_gbs), 2).c_str(),
              formatInterval(meanInterval95(store_memcpy_gbs), 2).c_str(),
              formatInterval(ratioInterval95(store_gbs, store_memcpy_gbs), 3).c_str());
  std::printf("| onboard (copy out of slots, async) | %s | %s | %s |\n",
              formatInterval(meanInterval95(onboard_gbs), 2).c_str(),
              formatInterval(meanInterval95(onboard_memcpy_gbs), 2).c_str(),
              formatInterval(ratioInterval95(onboard_gbs, onboard_memcpy_gbs), 3).c_str());
  if (json) {
    std::printf("{\"mode\":\"host\",\"offload_ratio\":%.4f,\"onboard_ratio\":%.4f}\n",
                ratioInterval95(store_gbs, store_memcpy_gbs).mean,
                ratioInterval95(onboard_gbs, onboard_memcpy_gbs).mean);
  }
  return 0;
}

// Keeps `limit` operations in flight: acquire() before each, release() from its completion.
class InFlight {
 public:
  explicit InFlight(size_t limit) : limit_(limit) {}
  void acquire() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return count_ < limit_; });
    ++count_;
  }
  void release(bool ok) {
    std::lock_guard lock(mu_);
    --count_;
    if (!ok) ++failures_;
    cv_.notify_all();
  }
  size_t waitIdle() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return count_ == 0; });
    return failures_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t limit_;
  size_t count_ = 0;
  size_t failures_ = 0;
};

// Disk mode: per repetition a fresh tier; N blocks written with `qd` writes in flight, then read
// back (sequentially or shuffled) with `qd` reads in flight, every read checked by the tier.
int runDisk(uint64_t block, uint64_t total, uint32_t qd, const std::string& dir, bool random,
            kw::DirectIo direct, int repeats, bool json) {
  uint64_t n = std::max<uint64_t>(1, total / block);
  uint64_t padded = kw::roundUpToSector(block);
  constexpr uint64_t kSources = 64;
  AlignedBuffer src(kSources * padded);
  std::vector<uint64_t> sums(kSources);
  for (uint64_t i = 0; i < kSources; ++i) {
    kw::fillBlockPayload(kw::BlockHash{i}, src.slice(i * padded, block));
    sums[i] = kw::blockChecksum(src.slice(i * padded, block));
  }
  AlignedBuffer dst(2ull * qd * padded);
  std::vector<double> write_gbs, read_gbs;
  bool direct_used = false;
  for (int r = 0; r < repeats + 1; ++r) {
    std::filesystem::remove_all(dir);
    kw::DiskTierOptions o;
    o.dir = dir;
    o.block_bytes = block;
    o.capacity_bytes = n * kw::diskSlotBytes(block);
    o.file_bytes = 1ull << 30;
    o.queue_depth = qd;
    o.max_queued_writes = 2 * qd;
    o.direct_io = direct;
    o.preallocate = kw::Preallocate::kEager;  // allocation is not part of the write figure
    kw::TierCounters counters;
    auto tier = kw::DiskTier::create(o, &counters, nullptr);
    if (!tier.ok()) {
      std::fprintf(stderr, "disk tier: %s\n", std::string(tier.status().message()).c_str());
      return 1;
    }
    direct_used = (*tier)->directIo();
    InFlight writes(2 * qd);
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      writes.acquire();
      uint64_t s = i % kSources;
      absl::Status st = (*tier)->write(i, src.slice(s * padded, padded), sums[s],
                                       [&writes](absl::Status done) { writes.release(done.ok()); });
      if (!st.ok()) return 1;
    }
    if (writes.waitIdle() > 0) return 1;
    double write_s = secondsSince(t0);
    std::vector<uint64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    if (random) std::shuffle(order.begin(), order.end(), std::mt19937_64(r));
    InFlight reads(2 * qd);
    std::vector<size_t> free_buffers(2 * qd);
    std::iota(free_buffers.begin(), free_buffers.end(), 0);
    std::mutex buffers_mu;
    t0 = Clock::now();
    for (uint64_t key : order) {
      reads.acquire();
      size_t b;
      {
        std::lock_guard lock(buffers_mu);
        b = free_buffers.back();
        free_buffers.pop_back();
      }
      (*tier)->read(key, dst.slice(b * padded, padded), [&, b](absl::Status done) {
        {
          std::lock_guard lock(buffers_mu);
          free_buffers.push_back(b);
        }
        reads.release(done.ok());
      });
    }
    if (reads.waitIdle() > 0) return 1;
    double read_s = secondsSince(t0);
    if (r == 0) continue;
    double gb = static_cast<double>(n * block) / 1e9;
    write_gbs.push_back(gb / write_s);
    read_gbs.push_back(gb / read_s);
  }
  std::filesystem::remove_all(dir);
  Interval w = meanInterval95(write_gbs), rd = meanInterval95(read_gbs);
  std::printf("disk tier: %llu blocks of %llu KiB, qd %u, %s reads, O_DIRECT %s, %d repetitions\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(block >> 10), qd,
              random ? "random" : "sequential", direct_used ? "yes" : "no", repeats);
  std::printf("| direction | tier GB/s (payload) |\n|---|---|\n| write | %s |\n| read | %s |\n",
              formatInterval(w, 3).c_str(), formatInterval(rd, 3).c_str());
  if (json) {
    std::printf("{\"mode\":\"disk\",\"write_gbs\":%.4f,\"read_gbs\":%.4f,\"direct_io\":%s}\n",
                w.mean, rd.mean, direct_used ? "true" : "false");
  }
  return 0;
}

}  // namespace
}  // namespace kvf::bench

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-tier-bench: figures of the KV tiers (worker/tiers/, docs/tiers.md).\n"
      "  --mode=host  host-tier offload and onboard copy bandwidth against memcpy on the same\n"
      "               buffers (mean and 95% interval over --repeats).\n"
      "  --mode=disk  disk-tier write and read bandwidth through io_uring in --dir; compare with\n"
      "               fio via experiments/bench/tier_bench.sh, which runs both.\n"
      "  --mode=loss  the seed's loss experiment: a trace's blocks through an LRU engine pool\n"
      "               into the host tier (turning over ~11 times) and the disk, twice; blocks\n"
      "               lost and the second pass's disk hits, default (lossless) vs lossy arm.\n"
      "  --mode=device  host tier <-> GPU copy bandwidth (one cudaMemcpyAsync per block), the\n"
      "               tier's CUDA-pinned slots against pageable memory, then the DeviceCopier's\n"
      "               gathered copies (cudaMemcpyBatchAsync) against per-block ones (needs a\n"
      "               CUDA build and a device; --block_kib, --host_mib, --repeats as in host).\n"
      "  --mode=overlap  cuBLAS bf16 GEMMs (--gemm_size) on a compute stream alone, then with an\n"
      "               offload and with an onboard of --host_mib running through the DeviceCopier\n"
      "               meanwhile: compute slowdown and copy GB/s under compute vs alone (needs a\n"
      "               CUDA build and a device; --batch_blocks, --blocks_per_event, --in_flight).\n"
      "  --mode=onboard  modelled TTFT of a --prefix_tokens prefix served from the pool (G1),\n"
      "               host memory (G2), disk (G3, files in --dir) or recomputed, through the\n"
      "               engine core with the live tiers on --profile, per --suffix_tokens and\n"
      "               per --onboard mode (whole, layerwise).\n"
      "Prints markdown tables; exit status 1 when a run fails (or a block came back wrong).\n\n"
      "Usage: kvf-tier-bench --mode=host|disk|loss|device|overlap|onboard [--dir DIR] [--trace "
      "FILE] "
      "[flags]");
  if (!args.empty()) kvf::bench::usage("unexpected argument '" + args[0] + "'");
  kvf::log::init("tier-bench", "warn");
  std::string mode = absl::GetFlag(FLAGS_mode);
  uint64_t block_kib = absl::GetFlag(FLAGS_block_kib);
  int repeats = absl::GetFlag(FLAGS_repeats);
  if (repeats < 1) kvf::bench::usage("--repeats must be at least 1");
  auto direct = absl::GetFlag(FLAGS_direct_io);
  kvf::worker::DirectIo direct_io = direct == "on"    ? kvf::worker::DirectIo::kOn
                                    : direct == "off" ? kvf::worker::DirectIo::kOff
                                                      : kvf::worker::DirectIo::kAuto;
  if (direct != "auto" && direct != "on" && direct != "off") {
    kvf::bench::usage("--direct_io must be auto, on or off");
  }
  if (mode == "host") {
    uint64_t block = (block_kib > 0 ? block_kib : 2048) << 10;
    return kvf::bench::runHost(block, absl::GetFlag(FLAGS_host_mib) << 20, repeats,
                               absl::GetFlag(FLAGS_json));
  }
  if (mode == "device") {
    uint64_t block = (block_kib > 0 ? block_kib : 2048) << 10;
    return kvf::bench::runDevice(block, absl::GetFlag(FLAGS_host_mib) << 20, repeats,
                                 absl::GetFlag(FLAGS_json));
  }
  if (mode == "overlap") {
    kvf::bench::OverlapOptions o;
    o.block_bytes = (block_kib > 0 ? block_kib : 2048) << 10;
    o.copy_bytes = absl::GetFlag(FLAGS_host_mib) << 20;
    o.gemm_size = absl::GetFlag(FLAGS_gemm_size);
    o.gemms = absl::GetFlag(FLAGS_gemms);
    o.compute_ms = absl::GetFlag(FLAGS_compute_ms);
    o.batch_blocks = absl::GetFlag(FLAGS_batch_blocks);
    o.blocks_per_event = absl::GetFlag(FLAGS_blocks_per_event);
    o.in_flight = absl::GetFlag(FLAGS_in_flight);
    o.repeats = repeats;
    o.json = absl::GetFlag(FLAGS_json);
    if (o.gemm_size < 256 || o.gemms < 0 || o.compute_ms <= 0 || o.batch_blocks == 0 ||
        o.blocks_per_event == 0 || o.in_flight == 0) {
      kvf::bench::usage(
          "--gemm_size must be >= 256; --compute_ms, --batch_blocks, --blocks_per_event and "
          "--in_flight positive; --gemms >= 0");
    }
    return kvf::bench::runOverlap(o);
  }
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) kvf::bench::usage("--dir is required for --mode=" + mode);
  if (mode == "disk") {
    std::string order = absl::GetFlag(FLAGS_read_order);
    if (order != "sequential" && order != "random") {
      kvf::bench::usage("--read_order must be sequential or random");
    }
    uint64_t block = (block_kib > 0 ? block_kib : 1024) << 10;
    uint32_t qd = absl::GetFlag(FLAGS_qd) > 0 ? absl::GetFlag(FLAGS_qd) : 16;
    return kvf::bench::runDisk(block, absl::GetFlag(FLAGS_disk_mib) << 20, qd, dir,
                               order == "random", direct_io, repeats, absl::GetFlag(FLAGS_json));
  }
  if (mode == "loss") {
    kvf::bench::LossOptions o;
    o.trace = absl::GetFlag(FLAGS_trace);
    if (o.trace.empty()) kvf::bench::usage("--trace is required for --mode=loss");
    o.dir = dir;
    o.block_bytes = (block_kib > 0 ? block_kib : 64) << 10;
    o.unique_blocks = absl::GetFlag(FLAGS_unique_blocks);
    o.g1_blocks = absl::GetFlag(FLAGS_g1_blocks);
    o.g2_blocks = absl::GetFlag(FLAGS_g2_blocks);
    o.disk_blocks = absl::GetFlag(FLAGS_disk_blocks);
    o.queue_depth = absl::GetFlag(FLAGS_qd) > 0 ? absl::GetFlag(FLAGS_qd) : 4;
    if (absl::GetFlag(FLAGS_compute_us) < 0) kvf::bench::usage("--compute_us must be >= 0");
    o.compute_per_block = static_cast<kvf::Nanos>(absl::GetFlag(FLAGS_compute_us) * 1e3);
    for (const std::string& arm : kvf::bench::splitCommas(absl::GetFlag(FLAGS_arms))) {
      if (arm != "default" && arm != "lossy") kvf::bench::usage("--arms: unknown arm " + arm);
      o.arms.push_back(arm);
    }
    if (o.g1_blocks == 0 || o.g2_blocks == 0 || o.unique_blocks == 0) {
      kvf::bench::usage("--g1_blocks, --g2_blocks and --unique_blocks must be positive");
    }
    return kvf::bench::runLossExperiment(o);
  }
  if (mode == "onboard") {
    kvf::bench::OnboardOptions o;
    auto profile = kvf::engine::loadProfile(absl::GetFlag(FLAGS_profile));
    if (!profile.ok()) kvf::bench::usage("--profile: " + std::string(profile.status().message()));
    o.engine.profile = *profile;
    o.engine.cache.payload_bytes_per_block = 256;
    if (!kvf::engine::finalizeEngineConfig(&o.engine).ok()) kvf::bench::usage("--profile: bad");
    o.dir = dir;
    o.prefix_tokens = absl::GetFlag(FLAGS_prefix_tokens);
    if (o.prefix_tokens < o.engine.cache.block_size) kvf::bench::usage("--prefix_tokens too small");
    for (const std::string& s : kvf::bench::splitCommas(absl::GetFlag(FLAGS_suffix_tokens))) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(s, &v) || v < 1) kvf::bench::usage("--suffix_tokens: bad value " + s);
      o.suffix_tokens.push_back(v);
    }
    o.modes.clear();
    for (const std::string& m : kvf::bench::splitCommas(absl::GetFlag(FLAGS_onboard))) {
      if (m != "whole" && m != "layerwise") {
        kvf::bench::usage("--onboard: unknown mode '" + m + "' (whole or layerwise)");
      }
      o.modes.push_back(m == "whole" ? kvf::engine::OnboardMode::kWhole
                                     : kvf::engine::OnboardMode::kLayerwise);
    }
    if (o.modes.empty()) kvf::bench::usage("--onboard: name at least one mode");
    return kvf::bench::runOnboard(o);
  }
  kvf::bench::usage("--mode must be host, disk, loss, device, overlap or onboard");
}
