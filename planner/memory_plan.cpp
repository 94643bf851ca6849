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
  for (size_t pos = 0; pos < steps.size(); ++pos) {
    if (!steps[pos].uses) continue;
    for (ValueId in : g.node(steps[pos].node).inputs) {
      if (in != kNoId) last_read[in] = std::max(last_read[in], static_cast<int>(pos));
    }
  }
  for (ValueId v : keep) last_read[v] = kForever;
  for (ValueId v : g.outputs()) last_read[v] = kForever;
  // roots of views and in-place outputs, and last use (step index) of every root
  std::vector<int> last_use(g.num_values(), -1);
  std::vector<int> root_read = last_read;  // per root: the last read of any value sharing it
  std::vector<ValueId> root(g.num_values());
  for (size_t v = 0; v < root.size(); ++v) root[v] = static_cast<ValueId>(v);
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
      }
    } else if (inplace_input && reuse && steps[pos].uses && out0 != kNoId && p.slots[out0].kind == ValueSlot::Kind::kNone) {
      int slot = inplace_input(g, n);
      if (slot >= 0 && n.has_input(slot)) {
        ValueId r = root[n.inputs[slot]];
        // the input's storage is arena storage that nobody reads after this node
        if (p.slots[r].kind == ValueSlot::Kind::kNone && root_read[r] == here && g.value(r).nbytes() == g.value(out0).nbytes() &&
            g.value(n.inputs[slot]).dtype == g.value(out0).dtype) {
          root[out0] = r;
          root_read[r] = std::max(root_read[r], last_read[out0]);
          p.inplace++;
        }
      }
    }
    for (ValueId out : n.outputs) {
      if (out != kNoId) last_use[root[out]] = std::max(last_use[root[out]], here);
    }
  }
  std::vector<char> pinned(g.num_values(), 0);
  for (ValueId v : keep) pinned[root[v]] = 1;
  for (ValueId v : g.outputs()) pinned[root[v]] = 1;

  OffsetAllocator alloc;
  // OASES_NO_MEMORY_REUSE=1 gives every value its own space (for debugging the plan)
  std::vector<std::vector<ValueId>> frees(steps.size());
  for (size_t pos = 0; pos < steps.size(); ++pos) {
    const Node& n = g.node(steps[pos].node);
    if (steps[pos].defines) {
      for (ValueId out : n.outputs) {
        if (out == kNoId) continue;
        ValueSlot& s = p.slots[out];
        if (s.kind == ValueSlot::Kind::kConstant || s.kind == ValueSlot::Kind::kInput) continue;
        const Value& val = g.value(out);
        s.bytes = val.nbytes();
        if (root[out] != out) {
          s.kind = ValueSlot::Kind::kView;
          s.root = root[out];
          continue;
        }
        s.kind = ValueSlot::Kind::kArena;
        s.offset = alloc.allocate(s.bytes);
        p.total_bytes += (s.bytes + kAlign - 1) / kAlign * kAlign;
        if (!pinned[out] && reuse) {
          int lu = last_use[out] < 0 ? static_cast<int>(pos) : last_use[out];
          frees[static_cast<size_t>(lu)].push_back(out);
        }
      }
    }
    for (ValueId v : frees[pos]) alloc.release(p.slots[v].offset);
  }
  p.arena_bytes = alloc.peak();
  return p;
}

}  // namespace oases
