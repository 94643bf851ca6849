#include "planner/pipeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "planner/cluster_spec.h"
#include "planner/reshard.h"

namespace oases {

Expected<std::vector<StageCut>> cut_stages(int blocks, int stages, const std::string& spec, const std::vector<double>& cost) {
  if (stages < 1) return error("--pp {}: at least one stage", stages);
  if (blocks < stages) return error("--pp {}: the model has {} transformer block(s), fewer than the stages", stages, blocks);
  if (!cost.empty() && static_cast<int>(cost.size()) != blocks) return error("{} block costs for {} blocks", cost.size(), blocks);
  std::vector<StageCut> cuts;
  if (!spec.empty()) {
    std::stringstream ss(spec);
    std::string item;
    int expect = 0;
    while (std::getline(ss, item, ',')) {
      int a = -1, b = -1;
      char dash = 0, extra = 0;
      std::istringstream is(item);
      if (!(is >> a >> dash >> b) || dash != '-' || (is >> extra)) return error("--stages '{}': '{}' is not FIRST-LAST", spec, item);
      if (b < a) return error("--stages '{}': stage {} ({}) is empty", spec, cuts.size(), item);
      if (a != expect)
        return error("--stages '{}': stage {} starts at block {}, expected {} (every block once, in order)", spec, cuts.size(), a, expect);
      if (b >= blocks) return error("--stages '{}': block {} is past the model's last block {}", spec, b, blocks - 1);
      cuts.push_back({a, b});
      expect = b + 1;
    }
    if (expect != blocks) return error("--stages '{}': blocks {}-{} are in no stage", spec, expect, blocks - 1);
    if (static_cast<int>(cuts.size()) != stages) return error("--stages '{}' gives {} stages, --pp {}", spec, cuts.size(), stages);
    return cuts;
  }
  // linear partition: best[k][i] = the least max stage cost of the first i blocks in k stages
  std::vector<double> prefix(static_cast<size_t>(blocks) + 1, 0);
  for (int i = 0; i < blocks; ++i)
    prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + (cost.empty() ? 1.0 : cost[static_cast<size_t>(i)]);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1, std::vector<double>(static_cast<size_t>(blocks) + 1, inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(static_cast<size_t>(blocks) + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= blocks; ++i) {
      for (int j = k - 1; j < i; ++j) {
        double v = std::max(best[static_cast<size_t>(k) - 1][static_cast<size_t>(j)],
                            prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(j)]);
        if (v <=
            best[static_cast<size_t>(k)][static_cast<size_t>(i)] + 1e-12) {  // ties: later cuts, a lighter last stage (it holds the head)
          best[static_cast<size_t>(k)][static_cast<size_t>(i)] = v;
          from[static_cast<size_t>(k)][static_cast<size_t>(i)] = j;
        }
      }
    }
  }
  cuts.resize(static_cast<size_t>(stages));
  for (int k = stages, i = blocks; k > 0; --k) {
    int j = from[static_cast<size_t>(k)][static_cast<size_t>(i)];
    cuts[static_cast<size_t>(k) - 1] = {j, i - 1};
    i = j;
  }
  return cuts;
}

std::string stages_string(const std::vector<StageCut>& cuts) {
  std::string s;
  for (const StageCut& c : cuts) s += fmt::format("{}{}-{}", s.empty() ? "" : ",", c.first, c.last);
  return s;
}

Status check_pipeline_batch(int64_t batch, int64_t dp, int64_t micro_batches, int64_t chunks) {
  if (dp < 1 || micro_batches < 1 || chunks < 1)
    return error("dp {}, micro-batches {} and chunks {} must each be at least 1", dp, micro_batches, chunks);
  if (batch % (dp * micro_batches * chunks) != 0)
    return error("the batch of {} does not split into dp {} x {} micro-batches x {} chunks ({} pieces)", batch, dp, micro_batches, chunks,
                 dp * micro_batches * chunks);
  return Status::ok();
}

const char* pipeline_name(PipelineSchedule p) {
  switch (p) {
    case PipelineSchedule::kGPipe: return "gpipe";
    case PipelineSchedule::k1F1B: return "1f1b";
    case PipelineSchedule::kEager1F1B: return "eager-1f1b";
    case PipelineSchedule::kZBH1: return "zb-h1";
  }
  return "?";
}

bool splits_backward(PipelineSchedule p) {
  return p == PipelineSchedule::kZBH1;
}

PipelineTimes split_backward(PipelineSchedule p, PipelineTimes t, double weight_share) {
  if (!splits_backward(p) || !t.weight_s.empty()) return t;
  for (double& b : t.backward_s) {
    t.weight_s.push_back(b * weight_share);
    b *= 1 - weight_share;
  }
  return t;
}

Expected<PipelineSchedule> parse_pipeline(const std::string& text) {
  for (auto p : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kEager1F1B, PipelineSchedule::kZBH1}) {
    if (text == pipeline_name(p)) return p;
  }
  return error("--pipeline '{}': use gpipe, 1f1b, eager-1f1b or zb-h1", text);
}

Status check_virtual_stages(PipelineSchedule p, int stages, int micro_batches, int V, int blocks) {
  if (V < 1) return error("--virtual-stages {}: at least 1", V);
  if (V == 1) return Status::ok();
  if (p != PipelineSchedule::k1F1B) return error("--virtual-stages {} runs the interleaved 1f1b schedule, not {}", V, pipeline_name(p));
  if (stages < 2) return error("--virtual-stages {} needs at least 2 pipeline stages, not {}", V, stages);
  if (micro_batches < 1 || micro_batches % stages != 0)
    return error("--virtual-stages {}: {} micro-batches are not a multiple of the {} stages (interleaved 1F1B sends S micro-batches round at once)",
                 V, micro_batches, stages);
  if (blocks >= 0 && blocks < stages * V)
    return error("--virtual-stages {}: {} stages x {} need {} block ranges; the model has {} transformer block(s)", V, stages, V, stages * V, blocks);
  return Status::ok();
}

int warmup_forwards(PipelineSchedule p, int stage, int stages, int micro_batches, int V) {
  if (V > 1) return std::min(micro_batches * V, 2 * (stages - stage - 1) + (V - 1) * stages);
  switch (p) {
    case PipelineSchedule::kGPipe: return micro_batches;
    case PipelineSchedule::k1F1B:
    case PipelineSchedule::kZBH1: return std::min(micro_batches, stages - stage - 1);
    case PipelineSchedule::kEager1F1B: return std::min(micro_batches, 2 * (stages - stage) - 1);
  }
  return micro_batches;
}

namespace {

// zb-h1's orders (see planner/pipeline.h): every stage's, from one run of the pipeline in unit steps.
std::vector<std::vector<PipeStep>> zero_bubble_orders(int S, int M) {
  std::vector<std::vector<PipeStep>> fb(static_cast<size_t>(S)), out(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) fb[static_cast<size_t>(s)] = stage_steps(PipelineSchedule::k1F1B, s, S, M);
  const int64_t never = std::numeric_limits<int64_t>::max();
  // when activation / gradient m reaches stage s (never: not made yet)
  std::vector<std::vector<int64_t>> act(static_cast<size_t>(S), std::vector<int64_t>(static_cast<size_t>(M), never)), grad = act;
  std::vector<int64_t> free(static_cast<size_t>(S), 0);
  std::vector<size_t> next(static_cast<size_t>(S), 0);
  std::vector<std::vector<int>> pending(static_cast<size_t>(S));  // B's run, W's not yet
  std::fill(act[0].begin(), act[0].end(), 0);                      // the first stage's inputs are there
  size_t left = static_cast<size_t>(3 * S * M);
  while (left > 0) {
    // the stage free first (ties: the lower stage) acts at its time: whatever ends by then is known
    int s = 0;
    for (int c = 1; c < S; ++c) {
      if (free[static_cast<size_t>(c)] < free[static_cast<size_t>(s)]) s = c;
    }
    const size_t su = static_cast<size_t>(s);
    const int64_t now = free[su];
    const size_t cap = static_cast<size_t>(s);  // W's stage s may defer past a forward
    auto run_w = [&]() {
      int m = pending[su].front();
      pending[su].erase(pending[su].begin());
      out[su].push_back({false, m, true});
      free[su] = now + 1;
      --left;
    };
    if (next[su] < fb[su].size()) {
      const PipeStep st = fb[su][next[su]];
      const size_t mu = static_cast<size_t>(st.micro);
      const int64_t ready = st.forward ? act[su][mu] : (s == S - 1 ? 0 : grad[su][mu]);
      if (st.forward && pending[su].size() > cap) {
        run_w();  // no more than cap W's deferred past a forward
        continue;
      }
      if (ready <= now) {
        out[su].push_back(st);
        ++next[su];
        free[su] = now + 1;
        --left;
        if (st.forward) {
          if (s + 1 < S) act[su + 1][mu] = now + 1;
        } else {
          pending[su].push_back(st.micro);
          if (s > 0) grad[su - 1][mu] = now + 1;
        }
        continue;
      }
    }
    if (!pending[su].empty()) {
      run_w();
      continue;
    }
    free[su] = now + 1;  // nothing to do: wait a unit
  }
  return out;
}

// zero_bubble_orders of (S, M), made once (the planner asks for every stage of many candidates).
std::shared_ptr<const std::vector<std::vector<PipeStep>>> zero_bubble_orders_cached(int S, int M) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::shared_ptr<const std::vector<std::vector<PipeStep>>>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({S, M});
    if (it != cache.end()) return it->second;
  }
  auto made = std::make_shared<const std::vector<std::vector<PipeStep>>>(zero_bubble_orders(S, M));
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 4096) cache.clear();
  return cache.emplace(std::make_pair(S, M), made).first->second;
}

}  // namespace

std::vector<PipeStep> stage_steps(PipelineSchedule p, int stage, int stages, int micro_batches, int V) {
  if (V > 1) {
    if (stage < 0 || stage >= stages || !check_virtual_stages(p, stages, micro_batches, V).is_ok()) return {};
    const int S = stages, total = micro_batches * V;
    auto nth = [&](int k, bool forward) {
      PipeStep st;
      st.forward = forward;
      st.micro = (k / (S * V)) * S + k % S;
      const int round = (k / S) % V;
      st.chunk = forward ? round : V - 1 - round;
      return st;
    };
    const int w = warmup_forwards(p, stage, stages, micro_batches, V);
    std::vector<PipeStep> out;
    for (int k = 0; k < w; ++k) out.push_back(nth(k, true));
    for (int i = 0; i < total; ++i) {
      if (w + i < total) out.push_back(nth(w + i, true));
      out.push_back(nth(i, false));
    }
    return out;
  }
  if (p == PipelineSchedule::kZBH1) {
    if (stage < 0 || stage >= stages || micro_batches < 1) return {};
    return (*zero_bubble_orders_cached(stages, micro_batches))[static_cast<size_t>(stage)];
  }
  int w = warmup_forwards(p, stage, stages, micro_batches);
  std::vector<PipeStep> out;
  for (int m = 0; m < w; ++m) out.push_back({true, m});
  for (int i = 0; i < micro_batches; ++i) {
    if (w + i < micro_batches) out.push_back({true, w + i});
    out.push_back({false, i});
  }
  return out;
}

int peak_in_flight(const std::vector<PipeStep>& steps) {
  const bool split = std::any_of(steps.begin(), steps.end(), [](const PipeStep& s) { return s.weight; });
  int now = 0, peak = 0;
  for (const PipeStep& s : steps) {
    if (s.forward) {
      ++now;
    } else if (s.weight == split) {  // done: its W, or its backward when there is none
      --now;
    }
    peak = std::max(peak, now);
  }
  return peak;
}

std::vector<InFlight> in_flight_profile(const std::vector<PipeStep>& steps) {
  const bool split = std::any_of(steps.begin(), steps.end(), [](const PipeStep& x) { return x.weight; });
  int V = 1;
  for (const PipeStep& s : steps) V = std::max(V, s.chunk + 1);
  std::vector<int> fb(static_cast<size_t>(V), 0), bw(static_cast<size_t>(V), 0);  // per chunk
  std::vector<InFlight> out;
  out.reserve(steps.size());
  InFlight now;
  for (const PipeStep& s : steps) {
    now.kind = s.kind();
    now.chunk = std::max(0, s.chunk);
    int& f = fb[static_cast<size_t>(now.chunk)];
    int& w = bw[static_cast<size_t>(now.chunk)];
    if (s.forward) {
      ++now.forward_backward, ++f;
    } else if (s.weight) {
      --now.backward_weight, --w;
    } else {
      --now.forward_backward, --f;
      if (split) ++now.backward_weight, ++w;
    }
    now.chunk_forward_backward = f;
    now.chunk_backward_weight = w;
    out.push_back(now);
  }
  return out;
}

Expected<PipelineSim> simulate_pipeline(PipelineSchedule p, int micro_batches, const PipelineTimes& given, int V) {
  const PipelineTimes t = split_backward(p, given);
  const int C = static_cast<int>(t.forward_s.size());  // model stages
  const int M = micro_batches;
  if (V < 1 || C < V || C % V != 0) return error("pipeline times: {} model stages for {} virtual stages a rank", C, V);
  const int S = C / V;
  if (t.backward_s.size() != t.forward_s.size() || static_cast<int>(t.transfer_s.size()) != C - 1)
    return error("pipeline times: {} forward, {} backward and {} transfer times for {} stages", t.forward_s.size(), t.backward_s.size(),
                 t.transfer_s.size(), C);
  if (M < 1) return error("a pipeline needs at least one micro-batch, not {}", M);
  OASES_RETURN_IF_ERROR(check_virtual_stages(p, S, M, V));
  if (splits_backward(p) && t.weight_s.size() != t.forward_s.size())
    return error("pipeline times: {} weight-gradient times for {} stages", t.weight_s.size(), C);
  const double unknown = -1;
  // arrival of activation m at model stage c (from c − 1) and of gradient m at c (from c + 1)
  std::vector<std::vector<double>> act(static_cast<size_t>(C), std::vector<double>(static_cast<size_t>(M), unknown));
  std::vector<std::vector<double>> grad = act, fwd_end = act;
  std::vector<std::vector<PipeStep>> steps;
  for (int s = 0; s < S; ++s) steps.push_back(stage_steps(p, s, S, M, V));
  std::vector<size_t> next(static_cast<size_t>(S), 0);
  std::vector<double> free(static_cast<size_t>(S), 0);
  // the links between ranks: one lane per direction (half duplex: per pair), free from when
  std::map<std::pair<int, int>, double> lanes;
  auto lane = [&](int from, int to) -> double& {
    return t.half_duplex ? lanes[{std::min(from, to), std::max(from, to)}] : lanes[{from, to}];
  };
  PipelineSim sim;
  for (int s = 0; s < S; ++s) sim.peak_in_flight.push_back(peak_in_flight(steps[static_cast<size_t>(s)]));
  size_t remaining = 0;
  for (const auto& st : steps) remaining += st.size();
  // when stage s's next step can start (its input there), `unknown` while it is not made yet
  auto ready_at = [&](int r) {
    const PipeStep& st = steps[static_cast<size_t>(r)][next[static_cast<size_t>(r)]];
    const int c = r + st.chunk * S;
    const size_t cu = static_cast<size_t>(c), mu = static_cast<size_t>(st.micro);
    return st.forward ? (c == 0 ? 0.0 : act[cu][mu]) : st.weight ? 0.0 : (c == C - 1 ? fwd_end[cu][mu] : grad[cu][mu]);
  };
  auto link_time = [&](int r) {  // of duration(r), the wait on the link
    const PipeStep& st = steps[static_cast<size_t>(r)][next[static_cast<size_t>(r)]];
    const size_t cu = static_cast<size_t>(r + st.chunk * S);
    const std::vector<double>& v = st.forward ? t.forward_link_s : t.backward_link_s;
    return st.weight || cu >= v.size() ? 0.0 : v[cu];
  };
  auto duration = [&](int r) {  // the step's time while every stage computes
    const PipeStep& st = steps[static_cast<size_t>(r)][next[static_cast<size_t>(r)]];
    const size_t cu = static_cast<size_t>(r + st.chunk * S);
    return st.forward ? t.forward_s[cu] : st.weight ? t.weight_s[cu] : t.backward_s[cu];
  };
  // stage s's next step ran from start to end: its transfer leaves, the stage moves on
  auto finish = [&](int s, double start, double end) {
    const size_t su = static_cast<size_t>(s);
    const PipeStep& st = steps[su][next[su]];
    const int c = s + st.chunk * S;
    const size_t cu = static_cast<size_t>(c), mu = static_cast<size_t>(st.micro);
    sim.events.push_back({c, st.forward, st.micro, st.weight, false, start, end});
    if (st.weight) {
      // its micro-batch's weight gradients: nothing leaves the stage
    } else if (st.forward) {
      fwd_end[cu][mu] = end;
      if (c + 1 < C) {  // the activation leaves right after the forward that made it
        double& l = lane(s, (c + 1) % S);
        double ts = std::max(end, l);
        l = ts + t.transfer_s[cu];
        act[cu + 1][mu] = l;
        sim.events.push_back({c, true, st.micro, false, true, ts, l, end});
      }
    } else if (c > 0) {
      double& l = lane(s, (c - 1) % S);
      double ts = std::max(end, l);
      l = ts + t.transfer_s[cu - 1];
      grad[cu - 1][mu] = l;
      sim.events.push_back({c - 1, false, st.micro, false, true, ts, l, end});
    }
    sim.step_s = std::max(sim.step_s, end);
    ++next[su];
    --remaining;
  };
  const auto stuck = [&] { return error("pipeline {}: the stages wait on each other (a schedule that cannot run)", pipeline_name(p)); };
  const double all_busy = std::max(1.0, static_cast<double>(S) * t.stage_threads / std::max(t.shared_cores, 1e-9));
  if (t.shared_cores <= 0 || all_busy <= 1.0) {
    // a device each (or cores enough for all): a step takes its time. Steps run in the order they
    // start (the earliest-starting ready step of any stage next), so the transfers take their
    // links in time order.
    while (remaining > 0) {
      int s = -1;
      double best = 0;
      for (int r = 0; r < S; ++r) {
        if (next[static_cast<size_t>(r)] >= steps[static_cast<size_t>(r)].size()) continue;
        const double ready = ready_at(r);
        if (ready == unknown) continue;
        double start = std::max(free[static_cast<size_t>(r)], ready);
        if (s < 0 || start < best) {
          s = r;
          best = start;
        }
      }
      if (s < 0) return stuck();
      const double end = best + duration(s);
      free[static_cast<size_t>(s)] = end;
      finish(s, best, end);
    }
  } else {
    // shared cores: time advances from one step's end or input's arrival to the next; in between
    // the computing stages' steps progress at the sharing's rate (their work: duration / all_busy).
    // Of a step, the time its ranks wait on the link (PipelineTimes::forward_link_s) takes the
    // same wall time however many cores are free: it runs after the step's work, off the cores.
    std::vector<double> left(static_cast<size_t>(S), -1), started(static_cast<size_t>(S), 0);  // -1: not computing
    std::vector<double> link_for(static_cast<size_t>(S), 0), link_end(static_cast<size_t>(S), -1);   // -1: not on the link
    double now = 0;
    while (remaining > 0) {
      int busy = 0;
      double arrival = std::numeric_limits<double>::infinity();
      for (int r = 0; r < S; ++r) {  // waits on the link that are over (their transfers leave)
        const size_t ru = static_cast<size_t>(r);
        if (link_end[ru] >= 0 && link_end[ru] <= now) {
          link_end[ru] = -1;
          finish(r, started[ru], now);
        }
      }
      if (remaining == 0) break;
      for (int r = 0; r < S; ++r) {
        const size_t ru = static_cast<size_t>(r);
        if (link_end[ru] >= 0) {
          arrival = std::min(arrival, link_end[ru]);
          continue;
        }
        if (left[ru] < 0 && next[ru] < steps[ru].size()) {
          const double ready = ready_at(r);
          if (ready != unknown && ready <= now) {
            const double d = duration(r);
            link_for[ru] = std::min(d, link_time(r));
            left[ru] = (d - link_for[ru]) / all_busy;
            started[ru] = now;
          } else if (ready != unknown) {
            arrival = std::min(arrival, ready);
          }
        }
        busy += left[ru] >= 0;
      }
      if (busy == 0) {
        if (!std::isfinite(arrival)) return stuck();
        now = arrival;
        continue;
      }
      const double rate = 1.0 / std::max(1.0, busy * t.stage_threads / t.shared_cores);
      double dt = (arrival - now);
      for (double l : left) {
        if (l >= 0) dt = std::min(dt, l / rate);
      }
      now += dt;
      for (int r = 0; r < S; ++r) {
        const size_t ru = static_cast<size_t>(r);
        double& l = left[ru];
        if (l < 0) continue;
        l -= dt * rate;
        if (l <= 1e-12 * std::max(1.0, now)) {
          l = -1;
          if (link_for[ru] > 0) {
            link_end[ru] = now + link_for[ru];
          } else {
            finish(r, started[ru], now);
          }
        }
      }
    }
  }
  // the bubble: 1 - the busiest rank's computing time (its steps' spans) / the step
  std::vector<double> busy_s(static_cast<size_t>(S), 0);
  for (const PipelineEvent& e : sim.events) {
    if (!e.transfer) busy_s[static_cast<size_t>(e.stage % S)] += e.end_s - e.start_s;
  }
  const double busiest = *std::max_element(busy_s.begin(), busy_s.end());
  sim.bubble = sim.step_s > 0 ? 1.0 - busiest / sim.step_s : 0;
  return sim;
}

PipelineTimes share_cores(PipelineTimes t, const ClusterSpec& cluster, int stages, int64_t stage_ranks) {
  if (cluster.cores_per_node > 0 && cluster.ranks_on_cores() >= static_cast<int64_t>(stages) * stage_ranks) {
    t.shared_cores = cluster.cores_per_node;
    t.stage_threads = static_cast<double>(stage_ranks * cluster.threads_per_rank);
  }
  return t;
}

std::vector<PipeTransfer> pipeline_transfer_order(const PipelineSim& sim) {
  std::vector<PipeTransfer> out;
  for (const PipelineEvent& e : sim.events) {
    if (e.transfer) out.push_back({e.stage, e.forward, e.micro, e.issue_s});
  }
  std::stable_sort(out.begin(), out.end(), [](const PipeTransfer& a, const PipeTransfer& b) {
    if (a.issue_s != b.issue_s) return a.issue_s < b.issue_s;
    if (a.boundary != b.boundary) return a.boundary < b.boundary;
    if (a.forward != b.forward) return a.forward;
    return a.micro < b.micro;
  });
  return out;
}

Status check_pipeline_order(PipelineSchedule p, int stages, int micro_batches, const PipelineTimes& given, int V) {
  const int S = stages, M = micro_batches, C = stages * std::max(V, 1);
  PipelineTimes t = given;
  if (t.forward_s.empty())
    t = PipelineTimes{std::vector<double>(static_cast<size_t>(C), 1.0), std::vector<double>(static_cast<size_t>(C), 2.0),
                      std::vector<double>(static_cast<size_t>(std::max(0, C - 1)), 0.5)};
  auto sim = simulate_pipeline(p, M, t, V);
  if (!sim) return sim.status();
  std::vector<PipeTransfer> order = pipeline_transfer_order(*sim);
  // op id of a transfer = its place in the global order; participants: the two ranks
  std::map<std::tuple<int, bool, int>, int> id;
  for (size_t i = 0; i < order.size(); ++i) id[{order[i].boundary, order[i].forward, order[i].micro}] = static_cast<int>(i);
  auto sender = [&](const PipeTransfer& x) { return (x.forward ? x.boundary : x.boundary + 1) % S; };
  auto receiver = [&](const PipeTransfer& x) { return (x.forward ? x.boundary + 1 : x.boundary) % S; };
  std::vector<std::vector<ChannelInstr>> programs(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    std::vector<int> mine;  // this rank's transfers in the global order
    for (size_t i = 0; i < order.size(); ++i) {
      if (sender(order[i]) == s || receiver(order[i]) == s) mine.push_back(static_cast<int>(i));
    }
    auto& prog = programs[static_cast<size_t>(s)];
    size_t issued = 0;  // mine[0 .. issued) started
    std::vector<int> sends;
    std::set<int> made;  // this rank's sends whose producer ran
    // starts every channel op of this rank up to global position `upto`; a send among them that
    // its producer has not made yet means the order does not fit this rank
    auto start_through = [&](int upto) -> Status {
      while (issued < mine.size() && mine[issued] <= upto) {
        const PipeTransfer& x = order[static_cast<size_t>(mine[issued])];
        if (sender(x) == s && !made.count(mine[issued]))
          return error("stage {} would start transfer {} before making it (the global order does not fit its steps)", s, mine[issued]);
        prog.push_back({true, mine[issued], 1});
        if (sender(x) == s) sends.push_back(mine[issued]);
        ++issued;
      }
      return Status::ok();
    };
    for (const PipeStep& st : stage_steps(p, s, S, M, V)) {
      if (st.weight) continue;  // a W step neither reads nor makes a transfer
      const int c = s + st.chunk * S;
      bool reads = st.forward ? c > 0 : c + 1 < C;
      if (reads) {
        int x = id.at({st.forward ? c - 1 : c, st.forward, st.micro});
        OASES_RETURN_IF_ERROR(start_through(x));
        prog.push_back({false, x, 1});
      }
      bool makes = st.forward ? c + 1 < C : c > 0;
      if (makes) {
        int y = id.at({st.forward ? c : c - 1, st.forward, st.micro});
        made.insert(y);
        OASES_RETURN_IF_ERROR(start_through(y));
      }
    }
    for (int op : sends) prog.push_back({false, op, 1});  // the sends' buffers are freed at the end
  }
  return check_channel_programs(programs,
                                [&](int op) {
                                  const PipeTransfer& x = order[static_cast<size_t>(op)];
                                  return std::vector<int64_t>{sender(x), receiver(x)};
                                })
      .with_context(fmt::format("pipeline {} over {} stages{}, {} micro-batches", pipeline_name(p), S,
                                V > 1 ? fmt::format(" x {} virtual", V) : "", M));
}

}  // namespace oases
