#include "router/core/ledger.h"

#include <utility>

namespace kvf::router {

LoadLease::LoadLease(std::shared_ptr<Ledger> ledger, int slot, int64_t running, int64_t ongoing,
                     int64_t prefill)
    : ledger_(std::move(ledger)),
      slot_(slot),
      running_(running),
      ongoing_(ongoing),
      prefill_(prefill),
      prefill_held_(true) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  generation_ = s.generation;
  s.running += running;
  s.ongoing_tokens += ongoing;
  s.pending_prefill_tokens += prefill;
}

LoadLease& LoadLease::operator=(LoadLease&& other) noexcept {
  if (this != &other) {
    release();
    ledger_ = std::move(other.ledger_);
    slot_ = other.slot_;
    generation_ = other.generation_;
    running_ = other.running_;
    ongoing_ = other.ongoing_;
    prefill_ = other.prefill_;
    prefill_held_ = other.prefill_held_;
    other.ledger_ = nullptr;
  }
  return *this;
}

InstanceState* LoadLease::state() const {
  if (ledger_ == nullptr) return nullptr;
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot_)];
  // A removed instance's slot may already belong to a new one: its counters are not ours.
  return s.generation == generation_ ? &s : nullptr;
}

void LoadLease::endPrefill() {
  if (!prefill_held_) return;
  if (InstanceState* s = state()) s->pending_prefill_tokens -= prefill_;
  prefill_held_ = false;
}

void LoadLease::setPrefill(int64_t tokens) {
  if (!prefill_held_) return;
  if (InstanceState* s = state()) s->pending_prefill_tokens += tokens - prefill_;
  prefill_ = tokens;
}

void LoadLease::release() {
  if (ledger_ == nullptr) return;
  endPrefill();
  if (InstanceState* s = state()) {
    s->running -= running_;
    s->ongoing_tokens -= ongoing_;
  }
  ledger_ = nullptr;
}

OffloadLease& OffloadLease::operator=(OffloadLease&& other) noexcept {
  if (this != &other) {
    release();
    ledger_ = std::move(other.ledger_);
    other.ledger_ = nullptr;
  }
  return *this;
}

void OffloadLease::release() {
  if (ledger_ == nullptr) return;
  auto ledger = std::move(ledger_);
  ledger_ = nullptr;
  ledger->policy->offloadFinished();
}

}  // namespace kvf::router
