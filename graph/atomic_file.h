// Output files written like checkpoints: every byte goes to PATH.tmp, which is flushed, fsync'ed
// and renamed over PATH only when all of it is written, so a crash or a full disk never leaves a
// half (or empty) file and never destroys the previous one. Every write, flush and close is
// checked; an error names PATH and the system's reason ("out.json: cannot write: No space left
// on device") and removes the temporary file.
//
// A PATH that exists and is not a regular file (/dev/null, /dev/full, a FIFO, /dev/stdout) is
// written in place: renaming over a device node would replace it.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "graph/status.h"

namespace oases {

class AtomicFile {
 public:
  // `append`: the new bytes follow PATH's current content (copied into the temporary file).
  static Expected<AtomicFile> create(const std::string& path, bool append = false);

  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&& o) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Not committed: the temporary file is removed and PATH keeps its old content.
  ~AtomicFile();

  Status write(const void* data, size_t bytes);
  Status write(std::string_view text) { return write(text.data(), text.size()); }
  // Pushes buffered bytes to the kernel (a step log: a full disk is reported at the step it fills).
  Status flush();
  // Flush, fsync, close, rename over PATH. After an error nothing is left but PATH's old content.
  Status commit();

  const std::string& path() const { return path_; }
  // False once committed or after an error.
  bool is_open() const { return f_ != nullptr; }

 private:
  AtomicFile(std::string path, std::string tmp, FILE* f) : path_(std::move(path)), tmp_(std::move(tmp)), f_(f) {}
  Status fail(const char* what);  // closes and removes the temporary file; errno names the reason
  void discard();

  std::string path_;
  std::string tmp_;  // empty when PATH is written in place
  FILE* f_ = nullptr;
};

// The whole content at once.
Status write_file_atomically(const std::string& path, std::string_view content);

// Refuses, before any work, an output PATH that cannot be created: a missing or read-only folder,
// a folder or a parent that is a file. `what` names the flag for the message ("--log-json out.jsonl:
// the folder /x does not exist").
Status check_output_file(const std::string& path, const std::string& what);
// The same for an output folder created with its missing parents: the nearest existing ancestor
// must be a writable folder.
Status check_output_folder(const std::string& path, const std::string& what);

}  // namespace oases
