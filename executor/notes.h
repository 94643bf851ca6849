// Notes for people, printed by --verbose runs only: which path a kernel took and why another was
// not taken (e.g. "attention forward: batched products (cuDNN not taken: ...)"). Each distinct
// note is printed once per process, to stderr as "note: TEXT", however often the kernel runs, so
// a training run says it once and not every step. The tools switch it on with --verbose; off, a
// note costs one relaxed atomic load.
#pragma once

#include <string>

namespace oases {

void set_verbose_notes(bool on);
bool verbose_notes();
// Prints "note: TEXT" the first time TEXT is given while notes are on; true when it printed.
bool note_once(const std::string& text);

}  // namespace oases
