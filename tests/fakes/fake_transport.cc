#include "tests/fakes/fake_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/status.h"
#include "common/strings.h"

namespace kvf::fakes {
namespace kt = kvf::transport;
using Clock = std::chrono::steady_clock;

namespace {

// A value set once, waited on by callers, completed on the fabric thread.
template <class T>
class Completion {
 public:
  explicit Completion(T pending) : value_(std::move(pending)) {}
  bool done() const {
    std::lock_guard lock(mu_);
    return done_;
  }
  bool waitFor(std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }
  T value() const {
    std::lock_guard lock(mu_);
    return value_;
  }
  bool complete(T value) {
    {
      std::lock_guard lock(mu_);
      if (done_) return false;
      value_ = std::move(value);
      done_ = true;
    }
    cv_.notify_all();
    return true;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  T value_;
};

}  // namespace

class FakeRegion;
class FakeLanding;
class FakePut;

struct FakeFabric::State : std::enable_shared_from_this<FakeFabric::State> {
  mutable std::mutex mu;
  std::condition_variable cv;
  std::multimap<Clock::time_point, std::function<void()>> timers;
  std::thread thread;
  bool stopping = false;
  int busy = 0;  // pending writes and notices
  mutable std::condition_variable idle_cv;

  uint64_t ops = 0;
  uint64_t fault_at = 0;
  Fault fault = Fault::kFail;
  std::chrono::milliseconds delay{0};
  std::vector<std::string> log;
  std::set<std::string> names;  // contexts created
  std::set<std::string> dead;
  uint64_t bytes_written = 0;
  uint64_t next_id = 1;
  std::map<std::string, std::weak_ptr<FakeRegion>> regions;   // by rkey
  std::map<uint64_t, std::shared_ptr<FakeLanding>> landings;  // unresolved, by id

  // Counts one operation of `kind` by `who`; the fault planned for it, if any.
  std::optional<std::pair<Fault, std::chrono::milliseconds>> op(const std::string& kind,
                                                                const std::string& who) {
    std::lock_guard lock(mu);
    ++ops;
    log.push_back(kind + "@" + who);
    if (ops != fault_at) return std::nullopt;
    return std::make_pair(fault, delay);
  }
  // Runs `fn` on the fabric thread at `when`; `counts_busy`: a write or notice (waitIdle).
  void at(Clock::time_point when, std::function<void()> fn, bool counts_busy = false) {
    std::function<void()> task = std::move(fn);
    if (counts_busy) {
      task = [this, inner = std::move(task)] {
        inner();
        std::lock_guard l(mu);
        if (--busy == 0) idle_cv.notify_all();
      };
    }
    {
      std::lock_guard lock(mu);
      if (counts_busy) ++busy;
      timers.emplace(when, std::move(task));
    }
    cv.notify_all();
  }
  void soon(std::function<void()> fn) { at(Clock::now(), std::move(fn)); }
  bool isDead(const std::string& name) {
    std::lock_guard lock(mu);
    return dead.contains(name);
  }
  void run() {
    std::unique_lock lock(mu);
    while (!stopping) {
      if (timers.empty()) {
        cv.wait(lock);
        continue;
      }
      auto first = timers.begin();
      if (first->first > Clock::now()) {
        cv.wait_until(lock, first->first);
        continue;
      }
      std::function<void()> fn = std::move(first->second);
      timers.erase(first);
      lock.unlock();
      fn();
      lock.lock();
    }
  }
};

static std::string nameOf(const std::string& address) {
  return address.starts_with("fake:") ? address.substr(5) : address;
}

class FakeRegion final : public kt::MemoryRegion {
 public:
  FakeRegion(std::shared_ptr<FakeFabric::State> s, std::string owner, std::byte* ptr,
             uint64_t length, std::unique_ptr<std::byte[]> owned)
      : s_(std::move(s)),
        owner_(std::move(owner)),
        ptr_(ptr),
        length_(length),
        owned_(std::move(owned)),
        rkey_(strCat("rkey:", owner_, ":", reinterpret_cast<uintptr_t>(ptr))) {}
  void* data() const override { return ptr_; }
  uint64_t base() const override { return reinterpret_cast<uint64_t>(ptr_); }
  uint64_t length() const override { return length_; }
  const std::string& packedRkey() const override { return rkey_; }
  uint32_t activeUsers() const override { return users_.load(); }
  void release(std::function<void()> done) override {
    std::lock_guard lock(mu_);
    releasing_ = true;
    done_ = std::move(done);
    if (users_.load() == 0) fireRelease();
  }
  bool contains(uint64_t addr, uint64_t len) const {
    return addr >= base() && len <= length_ && addr - base() <= length_ - len;
  }
  bool releasing() const {
    std::lock_guard lock(mu_);
    return releasing_;
  }
  const std::string& owner() const { return owner_; }
  void addUser() { users_.fetch_add(1); }
  void dropUser() {
    std::lock_guard lock(mu_);
    if (users_.fetch_sub(1) == 1 && releasing_) fireRelease();
  }

 private:
  void fireRelease() {
    if (!done_) return;
    s_->soon(std::exchange(done_, nullptr));
  }
  std::shared_ptr<FakeFabric::State> s_;
  std::string owner_;
  std::byte* ptr_;
  uint64_t length_;
  std::unique_ptr<std::byte[]> owned_;
  std::string rkey_;
  std::atomic<uint32_t> users_{0};
  mutable std::mutex mu_;
  bool releasing_ = false;
  std::function<void()> done_;
};

class FakeLanding final : public kt::Landing, public std::enable_shared_from_this<FakeLanding> {
 public:
  FakeLanding(std::shared_ptr<FakeFabric::State> s, uint64_t id, std::shared_ptr<FakeRegion> r,
              kt::LandingSpec spec, kt::LandingCallback done)
      : s_(std::move(s)),
        id_(id),
        region_(std::move(r)),
        spec_(std::move(spec)),
        callback_(std::move(done)) {}
  uint64_t id() const override { return id_; }
  bool done() const override { return completion_.done(); }
  absl::Status check() const override { return completion_.value(); }
  bool waitFor(std::chrono::milliseconds timeout) const override {
    return completion_.waitFor(timeout);
  }
  bool resolved() const override { return resolved_.load(); }
  uint32_t landedBlocks() const override { return landed_.load(); }
  void cancel() override {
    s_->soon([self = shared_from_this()] {
      bool gone = self->s_->isDead(nameOf(self->spec_.sender_address));
      self->finish(absl::CancelledError("landing cancelled by the receiver"), gone);
    });
  }
  void dismiss() override {
    s_->soon([self = shared_from_this()] {
      self->finish(absl::CancelledError("landing dismissed: the sender posted no put"), true);
    });
  }

  // Fabric thread. Resolves before completing, so a woken caller sees resolved().
  void finish(absl::Status status, bool resolve) {
    if (resolve && !resolved_.exchange(true)) {
      {
        std::lock_guard lock(s_->mu);
        s_->landings.erase(id_);
      }
      region_->dropUser();
    }
    if (completion_.complete(status) && callback_) std::exchange(callback_, nullptr)(status);
  }
  // Fabric thread: the sender's completion notice for `blocks` with `sums` (one per block, or
  // none), checked as every backend checks it.
  // `prefix`: blocks of earlier puts to this landing (PutRequest::notice_prefix), listed first.
  void notice(const std::vector<kt::NoticeBlock>& prefix, const std::vector<kt::BlockCopy>& blocks,
              const std::vector<uint64_t>& sums) {
    std::vector<kt::NoticeBlock> noticed = prefix;
    for (size_t i = 0; i < blocks.size(); ++i) {
      noticed.push_back({blocks[i].remote_addr, blocks[i].length, i < sums.size() ? sums[i] : 0});
    }
    bool mismatch = false;
    absl::Status status = kt::verifyNotice(spec_, noticed, sums.size() == blocks.size(),
                                           region_->data(), region_->base(), &mismatch);
    if (status.ok()) landed_.store(static_cast<uint32_t>(noticed.size()));
    finish(status, true);
  }
  const kt::LandingSpec& spec() const { return spec_; }

 private:
  std::shared_ptr<FakeFabric::State> s_;
  uint64_t id_;
  std::shared_ptr<FakeRegion> region_;
  kt::LandingSpec spec_;
  kt::LandingCallback callback_;
  std::atomic<bool> resolved_{false};
  std::atomic<uint32_t> landed_{0};
  Completion<absl::Status> completion_{absl::UnavailableError("pending")};
};

class FakePut final : public kt::PutHandle, public std::enable_shared_from_this<FakePut> {
 public:
  FakePut(std::shared_ptr<FakeFabric::State> s, kt::PutCallback done)
      : s_(std::move(s)), callback_(std::move(done)) {}
  bool done() const override { return completion_.done(); }
  absl::Status check() const override { return completion_.value().status(); }
  bool waitFor(std::chrono::milliseconds timeout) const override {
    return completion_.waitFor(timeout);
  }
  absl::StatusOr<kt::PutResult> result() const override { return completion_.value(); }
  void cancel() override {
    s_->soon([self = shared_from_this()] {
      self->finish(absl::CancelledError("put cancelled by the caller"));
    });
  }
  // Fabric thread; the first outcome wins.
  void finish(absl::StatusOr<kt::PutResult> result) {
    if (completion_.complete(result) && callback_) {
      std::exchange(callback_, nullptr)(std::move(result));
    }
  }

 private:
  std::shared_ptr<FakeFabric::State> s_;
  kt::PutCallback callback_;
  Completion<absl::StatusOr<kt::PutResult>> completion_{absl::UnavailableError("pending")};
};

namespace {

class FakeContext final : public kt::TransportContext {
 public:
  FakeContext(std::shared_ptr<FakeFabric::State> s, std::string name)
      : s_(std::move(s)), name_(std::move(name)), address_("fake:" + name_) {}
  std::string transportsInUse() const override { return "fake"; }
  bool supportsCudaMemory() const override { return false; }
  const std::string& workerAddress() const override { return address_; }

  absl::StatusOr<std::shared_ptr<kt::MemoryRegion>> registerMemory(void* ptr,
                                                                   uint64_t length) override {
    if (ptr == nullptr || length == 0) return absl::InvalidArgumentError("empty region");
    if (auto f = s_->op("register", name_); f && f->first == FakeFabric::Fault::kFail) {
      return absl::UnavailableError("injected: register failed");
    }
    return addRegion(static_cast<std::byte*>(ptr), length, nullptr);
  }
  absl::StatusOr<std::shared_ptr<kt::MemoryRegion>> allocateMemory(uint64_t length) override {
    if (length == 0) return absl::InvalidArgumentError("empty region");
    if (auto f = s_->op("register", name_); f && f->first == FakeFabric::Fault::kFail) {
      return absl::UnavailableError("injected: allocate failed");
    }
    auto owned = std::make_unique<std::byte[]>(length);
    std::byte* ptr = owned.get();
    return addRegion(ptr, length, std::move(owned));
  }
  absl::Status connect(const std::string& peer) override { return reachable(peer); }
  absl::Status disconnect(const std::string&) override { return absl::OkStatus(); }
  kt::TransportStats stats() const override { return {}; }

  absl::StatusOr<std::shared_ptr<kt::PutHandle>> postPut(kt::PutRequest r,
                                                         kt::PutCallback done) override {
    auto source = std::dynamic_pointer_cast<FakeRegion>(r.source);
    if (!source || source->owner() != name_) {
      return absl::InvalidArgumentError("source: not a region registered with this context");
    }
    if (r.blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
    for (const auto& b : r.blocks) {
      if (b.length == 0 || !source->contains(source->base() + b.local_offset, b.length)) {
        return absl::OutOfRangeError("blocks: local range outside the source region");
      }
    }
    if (r.checksums == kt::ChecksumMode::kProvided &&
        r.provided_checksums.size() != r.blocks.size()) {
      return absl::InvalidArgumentError("provided_checksums: one per block");
    }
    if (auto f = s_->op("post", name_); f && f->first == FakeFabric::Fault::kFail) {
      return absl::UnavailableError("injected: post failed");
    }
    kt::PutResult partial;
    partial.blocks = static_cast<uint32_t>(r.blocks.size());
    partial.operations = partial.blocks;
    for (const auto& b : r.blocks) partial.bytes += b.length;
    if (r.checksums == kt::ChecksumMode::kCompute) {
      for (const auto& b : r.blocks) {
        partial.checksums.push_back(
            kt::blockChecksum(static_cast<std::byte*>(source->data()) + b.local_offset, b.length));
      }
    } else if (r.checksums == kt::ChecksumMode::kProvided) {
      partial.checksums = r.provided_checksums;
    }
    auto put = std::make_shared<FakePut>(s_, std::move(done));
    auto deadline = r.deadline.count() > 0 ? r.deadline : std::chrono::milliseconds(1000);
    s_->at(Clock::now() + deadline, [put] {
      put->finish(absl::DeadlineExceededError("put did not complete within its deadline"));
    });
    source->addUser();
    auto shared = std::make_shared<kt::PutRequest>(std::move(r));
    s_->at(
        Clock::now(),
        [s = s_, name = name_, put, shared, partial] {
          write(s, name, put, shared, partial, true);
        },
        true);
    return std::shared_ptr<kt::PutHandle>(put);
  }

  absl::StatusOr<std::shared_ptr<kt::Landing>> expectPut(
      const std::shared_ptr<kt::MemoryRegion>& region, kt::LandingSpec spec,
      kt::LandingCallback done) override {
    auto target = std::dynamic_pointer_cast<FakeRegion>(region);
    if (!target || target->owner() != name_) {
      return absl::InvalidArgumentError("region: not a region registered with this context");
    }
    if (target->releasing()) return absl::FailedPreconditionError("region is being released");
    if (spec.blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
    for (const auto& b : spec.blocks) {
      if (b.length == 0 || !target->contains(b.remote_addr, b.length)) {
        return absl::OutOfRangeError("blocks: outside the region");
      }
    }
    KVF_RETURN_IF_ERROR(reachable(spec.sender_address));
    if (auto f = s_->op("expect", name_); f && f->first == FakeFabric::Fault::kFail) {
      return absl::UnavailableError("injected: expect failed");
    }
    auto deadline = spec.deadline.count() > 0 ? spec.deadline : std::chrono::milliseconds(1000);
    uint64_t id;
    {
      std::lock_guard lock(s_->mu);
      id = s_->next_id++;
    }
    auto landing = std::make_shared<FakeLanding>(s_, id, target, std::move(spec), std::move(done));
    target->addUser();
    {
      std::lock_guard lock(s_->mu);
      s_->landings.emplace(id, landing);
    }
    s_->at(Clock::now() + deadline, [s = s_, landing] {
      // The sender may still write: quarantined (unresolved) unless it is gone.
      bool gone = s->isDead(nameOf(landing->spec().sender_address));
      landing->finish(absl::DeadlineExceededError("no completion notice from the sender in time"),
                      gone);
    });
    return std::shared_ptr<kt::Landing>(landing);
  }

 private:
  absl::Status reachable(const std::string& peer) {
    std::lock_guard lock(s_->mu);
    std::string name = nameOf(peer);
    if (!s_->names.contains(name)) return absl::UnavailableError("unknown peer " + peer);
    if (s_->dead.contains(name)) return absl::UnavailableError("peer process " + name + " exited");
    return absl::OkStatus();
  }

  std::shared_ptr<kt::MemoryRegion> addRegion(std::byte* ptr, uint64_t length,
                                              std::unique_ptr<std::byte[]> owned) {
    auto region = std::make_shared<FakeRegion>(s_, name_, ptr, length, std::move(owned));
    std::lock_guard lock(s_->mu);
    s_->regions[region->packedRkey()] = region;
    return region;
  }

  // Fabric thread: the put's bytes reach the peer (counted once: `count`). Static: the
  // context may be gone by then, as a process's puts drain after it let go of them.
  static void write(std::shared_ptr<FakeFabric::State> s, std::string name,
                    std::shared_ptr<FakePut> put, std::shared_ptr<kt::PutRequest> r,
                    kt::PutResult partial, bool count) {
    auto source = std::static_pointer_cast<FakeRegion>(r->source);
    bool corrupt = false;
    if (count) {
      if (auto f = s->op("write", name)) {
        if (f->first == FakeFabric::Fault::kFail) {
          source->dropUser();
          put->finish(absl::UnavailableError("injected: put failed"));
          return;
        }
        if (f->first == FakeFabric::Fault::kDelay) {
          s->at(
              Clock::now() + f->second,
              [s, name, put, r, partial] { write(s, name, put, r, partial, false); }, true);
          return;
        }
        corrupt = f->first == FakeFabric::Fault::kCorrupt;
      }
    }
    if (s->isDead(name)) {  // the sender died with the put in flight
      source->dropUser();
      return;
    }
    std::shared_ptr<FakeRegion> target;
    {
      std::lock_guard lock(s->mu);
      auto it = s->regions.find(r->peer_rkey);
      if (it != s->regions.end()) target = it->second.lock();
    }
    absl::Status bad;
    if (!target || target->owner() != nameOf(r->peer_address) || s->isDead(target->owner())) {
      bad = absl::UnavailableError("endpoint to the peer failed");
    }
    for (const auto& b : r->blocks) {
      if (bad.ok() && !target->contains(b.remote_addr, b.length)) {
        bad = absl::OutOfRangeError("remote range outside the peer's region");
      }
    }
    if (!bad.ok()) {
      source->dropUser();
      put->finish(bad);
      return;
    }
    const auto* from = static_cast<const std::byte*>(source->data());
    uint64_t bytes = 0;
    for (const auto& b : r->blocks) {
      std::memcpy(reinterpret_cast<void*>(b.remote_addr), from + b.local_offset, b.length);
      bytes += b.length;
    }
    if (corrupt) reinterpret_cast<std::byte*>(r->blocks[0].remote_addr)[0] ^= std::byte{0x5a};
    source->dropUser();
    {
      std::lock_guard lock(s->mu);
      s->bytes_written += bytes;
    }
    if (r->landing_id == 0) {
      put->finish(partial);
      return;
    }
    notice(s, name, put, r, partial, true);
  }

  // Fabric thread: the completion notice reaches the receiver's landing.
  static void notice(std::shared_ptr<FakeFabric::State> s, std::string name,
                     std::shared_ptr<FakePut> put, std::shared_ptr<kt::PutRequest> r,
                     kt::PutResult partial, bool count) {
    if (count) {
      if (auto f = s->op("notice", name)) {
        if (f->first == FakeFabric::Fault::kFail) {
          put->finish(absl::UnavailableError("injected: completion notice failed"));
          return;
        }
        if (f->first == FakeFabric::Fault::kDelay) {
          s->at(
              Clock::now() + f->second,
              [s, name, put, r, partial] { notice(s, name, put, r, partial, false); }, true);
          return;
        }
      }
    }
    if (s->isDead(name)) return;
    std::shared_ptr<FakeLanding> landing;
    {
      std::lock_guard lock(s->mu);
      auto it = s->landings.find(r->landing_id);
      if (it != s->landings.end()) landing = it->second;
    }
    if (landing && landing->spec().sender_address == "fake:" + name) {
      landing->notice(r->notice_prefix, r->blocks, partial.checksums);
    }
    put->finish(partial);
  }

  std::shared_ptr<FakeFabric::State> s_;
  std::string name_;
  std::string address_;
};

}  // namespace

FakeFabric::FakeFabric() : state_(std::make_shared<State>()) {
  state_->thread = std::thread([s = state_.get()] { s->run(); });
}

FakeFabric::~FakeFabric() {
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
  // Timers not yet due (a put's or landing's deadline) capture the state, and unresolved
  // landings hold it: both would keep it alive past the fabric, a cycle that leaks everything
  // hanging off it. They can no longer run; drop them, outside the lock, since their
  // destructors may release callbacks that reach back into the fabric.
  std::multimap<Clock::time_point, std::function<void()>> timers;
  std::map<uint64_t, std::shared_ptr<FakeLanding>> landings;
  {
    std::lock_guard lock(state_->mu);
    timers.swap(state_->timers);
    landings.swap(state_->landings);
  }
}

std::unique_ptr<transport::TransportContext> FakeFabric::context(const std::string& name) {
  {
    std::lock_guard lock(state_->mu);
    state_->names.insert(name);
  }
  return std::make_unique<FakeContext>(state_, name);
}

void FakeFabric::inject(uint64_t nth, Fault fault, std::chrono::milliseconds delay) {
  std::lock_guard lock(state_->mu);
  state_->fault_at = nth;
  state_->fault = fault;
  state_->delay = delay;
}

uint64_t FakeFabric::operations() const {
  std::lock_guard lock(state_->mu);
  return state_->ops;
}

std::vector<std::string> FakeFabric::operationLog() const {
  std::lock_guard lock(state_->mu);
  return state_->log;
}

void FakeFabric::resetOperations() {
  std::lock_guard lock(state_->mu);
  state_->ops = 0;
  state_->fault_at = 0;
  state_->log.clear();
}

void FakeFabric::kill(const std::string& name) {
  std::vector<std::shared_ptr<FakeLanding>> orphans;
  {
    std::lock_guard lock(state_->mu);
    state_->dead.insert(name);
    for (auto& [id, landing] : state_->landings) {
      if (nameOf(landing->spec().sender_address) == name) orphans.push_back(landing);
    }
  }
  state_->soon([orphans] {
    for (const auto& l : orphans) {
      l->finish(absl::UnavailableError("peer process exited"), true);
    }
  });
}

uint64_t FakeFabric::bytesWritten() const {
  std::lock_guard lock(state_->mu);
  return state_->bytes_written;
}

bool FakeFabric::waitIdle(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mu);
  return state_->idle_cv.wait_for(lock, timeout, [&] { return state_->busy == 0; });
}

}  // namespace kvf::fakes
