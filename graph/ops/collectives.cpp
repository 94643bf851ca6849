// Collectives as IR ops (domain "oases"), placed in partitioned (per-rank) graphs where a consumer
// needs a layout its producer does not give. Attributes: mesh_axis (which group of the mesh),
// group_size, and for the ops that move a dimension: dim, segments (a segmented dimension holds
// `segments` equal parts, each split over the group, e.g. the q, k and v parts of a fused QKV).
//
//   AllReduce        sum over the group                         grad: Identity        (Megatron's g)
//   ParallelIdentity identity                                   grad: AllReduce       (Megatron's f)
//   AllGather        concatenate the group's shards along dim  grad: ReduceScatter
//   ReduceScatter    sum over the group, keep this rank's shard grad: AllGather
//   FlatReduceScatter (variadic) each input flattened, padded with zeros to a multiple of the group
//                    size and summed over the group; output i is this member's contiguous piece
//                    [ceil(numel_i / n)] of input i (the distributed optimizer's gradients, made
//                    after autodiff, planner/partition.h shard_gradient_reductions)
//   ShardSlice       keep this rank's shard of a replicated value (no communication) grad: AllGather
//                    (offset k: the shard of member (rank + k) mod n, for collective matmuls)
//   RingShift        one ring step: the value of member (rank - shift) mod n     (made after autodiff)
//   AllToAll         split along split_dim, concat along concat_dim grad: AllToAll (dims swapped)
//   Broadcast        the root's value on every member           grad: AllReduce
// AllReduce takes op = "sum" (default) or "max".
//
// Reshard(x?) -> y moves a value between two meshes placed anywhere in the world (cross-mesh
// resharding, planner/reshard.h): x is this rank's tile of the source layout (absent on a rank
// outside the source mesh), y its tile of the destination layout (shape [0] on a rank outside
// the destination mesh). Attributes: shape (global), src_mesh/dst_mesh (sizes), src_ranks/
// dst_ranks (world ranks), src_layout/dst_layout (R, S0, S01, ... per dimension; ":P<axes>" for a
// partial-sum source), world_rank (whose program this is), dtype (ONNX type, for a rank without
// x), strategy, channel (the communication channel, 1 by default, so a pending receive never
// queues in front of the mesh's own collectives). Every attribute but world_rank is the same on
// every rank. The transfer plan (senders, one global order) is made by the planner when it builds
// the program, for the plan's machine, and kept with it (planner/reshard_nodes.h); the kernel
// only runs it. Grad: the Reshard back (src and dst swapped).
//
// Local ops of partitioned graphs whose result depends on this rank's place in a group (the group
// rank is read at run time, so every rank runs the same graph):
//   ShardedGather(table, ids; mesh_axis)        rows of a vocabulary-split table; ids outside this
//                                                rank's rows give zeros (a partial sum over the axis)
//   ShardedPick(scores, labels; mesh_axis)      scores[i, label_i] when the label's class lives here,
//                                                else 0, for each row (vocabulary-parallel loss)
//   ShardedOneHotSub(p, labels; mesh_axis, ignore_index)  p minus the one-hot of the labels on this
//                                                rank's classes; ignored rows become 0
//   RingAssemble(x_0 … x_{n-1}; mesh_axis, dim)  concatenation along dim with x_s placed at part
//                                                (rank - s) mod n: the parts a ring of shifts
//                                                brought, put back in group order
//
// Collective matmuls (planner/collective_matmul.h) decompose an all-gather feeding matrix
// products, and a reduce-scatter of their sum, into n ring steps built from these ops.
//
// Layout(x; mesh, dims, grad_dims) is the identity that fixes a layout: on the mesh it names (its
// to_string), x is converted to the spec whose dimension d is split over mesh axis dims[d] (-1:
// whole); its gradient is a Layout to grad_dims (the layout x had). Planners put it where a value
// passes between ops split over different groups of ranks (tp 4 x dp 2 -> tp 2 x dp 4); on any other
// mesh (the chunk axis of micro-batching) it passes its input's spec through. The partitioner
// removes it once the conversions are in place, so no kernel ever sees it.
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"
#include "graph/tiles.h"

namespace oases {

using namespace ops;

namespace {

OpSchema collective(const std::string& op) {
  OpSchema s;
  s.domain = kOasesDomain;
  s.op_type = op;
  s.min_inputs = s.max_inputs = 1;
  s.foldable = false;
  s.traits = kTraitPostPartition;  // made in partitioned graphs: never sharded itself
  s.doc = "collective over mesh axis `mesh_axis`";
  return s;
}

// The attributes of a group of one member (the gradient check's single rank): each collective is
// then the identity, which checks the dual op's shapes and attributes; the dual pairing across
// ranks is what the tensor-parallel equivalence tests check.
AttrMap one_member(AttrMap a) {
  a.set_int("mesh_axis", 0);
  a.set_int("group_size", 1);
  return a;
}

int64_t group_size(const InferContext& c) {
  return std::max<int64_t>(1, c.attrs().get_int("group_size", 1));
}

Status check_dim(InferContext& c, int64_t* dim) {
  *dim = normalize_axis(c.attrs().get_int("dim", 0), c.rank(0));
  if (*dim < 0) return c.fail("dim {} out of range for {}", c.attrs().get_int("dim", 0), shape_str(c.shape(0)));
  return Status::ok();
}

AttrMap same_group(const AttrMap& a) {
  AttrMap o;
  for (const char* k : {"mesh_axis", "group_size", "dim", "segments"}) {
    if (const Attribute* v = a.find(k)) o.set(k, *v);
  }
  return o;
}

// bytes a ring algorithm sends per rank, for plans and the cost model
double ring_bytes(const Graph& g, const Node& n, double factor_of_full) {
  double full = static_cast<double>(g.value(n.inputs[0]).nbytes());
  double p = static_cast<double>(std::max<int64_t>(1, n.attrs.get_int("group_size", 1)));
  return factor_of_full * full * (p - 1) / p;
}

}  // namespace

void register_layout_op(OpRegistry& r);
void register_whole_op(OpRegistry& r);
void register_reshard_op(OpRegistry& r);

void register_collective_ops(OpRegistry& r) {
  {
    // variadic: a bucket of tensors reduced in one call (data-parallel gradients), output i = input i
    OpSchema s = collective("AllReduce");
    s.traits |= kTraitCollective | kTraitCombinesChunks;
    s.max_inputs = INT_MAX;
    s.max_outputs = INT_MAX;
    s.infer = [](InferContext& c) {
      if (c.num_outputs() != c.num_inputs()) return c.fail("{} inputs but {} outputs", c.num_inputs(), c.num_outputs());
      for (int i = 0; i < c.num_inputs(); ++i) {
        if (c.dtype(i) != c.dtype(0)) return c.fail("a bucket holds one dtype; input {} is {}", i, dtype_name(c.dtype(i)));
        c.set_output(i, c.dtype(i), c.shape(i));
      }
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      for (int i = 0; i < c.node().num_inputs(); ++i) {
        if (c.grad_out(i) != kNoId) c.add_grad(i, c.op("Identity", {c.grad_out(i)}));
      }
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) {
      double full = 0;
      for (ValueId v : n.inputs) full += static_cast<double>(g.value(v).nbytes());
      double p = static_cast<double>(std::max<int64_t>(1, n.attrs.get_int("group_size", 1)));
      return OpCost{0, 2.0 * full * (p - 1) / p};
    };
    s.examples = examples_of({example("one member", {ex_float({4, 6})}, one_member({}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("ParallelIdentity");
    s.traits |= kTraitCollective;
    s.view_of_input = 0;
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("AllReduce", {c.grad_out(0)}, same_group(c.attrs()), kOasesDomain));
      return Status::ok();
    };
    s.cost = [](const Graph&, const Node&) { return OpCost{}; };
    s.examples = examples_of({example("one member", {ex_float({4, 6})}, one_member({}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("AllGather");
    s.traits |= kTraitCollective | kTraitCombinesChunks;
    s.infer = [](InferContext& c) {
      int64_t d;
      OASES_RETURN_IF_ERROR(check_dim(c, &d));
      Shape out = c.shape(0);
      out[d] *= group_size(c);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("ReduceScatter", {c.grad_out(0)}, same_group(c.attrs()), kOasesDomain));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) {
      return OpCost{0, ring_bytes(g, n, 1.0) * static_cast<double>(n.attrs.get_int("group_size", 1))};
    };
    s.examples = examples_of({example("one member", {ex_float({4, 6})},
                                      one_member(AttrMap{{"dim", Attribute::of_int(1)}, {"segments", Attribute::of_int(1)}}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("ReduceScatter");
    s.traits |= kTraitCollective | kTraitCombinesChunks;
    s.infer = [](InferContext& c) {
      int64_t d;
      OASES_RETURN_IF_ERROR(check_dim(c, &d));
      int64_t n = group_size(c) * std::max<int64_t>(1, c.attrs().get_int("segments", 1));
      if (c.shape(0)[d] % n != 0) return c.fail("dim {} of {} does not divide into {} parts", d, shape_str(c.shape(0)), n);
      Shape out = c.shape(0);
      out[d] /= group_size(c);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("AllGather", {c.grad_out(0)}, same_group(c.attrs()), kOasesDomain));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, ring_bytes(g, n, 1.0)}; };
    s.examples = examples_of({example("one member", {ex_float({4, 6})},
                                      one_member(AttrMap{{"dim", Attribute::of_int(1)}, {"segments", Attribute::of_int(1)}}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("FlatReduceScatter");
    s.traits |= kTraitCollective;
    s.differentiable = false;  // made after autodiff from the gradients' all-reduces
    s.max_inputs = INT_MAX;
    s.max_outputs = INT_MAX;
    s.infer = [](InferContext& c) {
      if (c.num_outputs() != c.num_inputs()) return c.fail("{} inputs but {} outputs", c.num_inputs(), c.num_outputs());
      const int64_t n = group_size(c);
      for (int i = 0; i < c.num_inputs(); ++i) {
        if (c.dtype(i) != c.dtype(0)) return c.fail("a bucket holds one dtype; input {} is {}", i, dtype_name(c.dtype(i)));
        int64_t numel = 1;
        for (int64_t d : c.shape(i)) numel *= d;
        c.set_output(i, c.dtype(i), Shape{flat_piece(numel, n)});
      }
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) {
      double full = 0;
      for (ValueId v : n.inputs) full += static_cast<double>(g.value(v).nbytes());
      double p = static_cast<double>(std::max<int64_t>(1, n.attrs.get_int("group_size", 1)));
      return OpCost{0, full * (p - 1) / p};
    };
    s.examples = examples_of({example("one member", {ex_float({4, 6})}, one_member({}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("ShardSlice");
    s.traits |= kTraitCombinesChunks;  // local: no communication, so not a collective
    s.infer = [](InferContext& c) {
      int64_t d;
      OASES_RETURN_IF_ERROR(check_dim(c, &d));
      int64_t n = group_size(c) * std::max<int64_t>(1, c.attrs().get_int("segments", 1));
      if (c.shape(0)[d] % n != 0) return c.fail("dim {} of {} does not divide into {} parts", d, shape_str(c.shape(0)), n);
      Shape out = c.shape(0);
      out[d] /= group_size(c);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("AllGather", {c.grad_out(0)}, same_group(c.attrs()), kOasesDomain));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.examples = examples_of({example("one member", {ex_float({4, 6})},
                                      one_member(AttrMap{{"dim", Attribute::of_int(1)}, {"segments", Attribute::of_int(1)}}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("RingShift");
    s.traits |= kTraitCollective;
    s.differentiable = false;  // made by the collective-matmul pass, after autodiff
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, static_cast<double>(g.value(n.inputs[0]).nbytes())}; };
    s.examples = examples_of({example("one member", {ex_float({4, 6})}, one_member({}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("RingAssemble");
    s.differentiable = false;  // made by the collective-matmul pass, after autodiff
    s.max_inputs = INT_MAX;
    s.infer = [](InferContext& c) {
      int64_t d;
      OASES_RETURN_IF_ERROR(check_dim(c, &d));
      if (c.num_inputs() != group_size(c)) return c.fail("{} parts for a group of {}", c.num_inputs(), group_size(c));
      for (int i = 1; i < c.num_inputs(); ++i) {
        if (c.shape(i) != c.shape(0) || c.dtype(i) != c.dtype(0))
          return c.fail("part {} is {} {}, part 0 {} {}", i, dtype_name(c.dtype(i)), shape_str(c.shape(i)), dtype_name(c.dtype(0)),
                        shape_str(c.shape(0)));
      }
      Shape out = c.shape(0);
      out[d] *= group_size(c);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.examples = examples_of({example("one member", {ex_float({4, 6})}, one_member(AttrMap{{"dim", Attribute::of_int(0)}}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("AllToAll");
    s.traits |= kTraitCollective | kTraitCombinesChunks;
    s.infer = [](InferContext& c) {
      int64_t sd = normalize_axis(c.attrs().get_int("split_dim", 0), c.rank(0));
      int64_t cd = normalize_axis(c.attrs().get_int("concat_dim", 0), c.rank(0));
      if (sd < 0 || cd < 0) return c.fail("split_dim/concat_dim out of range for {}", shape_str(c.shape(0)));
      int64_t n = group_size(c);
      if (c.shape(0)[sd] % n != 0) return c.fail("dim {} of {} does not divide into {} parts", sd, shape_str(c.shape(0)), n);
      Shape out = c.shape(0);
      out[sd] /= n;
      out[cd] *= n;
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      AttrMap a = same_group(c.attrs());
      a.set_int("split_dim", c.attrs().get_int("concat_dim", 0));
      a.set_int("concat_dim", c.attrs().get_int("split_dim", 0));
      c.add_grad(0, c.op("AllToAll", {c.grad_out(0)}, a, kOasesDomain));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, ring_bytes(g, n, 1.0)}; };
    s.examples = examples_of({example("one member", {ex_float({4, 6})},
                                      one_member(AttrMap{{"split_dim", Attribute::of_int(1)}, {"concat_dim", Attribute::of_int(0)}}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("Broadcast");
    s.traits |= kTraitCollective | kTraitCombinesChunks;
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("AllReduce", {c.grad_out(0)}, same_group(c.attrs()), kOasesDomain));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, ring_bytes(g, n, 1.0)}; };
    s.examples = examples_of({example("one member", {ex_float({4, 6})}, one_member({}))});
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("ShardedGather");
    s.differentiable = false;  // made by the lowering of vocabulary-parallel ops, after autodiff
    s.min_inputs = s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.infer = [](InferContext& c) {
      Shape out;
      Shape d = c.shape(0);
      for (int64_t x : c.shape(1)) out.push_back(x);
      out.insert(out.end(), d.begin() + 1, d.end());
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, 2.0 * static_cast<double>(g.value(n.outputs[0]).nbytes())}; };
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("ShardedPick");
    s.differentiable = false;  // made by the lowering of vocabulary-parallel ops, after autodiff
    s.min_inputs = s.max_inputs = 2;
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.shape(1));
      return Status::ok();
    };
    // one score read per row, the labels read and the row values written
    s.cost = [](const Graph& g, const Node& n) {
      return OpCost{0, static_cast<double>(g.value(n.inputs[1]).nbytes()) + 2 * static_cast<double>(g.value(n.outputs[0]).nbytes())};
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = collective("ShardedOneHotSub");
    s.differentiable = false;  // made by the lowering of vocabulary-parallel ops, after autodiff
    s.min_inputs = s.max_inputs = 2;
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 1.0); };
    r.add(std::move(s));
  }
  register_layout_op(r);
  register_whole_op(r);
  register_reshard_op(r);
}

// An identity that only tells the partitioner something about its value (it removes the node).
static OpSchema marker_schema(const char* op_type, const char* doc) {
  OpSchema s;
  s.domain = kOasesDomain;
  s.op_type = op_type;
  s.min_inputs = s.max_inputs = 1;
  s.foldable = false;
  s.view_of_input = 0;
  s.doc = doc;
  s.infer = [](InferContext& c) {
    c.set_output(0, c.dtype(0), c.shape(0));
    return Status::ok();
  };
  s.cost = [](const Graph&, const Node&) { return OpCost{}; };
  return s;
}

void register_layout_op(OpRegistry& r) {
  OpSchema s = marker_schema("Layout", "identity fixing the layout of a value on a mesh (removed by the partitioner)");
  s.traits = kTraitNoKernel;  // the partitioner removes every Layout before a program is built
  s.grad = [](GradContext& c) {
    AttrMap a;
    a.set_string("mesh", c.attrs().get_string("mesh", ""));
    a.set_ints("dims", c.attrs().get_ints("grad_dims"));
    a.set_ints("grad_dims", c.attrs().get_ints("dims"));
    c.add_grad(0, c.op("Layout", {c.grad_out(0)}, a, kOasesDomain));
    return Status::ok();
  };
  s.shard = [](ShardContext& c) {
    const AttrMap& a = c.node().attrs;
    if (a.get_string("mesh", "") != c.mesh().to_string()) return shard_same_as_input(c, PartialPolicy::kAdditive);
    std::vector<int64_t> dims = a.get_ints("dims");
    if (dims.size() != c.in(0).rank()) return c.fail("layout of rank {} for a value of rank {}", dims.size(), c.in(0).rank());
    ShardingSpec want = ShardingSpec::replicated(dims.size());
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] >= c.mesh().num_axes()) return c.fail("mesh axis {} of a {}-axis mesh", dims[d], c.mesh().num_axes());
      want.dims[d] = DimSpec{static_cast<int>(dims[d]), 1};
    }
    c.require(0, want);
    c.set_out(0, want);
    return Status::ok();
  };
  s.examples = examples_of({example(
      "whole", {ex_float({4, 6})},
      AttrMap{
          {"mesh", Attribute::of_string("tp=1")}, {"dims", Attribute::of_ints({-1, -1})}, {"grad_dims", Attribute::of_ints({-1, -1})}})});
  r.add(std::move(s));
}

// A value leaving a pipeline stage: partial sums (a tied weight's gradient contribution, partial
// over dp) are reduced on the stage that made them, so a transfer always carries whole values.
void register_whole_op(OpRegistry& r) {
  OpSchema s =
      marker_schema("Whole",
                    "identity whose value has no pending partial sums on any mesh (removed by the partitioner, its output taking the "
                    "reduced value's place)");
  s.differentiable = false;   // marks a training graph after autodiff
  s.traits = kTraitNoKernel;  // the partitioner removes every Whole before a program is built
  s.shard = [](ShardContext& c) {
    ShardingSpec want = c.in(0).without_partial();
    c.require(0, want);
    c.set_out(0, want);
    return Status::ok();
  };
  s.examples = examples_of({example("whole", {ex_float({4, 6})}, AttrMap{})});
  r.add(std::move(s));
}

void register_reshard_op(OpRegistry& r) {
  OpSchema s;
  s.domain = kOasesDomain;
  s.op_type = "Reshard";
  s.min_inputs = 0;
  s.max_inputs = 1;
  s.foldable = false;
  s.traits = kTraitCollective | kTraitPostPartition;
  s.doc = "cross-mesh resharding of a value between two placed meshes (planner/reshard.h)";
  s.infer = [](InferContext& c) {
    const AttrMap& a = c.attrs();
    Shape shape = a.get_ints("shape");
    int64_t me = a.get_int("world_rank", -1);
    auto src = placed_layout(a.get_ints("src_mesh"), a.get_ints("src_ranks"), a.get_string("src_layout", ""), shape.size());
    if (!src) return c.fail("source: {}", src.status().message());
    auto dst = placed_layout(a.get_ints("dst_mesh"), a.get_ints("dst_ranks"), a.get_string("dst_layout", ""), shape.size());
    if (!dst) return c.fail("destination: {}", dst.status().message());
    int64_t sr = src->placed.mesh_rank(me), dr = dst->placed.mesh_rank(me);
    if (sr < 0 && dr < 0) return c.fail("world rank {} is in neither mesh", me);
    // the local tile of a side as one box (segmented tiles are not supported in programs)
    auto tile_shape = [&](const PlacedLayout& pl, int64_t r, const char* side) -> Expected<Shape> {
      auto t = tile_boxes(pl.spec, shape, pl.placed.mesh);
      if (!t) return t.status();
      const auto& boxes = t->boxes[static_cast<size_t>(r)];
      if (boxes.size() > 1)
        return error("the {} tile of rank {} is {} boxes (segments): not supported in programs", side, me, boxes.size());
      if (boxes.empty()) return Shape(shape.size(), 0);
      return boxes[0].extent;
    };
    DType dt = dtype_from_onnx(static_cast<int>(a.get_int("dtype", 1)));
    if (sr >= 0) {
      if (c.num_inputs() != 1) return c.fail("rank {} is in the source mesh: its tile is the input", me);
      auto want = tile_shape(*src, sr, "source");
      if (!want) return c.fail("{}", want.status().message());
      if (c.shape(0) != *want) return c.fail("input {} is not rank {}'s source tile {}", shape_str(c.shape(0)), me, shape_str(*want));
      dt = c.dtype(0);
    } else if (c.num_inputs() != 0) {
      return c.fail("rank {} is not in the source mesh: no input", me);
    }
    if (dr < 0) {
      c.set_output(0, dt, Shape{0});
      return Status::ok();
    }
    auto out = tile_shape(*dst, dr, "destination");
    if (!out) return c.fail("{}", out.status().message());
    c.set_output(0, dt, *out);
    return Status::ok();
  };
  s.grad = [](GradContext& c) {
    AttrMap a = c.attrs();
    for (const char* k : {"_mesh", "_ranks", "_layout"}) {
      std::string sk = std::string("src") + k, dk = std::string("dst") + k;
      const Attribute* sv = c.attrs().find(sk);
      const Attribute* dv = c.attrs().find(dk);
      if (sv) a.set(dk, *sv);
      if (dv) a.set(sk, *dv);
    }
    if (c.node().num_inputs() > 0) a.set_int("dtype", dtype_to_onnx(c.graph().value(c.input(0)).dtype));
    std::vector<ValueId> ins;
    if (c.grad_out(0) != kNoId && c.graph().value(c.grad_out(0)).numel() > 0) ins.push_back(c.grad_out(0));
    ValueId back = c.op("Reshard", ins, a, kOasesDomain);
    if (c.node().num_inputs() > 0) c.add_grad(0, back);
    return Status::ok();
  };
  s.cost = [](const Graph& g, const Node& n) {
    double bytes = 0;
    for (ValueId v : n.outputs) bytes += static_cast<double>(g.value(v).nbytes());
    return OpCost{0, bytes};
  };
  // one rank holding both meshes: the resharding is a local copy
  s.examples = examples_of({example("one rank", {ex_float({4, 6})},
                                    AttrMap{{"shape", Attribute::of_ints({4, 6})},
                                            {"src_mesh", Attribute::of_ints({1})},
                                            {"src_ranks", Attribute::of_ints({0})},
                                            {"src_layout", Attribute::of_string("S0R")},
                                            {"dst_mesh", Attribute::of_ints({1})},
                                            {"dst_ranks", Attribute::of_ints({0})},
                                            {"dst_layout", Attribute::of_string("RS0")},
                                            {"world_rank", Attribute::of_int(0)}})});
  r.add(std::move(s));
}

bool is_collective(const Node& n) {
  return op_has_trait(n, kTraitCollective);
}

}  // namespace oases
