// CUDA glue for collectives and the rank-dependent local ops of partitioned graphs (the CPU glue is
// executor/cpu/glue_collectives.cpp). The group of a mesh axis must be an NCCL group; the collective is
// enqueued on the stream this instruction runs on (the communication stream for scheduled
// collectives, the compute stream for collectives run in line). Rearrangements around the
// collective are strided copies on the same stream.
#include "executor/cuda/cuda_context.h"
#include "executor/cuda/device_tiles.h"
#include "executor/cuda/nccl_communicator.h"
#include "executor/reshard_runner.h"
#include "graph/op_registry.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/loss.h"

namespace oases::cuda {

namespace {

// The mesh axis's group, its calls enqueued on this instruction's stream: NCCL, or ranks sharing
// the device (executor/device_local_comm.h).
StreamGroup& stream_group(CudaContext& c, const char* attr = "mesh_axis") {
  CommGroup& g = c.k.group(c.attrs().get_int(attr, 0));
  auto* n = dynamic_cast<StreamGroup*>(&g);
  if (!n)
    c.k.fail("runs on CUDA and needs an NCCL or device-local group for mesh axis {} ({} is neither)", c.attrs().get_int(attr, 0),
             g.describe());
  n->set_stream(c.stream);
  return *n;
}

struct DimLayout {
  int64_t outer = 1, inner = 1, dim = 1;
};

DimLayout layout_of(const Shape& s, int64_t dim) {
  DimLayout l;
  for (int64_t d = 0; d < dim; ++d) l.outer *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(dim) + 1; d < s.size(); ++d) l.inner *= s[d];
  l.dim = s[static_cast<size_t>(dim)];
  return l;
}

ReduceOp reduce_op(CudaContext& c) {
  std::string op = c.attrs().get_string("op", "sum");
  if (op == "sum") return ReduceOp::kSum;
  if (op == "max") return ReduceOp::kMax;
  c.k.fail("unknown reduction '{}'", op);
}

void copy_in_out(CudaContext& c, int i) {
  if (c.k.out[static_cast<size_t>(i)].data != c.k.in[static_cast<size_t>(i)].data) {
    copy_bytes(c.k.in[static_cast<size_t>(i)].data, c.k.out[static_cast<size_t>(i)].data, c.k.in[static_cast<size_t>(i)].nbytes(),
               c.stream);
  }
}

// Cross-mesh resharding (pipeline stages, stage meshes): this rank's part of the node's transfer
// plan (made when the program was built), through the rank's device communicator on the channel
// stream: NCCL point to point and channel groups, or ranks sharing a device.
void reshard(CudaContext& c) {
  planned_reshard(c.k);  // a node without its plan fails first
  if (!c.k.comm)
    c.k.fail("runs on CUDA and needs the rank's device communicator (NCCL or ranks sharing devices); oases-train gives one to runs of "
             "two ranks or more");
  // no link emulation on the GPU: transfers run at the devices' speed
  CudaTileMemory mem(c.stream);
  run_reshard_node(c.k, *c.k.comm, mem);
}

}  // namespace

void register_cuda_collectives(CudaKernelRegistry& r) {
  r.add(kOasesDomain, "Reshard", reshard);
  r.add("oases", "AllReduce", [](CudaContext& c) {
    StreamGroup& g = stream_group(c);
    ReduceOp op = reduce_op(c);
    // a bucket: one all-reduce per tensor, in place on the outputs, batched into one NCCL group call
    for (size_t i = 0; i < c.k.in.size(); ++i) copy_in_out(c, static_cast<int>(i));
    g.begin_batch();
    try {
      for (auto& v : c.k.out) g.all_reduce(v.data, v.numel(), v.dtype, op);
    } catch (...) {
      g.end_batch();
      throw;
    }
    g.end_batch();
  });
  r.add("oases", "ParallelIdentity", [](CudaContext& c) { copy_in_out(c, 0); });
  r.add("oases", "AllGather", [](CudaContext& c) {
    StreamGroup& g = stream_group(c);
    int64_t segs = c.attrs().get_int("segments", 1), dim = c.attrs().get_int("dim", 0);
    DimLayout l = layout_of(c.in(0).shape, dim);
    size_t es = dtype_size(c.in(0).dtype);
    if (l.outer == 1 && segs == 1) {
      g.all_gather(c.in(0).data, c.out(0).data, static_cast<int64_t>(c.in(0).nbytes()));
      return;
    }
    void* tmp = c.scratch(c.out(0).nbytes());
    g.all_gather(c.in(0).data, tmp, static_cast<int64_t>(c.in(0).nbytes()));
    copy(tmp, c.out(0).data, es, from_rank_major_plan(l.outer, segs, g.size(), l.dim / segs * l.inner), c.stream);
  });
  r.add("oases", "ReduceScatter", [](CudaContext& c) {
    StreamGroup& g = stream_group(c);
    int64_t segs = c.attrs().get_int("segments", 1), dim = c.attrs().get_int("dim", 0);
    DimLayout l = layout_of(c.in(0).shape, dim);
    size_t es = dtype_size(c.in(0).dtype);
    int64_t count = c.out(0).numel();
    if (l.outer == 1 && segs == 1) {
      g.reduce_scatter(c.in(0).data, c.out(0).data, count, c.in(0).dtype, ReduceOp::kSum);
      return;
    }
    void* tmp = c.scratch(c.in(0).nbytes());
    copy(c.in(0).data, tmp, es, to_rank_major_plan(l.outer, segs, g.size(), l.dim / segs / g.size() * l.inner), c.stream);
    g.reduce_scatter(tmp, c.out(0).data, count, c.in(0).dtype, ReduceOp::kSum);
  });
  r.add("oases", "RingShift", [](CudaContext& c) {
    // one ring step of a collective matmul (planner/collective_matmul.h): a paired send and receive
    StreamGroup& g = stream_group(c);
    g.shift(c.in(0).data, c.out(0).data, static_cast<int64_t>(c.in(0).nbytes()), static_cast<int>(c.attrs().get_int("shift", 1)));
  });
  r.add("oases", "RingAssemble", [](CudaContext& c) {
    // input s is part (rank - s) mod n of the output along dim
    CommGroup& g = c.k.group(c.attrs().get_int("mesh_axis", 0));
    int64_t n = g.size(), dim = c.attrs().get_int("dim", 0);
    std::vector<int64_t> in = dims(c.in(0).shape), out = dims(c.out(0).shape);
    for (int64_t s = 0; s < n; ++s) {
      int64_t part = ((g.rank() - s) % n + n) % n;
      NdPlan p = concat_part_plan(in, out, dim, part * in[static_cast<size_t>(dim)]);
      copy(c.in(static_cast<int>(s)).data, c.out(0).data, dtype_size(c.in(0).dtype), p, c.stream);
    }
  });
  r.add("oases", "ShardSlice", [](CudaContext& c) {
    CommGroup& g = c.k.group(c.attrs().get_int("mesh_axis", 0));
    int64_t segs = c.attrs().get_int("segments", 1), dim = c.attrs().get_int("dim", 0);
    DimLayout l = layout_of(c.in(0).shape, dim);
    int64_t n = g.size(), piece = l.dim / segs / n;
    int64_t part = ((g.rank() + c.attrs().get_int("offset", 0)) % n + n) % n;
    // [outer, segs, n, piece·inner] -> this rank's index on the n axis (offset: a ring step's part)
    NdPlan p = slice_plan({l.outer, segs, n, piece * l.inner}, {0, 0, part, 0}, {1, 1, 1, 1}, {l.outer, segs, 1, piece * l.inner});
    copy(c.in(0).data, c.out(0).data, dtype_size(c.in(0).dtype), p, c.stream);
  });
  r.add("oases", "AllToAll", [](CudaContext& c) {
    StreamGroup& g = stream_group(c);
    int64_t sd = c.attrs().get_int("split_dim", 0), cd = c.attrs().get_int("concat_dim", 0);
    int64_t n = g.size();
    size_t es = dtype_size(c.in(0).dtype);
    std::vector<int64_t> in = dims(c.in(0).shape), chunk = in;
    chunk[static_cast<size_t>(sd)] /= n;
    int64_t chunk_elems = 1;
    for (int64_t v : chunk) chunk_elems *= v;
    char* send = static_cast<char*>(c.scratch(c.in(0).nbytes()));
    char* recv = static_cast<char*>(c.scratch(c.in(0).nbytes()));
    std::vector<int64_t> starts(in.size(), 0), steps(in.size(), 1);
    for (int64_t j = 0; j < n; ++j) {
      starts[static_cast<size_t>(sd)] = j * chunk[static_cast<size_t>(sd)];
      copy(c.in(0).data, send + j * chunk_elems * static_cast<int64_t>(es), es, slice_plan(in, starts, steps, chunk), c.stream);
    }
    g.all_to_all(send, recv, chunk_elems * static_cast<int64_t>(es));
    int64_t off = 0;
    for (int64_t j = 0; j < n; ++j) {
      copy(recv + j * chunk_elems * static_cast<int64_t>(es), c.out(0).data, es, concat_part_plan(chunk, dims(c.out(0).shape), cd, off),
           c.stream);
      off += chunk[static_cast<size_t>(cd)];
    }
  });
  r.add("oases", "Broadcast", [](CudaContext& c) {
    StreamGroup& g = stream_group(c);
    copy_in_out(c, 0);
    g.broadcast(c.out(0).data, static_cast<int64_t>(c.out(0).nbytes()), static_cast<int>(c.attrs().get_int("root", 0)));
  });
  r.add("oases", "ShardedGather", [](CudaContext& c) {
    CommGroup& g = c.k.group(c.attrs().get_int("mesh_axis", 0));
    const Shape& ts = c.in(0).shape;
    int64_t rows = ts[0], row_elems = shape_numel(ts) / std::max<int64_t>(1, rows);
    gather_forward(dtype_size(c.in(0).dtype), c.in(0).data, c.in(1).data, c.in(1).dtype == DType::kI64, c.in(1).numel(), c.out(0).data, 1,
                   rows, row_elems, g.rank() * rows, rows * g.size(), true, c.fault, c.stream);
  });
  r.add("oases", "ShardedPick", [](CudaContext& c) {
    CommGroup& g = c.k.group(c.attrs().get_int("mesh_axis", 0));
    const Shape& s = c.in(0).shape;
    int64_t n = s[0], cls = s[1], d = shape_numel(s) / std::max<int64_t>(1, n * cls);
    sharded_pick(elem(c.in(0).dtype), c.in(0).data, c.in(1).data, c.in(1).dtype == DType::kI64, c.out(0).data, n, cls, d, g.rank() * cls,
                 c.stream);
  });
  r.add("oases", "ShardedOneHotSub", [](CudaContext& c) {
    CommGroup& g = c.k.group(c.attrs().get_int("mesh_axis", 0));
    const Shape& s = c.in(0).shape;
    int64_t n = s[0], cls = s[1], d = shape_numel(s) / std::max<int64_t>(1, n * cls);
    sharded_onehot_sub(elem(c.in(0).dtype), c.in(0).data, c.in(1).data, c.in(1).dtype == DType::kI64, c.out(0).data, n, cls, d,
                       g.rank() * cls, c.attrs().has("ignore_index"), c.attrs().get_int("ignore_index", -100), c.stream);
  });
}

}  // namespace oases::cuda
