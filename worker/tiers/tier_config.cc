#include "worker/tiers/tier_config.h"

namespace kvf::worker {
namespace {

constexpr uint64_t kMiB = 1 << 20;

void parseHost(config::ConfigMap& m, HostTierOptions* h) {
  m.require("capacity_mib");
  uint64_t mib = 0;
  m.get("capacity_mib", &mib, 1, uint64_t{1} << 30);
  h->capacity_bytes = mib * kMiB;
  m.getEnum("pin", &h->pin,
            {{"required", PinMode::kRequired},
             {"preferred", PinMode::kPreferred},
             {"off", PinMode::kOff}});
  m.rejectUnknownKeys();
}

void parseDisk(config::ConfigMap& m, DiskTierOptions* d) {
  m.require("dir");
  m.get("dir", &d->dir);
  m.require("capacity_mib");
  uint64_t mib = 0;
  m.get("capacity_mib", &mib, 1, uint64_t{1} << 34);
  d->capacity_bytes = mib * kMiB;
  uint64_t file_mib = d->file_bytes / kMiB;
  m.get("file_mib", &file_mib, 1, uint64_t{1} << 20);
  d->file_bytes = file_mib * kMiB;
  m.getEnum("direct_io", &d->direct_io,
            {{"auto", DirectIo::kAuto}, {"on", DirectIo::kOn}, {"off", DirectIo::kOff}});
  m.getEnum("preallocate", &d->preallocate,
            {{"on_demand", Preallocate::kOnDemand}, {"eager", Preallocate::kEager}});
  m.getEnum("on_start", &d->on_start,
            {{"rebuild", DiskStart::kRebuild}, {"clear", DiskStart::kClear}});
  m.get("queue_depth", &d->queue_depth, 1, 1024);
  m.get("max_queued_writes", &d->max_queued_writes, 1, 1 << 20);
  uint64_t batch_kib = d->batch_bytes / 1024;
  m.get("batch_kib", &batch_kib, 0, uint64_t{1} << 22);
  d->batch_bytes = batch_kib * 1024;
  int64_t window_ms = d->batch_window / kNanosPerMilli;
  m.get("batch_window_ms", &window_ms, 0, 10'000);
  d->batch_window = window_ms * kNanosPerMilli;
  uint64_t limit = d->write_bytes_per_second / kMiB;
  m.get("write_limit_mib_per_s", &limit, 0, uint64_t{1} << 30);
  d->write_bytes_per_second = limit * kMiB;
  int64_t delay_us = d->fault_io_delay / kNanosPerMicro;
  m.get("fault_io_delay_us", &delay_us, 0, 10'000'000);
  d->fault_io_delay = delay_us * kNanosPerMicro;
  m.rejectUnknownKeys();
}

void parsePrefetch(config::ConfigMap& m, TierPrefetchOptions* p) {
  m.getEnum("mode", &p->mode,
            {{"queued", PrefetchMode::kQueued}, {"admission", PrefetchMode::kAdmission}});
  m.get("budget_fraction", &p->budget_fraction, 0.0, 1.0);
  m.get("margin_fraction", &p->margin_fraction, 0.0, 1.0);
  m.get("max_reads_in_flight", &p->max_reads_in_flight, 1, 1 << 20);
  m.rejectUnknownKeys();
}

}  // namespace

void parseTierConfig(config::ConfigMap& m, TieredStoreOptions* out) {
  m.require("host");
  if (auto h = m.map("host")) parseHost(*h, &out->host);
  if (auto d = m.map("disk")) {
    out->disk.emplace();
    parseDisk(*d, &*out->disk);
  }
  HostTierOptions& h = out->host;
  m.getEnum(
      "write_policy", &h.write_policy,
      {{"write_through", WritePolicy::kWriteThrough}, {"write_back", WritePolicy::kWriteBack}});
  int64_t lag_ms = h.writeback_max_lag / kNanosPerMilli;
  m.get("writeback_max_lag_ms", &lag_ms, 1, 3'600'000);
  h.writeback_max_lag = lag_ms * kNanosPerMilli;
  m.get("writeback_max_dirty", &h.writeback_max_dirty, 0, uint64_t{1} << 31);
  m.get("offload_min_hits", &h.offload_min_hits, 1, 1000);
  m.get("max_write_attempts", &h.max_write_attempts, 1, 100);
  m.get("decouple_eviction", &h.decouple_eviction);
  m.get("onboard_threads", &out->onboard_threads, 1, 64);
  m.get("verify_host_reads", &out->verify_host_reads);
  if (auto p = m.map("prefetch")) parsePrefetch(*p, &out->prefetch);
  if (!out->disk) {
    for (std::string_view key : {"write_policy", "writeback_max_lag_ms", "writeback_max_dirty",
                                 "offload_min_hits", "decouple_eviction", "prefetch"}) {
      if (m.has(key)) m.fail(key, "needs a disk tier (tiers.disk)");
    }
  }
  m.rejectUnknownKeys();
}

absl::StatusOr<TieredStoreOptions> parseTierConfigText(std::string_view text,
                                                       std::string_view source) {
  return config::parseText<TieredStoreOptions>(text, source, parseTierConfig);
}

}  // namespace kvf::worker
