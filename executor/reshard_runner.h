// Running a cross-mesh resharding plan (planner/reshard.h) on ranks: every rank walks the plan's
// one global order and takes its part in each transfer (pack the box, send or broadcast on a
// channel group, or post the receive), so no two ranks wait on each other in opposite orders.
// Link emulation knows hosts: a transfer between hosts holds the network card of every host it
// crosses (one lock per card, shared by threads and processes of the job alike) for the time the
// link model gives, so contention between transfers is real and measurable on one machine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "executor/communicator.h"
#include "executor/kernel_context.h"
#include "graph/dtype.h"
#include "graph/tiles.h"
#include "planner/reshard.h"

namespace oases {

// Bytes whose resize leaves new elements uninitialised (a destination tile is written whole by
// the transfers; zeroing it first would cost a pass over memory on every rank).
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
using TileBytes = std::vector<char, UninitAllocator<char>>;

// A rank's tile of a value: its boxes (graph/tiles.h), each stored densely in row-major order.
struct TileData {
  std::vector<Box> boxes;
  std::vector<TileBytes> data;  // per box: numel × element bytes
  int64_t element_bytes = 4;

  // Zero-filled boxes for the tile of mesh rank `r` under `tiles`.
  static TileData zeros(const TileMap& tiles, int64_t r, int64_t element_bytes);
  // The same boxes left uninitialised, for a tile that is then written whole.
  static TileData uninitialised(const TileMap& tiles, int64_t r, int64_t element_bytes);
  // The part `box` (inside one of this tile's boxes) as contiguous bytes, and its inverse.
  TileBytes pack(const Box& box) const;
  void unpack(const Box& box, const char* bytes);
  // Where `box` lies as one contiguous run of bytes inside one of this tile's boxes (a slab: the
  // trailing dims whole, the leading ones single), else null: such a box is sent from and received
  // into the tile itself, with no packing copy.
  const char* contiguous(const Box& box) const;
  char* contiguous(const Box& box);
  // Copies the part `box` from `from` (which holds it in one of its boxes) into this tile.
  void copy_from(const TileData& from, const Box& box);
};

// The emulated hosts' network cards: one lock file per card in `dir` (a folder every rank of the
// job sees).
class HostCards {
 public:
  explicit HostCards(std::string dir) : dir_(std::move(dir)) {}
  // Holds the cards of `hosts` (taken in ascending order, so holders never deadlock) while `work`
  // runs (the real data movement) and until `seconds` have passed since the cards were taken
  // (sleeping); fewer than two hosts: no card, only the timing.
  // `progress` (if given) is called while the time runs out, until it returns true (the transfer
  // `work` started is done), so that transfer can move (MPI progresses non-blocking operations
  // only inside MPI calls).
  void hold(std::vector<int> hosts, double seconds, const std::function<void()>& work, const std::function<bool()>& progress = {}) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};
// A fresh folder for the cards' lock files in the temporary directory; empty when none can be made.
std::string make_cards_folder();

struct ReshardRunOptions {
  int tag = 1;                       // the channel (Communicator::channel_group)
  DType dtype = DType::kF32;         // for the pre-reductions of a partial source
  const HostCards* cards = nullptr;  // emulate the cluster's links (null: run at full speed)
  ReshardCluster cluster;            // hosts and link models the emulation follows
};

struct ReshardRunStats {
  int64_t bytes_sent = 0, bytes_received = 0;
  int transfers = 0;  // this rank's sends, broadcasts and receives
};

// This rank's part of `plan`: `src` is its source tile (ignored when it holds none) and the result
// its destination tile (no boxes when it is not in the destination mesh).
TileData run_reshard(const ReshardPlan& plan, const ReshardProblem& p, Communicator& comm, const TileData& src, const ReshardRunOptions& o,
                     ReshardRunStats* stats = nullptr);

// The folder of the emulated hosts' network cards that Reshard kernels of this process hold while
// a transfer crosses hosts (oases-train --hosts with --emulate-link: the node's plan was made for
// more than one host); empty: transfers run at the machine's speed.
void set_emulated_cards_dir(const std::string& dir);
std::string emulated_cards_dir();

}  // namespace oases
