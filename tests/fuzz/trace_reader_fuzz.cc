// Fuzz target: the trace readers (trace/reader.h) on a hostile trace file: Mooncake, session and
// bailian JSONL, format detection, and one conversation file of the agentic-coding directory.
// Input: byte 0 picks the format and the error policy, the rest is the file. The readers read
// paths (line buffering and its bounds are part of what is fuzzed), so the input is written to
// an in-memory file (memfd) that is opened by its /proc/self/fd path; the agentic directory holds
// a symbolic link to it. Rewriting one memfd in place keeps file systems out of every execution:
// truncating and rewriting a file on disk made ext4 flush it on close (4 ms an execution on a
// virtual disk), and even on tmpfs the create/truncate calls cost more than the parse.
// Properties: every request read has a block count consistent with its length and
// non-negative lengths.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_check.h"
#include "trace/reader.h"

namespace {

namespace fs = std::filesystem;
using namespace kvf::trace;

// The input file: one memfd, rewritten in place for every input, and its path.
struct InputFile {
  int fd;
  std::string path;
};
const InputFile& inputFile() {
  static const InputFile& file = *new InputFile([] {
    int fd = memfd_create("kvf-trace-fuzz", 0);
    if (fd < 0) std::abort();
    return InputFile{fd, "/proc/self/fd/" + std::to_string(fd)};
  }());
  return file;
}

void setInput(std::string_view bytes) {
  int fd = inputFile().fd;
  if (!bytes.empty() && pwrite(fd, bytes.data(), bytes.size(), 0) != ssize_t(bytes.size())) {
    std::abort();
  }
  if (ftruncate(fd, static_cast<off_t>(bytes.size())) != 0) std::abort();
}

// The agentic-coding directory: one conversation file, a link to the input file. Never
// destroyed, so the cleanup registered with atexit can still read it.
const fs::path& agenticDir() {
  static const fs::path& dir = *new fs::path([] {
    fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string pattern = (base / "kvf-trace-fuzz-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    fs::path made(pattern);
    fs::create_symlink(inputFile().path, made / "trace_0001.json");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(agenticDir(), ec);
    });
    return made;
  }());
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto in = kvf::fuzz::splitInput(data, size);
  if (!in) return 0;
  static const TraceFormat kFormats[] = {TraceFormat::kAuto, TraceFormat::kMooncake,
                                         TraceFormat::kSession, TraceFormat::kBailian,
                                         TraceFormat::kAgentic};
  TraceFormat format = kFormats[in->choice % 5];
  ReaderOptions options;
  options.format = format;
  options.on_error = (in->choice / 5) % 2 ? OnError::kSkip : OnError::kStop;
  options.max_line_bytes = 1 << 16;
  setInput(in->rest);
  auto reader = openTrace(
      format == TraceFormat::kAgentic ? agenticDir().string() : inputFile().path, options);
  if (!reader.ok()) return 0;
  Request request;
  for (int i = 0; i < 100000; ++i) {
    auto more = (*reader)->next(&request);
    if (!more.ok() || !*more) break;
    KVF_FUZZ_CHECK(request.input_length >= 0 && request.output_length >= 0, "negative length");
    KVF_FUZZ_CHECK(blockCountConsistent(request), "block count inconsistent with the length");
  }
  return 0;
}
