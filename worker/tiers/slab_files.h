// The disk tier's files: one directory, locked against a second user, holding slab files that
// are preallocated (fallocate, or zero-filled where the file system cannot) to a block-aligned
// size as the tier grows. Decides O_DIRECT once for the directory: used where the file system
// accepts it, plain buffered I/O where it does not. Owned by the disk tier; allocate() is called
// by its I/O thread, the rest by create() only; fd() and directIo() are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/tiers/disk_format.h"

namespace kvf::worker {

enum class DirectIo : uint8_t { kAuto, kOn, kOff };

// The one conversion of an errno value: ENOSPC, EDQUOT and EFBIG (a file-size limit) are
// ResourceExhausted, so callers can tell a full disk from a broken one.
absl::Status errnoToStatus(int err, std::string_view what);

class SlabFiles {
 public:
  // What open() found: the directory's previous contents are kept (the caller rebuilds its index
  // from them) or were removed, and why.
  struct Opened {
    std::unique_ptr<SlabFiles> files;
    bool kept = false;
    std::string reason;
  };
  // Opens (creating) `dir` for `file_sizes.size()` slab files of the given byte sizes. `keep`:
  // reuse the slab files when the meta file matches `geometry` exactly; otherwise (or with
  // keep = false) every slab file is removed first.
  static absl::StatusOr<Opened> open(const std::string& dir, const DiskGeometry& geometry,
                                     std::vector<uint64_t> file_sizes, DirectIo direct_io,
                                     bool keep);
  ~SlabFiles();
  SlabFiles(const SlabFiles&) = delete;
  SlabFiles& operator=(const SlabFiles&) = delete;

  uint32_t fileCount() const { return static_cast<uint32_t>(sizes_.size()); }
  uint64_t fileBytes(uint32_t file) const { return sizes_[file]; }
  // -1 while the file is not allocated.
  int fd(uint32_t file) const { return fds_[file]; }
  bool directIo() const { return direct_; }
  const std::string& dir() const { return dir_; }

  // Creates and preallocates slab file `file`. ResourceExhausted when the disk (or a file-size
  // limit) has no room; the partial file is removed.
  absl::Status allocate(uint32_t file);

 private:
  SlabFiles(std::string dir, std::vector<uint64_t> sizes, int lock_fd, bool direct);
  absl::Status openExisting(uint32_t file);
  int openFlags() const;

  const std::string dir_;
  const std::vector<uint64_t> sizes_;
  std::vector<int> fds_;
  int lock_fd_;
  bool direct_;
};

}  // namespace kvf::worker
