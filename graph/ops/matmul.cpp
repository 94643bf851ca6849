// MatMul (numpy semantics: 1-D operands promoted, batch dimensions broadcast), Gemm
// (Y = alpha·op(A)·op(B) + beta·C, C broadcast to [M, N]) and Einsum.
// Einsum's canonical equation is explicit and spelt with letters only: spaces dropped, the
// implicit output written out (the ellipsis' dims, then the labels used once, in character
// order), each ellipsis replaced by letters the equation does not use, aligned from the right:
//   "...ii ->...i" on [3, 5, 5]  ->  "Aii->Ai";   "i,i" -> "i,i->".
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace oases {

using namespace ops;

namespace {

Status infer_matmul(InferContext& c) {
  Shape a = c.shape(0), b = c.shape(1);
  if (c.dtype(0) != c.dtype(1)) {
    return c.fail("operands have different types ({} and {})", dtype_name(c.dtype(0)), dtype_name(c.dtype(1)));
  }
  if (a.empty() || b.empty()) return c.fail("operands must have rank >= 1, got {} and {}", shape_str(a), shape_str(b));
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  int64_t k_a = a.back(), k_b = b[b.size() - 2];
  if (k_a != k_b) {
    return c.fail("inner dimensions differ: {} x {} ({} vs {})", shape_str(c.shape(0)), shape_str(c.shape(1)), k_a, k_b);
  }
  Shape batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  auto batch = broadcast_shapes(batch_a, batch_b);
  if (!batch) return c.fail("batch dimensions: {}", batch.status().message());
  Shape out = *batch;
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b.back());
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

Status infer_einsum(InferContext& c) {
  std::string eq;
  for (char ch : c.attrs().get_string("equation", "")) {
    if (!std::isspace(static_cast<unsigned char>(ch))) eq += ch;
  }
  if (eq.empty()) return c.fail("the equation is missing");
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t pos = 0;;) {
    size_t comma = lhs.find(',', pos);
    terms.push_back(lhs.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (static_cast<int>(terms.size()) != c.num_inputs()) {
    return c.fail("equation '{}' has {} operands, the node {} inputs", eq, terms.size(), c.num_inputs());
  }
  std::string used;
  auto check_term = [&](const std::string& t) -> Status {
    size_t ell = t.find("...");
    if (ell != std::string::npos && t.find("...", ell + 3) != std::string::npos) {
      return c.fail("equation '{}' has two ellipses in one term", eq);
    }
    for (size_t i = 0; i < t.size(); ++i) {
      if (ell != std::string::npos && i >= ell && i < ell + 3) continue;
      if (!std::isalpha(static_cast<unsigned char>(t[i]))) return c.fail("equation '{}': '{}' is not a letter", eq, t[i]);
      if (used.find(t[i]) == std::string::npos) used += t[i];
    }
    return Status::ok();
  };
  for (const auto& t : terms) OASES_RETURN_IF_ERROR(check_term(t));
  std::string rhs = arrow == std::string::npos ? std::string() : eq.substr(arrow + 2);
  if (arrow != std::string::npos) OASES_RETURN_IF_ERROR(check_term(rhs));
  // dims under each ellipsis, and letters the equation leaves free to stand for them
  int64_t ell_rank = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    bool has_ell = terms[k].find("...") != std::string::npos;
    int64_t letters = static_cast<int64_t>(terms[k].size()) - (has_ell ? 3 : 0);
    if (has_ell ? c.rank(static_cast<int>(k)) < letters : c.rank(static_cast<int>(k)) != letters) {
      return c.fail("term '{}' of equation '{}' does not fit input {} {}", terms[k], eq, k, shape_str(c.shape(static_cast<int>(k))));
    }
    if (has_ell) ell_rank = std::max(ell_rank, c.rank(static_cast<int>(k)) - letters);
  }
  std::string free;
  for (char ch = 'A'; ch <= 'z'; ++ch) {
    if (std::isalpha(static_cast<unsigned char>(ch)) && used.find(ch) == std::string::npos) free += ch;
  }
  if (ell_rank > static_cast<int64_t>(free.size())) return c.fail("equation '{}' needs more labels than there are letters", eq);
  std::string ell_labels = free.substr(0, static_cast<size_t>(ell_rank));
  for (size_t k = 0; k < terms.size(); ++k) {
    size_t ell = terms[k].find("...");
    if (ell == std::string::npos) continue;
    int64_t n = c.rank(static_cast<int>(k)) - (static_cast<int64_t>(terms[k].size()) - 3);
    terms[k].replace(ell, 3, ell_labels.substr(static_cast<size_t>(ell_rank - n)));
  }
  if (arrow == std::string::npos) {
    std::string once;
    for (char ch : used) {
      int count = 0;
      for (const auto& t : terms) count += static_cast<int>(std::count(t.begin(), t.end(), ch));
      if (count == 1) once += ch;
    }
    std::sort(once.begin(), once.end());
    rhs = ell_labels + once;
  } else if (size_t ell = rhs.find("..."); ell != std::string::npos) {
    rhs.replace(ell, 3, ell_labels);
  }
  // label sizes: equal wherever a label appears, or 1 (broadcast)
  std::map<char, int64_t> size;
  for (size_t k = 0; k < terms.size(); ++k) {
    for (size_t p = 0; p < terms[k].size(); ++p) {
      int64_t d = c.shape(static_cast<int>(k))[p];
      auto [it, fresh] = size.emplace(terms[k][p], d);
      if (fresh || it->second == d || d == 1) continue;
      if (it->second != 1) {
        return c.fail("label '{}' of equation '{}' has sizes {} and {}", terms[k][p], eq, it->second, d);
      }
      it->second = d;
    }
    if (k > 0 && c.dtype(static_cast<int>(k)) != c.dtype(0)) {
      return c.fail("operands have different types ({} and {})", dtype_name(c.dtype(0)), dtype_name(c.dtype(static_cast<int>(k))));
    }
  }
  Shape out;
  for (size_t i = 0; i < rhs.size(); ++i) {
    if (!size.count(rhs[i])) return c.fail("output label '{}' of equation '{}' appears in no operand", rhs[i], eq);
    if (rhs.find(rhs[i]) != i) return c.fail("output label '{}' of equation '{}' repeats", rhs[i], eq);
    out.push_back(size[rhs[i]]);
  }
  c.node().attrs.set_string("equation", fmt::format("{}->{}", fmt::join(terms, ","), rhs));
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

OpCost matmul_cost(const Graph& g, const Node& n) {
  const Shape& a = g.value(n.inputs[0]).shape;
  int64_t k = a.empty() ? 1 : a.back();
  return OpCost{2.0 * out_numel(g, n) * static_cast<double>(k), io_bytes(g, n)};
}

}  // namespace

namespace {

// A parameter, or a parameter seen through a Transpose (the weights of linear layers).
bool is_weight_like(const ShardContext& c, int i) {
  ValueId v = c.node().inputs[static_cast<size_t>(i)];
  const Value& val = c.graph().value(v);
  if (val.is_initializer) return true;
  if (val.producer == kNoId) return false;
  const Node& p = c.graph().node(val.producer);
  return p.op_type == "Transpose" && p.has_input(0) && c.graph().value(p.inputs[0]).is_initializer;
}

}  // namespace

Status shard_matmul(ShardContext& c, bool ta, bool tb) {
  Shape sa = c.in_shape(0), sb = c.in_shape(1);
  if (sa.size() < 2 || sb.size() < 2) {
    // vector operands: replicated
    for (int i = 0; i < 2; ++i) c.require(i, ShardingSpec::replicated(c.in(i).rank()));
    c.set_out(0, ShardingSpec::replicated(c.out_shape(0).size()));
    return Status::ok();
  }
  size_t ra = sa.size(), rb = sb.size();
  size_t am = ta ? ra - 1 : ra - 2, ak = ta ? ra - 2 : ra - 1;
  size_t bk = tb ? rb - 1 : rb - 2, bn = tb ? rb - 2 : rb - 1;
  Shape so = c.out_shape(0);
  size_t ro = so.size(), nb = ro - 2;
  ShardingSpec out = ShardingSpec::replicated(ro);
  uint32_t used = 0;
  auto take = [&](int axis) {
    if (axis < 0) return true;
    if ((used >> axis) & 1u) return false;
    used |= 1u << axis;
    return true;
  };
  // contraction dim first: it decides the partial axis
  DimSpec ka = c.in(0).dims[ak], kb = c.in(1).dims[bk];
  DimSpec k = ka.axis >= 0 ? ka : kb;
  if (c.in(0).dims[ak] != k) c.require(0, c.in(0).with_dim(ak, k.axis, k.segments));
  if (c.in(1).dims[bk] != k) c.require(1, c.in(1).with_dim(bk, k.axis, k.segments));
  take(k.axis);
  // M and N: when both are split over one axis, a weight keeps its split (the activation is
  // gathered: sequence parallelism feeding a column-parallel projection)
  DimSpec m = c.in(0).dims[am], n = c.in(1).dims[bn];
  if (m.axis >= 0 && m.axis == n.axis && is_weight_like(c, 1) && !is_weight_like(c, 0)) {
    c.require(0, c.in(0).with_dim(am, -1));
    m = DimSpec{};
  }
  if (!take(m.axis)) {
    c.require(0, c.in(0).with_dim(am, -1));
    m = DimSpec{};
  }
  if (!take(n.axis)) {
    c.require(1, c.in(1).with_dim(bn, -1));
    n = DimSpec{};
  }
  out.dims[ro - 2] = m;
  out.dims[ro - 1] = n;
  // batch dims
  for (size_t d = 0; d < nb; ++d) {
    DimSpec chosen;
    for (int i = 0; i < 2 && chosen.axis < 0; ++i) {
      Shape s = i == 0 ? sa : sb;
      size_t r = s.size() - 2;
      if (r + d < nb) continue;
      size_t j = d - (nb - r);
      if (s[j] == so[d] && c.in(i).dims[j].axis >= 0 && !((used >> c.in(i).dims[j].axis) & 1u)) chosen = c.in(i).dims[j];
    }
    take(chosen.axis);
    out.dims[d] = chosen;
    for (int i = 0; i < 2; ++i) {
      Shape s = i == 0 ? sa : sb;
      size_t r = s.size() - 2;
      if (r + d < nb) continue;
      size_t j = d - (nb - r);
      DimSpec want = s[j] == so[d] ? chosen : DimSpec{};
      if (c.in(i).dims[j] != want) c.require(i, c.in(i).with_dim(j, want.axis, want.segments));
    }
  }
  // partial sums: the contraction's axis, and one partial operand (the product is linear in each)
  if (k.axis >= 0) out.partial |= 1u << k.axis;
  for (int a = 0; a < c.mesh().num_axes(); ++a) {
    bool pa = c.in(0).is_partial(a), pb = c.in(1).is_partial(a);
    if (!pa && !pb) continue;
    if ((used >> a) & 1u) {
      if (pa) c.require(0, c.in(0).with_partial(a, false));
      if (pb) c.require(1, c.in(1).with_partial(a, false));
      continue;
    }
    out.partial |= 1u << a;
    if (pa && pb) c.require(1, c.in(1).with_partial(a, false));
  }
  c.set_out(0, out);
  return Status::ok();
}

namespace {

// MatMul: dA = dY·Bᵀ, dB = Aᵀ·dY through oases.MatMulT (no transposed copies). A weight (rank-2 B
// under batched A) gets its gradient as one [batch·M, K]ᵀ x [batch·M, N] product.
Status matmul_grad(GradContext& c) {
  ValueId a = c.input(0), b = c.input(1), dy = c.grad_out(0);
  Shape sa = c.shape(a), sb = c.shape(b);
  if (sa.size() == 1 || sb.size() == 1) {
    // promote vectors to matrices, then reshape the gradients back
    ValueId a2 = sa.size() == 1 ? c.op("Reshape", {a}, AttrMap{{"shape", Attribute::of_ints({1, sa[0]})}}) : a;
    ValueId b2 = sb.size() == 1 ? c.op("Reshape", {b}, AttrMap{{"shape", Attribute::of_ints({sb[0], 1})}}) : b;
    Shape sa2 = c.shape(a2), sb2 = c.shape(b2);
    auto bs = broadcast_shapes(Shape(sa2.begin(), sa2.end() - 2), Shape(sb2.begin(), sb2.end() - 2));
    Shape full = *bs;
    full.push_back(sa2[sa2.size() - 2]);
    full.push_back(sb2.back());
    ValueId dy2 = c.op("Reshape", {dy}, AttrMap{{"shape", Attribute::of_ints(full)}});
    if (c.needs(0)) {
      ValueId da = c.unbroadcast(c.op("MatMulT", {dy2, b2}, AttrMap{{"trans_b", Attribute::of_int(1)}}, kOasesDomain), c.shape(a2));
      c.add_grad(0, c.op("Reshape", {da}, AttrMap{{"shape", Attribute::of_ints(sa)}}));
    }
    if (c.needs(1)) {
      ValueId db = c.unbroadcast(c.op("MatMulT", {a2, dy2}, AttrMap{{"trans_a", Attribute::of_int(1)}}, kOasesDomain), c.shape(b2));
      c.add_grad(1, c.op("Reshape", {db}, AttrMap{{"shape", Attribute::of_ints(sb)}}));
    }
    return Status::ok();
  }
  if (c.needs(0)) {
    c.add_grad(0, c.unbroadcast(c.op("MatMulT", {dy, b}, AttrMap{{"trans_b", Attribute::of_int(1)}}, kOasesDomain), sa));
  }
  if (c.needs(1)) {
    if (sb.size() == 2 && sa.size() > 2) {
      int64_t rows = shape_numel(sa) / sa.back();
      ValueId a2 = c.op("Reshape", {a}, AttrMap{{"shape", Attribute::of_ints({rows, sa.back()})}});
      ValueId d2 = c.op("Reshape", {dy}, AttrMap{{"shape", Attribute::of_ints({rows, sb.back()})}});
      c.add_grad(1, c.op("MatMulT", {a2, d2}, AttrMap{{"trans_a", Attribute::of_int(1)}}, kOasesDomain));
    } else {
      c.add_grad(1, c.unbroadcast(c.op("MatMulT", {a, dy}, AttrMap{{"trans_a", Attribute::of_int(1)}}, kOasesDomain), sb));
    }
  }
  return Status::ok();
}

// Gemm: Y = α·op(A)·op(B) + β·C
Status gemm_grad(GradContext& c) {
  bool ta = c.attrs().get_int("transA", 0) != 0, tb = c.attrs().get_int("transB", 0) != 0;
  float alpha = c.attrs().get_float("alpha", 1.f), beta = c.attrs().get_float("beta", 1.f);
  ValueId a = c.input(0), b = c.input(1), dy = c.grad_out(0);
  ValueId sdy = alpha == 1.f ? dy : c.op("Mul", {dy, c.scalar(alpha, c.dtype(dy))});
  auto mm = [&](ValueId x, ValueId y, bool tx, bool ty) {
    return c.op("MatMulT", {x, y}, AttrMap{{"trans_a", Attribute::of_int(tx)}, {"trans_b", Attribute::of_int(ty)}}, kOasesDomain);
  };
  // op(A) = A or Aᵀ: d op(A) = dY·op(B)ᵀ
  if (c.needs(0)) c.add_grad(0, ta ? mm(b, sdy, tb, true) : mm(sdy, b, false, !tb));
  if (c.needs(1)) c.add_grad(1, tb ? mm(sdy, a, true, ta) : mm(a, sdy, !ta, false));
  if (c.node().has_input(2) && c.needs(2)) {
    ValueId g = beta == 1.f ? dy : c.op("Mul", {dy, c.scalar(beta, c.dtype(dy))});
    c.add_grad(2, c.unbroadcast(g, c.shape(c.input(2))));
  }
  return Status::ok();
}

Status shard_gemm(ShardContext& c) {
  bool ta = c.node().attrs.get_int("transA", 0) != 0, tb = c.node().attrs.get_int("transB", 0) != 0;
  OASES_RETURN_IF_ERROR(shard_matmul(c, ta, tb));
  if (c.has_input(2)) {
    ShardingSpec out = c.outputs()[0];
    if (out.any_partial()) {
      // C would be added once per rank: contract over replicated K instead
      size_t ak = ta ? 0 : 1, bk = tb ? 1 : 0;
      c.require(0, c.in(0).with_dim(ak, -1).without_partial());
      c.require(1, c.in(1).with_dim(bk, -1).without_partial());
      out = out.without_partial();
      c.set_out(0, out);
    }
    // C broadcasts to [M, N]: its non-broadcast dims follow the output
    Shape cs = c.in_shape(2), so = c.out_shape(0);
    ShardingSpec want = ShardingSpec::replicated(cs.size());
    for (size_t j = 0; j < cs.size(); ++j) {
      size_t d = so.size() - cs.size() + j;
      if (cs[j] == so[d]) want.dims[j] = out.dims[d];
    }
    c.require(2, want);
  }
  return Status::ok();
}

OpCost einsum_cost(const Graph& g, const Node& n) {
  // one multiply-add per operand for every assignment of all the labels
  std::string eq = n.attrs.get_string("equation", "");
  std::map<char, int64_t> size;
  size_t k = 0, p = 0;
  for (size_t i = 0; i < eq.size() && eq[i] != '-'; ++i) {
    if (eq[i] == ',') {
      ++k;
      p = 0;
      continue;
    }
    const Shape& s = g.value(n.inputs[k]).shape;
    if (p < s.size()) size[eq[i]] = std::max(size[eq[i]], s[p]);
    ++p;
  }
  double assignments = 1;
  for (const auto& [ch, d] : size) assignments *= static_cast<double>(d);
  return OpCost{2.0 * static_cast<double>(n.inputs.size()) * assignments, io_bytes(g, n)};
}

std::vector<OpExample> gemm_examples() {
  std::vector<OpExample> gemm;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      gemm.push_back(example(fmt::format("transA={} transB={}", ta, tb),
                             {ex_float(ta ? Shape{6, 4} : Shape{4, 6}), ex_float(tb ? Shape{2, 6} : Shape{6, 2}), ex_float({2})},
                             AttrMap{{"transA", Attribute::of_int(ta)},
                                     {"transB", Attribute::of_int(tb)},
                                     {"alpha", Attribute::of_float(0.7f)},
                                     {"beta", Attribute::of_float(1.3f)}}));
    }
  }
  return gemm;
}

}  // namespace

void register_matmul_ops(OpRegistry& r) {
  {
    OpSchema s;
    s.op_type = "MatMul";
    s.traits = kTraitWeightProduct | kTraitLinear | kTraitComputeBound;
    s.min_inputs = s.max_inputs = 2;
    s.infer = infer_matmul;
    s.grad = matmul_grad;
    s.shard = [](ShardContext& c) { return shard_matmul(c, false, false); };
    s.cost = matmul_cost;
    s.examples = examples_of(
        {example("2D", {ex_float({4, 6}), ex_float({6, 2})}), example("weight", {ex_float({2, 4, 6}), ex_float({6, 4})}),
         example("batched broadcast", {ex_float({2, 1, 4, 6}), ex_float({2, 6, 2})}),
         example("vector left", {ex_float({4}), ex_float({2, 4, 6})}), example("vector right", {ex_float({2, 4, 6}), ex_float({6})})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Gemm";
    s.traits = kTraitWeightProduct | kTraitLinear | kTraitComputeBound;
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.infer = [](InferContext& c) {
      const Shape& a = c.shape(0);
      const Shape& b = c.shape(1);
      if (a.size() != 2 || b.size() != 2) return c.fail("A {} and B {} must be matrices", shape_str(a), shape_str(b));
      bool ta = c.attrs().get_int("transA", 0) != 0, tb = c.attrs().get_int("transB", 0) != 0;
      int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
      int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
      if (k != kb) return c.fail("inner dimensions differ: A {} B {} (transA={}, transB={})", shape_str(a), shape_str(b), ta, tb);
      if (c.has_input(2)) {
        auto bc = broadcast_shapes(c.shape(2), Shape{m, n});
        if (!bc || *bc != Shape{m, n}) return c.fail("C {} does not broadcast to [{}, {}]", shape_str(c.shape(2)), m, n);
      }
      c.set_output(0, c.dtype(0), {m, n});
      return Status::ok();
    };
    s.grad = gemm_grad;
    s.shard = shard_gemm;
    s.cost = [](const Graph& g, const Node& n) {
      const Shape& a = g.value(n.inputs[0]).shape;
      int64_t k = n.attrs.get_int("transA", 0) ? a[0] : a[1];
      return OpCost{2.0 * out_numel(g, n) * static_cast<double>(k), io_bytes(g, n)};
    };
    s.examples = examples_of(gemm_examples());
    r.add(std::move(s));
  }
  {
    // No canonical training graph keeps an Einsum (attention is fused, products are MatMul), so
    // it runs on whole tensors and has no gradient rule.
    OpSchema s;
    s.op_type = "Einsum";
    s.traits = kTraitWeightProduct | kTraitComputeBound;
    s.min_inputs = 1;
    s.differentiable = false;
    s.infer = infer_einsum;
    s.shard = shard_replicated_only;
    s.cost = einsum_cost;
    s.examples = examples_of(
        {example("matrix product", {ex_float({4, 6}), ex_float({6, 2})}, AttrMap{{"equation", Attribute::of_string("ij,jk->ik")}})});
    r.add(std::move(s));
  }
}

}  // namespace oases
