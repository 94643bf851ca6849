#include "executor/notes.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>

namespace oases {

namespace {

std::atomic<bool> notes_on{false};
std::mutex notes_mu;
std::set<std::string>& notes_seen() {
  static std::set<std::string> seen;
  return seen;
}

}  // namespace

void set_verbose_notes(bool on) {
  notes_on.store(on, std::memory_order_relaxed);
}

bool verbose_notes() {
  return notes_on.load(std::memory_order_relaxed);
}

bool note_once(const std::string& text) {
  if (!verbose_notes()) return false;
  std::lock_guard<std::mutex> lock(notes_mu);
  if (!notes_seen().insert(text).second) return false;
  std::fprintf(stderr, "note: %s\n", text.c_str());
  return true;
}

}  // namespace oases
