// Finite-difference check of every gradient rule: each case builds a small float64 graph whose
// parameters are initializers, takes loss = Σ_k Σ y_k ∘ R_k over the op's outputs (R_k fixed random
// weights), and compares the gradients from build_backward with central differences of the forward
// pass. The cases are the examples every differentiable op carries in its registry entry
// (OpSchema::examples, in the op's file in graph/ops/); a few composite graphs follow by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "executor/communicator.h"
#include "executor/executor.h"
#include "graph/autodiff.h"
#include "graph/passes/pass.h"
#include "planner/reshard_nodes.h"

namespace oases {
namespace {

struct Builder {
  Graph g;
  std::mt19937 rng{1234};
  std::vector<ValueId> params;
  Builder() { g.opset_imports[""] = 18; }

  Tensor random(const Shape& s, double lo = -1.0, double hi = 1.0) {
    Tensor t(DType::kF64, s);
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<double>()[i] = u(rng);
    return t;
  }
  // a differentiable parameter
  ValueId param(const Shape& s, double lo = -1.0, double hi = 1.0) {
    ValueId v = g.add_initializer(g.unique_name("p"), random(s, lo, hi));
    params.push_back(v);
    return v;
  }
  ValueId constant(Tensor t) { return g.add_constant("c", std::move(t)); }
  ValueId ints(const std::vector<int64_t>& v, Shape s) { return g.add_constant("i", Tensor::from_int64(v, std::move(s))); }
  std::vector<ValueId> op_n(const std::string& op, const std::vector<ValueId>& ins, int n, AttrMap a = {}, const std::string& dom = "") {
    NodeId id = g.add_node_new_outputs(op, ins, n, std::move(a), "", dom);
    return g.node(id).outputs;
  }
  ValueId op(const std::string& op, const std::vector<ValueId>& ins, AttrMap a = {}, const std::string& dom = "") {
    return op_n(op, ins, 1, std::move(a), dom)[0];
  }
};

using BuildFn = std::function<std::vector<ValueId>(Builder&)>;

// A group of one member for mesh axis 0: the collectives' examples run on it (as the identity);
// the Reshards of `g` (one rank holding both meshes) planned for one machine.
ExecOptions one_member_group(const Graph& g) {
  static std::shared_ptr<LocalWorld> world = make_local_world(1);
  static std::unique_ptr<Communicator> comm = local_communicator(world, 0);
  static std::unique_ptr<CommGroup> group = comm->make_group({0});
  ExecOptions o;
  o.groups = {group.get()};
  auto plans = plan_reshards(g, reshard_cluster(1, {}, LinkModel{}, LinkModel{}));
  EXPECT_TRUE(plans) << plans.status().message();
  if (plans) o.reshards = *plans;
  return o;
}

// On one device a Layout is the identity (the partitioner removes it before anything runs).
void layouts_to_identity(Graph& g) {
  for (NodeId id : g.nodes()) {
    Node& n = g.node(id);
    if (n.domain != kOasesDomain || n.op_type != "Layout") continue;
    n.op_type = "Identity";
    n.domain = "";
    n.attrs = AttrMap{};
  }
}

double run_loss(const Graph& g, ValueId loss) {
  Graph h = g;
  h.set_outputs({loss});
  layouts_to_identity(h);
  auto ex = Executor::create(h, one_member_group(h));
  EXPECT_TRUE(ex) << ex.status().message();
  auto out = (*ex)->run({});
  EXPECT_TRUE(out) << out.status().message();
  return (*out)[0].item();
}

void check_outputs(const std::string& name, const BuildFn& build, double tol = 1e-6) {
  SCOPED_TRACE(name);
  Builder b;
  std::vector<ValueId> ys = build(b);
  // infer shapes of the forward graph
  InferShapesPass infer;
  auto r0 = infer.run(b.g);
  ASSERT_TRUE(r0) << r0.status().message();
  ValueId loss = kNoId;
  for (ValueId y : ys) {
    const Value yv = b.g.value(y);
    if (!is_floating(yv.dtype)) continue;
    ValueId R = b.constant(b.random(yv.shape));
    ValueId prod = b.op("Mul", {y, R});
    std::vector<int64_t> all;
    for (size_t i = 0; i < yv.shape.size(); ++i) all.push_back(static_cast<int64_t>(i));
    ValueId part = b.op("ReduceSum", {prod}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}});
    loss = loss == kNoId ? part : b.op("Add", {loss, part});
  }
  ASSERT_NE(loss, kNoId) << "no floating output";
  auto r1 = infer.run(b.g);
  ASSERT_TRUE(r1) << r1.status().message();
  b.g.set_outputs({loss});

  Graph train = b.g;
  // parameters must be distinct storage from the FD graph's, which we perturb
  auto bw = build_backward(train, loss, b.params);
  ASSERT_TRUE(bw) << bw.status().message();
  std::vector<ValueId> outs{loss};
  for (ValueId p : b.params) {
    ASSERT_TRUE(bw->grads.count(p)) << "no gradient reaches " << b.g.value(p).name;
    outs.push_back(bw->grads.at(p));
  }
  train.set_outputs(outs);
  layouts_to_identity(train);
  auto ex = Executor::create(train, one_member_group(train));
  ASSERT_TRUE(ex) << ex.status().message();
  auto res = (*ex)->run({});
  ASSERT_TRUE(res) << res.status().message();

  for (size_t pi = 0; pi < b.params.size(); ++pi) {
    ValueId p = b.params[pi];
    Tensor analytic = (*res)[pi + 1];
    ASSERT_EQ(analytic.shape(), b.g.value(p).shape);
    Tensor& t = b.g.value(p).constant;
    double* d = t.mutable_data<double>();
    double max_err = 0, max_ref = 1e-3;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double eps = 1e-6;
      double x0 = d[i];
      d[i] = x0 + eps;
      double lp = run_loss(b.g, loss);
      d[i] = x0 - eps;
      double lm = run_loss(b.g, loss);
      d[i] = x0;
      double num = (lp - lm) / (2 * eps);
      double ana = load_as_double(analytic.raw(), analytic.dtype(), i);
      max_err = std::max(max_err, std::abs(num - ana));
      max_ref = std::max(max_ref, std::abs(num));
    }
    EXPECT_LE(max_err / max_ref, tol) << "parameter " << pi << " (" << b.g.value(p).name << "): max abs error " << max_err
                                      << " against max |grad| " << max_ref;
  }
}

void check_gradients(const std::string& name, const std::function<ValueId(Builder&)>& build, double tol = 1e-6) {
  check_outputs(
      name, [&](Builder& b) { return std::vector<ValueId>{build(b)}; }, tol);
}

AttrMap attrs(std::initializer_list<std::pair<const std::string, Attribute>> a) {
  return AttrMap(a);
}
Attribute I(int64_t v) {
  return Attribute::of_int(v);
}
Attribute Is(std::vector<int64_t> v) {
  return Attribute::of_ints(std::move(v));
}

// The op of one registry example: fixed data become constants, float inputs parameters.
std::vector<ValueId> build_example(Builder& b, const OpSchema& s, const OpExample& ex) {
  std::vector<ValueId> ins;
  for (const ExampleInput& in : ex.inputs) ins.push_back(in.data ? b.constant(*in.data) : b.param(in.shape, in.lo, in.hi));
  return b.op_n(s.op_type, ins, ex.outputs, ex.attrs, s.domain);
}

TEST(GradCheck, EveryDifferentiableOpOfTheRegistry) {
  int ops = 0, cases = 0;
  for (const OpSchema* s : OpRegistry::global().all()) {
    if (!s->differentiable || !s->examples) continue;  // the registry test requires examples of every differentiable op
    ++ops;
    for (const OpExample& ex : s->examples()) {
      check_outputs(schema_key(*s) + " / " + ex.name, [&](Builder& b) { return build_example(b, *s, ex); });
      ++cases;
    }
  }
  EXPECT_GT(ops, 70);
  std::cout << "[ gradcheck ] " << cases << " examples of " << ops << " differentiable ops\n";
}

TEST(GradCheck, SplitOutputsWithoutGradientGetZeros) {
  check_gradients("Split", [](Builder& b) {
    auto o = b.op_n("Split", {b.param({2, 7})}, 3, attrs({{"axis", I(1)}, {"split", Is({2, 4, 1})}}));
    return b.op("Mul", {o[1], o[1]});  // outputs 0 and 2 get no gradient: zeros fill in
  });
}

TEST(GradCheck, FanOutAndTiedWeightsAccumulate) {
  // one table used by a Gather (embedding) and a MatMul (tied head)
  check_gradients("tied", [](Builder& b) {
    ValueId w = b.param({6, 4});
    ValueId e = b.op("Gather", {w, b.ints({1, 5, 1}, {3})});
    ValueId wt = b.op("Transpose", {w}, attrs({{"perm", Is({1, 0})}}));
    ValueId logits = b.op("MatMul", {e, wt});
    return b.op("Add", {logits, b.op("Mul", {logits, logits})});
  });
}

TEST(GradCheck, IntegerInputsAreNotDifferentiated) {
  Builder b;
  ValueId w = b.param({5, 3});
  ValueId idx = b.g.add_input("ids", DType::kI64, {4});
  ValueId y = b.op("Gather", {w, idx});
  std::vector<int64_t> axes{0, 1};
  ValueId l = b.op("ReduceSum", {y}, attrs({{"axes", Is(axes)}, {"keepdims", I(0)}}));
  InferShapesPass infer;
  ASSERT_TRUE(infer.run(b.g));
  auto bw = build_backward(b.g, l, {w, idx});
  ASSERT_TRUE(bw) << bw.status().message();
  EXPECT_TRUE(bw->grads.count(w));
  EXPECT_FALSE(bw->grads.count(idx));
}

}  // namespace
}  // namespace oases
