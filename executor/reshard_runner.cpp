#include "executor/reshard_runner.h"

#include <optional>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mutex>

#include "graph/op_registry.h"
#include "graph/status.h"
#include "planner/reshard_nodes.h"

namespace oases {

TileData TileData::zeros(const TileMap& tiles, int64_t r, int64_t element_bytes) {
  TileData t;
  t.element_bytes = element_bytes;
  if (r < 0) return t;
  t.boxes = tiles.boxes.at(static_cast<size_t>(r));
  for (const Box& b : t.boxes) t.data.emplace_back(static_cast<size_t>(b.numel() * element_bytes), 0);
  return t;
}

TileData TileData::uninitialised(const TileMap& tiles, int64_t r, int64_t element_bytes) {
  TileData t;
  t.element_bytes = element_bytes;
  if (r < 0) return t;
  t.boxes = tiles.boxes.at(static_cast<size_t>(r));
  for (const Box& b : t.boxes) t.data.emplace_back(static_cast<size_t>(b.numel() * element_bytes));
  return t;
}

TileBytes TileData::pack(const Box& box) const {
  TileBytes out(static_cast<size_t>(box.numel() * element_bytes));
  for (size_t k = 0; k < boxes.size(); ++k) {
    if (boxes[k].contains(box)) {
      copy_region(box, boxes[k], data[k].data(), box, out.data(), element_bytes);
      return out;
    }
  }
  throw OasesError(fmt::format("resharding: this rank's tile holds no box containing {}", box.to_string()));
}

namespace {

// Byte offset of `region` inside the dense `box` when it is one contiguous run, else -1.
int64_t contiguous_offset(const Box& region, const Box& box, int64_t es) {
  size_t nd = region.offset.size();
  if (!box.contains(region)) return -1;
  size_t d = nd;  // dims d.. are whole; dims before the first partial one must be single
  while (d > 0 && region.extent[d - 1] == box.extent[d - 1]) --d;
  if (d > 0) --d;  // the one partial (or first) dim may cover any range
  for (size_t k = 0; k < d; ++k) {
    if (region.extent[k] != 1) return -1;
  }
  int64_t off = 0, stride = es;
  for (size_t k = nd; k-- > 0;) {
    off += (region.offset[k] - box.offset[k]) * stride;
    stride *= box.extent[k];
  }
  return off;
}

}  // namespace

const char* TileData::contiguous(const Box& box) const {
  return view_of(*this).contiguous(box);
}

void TileData::copy_from(const TileData& from, const Box& box) {
  for (size_t j = 0; j < from.boxes.size(); ++j) {
    if (!from.boxes[j].contains(box)) continue;
    for (size_t k = 0; k < boxes.size(); ++k) {
      if (boxes[k].contains(box)) {
        copy_region(box, from.boxes[j], from.data[j].data(), boxes[k], data[k].data(), element_bytes);
        return;
      }
    }
    throw OasesError(fmt::format("resharding: this rank's tile has no box for {}", box.to_string()));
  }
  throw OasesError(fmt::format("resharding: this rank's tile holds no box containing {}", box.to_string()));
}

namespace {

// Runs `work`, then drives `progress` (if any) until it says the transfer is done, and sleeps until
// `seconds` have passed since the call.
void settle(double seconds, const std::function<void()>& work, const std::function<bool()>& progress) {
  auto until = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  work();
  while (progress && std::chrono::steady_clock::now() < until) {
    if (progress()) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::this_thread::sleep_until(until);
}

}  // namespace

std::string make_cards_folder() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "oases_cards_XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  return mkdtemp(buf.data()) ? std::string(buf.data()) : std::string();
}

void HostCards::hold(std::vector<int> hosts, double seconds, const std::function<void()>& work,
                     const std::function<bool()>& progress) const {
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  std::vector<int> fds;
  if (hosts.size() > 1) {
    for (int h : hosts) {
      std::string path = fmt::format("{}/card{}", dir_, h);
      int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0 || ::flock(fd, LOCK_EX) != 0) {
        for (int f : fds) ::close(f);  // closing releases the locks taken so far
        if (fd >= 0) ::close(fd);
        throw OasesError(fmt::format("link emulation: cannot lock {}: {}", path, std::strerror(errno)));
      }
      fds.push_back(fd);
    }
  }
  try {
    settle(seconds, work, progress);
  } catch (...) {
    for (int f : fds) ::close(f);
    throw;
  }
  for (int f : fds) ::close(f);
}

int TileView::holding(const Box& box) const {
  for (size_t k = 0; k < boxes.size(); ++k) {
    if (boxes[k].contains(box)) return static_cast<int>(k);
  }
  return -1;
}

char* TileView::contiguous(const Box& box) const {
  for (size_t k = 0; k < boxes.size(); ++k) {
    int64_t off = contiguous_offset(box, boxes[k], element_bytes);
    if (off >= 0) return data[k] + off;
  }
  return nullptr;
}

TileView view_of(const TileData& t) {
  TileView v;
  v.boxes = t.boxes;
  v.element_bytes = t.element_bytes;
  for (const TileBytes& d : t.data) v.data.push_back(const_cast<char*>(d.data()));
  return v;
}

char* HostTileMemory::scratch(int64_t bytes) {
  scratch_.emplace_back(static_cast<size_t>(bytes));
  return scratch_.back().data();
}

void HostTileMemory::copy_region(const Box& region, const Box& from_box, const char* from, const Box& to_box, char* to, int64_t es) {
  oases::copy_region(region, from_box, from, to_box, to, es);
}

TileData run_reshard(const ReshardPlan& plan, const ReshardProblem& p, Communicator& comm, const TileData& src, const ReshardRunOptions& o,
                     ReshardRunStats* stats) {
  auto dst_tiles = tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh);
  if (!dst_tiles) throw OasesError(dst_tiles.status().message());
  TileData dst = TileData::uninitialised(*dst_tiles, p.dst.placed.mesh_rank(comm.rank()), p.element_bytes);
  HostTileMemory mem;
  run_reshard_into(plan, p, comm, view_of(src), view_of(dst), mem, o, stats);
  return dst;
}

void run_reshard_into(const ReshardPlan& plan, const ReshardProblem& p, Communicator& comm, const TileView& src_in, const TileView& dst,
                      TileMemory& mem, const ReshardRunOptions& o, ReshardRunStats* stats) {
  ReshardRunStats local_stats;
  ReshardRunStats& st = stats ? *stats : local_stats;
  const int me = comm.rank();
  const int64_t es = p.element_bytes;
  void* const stream = mem.stream();
  if (stream) comm.set_stream(stream);
  // a channel group's calls go on the memory's stream (device groups)
  auto on_stream = [&](CommGroup& g) -> CommGroup& {
    if (stream) {
      if (auto* sg = dynamic_cast<StreamGroup*>(&g)) sg->set_stream(stream);
    }
    return g;
  };
  auto ints = [](const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); };
  // a broadcast's group: its sender (member 0), then its receivers
  auto broadcast_members = [](const Transfer& t) {
    std::vector<int> members{static_cast<int>(t.sender)};
    for (int64_t r : t.receivers) members.push_back(static_cast<int>(r));
    return members;
  };
  auto copy = [&](const Box& box, const TileView& from, const TileView& to) {
    int j = from.holding(box), k = to.holding(box);
    if (j < 0) throw OasesError(fmt::format("resharding: this rank's tile holds no box containing {}", box.to_string()));
    if (k < 0) throw OasesError(fmt::format("resharding: this rank's tile has no box for {}", box.to_string()));
    mem.copy_region(box, from.boxes[static_cast<size_t>(j)], from.data[static_cast<size_t>(j)], to.boxes[static_cast<size_t>(k)],
                    to.data[static_cast<size_t>(k)], es);
  };
  // A tile of `boxes` in scratch memory.
  auto scratch_tile = [&](const std::vector<Box>& boxes) {
    TileView t;
    t.boxes = boxes;
    t.element_bytes = es;
    for (const Box& b : boxes) t.data.push_back(mem.scratch(b.numel() * es));
    return t;
  };

  // 0. The communicators this rank's transfers need, made before anything is issued, in the one
  // global order (a device communicator cannot make them inside a batch).
  for (const PreReduction& pr : plan.pre) {
    for (const auto& g : pr.groups) {
      if (std::find(g.begin(), g.end(), me) != g.end()) comm.channel_group(ints(g), o.tag);
    }
  }
  for (const Transfer& t : plan.order) {
    bool receiver = std::find(t.receivers.begin(), t.receivers.end(), me) != t.receivers.end();
    if (t.kind == TransferKind::kSend) {
      if (t.sender == me) comm.connect(static_cast<int>(t.receivers.front()), o.tag);
      if (receiver) comm.connect(static_cast<int>(t.sender), o.tag);
    } else if (t.kind == TransferKind::kBroadcast) {
      if (t.sender == me || receiver) comm.channel_group(broadcast_members(t), o.tag);
    } else if (receiver) {
      comm.channel_group(ints(t.receivers), o.tag);
    }
  }

  // A sender's part of a transfer, under emulation holding the cards it crosses for the modelled time.
  std::vector<std::unique_ptr<CommRequest>> sent;  // their packed bytes live in `mem`
  // The request the work started is driven while the cards are held.
  auto emulate = [&](const Transfer& t, const std::function<void()>& work) {
    if (!o.cards) return work();
    std::vector<int> hosts;
    if (t.sender >= 0) hosts.push_back(o.cluster.host_of.at(static_cast<size_t>(t.sender)));
    for (int64_t r : t.receivers) hosts.push_back(o.cluster.host_of.at(static_cast<size_t>(r)));
    o.cards->hold(hosts, transfer_seconds(t, o.cluster), work, [&] { return sent.empty() || sent.back()->test(); });
  };

  // 1. A partial source is summed over each partial group (in one order on every rank), then cut
  // down to its tile of the effective layout.
  TileView reduced;  // the source after its pre-reductions (a partial source only)
  int64_t src_rank = p.src.placed.mesh_rank(me);
  bool pre = !plan.pre.empty() && src_rank >= 0;
  if (pre) {
    TileView sum = scratch_tile(src_in.boxes);
    for (const Box& b : sum.boxes) copy(b, src_in, sum);
    for (const PreReduction& pr : plan.pre) {
      for (const auto& g : pr.groups) {
        if (std::find(g.begin(), g.end(), me) == g.end()) continue;
        CommGroup& group = on_stream(comm.channel_group(ints(g), o.tag));
        for (size_t k = 0; k < sum.boxes.size(); ++k)
          group.all_reduce(sum.data[k], sum.boxes[k].numel() * es / static_cast<int64_t>(dtype_size(o.dtype)), o.dtype, ReduceOp::kSum);
      }
    }
    auto eff = tile_boxes(plan.effective_src, p.shape, plan.effective_src_mesh);
    if (!eff) throw OasesError(eff.status().message());
    reduced = scratch_tile(eff->boxes.at(static_cast<size_t>(src_rank)));
    for (const Box& b : reduced.boxes) copy(b, sum, reduced);
  }
  const TileView& src = pre ? reduced : src_in;

  // 2. Local copies: a destination rank that holds the box already.
  for (const UnitTask& t : plan.tasks) {
    if (std::find(t.local.begin(), t.local.end(), me) == t.local.end()) continue;
    copy(t.box, src, dst);
  }

  // 3. The transfers, in the one global order.
  // A receive lands in the destination tile itself when its box is contiguous there, else in a
  // buffer unpacked when it is finished.
  struct Pending {
    std::unique_ptr<CommRequest> req;
    TileView buf;  // one box, when not direct
    Box box;
    char* direct = nullptr;
    bool unpacked = false;
    int64_t bytes = 0;
  };
  std::map<int, Pending> received;  // by transfer index (and slice: index * 1024 + member)
  auto expect = [&](const Box& box) {
    Pending pd;
    pd.box = box;
    pd.bytes = box.numel() * es;
    pd.direct = dst.contiguous(box);
    if (!pd.direct) pd.buf = scratch_tile({box});
    return pd;
  };
  auto target = [](Pending& pd) { return pd.direct ? pd.direct : pd.buf.data[0]; };
  auto finish = [&](Pending& pd) {
    if (pd.unpacked) return;
    pd.req->wait_ordered();
    if (!pd.direct) copy(pd.box, pd.buf, dst);
    st.bytes_received += pd.bytes;
    pd.unpacked = true;
  };
  // A send goes from the tile itself when the box is contiguous there, else from a packed copy.
  auto send_bytes = [&](const TileView& from, const Box& box, const std::function<std::unique_ptr<CommRequest>(const char*, int64_t)>& post) {
    int64_t bytes = box.numel() * es;
    const char* data = from.contiguous(box);
    if (!data) {
      TileView packed = scratch_tile({box});
      copy(box, from, packed);
      data = packed.data[0];
    }
    sent.push_back(post(data, bytes));
    st.bytes_sent += bytes;
  };
  comm.begin_batch();
  try {
    for (size_t i = 0; i < plan.order.size(); ++i) {
      const Transfer& t = plan.order[i];
      const int key = static_cast<int>(i) * 1024;
      bool receiver = std::find(t.receivers.begin(), t.receivers.end(), me) != t.receivers.end();
      if (t.kind == TransferKind::kSend) {
        if (t.sender == me) {
          emulate(t, [&] {
            send_bytes(src, t.box, [&](const char* d, int64_t n) { return comm.isend(d, n, static_cast<int>(t.receivers.front()), o.tag); });
          });
          ++st.transfers;
        } else if (receiver) {
          Pending pd = expect(t.box);
          pd.req = comm.irecv(target(pd), pd.bytes, static_cast<int>(t.sender), o.tag);
          received.emplace(key, std::move(pd));
          ++st.transfers;
        }
      } else if (t.kind == TransferKind::kBroadcast) {
        if (t.sender != me && !receiver) continue;
        CommGroup& g = on_stream(comm.channel_group(broadcast_members(t), o.tag));
        ++st.transfers;
        if (t.sender == me) {
          // the root's buffer is only read
          emulate(t, [&] { send_bytes(src, t.box, [&](const char* d, int64_t n) { return g.ibroadcast(const_cast<char*>(d), n, 0); }); });
        } else {
          Pending pd = expect(t.box);
          pd.req = g.ibroadcast(target(pd), pd.bytes, 0);
          received.emplace(key, std::move(pd));
        }
      } else {  // all-gather inside one host: each member broadcasts the slice it was sent
        if (!receiver) continue;
        if (t.receivers.size() > 1024) throw OasesError("resharding: an all-gather of more than 1024 ranks");
        int index = static_cast<int>(std::find(t.receivers.begin(), t.receivers.end(), me) - t.receivers.begin());
        // the slices this rank passes on must have arrived: the batch so far goes out first
        bool waits = false;
        for (int a : t.after) waits |= received.count(a * 1024) && !received.at(a * 1024).unpacked;
        if (waits) {
          comm.end_batch();
          for (int a : t.after) {
            auto it = received.find(a * 1024);
            if (it != received.end()) finish(it->second);
          }
          comm.begin_batch();
        }
        CommGroup& g = on_stream(comm.channel_group(ints(t.receivers), o.tag));
        for (size_t k = 0; k < t.slices.size(); ++k) {
          const Box& s = t.slices[k];
          if (s.empty()) continue;
          ++st.transfers;
          if (static_cast<int>(k) == index) {
            double modelled =
                o.cards && o.cluster.intra.enabled() ? o.cluster.intra.broadcast_s(static_cast<double>(s.numel() * es), g.size()) : 0.0;
            settle(modelled,
                   [&] {
                     send_bytes(dst, s, [&](const char* d, int64_t n) { return g.ibroadcast(const_cast<char*>(d), n, static_cast<int>(k)); });
                   },
                   {});
          } else {
            Pending pd = expect(s);
            pd.req = g.ibroadcast(target(pd), pd.bytes, static_cast<int>(k));
            received.emplace(key + static_cast<int>(k) + 1, std::move(pd));
          }
        }
      }
    }
  } catch (...) {
    comm.end_batch();
    throw;
  }
  comm.end_batch();
  for (auto& [k, pd] : received) finish(pd);
  for (auto& req : sent) req->wait_ordered();
}

namespace {

// A Reshard node's tiles in its operands' memory (one box each at most; none where the rank is
// outside the mesh).
TileView reshard_source(const KernelContext& c, const ReshardProblem& p, int64_t me) {
  TileView src;
  src.element_bytes = p.element_bytes;
  int64_t sr = p.src.placed.mesh_rank(me);
  if (sr < 0 || !c.has_input(0)) return src;
  auto tiles = tile_boxes(p.src.spec, p.shape, p.src.placed.mesh);
  if (!tiles) c.fail("{}", tiles.status().message());
  src.boxes = tiles->boxes[static_cast<size_t>(sr)];
  if (src.boxes.size() > 1) c.fail("the source tile of rank {} has {} boxes; a Reshard node takes one", me, src.boxes.size());
  if (!src.boxes.empty()) {
    if (src.boxes[0].numel() * p.element_bytes != static_cast<int64_t>(c.in[0].nbytes()))
      c.fail("the source tile {} is not the input's {} bytes", src.boxes[0].to_string(), c.in[0].nbytes());
    src.data.push_back(static_cast<char*>(const_cast<void*>(c.in[0].data)));
  }
  return src;
}

TileView reshard_destination(const KernelContext& c, const ReshardProblem& p, int64_t me) {
  TileView dst;
  dst.element_bytes = p.element_bytes;
  int64_t dr = p.dst.placed.mesh_rank(me);
  if (dr < 0) return dst;
  auto tiles = tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh);
  if (!tiles) c.fail("{}", tiles.status().message());
  dst.boxes = tiles->boxes[static_cast<size_t>(dr)];
  if (dst.boxes.size() > 1) c.fail("the destination tile of rank {} has {} boxes; a Reshard node takes one", me, dst.boxes.size());
  if (dst.boxes.empty()) return dst;
  if (dst.boxes[0].numel() * p.element_bytes != static_cast<int64_t>(c.out[0].nbytes()))
    c.fail("the destination tile {} is not the output's {} bytes", dst.boxes[0].to_string(), c.out[0].nbytes());
  dst.data.push_back(static_cast<char*>(c.out[0].data));
  return dst;
}

// The source moved to scratch where it shares memory with the destination.
void keep_apart(TileView& src, const TileView& dst, TileMemory& mem) {
  if (src.data.empty() || dst.data.empty()) return;
  const char* a = src.data[0];
  const char* b = dst.data[0];
  int64_t na = src.boxes[0].numel() * src.element_bytes, nb = dst.boxes[0].numel() * dst.element_bytes;
  if (!(a < b + nb && b < a + na)) return;
  char* copy = mem.scratch(na);
  mem.copy_region(src.boxes[0], src.boxes[0], a, src.boxes[0], copy, src.element_bytes);
  src.data[0] = copy;
}

}  // namespace

const PlannedReshard& planned_reshard(const KernelContext& c) {
  if (!c.reshard) c.fail("no transfer plan: the planner plans a program's Reshard nodes as it builds it");
  return *c.reshard;
}

void run_reshard_node(const KernelContext& c, Communicator& comm, TileMemory& mem, const HostCards* cards) {
  const PlannedReshard& planned = planned_reshard(c);
  ReshardProblem p = planned.problem;
  p.element_bytes = static_cast<int64_t>(dtype_size(c.out[0].dtype));  // the program's dtype (float64 in checks)
  const int64_t me = c.attrs().get_int("world_rank", -1);
  if (me != comm.rank()) c.fail("the program is world rank {}'s, it runs on rank {}", me, comm.rank());
  ReshardRunOptions o;
  o.tag = planned.channel;
  o.dtype = c.out[0].dtype;
  o.cluster = planned.cluster;
  o.cards = cards;
  TileView src = reshard_source(c, p, me), dst = reshard_destination(c, p, me);
  keep_apart(src, dst, mem);
  run_reshard_into(planned.plan, p, comm, src, dst, mem, o);
}

namespace {

// The node's transfer plan was made when the program was built (planner/reshard_nodes.h); the
// kernel only takes this rank's part in it.
void reshard_kernel(KernelContext& c) {
  const ReshardCluster& cluster = planned_reshard(c).cluster;
  // a program of one rank (both meshes on rank 0) has no communicator: a world of its own
  std::shared_ptr<LocalWorld> solo_world;
  std::unique_ptr<Communicator> solo;
  Communicator* comm = c.comm;
  if (!comm) {
    if (cluster.world() > 1) c.fail("a Reshard between ranks needs the program's communicator");
    solo_world = make_local_world(1);
    solo = local_communicator(solo_world, 0);
    comm = solo.get();
  }
  // emulated hosts (oases-train --hosts): a transfer between hosts holds their cards for the time
  // the link between hosts takes
  std::optional<HostCards> cards;
  const bool hosts = std::any_of(cluster.host_of.begin(), cluster.host_of.end(), [](int h) { return h != 0; });
  if (!emulated_cards_dir().empty() && hosts) cards.emplace(emulated_cards_dir());
  HostTileMemory mem;
  run_reshard_node(c, *comm, mem, cards ? &*cards : nullptr);
}

std::mutex g_cards_mu;
std::string g_cards_dir;
}  // namespace

void set_emulated_cards_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_cards_mu);
  g_cards_dir = dir;
}

std::string emulated_cards_dir() {
  std::lock_guard<std::mutex> lock(g_cards_mu);
  return g_cards_dir;
}

void register_reshard(CpuKernelRegistry& r) {
  r.add(kOasesDomain, "Reshard", reshard_kernel);
}

}  // namespace oases
