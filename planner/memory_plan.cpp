#include "planner/memory_plan.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>

#include "graph/op_registry.h"

namespace oases {

namespace {

constexpr size_t kAlign = 64;

class OffsetAllocator {
 public:
  int64_t allocate(size_t bytes) {
    bytes = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best != free_.end()) {
      int64_t off = best->first;
      size_t left = best->second - bytes;
      free_.erase(best);
      if (left) free_[off + static_cast<int64_t>(bytes)] = left;
      sizes_[off] = bytes;
      return off;
    }
    // grow: reuse a free block at the end if there is one
    int64_t off = static_cast<int64_t>(top_);
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + static_cast<int64_t>(last->second) == static_cast<int64_t>(top_)) {
        off = last->first;
        free_.erase(last);
      }
    }
    top_ = static_cast<size_t>(off) + bytes;
    sizes_[off] = bytes;
    return off;
  }
  void release(int64_t off) {
    auto it = sizes_.find(off);
    if (it == sizes_.end()) return;
    size_t bytes = it->second;
    sizes_.erase(it);
    auto [pos, ok] = free_.emplace(off, bytes);
    // coalesce with neighbours
    if (pos != free_.begin()) {
      auto prev = std::prev(pos);
      if (prev->first + static_cast<int64_t>(prev->second) == pos->first) {
        prev->second += pos->second;
        free_.erase(pos);
        pos = prev;
      }
    }
    auto next = std::next(pos);
    if (next != free_.end() && pos->first + static_cast<int64_t>(pos->second) == next->first) {
      pos->second += next->second;
      free_.erase(next);
    }
  }
  size_t peak() const { return top_; }

 private:
  std::map<int64_t, size_t> free_;
  std::map<int64_t, size_t> sizes_;
  size_t top_ = 0;
};

// An arena value alive from step `first` to step `last` (inclusive), `bytes` rounded to kAlign.
struct Lifetime {
  ValueId value = kNoId;
  int first = 0, last = 0;
  size_t bytes = 0;
};

// Above this many values the quadratic offline assignment is not tried (planning GPT-3's shapes
// builds programs of hundreds of thousands).
constexpr size_t kOfflineValues = 40000;

// Best-fit as the program runs: at each step its outputs are placed, then the values last used
// there are released. Returns the arena's size.
size_t assign_online(const std::vector<Lifetime>& lives, size_t steps, std::vector<int64_t>* offsets) {
  OffsetAllocator alloc;
  offsets->assign(lives.size(), 0);
  std::vector<std::vector<size_t>> frees(steps + 1);
  size_t next = 0;
  for (size_t pos = 0; pos < steps; ++pos) {
    for (; next < lives.size() && lives[next].first == static_cast<int>(pos); ++next) {
      (*offsets)[next] = alloc.allocate(lives[next].bytes);
      if (lives[next].last < static_cast<int>(steps)) frees[static_cast<size_t>(lives[next].last)].push_back(next);
    }
    for (size_t i : frees[pos]) alloc.release((*offsets)[i]);
  }
  return alloc.peak();
}

// Greedy by size: the largest values first, each at the lowest offset where it overlaps no value
// already placed whose lifetime meets its own. Returns the arena's size.
size_t assign_by_size(const std::vector<Lifetime>& lives, std::vector<int64_t>* offsets) {
  std::vector<size_t> order(lives.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lives[a].bytes > lives[b].bytes; });
  offsets->assign(lives.size(), 0);
  std::vector<size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of the placed values alive beside it
  size_t peak = 0;
  for (size_t i : order) {
    const Lifetime& l = lives[i];
    busy.clear();
    for (size_t j : placed) {
      if (lives[j].first <= l.last && l.first <= lives[j].last) busy.emplace_back((*offsets)[j], (*offsets)[j] + static_cast<int64_t>(lives[j].bytes));
    }
    std::sort(busy.begin(), busy.end());
    int64_t off = 0;
    for (const auto& [b, e] : busy) {
      if (off + static_cast<int64_t>(l.bytes) <= b) break;
      off = std::max(off, e);
    }
    (*offsets)[i] = off;
    placed.push_back(i);
    peak = std::max(peak, static_cast<size_t>(off) + l.bytes);
  }
  return peak;
}

}  // namespace

MemoryPlan MemoryPlan::build(const Graph& g, const std::vector<NodeId>& order, const std::set<ValueId>& keep,
                             const InplaceFn& inplace_input) {
  std::vector<PlanStep> steps;
  for (NodeId n : order) steps.push_back(PlanStep{n, true, true});
  return build(g, steps, keep, inplace_input);
}

MemoryPlan MemoryPlan::build(const Graph& g, const std::vector<PlanStep>& steps, const std::set<ValueId>& keep,
                             const InplaceFn& inplace_input) {
  const OpRegistry& reg = OpRegistry::global();
  MemoryPlan p;
  p.slots.resize(g.num_values());
  for (size_t v = 0; v < g.num_values(); ++v) {
    const Value& val = g.value(static_cast<ValueId>(v));
    if (val.is_constant()) {
      p.slots[v].kind = ValueSlot::Kind::kConstant;
    } else if (val.is_input) {
      p.slots[v].kind = ValueSlot::Kind::kInput;
    }
  }
  // last step each value is read at (kept values and graph outputs: never released)
  constexpr int kForever = std::numeric_limits<int>::max();
  std::vector<int> last_read(g.num_values(), -1);
  std::vector<int> prev_read(g.num_values(), -1);  // the read step before the last one
  std::map<NodeId, int> wait_at;                     // a collective's wait: where it reads its inputs last
  for (size_t pos = 0; pos < steps.size(); ++pos) {
    if (!steps[pos].uses) continue;
    if (!steps[pos].defines) wait_at[steps[pos].node] = static_cast<int>(pos);
    for (ValueId in : g.node(steps[pos].node).inputs) {
      if (in == kNoId || last_read[in] == static_cast<int>(pos)) continue;
      prev_read[in] = last_read[in];
      last_read[in] = static_cast<int>(pos);
    }
  }
  for (ValueId v : keep) last_read[v] = kForever;
  for (ValueId v : g.outputs()) last_read[v] = kForever;
  // roots of views and in-place outputs, and last use (step index) of every root
  std::vector<int> last_use(g.num_values(), -1);
  std::vector<int> root_read = last_read;  // per root: the last read of any value sharing it
  std::vector<ValueId> root(g.num_values());
  for (size_t v = 0; v < root.size(); ++v) root[v] = static_cast<ValueId>(v);
  std::vector<std::vector<ValueId>> members(g.num_values());  // per root: the other values in its storage
  const bool reuse = std::getenv("OASES_NO_MEMORY_REUSE") == nullptr;
  for (size_t pos = 0; pos < steps.size(); ++pos) {
    const Node& n = g.node(steps[pos].node);
    const int here = static_cast<int>(pos);
    if (steps[pos].uses) {
      for (ValueId in : n.inputs) {
        if (in != kNoId) last_use[root[in]] = std::max(last_use[root[in]], here);
      }
    }
    if (!steps[pos].defines) continue;
    const OpSchema* s = reg.find(n.domain, n.op_type);
    ValueId out0 = n.output(0);
    if (s && s->view_of_input >= 0 && n.has_input(s->view_of_input) && out0 != kNoId) {
      ValueId src = n.inputs[s->view_of_input];
      if (g.value(src).dtype == g.value(out0).dtype) {
        root[out0] = root[src];
        root_read[root[src]] = std::max(root_read[root[src]], last_read[out0]);
        members[root[src]].push_back(out0);
      }
    } else if (inplace_input && reuse) {
      // where the node reads its inputs last: here, or (a collective started here) at its wait
      auto w = wait_at.find(n.id);
      const bool collective = !steps[pos].uses;
      const int read_at = collective ? (w != wait_at.end() ? w->second : -1) : here;
      std::vector<ValueId> taken;  // roots this node already writes over (an input read twice)
      for (const InplacePair& ip : inplace_input(g, n)) {
        if (read_at < 0 || ip.output < 0 || static_cast<size_t>(ip.output) >= n.outputs.size() || !n.has_input(ip.input)) continue;
        ValueId out = n.outputs[static_cast<size_t>(ip.output)], in = n.inputs[static_cast<size_t>(ip.input)];
        if (out == kNoId || p.slots[out].kind != ValueSlot::Kind::kNone) continue;
        ValueId r = root[in];
        // the input's storage is arena storage that nobody reads after this node
        if (p.slots[r].kind != ValueSlot::Kind::kNone || root_read[r] != read_at || g.value(r).nbytes() != g.value(out).nbytes() ||
            g.value(in).dtype != g.value(out).dtype)
          continue;
        // a collective writes its outputs while the steps between its start and its wait run:
        // none of them may read the storage (through the input or another value in it)
        if (collective && (prev_read[in] >= here || std::any_of(members[r].begin(), members[r].end(), [&](ValueId m) {
                             return m != in && last_read[m] >= here;
                           }) || (r != in && last_read[r] >= here)))
          continue;
        if (std::find(taken.begin(), taken.end(), r) != taken.end()) continue;
        taken.push_back(r);
        root[out] = r;
        root_read[r] = std::max(root_read[r], last_read[out]);
        members[r].push_back(out);
        p.inplace++;
      }
    }
    for (ValueId out : n.outputs) {
      if (out != kNoId) last_use[root[out]] = std::max(last_use[root[out]], here);
    }
  }
  std::vector<char> pinned(g.num_values(), 0);
  for (ValueId v : keep) pinned[root[v]] = 1;
  for (ValueId v : g.outputs()) pinned[root[v]] = 1;

  // Every arena value's lifetime: from the step defining it to its last use (inclusive; pinned
  // ones to the end). OASES_NO_MEMORY_REUSE=1 gives every value its own space (for debugging).
  std::vector<Lifetime> lives;
  for (size_t pos = 0; pos < steps.size(); ++pos) {
    const Node& n = g.node(steps[pos].node);
    if (!steps[pos].defines) continue;
    for (ValueId out : n.outputs) {
      if (out == kNoId) continue;
      ValueSlot& s = p.slots[out];
      if (s.kind == ValueSlot::Kind::kConstant || s.kind == ValueSlot::Kind::kInput) continue;
      s.bytes = g.value(out).nbytes();
      if (root[out] != out) {
        s.kind = ValueSlot::Kind::kView;
        s.root = root[out];
        continue;
      }
      s.kind = ValueSlot::Kind::kArena;
      const size_t bytes = std::max<size_t>(kAlign, (s.bytes + kAlign - 1) / kAlign * kAlign);
      p.total_bytes += (s.bytes + kAlign - 1) / kAlign * kAlign;
      int last = kForever;
      if (!pinned[out] && reuse) last = last_use[out] < 0 ? static_cast<int>(pos) : last_use[out];
      lives.push_back(Lifetime{out, static_cast<int>(pos), last, bytes});
    }
  }
  // Offsets: the online best-fit (in step order), and, for programs of up to kOfflineValues
  // values, the offline greedy-by-size assignment (largest first, each at the lowest offset free
  // of every value alive beside it), which packs much tighter where chunks leave holes; the
  // smaller arena wins.
  std::vector<int64_t> offsets;
  size_t peak = assign_online(lives, steps.size(), &offsets);
  if (reuse && lives.size() <= kOfflineValues) {
    std::vector<int64_t> packed;
    const size_t tight = assign_by_size(lives, &packed);
    if (tight < peak) {
      peak = tight;
      offsets = std::move(packed);
    }
  }
  for (size_t i = 0; i < lives.size(); ++i) p.slots[lives[i].value].offset = offsets[i];
  p.arena_bytes = peak;
  return p;
}

LivePeak live_peak(const Graph& g, const std::vector<PlanStep>& steps, const MemoryPlan& plan, const std::set<ValueId>& keep) {
  const size_t n = g.num_values();
  auto root_of = [&](ValueId v) -> ValueId {
    if (v == kNoId || static_cast<size_t>(v) >= plan.slots.size()) return kNoId;
    const ValueSlot& s = plan.slots[static_cast<size_t>(v)];
    if (s.kind == ValueSlot::Kind::kView) return s.root;
    return s.kind == ValueSlot::Kind::kArena ? v : kNoId;
  };
  const size_t none = std::numeric_limits<size_t>::max();
  std::vector<size_t> first(n, none), last(n, 0);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Node& node = g.node(steps[i].node);
    if (steps[i].defines) {
      for (ValueId o : node.outputs) {
        ValueId r = root_of(o);
        if (r == kNoId) continue;
        first[static_cast<size_t>(r)] = std::min(first[static_cast<size_t>(r)], i);
        last[static_cast<size_t>(r)] = std::max(last[static_cast<size_t>(r)], i);
      }
    }
    if (steps[i].uses) {
      for (ValueId v : node.inputs) {
        ValueId r = root_of(v);
        if (r != kNoId) last[static_cast<size_t>(r)] = std::max(last[static_cast<size_t>(r)], i);
      }
    }
  }
  auto to_end = [&](ValueId v) {
    ValueId r = root_of(v);
    if (r != kNoId && !steps.empty()) last[static_cast<size_t>(r)] = steps.size() - 1;
  };
  for (ValueId v : keep) to_end(v);
  for (ValueId v : g.outputs()) to_end(v);
  // bytes alive at each step: +bytes where a value starts, -bytes after its last step
  std::vector<int64_t> delta(steps.size() + 1, 0);
  for (size_t v = 0; v < n; ++v) {
    if (first[v] == none) continue;
    const auto b = static_cast<int64_t>(plan.slots[v].bytes);
    delta[first[v]] += b;
    delta[last[v] + 1] -= b;
  }
  LivePeak peak;
  int64_t alive = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    alive += delta[i];
    if (alive > static_cast<int64_t>(peak.bytes)) {
      peak.bytes = static_cast<size_t>(alive);
      peak.step = i;
    }
  }
  for (size_t v = 0; v < n; ++v) {
    if (first[v] != none && first[v] <= peak.step && last[v] >= peak.step)
      peak.values.push_back(LiveValue{static_cast<ValueId>(v), plan.slots[v].bytes});
  }
  std::sort(peak.values.begin(), peak.values.end(), [](const LiveValue& a, const LiveValue& b) { return a.bytes > b.bytes; });
  return peak;
}

}  // namespace oases
