#include "transport/cuda_staging.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/status.h"
#include "common/strings.h"
#include "transport/cuda_status.h"

namespace kvf::transport {
namespace {

// A worker thread running queued jobs in order (the only place that waits on CUDA events).
class JobThread {
 public:
  JobThread() : thread_([this] { run(); }) {}
  ~JobThread() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

// Slot state shared by the pipeline thread and put completions (progress thread).
struct Slot {
  cudaEvent_t copied = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false;  // its put has not completed yet
};

class Pusher final : public DeviceStagingPusher {
 public:
  Pusher(TransportContext& ctx, StagingOptions options) : ctx_(ctx), options_(options) {}
  ~Pusher() override {
    jobs_.reset();  // finishes queued pushes first
    for (auto& slot : slots_) {
      std::unique_lock lock(slot->mu);
      slot->cv.wait(lock, [&] { return !slot->busy; });
      if (slot->copied) cudaEventDestroy(slot->copied);
    }
    ring_region_.reset();
    if (ring_) cudaFreeHost(ring_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status init() {
    KVF_RETURN_IF_ERROR(cudaStatus(cudaSetDevice(options_.device), "cudaSetDevice"));
    KVF_RETURN_IF_ERROR(
        cudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    uint64_t bytes = options_.chunk_bytes * options_.chunks;
    KVF_RETURN_IF_ERROR(cudaStatus(cudaHostAlloc(&ring_, bytes, cudaHostAllocDefault),
                                   "cudaHostAlloc(staging ring)"));
    KVF_ASSIGN_OR_RETURN(ring_region_, ctx_.registerMemory(ring_, bytes));
    for (uint32_t i = 0; i < options_.chunks; ++i) {
      auto slot = std::make_unique<Slot>();
      KVF_RETURN_IF_ERROR(cudaStatus(
          cudaEventCreateWithFlags(&slot->copied, cudaEventDisableTiming), "cudaEventCreate"));
      slots_.push_back(std::move(slot));
    }
    jobs_ = std::make_unique<JobThread>();
    return absl::OkStatus();
  }

  absl::Status push(const void* device_base, PutRequest request, PutCallback done) override {
    for (size_t i = 0; i < request.blocks.size(); ++i) {
      if (request.blocks[i].length == 0 || request.blocks[i].length > options_.chunk_bytes) {
        return absl::InvalidArgumentError(strCat("blocks[", i, "].length: must be in (0, ",
                                                 options_.chunk_bytes, "] (the chunk size)"));
      }
    }
    if (request.checksums == ChecksumMode::kProvided) {
      return absl::InvalidArgumentError("checksums: kProvided is not supported when staging");
    }
    jobs_->post([this, device_base, request = std::move(request), done = std::move(done)]() {
      run(static_cast<const char*>(device_base), request, done);
    });
    return absl::OkStatus();
  }

 private:
  struct Chunk {
    std::vector<BlockCopy> blocks;  // local_offset: offset in the slot
    std::vector<uint64_t> device_offsets;
  };

  std::vector<Chunk> plan(const PutRequest& request) const {
    std::vector<Chunk> chunks(1);
    uint64_t used = 0;
    for (const auto& b : request.blocks) {
      if (used + b.length > options_.chunk_bytes) {
        chunks.emplace_back();
        used = 0;
      }
      chunks.back().blocks.push_back({used, b.remote_addr, b.length});
      chunks.back().device_offsets.push_back(b.local_offset);
      used += b.length;
    }
    return chunks;
  }

  // Pipeline: enqueue the copy of chunk k+1 before waiting for chunk k's copy and posting its put.
  void run(const char* device_base, const PutRequest& request, const PutCallback& done) {
    std::vector<Chunk> chunks = plan(request);
    auto state = std::make_shared<Totals>();
    state->remaining = chunks.size();
    state->done = done;
    auto enqueue = [&](size_t k) -> absl::Status {
      Slot& slot = *slots_[k % slots_.size()];
      {
        std::unique_lock lock(slot.mu);
        slot.cv.wait(lock, [&] { return !slot.busy; });  // its previous put finished
        slot.busy = true;
      }
      char* host = static_cast<char*>(ring_) + (k % slots_.size()) * options_.chunk_bytes;
      for (size_t i = 0; i < chunks[k].blocks.size(); ++i) {
        KVF_RETURN_IF_ERROR(
            cudaStatus(cudaMemcpyAsync(host + chunks[k].blocks[i].local_offset,
                                       device_base + chunks[k].device_offsets[i],
                                       chunks[k].blocks[i].length, cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync(D2H)"));
      }
      return cudaStatus(cudaEventRecord(slot.copied, stream_), "cudaEventRecord");
    };
    std::vector<NoticeBlock> noticed;  // blocks of the chunks before the last, in order
    size_t enqueued = 0, posted = 0;   // chunks in [posted, enqueued) hold a slot, no put yet
    absl::Status status = enqueue(0);
    if (status.ok()) enqueued = 1;
    for (size_t k = 0; k < chunks.size() && status.ok(); ++k) {
      if (k + 1 < chunks.size()) {
        status = enqueue(k + 1);
        if (status.ok()) enqueued = k + 2;
      }
      Slot& slot = *slots_[k % slots_.size()];
      if (status.ok()) status = cudaStatus(cudaEventSynchronize(slot.copied), "D2H copy");
      if (!status.ok()) break;
      const bool last = k + 1 == chunks.size();
      PutRequest put = request;
      put.source = ring_region_;
      for (auto& b : chunks[k].blocks) b.local_offset += (k % slots_.size()) * options_.chunk_bytes;
      put.blocks = chunks[k].blocks;
      if (request.checksums == ChecksumMode::kCompute) {
        // Computed here, on the staged host copy, so the final notice can list every chunk's.
        put.checksums = ChecksumMode::kProvided;
        put.provided_checksums.clear();
        for (const auto& b : put.blocks) {
          put.provided_checksums.push_back(
              blockChecksum(static_cast<const char*>(ring_) + b.local_offset, b.length));
        }
        state->addChecksums(put.provided_checksums);
      }
      // One landing, one notice: it goes with the last chunk and lists every chunk's blocks, and
      // is posted only once the earlier chunks' puts have completed (their bytes have landed).
      put.landing_id = last ? request.landing_id : 0;
      if (!last) {
        for (size_t i = 0; i < put.blocks.size(); ++i) {
          noticed.push_back({put.blocks[i].remote_addr, put.blocks[i].length,
                             put.provided_checksums.empty() ? 0 : put.provided_checksums[i]});
        }
      } else if (request.landing_id != 0) {
        status = state->waitCompleted(k);
        if (!status.ok()) break;
        put.notice_prefix = std::move(noticed);
      }
      Slot* slot_ptr = &slot;
      auto handle = ctx_.postPut(std::move(put), [state, slot_ptr](absl::StatusOr<PutResult> r) {
        {
          std::lock_guard lock(slot_ptr->mu);
          slot_ptr->busy = false;
        }
        slot_ptr->cv.notify_all();
        state->add(std::move(r));
      });
      status = handle.status();
      if (status.ok()) posted = k + 1;
    }
    if (!status.ok()) {
      // Free the slots of chunks copied but never put (puts posted free theirs on completion),
      // then report the error once; `done` does not wait for puts already posted.
      cudaStreamSynchronize(stream_);
      for (size_t k = posted; k < enqueued; ++k) {
        Slot& slot = *slots_[k % slots_.size()];
        {
          std::lock_guard lock(slot.mu);
          slot.busy = false;
        }
        slot.cv.notify_all();
      }
      state->fail(status);
    }
  }

  struct Totals {
    std::mutex mu;
    std::condition_variable cv;
    size_t remaining = 0;
    size_t completed = 0;  // puts that completed, successfully or not
    bool finished = false;
    PutResult sum;
    absl::Status error;
    PutCallback done;
    // Chunk checksums in block order (puts may complete out of order).
    void addChecksums(const std::vector<uint64_t>& sums) {
      std::lock_guard lock(mu);
      sum.checksums.insert(sum.checksums.end(), sums.begin(), sums.end());
    }
    void add(absl::StatusOr<PutResult> r) {
      std::unique_lock lock(mu);
      if (r.ok()) {
        sum.bytes += r->bytes;
        sum.blocks += r->blocks;
        sum.operations += r->operations;
        sum.elapsed = std::max(sum.elapsed, r->elapsed);
        sum.new_endpoint = sum.new_endpoint || r->new_endpoint;
      } else if (error.ok()) {
        error = r.status();
      }
      ++completed;
      cv.notify_all();
      if (--remaining == 0) finish(lock);
    }
    // Waits until `n` puts have completed; the first error among them otherwise.
    absl::Status waitCompleted(size_t n) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return completed >= n || !error.ok(); });
      return error;
    }
    void fail(absl::Status s) {
      std::unique_lock lock(mu);
      if (error.ok()) error = std::move(s);
      finish(lock);
    }
    void finish(std::unique_lock<std::mutex>& lock) {
      if (finished) return;
      finished = true;
      PutCallback cb = std::move(done);
      absl::StatusOr<PutResult> result = error.ok() ? absl::StatusOr<PutResult>(sum) : error;
      lock.unlock();
      if (cb) cb(std::move(result));
    }
  };

  TransportContext& ctx_;
  StagingOptions options_;
  cudaStream_t stream_ = nullptr;
  void* ring_ = nullptr;
  std::shared_ptr<MemoryRegion> ring_region_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<JobThread> jobs_;
};

class Uploader final : public DeviceUploader {
 public:
  explicit Uploader(int device) : device_(device) {}
  ~Uploader() override {
    jobs_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }
  absl::Status init() {
    KVF_RETURN_IF_ERROR(cudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    KVF_RETURN_IF_ERROR(
        cudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    jobs_ = std::make_unique<JobThread>();
    return absl::OkStatus();
  }
  absl::Status upload(std::vector<Copy> copies, std::function<void(absl::Status)> done) override {
    jobs_->post([this, copies = std::move(copies), done = std::move(done)] {
      absl::Status status;
      for (const auto& c : copies) {
        status =
            cudaStatus(cudaMemcpyAsync(c.device, c.host, c.length, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync(H2D)");
        if (!status.ok()) break;
      }
      absl::Status synced = cudaStatus(cudaStreamSynchronize(stream_), "H2D copy");
      if (done) done(status.ok() ? synced : status);
    });
    return absl::OkStatus();
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<JobThread> jobs_;
};

}  // namespace

bool cudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::StatusOr<std::unique_ptr<DeviceStagingPusher>> DeviceStagingPusher::create(
    TransportContext& ctx, StagingOptions options) {
  if (options.chunks < 2) return absl::InvalidArgumentError("chunks: must be >= 2");
  if (options.chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes: must be > 0");
  auto pusher = std::make_unique<Pusher>(ctx, options);
  KVF_RETURN_IF_ERROR(pusher->init());
  return std::unique_ptr<DeviceStagingPusher>(std::move(pusher));
}

absl::StatusOr<std::unique_ptr<DeviceUploader>> DeviceUploader::create(int device) {
  auto uploader = std::make_unique<Uploader>(device);
  KVF_RETURN_IF_ERROR(uploader->init());
  return std::unique_ptr<DeviceUploader>(std::move(uploader));
}

}  // namespace kvf::transport
