#include "worker/tiers/slab_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/strings.h"

namespace kvf::worker {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kZeroFillChunk = 1 << 20;

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

AlignedBuffer alignedZeros(uint64_t bytes) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kDiskSector, bytes));
  if (p != nullptr) std::memset(p, 0, bytes);
  return AlignedBuffer(p);
}

// Does the file system under `dir` take O_DIRECT I/O? Some refuse the open (EINVAL), some
// accept the open and refuse the I/O, so the probe writes and reads one sector.
absl::StatusOr<bool> probeDirectIo(const std::string& dir) {
  std::string path = dir + "/.kvf-direct-probe";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EINVAL) return false;
    return errnoToStatus(errno, strCat("creating ", path));
  }
  AlignedBuffer sector = alignedZeros(kDiskSector);
  bool ok = sector != nullptr && ::pwrite(fd, sector.get(), kDiskSector, 0) == kDiskSector &&
            ::pread(fd, sector.get(), kDiskSector, 0) == kDiskSector;
  int err = errno;
  ::close(fd);
  ::unlink(path.c_str());
  if (!ok && err != EINVAL) return errnoToStatus(err, strCat("probing O_DIRECT in ", dir));
  return ok;
}

bool isSlabFile(const std::string& name) {
  return name.size() > 9 && name.starts_with("slab-") && name.ends_with(".kvf");
}

absl::Status removeSlabFiles(const std::string& dir, size_t keep_below, bool keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (!isSlabFile(name)) continue;
    if (keep) {
      uint32_t index = static_cast<uint32_t>(std::strtoul(name.c_str() + 5, nullptr, 10));
      if (name == slabFileName(index) && index < keep_below) continue;
    }
    if (::unlink(entry.path().c_str()) != 0) {
      return errnoToStatus(errno, strCat("removing ", entry.path().string()));
    }
  }
  if (ec) return absl::InternalError(strCat("listing ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status writeMeta(const std::string& dir, const DiskGeometry& geometry) {
  std::string tmp = dir + "/" + std::string(kMetaFileName) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << encodeMeta(geometry);
    if (!out.flush()) return errnoToStatus(errno, strCat("writing ", tmp));
  }
  std::string path = dir + "/" + std::string(kMetaFileName);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return errnoToStatus(errno, strCat("renaming ", tmp));
  }
  return absl::OkStatus();
}

// Why the previous contents cannot be reused; empty when they can.
std::string reasonToClear(const std::string& dir, const DiskGeometry& geometry, bool keep) {
  if (!keep) return "on_start is clear";
  std::ifstream in(dir + "/" + std::string(kMetaFileName));
  if (!in) return strCat("no disk tier in ", dir);
  std::stringstream text;
  text << in.rdbuf();
  auto found = decodeMeta(text.str());
  if (!found.ok()) return strCat("unreadable meta file: ", std::string(found.status().message()));
  if (*found != geometry) {
    return strCat("geometry changed: block_bytes ", found->block_bytes, " -> ",
                  geometry.block_bytes, ", slot_bytes ", found->slot_bytes, " -> ",
                  geometry.slot_bytes, ", slots_per_file ", found->slots_per_file, " -> ",
                  geometry.slots_per_file);
  }
  return "";
}

}  // namespace

absl::Status errnoToStatus(int err, std::string_view what) {
  std::string message = strCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EINVAL:
    case EOPNOTSUPP:
      return absl::FailedPreconditionError(message);
    case EIO:
      return absl::DataLossError(message);
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<SlabFiles::Opened> SlabFiles::open(const std::string& dir,
                                                  const DiskGeometry& geometry,
                                                  std::vector<uint64_t> file_sizes,
                                                  DirectIo direct_io, bool keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(strCat("creating ", dir, ": ", ec.message()));
  std::string lock_path = dir + "/" + std::string(kLockFileName);
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return errnoToStatus(errno, strCat("opening ", lock_path));
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(lock_fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          strCat("disk tier directory ", dir, " is in use by another process"));
    }
    return errnoToStatus(err, strCat("locking ", lock_path));
  }
  // From here the lock is released by ~SlabFiles on any early return.
  bool direct = false;
  if (direct_io != DirectIo::kOff) {
    auto probed = probeDirectIo(dir);
    if (!probed.ok()) {
      ::close(lock_fd);
      return probed.status();
    }
    direct = *probed;
    if (!direct && direct_io == DirectIo::kOn) {
      ::close(lock_fd);
      return absl::FailedPreconditionError(
          strCat("the file system of ", dir, " refuses O_DIRECT (direct_io is on)"));
    }
  }
  size_t count = file_sizes.size();
  Opened opened;
  opened.files.reset(new SlabFiles(dir, std::move(file_sizes), lock_fd, direct));
  opened.reason = reasonToClear(dir, geometry, keep);
  opened.kept = opened.reason.empty();
  if (!opened.kept) {
    if (auto s = removeSlabFiles(dir, 0, false); !s.ok()) return s;
    if (auto s = writeMeta(dir, geometry); !s.ok()) return s;
    return opened;
  }
  opened.reason = strCat("rebuilt from ", dir);
  if (auto s = removeSlabFiles(dir, count, true); !s.ok()) return s;
  for (uint32_t i = 0; i < count; ++i) {
    if (auto s = opened.files->openExisting(i); !s.ok()) return s;
  }
  return opened;
}

SlabFiles::SlabFiles(std::string dir, std::vector<uint64_t> sizes, int lock_fd, bool direct)
    : dir_(std::move(dir)),
      sizes_(std::move(sizes)),
      fds_(sizes_.size(), -1),
      lock_fd_(lock_fd),
      direct_(direct) {}

SlabFiles::~SlabFiles() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
  ::close(lock_fd_);  // releases the flock
}

int SlabFiles::openFlags() const { return O_RDWR | O_CLOEXEC | (direct_ ? O_DIRECT : 0); }

// A slab file of the right size is reused as it is; anything else is removed (allocated again
// when the tier grows into it).
absl::Status SlabFiles::openExisting(uint32_t file) {
  std::string path = dir_ + "/" + slabFileName(file);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return errnoToStatus(errno, strCat("stat ", path));
  }
  if (static_cast<uint64_t>(st.st_size) != sizes_[file]) {
    if (::unlink(path.c_str()) != 0) return errnoToStatus(errno, strCat("removing ", path));
    return absl::OkStatus();
  }
  int fd = ::open(path.c_str(), openFlags());
  if (fd < 0) return errnoToStatus(errno, strCat("opening ", path));
  fds_[file] = fd;
  return absl::OkStatus();
}

absl::Status SlabFiles::allocate(uint32_t file) {
  std::string path = dir_ + "/" + slabFileName(file);
  int fd = ::open(path.c_str(), openFlags() | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return errnoToStatus(errno, strCat("creating ", path));
  uint64_t size = sizes_[file];
  int err = 0;
  if (::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0) {
    err = errno;
    if (err == EOPNOTSUPP) {
      // No preallocation on this file system: write the zeros ourselves, so the blocks exist.
      err = 0;
      AlignedBuffer zeros = alignedZeros(kZeroFillChunk);
      for (uint64_t at = 0; at < size && err == 0; at += kZeroFillChunk) {
        auto len = static_cast<size_t>(std::min(kZeroFillChunk, size - at));
        if (::pwrite(fd, zeros.get(), len, static_cast<off_t>(at)) != static_cast<ssize_t>(len)) {
          err = errno != 0 ? errno : ENOSPC;
        }
      }
    }
  }
  if (err != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return errnoToStatus(err, strCat("allocating ", path, " (", size, " bytes)"));
  }
  fds_[file] = fd;
  return absl::OkStatus();
}

}  // namespace kvf::worker
