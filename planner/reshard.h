// Cross-mesh resharding (after "On Optimizing the Communication of Model Parallelism", Zhuang et
// al., MLSys 2023): move a value laid out one way on a source mesh to another layout on a
// destination mesh, the two meshes placed anywhere in the world.
//
// 1. Unit tasks: every non-empty intersection of a destination tile with a source tile, with its
//    candidate senders (the source replicas holding it) and its receivers (the destination ranks
//    needing it). A receiver that is itself a candidate sender copies locally. A partial source
//    is first reduce-scattered (or all-reduced) inside the source mesh.
// 2. Strategies turn tasks into transfers: send/recv (one point-to-point message per receiver),
//    local all-gather (one slice to each receiver of a host, then an all-gather there) and
//    broadcast (one broadcast inside [sender + receivers] per task).
// 3. Sender choice and one global order (every rank issues its transfers in it, so no deadlock)
//    minimise the makespan when each host's network card does one transfer at a time and a
//    transfer holds the cards of every host it crosses: a load-balancing greedy, or a bounded
//    depth-first search that equals brute force on small problems.
// 4. A simulator scores an order on a cluster model; `ReshardStrategy::kAuto` picks the fastest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/sharding_spec.h"
#include "graph/status.h"
#include "graph/tiles.h"
#include "planner/link_model.h"

namespace oases {

// Where the world's ranks live and how fast the hosts talk.
struct ReshardCluster {
  std::vector<int> host_of;  // per world rank
  LinkModel inter;           // between hosts, through each host's one card
  LinkModel intra;           // inside a host (shared memory, NVLink): not through the card
  int64_t world() const { return static_cast<int64_t>(host_of.size()); }
  // `world` ranks spread over `hosts` hosts in order (the first world/hosts ranks on host 0, ...).
  static ReshardCluster spread(int64_t world, int hosts, LinkModel inter, LinkModel intra);
};

struct ReshardProblem {
  Shape shape;
  int64_t element_bytes = 4;
  PlacedLayout src, dst;  // each side's layout on its placed mesh (graph/tiles.h)
};

struct UnitTask {
  Box box;
  std::vector<int64_t> senders;    // world ranks holding the box (source replicas), ascending
  std::vector<int64_t> receivers;  // world ranks needing it that do not hold it, ascending
  std::vector<int64_t> local;      // world ranks needing it that hold it already (a local copy)
  int64_t bytes = 0;
};

// A partial source is summed inside the source mesh first: over each partial group, a
// reduce-scatter along `dim` (the value then sharded over `axis` there), or an all-reduce when
// every dimension is sharded already (dim = -1).
struct PreReduction {
  int axis = -1;
  int dim = -1;
  std::vector<std::vector<int64_t>> groups;  // world ranks
  int64_t bytes = 0;                         // of each member's part before the reduction
};

enum class ReshardStrategy { kSendRecv, kAllGather, kBroadcast, kAuto };
const char* strategy_name(ReshardStrategy s);
Expected<ReshardStrategy> parse_reshard_strategy(const std::string& text);

enum class TransferKind {
  kSend,       // sender → receivers[0]
  kBroadcast,  // sender → every receiver, one broadcast in [sender + receivers]
  kAllGather,  // inside one host: each of `receivers` holds slices[i] and gets the rest
};

struct Transfer {
  TransferKind kind = TransferKind::kSend;
  int task = -1;  // index into ReshardPlan::tasks
  int64_t sender = -1;
  std::vector<int64_t> receivers;
  Box box;                        // what moves (kAllGather: the whole box assembled)
  std::vector<Box> slices;        // kAllGather: receivers[i] holds slices[i] beforehand
  std::vector<int> after;         // indices in the order of transfers that must end first
  int64_t bytes = 0;              // bytes that cross (kAllGather: of the whole box)
  double start_s = 0, end_s = 0;  // as simulated
};

struct ReshardPlan {
  ReshardStrategy strategy = ReshardStrategy::kBroadcast;
  std::vector<PreReduction> pre;  // in order, before any transfer
  ShardingSpec effective_src;     // the source layout after the pre-reductions
  Mesh effective_src_mesh;
  std::vector<UnitTask> tasks;
  std::vector<Transfer> order;   // the one global order
  double predicted_s = 0;        // simulated makespan (pre-reductions included)
  double lower_bound_s = 0;      // bytes each receiving card must take in ÷ its bandwidth
  int64_t searched_nodes = 0;    // depth-first search nodes visited (0: greedy)
  bool search_complete = false;  // the search ended before its budget: the order is optimal
};

struct ReshardOptions {
  ReshardStrategy strategy = ReshardStrategy::kAuto;
  // Sender and order search for broadcasts: depth-first when the tasks are at most this many,
  // within `search_nodes` nodes, else the greedy alone.
  int search_max_tasks = 12;
  int64_t search_nodes = 200000;
};

// Validates the problem (layouts against their meshes and the shape, meshes inside the cluster's
// world) and lists the unit tasks after any pre-reduction.
Expected<ReshardPlan> reshard_tasks(const ReshardProblem& p, const ReshardCluster& c);
// Tasks, transfers, sender choice, order and prediction for one strategy (kAuto: the fastest).
Expected<ReshardPlan> plan_reshard(const ReshardProblem& p, const ReshardCluster& c, const ReshardOptions& o = {});

// Broadcasts for `plan.tasks` (one per task with receivers), their senders and order chosen by
// the greedy and, for small problems, the depth-first search; appended to `plan.order`.
void order_broadcasts(ReshardPlan& plan, const ReshardCluster& c, const ReshardOptions& o);

// The makespan of `order` (transfers in list order, each starting when every card it needs is
// free), writing each transfer's start and end; pre-reductions counted before.
double simulate_reshard(ReshardPlan& plan, const ReshardCluster& c);
// Duration of one transfer on its own.
double transfer_seconds(const Transfer& t, const ReshardCluster& c);

// The best broadcast order by exhaustive search (every order × every sender): tests only.
double brute_force_broadcast_makespan(const std::vector<UnitTask>& tasks, const ReshardCluster& c);

// --- checking that ranks' programs cannot deadlock ---------------------------------------------
//
// What the checker sees of a rank's program: the start or the wait of a communication op `op` (an
// id its participants share) on `channel`. A rank's compute thread issues starts and blocks at
// waits; each channel's thread runs the started ops in order; an op ends on a rank once every
// participant has begun it (reached it on its channel thread) — the collective rule, which is
// what a Reshard's sends (rendezvous) and receives need.
struct ChannelInstr {
  bool start = true;
  int op = 0;
  int channel = 0;
};
using Participants = std::function<std::vector<int64_t>(int op)>;
// Replays every rank's program (indexed by world rank); an error names the blocked ranks, the op
// each waits on, and who has not begun it.
Status check_channel_programs(const std::vector<std::vector<ChannelInstr>>& programs, const Participants& participants);
// The world ranks that take part in a resharding (send, receive, or pre-reduce).
std::vector<int64_t> reshard_participants(const ReshardPlan& plan);

// "task 3 [0:4, 0:8] 128 B: rank 2 → 9,10 (broadcast)" lines, the order, prediction and bound.
std::string describe(const ReshardPlan& plan, const ReshardCluster& c);

}  // namespace oases
