// A worker::EngineAdapter for the agent's tests: an engine reduced to what the agent touches.
// It owns a payload buffer of fixed-size blocks, a hash -> block table with pin counts, and an
// engine thread (its own io_context) on which every adapter call runs. It records what the agent
// told it about each fetch, checks the contract (one complete/fail, then one release, pins never
// negative) and, like an engine that reuses memory, scribbles a marker over the landing blocks it
// got back, so a write arriving after the release shows up in markersIntact().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tests/testing/io_thread.h"
#include "worker/engine_adapter.h"
#include "worker/tier_push.h"

namespace kvf::fakes {

class FakeEngineAdapter final : public worker::EngineAdapter {
 public:
  FakeEngineAdapter(int64_t block_size, uint64_t block_bytes, uint64_t num_blocks);
  ~FakeEngineAdapter() override;

  // What the agent reported about one fetch.
  struct FetchRecord {
    std::optional<worker::RemoteKvOutcome> completed;  // complete or fail, whichever came
    bool failed = false;
    bool released = false;
    std::vector<worker::BlockIndex> blocks;  // the landing blocks
    std::vector<worker::BlockHash> hashes;
    std::vector<std::string> violations;  // contract breaches seen
  };

  // Test thread. Caches block `block` under `hash`, with the content of that hash.
  void store(worker::BlockHash hash, worker::BlockIndex block);
  // Test thread: reserves landing blocks for fetch `id` (their content set to a marker).
  void expectFetch(const std::string& id, std::vector<worker::BlockHash> hashes,
                   std::vector<worker::BlockIndex> blocks);
  // Waits until fetch `id` was released (or `timeout` passed); its record.
  FetchRecord waitReleased(const std::string& id, std::chrono::milliseconds timeout);
  // Waits until the agent reported fetch `id`'s outcome (or `timeout` passed); its record.
  FetchRecord waitCompleted(const std::string& id, std::chrono::milliseconds timeout);
  FetchRecord record(const std::string& id);
  // True when every released landing block the engine did not take over still holds its
  // marker, and every taken-over block holds its hash's content.
  bool markersIntact();
  uint32_t pins(worker::BlockHash hash);
  uint32_t totalPins();
  void setClock(Nanos now);  // the engine clock (leases)
  // Test thread, before an agent is created over this adapter: pushes are also served from
  // `store` (which must outlive the adapter), as an engine with lower tiers does.
  void attachTiers(worker::TieredStore& store);
  size_t pinnedTierRuns();
  // Test thread: the engine thread stops once `resume` is ready, as an engine that shut down
  // before its agent: what is posted after this call never runs (it goes with the adapter), and
  // onEngine() must not be called any more.
  void haltWhen(std::shared_future<void> resume);
  // Any thread: the tasks the agent posted to the engine thread so far.
  size_t postedTasks() const { return posted_.load(); }
  // Runs `fn` on the engine thread and waits for it.
  template <class Fn>
  auto onEngine(Fn fn) {
    return engine_.run([&]() -> boost::asio::awaitable<decltype(fn())> { co_return fn(); });
  }

  // worker::EngineAdapter
  worker::BlockGeometry geometry() const override { return geometry_; }
  worker::PayloadRegion payloadRegion() const override;
  Nanos now() const override;
  void post(absl::AnyInvocable<void() &&> fn) override;
  std::vector<worker::BlockIndex> pinLeadingRun(std::span<const worker::BlockHash> h) override;
  void unpin(std::span<const worker::BlockHash> hashes) override;
  worker::PayloadRegion tierRegion() const override;
  worker::TierPushRun pinTierRun(std::span<const worker::BlockHash> hashes,
                                 std::span<const std::span<std::byte>> disk_buffers,
                                 absl::AnyInvocable<void(size_t) &&> on_disk_read) override;
  void unpinTierRun(uint64_t id) override;
  void completeRemoteKv(const worker::RemoteKvOutcome& outcome) override;
  void failRemoteKv(const worker::RemoteKvOutcome& outcome) override;
  void releaseLanding(const std::string& id) override;

  static constexpr std::byte kMarker{0xee};

 private:
  void onEngineThreadCheck(const char* what);
  std::span<std::byte> blockBytes(worker::BlockIndex b);
  // Polls fetch `id`'s record until `done` holds or `timeout` passed.
  FetchRecord waitFor(const std::string& id, std::chrono::milliseconds timeout,
                      const std::function<bool(const FetchRecord&)>& done);

  worker::BlockGeometry geometry_;
  std::vector<std::byte> payload_;
  std::mutex mu_;  // the test thread reads what the engine thread writes
  std::map<uint64_t, worker::BlockIndex> table_;
  std::map<uint64_t, uint32_t> pins_;
  std::map<std::string, FetchRecord> fetches_;
  std::vector<worker::BlockIndex> released_blocks_;  // marker must survive
  std::vector<std::pair<worker::BlockHash, worker::BlockIndex>> taken_;
  std::atomic<Nanos> clock_{0};
  std::atomic<size_t> posted_{0};
  std::thread::id engine_thread_;
  std::unique_ptr<worker::TierPushSource> tier_push_;  // engine thread, once attached
  testing::IoThread engine_;
};

}  // namespace kvf::fakes
