#include "graph/passes/fusion.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "graph/op_registry.h"

namespace oases {

namespace {

constexpr const char* kFusedDomain = "oases.cpu";

bool is_op(const Node& n, const char* domain, const char* op) {
  return n.domain == domain && n.op_type == op;
}
bool is_matmul(const Node& n) {
  return is_op(n, "", "MatMul") || is_op(n, "oases", "MatMulT") || is_op(n, kFusedDomain, "FusedMatMul") ||
         is_op(n, kDeviceFusedDomain, "FusedMatMul");
}

// OASES_NO_DEVICE_FUSION: a comma-separated list of the device fusions to leave out ("attention",
// "gelu", "loss"), to tell a fused op's fault from the rest (bench/gpu/run.sh retries with it).
bool device_fusion_off(const char* what) {
  const char* e = std::getenv("OASES_NO_DEVICE_FUSION");
  if (!e) return false;
  std::stringstream list(e);
  for (std::string item; std::getline(list, item, ',');) {
    if (item == what) return true;
  }
  return false;
}

class Fuser {
 public:
  Fuser(Graph& g, std::vector<NodeId>& order, const std::set<ValueId>& keep, bool device)
      : g_(g),
        order_(order),
        keep_(keep),
        device_(device),
        gelu_(device && !device_fusion_off("gelu")),
        attention_(!device || !device_fusion_off("attention")),
        loss_(device && !device_fusion_off("loss")),
        domain_(device ? kDeviceFusedDomain : kFusedDomain) {
    for (size_t i = 0; i < order_.size(); ++i) pos_[order_[i]] = i;
  }

  FusionStats run(std::vector<size_t>* slots) {
    std::vector<NodeId> snapshot = order_;
    for (NodeId id : snapshot) {
      if (!g_.alive(id) || !is_matmul(g_.node(id))) continue;
      NodeId m = fold_transposes(id);
      fuse_epilogue(m);
    }
    for (NodeId id : snapshot) {
      if (gelu_ && g_.alive(id) && is_op(g_.node(id), "oases", "GeluGrad")) matmul_gelu_grad(id);
    }
    for (NodeId id : snapshot) {
      if (g_.alive(id) && swap_transpose_node(id)) transpose_product(id);
    }
    // the CPU kernels' own ops beyond the products
    for (NodeId id : snapshot) {
      if (!device_ && g_.alive(id) && is_op(g_.node(id), "", "Add")) add_gather_grad(id);
    }
    for (NodeId id : snapshot) {
      if (attention_ && g_.alive(id) && is_op(g_.node(id), "oases", "Attention")) attention_strided(id);
    }
    for (NodeId id : snapshot) {
      if (loss_ && g_.alive(id) && is_op(g_.node(id), "", "Cast")) loss_reads_half(id);
    }
    remove_dead();
    if (slots) {
      slots->clear();
      for (size_t i = 0; i < order_.size(); ++i) {
        if (g_.alive(order_[i])) slots->push_back(i);
      }
    }
    order_.erase(std::remove_if(order_.begin(), order_.end(), [&](NodeId n) { return !g_.alive(n); }), order_.end());
    return stats_;
  }

 private:
  Graph& g_;
  std::vector<NodeId>& order_;
  const std::set<ValueId>& keep_;
  const bool device_;
  // the parts OASES_NO_DEVICE_FUSION can leave out (read once): device training's GELU and its
  // gradient in the products' epilogues, attention through strides, the loss on 16-bit logits
  const bool gelu_, attention_, loss_;
  const char* domain_;  // of the fused products and attention
  std::map<NodeId, size_t> pos_;
  FusionStats stats_;

  // A value only the executor reads: safe to stop materialising.
  bool internal(ValueId v) const {
    const Value& val = g_.value(v);
    return !val.is_input && !val.is_constant() && !g_.is_output(v) && !keep_.count(v);
  }
  bool single_use(ValueId v) const { return g_.value(v).uses.size() == 1 && internal(v); }
  // Every reader of v is one of `nodes` (and v is internal).
  bool read_only_by(ValueId v, const std::set<NodeId>& nodes) const {
    if (!internal(v)) return false;
    for (const Use& u : g_.value(v).uses) {
      if (!nodes.count(u.node)) return false;
    }
    return true;
  }
  // A Transpose(0, 2, 1, 3): attention's head transpose, [B, T, H, E] <-> [B, H, T, E].
  static bool is_head_transpose(const Node& n) {
    return is_op(n, "", "Transpose") && n.attrs.get_ints("perm") == std::vector<int64_t>{0, 2, 1, 3};
  }
  // The one reader of v when it is a head transpose and v is internal; else kNoId.
  NodeId head_transpose_reader(ValueId v) const {
    NodeId t = v == kNoId ? kNoId : single_reader(v, "Transpose");
    return t != kNoId && is_head_transpose(g_.node(t)) ? t : kNoId;
  }
  // The one reader of v when it is an `op` node of the default domain and v is internal; else kNoId.
  NodeId single_reader(ValueId v, const char* op) const {
    if (!single_use(v)) return kNoId;
    NodeId n = g_.value(v).uses[0].node;
    return is_op(g_.node(n), "", op) ? n : kNoId;
  }

  // Transpose node swapping exactly the last two axes of a rank >= 2 value, or kNoId.
  NodeId swap_transpose(ValueId v) const {
    NodeId p = g_.producer(v);
    return p != kNoId && swap_transpose_node(p) ? p : kNoId;
  }
  bool swap_transpose_node(NodeId p) const {
    if (!is_op(g_.node(p), "", "Transpose")) return false;
    const Node& t = g_.node(p);
    const Shape& s = g_.value(t.inputs[0]).shape;
    int64_t r = static_cast<int64_t>(s.size());
    std::vector<int64_t> perm = t.attrs.get_ints("perm");
    if (r < 2 || static_cast<int64_t>(perm.size()) != r) return false;
    for (int64_t i = 0; i < r - 2; ++i) {
      if (perm[i] != i) return false;
    }
    return perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
  }

  // Where operand `v` ([B, H, T, D]) lies in memory: a Transpose(0, 2, 1, 3) of a [B, T, H, D]
  // view of a [B, T, H·D] value, possibly a Split part of a fused [B, T, W] projection. Returns
  // the source value and [offset, batch, head, time strides]; `through` collects the nodes read
  // through. Without a match: v itself, contiguous.
  // `readers`: the nodes that may read v (default: v has one reader).
  ValueId trace_operand(ValueId v, std::vector<int64_t>* layout, std::vector<NodeId>* through, const std::set<NodeId>* readers = nullptr) {
    const Shape& s = g_.value(v).shape;
    *layout = {0, s[1] * s[2] * s[3], s[2] * s[3], s[3]};
    NodeId t = g_.producer(v);
    if (t == kNoId || !is_head_transpose(g_.node(t)) || !(readers ? read_only_by(v, *readers) : single_use(v))) return v;
    ValueId x = g_.node(t).inputs[0];  // [B, T, H, D]
    int64_t B = s[0], H = s[1], T = s[2], D = s[3];
    *layout = {0, T * H * D, D, H * D};
    through->push_back(t);
    ValueId src = x;
    NodeId r = g_.producer(x);
    if (r == kNoId || !is_op(g_.node(r), "", "Reshape") || !single_use(x)) return src;
    ValueId y = g_.node(r).inputs[0];
    const Shape& ys = g_.value(y).shape;
    if (ys != Shape{B, T, H * D} || g_.value(y).dtype != g_.value(x).dtype) return src;
    through->push_back(r);
    src = y;
    NodeId sp = g_.producer(y);
    if (sp == kNoId || !is_op(g_.node(sp), "", "Split") || !single_use(y)) return src;
    const Node& split = g_.node(sp);
    const Shape& zs = g_.value(split.inputs[0]).shape;
    int64_t axis = split.attrs.get_int("axis", 0);
    if (axis < 0) axis += static_cast<int64_t>(zs.size());
    std::vector<int64_t> sizes = split.attrs.get_ints("split");
    if (zs.size() != 3 || axis != 2 || zs[0] != B || zs[1] != T || sizes.size() != split.outputs.size()) return src;
    int64_t offset = 0;
    for (size_t o = 0; o < split.outputs.size() && split.outputs[o] != y; ++o) offset += sizes[o];
    *layout = {offset, T * zs[2], D, zs[2]};
    return split.inputs[0];
  }

  // oases.Attention as oases.cpu.Attention / oases.device.Attention reading and writing through
  // strides and, in a device program's training graph, the oases.AttentionGrad that reads its
  // output as oases.device.AttentionGrad (the CPU's backward stays: the transposed values it reads
  // keep their transposes there):
  //   q, k, v read where the projections left them (trace_operand; the values they replace may
  //     be read by the pair only), so the head transposes and the Split of a fused qkv do not run;
  //   the output written [B, T, H, Dv] for the Transpose(0, 2, 1, 3) that followed (its only reader
  //     besides the backward node, which then reads it there too);
  //   dO read from before the Transpose(0, 2, 1, 3) that made it;
  //   dq, dk, dv written straight into the Concat that the Split's gradient makes, when each one
  //     reaches it through Transpose(0, 2, 1, 3) → Reshape [B, T, H·E] alone; else each through the
  //     head transpose that reads it alone, or [B, H, T, E] as before.
  // Those transposes, split and concat moved 10.8 ms of data a step of the bf16 GPT bench stack
  // (hidden 1024 x 24, H100, docs/GPU.md); cuDNN reads and writes through strides instead.
  void attention_strided(NodeId id) {
    const Node& a = g_.node(id);
    if (a.num_inputs() < 3 || a.outputs.empty() || a.outputs[0] == kNoId) return;
    for (int s = 0; s < 3; ++s) {
      if (a.inputs[s] == kNoId || g_.value(a.inputs[s]).shape.size() != 4) return;
    }
    const ValueId out = a.outputs[0];
    const ValueId mask = a.has_input(3) ? a.inputs[3] : kNoId;
    // the backward node of this forward node (device programs)
    NodeId gid = kNoId;
    for (const Use& u : g_.value(out).uses) {
      const Node& n = g_.node(u.node);
      if (!device_ || !is_op(n, "oases", "AttentionGrad") || u.slot != 4 || n.num_inputs() < 6) continue;
      bool same = n.inputs[1] == a.inputs[0] && n.inputs[2] == a.inputs[1] && n.inputs[3] == a.inputs[2] &&
                  (n.has_input(6) ? n.inputs[6] : kNoId) == mask && a.outputs.size() > 1 && n.inputs[5] == a.outputs[1];
      if (same && gid == kNoId) gid = u.node;
    }
    const Shape q = g_.value(a.inputs[0]).shape, k = g_.value(a.inputs[1]).shape, v = g_.value(a.inputs[2]).shape;
    const int64_t B = q[0], H = q[1], Hkv = k[1], Tq = q[2], Tk = k[2], D = q[3], Dv = v[3];
    std::set<NodeId> pair{id};
    if (gid != kNoId) pair.insert(gid);
    std::vector<ValueId> srcs(3);
    std::vector<std::vector<int64_t>> layouts(3);
    std::vector<NodeId> through;
    for (int s = 0; s < 3; ++s) srcs[s] = trace_operand(a.inputs[s], &layouts[s], &through, &pair);
    // the output: [B, T, H, Dv] for its head transpose, when the pair reads nothing else of it
    NodeId ot = kNoId;
    {
      std::vector<NodeId> transposes;
      bool others = !internal(out);
      for (const Use& u : g_.value(out).uses) {
        const Node& n = g_.node(u.node);
        if (u.node == gid && u.slot == 4) continue;
        if (is_head_transpose(n)) {
          transposes.push_back(u.node);
        } else {
          others = true;
        }
      }
      if (!others && transposes.size() == 1) ot = transposes[0];
    }
    std::vector<int64_t> o_layout = ot != kNoId ? std::vector<int64_t>{Tq * H * Dv, Dv, H * Dv} : std::vector<int64_t>{H * Tq * Dv, Tq * Dv, Dv};
    const ValueId o_val = ot != kNoId ? g_.node(ot).outputs[0] : out;
    // the backward node's dO, dq, dk, dv
    ValueId dout_src = kNoId;
    std::vector<int64_t> dout_layout;
    std::vector<ValueId> grads;
    std::vector<std::vector<int64_t>> grad_layouts(3);
    std::vector<int64_t> packed_shape;
    std::vector<NodeId> grad_nodes;  // the nodes after the gradients that no longer run
    bool backward_changed = false;
    if (gid != kNoId) {
      const Node& gn = g_.node(gid);
      dout_src = gn.inputs[0];
      dout_layout = {H * Tq * Dv, Tq * Dv, Dv};
      NodeId dt = g_.producer(dout_src);
      if (dt != kNoId && single_use(dout_src) && is_head_transpose(g_.node(dt))) {
        dout_src = g_.node(dt).inputs[0];
        dout_layout = {Tq * H * Dv, Dv, H * Dv};
        backward_changed = true;
      }
      const int64_t heads[3] = {H, Hkv, Hkv}, times[3] = {Tq, Tk, Tk}, widths[3] = {D, D, Dv};
      grads.assign(3, kNoId);
      for (int i = 0; i < 3; ++i) {
        grads[i] = i < static_cast<int>(gn.outputs.size()) ? gn.outputs[i] : kNoId;
        grad_layouts[i] = {0, heads[i] * times[i] * widths[i], times[i] * widths[i], widths[i]};
      }
      // packed: Transpose → Reshape [B, T, H·E] → one Concat over the last axis of the three
      NodeId concat = kNoId;
      std::vector<NodeId> chain;
      for (int i = 0; i < 3 && (i == 0 || concat != kNoId); ++i) {
        NodeId t = head_transpose_reader(grads[i]);
        NodeId r = t == kNoId ? kNoId : single_reader(g_.node(t).outputs[0], "Reshape");
        ValueId rv = r == kNoId ? kNoId : g_.node(r).outputs[0];
        NodeId c = rv == kNoId || g_.value(rv).shape != Shape{B, times[i], heads[i] * widths[i]} ? kNoId : single_reader(rv, "Concat");
        if (c == kNoId || (i > 0 && c != concat)) {
          concat = kNoId;
          break;
        }
        concat = c;
        chain.insert(chain.end(), {t, r});
      }
      if (concat != kNoId) {
        const Node& cn = g_.node(concat);
        const Shape& cs = g_.value(cn.outputs[0]).shape;
        int64_t axis = cn.attrs.get_int("axis", 0);
        if (axis < 0) axis += static_cast<int64_t>(cs.size());
        if (cn.num_inputs() != 3 || cs.size() != 3 || axis != 2 || Tq != Tk) concat = kNoId;
      }
      if (concat != kNoId) {
        const Node& cn = g_.node(concat);
        const int64_t W = g_.value(cn.outputs[0]).shape[2];
        int64_t offset = 0;
        for (ValueId in : cn.inputs) {
          int i = 0;
          while (i < 3 && g_.node(chain[2 * i + 1]).outputs[0] != in) ++i;
          if (i == 3) {
            concat = kNoId;
            break;
          }
          grad_layouts[i] = {offset, Tq * W, widths[i], W};
          offset += heads[i] * widths[i];
        }
      }
      if (concat != kNoId) {
        packed_shape = g_.value(g_.node(concat).outputs[0]).shape;
        grads = {g_.node(concat).outputs[0]};
        grad_nodes = chain;
        grad_nodes.push_back(concat);
        backward_changed = true;
      } else {
        for (int i = 0; i < 3; ++i) {
          NodeId t = head_transpose_reader(grads[i]);
          if (t == kNoId) continue;
          grads[i] = g_.node(t).outputs[0];
          grad_layouts[i] = {0, times[i] * heads[i] * widths[i], widths[i], heads[i] * widths[i]};
          grad_nodes.push_back(t);
          backward_changed = true;
        }
      }
    }
    if (through.empty() && ot == kNoId && !backward_changed) return;
    const std::vector<int64_t> dims{B, H, Hkv, Tq, Tk, D, Dv};
    // both nodes: the dims and where q, k, v and the output lie
    auto shared = [&](AttrMap at) {
      at.set("dims", Attribute::of_ints(dims));
      at.set("q_layout", Attribute::of_ints(layouts[0]));
      at.set("k_layout", Attribute::of_ints(layouts[1]));
      at.set("v_layout", Attribute::of_ints(layouts[2]));
      at.set("o_layout", Attribute::of_ints(o_layout));
      return at;
    };
    // the forward node
    {
      Node old = g_.node(id);
      AttrMap at = shared(old.attrs);
      std::vector<ValueId> ins{srcs[0], srcs[1], srcs[2]};
      if (mask != kNoId) ins.push_back(mask);
      std::vector<ValueId> outs = old.outputs;
      outs[0] = o_val;
      if (ot != kNoId) g_.remove_node(ot);
      g_.remove_node(id);
      place(g_.add_node("Attention", ins, outs, std::move(at), old.name, domain_), old, id);
    }
    stats_.attention++;
    if (gid == kNoId) return;
    Node old = g_.node(gid);
    AttrMap at = shared(old.attrs);
    at.set("dout_layout", Attribute::of_ints(dout_layout));
    at.set("dq_layout", Attribute::of_ints(grad_layouts[0]));
    at.set("dk_layout", Attribute::of_ints(grad_layouts[1]));
    at.set("dv_layout", Attribute::of_ints(grad_layouts[2]));
    if (!packed_shape.empty()) at.set("packed_shape", Attribute::of_ints(packed_shape));
    std::vector<ValueId> ins{dout_src, srcs[0], srcs[1], srcs[2], o_val, old.inputs[5]};
    if (mask != kNoId) ins.push_back(mask);
    for (NodeId n : grad_nodes) g_.remove_node(n);
    NodeId dt = g_.producer(old.inputs[0]);
    g_.remove_node(gid);
    if (dout_src != old.inputs[0] && dt != kNoId && g_.alive(dt)) g_.remove_node(dt);
    place(g_.add_node("AttentionGrad", ins, grads, std::move(at), old.name, kDeviceFusedDomain), old, gid);
    stats_.attention++;
  }

  // Cast(x16 → float32) read only by softmax cross-entropy and its gradient: both read the 16-bit
  // scores, widening per element (oases.device ops), and a gradient whose one reader is a Cast back
  // to x16's type writes that type itself. The values are those of the unfused chain (widening is
  // exact; the gradient is rounded once either way) without the float32 copies of the logits and
  // of their gradient: 2.4 GB of traffic a step for a 50257-token vocabulary at 8192 tokens.
  void loss_reads_half(NodeId cast) {
    const Node& cn = g_.node(cast);
    if (cn.inputs.empty() || cn.outputs.empty()) return;
    ValueId x16 = cn.inputs[0], x32 = cn.outputs[0];
    const DType ht = g_.value(x16).dtype;
    if ((ht != DType::kF16 && ht != DType::kBF16) || g_.value(x32).dtype != DType::kF32 || !internal(x32)) return;
    std::vector<NodeId> users;
    for (const Use& u : g_.value(x32).uses) {
      const Node& n = g_.node(u.node);
      bool loss = is_op(n, "", "SoftmaxCrossEntropyLoss") && u.slot == 0 &&
                  (n.outputs.size() < 2 || n.outputs[1] == kNoId || (g_.value(n.outputs[1]).uses.empty() && internal(n.outputs[1])));
      bool grad = is_op(n, "oases", "SoftmaxCrossEntropyGrad") && u.slot == 1 && n.num_inputs() >= 3;
      if (!loss && !grad) return;
      if (std::find(users.begin(), users.end(), u.node) == users.end()) users.push_back(u.node);
    }
    if (users.empty()) return;
    for (NodeId id : users) {
      Node old = g_.node(id);
      std::vector<ValueId> ins = old.inputs;
      for (ValueId& v : ins) {
        if (v == x32) v = x16;
      }
      std::vector<ValueId> outs{old.outputs[0]};
      AttrMap a = old.attrs;
      std::string name = old.name;
      NodeId back = kNoId;  // a Cast of the gradient back to the 16-bit type
      if (old.op_type == "SoftmaxCrossEntropyGrad") {
        ValueId d = old.outputs[0];
        if (single_use(d)) {
          NodeId r = g_.value(d).uses[0].node;
          if (is_op(g_.node(r), "", "Cast") && g_.node(r).outputs.size() == 1 && g_.value(g_.node(r).outputs[0]).dtype == ht) back = r;
        }
        a.set("half_output", Attribute::of_int(back != kNoId ? 1 : 0));
        if (back != kNoId) {
          outs[0] = g_.node(back).outputs[0];
          name += "+" + g_.node(back).name;
        }
      }
      if (back != kNoId) g_.remove_node(back);
      g_.remove_node(id);
      place(g_.add_node(old.op_type, ins, outs, std::move(a), name, kDeviceFusedDomain), old, id);
      stats_.loss_casts += back != kNoId ? 2 : 1;
    }
  }

  // Nodes none of whose outputs is read any more (what the rewrites above left behind).
  void remove_dead() {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (!g_.alive(*it)) continue;
      const Node& n = g_.node(*it);
      bool dead = !n.outputs.empty();
      for (ValueId o : n.outputs) dead &= o == kNoId || (g_.value(o).uses.empty() && internal(o));
      if (dead) {
        g_.remove_node(*it);
        stats_.dead++;
      }
    }
  }

  // Add(X, GatherGrad(dy, idx)) → AddGatherGrad(X, dy, idx): the rows of dy are added into X's
  // copy (or into X itself, when the memory plan lets the output overwrite it) instead of
  // scattering into a zero-filled table first (a tied embedding's gradient: 154 MB for GPT-2).
  void add_gather_grad(NodeId id) {
    const Node& add = g_.node(id);
    if (add.num_inputs() != 2 || add.inputs[0] == add.inputs[1]) return;
    for (int s = 0; s < 2; ++s) {
      ValueId gv = add.inputs[s], x = add.inputs[1 - s];
      NodeId gg = g_.producer(gv);
      if (gg == kNoId || !is_op(g_.node(gg), "oases", "GatherGrad") || !single_use(gv)) continue;
      const Value &xv = g_.value(x), &ov = g_.value(add.outputs[0]);
      if (xv.shape != ov.shape || g_.value(gv).shape != ov.shape || xv.dtype != ov.dtype) continue;
      const Node& gn = g_.node(gg);
      std::vector<ValueId> ins{x, gn.inputs[0], gn.inputs[1]};
      AttrMap a = gn.attrs;  // axis, and row_mesh_axis for a vocabulary-split table
      ValueId out = add.outputs[0];
      std::string name = add.name + "+" + gn.name;
      Node::Phase phase = add.phase;
      std::string scope = add.scope;
      int chunk = add.chunk;
      g_.remove_node(gg);
      g_.remove_node(id);
      NodeId n = g_.add_node("AddGatherGrad", ins, {out}, std::move(a), name, kFusedDomain);
      g_.node(n).phase = phase;
      g_.node(n).scope = scope;
      g_.node(n).chunk = chunk;
      size_t p = pos_.at(id);
      order_[p] = n;
      pos_[n] = p;
      stats_.gather_grad++;
      return;
    }
  }

  // Transpose(op(A)·op(B)) = op(B)ᵀ·op(A)ᵀ: the product writes the transposed result directly
  // (e.g. the gradient of GPT-2's tied LM head, d(wteᵀ) → d(wte)).
  void transpose_product(NodeId t) {
    const Node& tn = g_.node(t);
    ValueId y = tn.inputs[0];
    NodeId mm = g_.producer(y);
    if (mm == kNoId || !single_use(y)) return;
    const Node& m = g_.node(mm);
    if (!is_matmul(m) || m.num_inputs() != 2 || !m.attrs.get_string("activation", "").empty()) return;
    if (g_.value(m.inputs[0]).shape.size() < 2 || g_.value(m.inputs[1]).shape.size() < 2) return;
    int64_t ta, tb;
    std::string act;
    flags_of(m, &ta, &tb, &act);
    ValueId out = tn.outputs[0];
    std::vector<ValueId> ins{m.inputs[1], m.inputs[0]};
    g_.remove_node(t);
    rebuild(mm, ins, 1 - tb, 1 - ta, "", out, t, "+transposed");
    stats_.transposes_folded++;
  }

  // Rebuilds matmul node `id` as oases.cpu.FusedMatMul (if it is not one yet) with the given
  // operands, flags and output (and the activation's input as output 1 where `preact` is given), at
  // position `at` of the order; returns the new node.
  NodeId rebuild(NodeId id, std::vector<ValueId> ins, int64_t ta, int64_t tb, const std::string& act, ValueId out, NodeId at,
                 const std::string& name_suffix, ValueId preact = kNoId) {
    Node old = g_.node(id);
    AttrMap a;
    a.set("trans_a", Attribute::of_int(ta));
    a.set("trans_b", Attribute::of_int(tb));
    a.set("activation", Attribute::of_string(act));
    g_.remove_node(id);
    std::vector<ValueId> outs{out};
    if (preact != kNoId) outs.push_back(preact);
    return place(g_.add_node("FusedMatMul", ins, outs, std::move(a), old.name + name_suffix, domain_), old, at);
  }

  // The one reader of v that is a Gelu in its tanh form (cuBLASLt's GELU) of v's type, or kNoId.
  NodeId tanh_gelu_reader(ValueId v, DType dt) const {
    NodeId found = kNoId;
    for (const Use& u : g_.value(v).uses) {
      const Node& n = g_.node(u.node);
      if (!is_op(n, "", "Gelu") || n.attrs.get_string("approximate", "none") != "tanh") continue;
      if (found != kNoId || n.outputs.empty() || n.outputs[0] == kNoId || g_.value(n.outputs[0]).dtype != dt) return kNoId;
      found = u.node;
    }
    return found;
  }

  // Device training: GeluGrad(tanh)(dY, X) whose dY is a product only it reads → one
  // oases.device.MatMulGeluGrad (cuBLASLt's DGELU epilogue), which also writes the bias gradient
  // where a ReduceSum of the GELU's gradient over every axis but the last, dims kept, gives it
  // (GradContext::unbroadcast's; DGELU_BGRAD). The fused node stands where the GeluGrad stood.
  void matmul_gelu_grad(NodeId id) {
    const Node& gg = g_.node(id);
    if (gg.attrs.get_string("approximate", "none") != "tanh" || gg.num_inputs() != 2 || gg.outputs.empty()) return;
    ValueId dy = gg.inputs[0], x = gg.inputs[1], dx = gg.outputs[0];
    if (dy == kNoId || x == kNoId || dx == kNoId || dy == x || !single_use(dy)) return;
    NodeId mm = g_.producer(dy);
    if (mm == kNoId || !is_matmul(g_.node(mm)) || g_.node(mm).num_inputs() != 2) return;
    const Node& m = g_.node(mm);
    int64_t ta, tb;
    std::string act;
    flags_of(m, &ta, &tb, &act);
    if (!act.empty() || m.inputs[0] == kNoId || m.inputs[1] == kNoId) return;
    const Value &dv = g_.value(dy), &xv = g_.value(x);
    const DType dt = dv.dtype;
    if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16) return;
    if (dv.shape != xv.shape || xv.dtype != dt || g_.value(dx).dtype != dt || g_.value(dx).shape != dv.shape || dv.shape.size() < 2) return;
    if (g_.value(m.inputs[0]).shape.size() < 2 || g_.value(m.inputs[1]).shape.size() < 2) return;
    // the bias gradient: a ReduceSum of dX over every axis but the last, dims kept
    std::vector<int64_t> leading(dv.shape.size() - 1);
    for (size_t i = 0; i < leading.size(); ++i) leading[i] = static_cast<int64_t>(i);
    NodeId sum = kNoId;
    for (const Use& u : g_.value(dx).uses) {
      const Node& r = g_.node(u.node);
      if (!is_op(r, "", "ReduceSum") || r.num_inputs() != 1 || r.outputs.empty() || r.outputs[0] == kNoId) continue;
      if (r.attrs.get_int("keepdims", 1) != 1 || r.attrs.get_ints("axes") != leading || g_.value(r.outputs[0]).dtype != dt) continue;
      sum = u.node;
      break;
    }
    std::vector<ValueId> ins{m.inputs[0], m.inputs[1], x}, outs{dx};
    if (sum != kNoId) outs.push_back(g_.node(sum).outputs[0]);
    AttrMap a;
    a.set("trans_a", Attribute::of_int(ta));
    a.set("trans_b", Attribute::of_int(tb));
    a.set("approximate", Attribute::of_string("tanh"));
    Node old = gg;
    std::string name = m.name + "+" + gg.name + (sum != kNoId ? "+" + g_.node(sum).name : "");
    g_.remove_node(mm);
    g_.remove_node(id);
    if (sum != kNoId) g_.remove_node(sum);
    place(g_.add_node("MatMulGeluGrad", ins, outs, std::move(a), name, kDeviceFusedDomain), old, id);
    stats_.gelu_grad++;
  }

  // New node `n` standing for `old`: its scope, phase, origin and chunk, at `at`'s place in the order.
  NodeId place(NodeId n, const Node& old, NodeId at) {
    Node& nn = g_.node(n);
    nn.scope = old.scope;
    nn.phase = old.phase;
    nn.origin = old.origin;
    nn.chunk = old.chunk;
    size_t p = pos_.at(at);
    order_[p] = n;
    pos_[n] = p;
    return n;
  }

  static void flags_of(const Node& n, int64_t* ta, int64_t* tb, std::string* act) {
    *ta = n.attrs.get_int("trans_a", 0);
    *tb = n.attrs.get_int("trans_b", 0);
    *act = n.attrs.get_string("activation", "");
  }

  // Operands produced by a last-two-axes Transpose are read untransposed with the flag toggled.
  NodeId fold_transposes(NodeId id) {
    const Node& n = g_.node(id);
    if (n.num_inputs() < 2 || n.inputs[0] == kNoId || n.inputs[1] == kNoId) return id;
    if (g_.value(n.inputs[0]).shape.size() < 2 || g_.value(n.inputs[1]).shape.size() < 2) return id;
    if (is_op(n, "", "MatMul") && n.num_inputs() != 2) return id;
    int64_t flag[2];
    std::string act;
    flags_of(n, &flag[0], &flag[1], &act);
    std::vector<ValueId> ins = n.inputs;
    std::vector<NodeId> folded;  // the Transpose nodes read through
    for (int s = 0; s < 2; ++s) {
      NodeId t = swap_transpose(ins[s]);
      if (t == kNoId) continue;
      folded.push_back(t);
      ins[s] = g_.node(t).inputs[0];
      flag[s] = 1 - flag[s];
    }
    if (folded.empty()) return id;
    ValueId out = n.outputs[0];
    NodeId m = rebuild(id, ins, flag[0], flag[1], act, out, id, "");
    for (NodeId t : folded) {
      if (!g_.alive(t)) continue;  // both operands read the same transpose
      ValueId tv = g_.node(t).outputs[0];
      if (g_.value(tv).uses.empty() && internal(tv)) {
        g_.remove_node(t);
        stats_.transposes_folded++;
      }
    }
    return m;
  }

  // MatMul → Add(bias) → activation, as far as the chain goes.
  void fuse_epilogue(NodeId id) {
    const Node& n = g_.node(id);
    if (is_op(n, "oases", "MatMulT") || n.num_inputs() > 2) return;  // backward products, or already has a bias
    ValueId y = n.outputs[0];
    DType dt = g_.value(y).dtype;
    // the CPU kernels' epilogues: fp32 and fp64; the device's (cuBLASLt and one bias kernel):
    // fp32 and the 16-bit types
    bool typed = device_ ? (dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16) : (dt == DType::kF32 || dt == DType::kF64);
    if (!typed || g_.value(y).shape.size() < 2) return;
    if (g_.value(n.inputs[0]).shape.size() < 2 || g_.value(n.inputs[1]).shape.size() < 2) return;
    int64_t ta, tb;
    std::string act;
    flags_of(n, &ta, &tb, &act);
    std::vector<ValueId> ins = n.inputs;
    NodeId last = id;
    ValueId out = y;
    // bias
    if (single_use(out)) {
      const Node& add = g_.node(g_.value(out).uses[0].node);
      if (is_op(add, "", "Add") && add.num_inputs() == 2 && g_.value(add.outputs[0]).shape == g_.value(out).shape) {
        ValueId bias = add.inputs[add.inputs[0] == out ? 1 : 0];
        const Value& bv = g_.value(bias);
        int64_t cols = g_.value(out).shape.back();
        bool last_axis = bv.dtype == dt && !bv.shape.empty() && bv.shape.back() == cols && bv.numel() == cols &&
                         bv.shape.size() <= g_.value(out).shape.size();
        if (last_axis && add.inputs[0] != add.inputs[1]) {
          ins.push_back(bias);
          last = add.id;
          out = add.outputs[0];
          g_.remove_node(add.id);
          stats_.bias++;
        }
      }
    }
    // activation
    ValueId preact = kNoId;
    if (act.empty() && single_use(out)) {
      const Node& a = g_.node(g_.value(out).uses[0].node);
      bool gelu = is_op(a, "", "Gelu"), relu = is_op(a, "", "Relu");
      if ((gelu || relu) && g_.value(a.outputs[0]).dtype == dt) {
        act = relu ? "relu" : (a.attrs.get_string("approximate", "none") == "tanh" ? "gelu_tanh" : "gelu");
        last = a.id;
        out = a.outputs[0];
        g_.remove_node(a.id);
        stats_.activation++;
      }
    } else if (act.empty() && gelu_ && !g_.value(out).uses.empty()) {
      // training: the GELU's input is read by its gradient too, so the product writes both (the
      // fused node stays where the input was made; the GELU's readers all follow it)
      NodeId gelu = tanh_gelu_reader(out, dt);
      if (gelu != kNoId) {
        act = "gelu_tanh";
        preact = out;
        out = g_.node(gelu).outputs[0];
        g_.remove_node(gelu);
        stats_.gelu_aux++;
      }
    }
    // residual: (A·B + bias) + R with R shaped as the product; not when R is what a collective
    // brings (the fused product would wait for the transfer instead of running beside it, e.g. a
    // collective matmul's ring step or a backward sum with an all-reduced term)
    if (act.empty() && single_use(out)) {
      const Node& add = g_.node(g_.value(out).uses[0].node);
      if (is_op(add, "", "Add") && add.num_inputs() == 2 && add.inputs[0] != add.inputs[1]) {
        ValueId r = add.inputs[add.inputs[0] == out ? 1 : 0];
        const Value& rv = g_.value(r);
        bool arrives = rv.producer != kNoId && is_collective(g_.node(rv.producer));
        if (!arrives && rv.dtype == dt && rv.shape == g_.value(out).shape && g_.value(add.outputs[0]).shape == rv.shape) {
          if (ins.size() == 2) ins.push_back(kNoId);  // no bias
          ins.push_back(r);
          last = add.id;
          out = add.outputs[0];
          g_.remove_node(add.id);
          stats_.residual++;
        }
      }
    }
    if (out == y) return;
    // at the place of the chain's last node: every operand exists there and every reader follows
    std::string suffix = std::string(ins.size() > 2 && ins[2] != kNoId ? "+bias" : "") + (act.empty() ? "" : "+" + act) +
                         (ins.size() > 3 ? "+residual" : "");
    rebuild(id, ins, ta, tb, act, out, last, suffix, preact);
  }
};

}  // namespace

std::vector<InplacePair> inplace_outputs(const Graph& g, const Node& n) {
  static const std::set<std::string> unary = {"Relu",    "Gelu",    "Tanh",       "Sigmoid",    "Exp", "Log",
                                              "Neg",     "Abs",     "Sqrt",       "Reciprocal", "Erf", "Identity",
                                              "Dropout", "Softmax", "LogSoftmax", "LeakyRelu",  "Elu"};
  static const std::set<std::string> binary = {"Add", "Sub", "Mul", "Div"};
  static const std::set<std::string> grads = {"GeluGrad", "UnaryGrad", "DropoutGrad", "SoftmaxGrad"};
  if (n.outputs.empty() || n.outputs[0] == kNoId) return {};
  if (n.domain == kOasesDomain && n.op_type == "AllReduce") {
    std::vector<InplacePair> pairs;
    for (size_t i = 0; i < n.outputs.size() && i < n.inputs.size(); ++i) {
      if (n.outputs[i] != kNoId && n.inputs[i] != kNoId) pairs.push_back(InplacePair{static_cast<int>(i), static_cast<int>(i)});
    }
    return pairs;
  }
  const Shape& out = g.value(n.outputs[0]).shape;
  auto same = [&](int s) { return n.has_input(s) && g.value(n.inputs[s]).shape == out; };
  auto first = [](int slot) { return slot < 0 ? std::vector<InplacePair>{} : std::vector<InplacePair>{InplacePair{0, slot}}; };
  if (n.domain.empty() && unary.count(n.op_type)) return first(same(0) ? 0 : -1);
  if (n.domain.empty() && binary.count(n.op_type)) return first(same(0) ? 0 : (same(1) ? 1 : -1));
  if (n.domain == "oases" && grads.count(n.op_type)) return first(same(0) ? 0 : -1);
  if (n.domain == kFusedDomain && n.op_type == "AddGatherGrad") return first(0);
  return {};
}

FusionStats fuse_for_cpu(Graph& g, std::vector<NodeId>& order, const std::set<ValueId>& keep, std::vector<size_t>* slots) {
  Fuser f(g, order, keep, false);
  return f.run(slots);
}

FusionStats fuse_for_device(Graph& g, std::vector<NodeId>& order, const std::set<ValueId>& keep, std::vector<size_t>* slots) {
  Fuser f(g, order, keep, true);
  return f.run(slots);
}

}  // namespace oases
