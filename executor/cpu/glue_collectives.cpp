// CPU glue for collectives and for the rank-dependent local ops of partitioned graphs. The group of
// mesh axis `mesh_axis` comes from the KernelContext; data are rearranged so that the collective
// itself always works on contiguous per-rank blocks.
#include <cstring>
#include <memory>

#include "executor/communicator.h"
#include "executor/cpu/common.h"
#include "graph/tiles.h"
#include "kernels/cpu/layout.h"

namespace oases {

using namespace oases::cpu;
namespace k = oases::kernels;

CommGroup& KernelContext::group(int64_t a) const {
  if (!groups || a < 0 || static_cast<size_t>(a) >= groups->size() || !(*groups)[static_cast<size_t>(a)]) {
    fail("needs the communication group of mesh axis {}, and this program runs without one", a);
  }
  return *(*groups)[static_cast<size_t>(a)];
}

namespace {

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

// Scratch for rearranging a collective's data: per thread and slot, kept and reused, not zeroed (a
// fresh zero-filled vector per collective cost the memset and its page faults on every
// sequence-parallel gather and scatter: ~0.2 ms a MiB-sized one on the 2-vCPU VM, 2026-11-29).
// Buffers over kKeep are allocated for the one use (what a thread keeps stays under 2 x kKeep).
// Two live at once on a thread need two slots.
class Scratch {
 public:
  Scratch(size_t bytes, int slot) {
    static constexpr size_t kKeep = size_t{16} << 20;
    if (bytes > kKeep) {
      own_.reset(new char[bytes]);
      p_ = own_.get();
      return;
    }
    thread_local std::unique_ptr<char[]> kept[2];
    thread_local size_t kept_size[2] = {0, 0};
    if (kept_size[slot] < bytes) {
      kept[slot].reset(new char[bytes]);
      kept_size[slot] = bytes;
    }
    p_ = kept[slot].get();
  }
  char* data() const { return p_; }

 private:
  std::unique_ptr<char[]> own_;
  char* p_ = nullptr;
};

ReduceOp reduce_op(const KernelContext& c) {
  std::string op = c.attrs().get_string("op", "sum");
  if (op == "sum") return ReduceOp::kSum;
  if (op == "max") return ReduceOp::kMax;
  c.fail("unknown reduction '{}'", op);
}

}  // namespace

void register_cpu_collectives(CpuKernelRegistry& r) {
  r.add("oases", "AllReduce", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    if (c.in.size() == 1) {
      if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
      g.all_reduce(c.out[0].data, c.out[0].numel(), c.out[0].dtype, reduce_op(c));
      return;
    }
    // a bucket: one contiguous buffer, one collective
    size_t total = 0;
    for (const auto& v : c.in) total += v.nbytes();
    Scratch buf(total, 0);
    size_t off = 0;
    for (const auto& v : c.in) {
      std::memcpy(buf.data() + off, v.data, v.nbytes());
      off += v.nbytes();
    }
    g.all_reduce(buf.data(), static_cast<int64_t>(total / dtype_size(c.in[0].dtype)), c.in[0].dtype, reduce_op(c));
    off = 0;
    for (auto& v : c.out) {
      std::memcpy(v.data, buf.data() + off, v.nbytes());
      off += v.nbytes();
    }
  });
  r.add("oases", "ParallelIdentity", [](KernelContext& c) {
    if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
  });
  r.add("oases", "AllGather", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    int64_t segs = c.attrs().get_int("segments", 1), dim = c.attrs().get_int("dim", 0);
    DimLayout l = layout_of(c.in[0].shape, dim);
    size_t es = dtype_size(c.in[0].dtype);
    if (l.outer == 1 && segs == 1) {
      g.all_gather(c.in[0].data, c.out[0].data, static_cast<int64_t>(c.in[0].nbytes()));
      return;
    }
    Scratch tmp(c.out[0].nbytes(), 0);
    g.all_gather(c.in[0].data, tmp.data(), static_cast<int64_t>(c.in[0].nbytes()));
    k::from_rank_major(tmp.data(), c.out[0].data, l.outer, segs, g.size(), static_cast<size_t>(l.dim / segs * l.inner) * es);
  });
  r.add("oases", "ReduceScatter", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    int64_t segs = c.attrs().get_int("segments", 1), dim = c.attrs().get_int("dim", 0);
    DimLayout l = layout_of(c.in[0].shape, dim);
    size_t es = dtype_size(c.in[0].dtype);
    int64_t count = c.out[0].numel();
    if (l.outer == 1 && segs == 1) {
      g.reduce_scatter(c.in[0].data, c.out[0].data, count, c.in[0].dtype, ReduceOp::kSum);
      return;
    }
    Scratch tmp(c.in[0].nbytes(), 0);
    k::to_rank_major(c.in[0].data, tmp.data(), l.outer, segs, g.size(), static_cast<size_t>(l.dim / segs / g.size() * l.inner) * es);
    g.reduce_scatter(tmp.data(), c.out[0].data, count, c.in[0].dtype, ReduceOp::kSum);
  });
  r.add("oases", "FlatReduceScatter", [](KernelContext& c) {
    // every member's pieces side by side (member j: piece j of each input, zero-padded), one
    // reduce-scatter, this member's pieces out
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    const int64_t n = g.size();
    const size_t es = dtype_size(c.in[0].dtype);
    int64_t row = 0;  // elements of one member's pieces
    for (const auto& v : c.in) row += flat_piece(v.numel(), n);
    std::vector<char> send(static_cast<size_t>(row * n) * es, 0), mine(static_cast<size_t>(row) * es);
    for (int64_t j = 0; j < n; ++j) {
      int64_t at = j * row;
      for (const auto& v : c.in) {
        int64_t piece = flat_piece(v.numel(), n), len = flat_piece_length(v.numel(), n, j);
        if (len > 0) std::memcpy(send.data() + static_cast<size_t>(at) * es, static_cast<const char*>(v.data) + static_cast<size_t>(j * piece) * es,
                                 static_cast<size_t>(len) * es);
        at += piece;
      }
    }
    g.reduce_scatter(send.data(), mine.data(), row, c.in[0].dtype, ReduceOp::kSum);
    size_t off = 0;
    for (auto& v : c.out) {
      std::memcpy(v.data, mine.data() + off, v.nbytes());
      off += v.nbytes();
    }
  });
  r.add("oases", "ShardSlice", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    int64_t segs = c.attrs().get_int("segments", 1), dim = c.attrs().get_int("dim", 0);
    DimLayout l = layout_of(c.in[0].shape, dim);
    size_t es = dtype_size(c.in[0].dtype);
    int64_t n = g.size(), piece = l.dim / segs / n;
    int64_t part = ((g.rank() + c.attrs().get_int("offset", 0)) % n + n) % n;  // offset: a ring step's part
    size_t run = static_cast<size_t>(piece * l.inner) * es;
    const char* src = static_cast<const char*>(c.in[0].data);
    char* dst = static_cast<char*>(c.out[0].data);
    for (int64_t o = 0; o < l.outer; ++o) {
      for (int64_t s = 0; s < segs; ++s) {
        std::memcpy(dst + ((o * segs + s) * piece * l.inner) * static_cast<int64_t>(es),
                    src + ((o * l.dim + s * (l.dim / segs) + part * piece) * l.inner) * static_cast<int64_t>(es), run);
      }
    }
  });
  r.add("oases", "RingShift", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    g.shift(c.in[0].data, c.out[0].data, static_cast<int64_t>(c.in[0].nbytes()), static_cast<int>(c.attrs().get_int("shift", 1)));
  });
  r.add("oases", "RingAssemble", [](KernelContext& c) {
    // input s is part (rank - s) mod n of the output along dim: [outer, n, piece·inner]
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    int64_t n = g.size(), dim = c.attrs().get_int("dim", 0);
    DimLayout l = layout_of(c.in[0].shape, dim);
    size_t run = static_cast<size_t>(l.dim * l.inner) * dtype_size(c.in[0].dtype);
    char* dst = static_cast<char*>(c.out[0].data);
    for (int64_t s = 0; s < n; ++s) {
      int64_t part = ((g.rank() - s) % n + n) % n;
      const char* src = static_cast<const char*>(c.in[static_cast<size_t>(s)].data);
      for (int64_t o = 0; o < l.outer; ++o) std::memcpy(dst + (o * n + part) * static_cast<int64_t>(run), src + o * static_cast<int64_t>(run), run);
    }
  });
  r.add("oases", "AllToAll", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    int64_t sd = c.attrs().get_int("split_dim", 0), cd = c.attrs().get_int("concat_dim", 0);
    int64_t n = g.size();
    size_t es = dtype_size(c.in[0].dtype);
    const Shape& in = c.in[0].shape;
    // pack: chunk j = slice j of split_dim
    Shape chunk = in;
    chunk[static_cast<size_t>(sd)] /= n;
    int64_t chunk_elems = shape_numel(chunk);
    Scratch send(c.in[0].nbytes(), 0), recv(c.in[0].nbytes(), 1);
    std::vector<int64_t> starts(in.size(), 0), steps(in.size(), 1);
    for (int64_t j = 0; j < n; ++j) {
      starts[static_cast<size_t>(sd)] = j * chunk[static_cast<size_t>(sd)];
      k::strided_slice(c.in[0].data, in, starts, steps, send.data() + j * chunk_elems * static_cast<int64_t>(es), chunk, es);
    }
    g.all_to_all(send.data(), recv.data(), chunk_elems * static_cast<int64_t>(es));
    std::vector<const void*> parts;
    std::vector<std::vector<int64_t>> shapes;
    for (int64_t j = 0; j < n; ++j) {
      parts.push_back(recv.data() + j * chunk_elems * static_cast<int64_t>(es));
      shapes.push_back(chunk);
    }
    k::concat(parts, shapes, cd, c.out[0].data, es);
  });
  r.add("oases", "Broadcast", [](KernelContext& c) {
    if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
    c.group(c.attrs().get_int("mesh_axis", 0))
        .broadcast(c.out[0].data, static_cast<int64_t>(c.out[0].nbytes()), static_cast<int>(c.attrs().get_int("root", 0)));
  });
  r.add("oases", "ShardedGather", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    const Shape& ts = c.in[0].shape;
    int64_t rows = ts[0], start = g.rank() * rows, vocab = rows * g.size();
    int64_t row_elems = shape_numel(ts) / std::max<int64_t>(1, rows);
    size_t row_bytes = static_cast<size_t>(row_elems) * dtype_size(c.in[0].dtype);
    int64_t n = c.in[1].numel();
    const char* table = static_cast<const char*>(c.in[0].data);
    char* out = static_cast<char*>(c.out[0].data);
    for (int64_t i = 0; i < n; ++i) {
      int64_t id = load_as_int64(c.in[1].data, c.in[1].dtype, i);
      if (id < 0) id += vocab;
      if (id < 0 || id >= vocab) c.fail("index {} is outside [0, {})", id, vocab);
      if (id >= start && id < start + rows) {
        std::memcpy(out + i * static_cast<int64_t>(row_bytes), table + (id - start) * static_cast<int64_t>(row_bytes), row_bytes);
      } else {
        std::memset(out + i * static_cast<int64_t>(row_bytes), 0, row_bytes);
      }
    }
  });
  r.add("oases", "ShardedPick", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    const Shape& s = c.in[0].shape;
    int64_t n = s[0], cls = s[1], d = shape_numel(s) / std::max<int64_t>(1, n * cls);
    int64_t start = g.rank() * cls;
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      const T* z = c.in[0].as<T>();
      T* out = c.out[0].as<T>();
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < d; ++j) {
          int64_t l = load_as_int64(c.in[1].data, c.in[1].dtype, i * d + j) - start;
          out[i * d + j] = l >= 0 && l < cls ? z[(i * cls + l) * d + j] : T(0);
        }
      }
    });
  });
  r.add("oases", "ShardedOneHotSub", [](KernelContext& c) {
    CommGroup& g = c.group(c.attrs().get_int("mesh_axis", 0));
    const Shape& s = c.in[0].shape;
    int64_t n = s[0], cls = s[1], d = shape_numel(s) / std::max<int64_t>(1, n * cls);
    int64_t start = g.rank() * cls;
    bool has_ignore = c.attrs().has("ignore_index");
    int64_t ignore = c.attrs().get_int("ignore_index", -100);
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      const T* p = c.in[0].as<T>();
      T* out = c.out[0].as<T>();
      if (out != p) std::memcpy(out, p, c.in[0].nbytes());
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < d; ++j) {
          int64_t label = load_as_int64(c.in[1].data, c.in[1].dtype, i * d + j);
          if (has_ignore && label == ignore) {
            for (int64_t a = 0; a < cls; ++a) out[(i * cls + a) * d + j] = T(0);
            continue;
          }
          int64_t l = label - start;
          if (l >= 0 && l < cls) out[(i * cls + l) * d + j] -= T(1);
        }
      }
    });
  });
}

}  // namespace oases
