#include "transport/peer_identity.h"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "common/strings.h"

namespace kvf::transport {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'F', '1'};
constexpr size_t kMaxUcpAddress = 64 * 1024;
constexpr size_t kMaxBootId = 64;

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <class T>
bool take(std::string_view& in, T* value) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(value, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

}  // namespace

PeerIdentity localIdentity(std::string ucp_address) {
  PeerIdentity id;
  id.pid = static_cast<uint32_t>(::getpid());
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0) id.pid_namespace = st.st_ino;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, id.boot_id);
  if (id.boot_id.size() > kMaxBootId) id.boot_id.resize(kMaxBootId);
  id.ucp_address = std::move(ucp_address);
  return id;
}

std::string encodePeerAddress(const PeerIdentity& identity) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, identity.pid);
  put<uint64_t>(out, identity.pid_namespace);
  put<uint8_t>(out, static_cast<uint8_t>(identity.boot_id.size()));
  out.append(identity.boot_id);
  put<uint32_t>(out, static_cast<uint32_t>(identity.ucp_address.size()));
  out.append(identity.ucp_address);
  return out;
}

absl::StatusOr<PeerIdentity> decodePeerAddress(std::string_view bytes) {
  auto bad = [](std::string_view what) {
    return absl::InvalidArgumentError(strCat("peer address: ", what));
  };
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("missing KVF1 magic (not a kvfabric transport address)");
  }
  bytes.remove_prefix(sizeof(kMagic));
  PeerIdentity id;
  uint8_t boot_len = 0;
  uint32_t ucp_len = 0;
  if (!take(bytes, &id.pid) || !take(bytes, &id.pid_namespace) || !take(bytes, &boot_len)) {
    return bad("truncated header");
  }
  if (boot_len > kMaxBootId || bytes.size() < boot_len) return bad("bad boot id length");
  id.boot_id.assign(bytes.data(), boot_len);
  bytes.remove_prefix(boot_len);
  if (!take(bytes, &ucp_len)) return bad("truncated UCX address length");
  if (ucp_len == 0 || ucp_len > kMaxUcpAddress || bytes.size() != ucp_len) {
    return bad(strCat("UCX address length ", ucp_len, " does not match the ", bytes.size(),
                      " bytes present"));
  }
  id.ucp_address.assign(bytes.data(), ucp_len);
  return id;
}

int openPidFd(uint32_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
}

}  // namespace kvf::transport
