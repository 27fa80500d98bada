#include "engine/engine_core.h"

#include "common/status.h"
#include "common/strings.h"

namespace kvf::engine {

absl::StatusOr<std::unique_ptr<EngineCore>> EngineCore::create(const EngineConfig& config,
                                                               worker::KvEventSink* sink) {
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->timing_ = std::make_unique<TimingModel>(config.profile);
  KvPoolOptions pool_options;
  pool_options.block_size = config.cache.block_size;
  pool_options.num_blocks = config.cache.num_gpu_blocks;
  pool_options.payload_bytes_per_block = config.cache.payload_bytes_per_block;
  pool_options.enable_prefix_caching = config.cache.enable_prefix_caching;
  KVF_ASSIGN_OR_RETURN(core->pool_, KvPool::create(pool_options, sink));
  SchedulerConfig sched = config.scheduler;
  if (sched.vocab_size <= 0) sched.vocab_size = config.profile.model.vocab_size;
  if (sched.eos_token_id < 0) sched.eos_token_id = sched.vocab_size - 1;
  core->scheduler_ =
      std::make_unique<Scheduler>(sched, core->pool_.get(), core->timing_.get(), sink);
  core->keyed_events_ = sink == nullptr || dynamic_cast<KeyedKvEventSink*>(sink) != nullptr;
  core->max_model_len_ =
      config.max_model_len > 0 ? config.max_model_len : config.profile.model.max_model_len;
  return core;
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
