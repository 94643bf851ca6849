#include "graph/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <sys/stat.h>
#include <unistd.h>

namespace oases {

namespace fs = std::filesystem;

namespace {

bool is_special_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

}  // namespace

Expected<AtomicFile> AtomicFile::create(const std::string& path, bool append) {
  if (is_special_file(path)) {
    FILE* f = std::fopen(path.c_str(), append ? "ab" : "wb");
    if (!f) return error("{}: cannot open for writing: {}", path, std::strerror(errno));
    return AtomicFile(path, "", f);
  }
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return error("{}: cannot open {} for writing: {}", path, tmp, std::strerror(errno));
  AtomicFile out(path, tmp, f);
  if (append) {
    FILE* old = std::fopen(path.c_str(), "rb");
    if (old) {
      char buf[1 << 16];
      size_t n = 0;
      Status st;
      while (st.is_ok() && (n = std::fread(buf, 1, sizeof buf, old)) > 0) st = out.write(buf, n);
      bool read_failed = std::ferror(old) != 0;
      std::fclose(old);
      if (!st.is_ok()) return st;
      if (read_failed) return error("{}: cannot read its current content to append to it", path);
    }
  }
  return out;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)), f_(o.f_) {
  o.f_ = nullptr;
}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this != &o) {
    discard();
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    f_ = o.f_;
    o.f_ = nullptr;
  }
  return *this;
}

AtomicFile::~AtomicFile() {
  discard();
}

void AtomicFile::discard() {
  if (!f_) return;
  std::fclose(f_);
  f_ = nullptr;
  if (!tmp_.empty()) std::remove(tmp_.c_str());
}

Status AtomicFile::fail(const char* what) {
  int err = errno;
  discard();
  return error("{}: cannot {}: {}", path_, what, err ? std::strerror(err) : "unknown error");
}

Status AtomicFile::write(const void* data, size_t bytes) {
  if (!f_) return error("{}: written after it was closed", path_);
  errno = 0;
  if (bytes > 0 && std::fwrite(data, 1, bytes, f_) != bytes) return fail("write");
  return Status::ok();
}

Status AtomicFile::flush() {
  if (!f_) return error("{}: written after it was closed", path_);
  errno = 0;
  if (std::fflush(f_) != 0) return fail("write");
  return Status::ok();
}

Status AtomicFile::commit() {
  if (!f_) return error("{}: committed after it was closed", path_);
  errno = 0;
  if (std::fflush(f_) != 0) return fail("write");
  // a device written in place (/dev/null) has nothing to sync and answers EINVAL
  if (!tmp_.empty() && ::fsync(fileno(f_)) != 0) return fail("sync");
  FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) {
    int err = errno;
    if (!tmp_.empty()) std::remove(tmp_.c_str());
    return error("{}: cannot close: {}", path_, std::strerror(err));
  }
  if (tmp_.empty()) return Status::ok();
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) {
    std::remove(tmp_.c_str());
    return error("{}: cannot rename {} over it: {}", path_, tmp_, ec.message());
  }
  return Status::ok();
}

Status write_file_atomically(const std::string& path, std::string_view content) {
  OASES_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  OASES_RETURN_IF_ERROR(f.write(content));
  return f.commit();
}

Status check_output_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return error("{}: is a folder, not a file", what);
  if (fs::exists(path, ec) && is_special_file(path)) {
    if (::access(path.c_str(), W_OK) != 0) return error("{}: not writable", what);
    return Status::ok();
  }
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::exists(dir, ec)) return error("{}: the folder {} does not exist", what, dir.string());
  if (!fs::is_directory(dir, ec)) return error("{}: {} is not a folder", what, dir.string());
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return error("{}: the folder {} is not writable", what, dir.string());
  return Status::ok();
}

Status check_output_folder(const std::string& path, const std::string& what) {
  std::error_code ec;
  fs::path dir = fs::absolute(path, ec);
  while (!fs::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
  if (!fs::is_directory(dir, ec)) return error("{}: {} is not a folder", what, dir.string());
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return error("{}: {} is not writable", what, dir.string());
  return Status::ok();
}

}  // namespace oases
