#include "transport/core.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/status.h"
#include "transport/ucx_status.h"

namespace kvf::transport {
namespace {

constexpr uint64_t kWakeTag = 1;
constexpr uint64_t kWorkerTag = 2;
constexpr uint64_t kPidTag = 3;

// Maps our transport names to UCX_TLS; anything else must look like a UCX_TLS list.
// True when every transport in a UCX_TLS list is shared memory (no peer error handling there).
bool sharedMemoryOnly(const std::string& tls) {
  static const char* kShm[] = {"sm", "shm", "mm", "posix", "sysv", "cma", "knem", "xpmem", "self"};
  size_t start = 0;
  while (start <= tls.size()) {
    size_t end = tls.find(',', start);
    if (end == std::string::npos) end = tls.size();
    std::string token = tls.substr(start, end - start);
    if (!std::any_of(std::begin(kShm), std::end(kShm), [&](const char* s) { return token == s; })) {
      return false;
    }
    start = end + 1;
  }
  return true;
}

absl::StatusOr<std::string> resolveTls(const std::string& transports) {
  if (transports == "shm") return std::string("sm");
  if (transports == "tcp") return std::string("tcp");
  if (transports == "rdma") return std::string("rc,ud,sm,self");
  if (transports == "all") return std::string("all");
  if (transports.empty()) return absl::InvalidArgumentError("transports: must not be empty");
  for (char c : transports) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == ',' || c == '_' || c == '^')) {
      return absl::InvalidArgumentError(
          strCat("transports: '", transports,
                 "' is not shm, tcp, rdma, all or a UCX_TLS list (bad character '", c, "')"));
    }
  }
  return transports;
}

ucs_status_t noticeHandler(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param) {
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;  // never sent that way
  static_cast<Core*>(arg)->onNotice(header, header_length, data, length);
  return UCS_OK;
}

void endpointErrorHandler(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<Core*>(arg)->onEndpointError(ep, status);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::shared_ptr<Core>> Core::create(const TransportOptions& options) {
  if (options.default_deadline.count() <= 0) {
    return absl::InvalidArgumentError("default_deadline: must be > 0");
  }
  if (options.keepalive_interval.count() <= 0) {
    return absl::InvalidArgumentError("keepalive_interval: must be > 0");
  }
  if (options.busy_poll.count() < 0) return absl::InvalidArgumentError("busy_poll: must be >= 0");
  if (options.max_blocks_per_put == 0) {
    return absl::InvalidArgumentError("max_blocks_per_put: must be > 0");
  }
  if (options.idle_wakeup_ms < 1 || options.idle_wakeup_ms > 1000) {
    return absl::InvalidArgumentError("idle_wakeup_ms: must be in [1, 1000]");
  }
  if (options.max_endpoints == 0) return absl::InvalidArgumentError("max_endpoints: must be > 0");
  std::shared_ptr<Core> core(new Core(options));
  KVF_RETURN_IF_ERROR(core->init());
  core->start();
  return core;
}

absl::Status Core::init() {
  KVF_ASSIGN_OR_RETURN(tls_, resolveTls(options_.transports));
  shm_only_ = sharedMemoryOnly(tls_);
  ucp_config_t* config = nullptr;
  KVF_RETURN_IF_ERROR(ucsToStatus(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read"));
  std::unique_ptr<ucp_config_t, void (*)(ucp_config_t*)> config_guard(config, ucp_config_release);
  KVF_RETURN_IF_ERROR(ucsToStatus(ucp_config_modify(config, "TLS", tls_.c_str()), "UCX_TLS"));
  if (!options_.net_devices.empty()) {
    KVF_RETURN_IF_ERROR(ucsToStatus(
        ucp_config_modify(config, "NET_DEVICES", options_.net_devices.c_str()), "net_devices"));
  }
  std::string keepalive = strCat(options_.keepalive_interval.count(), "ms");
  KVF_RETURN_IF_ERROR(ucsToStatus(
      ucp_config_modify(config, "KEEPALIVE_INTERVAL", keepalive.c_str()), "keepalive_interval"));

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = options_.name.c_str();
  KVF_RETURN_IF_ERROR(ucsToStatus(ucp_init(&params, config, &context_), "ucp_init"));
  ucp_context_attr_t context_attr{};
  context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &context_attr) == UCS_OK) {
    cuda_memory_ = context_attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA);
  }

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  KVF_RETURN_IF_ERROR(
      ucsToStatus(ucp_worker_create(context_, &wparams, &worker_), "ucp_worker_create"));

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  KVF_RETURN_IF_ERROR(ucsToStatus(ucp_worker_query(worker_, &attr), "ucp_worker_query"));
  std::string ucp_address(static_cast<const char*>(static_cast<const void*>(attr.address)),
                          attr.address_length);
  ucp_worker_release_address(worker_, attr.address);
  identity_ = localIdentity(std::move(ucp_address));
  address_ = encodePeerAddress(identity_);

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kNoticeAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = noticeHandler;
  am.arg = this;
  KVF_RETURN_IF_ERROR(
      ucsToStatus(ucp_worker_set_am_recv_handler(worker_, &am), "ucp_worker_set_am_recv_handler"));

  KVF_RETURN_IF_ERROR(ucsToStatus(ucp_worker_get_efd(worker_, &worker_fd_), "ucp_worker_get_efd"));
  epoll_fd_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  event_fd_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (epoll_fd_.get() < 0 || event_fd_.get() < 0) {
    return absl::InternalError(strCat("epoll/eventfd: ", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, event_fd_.get(), &ev);
  ev.data.u64 = kWorkerTag;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, worker_fd_, &ev);
  log::info("transport context created", "name", options_.name, "tls", tls_, "devices",
            options_.net_devices.empty() ? "all" : options_.net_devices, "cuda_memory",
            cuda_memory_);
  return absl::OkStatus();
}

void Core::start() {
  thread_ = std::thread([this] { run(); });
}

Core::~Core() {
  shutdown();
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

bool Core::post(std::function<void()> fn) {
  if (stopped_.load()) return false;
  {
    std::lock_guard lock(queue_mu_);
    if (stopped_.load()) return false;
    queue_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof(one));
  return true;
}

bool Core::runCommands() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard lock(queue_mu_);
    batch.swap(queue_);
  }
  for (auto& fn : batch) fn();
  return !batch.empty();
}

void Core::run() {
  Nanos last_activity = clock_.now();
  Nanos next_housekeeping = 0;
  const Nanos spin = std::chrono::nanoseconds(options_.busy_poll).count();
  while (!stopping_.load()) {
    bool active = runCommands();
    while (ucp_worker_progress(worker_) != 0) active = true;
    Nanos now = clock_.now();
    if (active) last_activity = now;
    if (now >= next_housekeeping) {
      housekeeping(now, 0);
      next_housekeeping = now + kNanosPerMilli;
    }
    if (active || now - last_activity < spin) continue;
    if (busy_batches_ > 0) {
      // Puts in flight: keep progressing (UCX gives no wakeup when a full send FIFO drains),
      // yielding the core between polls.
      std::this_thread::yield();
      continue;
    }
    // Idle: sleep on the worker's event fd, the command eventfd and the peers' pidfds.
    ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;
    Nanos wake = std::min(nextDeadline(), now + options_.idle_wakeup_ms * kNanosPerMilli);
    int timeout_ms =
        static_cast<int>(std::max<Nanos>(0, (wake - now + kNanosPerMilli - 1) / kNanosPerMilli));
    housekeeping(now, timeout_ms);
  }
  // Shutdown: fail everything in flight, close endpoints, drop registrations.
  runCommands();
  std::vector<Peer*> peers;
  for (auto& [key, peer] : peers_) peers.push_back(peer.get());
  for (Peer* peer : peers) closePeer(peer, absl::CancelledError("transport context shut down"));
  for (auto& [id, landing] : landings_) {
    finishLanding(*landing, absl::CancelledError("transport context shut down"), true);
  }
  landings_.clear();
  Nanos give_up = clock_.now() + 200 * kNanosPerMilli;
  while (!closing_.empty() && clock_.now() < give_up) {
    ucp_worker_progress(worker_);
    reapClosing();
  }
  for (RegionImpl* region : regions_) region->unmapNow();
  regions_.clear();
  std::lock_guard lock(queue_mu_);
  stopped_.store(true);
  for (auto& fn : queue_) fn();  // commands posted during shutdown see stopped state
  queue_.clear();
}

void Core::housekeeping(Nanos now, int timeout_ms) {
  epoll_event events[16];
  int n = ::epoll_wait(epoll_fd_.get(), events, 16, timeout_ms);
  std::vector<int> exited;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kWakeTag) {
      uint64_t value;
      [[maybe_unused]] ssize_t r = ::read(event_fd_.get(), &value, sizeof(value));
    } else if (events[i].data.u64 >= kPidTag) {
      exited.push_back(static_cast<int>(events[i].data.u64 - kPidTag));
    }
  }
  if (!exited.empty()) {
    // What a peer sent before it exited (its last writes, its completion notice) is still in
    // our sockets / FIFOs: deliver it before declaring the peer gone.
    for (int i = 0; i < 100000 && ucp_worker_progress(worker_) != 0; ++i) {
    }
  }
  for (int fd : exited) {
    for (auto& [key, peer] : peers_) {
      if (peer->pidfd.get() != fd) continue;
      stats_.peer_failures.fetch_add(1);
      log::warn("transport peer process exited", "name", options_.name, "pid", peer->identity.pid);
      closePeer(peer.get(),
                absl::UnavailableError(strCat("peer process ", peer->identity.pid, " exited")),
                /*peer_exited=*/true);
      break;
    }
  }
  reapClosing();
  checkDeadlines(timeout_ms > 0 ? clock_.now() : now);
}

void Core::shutdown() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof(one));
  thread_.join();
}

absl::StatusOr<Peer*> Core::getPeer(const std::string& key, bool* created) {
  *created = false;
  auto it = peers_.find(key);
  if (it != peers_.end()) {
    it->second->last_used = clock_.now();
    return it->second.get();
  }
  if (peers_.size() >= options_.max_endpoints) evictIdlePeer();
  KVF_ASSIGN_OR_RETURN(PeerIdentity identity, decodePeerAddress(key));
  auto peer = std::make_unique<Peer>();
  peer->key = key;
  peer->identity = std::move(identity);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer->identity.ucp_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = endpointErrorHandler;
  params.err_handler.arg = this;
  ucs_status_t status = UCS_ERR_UNSUPPORTED;
  if (!shm_only_) status = ucp_ep_create(worker_, &params, &peer->ep);
  peer->peer_error_mode = status == UCS_OK;
  if (status != UCS_OK) {
    // Shared-memory transports lack peer failure support: fall back to process liveness.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucp_ep_create(worker_, &params, &peer->ep);
  }
  KVF_RETURN_IF_ERROR(ucsToStatus(status, "ucp_ep_create"));
  if (peer->identity.sameHostAs(identity_)) {
    peer->pidfd = UniqueFd(openPidFd(peer->identity.pid));
    if (peer->pidfd.get() < 0) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(peer->ep, &param);
      if (UCS_PTR_IS_PTR(req)) closing_.push_back(Closing{req, {}});
      return absl::UnavailableError(
          strCat("peer process ", peer->identity.pid, " is gone: ", std::strerror(errno)));
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kPidTag + static_cast<uint64_t>(peer->pidfd.get());
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, peer->pidfd.get(), &ev);
  }
  if (!peer->peer_error_mode && peer->pidfd.get() < 0) {
    static log::RateLimitedLog degraded;
    degraded.warn("transport endpoint without failure detection (deadlines only)", "name",
                  options_.name);
  }
  log::debug("transport endpoint created", "name", options_.name, "peer_pid", peer->identity.pid,
             "peer_error_mode", peer->peer_error_mode);
  stats_.endpoints_created.fetch_add(1);
  *created = true;
  Peer* raw = peer.get();
  peer->last_used = clock_.now();
  peers_.emplace(key, std::move(peer));
  stats_.endpoints_cached.store(static_cast<uint32_t>(peers_.size()));
  return raw;
}

absl::StatusOr<ucp_rkey_h> Core::getRkey(Peer& peer, const std::string& bytes, bool* created) {
  auto it = peer.rkeys.find(bytes);
  if (it != peer.rkeys.end()) return it->second;
  if (peer.rkeys.size() >= 1024) {
    return absl::ResourceExhaustedError("more than 1024 remote keys cached for one peer");
  }
  ucp_rkey_h rkey = nullptr;
  KVF_RETURN_IF_ERROR(
      ucsToStatus(ucp_ep_rkey_unpack(peer.ep, bytes.data(), &rkey), "ucp_ep_rkey_unpack"));
  peer.rkeys.emplace(bytes, rkey);
  *created = true;
  return rkey;
}

void Core::closePeer(Peer* peer, const absl::Status& status, bool peer_exited, bool graceful) {
  auto node = peers_.extract(peer->key);
  if (node.empty()) return;
  std::unique_ptr<Peer> owned = std::move(node.mapped());
  stats_.endpoints_cached.store(static_cast<uint32_t>(peers_.size()));
  if (owned->pidfd.get() >= 0) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, owned->pidfd.get(), 0);
  for (const auto& [raw, batch] : owned->batches) finishBatch(*batch, status);
  for (const auto& [raw, landing] : owned->landings) {
    // The endpoint to the sender is gone: no further write from it can land.
    finishLanding(*landing, status, true);
  }
  if (peer_exited && !owned->peer_error_mode) {
    // Shared memory without peer error mode: UCX keeps sends to the dead peer pending forever
    // (its FIFO is never drained again), so they can no longer read the source. Release it.
    for (auto& [raw, batch] : owned->batches) {
      if (!batch->source_held) continue;
      batch->source_held = false;
      std::static_pointer_cast<RegionImpl>(batch->request.source)->dropUser();
      batch->request.source.reset();
      batch->drained_.store(true, std::memory_order_release);
    }
  }
  Closing closing{nullptr, {}};
  for (auto& [bytes, rkey] : owned->rkeys) closing.rkeys.push_back(rkey);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // An idle endpoint to a live peer closes gracefully (flush); a failed one is forced.
  param.flags = graceful ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(owned->ep, &param);
  if (UCS_PTR_IS_PTR(req)) closing.request = req;
  closing_.push_back(std::move(closing));
  reapClosing();
}

void Core::evictIdlePeer() {
  Peer* victim = nullptr;
  for (auto& [key, peer] : peers_) {
    if (!peer->batches.empty() || !peer->landings.empty()) continue;
    if (!victim || peer->last_used < victim->last_used) victim = peer.get();
  }
  if (!victim) return;  // every endpoint is busy: the cache grows past the bound for now
  static log::RateLimitedLog evicting;
  evicting.warn("transport endpoint cache full, evicting the least recently used", "name",
                options_.name, "max_endpoints", options_.max_endpoints);
  closePeer(victim, absl::AbortedError("endpoint evicted"), false, /*graceful=*/true);
}

void Core::reapClosing() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (it->request && ucp_request_check_status(it->request) == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    if (it->request) ucp_request_free(it->request);
    for (ucp_rkey_h rkey : it->rkeys) ucp_rkey_destroy(rkey);
    it = closing_.erase(it);
  }
}

void Core::onEndpointError(ucp_ep_h ep, ucs_status_t status) {
  for (auto& [key, peer] : peers_) {
    if (peer->ep != ep) continue;
    stats_.peer_failures.fetch_add(1);
    log::warn("transport endpoint failed", "name", options_.name, "peer_pid", peer->identity.pid,
              "error", ucs_status_string(status));
    // Whatever UCX calls it (reset, timeout, unreachable), the peer is gone for this batch.
    closePeer(peer.get(), absl::UnavailableError(strCat("endpoint to peer ", peer->identity.pid,
                                                        " failed: ", ucs_status_string(status))));
    return;
  }
}

absl::Status Core::connect(const std::string& peer_address) {
  return call<absl::Status>([&]() -> absl::Status {
    bool created = false;
    return getPeer(peer_address, &created).status();
  });
}

absl::Status Core::disconnect(const std::string& peer_address) {
  return call<absl::Status>([&]() -> absl::Status {
    auto it = peers_.find(peer_address);
    if (it == peers_.end()) return absl::OkStatus();
    Peer* peer = it->second.get();
    if (!peer->landings.empty()) {
      // Closing our endpoint does not stop the peer's writes into our memory.
      return absl::FailedPreconditionError(
          strCat(peer->landings.size(), " landing(s) from this peer are unresolved"));
    }
    // Forced only where peer error mode makes that defined; flushed on shared memory.
    closePeer(peer, absl::AbortedError("endpoint closed by disconnect()"), false,
              /*graceful=*/!peer->peer_error_mode);
    return absl::OkStatus();
  });
}

TransportStats Core::stats() const {
  TransportStats s;
  s.puts_ok = stats_.puts_ok.load();
  s.puts_failed = stats_.puts_failed.load();
  s.bytes_put = stats_.bytes_put.load();
  s.landings_ok = stats_.landings_ok.load();
  s.landings_failed = stats_.landings_failed.load();
  s.gets_ok = stats_.gets_ok.load();
  s.gets_failed = stats_.gets_failed.load();
  s.bytes_got = stats_.bytes_got.load();
  s.checksum_mismatches = stats_.checksum_mismatches.load();
  s.peer_failures = stats_.peer_failures.load();
  s.endpoints_created = stats_.endpoints_created.load();
  s.puts_refused = stats_.puts_refused.load();
  s.notices_refused = stats_.notices_refused.load();
  s.gets_refused = stats_.gets_refused.load();
  s.endpoints_cached = stats_.endpoints_cached.load();
  return s;
}

}  // namespace kvf::transport
