// Drives an EngineCore alone in virtual time until one request finishes: steps back to back,
// and with nothing runnable jumps to the next onboard's ready time (waiting, in real time and
// bounded, for a live store's copies first, so polling never stretches the modelled clock).
// For tests and benchmarks that measure one request's modelled latency; the caller's thread.
#pragma once

#include <string>

#include "engine/engine_core.h"

namespace kvf::engine {

struct VirtualOutcome {
  bool finished = false;
  int64_t cached_tokens = -1;    // prefix hits (G1 and onboarded) at first admission
  int64_t tier_tokens = 0;       // of them, onboarded from host memory or disk
  int64_t tier_disk_tokens = 0;  // of tier_tokens, those read from disk
  Nanos ttft = -1;               // first token time - arrival (modelled)
};

// Adds `spec` at `*now` and steps until it finishes (or max_steps); `*now` ends at the last
// step's end.
VirtualOutcome runToCompletion(EngineCore& core, RequestSpec spec, Nanos* now,
                               int max_steps = 1 << 20);

}  // namespace kvf::engine
