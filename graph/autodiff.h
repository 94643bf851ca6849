// Reverse-mode autodiff on the IR. build_backward appends to the graph the nodes computing
// d(loss)/d(x) for every requested value x, walking the forward nodes in reverse topological order
// and calling each op's gradient rule (OpSchema::grad, in the op's family file). Rules emit ordinary
// IR nodes, so the backward pass is graph that passes, the planner and the executor all see.
// Fan-out contributions are summed; integer and boolean values and an op's non-differentiable
// inputs get no gradient.
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"
#include "graph/op_registry.h"

namespace oases {

struct BackwardResult {
  std::map<ValueId, ValueId> grads;  // requested value -> its gradient (absent when none flows)
  int nodes_added = 0;
};

// `loss` must be a floating scalar (or the seed is ones of its shape).
Expected<BackwardResult> build_backward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt);

class GradContext {
 public:
  GradContext(Graph& g, NodeId node, std::vector<ValueId> grad_outputs, std::vector<bool> needs)
      : g_(g), node_id_(node), grad_out_(std::move(grad_outputs)), needs_(std::move(needs)), grad_in_(needs_.size()) {}

  Graph& graph() { return g_; }
  const Node& node() const { return g_.node(node_id_); }
  const AttrMap& attrs() const { return node().attrs; }
  ValueId input(int i) const { return node().input(i); }
  ValueId output(int i) const { return node().output(i); }
  Shape shape(ValueId v) const { return g_.value(v).shape; }  // a copy: emitting nodes may move values
  DType dtype(ValueId v) const { return g_.value(v).dtype; }
  // Gradient flowing into output i (kNoId when none does).
  ValueId grad_out(int i) const { return i < static_cast<int>(grad_out_.size()) ? grad_out_[i] : kNoId; }
  bool needs(int i) const { return i < static_cast<int>(needs_.size()) && needs_[i]; }
  // Adds a contribution to input i's gradient (ignored when the input needs none).
  void add_grad(int i, ValueId grad);
  const std::vector<std::vector<ValueId>>& grad_inputs() const { return grad_in_; }

  // Emits a node with fresh outputs whose shapes are inferred at once; returns output 0.
  ValueId op(const std::string& type, const std::vector<ValueId>& ins, AttrMap attrs = {}, const std::string& domain = "");
  std::vector<ValueId> op_n(const std::string& type, const std::vector<ValueId>& ins, int n, AttrMap attrs = {},
                            const std::string& domain = "");
  ValueId scalar(double v, DType dt);
  ValueId zeros(const Shape& s, DType dt);
  // Sums `grad` over broadcast dims so it has shape `to`.
  ValueId unbroadcast(ValueId grad, const Shape& to);
  // Makes sure the forward node has optional output i (e.g. LayerNorm's mean) and returns it.
  ValueId ensure_output(int i, DType dt, const Shape& s);
  template <class... Args>
  Status fail(fmt::format_string<Args...> f, Args&&... args) const {
    return Status::error(node().describe() + ": gradient: " + fmt::format(f, std::forward<Args>(args)...));
  }
  // Status of the first failed emission (shape inference of an emitted node), if any.
  const Status& status() const { return status_; }
  int emitted() const { return emitted_; }

 private:
  Graph& g_;
  NodeId node_id_;
  std::vector<ValueId> grad_out_;
  std::vector<bool> needs_;
  std::vector<std::vector<ValueId>> grad_in_;
  Status status_;
  int emitted_ = 0;
};

// Runs normalize + infer for one node (used when passes emit nodes after shape inference).
Status infer_node(Graph& g, NodeId n);

}  // namespace oases
