// A TransportContext for tests, without UCX: contexts made by one FakeFabric reach each other by
// address inside this process, so a put is a memcpy into the peer's registered memory (a remote
// address is a pointer here) followed by the completion notice, which the receiver's Landing
// verifies as the UCX context does (block list, per-block xxh3). It keeps the contract of
// transport/transport.h: callbacks run once on the fabric's own thread (the progress thread),
// deadlines complete puts and landings, and a landing whose sender may still write stays
// unresolved (quarantined) until a late notice arrives or the sender is killed.
//
// Faults, in the manner of Beast's tests: every fallible step any context of the fabric takes
// is one numbered operation, and inject(n, fault) makes operation n (1-based) fail, wait, or
// damage its bytes. A test runs a scenario for n = 1, 2, ... until a run reaches no operation n.
// The operations are "register" (registerMemory / allocateMemory), "expect" (expectPut), "post"
// (postPut), "write" (a put's bytes reaching the peer) and "notice" (its completion notice).
// Thread-safe; the fabric must outlive its contexts.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace kvf::fakes {

class FakeFabric {
 public:
  enum class Fault {
    kFail,     // register/expect/post: an error status; write: the put fails, nothing lands;
               // notice: the put fails after its bytes landed, the notice is lost
    kDelay,    // the operation happens `delay` later (write: the bytes and the notice)
    kCorrupt,  // write: one byte of the first block is flipped on its way
  };

  FakeFabric();
  ~FakeFabric();
  FakeFabric(const FakeFabric&) = delete;
  FakeFabric& operator=(const FakeFabric&) = delete;

  // A context named `name` (in its address and the operation log).
  std::unique_ptr<transport::TransportContext> context(const std::string& name);

  void inject(uint64_t nth, Fault fault,
              std::chrono::milliseconds delay = std::chrono::milliseconds(0));
  // Operations so far, and their kinds in order ("expect@D", "post@C", ...).
  uint64_t operations() const;
  std::vector<std::string> operationLog() const;
  // Starts numbering again from 1 (after a test's setup) and clears the fault.
  void resetOperations();

  // The process of the context named `name` dies: its pending writes and notices are dropped,
  // landings expecting it resolve with kUnavailable, puts towards it fail.
  void kill(const std::string& name);

  // Bytes written into any region, by puts, since creation (late writes included).
  uint64_t bytesWritten() const;
  // True once no delayed operation is pending, waiting at most `timeout`.
  bool waitIdle(std::chrono::milliseconds timeout) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kvf::fakes
