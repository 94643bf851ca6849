#include "planner/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

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

void tabulate(CostModel& m, const ScheduleOptions& s, int64_t K, Tables* t) {
  int P = m.num_parts();
  const ModelAnalysis& a = m.analysis();
  t->part.assign(static_cast<size_t>(P), nullptr);
  for (int i = 0; i < P; ++i) {
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
      for (const Layout& l : Li) {
        pt.mem.push_back(m.part_memory(i, l, s, K));
        pt.tr.push_back(m.part_transient(i, l, s, K));
      }
      if (i == 0) {
        for (const Layout& l : Li) pt.obj.push_back(m.part_objective(0, l, l, s, K));
      } else {
        for (const Layout& p : *Lp) {
          for (const Layout& l : Li) pt.obj.push_back(m.part_objective(i, p, l, s, K));
        }
      }
      it = t->store.emplace(key, std::move(pt)).first;
    }
    t->part[static_cast<size_t>(i)] = &it->second;
  }
}

struct ChainResult {
  bool found = false;
  double obj = kInf, mem = 0;
  std::vector<Layout> layouts;
};

// Exact chain program for one (schedule, K, tied degree, cap on the working set) over the allowed
// layouts. Unconstrained (budget < 0): one label per state; constrained: Pareto fronts of
// (objective, memory).
ChainResult chain(const Tables& t, const std::vector<std::vector<char>>& allowed, double budget, double cap, double incumbent,
                  int64_t* transitions, int64_t* labels) {
  int P = static_cast<int>(t.L.size());
  std::vector<std::vector<std::vector<Label>>> fronts(static_cast<size_t>(P));
  bool constrained = budget >= 0;
  auto usable = [&](int i, size_t b) {
    return allowed[static_cast<size_t>(i)][b] && (!constrained || t.part[static_cast<size_t>(i)]->tr[b] <= cap);
  };
  // Under a limit, bounds on what the rest of the chain adds after part i laid out b (a backward
  // program without the limit): the least objective and the least memory. A label whose objective
  // plus the first reaches the incumbent, or whose memory plus the second passes the budget, can
  // never complete into a better plan that fits, so dropping it keeps the search exact.
  std::vector<std::vector<double>> rest_obj(static_cast<size_t>(P)), rest_mem(static_cast<size_t>(P));
  if (constrained) {
    rest_obj[static_cast<size_t>(P - 1)].assign(t.L[static_cast<size_t>(P - 1)].size(), 0.0);
    rest_mem[static_cast<size_t>(P - 1)].assign(t.L[static_cast<size_t>(P - 1)].size(), 0.0);
    for (int i = P - 2; i >= 0; --i) {
      size_t na = t.L[static_cast<size_t>(i)].size(), nb = t.L[static_cast<size_t>(i + 1)].size();
      const PartTable& T = *t.part[static_cast<size_t>(i + 1)];
      rest_obj[static_cast<size_t>(i)].assign(na, kInf);
      double least_mem = kInf;
      for (size_t b = 0; b < nb; ++b) {
        if (usable(i + 1, b)) least_mem = std::min(least_mem, T.mem[b] + rest_mem[static_cast<size_t>(i + 1)][b]);
      }
      rest_mem[static_cast<size_t>(i)].assign(na, least_mem);
      for (size_t a = 0; a < na; ++a) {
        double best = kInf;
        for (size_t b = 0; b < nb; ++b) {
          if (usable(i + 1, b)) best = std::min(best, T.obj[a * nb + b] + rest_obj[static_cast<size_t>(i + 1)][b]);
        }
        rest_obj[static_cast<size_t>(i)][a] = best;
      }
    }
  }
  if (constrained) {
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
    if (!std::isfinite(best_obj) || best_obj >= incumbent || best_mem > budget) return ChainResult{};
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
        // under a limit, labels that cannot complete into a better fitting plan are not made
        const double obj_room = constrained ? incumbent - rest_obj[static_cast<size_t>(i)][b] : kInf;
        const double mem_room = constrained ? budget - rest_mem[static_cast<size_t>(i)][b] - mem_b : kInf;
        for (size_t a = 0; a < fp.size(); ++a) {
          const auto& fa = fp[a];
          if (fa.empty()) continue;
          ++*transitions;
          double o = T.obj[a * nb + b];
          for (size_t k = 0; k < fa.size(); ++k) {
            if (fa[k].obj + o >= obj_room || fa[k].mem > mem_room) continue;
            cand.push_back(Label{fa[k].obj + o, fa[k].mem + mem_b, static_cast<int>(a), static_cast<int>(k)});
          }
        }
      }
      std::vector<Label>& f = fronts[static_cast<size_t>(i)][b];
      *labels += static_cast<int64_t>(cand.size());
      if (!constrained) {
        for (const Label& c : cand) {
          if (f.empty() || c.obj < f[0].obj) f.assign(1, c);
        }
        continue;
      }
      double ro = rest_obj[static_cast<size_t>(i)][b], rm = rest_mem[static_cast<size_t>(i)][b];
      std::sort(cand.begin(), cand.end(), [](const Label& x, const Label& y) { return x.mem != y.mem ? x.mem < y.mem : x.obj < y.obj; });
      double best = kInf;
      for (const Label& c : cand) {
        if (c.mem + rm > budget || c.obj >= best || c.obj + ro >= incumbent) continue;
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
int64_t drop_dominated(const Tables& t, std::vector<std::vector<char>>* allowed) {
  const int P = static_cast<int>(t.L.size());
  auto& A = *allowed;
  int64_t dropped = 0;
  bool changed = true;
  while (changed) {
    changed = false;
    for (int i = 0; i < P; ++i) {
      const PartTable& T = *t.part[static_cast<size_t>(i)];
      const PartTable* N = i + 1 < P ? t.part[static_cast<size_t>(i + 1)] : nullptr;
      const size_t n = t.L[static_cast<size_t>(i)].size();
      const size_t np = i > 0 ? t.L[static_cast<size_t>(i - 1)].size() : 0;
      const size_t nn = i + 1 < P ? t.L[static_cast<size_t>(i + 1)].size() : 0;
      auto& ai = A[static_cast<size_t>(i)];
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
      for (size_t x = 0; x < n; ++x) {
        if (!ai[x]) continue;
        for (size_t y = 0; y < n; ++y) {
          if (y == x || !ai[y]) continue;
          // y dominates x; of two identical layouts the later one goes
          if (no_worse(y, x) && (y < x || !no_worse(x, y))) {
            ai[x] = 0;
            ++dropped;
            changed = true;
            break;
          }
        }
      }
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

SearchResult search_plan(CostModel& m, const SearchOptions& o) {
  SearchResult res;
  res.least_memory = kInf;
  res.objective = kInf;
  bool mix = mixed(m, o);
  if (!mix) res.restriction = o.allow_mixed ? "every part one layout: " + m.analysis().mixed_why : "every part one layout (asked)";
  for (const std::string& sn : o.schedules) {
    auto so = schedule_by_name(sn);
    if (!so) continue;
    for (int64_t K : o.chunks) {
      if (interleaved(sn) && K < 2) continue;
      Tables tables;
      SpaceBest space;  // the best fitting plan of this (schedule, K)
      space.objective = kInf;
      for (int64_t tied : tied_degrees(m, o)) {
        auto L = part_layouts(m, o, K, tied);
        bool empty = false;
        for (const auto& li : L) empty |= li.empty();
        if (empty) continue;
        if (!mix) {
          // one layout for every part
          std::set<Layout> common(L[0].begin(), L[0].end());
          for (const auto& li : L) {
            std::set<Layout> next;
            for (const Layout& l : li) {
              if (common.count(l)) next.insert(l);
            }
            common = next;
          }
          for (const Layout& l : common) {
            PlanChoice p{std::vector<Layout>(static_cast<size_t>(m.num_parts()), l), sn, K};
            res.transitions += m.num_parts();
            double mem = plan_memory(m, p);
            res.least_memory = std::min(res.least_memory, mem);
            if (o.memory_limit > 0 && mem > o.memory_limit) continue;
            double obj = plan_objective(m, p);
            if (obj < space.objective) space = {p, obj, mem};
          }
          continue;
        }
        // the tables of this (schedule, K), shared by the tied degrees
        if (tables.L.empty()) {
          tables.L = part_layouts(m, o, K, 0);
          tabulate(m, *so, K, &tables);
        }
        std::vector<std::vector<char>> allowed(L.size());
        for (size_t i = 0; i < L.size(); ++i) {
          for (const Layout& l : tables.L[i]) allowed[i].push_back(std::find(L[i].begin(), L[i].end(), l) != L[i].end());
        }
        // (the least memory below is unchanged: a layout's dominator has no more memory or working set)
        res.dominated += drop_dominated(tables, &allowed);
        // the least memory of this space: per cap on the working set, each part its smallest
        std::set<double> caps;
        for (size_t i = 0; i < L.size(); ++i) {
          for (size_t b = 0; b < allowed[i].size(); ++b) {
            if (allowed[i][b]) caps.insert(tables.part[i]->tr[b]);
          }
        }
        for (double cap : caps) {
          double sum = cap;
          bool ok = true;
          for (size_t i = 0; i < L.size() && ok; ++i) {
            double best = kInf;
            const PartTable& T = *tables.part[i];
            for (size_t b = 0; b < allowed[i].size(); ++b) {
              if (allowed[i][b] && T.tr[b] <= cap) best = std::min(best, T.mem[b]);
            }
            ok = std::isfinite(best);
            sum += best;
          }
          if (ok) res.least_memory = std::min(res.least_memory, sum);
        }
        ChainResult free_run = chain(tables, allowed, -1, kInf, kInf, &res.transitions, &res.labels);
        const double bound = std::min(space.objective, o.keep_spaces ? kInf : res.objective);
        if (!free_run.found || free_run.obj >= bound) continue;  // the bound: no better plan here
        PlanChoice p{free_run.layouts, sn, K};
        double mem = plan_memory(m, p);
        if (o.memory_limit <= 0 || mem <= o.memory_limit) {
          space = {p, free_run.obj, mem};
          continue;
        }
        double cut = bound;
        for (double cap : caps) {
          if (cap > o.memory_limit) break;
          ChainResult c = chain(tables, allowed, o.memory_limit - cap, cap, cut, &res.transitions, &res.labels);
          if (!c.found || c.obj >= cut) continue;
          PlanChoice q{c.layouts, sn, K};
          space = {q, c.obj, plan_memory(m, q)};
          cut = c.obj;
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
  }
  std::stable_sort(res.spaces.begin(), res.spaces.end(), [](const SpaceBest& x, const SpaceBest& y) { return x.objective < y.objective; });
  if (!std::isfinite(res.least_memory)) res.least_memory = 0;
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
  return Plan::from_parts(part_layouts_of(a, p.layouts), ranks, p.schedule, p.chunks);
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
