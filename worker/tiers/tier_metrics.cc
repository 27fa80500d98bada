#include <string>
#include <utility>

#include "worker/tiers/tiered_store.h"

namespace kvf::worker {
namespace {

metrics::Labels with(const metrics::Labels& base, std::string name, std::string value) {
  metrics::Labels out = base;
  out.emplace_back(std::move(name), std::move(value));
  return out;
}

}  // namespace

void exportMetrics(const TieredStore& store, metrics::Registry& r, const metrics::Labels& labels) {
  using metrics::MetricType;
  const TierCounters& c = store.counters();
  auto counter = [&](std::string_view name, std::string_view help, const metrics::Labels& l,
                     const std::atomic<uint64_t>& value) {
    r.callback(name, help, MetricType::kCounter, l,
               [&value] { return static_cast<double>(value.load(std::memory_order_relaxed)); });
  };
  for (size_t i = 0; i < kDropReasonCount; ++i) {
    auto reason = static_cast<DropReason>(i);
    counter("kvfabric_tier_blocks_dropped_total",
            "Blocks that left the tiers for good, by reason (lost_before_write only with "
            "decouple_eviction)",
            with(labels, "reason", std::string(dropReasonName(reason))), c.dropped[i]);
  }
  counter("kvfabric_tier_host_stored_blocks_total", "Blocks offloaded into host memory", labels,
          c.host_stored);
  counter("kvfabric_tier_host_moved_to_disk_blocks_total",
          "Blocks that left host memory with a durable copy on disk", labels, c.host_moved_down);
  counter("kvfabric_tier_host_backpressure_total",
          "Offloads refused because every host block waited for the disk or was in use", labels,
          c.host_backpressure);
  counter("kvfabric_tier_onboarded_blocks_total", "Blocks read back into the engine, by tier",
          with(labels, "tier", "host"), c.host_onboarded);
  counter("kvfabric_tier_onboarded_blocks_total", "Blocks read back into the engine, by tier",
          with(labels, "tier", "disk"), c.disk_onboarded);
  counter("kvfabric_tier_promoted_blocks_total",
          "Blocks read from disk into host memory for a request waiting in the queue", labels,
          c.disk_promoted);
  counter("kvfabric_tier_disk_written_blocks_total", "Blocks made durable on disk", labels,
          c.disk_written);
  counter("kvfabric_tier_disk_write_errors_total", "Disk writes refused or cut short", labels,
          c.disk_write_errors);
  counter("kvfabric_tier_disk_read_errors_total", "Disk reads that failed", labels,
          c.disk_read_errors);
  counter("kvfabric_tier_disk_grow_failures_total",
          "Slab files that could not be allocated (a full disk caps the tier)", labels,
          c.disk_grow_failures);
  counter("kvfabric_tier_disk_written_bytes_total", "Payload bytes written to disk", labels,
          c.disk_bytes_written);
  counter("kvfabric_tier_disk_read_bytes_total", "Payload bytes read from disk", labels,
          c.disk_bytes_read);
  const TieredStore* s = &store;
  auto gauge = [&](std::string_view name, std::string_view help, const metrics::Labels& l,
                   std::function<double()> read) {
    r.callback(name, help, MetricType::kGauge, l, std::move(read));
  };
  gauge("kvfabric_tier_blocks", "Blocks held, by tier", with(labels, "tier", "host"),
        [s] { return static_cast<double>(s->stats().host.resident); });
  gauge("kvfabric_tier_blocks", "Blocks held, by tier", with(labels, "tier", "disk"),
        [s] { return static_cast<double>(s->stats().disk_blocks); });
  gauge("kvfabric_tier_capacity_blocks", "Blocks the tier's budget holds, by tier",
        with(labels, "tier", "host"),
        [s] { return static_cast<double>(s->stats().host.capacity); });
  gauge("kvfabric_tier_capacity_blocks", "Blocks the tier's budget holds, by tier",
        with(labels, "tier", "disk"),
        [s] { return static_cast<double>(s->stats().disk_allocated_blocks); });
  gauge("kvfabric_tier_host_dirty_blocks", "Host blocks waiting for or in a disk write", labels,
        [s] {
          auto u = s->stats().host;
          return static_cast<double>(u.dirty + u.writing);
        });
  gauge("kvfabric_tier_disk_queued_writes", "Disk writes accepted and not yet finished", labels,
        [s] { return static_cast<double>(s->stats().disk_queued_writes); });
  gauge("kvfabric_tier_host_page_locked", "1 when host-tier memory is page-locked", labels,
        [s] { return s->hostPinKind() == PinKind::kNone ? 0.0 : 1.0; });
}

}  // namespace kvf::worker
