#include "engine/engine_core.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "common/status.h"
#include "common/strings.h"

namespace kvf::engine {

absl::StatusOr<std::unique_ptr<EngineCore>> EngineCore::create(
    const EngineConfig& config, worker::KvEventSink* sink, std::unique_ptr<LowerTiers> tiers,
    std::shared_ptr<PayloadMemory> memory) {
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->tiers_ = std::move(tiers);
  core->onboard_mode_ = config.scheduler.onboard;
  core->timing_ = std::make_unique<TimingModel>(config.profile);
  KvPoolOptions pool_options;
  pool_options.block_size = config.cache.block_size;
  pool_options.num_blocks = config.cache.num_gpu_blocks;
  pool_options.payload_bytes_per_block = config.cache.payload_bytes_per_block;
  pool_options.enable_prefix_caching = config.cache.enable_prefix_caching;
  KVF_ASSIGN_OR_RETURN(core->pool_, KvPool::create(pool_options, sink, std::move(memory)));
  core->pool_->setLowerTiers(core->tiers_.get());
  SchedulerConfig sched = config.scheduler;
  if (config.tiers) sched.prefetch = config.tiers->prefetch;
  if (sched.vocab_size <= 0) sched.vocab_size = config.profile.model.vocab_size;
  if (sched.eos_token_id < 0) sched.eos_token_id = sched.vocab_size - 1;
  core->scheduler_ =
      std::make_unique<Scheduler>(sched, core->pool_.get(), core->timing_.get(), sink);
  core->keyed_events_ = sink == nullptr || dynamic_cast<KeyedKvEventSink*>(sink) != nullptr;
  core->max_model_len_ =
      config.max_model_len > 0 ? config.max_model_len : config.profile.model.max_model_len;
  return core;
}

EngineCore::~EngineCore() {
  // A copy still writing into the pool must end before the pool goes away.
  for (PendingOnboard& p : onboards_) {
    while (!p.copy->done()) std::this_thread::yield();
  }
}

bool EngineCore::abort(const std::string& id) {
  auto it = std::find_if(onboards_.begin(), onboards_.end(),
                         [&](const PendingOnboard& p) { return p.id == id && !p.aborted; });
  bool aborted = scheduler_->abort(id);
  // The scheduler quarantined the landing blocks: the copy may still write into them.
  if (aborted && it != onboards_.end()) it->aborted = true;
  return aborted;
}

void EngineCore::step(Nanos now, StepResult* result) {
  if (tiers_ != nullptr) tiers_->poll();
  if (!onboards_.empty()) finishOnboards(now);
  scheduler_->step(now, result);
  if (!result->tier_onboards.empty()) startOnboards(*result, now);
}

std::optional<Nanos> EngineCore::nextOnboardReady() const {
  std::optional<Nanos> next;
  for (const PendingOnboard& p : onboards_) {
    if (!next || p.ready_at < *next) next = p.ready_at;
  }
  return next;
}

bool EngineCore::onboardsCopied() const {
  return std::all_of(onboards_.begin(), onboards_.end(),
                     [](const PendingOnboard& p) { return p.copy->done(); });
}

void EngineCore::startOnboards(const StepResult& result, Nanos now) {
  const int64_t bs = pool_->blockSize();
  for (const TierOnboardStart& o : result.tier_onboards) {
    PendingOnboard p;
    p.id = o.id;
    p.hashes = o.hashes;
    p.blocks = o.blocks;
    std::vector<std::span<std::byte>> dst;
    dst.reserve(o.blocks.size());
    for (BlockIndex b : o.blocks) dst.push_back(pool_->payload(b));
    p.copy = tiers_->onboard(o.hashes, dst);
    const auto host = static_cast<int64_t>(o.host_blocks) * bs;
    const auto disk = static_cast<int64_t>(o.disk_blocks) * bs;
    p.ready_at = now + timing_->onboardReadyDuration(onboard_mode_, host, disk);
    if (onboard_mode_ == OnboardMode::kLayerwise) {
      p.kv_ready_at = now + timing_->onboardDuration(host, disk);
    }
    onboards_.push_back(std::move(p));
  }
}

size_t EngineCore::verifiedPrefix(const PendingOnboard& p) {
  size_t n = std::min(p.copy->readyPrefix(), p.blocks.size());
  for (size_t i = 0; i < n; ++i) {
    if (!pool_->verifyPayload(p.blocks[i], p.hashes[i])) {
      ++onboard_payload_mismatches_;
      return i;
    }
  }
  return n;
}

void EngineCore::finishOnboards(Nanos now) {
  // Live copies slower than the model are polled again a little later.
  constexpr Nanos kRepoll = 100 * kNanosPerMicro;
  for (size_t i = 0; i < onboards_.size();) {
    PendingOnboard& p = onboards_[i];
    if (p.ready_at > now) {
      ++i;
      continue;
    }
    if (!p.copy->done()) {
      p.ready_at = now + kRepoll;
      ++i;
      continue;
    }
    if (p.aborted) {
      scheduler_->releaseRemoteKvLanding(p.id);
    } else {
      size_t good = verifiedPrefix(p);
      absl::Status s = good > 0 ? scheduler_->completeRemoteKv(p.id, good, now, p.kv_ready_at)
                                : scheduler_->failRemoteKv(p.id, now, false);
      (void)s;  // the request waits for exactly this onboard: it cannot be gone
    }
    onboards_.erase(onboards_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

absl::Status EngineCore::validate(const RequestSpec& spec) const {
  int64_t prompt_len = 0;
  if (spec.prompt_blocks) {
    KVF_RETURN_IF_ERROR(validatePromptBlocks(spec));
    prompt_len = spec.prompt_blocks->num_tokens;
  } else {
    if (spec.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
    const int64_t vocab = vocabSize();
    for (size_t i = 0; i < spec.prompt.size(); ++i) {
      if (spec.prompt[i] >= vocab) {
        return absl::InvalidArgumentError(strCat("prompt[", i, "]: token id ", spec.prompt[i],
                                                 " is out of vocabulary (0..", vocab - 1, ")"));
      }
    }
    prompt_len = static_cast<int64_t>(spec.prompt.size());
  }
  if (prompt_len >= max_model_len_) {
    return absl::InvalidArgumentError(strCat("prompt: this model's maximum context length is ",
                                             max_model_len_, " tokens, but the prompt has ",
                                             prompt_len, " tokens"));
  }
  if (spec.remote_kv) {
    if (spec.remote_kv->source.empty()) {
      return absl::InvalidArgumentError("kv_transfer_params.source: must not be empty");
    }
    auto max_blocks = static_cast<size_t>(prompt_len / pool_->blockSize());
    if (spec.remote_kv->block_hashes.size() > max_blocks) {
      return absl::InvalidArgumentError(
          strCat("kv_transfer_params.block_hashes: ", spec.remote_kv->block_hashes.size(),
                 " hashes for a prompt of ", max_blocks, " full blocks"));
    }
  }
  if (spec.remote_decode_lease && *spec.remote_decode_lease <= 0) {
    return absl::InvalidArgumentError("kv_transfer_params.lease_ms: must be positive");
  }
  const SamplingParams& s = spec.sampling;
  if (s.max_tokens < 1) return absl::InvalidArgumentError("max_tokens: must be at least 1");
  if (s.max_tokens > max_model_len_ - prompt_len) {
    return absl::InvalidArgumentError(strCat("max_tokens: this model's maximum context length is ",
                                             max_model_len_, " tokens; the prompt has ", prompt_len,
                                             " tokens and max_tokens is ", s.max_tokens));
  }
  const int64_t capacity = pool_->numBlocks() * pool_->blockSize();  // immutable after create()
  if (s.max_tokens > capacity - prompt_len) {
    return absl::InvalidArgumentError(strCat("max_tokens: prompt + max_tokens (", prompt_len, " + ",
                                             s.max_tokens, ") exceeds the KV cache capacity (",
                                             capacity, " tokens)"));
  }
  if (s.min_tokens < 0 || s.min_tokens > s.max_tokens) {
    return absl::InvalidArgumentError(
        strCat("min_tokens: must be in [0, max_tokens], got ", s.min_tokens));
  }
  return absl::OkStatus();
}

absl::Status EngineCore::validatePromptBlocks(const RequestSpec& spec) const {
  const PromptBlocks& p = *spec.prompt_blocks;
  if (!spec.prompt.empty()) {
    return absl::InvalidArgumentError("prompt: must be empty when prompt_blocks is given");
  }
  if (p.num_tokens < 1) {
    return absl::InvalidArgumentError("prompt: must not be empty");
  }
  auto expected = static_cast<size_t>(p.num_tokens / pool_->blockSize());
  if (p.block_keys.size() != expected) {
    return absl::InvalidArgumentError(strCat("prompt_blocks.block_keys: ", p.block_keys.size(),
                                             " keys for ", expected, " full blocks of ",
                                             pool_->blockSize(), " tokens"));
  }
  if (!keyed_events_) {
    return absl::FailedPreconditionError(
        "prompt_blocks: this core's KV event sink cannot take token-free stores");
  }
  if (!p.block_hashes.empty()) {
    if (scheduler_->config().keyed_hasher.hash == nullptr) {
      return absl::FailedPreconditionError(
          "prompt_blocks.block_hashes: this core has no keyed hasher to agree with");
    }
    if (p.block_hashes.size() != p.block_keys.size()) {
      return absl::InvalidArgumentError(
          strCat("prompt_blocks.block_hashes: ", p.block_hashes.size(), " hashes for ",
                 p.block_keys.size(), " block keys"));
    }
  }
  return absl::OkStatus();
}

absl::Status EngineCore::add(RequestSpec spec, Nanos now) {
  KVF_RETURN_IF_ERROR(validate(spec));
  return scheduler_->add(std::move(spec), now);
}

std::vector<BlockIndex> EngineCore::pinLeadingRun(std::span<const BlockHash> hashes) {
  std::vector<BlockIndex> blocks;
  for (BlockHash h : hashes) {
    auto b = pool_->table().find(h);
    if (!b || !pool_->pin(h).ok()) break;
    blocks.push_back(*b);
  }
  return blocks;
}

void EngineCore::unpin(std::span<const BlockHash> hashes) {
  for (BlockHash h : hashes) {
    absl::Status s = pool_->unpin(h);
    (void)s;  // unknown hashes are ignored: a caller may unpin what it failed to pin
  }
}

}  // namespace kvf::engine
