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
  // The part `box` (inside one of this tile's boxes) as contiguous bytes.
  TileBytes pack(const Box& box) const;
  // Where `box` lies as one contiguous run of bytes inside one of this tile's boxes (a slab: the
  // trailing dims whole, the leading ones single), else null: such a box is sent from and received
  // into the tile itself, with no packing copy.
  const char* contiguous(const Box& box) const;
  // Copies the part `box` from `from` (which holds it in one of its boxes) into this tile.
  void copy_from(const TileData& from, const Box& box);
};

// A rank's tile as memory somewhere (the host's or a device's): its boxes and where each one's
// dense row-major bytes lie. A view owns nothing.
struct TileView {
  std::vector<Box> boxes;
  std::vector<char*> data;  // per box
  int64_t element_bytes = 4;

  // The index of a box holding `box` (-1: none).
  int holding(const Box& box) const;
  // Where `box` lies as one contiguous run of bytes inside one of the boxes (TileData::contiguous).
  char* contiguous(const Box& box) const;
};
TileView view_of(const TileData& t);  // its boxes in place (a source view is only read)

// Where a reshard's tiles live: scratch memory and copies between boxes, on the host (memcpy, done
// when the call returns) or on a device (copy kernels enqueued on stream(), in the order issued).
class TileMemory {
 public:
  virtual ~TileMemory() = default;
  // Bytes alive while this object is (on a device: in stream order).
  virtual char* scratch(int64_t bytes) = 0;
  // Copies `region` out of `from` (the dense box `from_box`) into `to` (the dense box `to_box`).
  virtual void copy_region(const Box& region, const Box& from_box, const char* from, const Box& to_box, char* to, int64_t es) = 0;
  // The stream a device's transfers and copies are enqueued on; null for host memory.
  virtual void* stream() const { return nullptr; }
};

// Host memory: graph/tiles.h copy_region, scratch owned until destruction.
class HostTileMemory : public TileMemory {
 public:
  char* scratch(int64_t bytes) override;
  void copy_region(const Box& region, const Box& from_box, const char* from, const Box& to_box, char* to, int64_t es) override;

 private:
  std::vector<TileBytes> scratch_;
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

// The same with both tiles where `mem` keeps them: `dst` (its boxes those of this rank's
// destination tile, none outside the destination mesh) is written whole. The one implementation:
// on the host (HostTileMemory, any communicator) every transfer is done when it returns; on a device
// (`comm` a device communicator: NCCL or ranks sharing devices, executor/device_local_comm.h) the
// transfers, pre-reductions and copies are enqueued on mem.stream() in one order and the host waits
// for none of them, except that ranks sharing a device meet on the host as each transfer is issued.
// Transfers issued together go to the communicator as one batch (NCCL: one group call); a
// rank's pair and channel communicators are made first, in the plan's global order.
void run_reshard_into(const ReshardPlan& plan, const ReshardProblem& p, Communicator& comm, const TileView& src, const TileView& dst,
                      TileMemory& mem, const ReshardRunOptions& o, ReshardRunStats* stats = nullptr);

// A Reshard node's transfer plan (made when the program was built, planner/reshard_nodes.h); a
// node without one fails.
const PlannedReshard& planned_reshard(const KernelContext& c);
// A Reshard node's run, the CPU and CUDA kernels' one body: this rank's part in the node's plan
// through `comm`, its tiles its operands' memory as `mem` sees it (one box each at most; the
// source moved to scratch where it shares memory with the destination); `cards` (the host's)
// emulates the links.
void run_reshard_node(const KernelContext& c, Communicator& comm, TileMemory& mem, const HostCards* cards = nullptr);

// The folder of the emulated hosts' network cards that Reshard kernels of this process hold while
// a transfer crosses hosts (oases-train --hosts with --emulate-link: the node's plan was made for
// more than one host); empty: transfers run at the machine's speed.
void set_emulated_cards_dir(const std::string& dir);
std::string emulated_cards_dir();

}  // namespace oases
