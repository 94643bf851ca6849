#include "planner/reshard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

namespace oases {

const char* strategy_name(ReshardStrategy s) {
  switch (s) {
    case ReshardStrategy::kSendRecv: return "sendrecv";
    case ReshardStrategy::kAllGather: return "allgather";
    case ReshardStrategy::kBroadcast: return "broadcast";
    case ReshardStrategy::kAuto: return "auto";
  }
  return "?";
}

Expected<ReshardStrategy> parse_reshard_strategy(const std::string& text) {
  for (auto s : {ReshardStrategy::kSendRecv, ReshardStrategy::kAllGather, ReshardStrategy::kBroadcast, ReshardStrategy::kAuto}) {
    if (text == strategy_name(s)) return s;
  }
  return error("--strategy '{}': use sendrecv, allgather, broadcast or auto", text);
}

ReshardCluster ReshardCluster::spread(int64_t world, int hosts, LinkModel inter, LinkModel intra) {
  ReshardCluster c{{}, inter, intra};
  hosts = static_cast<int>(std::clamp<int64_t>(hosts, 1, std::max<int64_t>(world, 1)));
  int64_t per = (world + hosts - 1) / hosts;
  for (int64_t r = 0; r < world; ++r) c.host_of.push_back(static_cast<int>(r / per));
  return c;
}

namespace {

std::vector<int64_t> to_world(const PlacedMesh& p, const std::vector<int64_t>& mesh_ranks) {
  std::vector<int64_t> w;
  for (int64_t r : mesh_ranks) w.push_back(p.ranks[static_cast<size_t>(r)]);
  std::sort(w.begin(), w.end());
  return w;
}

int64_t max_tile_numel(const TileMap& t) {
  int64_t n = 0;
  for (const auto& bs : t.boxes) {
    int64_t k = 0;
    for (const Box& b : bs) k += b.numel();
    n = std::max(n, k);
  }
  return n;
}

std::set<int> hosts_of(const ReshardCluster& c, int64_t sender, const std::vector<int64_t>& receivers) {
  std::set<int> h{c.host_of[static_cast<size_t>(sender)]};
  for (int64_t r : receivers) h.insert(c.host_of[static_cast<size_t>(r)]);
  return h;
}

// Resources a transfer holds: the cards of every host it crosses (ids 0 … hosts-1) or, inside one
// host, its ranks (ids hosts + rank).
std::vector<int> resources(const Transfer& t, const ReshardCluster& c, int hosts) {
  std::set<int> h = hosts_of(c, t.sender >= 0 ? t.sender : t.receivers.front(), t.receivers);
  if (h.size() > 1) return {h.begin(), h.end()};
  std::set<int> r;
  if (t.sender >= 0) r.insert(hosts + static_cast<int>(t.sender));
  for (int64_t x : t.receivers) r.insert(hosts + static_cast<int>(x));
  return {r.begin(), r.end()};
}

int num_hosts(const ReshardCluster& c) {
  int h = 0;
  for (int x : c.host_of) h = std::max(h, x + 1);
  return h;
}

double pre_reduction_seconds(const PreReduction& pr, const ReshardCluster& c) {
  double worst = 0;
  for (const auto& g : pr.groups) {
    std::set<int> h;
    for (int64_t r : g) h.insert(c.host_of[static_cast<size_t>(r)]);
    const LinkModel& link = h.size() > 1 ? c.inter : c.intra;
    int p = static_cast<int>(g.size());
    worst = std::max(
        worst, pr.dim >= 0 ? link.gather_like_s(static_cast<double>(pr.bytes), p) : link.all_reduce_s(static_cast<double>(pr.bytes), p));
  }
  return worst;
}

// Splits `box` along its longest dimension into at most n non-empty slices (the last shorter).
std::vector<Box> slice_box(const Box& box, int64_t n) {
  size_t d = 0;
  for (size_t i = 1; i < box.extent.size(); ++i) {
    if (box.extent[i] > box.extent[d]) d = i;
  }
  std::vector<Box> out;
  if (box.extent.empty()) return {box};
  int64_t len = (box.extent[d] + n - 1) / n;
  for (int64_t i = 0; i < n; ++i) {
    int64_t lo = i * len, hi = std::min(box.extent[d], (i + 1) * len);
    if (hi <= lo) break;
    Box s = box;
    s.offset[d] += lo;
    s.extent[d] = hi - lo;
    out.push_back(s);
  }
  return out;
}

// --- sender and order search for broadcasts ---------------------------------------------------

struct Choice {
  std::vector<int> res;
  double seconds = 0;
};

// Per task, per candidate sender: the resources and duration of its broadcast.
std::vector<std::vector<Choice>> broadcast_choices(const std::vector<UnitTask>& tasks, const ReshardCluster& c, int hosts) {
  std::vector<std::vector<Choice>> out(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    for (int64_t s : tasks[i].senders) {
      Transfer t;
      t.kind = tasks[i].receivers.size() == 1 ? TransferKind::kSend : TransferKind::kBroadcast;
      t.sender = s;
      t.receivers = tasks[i].receivers;
      t.bytes = tasks[i].bytes;
      out[i].push_back({resources(t, c, hosts), transfer_seconds(t, c)});
    }
  }
  return out;
}

double place(const Choice& ch, std::vector<double>& free) {
  double start = 0;
  for (int r : ch.res) start = std::max(start, free[static_cast<size_t>(r)]);
  double end = start + ch.seconds;
  for (int r : ch.res) free[static_cast<size_t>(r)] = end;
  return end;
}

struct Placement {
  int task, sender;  // sender: index into the task's senders
};

// Largest task first, each to the sender that ends it soonest (ties: the sender that has sent
// the fewest bytes so far, then the lowest rank).
std::vector<Placement> greedy_order(const std::vector<UnitTask>& tasks, const std::vector<std::vector<Choice>>& ch, size_t nres,
                                    double* makespan) {
  std::vector<int> idx;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!tasks[i].receivers.empty()) idx.push_back(static_cast<int>(i));
  }
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
    double ta = ch[static_cast<size_t>(a)].front().seconds, tb = ch[static_cast<size_t>(b)].front().seconds;
    return ta > tb;
  });
  std::vector<double> free(nres, 0.0);
  std::map<int64_t, int64_t> sent;
  std::vector<Placement> out;
  double span = 0;
  for (int i : idx) {
    const auto& opts = ch[static_cast<size_t>(i)];
    int best = 0;
    double best_end = std::numeric_limits<double>::infinity();
    for (size_t s = 0; s < opts.size(); ++s) {
      std::vector<double> f = free;
      double end = place(opts[s], f);
      int64_t sender = tasks[static_cast<size_t>(i)].senders[s];
      int64_t best_sender = tasks[static_cast<size_t>(i)].senders[static_cast<size_t>(best)];
      if (end < best_end - 1e-15 || (end <= best_end + 1e-15 && sent[sender] < sent[best_sender])) {
        best = static_cast<int>(s);
        best_end = end;
      }
    }
    span = std::max(span, place(opts[static_cast<size_t>(best)], free));
    sent[tasks[static_cast<size_t>(i)].senders[static_cast<size_t>(best)]] += tasks[static_cast<size_t>(i)].bytes;
    out.push_back({i, best});
  }
  *makespan = span;
  return out;
}

class BroadcastSearch {
 public:
  BroadcastSearch(const std::vector<UnitTask>& tasks, const std::vector<std::vector<Choice>>& ch, size_t nres, int64_t budget)
      : tasks_(tasks), ch_(ch), nres_(nres), budget_(budget) {
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].receivers.empty()) continue;
      todo_.push_back(static_cast<int>(i));
      // Resources every choice of sender holds, and the shortest duration: the bound's share.
      std::set<int> must(ch[i].front().res.begin(), ch[i].front().res.end());
      double shortest = ch[i].front().seconds;
      for (const Choice& c : ch[i]) {
        std::set<int> keep;
        for (int r : c.res) {
          if (must.count(r)) keep.insert(r);
        }
        must = keep;
        shortest = std::min(shortest, c.seconds);
      }
      must_[i] = {must.begin(), must.end()};
      shortest_[i] = shortest;
    }
  }

  // Returns whether the search finished within its budget (the best is then optimal).
  bool run(std::vector<Placement> seed, double seed_span) {
    best_ = std::move(seed);
    best_span_ = seed_span;
    std::vector<double> free(nres_, 0.0);
    std::vector<bool> done(tasks_.size(), false);
    std::vector<Placement> path;
    dfs(free, done, path, 0.0);
    return nodes_ <= budget_;
  }
  const std::vector<Placement>& best() const { return best_; }
  double best_span() const { return best_span_; }
  int64_t nodes() const { return nodes_; }

 private:
  double bound(const std::vector<double>& free, const std::vector<bool>& done, double span) const {
    std::vector<double> load = free;
    for (int i : todo_) {
      if (done[static_cast<size_t>(i)]) continue;
      for (int r : must_.at(i)) load[static_cast<size_t>(r)] += shortest_.at(i);
    }
    return std::max(span, *std::max_element(load.begin(), load.end()));
  }

  // Two tasks with the same senders, receivers and size are interchangeable: branch on the first.
  bool same(int a, int b) const {
    const UnitTask &x = tasks_[static_cast<size_t>(a)], &y = tasks_[static_cast<size_t>(b)];
    return x.bytes == y.bytes && x.senders == y.senders && x.receivers == y.receivers;
  }

  void dfs(std::vector<double>& free, std::vector<bool>& done, std::vector<Placement>& path, double span) {
    if (++nodes_ > budget_) return;
    if (path.size() == todo_.size()) {
      if (span < best_span_ - 1e-15) {
        best_span_ = span;
        best_ = path;
      }
      return;
    }
    if (bound(free, done, span) >= best_span_ - 1e-15) return;
    for (size_t k = 0; k < todo_.size(); ++k) {
      int i = todo_[k];
      if (done[static_cast<size_t>(i)]) continue;
      bool twin = false;
      for (size_t j = 0; j < k && !twin; ++j) twin = !done[static_cast<size_t>(todo_[j])] && same(todo_[j], i);
      if (twin) continue;
      for (size_t s = 0; s < ch_[static_cast<size_t>(i)].size(); ++s) {
        std::vector<double> saved = free;
        double end = place(ch_[static_cast<size_t>(i)][s], free);
        done[static_cast<size_t>(i)] = true;
        path.push_back({i, static_cast<int>(s)});
        dfs(free, done, path, std::max(span, end));
        path.pop_back();
        done[static_cast<size_t>(i)] = false;
        free = std::move(saved);
        if (nodes_ > budget_) return;
      }
    }
  }

  const std::vector<UnitTask>& tasks_;
  const std::vector<std::vector<Choice>>& ch_;
  size_t nres_;
  int64_t budget_;
  int64_t nodes_ = 0;
  std::vector<int> todo_;
  std::map<int, std::vector<int>> must_;
  std::map<int, double> shortest_;
  std::vector<Placement> best_;
  double best_span_ = 0;
};

Transfer broadcast_transfer(const UnitTask& t, int task, int sender_index) {
  Transfer x;
  x.kind = t.receivers.size() == 1 ? TransferKind::kSend : TransferKind::kBroadcast;
  x.task = task;
  x.sender = t.senders[static_cast<size_t>(sender_index)];
  x.receivers = t.receivers;
  x.box = t.box;
  x.bytes = t.bytes;
  return x;
}

// The sender of a baseline: one on the receiver's host when there is one, else the replicas in
// turn.
int64_t baseline_sender(const UnitTask& t, const ReshardCluster& c, int64_t receiver, size_t turn) {
  for (int64_t s : t.senders) {
    if (c.host_of[static_cast<size_t>(s)] == c.host_of[static_cast<size_t>(receiver)]) return s;
  }
  return t.senders[turn % t.senders.size()];
}

void plan_sendrecv(ReshardPlan& p, const ReshardCluster& c) {
  size_t turn = 0;
  for (size_t i = 0; i < p.tasks.size(); ++i) {
    const UnitTask& t = p.tasks[i];
    for (int64_t r : t.receivers) {
      Transfer x;
      x.kind = TransferKind::kSend;
      x.task = static_cast<int>(i);
      x.sender = baseline_sender(t, c, r, turn++);
      x.receivers = {r};
      x.box = t.box;
      x.bytes = t.bytes;
      p.order.push_back(x);
    }
  }
}

void plan_allgather(ReshardPlan& p, const ReshardCluster& c) {
  size_t turn = 0;
  for (size_t i = 0; i < p.tasks.size(); ++i) {
    const UnitTask& t = p.tasks[i];
    std::map<int, std::vector<int64_t>> by_host;
    for (int64_t r : t.receivers) by_host[c.host_of[static_cast<size_t>(r)]].push_back(r);
    for (auto& [host, rs] : by_host) {
      int64_t sender = baseline_sender(t, c, rs.front(), turn++);
      std::vector<Box> slices = slice_box(t.box, static_cast<int64_t>(rs.size()));
      std::vector<int> sends;
      for (size_t k = 0; k < slices.size(); ++k) {
        Transfer x;
        x.kind = TransferKind::kSend;
        x.task = static_cast<int>(i);
        x.sender = sender;
        x.receivers = {rs[k]};
        x.box = slices[k];
        x.bytes = slices[k].numel() * t.bytes / std::max<int64_t>(1, t.box.numel());
        sends.push_back(static_cast<int>(p.order.size()));
        p.order.push_back(x);
      }
      if (rs.size() < 2) continue;
      Transfer g;
      g.kind = TransferKind::kAllGather;
      g.task = static_cast<int>(i);
      g.receivers = rs;
      g.box = t.box;
      g.slices = slices;
      g.slices.resize(rs.size(), Box{t.box.offset, std::vector<int64_t>(t.box.extent.size(), 0)});
      g.bytes = t.bytes;
      g.after = sends;
      p.order.push_back(g);
    }
  }
}

}  // namespace

void order_broadcasts(ReshardPlan& p, const ReshardCluster& c, const ReshardOptions& o) {
  int hosts = num_hosts(c);
  size_t nres = static_cast<size_t>(hosts) + static_cast<size_t>(c.world());
  auto ch = broadcast_choices(p.tasks, c, hosts);
  double span = 0;
  std::vector<Placement> order = greedy_order(p.tasks, ch, nres, &span);
  if (static_cast<int64_t>(order.size()) <= o.search_max_tasks && order.size() > 1) {
    BroadcastSearch search(p.tasks, ch, nres, o.search_nodes);
    p.search_complete = search.run(order, span);
    p.searched_nodes = search.nodes();
    order = search.best();
  }
  for (const Placement& pl : order) p.order.push_back(broadcast_transfer(p.tasks[static_cast<size_t>(pl.task)], pl.task, pl.sender));
}

double transfer_seconds(const Transfer& t, const ReshardCluster& c) {
  // A link without a model (bandwidth 0) costs nothing: only the modelled links are scheduled.
  auto cost = [&](const LinkModel& l, double s) { return l.enabled() ? s : 0.0; };
  double bytes = static_cast<double>(t.bytes);
  if (t.kind == TransferKind::kAllGather) return cost(c.intra, c.intra.gather_like_s(bytes, static_cast<int>(t.receivers.size())));
  std::set<int> h = hosts_of(c, t.sender, t.receivers);
  int members = static_cast<int>(t.receivers.size()) + 1;
  // A broadcast is a pipelined ring: across hosts each card carries the data once.
  if (h.size() > 1) return cost(c.inter, c.inter.broadcast_s(bytes, t.kind == TransferKind::kSend ? 2 : static_cast<int>(h.size())));
  return cost(c.intra, c.intra.broadcast_s(bytes, t.kind == TransferKind::kSend ? 2 : members));
}

double simulate_reshard(ReshardPlan& plan, const ReshardCluster& c) {
  double t0 = 0;
  for (const PreReduction& pr : plan.pre) t0 += pre_reduction_seconds(pr, c);
  int hosts = num_hosts(c);
  std::vector<double> free(static_cast<size_t>(hosts) + static_cast<size_t>(c.world()), t0);
  double span = t0;
  for (Transfer& t : plan.order) {
    double start = t0;
    for (int r : resources(t, c, hosts)) start = std::max(start, free[static_cast<size_t>(r)]);
    for (int a : t.after) start = std::max(start, plan.order[static_cast<size_t>(a)].end_s);
    t.start_s = start;
    t.end_s = start + transfer_seconds(t, c);
    for (int r : resources(t, c, hosts)) free[static_cast<size_t>(r)] = t.end_s;
    span = std::max(span, t.end_s);
  }
  plan.predicted_s = span;
  return span;
}

double brute_force_broadcast_makespan(const std::vector<UnitTask>& tasks, const ReshardCluster& c) {
  int hosts = num_hosts(c);
  size_t nres = static_cast<size_t>(hosts) + static_cast<size_t>(c.world());
  auto ch = broadcast_choices(tasks, c, hosts);
  std::vector<int> perm;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!tasks[i].receivers.empty()) perm.push_back(static_cast<int>(i));
  }
  double best = std::numeric_limits<double>::infinity();
  do {
    // every sender choice for this order, as a mixed-radix counter
    std::vector<size_t> pick(perm.size(), 0);
    while (true) {
      std::vector<double> free(nres, 0.0);
      double span = 0;
      for (size_t k = 0; k < perm.size(); ++k) span = std::max(span, place(ch[static_cast<size_t>(perm[k])][pick[k]], free));
      best = std::min(best, span);
      size_t k = 0;
      while (k < pick.size() && ++pick[k] == ch[static_cast<size_t>(perm[k])].size()) pick[k++] = 0;
      if (k == pick.size()) break;
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  return perm.empty() ? 0 : best;
}

Expected<ReshardPlan> reshard_tasks(const ReshardProblem& p, const ReshardCluster& c) {
  if (c.world() < 1) return error("resharding needs a world of at least one rank");
  if (Status st = p.src.placed.validate(c.world()); !st) return st.with_context("source mesh");
  if (Status st = p.dst.placed.validate(c.world()); !st) return st.with_context("destination mesh");
  for (int64_t d : p.shape) {
    if (d < 0) return error("shape {} has a negative dimension", shape_str(p.shape));
  }
  if (p.dst.spec.any_partial())
    return error("destination layout {} is a partial sum: a resharding delivers whole values", p.dst.spec.to_string(&p.dst.placed.mesh));
  auto dst_tiles = tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh);
  if (!dst_tiles) return dst_tiles.status().with_context("destination layout");
  auto src_start = tile_boxes(p.src.spec, p.shape, p.src.placed.mesh);
  if (!src_start) return src_start.status().with_context("source layout");

  ReshardPlan plan;
  plan.effective_src = p.src.spec;
  plan.effective_src_mesh = p.src.placed.mesh;
  const Mesh& sm = p.src.placed.mesh;
  // Partial sums: reduce-scatter each partial axis over the largest dimension it may shard (it
  // must not be sharded already), else all-reduce.
  for (int a = 0; a < sm.num_axes(); ++a) {
    if (!plan.effective_src.is_partial(a)) continue;
    auto before = tile_boxes(plan.effective_src, p.shape, sm);
    if (!before) return before.status();
    PreReduction pr;
    pr.axis = a;
    pr.bytes = max_tile_numel(*before) * p.element_bytes;
    int best = -1;
    for (size_t d = 0; d < p.shape.size(); ++d) {
      if (plan.effective_src.dims[d].axis >= 0) continue;
      if (best < 0 || p.shape[d] > p.shape[static_cast<size_t>(best)]) best = static_cast<int>(d);
    }
    pr.dim = best;
    std::set<std::vector<int64_t>> groups;
    for (int64_t r = 0; r < sm.size(); ++r) groups.insert(to_world(p.src.placed, sm.group(r, a)));
    pr.groups.assign(groups.begin(), groups.end());
    plan.effective_src = plan.effective_src.with_partial(a, false);
    if (best >= 0) plan.effective_src = plan.effective_src.with_dim(static_cast<size_t>(best), a);
    plan.pre.push_back(pr);
  }
  auto src_tiles = tile_boxes(plan.effective_src, p.shape, sm);
  if (!src_tiles) return src_tiles.status().with_context("source layout");

  // Each destination replica group needs its boxes; every source replica group holding part of
  // one is a candidate sender set (tiles of a non-partial layout partition the tensor).
  std::map<std::pair<Box, std::vector<int64_t>>, std::set<int64_t>> need;
  for (const auto& dg : dst_tiles->replica_groups) {
    std::vector<int64_t> receivers = to_world(p.dst.placed, dg);
    for (const Box& want : dst_tiles->boxes[static_cast<size_t>(dg.front())]) {
      for (const auto& sg : src_tiles->replica_groups) {
        for (const Box& have : src_tiles->boxes[static_cast<size_t>(sg.front())]) {
          Box part = want.intersect(have);
          if (part.empty()) continue;
          auto& rs = need[{part, to_world(p.src.placed, sg)}];
          rs.insert(receivers.begin(), receivers.end());
        }
      }
    }
  }
  for (auto& [key, rs] : need) {
    UnitTask t;
    t.box = key.first;
    t.senders = key.second;
    for (int64_t r : rs) (std::binary_search(t.senders.begin(), t.senders.end(), r) ? t.local : t.receivers).push_back(r);
    t.bytes = t.box.numel() * p.element_bytes;
    plan.tasks.push_back(std::move(t));
  }
  return plan;
}

namespace {

// Lower bound: what each host's card must take in (a box its host has no replica of), once.
double lower_bound_seconds(const std::vector<UnitTask>& tasks, const ReshardCluster& c) {
  if (!c.inter.enabled()) return 0;
  std::map<int, int64_t> in;
  for (const UnitTask& t : tasks) {
    std::set<int> sender_hosts, receiver_hosts;
    for (int64_t s : t.senders) sender_hosts.insert(c.host_of[static_cast<size_t>(s)]);
    for (int64_t r : t.receivers) receiver_hosts.insert(c.host_of[static_cast<size_t>(r)]);
    for (int h : receiver_hosts) {
      if (!sender_hosts.count(h)) in[h] += t.bytes;
    }
  }
  double lb = 0;
  for (auto [h, bytes] : in) lb = std::max(lb, static_cast<double>(bytes) / (c.inter.bandwidth_gbps * 1e9));
  return lb;
}

// Transfers, order and prediction of one strategy for the tasks of `plan`.
void fill_strategy(ReshardPlan& plan, ReshardStrategy s, const ReshardCluster& c, const ReshardOptions& o) {
  plan.strategy = s;
  switch (s) {
    case ReshardStrategy::kSendRecv: plan_sendrecv(plan, c); break;
    case ReshardStrategy::kAllGather: plan_allgather(plan, c); break;
    default: order_broadcasts(plan, c, o); break;
  }
  simulate_reshard(plan, c);
}

}  // namespace

Expected<ReshardPlan> plan_reshard(const ReshardProblem& p, const ReshardCluster& c, const ReshardOptions& o) {
  auto tasks = reshard_tasks(p, c);
  if (!tasks) return tasks;
  tasks->lower_bound_s = lower_bound_seconds(tasks->tasks, c);
  if (o.strategy != ReshardStrategy::kAuto) {
    fill_strategy(*tasks, o.strategy, c, o);
    return tasks;
  }
  // the fastest predicted of the three, from the one set of tasks
  std::optional<ReshardPlan> best;
  for (auto s : {ReshardStrategy::kBroadcast, ReshardStrategy::kSendRecv, ReshardStrategy::kAllGather}) {
    ReshardPlan plan = *tasks;
    fill_strategy(plan, s, c, o);
    if (!best || plan.predicted_s < best->predicted_s) best = std::move(plan);
  }
  return std::move(*best);
}

std::string describe(const ReshardPlan& plan, const ReshardCluster& c) {
  std::string s;
  for (const PreReduction& pr : plan.pre) {
    s += fmt::format("pre: {} over source axis {} in {} groups ({} B each)\n",
                     pr.dim >= 0 ? fmt::format("reduce-scatter along dimension {}", pr.dim) : std::string("all-reduce"), pr.axis,
                     pr.groups.size(), pr.bytes);
  }
  s += fmt::format("{} unit tasks:\n", plan.tasks.size());
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const UnitTask& t = plan.tasks[i];
    s += fmt::format("  task {} {} {} B: senders {} → receivers {}{}\n", i, t.box.to_string(), t.bytes, fmt::join(t.senders, ","),
                     t.receivers.empty() ? std::string("-") : fmt::format("{}", fmt::join(t.receivers, ",")),
                     t.local.empty() ? std::string() : fmt::format(" (local copy on {})", fmt::join(t.local, ",")));
  }
  s += fmt::format("order ({}, {} transfers):\n", strategy_name(plan.strategy), plan.order.size());
  for (size_t i = 0; i < plan.order.size(); ++i) {
    const Transfer& t = plan.order[i];
    const char* kind = t.kind == TransferKind::kSend ? "send" : t.kind == TransferKind::kBroadcast ? "broadcast" : "all-gather";
    std::string who =
        t.kind == TransferKind::kAllGather
            ? fmt::format("among {}", fmt::join(t.receivers, ","))
            : fmt::format("rank {} (host {}) → {}", t.sender, c.host_of[static_cast<size_t>(t.sender)], fmt::join(t.receivers, ","));
    s += fmt::format("  {:>3} {:<10} task {} {} {} B: {}  [{:.3f} – {:.3f} ms]\n", i, kind, t.task, t.box.to_string(), t.bytes, who,
                     t.start_s * 1e3, t.end_s * 1e3);
  }
  s += fmt::format("predicted {:.3f} ms, lower bound {:.3f} ms{}\n", plan.predicted_s * 1e3, plan.lower_bound_s * 1e3,
                   plan.searched_nodes ? fmt::format(" (order searched over {} nodes{})", plan.searched_nodes,
                                                     plan.search_complete ? ", optimal" : ", budget reached")
                                       : "");
  return s;
}

std::vector<int64_t> reshard_participants(const ReshardPlan& plan) {
  std::set<int64_t> r;
  for (const PreReduction& pr : plan.pre) {
    for (const auto& g : pr.groups) r.insert(g.begin(), g.end());
  }
  for (const Transfer& t : plan.order) {
    if (t.sender >= 0) r.insert(t.sender);
    r.insert(t.receivers.begin(), t.receivers.end());
  }
  return {r.begin(), r.end()};
}

Status check_channel_programs(const std::vector<std::vector<ChannelInstr>>& programs, const Participants& participants) {
  const size_t n = programs.size();
  std::vector<size_t> pc(n, 0);
  std::vector<std::map<int, std::deque<int>>> queues(n);  // per rank, per channel: started ops
  std::vector<std::set<int>> begun(n), done(n);
  std::map<int, std::vector<int64_t>> who;
  auto members = [&](int op) -> const std::vector<int64_t>& {
    auto it = who.find(op);
    if (it == who.end()) it = who.emplace(op, participants(op)).first;
    return it->second;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < n; ++r) {
      for (auto& [ch, q] : queues[r]) {
        while (!q.empty()) {
          int op = q.front();
          if (begun[r].insert(op).second) progress = true;
          bool all = true;
          for (int64_t m : members(op)) all = all && m >= 0 && static_cast<size_t>(m) < n && begun[static_cast<size_t>(m)].count(op);
          if (!all) break;
          done[r].insert(op);
          q.pop_front();
          progress = true;
        }
      }
      while (pc[r] < programs[r].size()) {
        const ChannelInstr& in = programs[r][pc[r]];
        if (in.start) {
          queues[r][in.channel].push_back(in.op);
        } else if (!done[r].count(in.op)) {
          break;
        }
        ++pc[r];
        progress = true;
      }
    }
  }
  std::vector<std::string> stuck;
  for (size_t r = 0; r < n; ++r) {
    std::string what;
    if (pc[r] < programs[r].size()) {
      what = fmt::format("rank {} waits for op {}", r, programs[r][pc[r]].op);
    }
    for (auto& [ch, q] : queues[r]) {
      if (q.empty()) continue;
      std::vector<int64_t> missing;
      for (int64_t m : members(q.front())) {
        if (m < 0 || static_cast<size_t>(m) >= n || !begun[static_cast<size_t>(m)].count(q.front())) missing.push_back(m);
      }
      what += fmt::format("{}rank {}'s channel {} is at op {}, not yet begun by rank(s) {}", what.empty() ? "" : "; ", r, ch, q.front(),
                          fmt::join(missing, ","));
    }
    if (!what.empty()) stuck.push_back(what);
  }
  if (!stuck.empty()) return error("the ranks' programs deadlock: {}", fmt::join(stuck, "; "));
  return Status::ok();
}

}  // namespace oases
