#include "executor/stream_plan.h"

#include <algorithm>
#include <array>
#include <map>

namespace oases {

StreamPlan build_stream_plan(const Program& p) {
  std::vector<bool> channel(p.instrs.size(), false);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    channel[i] = p.instrs[i].kind == Instr::Kind::kCommStart && p.graph.node(p.instrs[i].node).attrs.get_int("channel", 0) > 0;
  }
  return build_stream_plan(p.instrs, channel);
}

StreamPlan build_stream_plan(const std::vector<Instr>& instrs, const std::vector<bool>& channel) {
  StreamPlan sp;
  std::map<NodeId, int> done_event;  // collective node -> its completion event
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instr& in = instrs[i];
    switch (in.kind) {
      case Instr::Kind::kCompute:
        sp.ops.push_back({StreamOp::Kind::kLaunch, 0, i, -1});
        sp.launches[0]++;
        break;
      case Instr::Kind::kCommStart: {
        int ready = sp.num_events++, done = sp.num_events++;
        const int s = i < channel.size() && channel[i] ? 2 : 1;
        sp.ops.push_back({StreamOp::Kind::kRecord, 0, 0, ready});
        sp.ops.push_back({StreamOp::Kind::kWait, s, 0, ready});
        sp.ops.push_back({StreamOp::Kind::kLaunch, s, i, -1});
        sp.ops.push_back({StreamOp::Kind::kRecord, s, 0, done});
        sp.launches[s]++;
        done_event[in.node] = done;
        break;
      }
      case Instr::Kind::kCommWait: {
        auto it = done_event.find(in.node);
        if (it != done_event.end()) sp.ops.push_back({StreamOp::Kind::kWait, 0, 0, it->second});
        break;
      }
    }
  }
  return sp;
}

namespace {

struct Access {
  int stream;
  int64_t clock;  // position on its stream
  bool write;
  size_t instr;
  ValueId value;
};

}  // namespace

Status check_stream_plan(const Program& p, const StreamPlan& plan) {
  const Graph& g = p.graph;
  const MemoryPlan& mp = p.memory;
  // arena range of each value (views resolve to their root)
  auto range_of = [&](ValueId v, int64_t* lo, int64_t* hi) {
    if (v == kNoId || static_cast<size_t>(v) >= mp.slots.size()) return false;
    const ValueSlot* s = &mp.slots[v];
    if (s->kind == ValueSlot::Kind::kView) s = &mp.slots[s->root];
    if (s->kind != ValueSlot::Kind::kArena || s->bytes == 0) return false;
    *lo = s->offset;
    *hi = s->offset + static_cast<int64_t>(s->bytes);
    return true;
  };
  // accesses per root value; overlapping roots found by a sorted sweep
  struct Range {
    int64_t lo, hi;
    ValueId root;
  };
  std::vector<Range> ranges;
  for (size_t v = 0; v < mp.slots.size(); ++v) {
    if (mp.slots[v].kind == ValueSlot::Kind::kArena && mp.slots[v].bytes) {
      ranges.push_back({mp.slots[v].offset, mp.slots[v].offset + static_cast<int64_t>(mp.slots[v].bytes), static_cast<ValueId>(v)});
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::map<ValueId, std::vector<ValueId>> overlaps;
  for (size_t i = 0; i < ranges.size(); ++i) {
    for (size_t j = i; j < ranges.size() && ranges[j].lo < ranges[i].hi; ++j) {
      overlaps[ranges[i].root].push_back(ranges[j].root);
      if (j != i) overlaps[ranges[j].root].push_back(ranges[i].root);
    }
  }
  auto root_of = [&](ValueId v) {
    const ValueSlot& s = mp.slots[v];
    return s.kind == ValueSlot::Kind::kView ? s.root : v;
  };
  std::map<ValueId, std::vector<Access>> log;
  int64_t vc[kNumStreams][kNumStreams] = {};  // vc[s][t]: what stream s has seen of stream t
  std::array<int64_t, kNumStreams> unset;
  unset.fill(-1);
  std::vector<std::array<int64_t, kNumStreams>> events(static_cast<size_t>(plan.num_events), unset);
  std::vector<char> recorded(static_cast<size_t>(plan.num_events), 0);
  int64_t clock[kNumStreams] = {};
  for (const StreamOp& op : plan.ops) {
    int s = op.stream;
    if (op.kind == StreamOp::Kind::kRecord) {
      for (int t = 0; t < kNumStreams; ++t) events[static_cast<size_t>(op.event)][static_cast<size_t>(t)] = vc[s][t];
      events[static_cast<size_t>(op.event)][static_cast<size_t>(s)] = clock[s];
      recorded[static_cast<size_t>(op.event)] = 1;
      continue;
    }
    if (op.kind == StreamOp::Kind::kWait) {
      if (!recorded[static_cast<size_t>(op.event)]) return error("stream {} waits for event {} before it is recorded", s, op.event);
      for (int t = 0; t < kNumStreams; ++t) vc[s][t] = std::max(vc[s][t], events[static_cast<size_t>(op.event)][static_cast<size_t>(t)]);
      continue;
    }
    ++clock[s];
    vc[s][s] = clock[s];
    const Node& n = g.node(p.instrs[op.instr].node);
    auto touch = [&](ValueId v, bool write) -> Status {
      int64_t lo, hi;
      if (!range_of(v, &lo, &hi)) return Status::ok();
      ValueId r = root_of(v);
      for (ValueId other : overlaps[r]) {
        for (const Access& a : log[other]) {
          if (a.stream == s || (!a.write && !write)) continue;
          if (a.clock > vc[s][a.stream]) {
            return error(
                "unordered access: {} on stream {} {} '{}' while {} on stream {} {} '{}' (arena bytes overlap) with no event between",
                n.describe(), s, write ? "writes" : "reads", g.value(v).name, g.node(p.instrs[a.instr].node).describe(), a.stream,
                a.write ? "writes" : "reads", g.value(a.value).name);
          }
        }
      }
      log[r].push_back(Access{s, clock[s], write, op.instr, v});
      return Status::ok();
    };
    for (ValueId v : n.inputs) OASES_RETURN_IF_ERROR(touch(v, false));
    for (ValueId v : n.outputs) OASES_RETURN_IF_ERROR(touch(v, true));
  }
  return Status::ok();
}

std::string describe(const StreamPlan& plan, const Program& p) {
  std::string out;
  for (const StreamOp& op : plan.ops) {
    const char* st = op.stream == 0 ? "compute" : op.stream == 1 ? "comm   " : "channel";
    switch (op.kind) {
      case StreamOp::Kind::kLaunch: out += fmt::format("{} launch {}\n", st, p.graph.node(p.instrs[op.instr].node).describe()); break;
      case StreamOp::Kind::kRecord: out += fmt::format("{} record e{}\n", st, op.event); break;
      case StreamOp::Kind::kWait: out += fmt::format("{} wait   e{}\n", st, op.event); break;
    }
  }
  return out;
}

}  // namespace oases
