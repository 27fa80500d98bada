// kvf-transport-peer: the other process in the multi-process transport tests. As a receiver it
// registers a region and waits for one batch (landing) from a sender; as a sender it pushes
// batches into a receiver. Talks to the test over stdin/stdout, one line per step:
//   receiver: prints "ADDR <addr64> <rkey64> <base>", reads "SENDER <addr64>",
//             prints "LANDING <id>", then "RESULT <code> <message>" when the landing completes.
//   sender:   prints "ADDR <addr64>", reads "TARGET <addr64> <rkey64> <base> <landing_id>",
//             pushes --repeat batches (the last one notifies the landing), printing
//             "BATCH <n> <code>" after each and "RESULT <code> <message>" at the end.
// Exit status 0 when RESULT is OK, 1 otherwise, 2 on bad usage.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/log.h"
#include "common/strings.h"
#include "tests/transport/peer_layout.h"
#include "transport/base64.h"
#include "transport/transport.h"

ABSL_FLAG(std::string, role, "", "receiver, sender or holder (a filled region to read from)");
ABSL_FLAG(std::string, transports, "shm", "shm, tcp or a UCX_TLS list");
ABSL_FLAG(std::string, net_devices, "lo", "UCX_NET_DEVICES for tcp");
ABSL_FLAG(uint64_t, blocks, 4096, "blocks per batch");
ABSL_FLAG(uint64_t, block_size, 16384, "bytes per block");
ABSL_FLAG(uint64_t, seed, 1, "layout and pattern seed");
ABSL_FLAG(int64_t, deadline_ms, 1000, "deadline of each put / of the landing");
ABSL_FLAG(int64_t, repeat, 1, "sender: batches to push (the last one notifies the landing)");
ABSL_FLAG(bool, checksums, true, "sender computes / receiver verifies xxh3 per block");
ABSL_FLAG(int64_t, corrupt_block, -1, "sender: report a wrong checksum for this block");

namespace kt = kvf::transport;
using namespace std::chrono_literals;

namespace {

void say(const std::string& line) {
  std::cout << line << std::endl;  // flushes: the test reads line by line
}

int finish(const absl::Status& status) {
  std::string message(status.message());
  for (char& c : message) {
    if (c == '\n') c = ' ';
  }
  say(kvf::strCat("RESULT ", absl::StatusCodeToString(status.code()), " ", message));
  return status.ok() ? 0 : 1;
}

std::unique_ptr<kt::TransportContext> makeContext(const std::string& name) {
  kt::TransportOptions options;
  options.name = name;
  options.transports = absl::GetFlag(FLAGS_transports);
  if (options.transports != "shm") options.net_devices = absl::GetFlag(FLAGS_net_devices);
  auto ctx = kt::TransportContext::create(options);
  if (!ctx.ok()) {
    finish(ctx.status());
    std::exit(1);
  }
  return std::move(*ctx);
}

int runReceiver() {
  uint64_t count = absl::GetFlag(FLAGS_blocks), block = absl::GetFlag(FLAGS_block_size);
  auto ctx = makeContext("peer-receiver");
  auto region = ctx->allocateMemory(count * block);  // shared memory: one-sided writes on a host
  if (!region.ok()) return finish(region.status());
  char* memory = static_cast<char*>((*region)->data());
  std::memset(memory, 0, count * block);
  say(kvf::strCat("ADDR ", kt::base64Encode(ctx->workerAddress()), " ",
                  kt::base64Encode((*region)->packedRkey()), " ", (*region)->base()));
  std::string word, sender64;
  if (!(std::cin >> word >> sender64) || word != "SENDER") return 2;
  auto sender = kt::base64Decode(sender64);
  if (!sender.ok()) return finish(sender.status());
  kt::LandingSpec spec;
  spec.sender_address = *sender;
  spec.blocks =
      kt::testing::layoutBlocks(count, block, absl::GetFlag(FLAGS_seed), (*region)->base());
  spec.deadline = std::chrono::milliseconds(absl::GetFlag(FLAGS_deadline_ms));
  spec.verify_checksums = absl::GetFlag(FLAGS_checksums);
  auto landing = ctx->expectPut(*region, spec, nullptr);
  if (!landing.ok()) return finish(landing.status());
  say(kvf::strCat("LANDING ", (*landing)->id()));
  (*landing)->waitFor(spec.deadline + 5s);
  absl::Status status = (*landing)->check();
  if (status.ok()) {
    // Independent of the transport's own check: compare every byte with the pattern.
    std::vector<char> expected(count * block);
    kt::testing::fillPattern(expected.data(), expected.size(), absl::GetFlag(FLAGS_seed));
    for (uint64_t i = 0; i < count && status.ok(); ++i) {
      const auto& b = spec.blocks[i];
      if (std::memcmp(memory + (b.remote_addr - (*region)->base()),
                      expected.data() + b.local_offset, block) != 0) {
        status = absl::DataLossError(kvf::strCat("block ", i, " differs from the pattern"));
      }
    }
  }
  return finish(status);
}

int runSender() {
  uint64_t count = absl::GetFlag(FLAGS_blocks), block = absl::GetFlag(FLAGS_block_size);
  std::vector<char> memory(count * block);  // outlives the context (destroyed after it)
  auto ctx = makeContext("peer-sender");
  kt::testing::fillPattern(memory.data(), memory.size(), absl::GetFlag(FLAGS_seed));
  auto region = ctx->registerMemory(memory.data(), memory.size());
  if (!region.ok()) return finish(region.status());
  say(kvf::strCat("ADDR ", kt::base64Encode(ctx->workerAddress())));
  std::string word, addr64, rkey64;
  uint64_t base = 0, landing_id = 0;
  if (!(std::cin >> word >> addr64 >> rkey64 >> base >> landing_id) || word != "TARGET") return 2;
  auto addr = kt::base64Decode(addr64);
  auto rkey = kt::base64Decode(rkey64);
  if (!addr.ok() || !rkey.ok()) return finish(absl::InvalidArgumentError("bad TARGET line"));
  kt::PutRequest request;
  request.source = *region;
  request.peer_address = *addr;
  request.peer_rkey = *rkey;
  request.blocks = kt::testing::layoutBlocks(count, block, absl::GetFlag(FLAGS_seed), base);
  request.deadline = std::chrono::milliseconds(absl::GetFlag(FLAGS_deadline_ms));
  int64_t corrupt = absl::GetFlag(FLAGS_corrupt_block);
  if (corrupt >= 0 && static_cast<uint64_t>(corrupt) < count) {
    request.checksums = kt::ChecksumMode::kProvided;
    for (const auto& b : request.blocks) {
      request.provided_checksums.push_back(
          kt::blockChecksum(memory.data() + b.local_offset, block));
    }
    request.provided_checksums[corrupt] ^= 0x5a5a;
  } else if (absl::GetFlag(FLAGS_checksums)) {
    request.checksums = kt::ChecksumMode::kCompute;
  }
  absl::Status status;
  int64_t repeat = absl::GetFlag(FLAGS_repeat);
  for (int64_t n = 1; n <= repeat && status.ok(); ++n) {
    request.landing_id = n == repeat ? landing_id : 0;
    auto handle = ctx->postPut(request, nullptr);
    if (!handle.ok()) return finish(handle.status());
    if (!(*handle)->waitFor(request.deadline + 5s)) {
      return finish(absl::InternalError("put did not complete within deadline + 5 s"));
    }
    status = (*handle)->check();
    say(kvf::strCat("BATCH ", n, " ", absl::StatusCodeToString(status.code())));
  }
  return finish(status);
}

// Holds a filled region for the reader tests (one-sided gets by the test process) until its
// stdin closes or it is killed.
int runHolder() {
  uint64_t count = absl::GetFlag(FLAGS_blocks), block = absl::GetFlag(FLAGS_block_size);
  auto ctx = makeContext("peer-holder");
  auto region = ctx->allocateMemory(count * block);
  if (!region.ok()) return finish(region.status());
  kt::testing::fillPattern(static_cast<char*>((*region)->data()), count * block,
                           absl::GetFlag(FLAGS_seed));
  say(kvf::strCat("ADDR ", kt::base64Encode(ctx->workerAddress()), " ",
                  kt::base64Encode((*region)->packedRkey()), " ", (*region)->base(), " ",
                  (*region)->length()));
  std::string word;
  while (std::cin >> word) {
  }
  return finish(absl::OkStatus());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvf-transport-peer --role=receiver|sender|holder [flags]: the second process of the "
      "transport "
      "multi-process tests (protocol on stdin/stdout, see the source header).");
  absl::ParseCommandLine(argc, argv);
  kvf::log::init(absl::GetFlag(FLAGS_role), "warn");
  if (absl::GetFlag(FLAGS_role) == "receiver") return runReceiver();
  if (absl::GetFlag(FLAGS_role) == "sender") return runSender();
  if (absl::GetFlag(FLAGS_role) == "holder") return runHolder();
  std::cerr << "--role must be receiver, sender or holder\n";
  return 2;
}
