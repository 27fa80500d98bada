// The HTTP side's part in remote KV (HTTP thread): kv_transfer_params of an API request become
// the core's RemoteKvSpec or remote-decode lease, a fetch the core started goes to the worker
// agent with its deadline, and the agent's outcome comes back as the request's
// kv_transfer_result. The push itself is the agent's (worker/agent.h).
#include <boost/json.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_server_impl.h"

namespace kvf::engine {

using detail::kMs;
namespace bj = boost::json;

int64_t EngineHttpSide::promptBlocks(const RequestSpec& spec) const {
  return static_cast<int64_t>(spec.prompt.size()) /
         std::max<int64_t>(1, shared_.config.cache.block_size);
}

void EngineHttpSide::setTransferAuth(std::string key) {
  if (key.empty()) {
    transfer_auth_.reset();
    return;
  }
  protocol::TransferAuthOptions o;
  o.freshness_ms = shared_.config.worker.transfer_auth_window_ms;
  transfer_auth_.emplace(std::move(key), o);
}

absl::Status EngineHttpSide::authenticateKvTransfer(const boost::json::value& raw,
                                                    const http::Request& req) {
  if (!transfer_auth_) return absl::OkStatus();  // insecure: refused at startup otherwise
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  absl::Status st = transfer_auth_->verify(req.header(protocol::kTransferAuthHeader), raw,
                                           req.header("x-request-id"), now_ms);
  if (!st.ok()) {
    shared_.m.kv_transfer_refused->inc();
    refused_log_.warn("kv_transfer_params refused", "reason", std::string(st.message()));
  }
  return st;
}

absl::Status EngineHttpSide::applyKvTransfer(const KvTransferParams& k,
                                             const boost::json::value& raw,
                                             const http::Request& req, RequestSpec& spec) {
  const WorkerConfig& wc = shared_.config.worker;
  if (agent_ == nullptr) {
    return absl::InvalidArgumentError(
        "kv_transfer_params: this engine has no worker control server (--worker_port)");
  }
  KVF_RETURN_IF_ERROR(authenticateKvTransfer(raw, req));
  if (k.do_remote_decode) {
    int64_t lease_ms = k.lease_ms > 0 ? k.lease_ms : wc.default_lease_ms;
    if (lease_ms > wc.max_lease_ms) {
      return absl::InvalidArgumentError(
          strCat("kv_transfer_params.lease_ms: at most ", wc.max_lease_ms));
    }
    // Leases pin KV for a peer: bounded in number and blocks, counting those being prefilled.
    const int64_t blocks = promptBlocks(spec);
    const auto max_blocks = static_cast<int64_t>(
        wc.max_leased_fraction * static_cast<double>(shared_.config.cache.num_gpu_blocks));
    const int64_t held_blocks = static_cast<int64_t>(agent_->leasedBlocks());
    if (static_cast<int64_t>(agent_->leaseCount()) + pending_lease_requests_ >= wc.max_leases ||
        held_blocks + pending_lease_blocks_ + blocks > max_blocks) {
      shared_.m.leases_refused->inc();
      return absl::ResourceExhaustedError(
          strCat("kv_transfer_params.do_remote_decode: lease capacity in use (at most ",
                 wc.max_leases, " leases and ", max_blocks, " blocks)"));
    }

    // The lease runs on the engine clock (time_scale x wall time).
    spec.remote_decode_lease =
        static_cast<Nanos>(static_cast<double>(lease_ms * kMs) * shared_.config.time_scale);
    spec.remote_decode_lease_cap =
        static_cast<Nanos>(static_cast<double>(wc.max_lease_ms * kMs) * shared_.config.time_scale);
    spec.sampling.max_tokens = 1;  // prefill and one token; decode happens elsewhere
    spec.sampling.min_tokens = 0;
    return absl::OkStatus();
  }
  if (absl::Status url = worker::validateWorkerUrl(k.source); !url.ok()) {
    return absl::InvalidArgumentError(strCat("kv_transfer_params.", std::string(url.message())));
  }
  RemoteKvSpec remote;
  remote.source = k.source;
  if (k.block_hashes) remote.block_hashes = *k.block_hashes;
  spec.remote_kv = std::move(remote);
  return absl::OkStatus();
}

boost::json::value EngineHttpSide::leaseParams(const detail::Pending& p) const {
  KvTransferParams params;
  params.source = agent_ != nullptr ? agent_->url() : std::string();
  params.block_hashes = p.lease_block_hashes;
  params.lease_id = *p.lease_id;
  return protocol::kvTransferParamsJson(params);
}

std::optional<bj::value> EngineHttpSide::holderParams(const detail::Pending& p) const {
  if (!nixlDialect()) {
    if (!p.lease_id) return std::nullopt;
    return leaseParams(p);
  }
  // vLLM's P keeps the blocks only for a request that finished; otherwise it answers null.
  if (!p.lease_id || agent_ == nullptr) return bj::value(nullptr);
  const WorkerConfig& wc = shared_.config.worker;
  protocol::NixlRemoteParams n;
  n.remote_engine_id = wc.engine_id.empty() ? shared_.config.instance_id : wc.engine_id;
  n.remote_block_ids.emplace_back(p.lease_blocks.begin(), p.lease_blocks.end());
  n.remote_request_id = *p.lease_id;
  n.remote_host = wc.host == "0.0.0.0" ? "127.0.0.1" : wc.host;  // the side channel
  n.remote_port = agent_->port();
  n.tp_size = 1;
  n.remote_num_tokens = p.prompt_tokens;
  return bj::value(protocol::nixlRemoteParamsJson(n));
}

absl::Status EngineHttpSide::applyNixlDecodeLeg(const bj::value& params, const http::Request& req,
                                                RequestSpec& spec, detail::FetchOptions* fetch,
                                                std::string* invalid) {
  if (agent_ == nullptr) {
    return absl::InvalidArgumentError(
        "kv_transfer_params: this engine has no worker control server (--worker_port)");
  }
  // Before anything in the params is looked at: remote_host and remote_port decide where this
  // engine sends its worker token, so only the router may name them.
  KVF_RETURN_IF_ERROR(authenticateKvTransfer(params, req));
  protocol::KvTransferLimits kl;
  kl.max_block_hashes = static_cast<size_t>(limits_.max_model_len);
  absl::StatusOr<protocol::NixlRemoteParams> n = protocol::parseNixlRemoteParams(params, kl);
  std::string source;
  if (n.ok()) {
    source = strCat("http://", n->remote_host, ":", n->remote_port);
    if (absl::Status url = worker::validateWorkerUrl(source); !url.ok()) n = url;
  }
  if (n.ok() && (n->remote_block_ids.empty() || n->remote_block_ids[0].empty())) {
    n = absl::InvalidArgumentError("kv_transfer_params.remote_block_ids: no blocks");
  }
  if (!n.ok()) {
    // vLLM logs "Got invalid KVTransferParams" and prefills locally.
    static log::RateLimitedLog invalid_log;
    invalid_log.warn("nixl decode leg with invalid kv_transfer_params: prefilling locally", "error",
                     std::string(n.status().message()));
    *invalid = std::string(n.status().message());
    return absl::OkStatus();
  }
  RemoteKvSpec remote;
  remote.source = source;
  spec.remote_kv = std::move(remote);
  fetch->source = std::move(source);
  fetch->nixl = worker::NixlRead{n->remote_request_id, n->remote_engine_id,
                                 std::move(n->remote_block_ids[0])};
  return absl::OkStatus();
}

void EngineHttpSide::startFetch(RemoteKvFetch f) {
  detail::FetchOptions opt;
  if (auto it = fetch_options_.find(f.id); it != fetch_options_.end()) {
    opt = std::move(it->second);
    fetch_options_.erase(it);
  } else {
    opt.source = f.source;
  }
  const WorkerConfig& wc = shared_.config.worker;
  const auto n = static_cast<int64_t>(f.hashes.size());
  // By default the modelled transfer of the whole run plus a margin, capped.
  Nanos deadline = opt.deadline_ms * kMs;
  if (deadline <= 0) {
    const Nanos modelled =
        shared_.wallDuration(core_.timing().transferDuration(n * shared_.config.cache.block_size));
    deadline = std::min(wc.push_deadline_cap_ms * kMs, modelled + wc.push_deadline_margin_ms * kMs);
  }
  worker::RemoteKvFetch fetch;
  fetch.id = std::move(f.id);
  fetch.source = std::move(opt.source);
  fetch.lease_id = std::move(opt.lease_id);
  fetch.nixl = std::move(opt.nixl);
  fetch.hashes = std::move(f.hashes);
  fetch.blocks = std::move(f.blocks);
  fetch.deadline = std::chrono::milliseconds(std::max<Nanos>(1, deadline / kMs));
  agent_->fetch(std::move(fetch));
}

void EngineHttpSide::setTransferResult(const std::string& id, KvTransferResult result) {
  if (auto it = pending_.find(id); it != pending_.end()) {
    it->second->kv_transfer_result = std::move(result);
  }
}

}  // namespace kvf::engine
