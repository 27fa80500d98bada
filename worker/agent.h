// The worker agent: what kvfabric adds inside an engine so that engines move KV to each other.
// It runs the worker control server (GET /kv/info, POST /kv/push, bearer token), serves pushes
// as the *holder* (pins the leading run a peer asks for, puts it into the peer's landing memory,
// unpins), fetches as the *receiver* (asks a holder to push into landing blocks the engine
// reserved, watches the landing, reports the outcome, releases quarantined landing blocks once
// no late write can reach them) and keeps remote-decode leases. It reaches the engine only
// through an EngineAdapter and moves bytes only through a transport::TransportContext (UCX, or
// a test double). docs/protocols.md ("KV push") describes the protocol, docs/extending.md how to
// put the agent in another engine.
//
// Threads: the agent's own work (HTTP, transport completions, timers) runs on the io_context
// given to create(), which exactly one thread runs (the *agent thread*; the emulated engine
// shares its HTTP thread). Engine state is touched only on the engine thread, through
// EngineAdapter::post. Methods say which thread may call them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "absl/status/statusor.h"
#include "common/http.h"
#include "common/metrics.h"
#include "protocol/push.h"
#include "transport/transport.h"
#include "worker/engine_adapter.h"
#include "worker/lease_table.h"

namespace kvf::worker {

struct AgentOptions {
  std::string instance_id = "worker";  // in /kv/info, logs and transport metrics
  std::string host = "127.0.0.1";      // control server address
  uint16_t port = 0;                   // 0 picks a free port
  // Bearer token required on /kv/* and sent to peers. create() refuses an empty token unless
  // `insecure` is set.
  std::string token;
  bool insecure = false;           // allow an empty token: no authentication at all (test only)
  size_t max_push_blocks = 65536;  // blocks per push, both directions
  // The URL peers reach this control server at (a push names it so that the holder can claim
  // the landing here). Empty: url().
  std::string advertise_url;
  // Worker URLs of the cluster's engines, from the router's registry. Non-empty: this agent
  // pushes only to receivers whose URL is listed (a push naming any other is refused before
  // any write). Empty: any receiver that grants the landing on its own worker API.
  std::vector<std::string> peers;
  // Connect timeout towards a holder (its deadline bounds the rest of a fetch).
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds lease_check_interval{50};
  metrics::Labels metric_labels;  // added to every metric the agent registers
  // NixlConnector dialect: the engine id a holder reports (P's remote_engine_id).
  std::string engine_id;
  // Pushes served from the engine's disk tier read the blocks into a transport-registered bounce
  // region of this many bytes (shared by concurrent pushes; disk blocks that find no room are
  // answered missing). 0: no push is served from disk. Host-memory blocks need none.
  uint64_t push_bounce_bytes = 64ull << 20;
  // TEST ONLY holder-side faults: "" (none), "corrupt" (push damaged bytes with the checksums of
  // the good ones), "corrupt_content" (damaged bytes, matching checksums), "stall" (wait
  // fault_stall_ms before pushing).
  std::string fault;
  int64_t fault_stall_ms = 3000;
};

// A fetch in vLLM's NixlConnector dialect: the reader asks the holder's side channel (`source`)
// for its blocks' metadata (extending the holder's lease), reads them with one-sided gets, and
// notifies the holder, which then frees them.
struct NixlRead {
  std::string remote_request_id;           // the holder's lease
  std::string remote_engine_id;            // must match the holder's engine id
  std::vector<uint64_t> remote_block_ids;  // the holder's blocks of the prompt, in order
};

// One fetch: pull `hashes` from the holder at `source` into the engine's landing `blocks`.
struct RemoteKvFetch {
  std::string id;        // the engine's name for it, echoed in RemoteKvOutcome
  std::string source;    // the holder's worker URL, http://host:port
  std::string lease_id;  // optional: the holder releases this lease once it pushed
  std::vector<BlockHash> hashes;
  std::vector<BlockIndex> blocks;            // landing blocks, one per hash, reserved by the engine
  std::chrono::milliseconds deadline{1000};  // for the whole fetch, from fetch()
  std::optional<NixlRead> nixl;              // set: read in the NIXL dialect, not push
};

// InvalidArgument ("source: ...") unless `url` is http://host:port, what RemoteKvFetch::source
// takes.
absl::Status validateWorkerUrl(std::string_view url);

class WorkerAgent {
 public:
  // Registers the adapter's payload region with `transport` (which the agent then owns) and
  // binds the control server; nothing is served before start(). `adapter` must outlive the
  // agent; `registry` (may be null) receives the agent's and the transport's metrics and must
  // outlive it too. Call from the agent thread or before it runs.
  static absl::StatusOr<std::unique_ptr<WorkerAgent>> create(
      asio::io_context& ioc, EngineAdapter& adapter,
      std::unique_ptr<transport::TransportContext> transport, AgentOptions options,
      metrics::Registry* registry);
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  // Agent thread (or before it runs): starts serving and the lease expiry timer.
  void start();
  // Agent thread: stops serving; fetches in flight end with their deadlines.
  void stop();

  uint16_t port() const;
  // http://host:port of the control server (127.0.0.1 when bound to 0.0.0.0), or
  // AgentOptions::advertise_url when set.
  std::string url() const;
  transport::TransportContext& transport();

  // Any thread: starts a fetch; its outcome reaches the engine through the adapter.
  void fetch(RemoteKvFetch fetch);

  // Engine thread. Pins the leading cached run of `hashes` and keeps it pinned under `lease_id`
  // until a push names the lease or `ttl` passes on the engine clock; returns the pinned run.
  std::vector<BlockHash> holdLease(const std::string& lease_id, std::span<const BlockHash> hashes,
                                   Nanos ttl);
  // Engine thread: takes over a lease whose blocks the engine pinned already.
  void adoptLease(const std::string& lease_id, Lease lease);
  // Engine thread: drops the lease (unpins its blocks) when nobody will read it: its request
  // was aborted after it finished, before its answer went out. A no-op for an unknown id.
  void releaseLease(const std::string& lease_id);
  // Any thread: leases held now, and the blocks they pin.
  size_t leaseCount() const;
  size_t leasedBlocks() const;
  // Any thread: whether a request head carries the cluster's worker token (always true for an
  // insecure agent). Lets the engine guard its own peer-only endpoints with the same token.
  bool authorized(const http::Request& head) const;

  struct Impl;

 private:
  explicit WorkerAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvf::worker
