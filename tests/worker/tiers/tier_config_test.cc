#include "worker/tiers/tier_config.h"

#include <gtest/gtest.h>

namespace kvf::worker {
namespace {

TEST(TierConfigTest, ParsesEveryKey) {
  auto o = parseTierConfigText(R"(
host: {capacity_mib: 64, pin: required}
disk:
  dir: /var/cache/kvf
  capacity_mib: 1024
  file_mib: 128
  direct_io: off
  preallocate: eager
  on_start: clear
  queue_depth: 8
  max_queued_writes: 32
  batch_kib: 512
  batch_window_ms: 10
  write_limit_mib_per_s: 900
  fault_io_delay_us: 250
write_policy: write_back
writeback_max_lag_ms: 500
writeback_max_dirty: 100
offload_min_hits: 2
max_write_attempts: 5
decouple_eviction: true
onboard_threads: 4
verify_host_reads: true
)",
                               "<test>");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host.capacity_bytes, 64u << 20);
  EXPECT_EQ(o->host.pin, PinMode::kRequired);
  ASSERT_TRUE(o->disk.has_value());
  EXPECT_EQ(o->disk->dir, "/var/cache/kvf");
  EXPECT_EQ(o->disk->capacity_bytes, 1024ull << 20);
  EXPECT_EQ(o->disk->file_bytes, 128u << 20);
  EXPECT_EQ(o->disk->direct_io, DirectIo::kOff);
  EXPECT_EQ(o->disk->preallocate, Preallocate::kEager);
  EXPECT_EQ(o->disk->on_start, DiskStart::kClear);
  EXPECT_EQ(o->disk->queue_depth, 8u);
  EXPECT_EQ(o->disk->max_queued_writes, 32u);
  EXPECT_EQ(o->disk->batch_bytes, 512u * 1024);
  EXPECT_EQ(o->disk->batch_window, 10 * kNanosPerMilli);
  EXPECT_EQ(o->disk->write_bytes_per_second, 900ull << 20);
  EXPECT_EQ(o->disk->fault_io_delay, 250 * kNanosPerMicro);
  EXPECT_EQ(o->host.write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(o->host.writeback_max_lag, 500 * kNanosPerMilli);
  EXPECT_EQ(o->host.writeback_max_dirty, 100u);
  EXPECT_EQ(o->host.offload_min_hits, 2u);
  EXPECT_EQ(o->host.max_write_attempts, 5u);
  EXPECT_TRUE(o->host.decouple_eviction);
  EXPECT_EQ(o->onboard_threads, 4u);
  EXPECT_TRUE(o->verify_host_reads);
}

TEST(TierConfigTest, DefaultsAreLosslessWriteThroughWithoutFilter) {
  auto o = parseTierConfigText("host: {capacity_mib: 8}\ndisk: {dir: /tmp/x, capacity_mib: 64}\n",
                               "<test>");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host.write_policy, WritePolicy::kWriteThrough);
  EXPECT_FALSE(o->host.decouple_eviction);
  EXPECT_EQ(o->host.offload_min_hits, 1u);
  EXPECT_EQ(o->disk->direct_io, DirectIo::kAuto);
  EXPECT_EQ(o->disk->on_start, DiskStart::kRebuild);
  EXPECT_EQ(o->disk->batch_bytes, 1u << 20);
  EXPECT_EQ(o->disk->batch_window, 30 * kNanosPerMilli);
}

TEST(TierConfigTest, ReportsEveryProblemWithItsField) {
  auto o = parseTierConfigText(R"(
host: {capacity_mib: 0, pin: sometimes}
disk: {capacity_mib: 64, queue_depth: 0, colour: blue}
write_policy: write_around
)",
                               "tiers.yaml");
  ASSERT_FALSE(o.ok());
  std::string m(o.status().message());
  for (const char* field : {"host.capacity_mib", "host.pin", "disk.dir", "disk.queue_depth",
                            "disk.colour", "write_policy"}) {
    EXPECT_NE(m.find(field), std::string::npos) << field << " in " << m;
  }
  auto no_disk = parseTierConfigText("host: {capacity_mib: 8}\nwrite_policy: write_back\n", "t");
  ASSERT_FALSE(no_disk.ok());
  EXPECT_NE(std::string(no_disk.status().message()).find("needs a disk tier"), std::string::npos);
}

}  // namespace
}  // namespace kvf::worker
