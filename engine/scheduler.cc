#include "engine/scheduler.h"

#include <algorithm>
#include <bit>
#include <cassert>

#include "common/prefetch.h"
#include "common/strings.h"
#include "engine/block_hasher.h"

namespace kvf::engine {

const char* finishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "unknown";
}

Scheduler::Scheduler(SchedulerConfig config, KvPool* pool, const TimingModel* timing,
                     worker::KvEventSink* sink)
    : config_(config),
      pool_(pool),
      timing_(timing),
      sink_(sink),
      keyed_sink_(dynamic_cast<KeyedKvEventSink*>(sink)) {
  const auto bs = static_cast<uint64_t>(pool_->blockSize());
  if (std::has_single_bit(bs)) block_shift_ = std::countr_zero(bs);
  if (pool_->lowerTiers() != nullptr && config_.prefetch.mode == worker::PrefetchMode::kQueued) {
    prefetch_ = std::make_unique<QueuedPrefetch>(config_.prefetch, pool_->lowerTiers(), timing_,
                                                 pool_->blockSize());
  }
}

Scheduler::~Scheduler() = default;

absl::Status Scheduler::add(RequestSpec spec, Nanos now) {
  const bool token_free = spec.prompt_blocks.has_value();
  auto prompt_len =
      token_free ? spec.prompt_blocks->num_tokens : static_cast<int64_t>(spec.prompt.size());
  if (prompt_len < 1) return absl::InvalidArgumentError("prompt must not be empty");
  if (requests_.contains(spec.id)) {
    return absl::AlreadyExistsError(strCat("request id ", spec.id, " is already running"));
  }
  int64_t bs = pool_->blockSize();
  auto capacity = pool_->numBlocks() * bs;
  if (token_free &&
      (!spec.prompt.empty() ||
       static_cast<int64_t>(spec.prompt_blocks->block_keys.size()) != prompt_len / bs)) {
    return absl::InvalidArgumentError(
        strCat("prompt_blocks: ", prompt_len / bs, " block keys expected and no token ids"));
  }
  if (spec.sampling.max_tokens < 1 || spec.sampling.max_tokens > capacity - prompt_len) {
    int64_t worst = prompt_len + std::min(spec.sampling.max_tokens, capacity);
    return absl::InvalidArgumentError(strCat("prompt + max_tokens (", worst,
                                             " tokens) exceeds the KV cache capacity (", capacity,
                                             " tokens)"));
  }
  auto r = std::make_unique<Request>();
  r->id = std::move(spec.id);
  r->tag = spec.tag;
  r->arrival_seq = next_arrival_seq_++;
  r->prompt_len = prompt_len;
  r->sampling = spec.sampling;
  if (token_free) {
    r->token_free = true;
    r->prompt_keys = std::move(spec.prompt_blocks->block_keys);
    // Given hashes (EngineCore::validate checked their number and the keyed hasher) are the
    // prompt's leading hashes; ensureHashes() goes on from there.
    if (spec.prompt_blocks->block_hashes.size() == r->prompt_keys.size() &&
        config_.keyed_hasher.hash != nullptr) {
      r->block_hashes = std::move(spec.prompt_blocks->block_hashes);
    }
    r->output_seed = spec.prompt_blocks->content_seed;
  } else {
    r->prompt = std::move(spec.prompt);
    r->output_seed = outputSeed(r->prompt);
  }
  r->arrival_time = now;
  r->remote_kv = std::move(spec.remote_kv);
  r->remote_decode_lease = spec.remote_decode_lease;
  r->remote_decode_lease_cap = spec.remote_decode_lease_cap;
  Request& queued = *r;
  waiting_.push_back(r.get());
  requests_.emplace(queued.id, std::move(r));
  // An idle engine admits the request at once: a promotion would race its own onboard. Behind
  // a step in progress or other waiting requests it waits at least until the step ends, and its
  // disk blocks can be read into host memory meanwhile.
  const bool waits = !running_.empty() || waiting_.size() > 1;
  if (prefetch_ != nullptr && waits && !queued.remote_kv) prefetchQueued(queued, now);
  return absl::OkStatus();
}

void Scheduler::prefetchQueued(Request& r, Nanos now) {
  ensureHashes(r);
  auto max_blocks = static_cast<size_t>(divBlocks(r.numTokens() - 1));
  std::span<const BlockHash> lookup(r.block_hashes.data(),
                                    std::min(max_blocks, r.block_hashes.size()));
  size_t g1 = pool_->findCachedPrefix(lookup).size();
  if (g1 < lookup.size()) prefetch_->onQueued(lookup.subspan(g1), now, &r.promoted);
}

bool Scheduler::abort(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request* r = it->second.get();
  if (r->status == RequestStatus::kWaitingForRemoteKv) {
    // The peer may still be writing: the landing blocks wait for releaseRemoteKvLanding().
    stats_.remote_kv_blocks_quarantined += r->landing_blocks.size();
    auto& q = quarantine_[r->id];
    q.insert(q.end(), r->landing_blocks.begin(), r->landing_blocks.end());
    remote_waiting_.erase(r->id);
  }
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  releasePrefetch(*r);
  releaseBlocks(*r);
  requests_.erase(it);
  return true;
}

SchedulerStats Scheduler::statsNow() const {
  SchedulerStats s = stats_;
  s.num_running = static_cast<int>(running_.size());
  s.num_waiting = static_cast<int>(waiting_.size());
  s.num_waiting_for_remote_kv = static_cast<int>(remote_waiting_.size());
  s.num_leases = static_cast<int>(leases_.size());
  if (prefetch_ != nullptr) s.prefetch = prefetch_->stats();
  return s;
}

void Scheduler::ensureHashes(Request& r) {
  const int64_t bs = pool_->blockSize();
  if (r.token_free) {
    const KeyedBlockHasher& kh = config_.keyed_hasher;
    while (static_cast<int64_t>(r.block_hashes.size() + 1) * bs <= r.numTokens()) {
      size_t i = r.block_hashes.size();
      if (kh.hash != nullptr) {
        uint64_t parent = i == 0 ? kh.root : r.block_hashes[i - 1].value();
        r.block_hashes.emplace_back(kh.hash(parent, blockKey(r, i)));
        continue;
      }
      BlockHash parent = i == 0 ? BlockHash() : r.block_hashes[i - 1];
      r.block_hashes.push_back(hashBlockKey(config_.hash_seed, parent, blockKey(r, i)));
    }
    return;
  }
  std::vector<TokenId> block(static_cast<size_t>(bs));
  while (static_cast<int64_t>(r.block_hashes.size() + 1) * bs <= r.numTokens()) {
    size_t i = r.block_hashes.size();
    for (int64_t j = 0; j < bs; ++j) block[j] = r.tokenAt(static_cast<int64_t>(i) * bs + j);
    BlockHash parent = i == 0 ? BlockHash() : r.block_hashes[i - 1];
    r.block_hashes.push_back(hashBlock(config_.hash_seed, parent, block));
  }
}

uint64_t Scheduler::blockKey(const Request& r, size_t i) const {
  return i < r.prompt_keys.size() ? r.prompt_keys[i]
                                  : generatedBlockKey(r.output_seed, static_cast<int64_t>(i));
}

int64_t Scheduler::chunkLimit(int64_t budget) const {
  if (config_.long_prefill_token_threshold > 0) {
    return std::min(budget, config_.long_prefill_token_threshold);
  }
  return budget;
}

bool Scheduler::allocateSlots(Request& r, int64_t n, std::span<const BlockIndex> cached,
                              size_t watched) {
  const int64_t bs = pool_->blockSize();
  auto held = static_cast<int64_t>(r.blocks.size() + cached.size());
  int64_t tokens = r.num_computed_tokens + static_cast<int64_t>(cached.size()) * bs + n;
  int64_t need = std::max<int64_t>(0, divBlocks(tokens + bs - 1) - held);
  if (need == 0 && cached.empty()) return true;  // a decode inside its last block
  // Touching an unreferenced cached block takes it off the free queue, so those count against
  // the free blocks too; count them only when the bounds 0 and cached.size() do not decide
  // (a head that waits for blocks asks every step, with thousands of cached blocks).
  const int64_t free_blocks = pool_->numFreeBlocks();
  if (need > free_blocks) return false;
  if (need + static_cast<int64_t>(cached.size()) > free_blocks) {
    // The leading `watched` blocks are the pool's intact watch: their count is kept there.
    int64_t unreferenced =
        watched > 0 && pool_->watchIntact(r.prefix_hint_watch)
            ? pool_->watchedUnreferenced() + pool_->countUnreferenced(cached.subspan(watched))
            : pool_->countUnreferenced(cached);
    if (need + unreferenced > free_blocks) return false;
  }
  pool_->acquire(cached);  // before allocate(), so eviction cannot take the hit blocks
  r.blocks.insert(r.blocks.end(), cached.begin(), cached.end());
  [[maybe_unused]] bool allocated = pool_->allocateInto(need, &r.blocks);
  assert(allocated);
  return true;
}

void Scheduler::releaseBlocks(Request& r) {
  std::reverse(r.blocks.begin(), r.blocks.end());  // tail blocks are evicted first
  pool_->release(r.blocks);
  r.blocks.clear();
  r.num_computed_tokens = 0;
  r.num_cached_blocks = 0;
}

void Scheduler::preempt(Request& r, std::vector<Scheduled>& scheduled, int64_t& budget) {
  running_.erase(std::remove(running_.begin(), running_.end(), &r), running_.end());
  for (auto it = scheduled.begin(); it != scheduled.end(); ++it) {
    if (it->request == &r) {
      budget += it->num_tokens;
      scheduled.erase(it);
      break;
    }
  }
  releaseBlocks(r);
  r.kv_ready_at = -1;
  r.status = RequestStatus::kPreempted;
  ++r.num_preemptions;
  ++stats_.num_preemptions;
  waiting_.push_front(&r);
}

bool Scheduler::releaseWaitingHolds() {
  bool released = false;
  for (size_t i = 1; i < waiting_.size(); ++i) {
    Request& r = *waiting_[i];
    if (r.blocks.empty()) continue;
    releaseBlocks(r);  // landed blocks stay cached: its admission may find them again
    r.local_hit_tokens = 0;
    r.kv_ready_at = -1;
    ++r.num_preemptions;
    ++stats_.num_preemptions;
    released = true;
  }
  return released;
}

void Scheduler::scheduleRunning(std::vector<Scheduled>& scheduled, int64_t& budget, int& preempted,
                                StepResult& result) {
  std::vector<Request*>& order = order_;
  order.clear();
  for (Request* r : running_) {
    if (r->numTokens() - r->num_computed_tokens == 1) order.push_back(r);  // decodes first
  }
  for (Request* r : running_) {
    if (r->numTokens() - r->num_computed_tokens != 1) order.push_back(r);
  }
  for (Request* r : order) {
    if (budget <= 0) break;
    if (r->status != RequestStatus::kRunning) continue;  // preempted earlier in this loop
    int64_t remaining = r->numTokens() - r->num_computed_tokens;
    int64_t n = remaining == 1 ? 1 : std::min(remaining, chunkLimit(budget));
    bool self_preempted = false;
    while (!allocateSlots(*r, n, {})) {
      Request* victim = running_.back();
      preempt(*victim, scheduled, budget);
      ++preempted;
      if (victim == r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) continue;
    scheduled.push_back({r, n});
    budget -= n;
  }
  result.num_preempted = preempted;
}

void Scheduler::keepPrefixHint(Request& r, std::vector<BlockIndex> blocks, size_t watched) {
  r.prefix_hint = std::move(blocks);
  std::span<const BlockIndex> hint(r.prefix_hint);
  if (watched > 0 && pool_->watchIntact(r.prefix_hint_watch)) {
    pool_->extendWatch(r.prefix_hint_watch, hint.subspan(watched));  // only the new blocks
    return;
  }
  if (pool_->watchIntact(r.prefix_hint_watch)) pool_->endWatch();
  r.prefix_hint_watch = hint.empty() ? 0 : pool_->watchCachedPrefix(hint);
}

void Scheduler::admitWaiting(std::vector<Scheduled>& scheduled, int64_t& budget,
                             StepResult& result) {
  const int64_t bs = pool_->blockSize();
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    // Admission always needs a fresh block (the last token is computed), so with none free the
    // head waits: skip its prefix lookup, which under overload would repeat every step.
    if (pool_->numFreeBlocks() == 0) break;
    Request& r = *waiting_.front();
    ensureHashes(r);
    // A request back from a remote-KV fetch already holds its blocks (local hits + pushed).
    const bool resumed = !r.blocks.empty();
    std::vector<BlockIndex> cached;
    size_t watched = 0;  // leading blocks of `cached` still under the head's watch
    if (!resumed) {
      // The last token is always computed, so at most (n - 1) / bs blocks can come from cache.
      auto max_blocks = static_cast<size_t>(divBlocks(r.numTokens() - 1));
      std::span<const BlockHash> lookup(r.block_hashes.data(),
                                        std::min(max_blocks, r.block_hashes.size()));
      if (pool_->watchIntact(r.prefix_hint_watch) && r.prefix_hint.size() <= lookup.size()) {
        // Every block found last step still holds its hash: probe only past them.
        cached = std::move(r.prefix_hint);
        watched = cached.size();
        std::vector<BlockIndex> more = pool_->findCachedPrefix(lookup.subspan(watched));
        cached.insert(cached.end(), more.begin(), more.end());
      } else {
        cached = pool_->findCachedPrefix(lookup, r.prefix_hint);
      }
      if (r.remote_kv) {
        std::vector<BlockHash> run = remoteRun(r, cached.size(), max_blocks);
        if (!run.empty()) {
          if (!startRemoteKv(r, cached, std::move(run), result)) {
            keepPrefixHint(r, std::move(cached), watched);
            break;  // FCFS: wait for blocks
          }
          keepPrefixHint(r, {}, 0);
          releasePrefetch(r);
          waiting_.pop_front();  // it waits aside and does not block the queue
          continue;
        }
        r.remote_kv.reset();  // nothing worth fetching
      }
      // The prefix past the G1 hit may be held below (host memory, disk): onboard it, and the
      // request waits aside for its own blocks only.
      if (std::optional<bool> started = startOnboard(r, cached, lookup, result)) {
        if (!*started) {
          keepPrefixHint(r, std::move(cached), watched);
          break;  // FCFS: wait for blocks
        }
        keepPrefixHint(r, {}, 0);
        releasePrefetch(r);
        waiting_.pop_front();
        continue;
      }
    }
    int64_t computed = resumed ? r.num_computed_tokens : static_cast<int64_t>(cached.size()) * bs;
    int64_t n = r.numTokens() - computed;
    const bool fits = config_.enable_chunked_prefill || n <= budget;
    n = std::min(n, chunkLimit(budget));
    if (!fits || !allocateSlots(r, n, cached, watched)) {
      // FCFS: the head waits for blocks; its next lookup starts from these.
      keepPrefixHint(r, std::move(cached), watched);
      break;
    }
    keepPrefixHint(r, {}, 0);
    if (!resumed) {
      r.num_computed_tokens = computed;
      r.num_cached_blocks = cached.size();
    }
    if (r.num_cached_tokens < 0) {
      // First admission: outputs grow by one token per step, so reserve what max_tokens allows
      // (bounded) and decoding does not reallocate as it goes. Here rather than at add(), so a
      // long waiting queue holds no output memory (at most max_num_seqs requests run).
      constexpr int64_t kOutputReserve = int64_t{1} << 14;
      r.output.reserve(static_cast<size_t>(std::min(r.sampling.max_tokens, kOutputReserve)));
      r.num_cached_tokens = computed;
      stats_.prompt_tokens += static_cast<uint64_t>(r.prompt_len);
    }
    int64_t local_hits = resumed ? r.local_hit_tokens : computed;
    stats_.prefix_cache_queries += static_cast<uint64_t>(r.numTokens());
    stats_.prefix_cache_hits += static_cast<uint64_t>(local_hits);
    releasePrefetch(r);
    waiting_.pop_front();
    r.status = RequestStatus::kRunning;
    running_.push_back(&r);
    scheduled.push_back({&r, n});
    budget -= n;
  }
}

void Scheduler::cacheFullBlocks(Request& r) {
  const int64_t bs = pool_->blockSize();
  auto full = static_cast<size_t>(divBlocks(r.num_computed_tokens));
  // Most decode steps fill no block: nothing to hash, cache or publish.
  if (full <= r.num_cached_blocks &&
      static_cast<int64_t>(r.block_hashes.size() + 1) * bs > r.numTokens()) {
    return;
  }
  ensureHashes(r);
  size_t run_start = r.num_cached_blocks;
  auto flush = [&](size_t end) {
    if (end <= run_start || sink_ == nullptr) return;
    worker::BlockStored ev;
    ev.block_hashes.assign(r.block_hashes.begin() + run_start, r.block_hashes.begin() + end);
    if (run_start > 0) ev.parent_block_hash = r.block_hashes[run_start - 1];
    ev.block_size = static_cast<int>(bs);
    if (r.token_free) {
      if (keyed_sink_ == nullptr) return;
      std::vector<uint64_t> keys;
      if (keyed_sink_->wantsBlockKeys()) {
        keys.reserve(end - run_start);
        for (size_t i = run_start; i < end; ++i) keys.push_back(blockKey(r, i));
      }
      keyed_sink_->onBlockStoredKeys(std::move(ev), std::move(keys));
      return;
    }
    ev.token_ids.reserve((end - run_start) * bs);
    for (auto t = static_cast<int64_t>(run_start) * bs; t < static_cast<int64_t>(end) * bs; ++t) {
      ev.token_ids.push_back(r.tokenAt(t));
    }
    sink_->onBlockStored(std::move(ev));
  };
  constexpr size_t kAhead = 8;  // cache misses in flight
  for (size_t i = r.num_cached_blocks; i < full; ++i) {
    if (i + kAhead < full)
      pool_->prefetchCacheBlock(r.blocks[i + kAhead], r.block_hashes[i + kAhead]);
    if (!pool_->cacheBlock(r.blocks[i], r.block_hashes[i])) {
      flush(i);  // a duplicate of a block cached elsewhere ends the run
      run_start = i + 1;
    }
  }
  flush(full);
  r.num_cached_blocks = std::max(r.num_cached_blocks, full);
}

TokenId Scheduler::sampleToken(Request& r, Nanos end) {
  auto index = static_cast<int64_t>(r.output.size());
  TokenId token = generatedToken(r.output_seed, index, config_.vocab_size);
  bool eos = token == config_.eos_token_id;
  if (eos && index < r.sampling.min_tokens) {
    token = (token + 1) % config_.vocab_size;  // EOS is masked until min_tokens
    eos = false;
  }
  r.output.push_back(token);
  ++stats_.generation_tokens;
  if (r.first_token_time < 0) r.first_token_time = end;
  if (eos && !r.sampling.ignore_eos) {
    finish(r, FinishReason::kStop, end);
  } else if (static_cast<int64_t>(r.output.size()) >= r.sampling.max_tokens) {
    finish(r, FinishReason::kLength, end);
  }
  return token;
}

void Scheduler::finish(Request& r, FinishReason reason, Nanos now) {
  if (r.remote_decode_lease) takeLease(r, now);  // pins before the blocks are released
  r.status = RequestStatus::kFinished;
  r.finish_reason = reason;
  running_.erase(std::remove(running_.begin(), running_.end(), &r), running_.end());
  std::reverse(r.blocks.begin(), r.blocks.end());  // tail blocks are evicted first
  pool_->release(r.blocks);
  r.blocks.clear();
}

void Scheduler::fillOutput(const Request& r, RequestOutput& o) const {
  if (config_.output_ids) o.id = r.id;
  o.tag = r.tag;
  o.finish = r.finish_reason;
  o.prompt_tokens = r.prompt_len;
  o.cached_tokens = std::max<int64_t>(0, r.num_cached_tokens);
  o.output_tokens = static_cast<int64_t>(r.output.size());
  o.arrival_time = r.arrival_time;
  o.first_token_time = r.first_token_time;
  o.num_preemptions = r.num_preemptions;
  o.remote_kv_tokens = r.remote_kv_tokens;
  o.tier_tokens = r.tier_tokens;
  o.tier_disk_tokens = r.tier_disk_tokens;
  if (r.status == RequestStatus::kFinished && r.remote_decode_lease) {
    o.lease_id = r.id;
    o.lease_block_hashes = r.lease_hashes;
    o.lease_blocks = pool_->findCachedPrefix(r.lease_hashes);
  }
}

// A simulator steps many engines in turn, so a step finds its requests cold: start every
// running request's loads at once (the fields a decode step reads and the end of its output,
// which sampleToken appends to) instead of one miss after another through the batch.
void Scheduler::prefetchRunning() const {
  for (const Request* r : running_) {
    prefetchLine(&r->prompt_len);
    prefetchLine(&r->output);
    prefetchLine(&r->num_computed_tokens);
    prefetchLine(&r->blocks);
  }
  for (const Request* r : running_) {
    if (r->output.capacity() > 0) prefetchLine(r->output.data() + r->output.size());
  }
}

StepResult Scheduler::step(Nanos now) {
  StepResult result;
  step(now, &result);
  return result;
}

void Scheduler::step(Nanos now, StepResult* into) {
  StepResult& result = *into;
  result.outputs.clear();
  result.remote_kv_fetches.clear();
  result.tier_onboards.clear();
  result.duration = 0;
  result.num_scheduled_tokens = 0;
  result.num_prefill_requests = result.num_decode_requests = result.num_preempted = 0;
  result.start = now;
  std::vector<Scheduled>& scheduled = scheduled_;
  scheduled.clear();
  int64_t budget = config_.max_num_batched_tokens;
  int preempted = 0;
  prefetchRunning();
  expireLeases(now);
  if (prefetch_ != nullptr) prefetch_->pump(now);
  scheduleRunning(scheduled, budget, preempted, result);
  if (preempted == 0) admitWaiting(scheduled, budget, result);
  if (running_.empty() && !waiting_.empty() && releaseWaitingHolds()) {
    admitWaiting(scheduled, budget, result);
  }
  if (scheduled.empty()) return;

  std::vector<BatchEntry>& batch = batch_;
  batch.clear();
  for (auto& [r, n] : scheduled) {
    bool decode = n == 1 && !r->output.empty() && r->num_computed_tokens + 1 == r->numTokens();
    (decode ? result.num_decode_requests : result.num_prefill_requests)++;
    batch.push_back({n, r->num_computed_tokens});
    r->num_computed_tokens += n;
    result.num_scheduled_tokens += n;
    cacheFullBlocks(*r);
  }
  result.duration = timing_->stepDuration(batch);
  const Nanos compute = result.duration;
  for (auto& [r, n] : scheduled) {
    if (r->kv_ready_at < 0) continue;
    // Layer-wise push or onboard: the forward pass runs layer by layer over the whole batch,
    // and layer l waits for layer l of this request's KV. Only the KV still arriving adds to
    // the step; requests in it without such KV add their compute alone (in `compute`).
    result.duration =
        std::max(result.duration, timing_->layeredStepDuration(compute, now, r->kv_ready_at));
    r->kv_ready_at = -1;
  }
  const Nanos end = now + result.duration;
  done_.clear();
  result.outputs.reserve(scheduled.size());
  for (auto& [r, n] : scheduled) {
    std::optional<TokenId> token;
    if (r->num_computed_tokens == r->numTokens()) token = sampleToken(*r, end);
    RequestOutput& out = result.outputs.emplace_back();
    fillOutput(*r, out);
    if (token) out.new_tokens.push_back(*token);
    if (r->status == RequestStatus::kFinished) done_.push_back(r);
  }
  for (Request* r : done_) requests_.erase(requests_.find(r->id));
}

}  // namespace kvf::engine
