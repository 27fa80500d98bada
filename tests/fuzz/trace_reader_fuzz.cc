// Fuzz target: the trace readers (trace/reader.h) on a hostile trace file: Mooncake, session and
// bailian JSONL, format detection, and one conversation file of the agentic-coding directory.
// Input: byte 0 picks the format and the error policy, the rest is the file. The file is
// written to a private temporary directory because the readers read paths (line buffering and
// its bounds are part of what is fuzzed). Properties: every request read has a block count
// consistent with its length and non-negative lengths.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_check.h"
#include "trace/reader.h"

namespace {

namespace fs = std::filesystem;
using namespace kvf::trace;

const fs::path& workDir() {
  // Never destroyed, so the cleanup registered with atexit can still read it.
  static const fs::path& dir = *new fs::path([] {
    fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string pattern = (base / "kvf-trace-fuzz-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    fs::path made(pattern);
    fs::create_directory(made / "agentic");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(workDir(), ec);
    });
    return made;
  }());
  return dir;
}

void writeFile(const fs::path& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
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
  fs::path path;
  if (format == TraceFormat::kAgentic) {
    path = workDir() / "agentic";
    writeFile(path / "trace_0001.json", in->rest);
  } else {
    path = workDir() / "trace.jsonl";
    writeFile(path, in->rest);
  }
  auto reader = openTrace(path.string(), options);
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
