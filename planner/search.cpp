#include "planner/search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

namespace oases {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool interleaved(const std::string& s) {
  return s == "overlap_checkpoint" || s == "oases";
}

// The layouts each part may take for one (schedule, K): feasible, allowed by the options, and for a
// tied head the embedding's degree.
std::vector<std::vector<Layout>> part_layouts(CostModel& m, const SearchOptions& o, int64_t K, int64_t tied_tp) {
  std::vector<std::vector<Layout>> out(static_cast<size_t>(m.num_parts()));
  for (int i = 0; i < m.num_parts(); ++i) {
    for (const Layout& l : allowed_layouts(m.analysis(), m.ranks(), o, i, K)) {
      if (tied_tp > 0 && (i == 0 || i == m.num_parts() - 1) && l.tp != tied_tp) continue;
      if (!m.part(i, l, K).feasible) continue;
      out[static_cast<size_t>(i)].push_back(l);
    }
  }
  return out;
}

// Parts the search treats alike: the same records (plain and sequence-parallel signatures), both
// the first part or not, both the embedding or not (its candidates differ). They have the same
// candidate layouts, feasibility and costs; a 96-layer model has a handful of classes.
std::vector<int> part_classes(const ModelAnalysis& a) {
  std::map<std::string, int> ids;
  std::vector<int> out;
  for (size_t i = 0; i < a.parts.size(); ++i) {
    std::string key =
        fmt::format("{}|{}|{}|{}", a.plain[i].signature, a.seqpar.empty() ? "" : a.seqpar[i].signature, i == 0, a.parts[i] == "embedding");
    out.push_back(ids.emplace(key, static_cast<int>(ids.size())).first->second);
  }
  return out;
}

// part_layouts with no tied degree, priced once per class of parts.
std::vector<std::vector<Layout>> class_layouts(CostModel& m, const SearchOptions& o, int64_t K, const std::vector<int>& cls) {
  std::map<int, std::vector<Layout>> by_class;
  std::vector<std::vector<Layout>> out(static_cast<size_t>(m.num_parts()));
  for (int i = 0; i < m.num_parts(); ++i) {
    auto it = by_class.find(cls[static_cast<size_t>(i)]);
    if (it == by_class.end()) {
      std::vector<Layout> ls;
      for (const Layout& l : allowed_layouts(m.analysis(), m.ranks(), o, i, K)) {
        if (m.part(i, l, K).feasible) ls.push_back(l);
      }
      it = by_class.emplace(cls[static_cast<size_t>(i)], std::move(ls)).first;
    }
    out[static_cast<size_t>(i)] = it->second;
  }
  return out;
}

// The layouts of `all` (class_layouts) that a tied degree leaves: the embedding's and the head's
// of that tp.
std::vector<std::vector<Layout>> with_tied_degree(std::vector<std::vector<Layout>> L, int64_t tied_tp) {
  if (tied_tp <= 0) return L;
  for (size_t i : {size_t{0}, L.size() - 1}) {
    std::vector<Layout> keep;
    for (const Layout& l : L[i]) {
      if (l.tp == tied_tp) keep.push_back(l);
    }
    L[i] = std::move(keep);
  }
  return L;
}

struct Label {
  double obj = 0, mem = 0;
  int prev_state = -1, prev_label = -1;
};

// Costs of one (schedule, K) tabulated per part over its layouts, shared by every part of the same
// shape (a 96-layer model has a handful of distinct parts): obj[a * |L_i| + b] is part i laid out
// L_i[b] after part i-1 laid out L_{i-1}[a] (part 0: obj[b]); mem and tr per layout.
struct PartTable {
  std::vector<double> obj, mem, tr;
};

struct Tables {
  std::vector<std::vector<Layout>> L;  // per part: every layout the options allow
  std::vector<const PartTable*> part;  // per part
  std::map<std::string, PartTable> store;
};

std::string layouts_text(const std::vector<Layout>& ls) {
  std::string t;
  for (const Layout& l : ls) t += l.to_string() + ",";
  return t;
}

// The seconds of moving the batch between two classes of parts' layouts (reshard_seconds, by the
// previous part's layout, then the part's), with K chunks: the same under every schedule.
using ReshardCache = std::map<std::tuple<int, int, int64_t>, std::vector<double>>;

void tabulate(CostModel& m, const ScheduleOptions& s, int64_t K, const std::vector<int>& cls, ReshardCache* reshard, Tables* t) {
  int P = m.num_parts();
  const ModelAnalysis& a = m.analysis();
  t->part.assign(static_cast<size_t>(P), nullptr);
  std::map<std::pair<int, int>, const PartTable*> by_classes;  // (part's class, previous part's class): its layouts' and theirs
  for (int i = 0; i < P; ++i) {
    const std::pair<int, int> cc{cls[static_cast<size_t>(i)], i > 0 ? cls[static_cast<size_t>(i - 1)] : -1};
    if (auto hit = by_classes.find(cc); hit != by_classes.end()) {
      t->part[static_cast<size_t>(i)] = hit->second;
      continue;
    }
    const auto& Li = t->L[static_cast<size_t>(i)];
    const auto* Lp = i > 0 ? &t->L[static_cast<size_t>(i - 1)] : nullptr;
    // what part_objective, part_memory and part_transient read: the part's records (its
    // signatures), whether it is the first, and the layouts on both sides
    std::string key = fmt::format("{}|{}|{}|{}|{}", a.plain[static_cast<size_t>(i)].signature,
                                  a.seqpar.empty() ? "" : a.seqpar[static_cast<size_t>(i)].signature, i == 0, layouts_text(Li),
                                  Lp ? layouts_text(*Lp) : "");
    auto it = t->store.find(key);
    if (it == t->store.end()) {
      PartTable pt;
      std::vector<const PartCost*> cost;
      for (const Layout& l : Li) {
        cost.push_back(&m.part(i, l, K));
        pt.mem.push_back(m.part_memory(i, l, s, K));
        pt.tr.push_back(m.part_transient(i, l, s, K));
      }
      if (i == 0) {
        for (const PartCost* c : cost) pt.obj.push_back(m.part_objective(*c, 0, s, K));
      } else {
        std::vector<double>& r = (*reshard)[{cc.first, cc.second, K}];
        if (r.empty()) {
          for (const Layout& p : *Lp) {
            for (const Layout& l : Li) r.push_back(m.reshard_seconds(i, p, l, K));
          }
        }
        for (size_t ab = 0; ab < r.size(); ++ab) pt.obj.push_back(m.part_objective(*cost[ab % Li.size()], r[ab], s, K));
      }
      it = t->store.emplace(key, std::move(pt)).first;
    }
    t->part[static_cast<size_t>(i)] = &it->second;
    by_classes.emplace(cc, &it->second);
  }
}

struct ChainResult {
  bool found = false;
  double obj = kInf, mem = 0;
  std::vector<Layout> layouts;
};

// Float slack of the bounds below: a bound is taken to pass a threshold only when it passes it by
// more than this (relative), so that rounding in sums taken in another order never cuts the
// optimum.
constexpr double kSlack = 1e-9;
bool above(double bound, double threshold) {
  return bound > threshold + kSlack * std::abs(threshold);
}

// Whether part i may take its layout b in a chain: allowed, and with a working set within the cap.
bool usable(const Tables& t, const std::vector<std::vector<char>>& allowed, double cap, int i, size_t b) {
  return allowed[static_cast<size_t>(i)][b] && t.part[static_cast<size_t>(i)]->tr[b] <= cap;
}

// The path of the chain through usable layouts least in wo * objective + wm * memory: a forward
// program with one value per state. Its objective and memory are summed part by part in chain
// order (as the label programs sum them).
struct WeightedPath {
  bool found = false;
  double value = kInf, obj = 0, mem = 0;
  std::vector<int> path;  // layout index per part
};
WeightedPath weighted_path(const Tables& t, const std::vector<std::vector<char>>& allowed, double cap, double wo, double wm,
                           int64_t* transitions) {
  const int P = static_cast<int>(t.L.size());
  std::vector<size_t> off(static_cast<size_t>(P) + 1, 0);
  for (int i = 0; i < P; ++i) off[static_cast<size_t>(i) + 1] = off[static_cast<size_t>(i)] + t.L[static_cast<size_t>(i)].size();
  std::vector<double> f(off.back(), kInf);
  std::vector<int> pred(off.back(), -1);
  for (int i = 0; i < P; ++i) {
    const PartTable& T = *t.part[static_cast<size_t>(i)];
    const size_t nb = t.L[static_cast<size_t>(i)].size();
    double* fi = &f[off[static_cast<size_t>(i)]];
    int* pi = &pred[off[static_cast<size_t>(i)]];
    int64_t usable_here = 0;
    for (size_t b = 0; b < nb; ++b) usable_here += usable(t, allowed, cap, i, b);
    if (i == 0) {
      for (size_t b = 0; b < nb; ++b) {
        if (usable(t, allowed, cap, 0, b)) fi[b] = wo * T.obj[b] + wm * T.mem[b];
      }
      *transitions += usable_here;
      continue;
    }
    const size_t na = t.L[static_cast<size_t>(i - 1)].size();
    const double* fp = &f[off[static_cast<size_t>(i - 1)]];
    for (size_t a = 0; a < na; ++a) {
      if (!std::isfinite(fp[a])) continue;
      *transitions += usable_here;
      const double* row = &T.obj[a * nb];
      for (size_t b = 0; b < nb; ++b) {
        double v = fp[a] + wo * row[b];
        if (v < fi[b]) {
          fi[b] = v;
          pi[b] = static_cast<int>(a);
        }
      }
    }
    for (size_t b = 0; b < nb; ++b) {
      if (usable(t, allowed, cap, i, b)) {
        fi[b] += wm * T.mem[b];
      } else {
        fi[b] = kInf;
      }
    }
  }
  WeightedPath w;
  const size_t nl = t.L[static_cast<size_t>(P - 1)].size();
  int bs = -1;
  for (size_t b = 0; b < nl; ++b) {
    if (f[off[static_cast<size_t>(P - 1)] + b] < w.value) {
      w.value = f[off[static_cast<size_t>(P - 1)] + b];
      bs = static_cast<int>(b);
    }
  }
  if (bs < 0) return w;
  w.found = true;
  std::vector<int>& path = w.path;
  path.resize(static_cast<size_t>(P));
  for (int i = P - 1; i >= 0; --i) {
    path[static_cast<size_t>(i)] = bs;
    bs = pred[off[static_cast<size_t>(i)] + static_cast<size_t>(bs)];
  }
  for (int i = 0; i < P; ++i) {
    const PartTable& T = *t.part[static_cast<size_t>(i)];
    const size_t b = static_cast<size_t>(path[static_cast<size_t>(i)]);
    const size_t nb = t.L[static_cast<size_t>(i)].size();
    w.obj += i == 0 ? T.obj[b] : T.obj[static_cast<size_t>(path[static_cast<size_t>(i - 1)]) * nb + b];
    w.mem += T.mem[b];
  }
  return w;
}

// The fastest fitting plan among the crossings of two paths of one chain: one path's layouts up to
// some part and the other's after it (both ways round). Between the two ends of the Lagrangian
// hull's edge these are the plans that take some parts one way and the rest the other, as a
// constrained optimum of a chain of identical parts does (layers 0-79 one split, 80-95 another).
double fastest_crossing(const Tables& t, const WeightedPath& x, const WeightedPath& y, double budget) {
  const int P = static_cast<int>(t.L.size());
  auto cost = [&](int i, int prev, int cur) {
    const PartTable& T = *t.part[static_cast<size_t>(i)];
    return i == 0 ? T.obj[static_cast<size_t>(cur)]
                  : T.obj[static_cast<size_t>(prev) * t.L[static_cast<size_t>(i)].size() + static_cast<size_t>(cur)];
  };
  double best = kInf;
  for (const auto& [head, tail] : {std::pair{&x, &y}, std::pair{&y, &x}}) {
    // the tail path's parts from i on: their memory, and their costs after part i (each after
    // the tail's own previous layout)
    std::vector<double> tail_obj(static_cast<size_t>(P) + 1, 0.0), tail_mem(static_cast<size_t>(P) + 1, 0.0);
    for (int i = P - 1; i >= 0; --i) {
      const int cur = tail->path[static_cast<size_t>(i)];
      tail_obj[static_cast<size_t>(i)] =
          tail_obj[static_cast<size_t>(i) + 1] + (i > 0 ? cost(i, tail->path[static_cast<size_t>(i - 1)], cur) : 0);
      tail_mem[static_cast<size_t>(i)] =
          tail_mem[static_cast<size_t>(i) + 1] + t.part[static_cast<size_t>(i)]->mem[static_cast<size_t>(cur)];
    }
    double obj = 0, mem = 0;
    for (int j = 0; j + 1 < P; ++j) {  // the head's layouts for parts 0..j, the tail's after
      const int cur = head->path[static_cast<size_t>(j)];
      obj += cost(j, j > 0 ? head->path[static_cast<size_t>(j - 1)] : cur, cur);
      mem += t.part[static_cast<size_t>(j)]->mem[static_cast<size_t>(cur)];
      const int next = tail->path[static_cast<size_t>(j) + 1];
      const double o = obj + cost(j + 1, cur, next) + tail_obj[static_cast<size_t>(j) + 2];
      const double m = mem + tail_mem[static_cast<size_t>(j) + 1];
      if (m <= budget) best = std::min(best, o);
    }
  }
  return best;
}

// A lower bound on the objective of every plan of one chain (working sets within `cap`, memory
// within `budget`), by Lagrangian relaxation: for any lambda >= 0 no such plan is faster than
//   min over paths of (objective + lambda * memory) - lambda * budget,
// the least of a one-label program. lambda is moved along the lower convex hull of the paths'
// (memory, objective) points, between the fastest path (over the budget) and a fitting one, to
// the edge that crosses the budget, where the bound is the best one lambda can give; `hint` (a
// multiplier that served a chain like this one) is tried first. The fitting paths met on the way,
// and the crossings of the edge's two ends, are plans: their objectives bound the optimum from
// above. Stops as soon as the bound passes `stop_above` (nothing better than that fits here).
struct DualBound {
  double lower = kInf;     // no plan of the chain is faster (inf: none fits)
  double lambda = 0;       // the multiplier that gave it
  double feasible = kInf;  // the fastest fitting plan met
};
DualBound dual_bound(const Tables& t, const std::vector<std::vector<char>>& allowed, double cap, double budget, double free_obj,
                     double stop_above, double hint, int64_t* transitions) {
  DualBound d;
  // the chain without the cap's restriction and without the limit bounds it
  d.lower = free_obj;
  auto weighed = [&](const WeightedPath& p, double lambda) {  // p: the least at lambda
    const double bound = p.value - lambda * budget;
    if (bound > d.lower) {
      d.lower = bound;
      d.lambda = lambda;
    }
    if (p.mem <= budget) d.feasible = std::min(d.feasible, p.obj);
  };
  // the two ends of a hull edge: `over` the budget (the faster), `under` it
  WeightedPath over, under;
  if (hint > 0) {
    WeightedPath p = weighted_path(t, allowed, cap, 1, hint, transitions);
    if (!p.found) return DualBound{};  // no path under this cap
    weighed(p, hint);
    if (above(d.lower, stop_above)) return d;
    (p.mem > budget ? over : under) = std::move(p);
  }
  if (!over.found) {
    WeightedPath fast = weighted_path(t, allowed, cap, 1, 0, transitions);
    if (!fast.found) return DualBound{};
    if (fast.mem <= budget) {  // the fastest path fits: it is the chain's optimum
      d.lower = d.feasible = fast.obj;
      d.lambda = 0;
      return d;
    }
    weighed(fast, 0);
    if (above(d.lower, stop_above)) return d;
    over = std::move(fast);
  }
  if (!under.found) {
    under = weighted_path(t, allowed, cap, 0, 1, transitions);  // the least memory
    if (under.mem > budget) return DualBound{};                 // nothing fits
    d.feasible = std::min(d.feasible, under.obj);
  }
  for (int iter = 0; iter < 64 && under.obj > over.obj && over.mem > under.mem; ++iter) {
    const double lambda = (under.obj - over.obj) / (over.mem - under.mem);
    WeightedPath p = weighted_path(t, allowed, cap, 1, lambda, transitions);
    weighed(p, lambda);
    if (above(d.lower, stop_above)) return d;
    // no path below the line through `over` and `under`: that edge of the hull crosses the budget
    const double line = over.obj + lambda * over.mem;
    if (p.value >= line - 1e-12 * std::abs(line)) break;
    (p.mem > budget ? over : under) = std::move(p);
  }
  d.feasible = std::min(d.feasible, fastest_crossing(t, over, under, budget));
  d.lower = std::min(d.lower, d.feasible);
  return d;
}

// The chain's fastest plan over the allowed layouts, without a limit (a one-label program; of
// equal plans the one the label programs would keep).
ChainResult fastest(const Tables& t, const std::vector<std::vector<char>>& allowed, int64_t* transitions) {
  WeightedPath w = weighted_path(t, allowed, kInf, 1, 0, transitions);
  ChainResult r;
  if (!w.found) return r;
  r.found = true;
  r.obj = w.obj;
  r.mem = w.mem;
  for (size_t i = 0; i < w.path.size(); ++i) r.layouts.push_back(t.L[i][static_cast<size_t>(w.path[i])]);
  return r;
}

// Exact chain program for one (schedule, K, tied degree, cap on the working set) over the allowed
// layouts under a memory budget (the limit less the cap): Pareto fronts of (objective, memory),
// making only labels that can still complete into a fitting plan faster than `cut` and no slower
// than `known` (the objective of a plan known to fit). (Without a limit: fastest.)
ChainResult chain(const Tables& t, const std::vector<std::vector<char>>& allowed, double budget, double cap, double cut, double known,
                  double lambda, int64_t* transitions, int64_t* labels) {
  int P = static_cast<int>(t.L.size());
  std::vector<std::vector<std::vector<Label>>> fronts(static_cast<size_t>(P));
  auto usable = [&](int i, size_t b) { return oases::usable(t, allowed, cap, i, b); };
  // Bounds on what the rest of the chain adds after part i laid out b (backward
  // programs without the limit): the least objective, the least memory, and the least objective
  // + lambda * memory. A label (objective o, memory m) can complete into no plan that fits and is
  // faster than o + rest_obj, nor than o + lambda * m + rest_lag - lambda * budget (Lagrangian
  // relaxation, dual_bound), and into no plan that fits at all when m + rest_mem passes the
  // budget: dropping it when these pass `cut` or `known` keeps the search exact.
  std::vector<std::vector<double>> rest_obj(static_cast<size_t>(P)), rest_mem(static_cast<size_t>(P)), rest_lag(static_cast<size_t>(P));
  const bool lagrangian = lambda > 0;
  rest_obj[static_cast<size_t>(P - 1)].assign(t.L[static_cast<size_t>(P - 1)].size(), 0.0);
  rest_mem[static_cast<size_t>(P - 1)].assign(t.L[static_cast<size_t>(P - 1)].size(), 0.0);
  rest_lag[static_cast<size_t>(P - 1)].assign(t.L[static_cast<size_t>(P - 1)].size(), 0.0);
  for (int i = P - 2; i >= 0; --i) {
    size_t na = t.L[static_cast<size_t>(i)].size(), nb = t.L[static_cast<size_t>(i + 1)].size();
    const PartTable& T = *t.part[static_cast<size_t>(i + 1)];
    rest_obj[static_cast<size_t>(i)].assign(na, kInf);
    rest_lag[static_cast<size_t>(i)].assign(na, kInf);
    double least_mem = kInf;
    for (size_t b = 0; b < nb; ++b) {
      if (usable(i + 1, b)) least_mem = std::min(least_mem, T.mem[b] + rest_mem[static_cast<size_t>(i + 1)][b]);
    }
    rest_mem[static_cast<size_t>(i)].assign(na, least_mem);
    for (size_t a = 0; a < na; ++a) {
      double best = kInf, best_lag = kInf;
      for (size_t b = 0; b < nb; ++b) {
        if (!usable(i + 1, b)) continue;
        best = std::min(best, T.obj[a * nb + b] + rest_obj[static_cast<size_t>(i + 1)][b]);
        if (lagrangian) best_lag = std::min(best_lag, T.obj[a * nb + b] + lambda * T.mem[b] + rest_lag[static_cast<size_t>(i + 1)][b]);
      }
      rest_obj[static_cast<size_t>(i)][a] = best;
      rest_lag[static_cast<size_t>(i)][a] = best_lag;
    }
  }
  // a label at part i laid out b that reaches `bound` can complete into nothing that is kept
  const double bound = std::min(cut, known);
  // The backward program above is the unconstrained optimum over the usable layouts (those whose
  // working set is under this cap): it bounds what the labels can reach. When even it cannot
  // beat the incumbent, or the least memory cannot fit, no label program is needed; when its own
  // path fits the budget, that path is the constrained optimum itself (nothing fits and is
  // faster). Only otherwise are the Pareto fronts expanded.
  const PartTable& T0 = *t.part[0];
  double best_obj = kInf, best_mem = kInf;
  size_t b0 = 0;
  for (size_t b = 0; b < t.L[0].size(); ++b) {
    if (!usable(0, b)) continue;
    best_mem = std::min(best_mem, T0.mem[b] + rest_mem[0][b]);
    if (T0.obj[b] + rest_obj[0][b] < best_obj) {
      best_obj = T0.obj[b] + rest_obj[0][b];
      b0 = b;
    }
  }
  if (!std::isfinite(best_obj) || best_obj >= cut || above(best_obj, known) || best_mem > budget) return ChainResult{};
  std::vector<size_t> path{b0};
  double path_mem = T0.mem[b0];
  for (int i = 1; i < P; ++i) {
    const PartTable& T = *t.part[static_cast<size_t>(i)];
    size_t nb = t.L[static_cast<size_t>(i)].size(), a = path.back(), arg = 0;
    double best = kInf;
    for (size_t b = 0; b < nb; ++b) {
      if (!usable(i, b)) continue;
      double v = T.obj[a * nb + b] + rest_obj[static_cast<size_t>(i)][b];
      if (v < best) {
        best = v;
        arg = b;
      }
    }
    *transitions += static_cast<int64_t>(nb);
    path.push_back(arg);
    path_mem += T.mem[arg];
  }
  if (path_mem <= budget) {
    ChainResult r;
    r.found = true;
    r.obj = best_obj;
    r.mem = path_mem;
    for (int i = 0; i < P; ++i) r.layouts.push_back(t.L[static_cast<size_t>(i)][path[static_cast<size_t>(i)]]);
    return r;
  }
  std::vector<Label> cand;
  for (int i = 0; i < P; ++i) {
    const auto& Li = t.L[static_cast<size_t>(i)];
    const PartTable& T = *t.part[static_cast<size_t>(i)];
    size_t nb = Li.size();
    fronts[static_cast<size_t>(i)].assign(nb, {});
    for (size_t b = 0; b < nb; ++b) {
      if (!usable(i, b)) continue;
      double mem_b = T.mem[b];
      cand.clear();
      if (i == 0) {
        ++*transitions;
        cand.push_back(Label{T.obj[b], mem_b, -1, -1});
      } else {
        const auto& fp = fronts[static_cast<size_t>(i - 1)];
        // labels that cannot complete into a better fitting plan are not made
        const double obj_room = cut - rest_obj[static_cast<size_t>(i)][b];
        const double mem_room = budget - rest_mem[static_cast<size_t>(i)][b] - mem_b;
        // o + lambda * m + lag_rest must not pass the bound (m: the label's memory before part i)
        const double lag_rest = lagrangian ? rest_lag[static_cast<size_t>(i)][b] + lambda * (mem_b - budget) : 0;
        const double known_rest = rest_obj[static_cast<size_t>(i)][b];
        for (size_t a = 0; a < fp.size(); ++a) {
          const auto& fa = fp[a];
          if (fa.empty()) continue;
          ++*transitions;
          double o = T.obj[a * nb + b];
          for (size_t k = 0; k < fa.size(); ++k) {
            const double no = fa[k].obj + o;
            if (no >= obj_room || fa[k].mem > mem_room) continue;
            if (above(no + known_rest, known)) continue;
            if (lagrangian && above(no + lambda * fa[k].mem + lag_rest, bound)) continue;
            cand.push_back(Label{no, fa[k].mem + mem_b, static_cast<int>(a), static_cast<int>(k)});
          }
        }
      }
      std::vector<Label>& f = fronts[static_cast<size_t>(i)][b];
      *labels += static_cast<int64_t>(cand.size());
      double ro = rest_obj[static_cast<size_t>(i)][b], rm = rest_mem[static_cast<size_t>(i)][b];
      // equal labels (plans alike but for where a switch of layout sits) in the order they came,
      // by the label they extend: which one is kept then does not depend on what the bounds cut
      std::sort(cand.begin(), cand.end(), [](const Label& x, const Label& y) {
        return std::tie(x.mem, x.obj, x.prev_state, x.prev_label) < std::tie(y.mem, y.obj, y.prev_state, y.prev_label);
      });
      double best = kInf;
      for (const Label& c : cand) {
        if (c.mem + rm > budget || c.obj >= best || c.obj + ro >= cut) continue;
        f.push_back(c);
        best = c.obj;
      }
    }
  }
  ChainResult r;
  int bs = -1, bl = -1;
  const auto& last = fronts[static_cast<size_t>(P - 1)];
  for (size_t b = 0; b < last.size(); ++b) {
    for (size_t k = 0; k < last[b].size(); ++k) {
      if (last[b][k].obj < r.obj) {
        r.obj = last[b][k].obj;
        r.mem = last[b][k].mem;
        bs = static_cast<int>(b);
        bl = static_cast<int>(k);
      }
    }
  }
  if (bs < 0) return r;
  r.found = true;
  r.layouts.assign(static_cast<size_t>(P), Layout{});
  for (int i = P - 1; i >= 0; --i) {
    r.layouts[static_cast<size_t>(i)] = t.L[static_cast<size_t>(i)][static_cast<size_t>(bs)];
    const Label& lab = fronts[static_cast<size_t>(i)][static_cast<size_t>(bs)][static_cast<size_t>(bl)];
    bs = lab.prev_state;
    bl = lab.prev_label;
  }
  return r;
}

// Dominance pruning, exact: layout x of part i can be dropped when another allowed layout y of the
// same part is no worse in every respect the chain sees (its memory, its working set, its cost
// after every allowed layout of part i-1, and the cost of every allowed layout of part i+1 after
// it): any plan through x is then matched or beaten by the same plan through y. Of identical
// layouts the first is kept. Repeated until nothing more drops (a drop in one part can let its
// neighbours drop more). Returns the layouts dropped.
// What dominance drops of one part is a function of its table, the next part's, and the allowed
// layouts of the part and its two neighbours: the middle parts of a deep model repeat the same
// few cases, so each case is worked out once (per space, over its tied degrees).
using DominanceCache = std::unordered_map<std::string, std::pair<std::vector<char>, int64_t>>;

int64_t drop_dominated(const Tables& t, std::vector<std::vector<char>>* allowed, DominanceCache* cache) {
  const int P = static_cast<int>(t.L.size());
  auto& A = *allowed;
  int64_t dropped = 0;
  bool changed = true;
  std::string key;
  while (changed) {
    changed = false;
    for (int i = 0; i < P; ++i) {
      const PartTable& T = *t.part[static_cast<size_t>(i)];
      const PartTable* N = i + 1 < P ? t.part[static_cast<size_t>(i + 1)] : nullptr;
      const size_t n = t.L[static_cast<size_t>(i)].size();
      const size_t np = i > 0 ? t.L[static_cast<size_t>(i - 1)].size() : 0;
      const size_t nn = i + 1 < P ? t.L[static_cast<size_t>(i + 1)].size() : 0;
      auto& ai = A[static_cast<size_t>(i)];
      key.clear();
      const PartTable* tables[2] = {&T, N};
      key.append(reinterpret_cast<const char*>(tables), sizeof(tables));
      key += i == 0 ? 'f' : 'm';
      if (i > 0) key.append(A[static_cast<size_t>(i - 1)].begin(), A[static_cast<size_t>(i - 1)].end());
      key += '|';
      key.append(ai.begin(), ai.end());
      key += '|';
      if (N) key.append(A[static_cast<size_t>(i + 1)].begin(), A[static_cast<size_t>(i + 1)].end());
      if (auto hit = cache->find(key); hit != cache->end()) {
        ai = hit->second.first;
        dropped += hit->second.second;
        changed |= hit->second.second > 0;
        continue;
      }
      auto no_worse = [&](size_t y, size_t x) {  // y no worse than x
        if (T.mem[y] > T.mem[x] || T.tr[y] > T.tr[x]) return false;
        if (i == 0) {
          if (T.obj[y] > T.obj[x]) return false;
        } else {
          const auto& ap = A[static_cast<size_t>(i - 1)];
          for (size_t a = 0; a < np; ++a) {
            if (ap[a] && T.obj[a * n + y] > T.obj[a * n + x]) return false;
          }
        }
        if (N) {
          const auto& an = A[static_cast<size_t>(i + 1)];
          for (size_t c = 0; c < nn; ++c) {
            if (an[c] && N->obj[y * nn + c] > N->obj[x * nn + c]) return false;
          }
        }
        return true;
      };
      int64_t here = 0;
      for (size_t x = 0; x < n; ++x) {
        if (!ai[x]) continue;
        for (size_t y = 0; y < n; ++y) {
          if (y == x || !ai[y]) continue;
          // y dominates x; of two identical layouts the later one goes
          if (no_worse(y, x) && (y < x || !no_worse(x, y))) {
            ai[x] = 0;
            ++here;
            break;
          }
        }
      }
      cache->emplace(key, std::make_pair(ai, here));
      dropped += here;
      changed |= here > 0;
    }
  }
  return dropped;
}

std::vector<int64_t> tied_degrees(CostModel& m, const SearchOptions& o) {
  if (!m.analysis().tied_head) return {0};
  std::vector<int64_t> out;
  for (int64_t t : m.analysis().tp_candidates) {
    if (o.degrees.empty() || std::find(o.degrees.begin(), o.degrees.end(), t) != o.degrees.end()) out.push_back(t);
  }
  return out;
}

bool mixed(CostModel& m, const SearchOptions& o) {
  return o.allow_mixed && m.analysis().mixed_ok;
}

}  // namespace

std::vector<Layout> allowed_layouts(const ModelAnalysis& a, int64_t ranks, const SearchOptions& o, int part, int64_t K) {
  std::vector<Layout> out;
  for (const Layout& l : candidate_layouts(a, ranks, part, K)) {
    if (l.sequence_parallel && !o.allow_sequence_parallel) continue;
    if (l.collective_matmul && !o.allow_collective_matmul) continue;
    if (!o.degrees.empty() && std::find(o.degrees.begin(), o.degrees.end(), l.tp) == o.degrees.end()) continue;
    out.push_back(l);
  }
  if (o.require_sequence_parallel) {
    std::vector<Layout> sp;
    for (const Layout& l : out) {
      bool has_sp = std::any_of(out.begin(), out.end(), [&](const Layout& x) { return x.tp == l.tp && x.sequence_parallel; });
      if (l.sequence_parallel || !has_sp) sp.push_back(l);
    }
    out = std::move(sp);
  }
  return out;
}

double plan_objective(CostModel& m, const PlanChoice& p) {
  auto s = schedule_by_name(p.schedule);
  double total = 0;
  for (int i = 0; i < m.num_parts(); ++i) {
    const Layout& cur = p.layouts[static_cast<size_t>(i)];
    total += m.part_objective(i, i > 0 ? p.layouts[static_cast<size_t>(i - 1)] : cur, cur, *s, p.chunks);
  }
  return total;
}

double plan_memory(CostModel& m, const PlanChoice& p) {
  auto s = schedule_by_name(p.schedule);
  double mem = 0, tr = 0;
  for (int i = 0; i < m.num_parts(); ++i) {
    mem += m.part_memory(i, p.layouts[static_cast<size_t>(i)], *s, p.chunks);
    tr = std::max(tr, m.part_transient(i, p.layouts[static_cast<size_t>(i)], *s, p.chunks));
  }
  return mem + tr;
}

namespace {

// One tied degree of a (schedule, K) space: the layouts it allows, what dominance leaves of them,
// the caps on the working set and the chain's free optimum; under a limit, per cap, a lower bound
// on what fits (dual_bound).
struct TiedSpace {
  int64_t tied = 0;
  std::vector<std::vector<Layout>> L;      // one layout for all parts: per part, the layouts this tied degree allows
  std::vector<std::vector<char>> allowed;  // over the space's tables.L, after dominance
  std::vector<double> caps;                // ascending
  std::vector<double> least;               // per cap: the least memory of the parts (each its smallest under the cap)
  ChainResult free_run;
  double free_memory = 0;
  std::vector<DualBound> dual;  // per cap (under a limit and when the free optimum does not fit)
};

struct Space {
  std::string schedule;
  ScheduleOptions so;
  int64_t K = 1;
  Tables tables;  // mixed layouts only
  DominanceCache dominance;
  std::vector<TiedSpace> tied;
  double known = kInf;  // the objective of the fastest plan of this space known to fit
};

// The spaces and their tied degrees, tabulated, pruned by dominance, with each one's free optimum
// (the unconstrained program) and the least memory any of them needs.
std::vector<Space> make_spaces(CostModel& m, const SearchOptions& o, bool mix, const std::vector<int>& cls, SearchResult* res) {
  std::vector<Space> spaces;
  ReshardCache reshard;
  for (const std::string& sn : o.schedules) {
    auto so = schedule_by_name(sn);
    if (!so) continue;
    for (int64_t K : o.chunks) {
      if (interleaved(sn) && K < 2) continue;
      Space sp;
      sp.schedule = sn;
      sp.so = *so;
      sp.K = K;
      const std::vector<std::vector<Layout>> all = class_layouts(m, o, K, cls);
      for (int64_t tied : tied_degrees(m, o)) {
        TiedSpace ts;
        ts.tied = tied;
        // a tied degree leaves the embedding and the head only their layouts of that tp
        auto kept = [&](size_t i, const Layout& l) { return tied <= 0 || (i != 0 && i + 1 != all.size()) || l.tp == tied; };
        bool empty = false;
        for (size_t i = 0; i < all.size(); ++i)
          empty |= std::none_of(all[i].begin(), all[i].end(), [&](const Layout& l) { return kept(i, l); });
        if (empty) continue;
        if (!mix) {
          ts.L = with_tied_degree(all, tied);
          sp.tied.push_back(std::move(ts));
          continue;
        }
        // the tables of this (schedule, K), shared by the tied degrees
        if (sp.tables.L.empty()) {
          sp.tables.L = all;
          tabulate(m, sp.so, K, cls, &reshard, &sp.tables);
        }
        const Tables& tables = sp.tables;
        ts.allowed.resize(all.size());
        for (size_t i = 0; i < all.size(); ++i) {
          for (const Layout& l : tables.L[i]) ts.allowed[i].push_back(kept(i, l));
        }
        // (the least memory below is unchanged: a layout's dominator has no more memory or working set)
        res->dominated += drop_dominated(tables, &ts.allowed, &sp.dominance);
        // the least memory of this space: per cap on the working set, each part its smallest
        std::set<double> caps;
        for (size_t i = 0; i < all.size(); ++i) {
          for (size_t b = 0; b < ts.allowed[i].size(); ++b) {
            if (ts.allowed[i][b]) caps.insert(tables.part[i]->tr[b]);
          }
        }
        ts.caps.assign(caps.begin(), caps.end());
        for (double cap : ts.caps) {
          double sum = cap;
          bool ok = true;
          for (size_t i = 0; i < all.size() && ok; ++i) {
            double best = kInf;
            const PartTable& T = *tables.part[i];
            for (size_t b = 0; b < ts.allowed[i].size(); ++b) {
              if (ts.allowed[i][b] && T.tr[b] <= cap) best = std::min(best, T.mem[b]);
            }
            ok = std::isfinite(best);
            sum += best;
          }
          if (ok) res->least_memory = std::min(res->least_memory, sum);
          ts.least.push_back(ok ? sum - cap : kInf);
        }
        ts.free_run = fastest(tables, ts.allowed, &res->transitions);
        if (ts.free_run.found) ts.free_memory = plan_memory(m, PlanChoice{ts.free_run.layouts, sn, K});
        sp.tied.push_back(std::move(ts));
      }
      spaces.push_back(std::move(sp));
    }
  }
  return spaces;
}

// Under a limit: the plans known to fit (free optima that fit, and the fitting paths the dual
// bounds meet), and per chain a lower bound. The chains are bounded in the order of their free
// optima, fastest first, each stopping once its bound passes the fastest plan known to fit (of its
// space with keep_spaces, else of any): the label programs then make only labels that can still
// beat it.
void bound_chains(const SearchOptions& o, std::vector<Space>* spaces, int64_t* work) {
  double known = kInf;
  std::vector<std::pair<double, std::pair<size_t, size_t>>> order;
  for (size_t s = 0; s < spaces->size(); ++s) {
    Space& sp = (*spaces)[s];
    for (size_t k = 0; k < sp.tied.size(); ++k) {
      const TiedSpace& ts = sp.tied[k];
      if (!ts.free_run.found) continue;
      if (ts.free_memory <= o.memory_limit) {
        sp.known = std::min(sp.known, ts.free_run.obj);
        known = std::min(known, ts.free_run.obj);
      } else {
        order.push_back({ts.free_run.obj, {s, k}});
      }
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  double hint = 0;  // the last multiplier found: the chains' are alike (same model, other caps, degrees, schedules)
  for (const auto& [free_obj, at] : order) {
    Space& sp = (*spaces)[at.first];
    TiedSpace& ts = sp.tied[at.second];
    for (size_t c = 0; c < ts.caps.size(); ++c) {
      const double cap = ts.caps[c];
      if (cap > o.memory_limit) break;
      const double stop = o.keep_spaces ? sp.known : known;
      DualBound d;
      d.lower = free_obj;  // the free optimum bounds every cap
      if (above(ts.least[c], o.memory_limit - cap)) {
        d.lower = kInf;  // nothing fits under this cap
      } else if (!above(free_obj, stop)) {
        d = dual_bound(sp.tables, ts.allowed, cap, o.memory_limit - cap, free_obj, stop, hint, work);
        if (d.lambda > 0) hint = d.lambda;
      }
      sp.known = std::min(sp.known, d.feasible);
      known = std::min(known, d.feasible);
      ts.dual.push_back(d);
    }
  }
  if (!o.keep_spaces) {
    for (Space& sp : *spaces) sp.known = known;
  }
}

}  // namespace

SearchResult search_plan(CostModel& m, const SearchOptions& o) {
  SearchResult res;
  res.least_memory = kInf;
  res.objective = kInf;
  bool mix = mixed(m, o);
  if (!mix) res.restriction = o.allow_mixed ? "every part one layout: " + m.analysis().mixed_why : "every part one layout (asked)";
  const std::vector<int> cls = part_classes(m.analysis());
  std::vector<Space> spaces = make_spaces(m, o, mix, cls, &res);
  if (mix && o.memory_limit > 0 && o.bound_chains) bound_chains(o, &spaces, &res.bound_transitions);
  for (Space& sp : spaces) {
    const std::string& sn = sp.schedule;
    const int64_t K = sp.K;
    SpaceBest space;  // the best fitting plan of this (schedule, K)
    space.objective = kInf;
    for (TiedSpace& ts : sp.tied) {
      if (!mix) {
        // one layout for every part
        const auto& L = ts.L;
        std::set<Layout> common(L[0].begin(), L[0].end());
        for (const auto& li : L) {
          std::set<Layout> next;
          for (const Layout& l : li) {
            if (common.count(l)) next.insert(l);
          }
          common = next;
        }
        for (const Layout& l : common) {
          // what plan_memory and plan_objective add up, part by part, each class of parts priced once
          std::map<int, std::array<double, 3>> by_class;
          double kept = 0, working = 0, obj = 0;
          for (int i = 0; i < m.num_parts(); ++i) {
            auto it = by_class.find(cls[static_cast<size_t>(i)]);
            if (it == by_class.end()) {
              std::array<double, 3> v{m.part_memory(i, l, sp.so, K), m.part_transient(i, l, sp.so, K), m.part_objective(i, l, l, sp.so, K)};
              it = by_class.emplace(cls[static_cast<size_t>(i)], v).first;
            }
            kept += it->second[0];
            working = std::max(working, it->second[1]);
            obj += it->second[2];
          }
          res.transitions += m.num_parts();
          const double mem = kept + working;
          res.least_memory = std::min(res.least_memory, mem);
          if (o.memory_limit > 0 && mem > o.memory_limit) continue;
          if (obj < space.objective) space = {PlanChoice{std::vector<Layout>(static_cast<size_t>(m.num_parts()), l), sn, K}, obj, mem};
        }
        continue;
      }
      const ChainResult& free_run = ts.free_run;
      const double bound = std::min(space.objective, o.keep_spaces ? kInf : res.objective);
      if (!free_run.found || free_run.obj >= bound) continue;  // the bound: no better plan here
      if (o.memory_limit <= 0 || ts.free_memory <= o.memory_limit) {
        space = {PlanChoice{free_run.layouts, sn, K}, free_run.obj, ts.free_memory};
        continue;
      }
      double cut = bound;
      for (size_t c = 0; c < ts.caps.size(); ++c) {
        const double cap = ts.caps[c];
        if (cap > o.memory_limit) break;
        const DualBound unbounded{-kInf, 0, kInf};
        const DualBound& d = c < ts.dual.size() ? ts.dual[c] : unbounded;
        if (above(d.lower, std::min(cut, sp.known))) continue;  // nothing under this cap beats both
        ChainResult r = chain(sp.tables, ts.allowed, o.memory_limit - cap, cap, cut, sp.known, d.lambda, &res.transitions, &res.labels);
        if (!r.found || r.obj >= cut) continue;
        PlanChoice q{r.layouts, sn, K};
        space = {q, r.obj, plan_memory(m, q)};
        cut = r.obj;
      }
    }
    if (!std::isfinite(space.objective)) continue;
    if (space.objective < res.objective) {
      res.found = true;
      res.objective = space.objective;
      res.memory = space.memory;
      res.best = space.choice;
    }
    if (o.keep_spaces) res.spaces.push_back(space);
  }
  std::stable_sort(res.spaces.begin(), res.spaces.end(), [](const SpaceBest& x, const SpaceBest& y) { return x.objective < y.objective; });
  if (!std::isfinite(res.least_memory)) res.least_memory = 0;
  res.best.zero = m.zero();
  for (SpaceBest& sb : res.spaces) sb.choice.zero = m.zero();
  return res;
}

SearchResult brute_force(CostModel& m, const SearchOptions& o) {
  SearchResult res;
  res.objective = kInf;
  res.least_memory = kInf;
  bool mix = mixed(m, o);
  for (const std::string& sn : o.schedules) {
    auto so = schedule_by_name(sn);
    if (!so) continue;
    for (int64_t K : o.chunks) {
      if (interleaved(sn) && K < 2) continue;
      for (int64_t tied : tied_degrees(m, o)) {
        auto L = part_layouts(m, o, K, tied);
        bool empty = false;
        for (const auto& li : L) empty |= li.empty();
        if (empty) continue;
        std::vector<size_t> idx(L.size(), 0);
        while (true) {
          PlanChoice p;
          p.schedule = sn;
          p.chunks = K;
          bool same = true;
          for (size_t i = 0; i < L.size(); ++i) {
            p.layouts.push_back(L[i][idx[i]]);
            same &= p.layouts[i] == p.layouts[0];
          }
          if (mix || same) {
            ++res.transitions;
            double mem = plan_memory(m, p);
            res.least_memory = std::min(res.least_memory, mem);
            if (o.memory_limit <= 0 || mem <= o.memory_limit) {
              double obj = plan_objective(m, p);
              if (obj < res.objective) {
                res.found = true;
                res.objective = obj;
                res.memory = mem;
                res.best = p;
              }
            }
          }
          size_t k = 0;
          while (k < idx.size() && ++idx[k] == L[k].size()) idx[k++] = 0;
          if (k == idx.size()) break;
        }
      }
    }
  }
  if (!std::isfinite(res.least_memory)) res.least_memory = 0;
  return res;
}

std::vector<PartLayout> part_layouts_of(const ModelAnalysis& a, const std::vector<Layout>& layouts) {
  std::vector<PartLayout> out;
  for (size_t i = 0; i < a.parts.size() && i < layouts.size(); ++i) out.push_back(PartLayout{a.parts[i], layouts[i]});
  return out;
}

Plan plan_of_choice(const ModelAnalysis& a, const PlanChoice& p, int64_t ranks) {
  Plan plan = Plan::from_parts(part_layouts_of(a, p.layouts), ranks, p.schedule, p.chunks);
  plan.zero = p.zero ? 1 : 0;
  return plan;
}

SearchOptions megatron_search_options(const SearchOptions& asked) {
  SearchOptions mo = asked;
  mo.keep_spaces = false;
  mo.allow_mixed = false;
  mo.allow_sequence_parallel = false;
  mo.allow_collective_matmul = false;
  mo.schedules = {"plain", "default_checkpoint"};
  mo.chunks = {1};
  return mo;
}

std::vector<PlanChoice> simulation_candidates(const SearchResult& best, const SearchResult& megatron, const SearchOptions& asked) {
  std::vector<PlanChoice> cands;
  auto in_asked = [&](const PlanChoice& c) {
    return std::find(asked.schedules.begin(), asked.schedules.end(), c.schedule) != asked.schedules.end() &&
           std::find(asked.chunks.begin(), asked.chunks.end(), c.chunks) != asked.chunks.end();
  };
  if (megatron.found && in_asked(megatron.best)) cands.push_back(megatron.best);
  for (const SpaceBest& sb : best.spaces) cands.push_back(sb.choice);
  return cands;
}

}  // namespace oases
