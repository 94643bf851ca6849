// Conv (ONNX Conv-1 and Conv-11, which read alike: the kernel from W, SAME_UPPER padding extra at
// the end, SAME_LOWER at the start) with group 1 over any number of spatial dims, and its backward
// ops:
//   Conv(x [N, C, D...], w [M, C, K...], b [M]?)              -> y [N, M, O...]
//   oases.ConvGradInput(dy [N, M, O...], w; input_spatial)     -> dx [N, C, D...]
//   oases.ConvGradWeight(dy [N, M, O...], x; kernel_shape)     -> dw [M, C, K...]
// Canonical form: `strides`, `dilations` (S each) and explicit `pads` (S begins, S ends) resolved
// from the defaults and auto_pad; `kernel_shape` written from W. The backward ops carry the same
// three, and only spatial sizes (never N, C or M), so they need no partition lowering.
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

#include <algorithm>

namespace oases {

using namespace ops;

namespace {

struct ConvAttrs {
  std::vector<int64_t> strides, pads, dilations;
};

// Output spatial size of one dim, or <= 0 when the window does not fit.
int64_t conv_out_dim(int64_t in, int64_t k, int64_t stride, int64_t pad_begin, int64_t pad_end, int64_t dil) {
  return (in + pad_begin + pad_end - dil * (k - 1) - 1) / stride + 1;
}

Status infer_conv(InferContext& c) {
  if (c.num_inputs() < 2) return c.fail("needs X and W");
  const Shape x = c.shape(0), w = c.shape(1);
  if (x.size() < 3) return c.fail("X {} must be [N, C, D1, ...] with at least one spatial dim", shape_str(x));
  if (w.size() != x.size()) return c.fail("W {} must have the rank of X {}", shape_str(w), shape_str(x));
  for (size_t d = 0; d < x.size(); ++d) {
    if (x[d] <= 0) return c.fail("X {} has an empty or unknown dim {} (zero-size convolutions are not supported)", shape_str(x), d);
    if (w[d] <= 0) return c.fail("W {} has an empty or unknown dim {}", shape_str(w), d);
  }
  if (c.dtype(1) != c.dtype(0)) return c.fail("X is {} and W {}", dtype_name(c.dtype(0)), dtype_name(c.dtype(1)));
  int64_t group = c.attrs().get_int("group", 1);
  if (group != 1) return c.fail("group {} is not supported (only group 1: no grouped or depthwise convolution)", group);
  if (w[1] != x[1]) return c.fail("W {} reads {} input channels, X {} has {}", shape_str(w), w[1], shape_str(x), x[1]);
  const size_t S = x.size() - 2;
  const int64_t m = w[0];
  if (c.has_input(2)) {
    if (c.shape(2) != Shape{m}) return c.fail("B {} must be [{}] (one bias per output channel)", shape_str(c.shape(2)), m);
    if (c.dtype(2) != c.dtype(0)) return c.fail("B is {}, X {}", dtype_name(c.dtype(2)), dtype_name(c.dtype(0)));
  }
  Shape kernel(w.begin() + 2, w.end());
  if (c.attrs().has("kernel_shape") && c.attrs().get_ints("kernel_shape") != std::vector<int64_t>(kernel.begin(), kernel.end())) {
    return c.fail("kernel_shape {} differs from W's spatial dims {}", shape_str(c.attrs().get_ints("kernel_shape")), shape_str(kernel));
  }
  auto list = [&](const char* name, int64_t def, size_t n) -> Expected<std::vector<int64_t>> {
    std::vector<int64_t> v = c.attrs().get_ints(name, std::vector<int64_t>(n, def));
    if (v.size() != n) return c.fail("{} has {} values for {} spatial dims", name, v.size(), S);
    for (int64_t e : v) {
      if (e < (def == 0 ? 0 : 1)) return c.fail("{} {} must be {}", name, shape_str(v), def == 0 ? ">= 0" : ">= 1");
    }
    return v;
  };
  ConvAttrs a;
  OASES_ASSIGN_OR_RETURN(a.strides, list("strides", 1, S));
  OASES_ASSIGN_OR_RETURN(a.dilations, list("dilations", 1, S));
  std::string auto_pad = c.attrs().get_string("auto_pad", "NOTSET");
  if (auto_pad == "NOTSET") {
    OASES_ASSIGN_OR_RETURN(a.pads, list("pads", 0, 2 * S));
  } else if (auto_pad == "VALID") {
    a.pads.assign(2 * S, 0);
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    // output = ceil(in / stride); the total padding that gives it, the odd one at the end (UPPER)
    a.pads.assign(2 * S, 0);
    for (size_t d = 0; d < S; ++d) {
      int64_t out = (x[d + 2] + a.strides[d] - 1) / a.strides[d];
      int64_t total = std::max<int64_t>(0, (out - 1) * a.strides[d] + a.dilations[d] * (kernel[d] - 1) + 1 - x[d + 2]);
      int64_t small = total / 2;
      a.pads[d] = auto_pad == "SAME_UPPER" ? small : total - small;
      a.pads[d + S] = total - a.pads[d];
    }
  } else {
    return c.fail("auto_pad '{}' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER", auto_pad);
  }
  Shape out{x[0], m};
  for (size_t d = 0; d < S; ++d) {
    int64_t o = conv_out_dim(x[d + 2], kernel[d], a.strides[d], a.pads[d], a.pads[d + S], a.dilations[d]);
    if (o <= 0) {
      return c.fail("spatial dim {} of X {} is too small for kernel {} (dilation {}, pads {}): no output", d, shape_str(x), kernel[d],
                    a.dilations[d], shape_str(a.pads));
    }
    out.push_back(o);
  }
  AttrMap& at = c.node().attrs;
  at.erase("auto_pad");
  at.erase("group");
  at.set_ints("kernel_shape", std::vector<int64_t>(kernel.begin(), kernel.end()));
  at.set_ints("strides", a.strides);
  at.set_ints("dilations", a.dilations);
  at.set_ints("pads", a.pads);
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

// The canonical attributes a Conv hands its backward ops.
AttrMap geometry_attrs(const AttrMap& conv) {
  AttrMap a;
  for (const char* k : {"strides", "pads", "dilations"}) a.set_ints(k, conv.get_ints(k));
  return a;
}

// Checks that the geometry attributes of a backward op fit dy's spatial dims.
Status check_grad_geometry(InferContext& c, const Shape& in_spatial, const Shape& kernel) {
  const Shape& dy = c.shape(0);
  size_t S = in_spatial.size();
  if (dy.size() != S + 2 || kernel.size() != S) return c.fail("dy {} does not fit {} spatial dims", shape_str(dy), S);
  auto st = c.attrs().get_ints("strides"), pads = c.attrs().get_ints("pads"), dil = c.attrs().get_ints("dilations");
  if (st.size() != S || dil.size() != S || pads.size() != 2 * S) return c.fail("strides, dilations and pads must be resolved (a Conv's)");
  for (size_t d = 0; d < S; ++d) {
    if (conv_out_dim(in_spatial[d], kernel[d], st[d], pads[d], pads[d + S], dil[d]) != dy[d + 2]) {
      return c.fail("dy {} does not match input spatial {} and kernel {}", shape_str(dy), shape_str(in_spatial), shape_str(kernel));
    }
  }
  return Status::ok();
}

OpCost conv_cost(const Graph& g, const Node& n, int with_kernel_of) {
  // 2·(output elements)·C·K for the forward and either backward product
  const Shape& w = g.value(n.inputs[static_cast<size_t>(with_kernel_of)]).shape;
  double ck = 1;
  for (size_t d = 1; d < w.size(); ++d) ck *= static_cast<double>(w[d]);
  return OpCost{2.0 * out_numel(g, n) * ck, io_bytes(g, n)};
}

// No partial sums in: a bias would be added once per rank, and the backward rules stay simple.
void require_whole_sums(ShardContext& c) {
  c.require_no_partial();
}

DimSpec plain(const DimSpec& d) {
  return d.segments == 1 ? d : DimSpec{};
}

uint32_t axis_bit(const DimSpec& d) {
  return d.axis >= 0 ? 1u << d.axis : 0u;
}

// Both Conv gradients: dy [N, M, ...] split (n, channels), the other operand (w or x) split `other`
// on its first dim; the result split `out` on its first dim, a partial sum over `summed`'s axis
// (plus dy's own partial sums, the gradient being linear in dy).
Status conv_grad_shard(ShardContext& c, DimSpec n, DimSpec channels, DimSpec other, DimSpec out, DimSpec summed) {
  size_t rank = c.in(0).rank();
  ShardingSpec dy = ShardingSpec::replicated(rank), second = ShardingSpec::replicated(rank);
  dy.dims[0] = n;
  dy.dims[1] = channels;
  second.dims[0] = other;
  dy.partial = c.in(0).partial & ~(axis_bit(n) | axis_bit(channels));
  c.require(0, dy);
  c.require(1, second);
  ShardingSpec result = ShardingSpec::replicated(rank);
  result.dims[0] = out;
  result.partial = dy.partial | axis_bit(summed);
  c.set_out(0, result);
  return Status::ok();
}

}  // namespace

void register_conv_ops(OpRegistry& r) {
  {
    OpSchema s;
    s.op_type = "Conv";
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.oldest_version = 1;  // Conv-1 and Conv-11 differ in documentation only
    s.infer = infer_conv;
    s.cost = [](const Graph& g, const Node& n) { return conv_cost(g, n, 1); };
    s.traits = kTraitComputeBound | kTraitWeightProduct;
    s.doc = "N-D convolution (group 1) by im2col and GEMM";
    // dx = ConvGradInput(dy, w), dw = ConvGradWeight(dy, x), db = Σ dy over N and space
    s.grad = [](GradContext& c) {
      ValueId x = c.input(0), w = c.input(1), dy = c.grad_out(0);
      Shape sx = c.shape(x), sw = c.shape(w);
      AttrMap geo = geometry_attrs(c.attrs());
      if (c.needs(0)) {
        AttrMap a = geo;
        a.set_ints("input_spatial", std::vector<int64_t>(sx.begin() + 2, sx.end()));
        c.add_grad(0, c.op("ConvGradInput", {dy, w}, a, kOasesDomain));
      }
      if (c.needs(1)) {
        AttrMap a = geo;
        a.set_ints("kernel_shape", std::vector<int64_t>(sw.begin() + 2, sw.end()));
        c.add_grad(1, c.op("ConvGradWeight", {dy, x}, a, kOasesDomain));
      }
      if (c.node().has_input(2) && c.needs(2)) {
        std::vector<int64_t> axes{0};
        for (size_t d = 2; d < sx.size(); ++d) axes.push_back(static_cast<int64_t>(d));
        c.add_grad(2, c.op("ReduceSum", {dy}, AttrMap{{"axes", Attribute::of_ints(axes)}, {"keepdims", Attribute::of_int(0)}}));
      }
      return Status::ok();
    };
    // Batch split (data parallel, micro-batch chunks) and output channels split (column-parallel:
    // w and b by rows, x whole); input channels and spatial dims whole.
    s.shard = [](ShardContext& c) {
      require_whole_sums(c);
      size_t rank = c.in(0).rank();
      DimSpec m = plain(c.in(1).dims[0]);
      DimSpec n = plain(c.in(0).dims[0]);
      if (n.axis >= 0 && n.axis == m.axis) n = DimSpec{};
      ShardingSpec x = ShardingSpec::replicated(rank), w = ShardingSpec::replicated(rank);
      x.dims[0] = n;
      w.dims[0] = m;
      c.require(0, x);
      c.require(1, w);
      if (c.has_input(2)) c.require(2, ShardingSpec::replicated(1).with_dim(0, m.axis));
      ShardingSpec y = ShardingSpec::replicated(rank);
      y.dims[0] = n;
      y.dims[1] = m;
      c.set_out(0, y);
      return Status::ok();
    };
    s.examples = [] {
      auto attrs = [](std::vector<int64_t> st, std::vector<int64_t> pads, std::vector<int64_t> dil) {
        return AttrMap{{"strides", Attribute::of_ints(st)}, {"pads", Attribute::of_ints(pads)}, {"dilations", Attribute::of_ints(dil)}};
      };
      return std::vector<OpExample>{
          example("patch embedding (stride = kernel)", {ex_float({2, 3, 4, 4}), ex_float({4, 3, 2, 2}), ex_float({4})},
                  attrs({2, 2}, {0, 0, 0, 0}, {1, 1})),
          example("padded, strided, dilated", {ex_float({2, 2, 5, 4}), ex_float({3, 2, 3, 2}), ex_float({3})},
                  attrs({2, 1}, {1, 0, 2, 1}, {1, 2})),
          example("1-D, no bias, SAME_UPPER", {ex_float({2, 2, 7}), ex_float({4, 2, 2})},
                  AttrMap{{"auto_pad", Attribute::of_string("SAME_UPPER")}, {"strides", Attribute::of_ints({2})}}),
          example("3-D", {ex_float({1, 2, 3, 3, 2}), ex_float({2, 2, 2, 2, 1}), ex_float({2})},
                  attrs({1, 1, 1}, {0, 1, 0, 0, 0, 1}, {1, 1, 1})),
      };
    };
    r.add(std::move(s));
  }
  auto grad_op = [](const char* op) {
    OpSchema s;
    s.domain = kOasesDomain;
    s.op_type = op;
    s.min_inputs = s.max_inputs = 2;
    s.foldable = false;
    s.differentiable = false;  // backward ops: no second derivatives
    s.traits = kTraitComputeBound;
    s.cost = [](const Graph& g, const Node& n) {
      // ConvGradInput: 2·|dy|·C·K (w [M, C, K...] at input 1)
      if (n.op_type == "ConvGradInput") {
        const Shape& dy = g.value(n.inputs[0]).shape;
        const Shape& w = g.value(n.inputs[1]).shape;
        double ck = 1;
        for (size_t d = 1; d < w.size(); ++d) ck *= static_cast<double>(w[d]);
        return OpCost{2.0 * static_cast<double>(shape_numel(dy)) * ck, io_bytes(g, n)};
      }
      // dw [M, C, K...]: every element sums N·P products, |dy| / M of them
      const Shape& dy = g.value(n.inputs[0]).shape;
      double np = static_cast<double>(shape_numel(dy)) / static_cast<double>(std::max<int64_t>(dy[1], 1));
      return OpCost{2.0 * out_numel(g, n) * np, io_bytes(g, n)};
    };
    return s;
  };
  {
    OpSchema s = grad_op("ConvGradInput");
    s.doc = "dx of Conv: col2im(wᵀ · dy)";
    s.infer = [](InferContext& c) {
      const Shape dy = c.shape(0), w = c.shape(1);
      Shape in_spatial = c.attrs().get_ints("input_spatial");
      if (w.size() != dy.size() || w[0] != dy[1])
        return c.fail("dy {} and W {} disagree on the output channels", shape_str(dy), shape_str(w));
      OASES_RETURN_IF_ERROR(check_grad_geometry(c, in_spatial, Shape(w.begin() + 2, w.end())));
      Shape out{dy[0], w[1]};
      out.insert(out.end(), in_spatial.begin(), in_spatial.end());
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    // contraction over M: split dy channels with w rows make dx a partial sum; batch follows dy
    s.shard = [](ShardContext& c) {
      c.require(1, c.in(1).without_partial());
      DimSpec k = plain(c.in(1).dims[0]);
      if (k.axis < 0) k = plain(c.in(0).dims[1]);
      DimSpec n = plain(c.in(0).dims[0]);
      if (n.axis >= 0 && n.axis == k.axis) n = DimSpec{};
      return conv_grad_shard(c, n, k, k, n, k);
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_op("ConvGradWeight");
    s.doc = "dw of Conv: Σ_n dy[n] · im2col(x[n])ᵀ";
    s.infer = [](InferContext& c) {
      const Shape dy = c.shape(0), x = c.shape(1);
      Shape kernel = c.attrs().get_ints("kernel_shape");
      if (x.size() != dy.size() || x[0] != dy[0]) return c.fail("dy {} and X {} disagree on the batch", shape_str(dy), shape_str(x));
      OASES_RETURN_IF_ERROR(check_grad_geometry(c, Shape(x.begin() + 2, x.end()), kernel));
      Shape out{dy[1], x[1]};
      out.insert(out.end(), kernel.begin(), kernel.end());
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    // output channels follow dy's; a split batch (dy and x alike) makes dw a partial sum
    s.shard = [](ShardContext& c) {
      c.require(1, c.in(1).without_partial());
      DimSpec m = plain(c.in(0).dims[1]);
      DimSpec n = plain(c.in(0).dims[0]);
      if (n.axis < 0) n = plain(c.in(1).dims[0]);
      if (n.axis >= 0 && n.axis == m.axis) n = DimSpec{};
      return conv_grad_shard(c, n, m, n, m, n);
    };
    r.add(std::move(s));
  }
}

}  // namespace oases
