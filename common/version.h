// The version of this build, for `--version` of every kvf-* binary: the project version, the
// git revision the sources came from (with "-dirty" when tracked files differed from it) and
// the CMake build type. Defined in a source file the build regenerates when any of them
// changes (cmake/KvfVersion.cmake), linked into the binaries only. Thread-safe.
#pragma once

#include <string_view>

namespace kvf {

// e.g. "0.1.0 (git 8dbb015c1a2b, RelWithDebInfo build)".
std::string_view buildVersion();

}  // namespace kvf
