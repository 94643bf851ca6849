// Small helpers for pattern-matching rewrites on the IR.
#pragma once

#include <optional>

#include "graph/graph.h"

namespace oases::pattern {

// The node producing v if it has the given op type (default domain unless `domain` given).
const Node* producer_if(const Graph& g, ValueId v, const std::string& op, const std::string& domain = "");
// The single consumer node of v, or nullptr when v has zero or several uses or is a graph output.
const Node* sole_consumer(const Graph& g, ValueId v);
// Scalar value of a constant (any shape with one element, or all elements equal), if constant.
std::optional<double> scalar_constant(const Graph& g, ValueId v);
bool is_scalar_near(const Graph& g, ValueId v, double want, double rel_tol = 1e-3);
// For a commutative binary node, the operand that is not `known` (kNoId if `known` is neither).
ValueId other_operand(const Node& n, ValueId known);
// True when v's only consumers are among `nodes` (so removing them leaves nothing dangling).
bool uses_only_within(const Graph& g, ValueId v, const std::vector<NodeId>& nodes);
// Axes of a normalised reduction node as trailing-count: reduces exactly the last `k` dims → k, else -1.
int trailing_reduce_count(const Graph& g, const Node& reduce);

}  // namespace oases::pattern
