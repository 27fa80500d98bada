// The readiness signal of kvfabric's servers (kvf-engine, kvf-router --ready_file PATH): a
// file that appears, complete, once the server listens, so a script can wait for it instead
// of polling a port. Holds the listening HTTP port followed by a newline. The file is removed
// when the server starts (so a stale one never signals) and when it stops. Owned by main();
// not thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace kvf {

class ReadyFile {
 public:
  // Removes a file left at `path` by an earlier run. An empty path disables the signal.
  explicit ReadyFile(std::string path);
  ~ReadyFile();
  ReadyFile(const ReadyFile&) = delete;
  ReadyFile& operator=(const ReadyFile&) = delete;

  // Writes "<port>\n" to a temporary file beside `path` and renames it into place, so a reader
  // never sees a partial file.
  absl::Status publish(uint16_t port);

 private:
  std::string path_;
};

}  // namespace kvf
