#include "common/ready_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/strings.h"

namespace kvf {

ReadyFile::ReadyFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

ReadyFile::~ReadyFile() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

absl::Status ReadyFile::publish(uint16_t port) {
  if (path_.empty()) return absl::OkStatus();
  std::string tmp = strCat(path_, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.flush();
    if (!out) return absl::InternalError(strCat("cannot write the ready file ", tmp));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return absl::InternalError(strCat("cannot rename ", tmp, " to ", path_));
  }
  return absl::OkStatus();
}

}  // namespace kvf
