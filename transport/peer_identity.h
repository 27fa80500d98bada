// The opaque worker address a TransportContext hands to peers: the UCX worker address wrapped
// with the process identity (pid, pid namespace, boot id) so that a peer on the same host can
// watch the process with a pidfd - the liveness signal on shared memory, where UCX has no peer
// error handling. Value types; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvf::transport {

struct PeerIdentity {
  uint32_t pid = 0;
  uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid
  std::string boot_id;         // /proc/sys/kernel/random/boot_id
  std::string ucp_address;     // ucp_worker_query's address bytes

  // True when `other` runs on this host in this pid namespace (its pid can be watched).
  bool sameHostAs(const PeerIdentity& other) const {
    return !boot_id.empty() && boot_id == other.boot_id && pid_namespace == other.pid_namespace;
  }
};

// This process's identity with the given UCX address.
PeerIdentity localIdentity(std::string ucp_address);

std::string encodePeerAddress(const PeerIdentity& identity);

// Parses bytes from a peer (not trusted): checks the magic, every length and the total size.
absl::StatusOr<PeerIdentity> decodePeerAddress(std::string_view bytes);

// Opens a pidfd for `pid` (readable once the process exits); -1 with errno on failure.
int openPidFd(uint32_t pid);

}  // namespace kvf::transport
