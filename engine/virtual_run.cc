#include "engine/virtual_run.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace kvf::engine {

VirtualOutcome runToCompletion(EngineCore& core, RequestSpec spec, Nanos* now, int max_steps) {
  const std::string id = spec.id;
  const Nanos arrival = *now;
  VirtualOutcome out;
  if (!core.add(std::move(spec), *now).ok()) return out;
  StepResult r;
  for (int i = 0; i < max_steps; ++i) {
    if (!core.hasWork()) {
      std::optional<Nanos> ready = core.nextOnboardReady();
      if (!ready) break;
      *now = std::max(*now, *ready);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!core.onboardsCopied() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
    }
    core.step(*now, &r);
    *now += r.duration;
    for (const RequestOutput& o : r.outputs) {
      if (o.id != id) continue;
      if (out.ttft < 0 && o.first_token_time >= 0) out.ttft = o.first_token_time - arrival;
      out.cached_tokens = o.cached_tokens;
      out.tier_tokens = o.tier_tokens;
      out.tier_disk_tokens = o.tier_disk_tokens;
      if (o.finish) {
        out.finished = true;
        return out;
      }
    }
  }
  return out;
}

}  // namespace kvf::engine
