// The clock-agnostic engine core: KV pool, timing model and scheduler wired together from an
// EngineConfig, plus request validation (vocabulary, max_model_len). The live server drives it
// with Asio timers; a discrete-event simulator can drive it in virtual time and capture KV
// events with any KvEventSink. No I/O; owned and called by one thread.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/engine_config.h"
#include "engine/kv_pool.h"
#include "engine/scheduler.h"
#include "engine/timing_model.h"
#include "worker/kv_events.h"

namespace kvf::engine {

class EngineCore {
 public:
  // `sink` (may be null) receives BlockStored / BlockRemoved; it must outlive the core.
  static absl::StatusOr<std::unique_ptr<EngineCore>> create(const EngineConfig& config,
                                                            worker::KvEventSink* sink);

  // InvalidArgument naming the field for a request the engine can never serve.
  absl::Status validate(const RequestSpec& spec) const;
  // validate() then queue.
  absl::Status add(RequestSpec spec, Nanos now);
  bool abort(const std::string& id) { return scheduler_->abort(id); }
  StepResult step(Nanos now) { return scheduler_->step(now); }
  bool hasWork() const { return scheduler_->hasWork(); }

  SchedulerStats stats() const { return scheduler_->statsNow(); }
  KvPool& pool() { return *pool_; }
  const TimingModel& timing() const { return *timing_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  int64_t maxModelLen() const { return max_model_len_; }
  int64_t vocabSize() const { return timing_->profile().model.vocab_size; }

 private:
  EngineCore() = default;
  std::unique_ptr<TimingModel> timing_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t max_model_len_ = 0;
};

}  // namespace kvf::engine
