// The router's side of engines' KV events: one subscriber per data-parallel rank, each rank a
// stream of the instance in the cache index; application of decoded batches (the indexed KV
// cache group only, other tiers kept per medium in the routing core, unknown events and fields
// counted); resets on
// restart, late join, lost history and undecodable batches; the learned KV capacity; and the
// check that tells an operator when an instance serves traffic while its stream is silent or
// its cache hits go unpredicted. Runs on the router's io thread; subscribers post to it.
#include <charconv>
#include <chrono>

#include <boost/json.hpp>

#include <boost/asio/post.hpp>

#include "common/log.h"
#include "common/strings.h"
#include "router/kv_subscriber.h"
#include "router/router.h"
#include "router/router_internal.h"

namespace kvf::router {
namespace {

constexpr std::string_view kKvStates[] = {"disabled", "waiting", "live", "silent"};

bool isGpu(std::string_view medium) { return medium.empty() || medium == "GPU"; }

// The value of label `label` on the first sample of `name` in a Prometheus exposition.
std::optional<uint64_t> labelValue(std::string_view text, std::string_view name,
                                   std::string_view label) {
  size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string_view::npos) {
    bool line_start = pos == 0 || text[pos - 1] == '\n';
    size_t after = pos + name.size();
    pos = after;
    if (!line_start || after >= text.size() || text[after] != '{') continue;
    std::string_view line = text.substr(after, text.find('\n', after) - after);
    std::string key = strCat(label, "=\"");
    size_t at = line.find(key);
    if (at == std::string_view::npos) return std::nullopt;
    std::string_view value = line.substr(at + key.size());
    value = value.substr(0, value.find('"'));
    uint64_t n = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || ptr != value.data() + value.size()) return std::nullopt;
    return n;
  }
  return std::nullopt;
}

// Hybrid models publish one event per KV cache group. The group that decides prefix reuse
// (full attention) is indexed; a sliding-window group's removals happen as its window moves and
// must not erase the prefix. Before kinds were published (vLLM v0.20-v0.21) group 0 is taken.
bool indexedGroup(Instance::KvStream& state, const KvEvent& event) {
  if (!event.group_idx) return true;  // a single-group engine
  const int64_t group = *event.group_idx;
  if (event.kind == KvEventKind::kBlockStored && !event.cache_spec_kind.empty()) {
    if (!decidesPrefixReuse(event.cache_spec_kind)) return false;
    if (!state.indexed_group || group < *state.indexed_group) state.indexed_group = group;
  }
  return group == state.indexed_group.value_or(0);
}

}  // namespace

void Router::startKvSubscribers(const std::shared_ptr<Instance>& instance) {
  const InstanceConfig& config = instance->config;
  instance->kv_capacity_blocks = config.kv_capacity_blocks;
  core_->index().setCapacity(instance->slot, static_cast<size_t>(config.kv_capacity_blocks));
  instance->kv_state_gauges.clear();
  for (std::string_view state : kKvStates) {
    instance->kv_state_gauges.push_back(
        &registry_.gauge("kvfabric_router_kv_events_state",
                         "1 for the instance's KV-event state (disabled, waiting: subscribed, no "
                         "batch yet; live; silent: served requests, no batch for silent_after_s)",
                         {{"instance", config.id}, {"state", std::string(state)}}));
  }
  if (!instance->hasEvents()) {
    setKvState(*instance, 0);
    return;
  }
  setKvState(*instance, 1);
  const int ranks = config.kv_events.data_parallel_size;
  instance->kv_streams.assign(static_cast<size_t>(ranks), {});
  instance->kv_watch_since = clock_.now();
  std::weak_ptr<Router> weak = weak_from_this();
  int slot = instance->slot;
  uint64_t generation = instance->generation;
  KvSubscriberOptions options;
  options.max_payload_bytes = config_.max_kv_event_bytes;
  for (int rank = 0; rank < ranks; ++rank) {
    KvEventsConfig stream = config.kv_events;
    stream.endpoint = rankEndpoint(stream.endpoint, rank);
    stream.replay_endpoint = rankEndpoint(stream.replay_endpoint, rank);
    log::info("subscribing to KV events", "instance", config.id, "rank", rank, "endpoint",
              stream.endpoint, "replay",
              stream.replay_endpoint.empty() ? "none" : stream.replay_endpoint, "topic",
              stream.topic);
    instance->subscribers.push_back(std::make_unique<KvSubscriber>(
        zmq_, std::move(stream),
        [weak, slot, generation, rank, &ioc = ioc_](KvUpdate&& update) {
          asio::post(ioc, [weak, slot, generation, rank, u = std::move(update)]() mutable {
            if (auto self = weak.lock()) self->applyKvUpdate(slot, generation, rank, u);
          });
        },
        options));
  }
  // The subscribers' sequencing counters, summed over the instance's ranks.
  std::weak_ptr<Instance> weak_instance = instance;
  auto stat = [&](std::string_view name, std::string_view help,
                  std::atomic<uint64_t> KvSubscriberStats::*field) {
    registry_.callback(name, help, metrics::MetricType::kCounter, {{"instance", config.id}},
                       [weak_instance, field] {
                         auto i = weak_instance.lock();
                         double sum = 0;
                         if (!i) return sum;
                         for (const auto& s : i->subscribers) sum += (s->stats().*field).load();
                         return sum;
                       });
  };
  stat("kvfabric_router_instance_kv_gaps_total",
       "Sequence gaps seen on the instance's KV event streams", &KvSubscriberStats::gaps);
  stat("kvfabric_router_instance_kv_replayed_total",
       "KV event batches recovered through the replay socket", &KvSubscriberStats::replayed);
  stat("kvfabric_router_instance_kv_unrecovered_gaps_total",
       "Gaps the replay could not fill (each resets the rank's index)",
       &KvSubscriberStats::unrecovered_gaps);
  stat("kvfabric_router_instance_kv_restarts_total",
       "Engine restarts seen as a sequence going back", &KvSubscriberStats::restarts);
  stat("kvfabric_router_instance_kv_late_joins_total",
       "Streams first seen past seq 0 with the history before lost",
       &KvSubscriberStats::late_joins);
}

void Router::setKvState(Instance& instance, size_t state) {
  for (size_t i = 0; i < instance.kv_state_gauges.size(); ++i) {
    instance.kv_state_gauges[i]->set(i == state ? 1.0 : 0.0);
  }
  instance.kv_state = kKvStates[state];
}

void Router::resetKvInstance(Instance& instance, std::string_view reason) {
  core_->index().clearInstance(instance.slot);
  core_->clearTiers(instance.slot);
  for (auto& stream : instance.kv_streams) stream.indexed_group.reset();
  instance.kv_last_reset = std::string(reason);
  instance.kv_resets->inc();
  updateTierGauges(instance);
}

void Router::applyKvUpdate(int slot, uint64_t generation, int stream, KvUpdate& update) {
  std::shared_ptr<Instance> instance = slots_[slot];
  if (!instance || instance->generation != generation || instance->removed) return;
  Instance::KvStream& state = instance->kv_streams[static_cast<size_t>(stream)];
  if (update.kind == KvUpdate::Kind::kReset) {
    // The stream's history is unknown from here: what it held is dropped at once.
    core_->index().clearStream(slot, stream);
    state.indexed_group.reset();
    core_->clearTiers(slot);
    updateTierGauges(*instance);
    instance->kv_last_reset = update.reason;
    instance->kv_resets->inc();
    instance->kv_lost->inc(static_cast<double>(update.lost_batches));
    instance->kv_lost_batches += update.lost_batches;
    if (update.reason == "undecodable") instance->kv_decode_errors->inc();
    log::warn("KV index reset for instance", "instance", instance->config.id, "rank", stream,
              "reason", update.reason, "seq", update.seq, "lost_batches", update.lost_batches,
              "error", update.error);
    return;
  }
  instance->kv_batches->inc();
  state.last_seq = update.seq;
  instance->last_kv_event = clock_.now();
  instance->routed_since_kv_event = 0;
  if (instance->kv_events_silent) {
    instance->kv_events_silent = false;
    log::info("KV events flowing again", "instance", instance->config.id);
  }
  setKvState(*instance, 2);
  double now_wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (update.batch.ts > 0)
    metrics_->kv_event_lag_seconds->observe(std::max(0.0, now_wall - update.batch.ts));
  metrics_->kv_skipped_unknown_type->inc(update.batch.skipped_events);
  metrics_->kv_skipped_unknown_field->inc(update.batch.ignored_fields);
  bool tiers_changed = false;
  for (KvEvent& event : update.batch.events) {
    if (event.kind != KvEventKind::kAllBlocksCleared && !isGpu(event.medium)) {
      // Another tier: never a GPU prefix hit; the policy credits the run it continues.
      tiers_changed = true;
      if (event.kind == KvEventKind::kBlockStored) {
        if (!core_->storeTierBlocks(slot, stream, event.medium, event.stored)) {
          metrics_->kv_skipped_tier_full->inc();
        }
      } else {
        core_->removeTierBlocks(slot, event.medium, event.removed);
      }
      continue;
    }
    if (!indexedGroup(state, event)) {
      metrics_->kv_skipped_other_group->inc();
      continue;
    }
    switch (event.kind) {
      case KvEventKind::kBlockStored:
        if (!core_->index().storeBlocks(slot, event.stored, stream))
          metrics_->kv_events_ignored->inc();
        break;
      case KvEventKind::kBlockRemoved:
        core_->index().removeBlocks(slot, event.removed, stream);
        break;
      case KvEventKind::kAllBlocksCleared:
        core_->index().clearStream(slot, stream);
        core_->index().clearSoft(slot);
        instance->kv_last_reset = "all_blocks_cleared";
        instance->kv_resets->inc();
        break;
    }
  }
  if (tiers_changed) updateTierGauges(*instance);
}

void Router::updateTierGauges(Instance& instance) {
  for (const auto& [medium, blocks] : core_->tiers(instance.slot).summary()) {
    registry_
        .gauge("kvfabric_router_instance_tier_blocks",
               "Blocks the instance holds per its KV events in a tier other than GPU (medium)",
               {{"instance", instance.config.id}, {"medium", medium}})
        .set(static_cast<double>(blocks));
  }
}

void Router::learnKvCapacity(Instance& instance, std::string_view metrics_body) {
  if (instance.config.kv_capacity_blocks != 0) return;  // configured: the operator's word
  auto blocks = labelValue(metrics_body, "vllm:cache_config_info", "num_gpu_blocks");
  if (!blocks || *blocks == 0 || *blocks == instance.kv_capacity_blocks) return;
  instance.kv_capacity_blocks = *blocks;
  core_->index().setCapacity(instance.slot, static_cast<size_t>(*blocks));
  log::info("learned KV capacity", "instance", instance.config.id, "blocks", *blocks);
}

void Router::checkKvEvents(Instance& instance) {
  // Hits the engine reported beyond the prediction, over the last interval.
  double actual = instance.actual_cached_tokens->value();
  double unpredicted = instance.unpredicted_hit_tokens->value();
  double d_actual = actual - instance.kv_check_actual;
  double d_unpredicted = unpredicted - instance.kv_check_unpredicted;
  instance.kv_check_actual = actual;
  instance.kv_check_unpredicted = unpredicted;
  instance.hits_unpredicted = d_actual > 0 && 2 * d_unpredicted > d_actual;
  if (instance.hits_unpredicted) {
    instance.kv_check_log.warn("engine reports cache hits the router did not predict", "instance",
                               instance.config.id, "unpredicted_tokens", d_unpredicted,
                               "reported_tokens", d_actual);
  }
  if (!instance.hasEvents()) return;
  Nanos since = instance.last_kv_event != 0 ? instance.last_kv_event : instance.kv_watch_since;
  bool silent =
      instance.routed_since_kv_event > 0 && clock_.now() - since > config_.kv_events_silent_after;
  if (silent) {
    instance.kv_events_silent = true;
    setKvState(instance, 3);
    instance.kv_check_log.warn(
        "instance serves requests but its KV event stream is silent: check the engine's "
        "--kv-events-config (publisher, topic, endpoint)",
        "instance", instance.config.id, "topic", instance.config.kv_events.topic,
        "routed_since_last_event", instance.routed_since_kv_event, "last_event_age_s",
        instance.last_kv_event != 0 ? nanosToSeconds(clock_.now() - instance.last_kv_event) : -1.0);
  }
}

void Router::kvEventsJson(const Instance& instance, boost::json::object* out) const {
  boost::json::object& o = *out;
  const KvEventsConfig& c = instance.config.kv_events;
  o["endpoint"] = c.endpoint;
  o["topic"] = c.topic;
  o["data_parallel_size"] = c.data_parallel_size;
  o["state"] = instance.kv_state;
  o["events_silent"] = instance.kv_events_silent;
  o["hits_unpredicted"] = instance.hits_unpredicted;
  o["last_event_age_s"] =
      instance.last_kv_event != 0 ? nanosToSeconds(clock_.now() - instance.last_kv_event) : -1.0;
  o["routed_since_last_event"] = instance.routed_since_kv_event;
  o["batches"] = instance.kv_batches->value();
  o["lost_batches"] = instance.kv_lost_batches;
  o["last_reset"] = instance.kv_last_reset;
  o["capacity_blocks"] = instance.kv_capacity_blocks;
  boost::json::array groups;
  boost::json::array seqs;
  for (const auto& s : instance.kv_streams) {
    groups.push_back(s.indexed_group ? boost::json::value(*s.indexed_group) : nullptr);
    seqs.push_back(s.last_seq);
  }
  o["indexed_group"] = std::move(groups);  // per data-parallel rank
  o["last_seq"] = std::move(seqs);
  boost::json::object tiers;
  tiers["GPU"] = core_->index().instanceBlocks(instance.slot);
  for (const auto& [medium, blocks] : core_->tiers(instance.slot).summary()) {
    tiers[medium] = blocks;
  }
  o["tier_blocks"] = std::move(tiers);
  // Lower-tier blocks whose chain could not be placed (never credited).
  o["tier_unresolved_blocks"] = core_->tiers(instance.slot).unresolved();
}

}  // namespace kvf::router
