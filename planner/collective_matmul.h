// Collective matmuls (overlap inside the op, beyond the paper's batch chunks): with sequence
// parallelism, the all-gather of the sequence before column-parallel products and the
// reduce-scatter after a row-parallel product (and their duals in the backward pass) are
// decomposed into n - 1 ring steps over the tp group, each step's transfer overlapping the
// partial product of the part already here.
//
//   all-gather → products:   x_0 = this rank's part;  x_s = RingShift(x_{s-1})   (part (r - s) mod n)
//                            y_s = x_s · W for every product reading the gathered value;
//                            y = RingAssemble(y_0 … y_{n-1}) (parts back in group order); other
//                            readers get RingAssemble(x_0 … x_{n-1}), the gathered value itself
//   products (+ sums) → reduce-scatter:
//                            p_s = Σ_j ShardSlice(A_j; offset n-1-s) · W_j   (part (r + n-1-s) mod n)
//                            acc_0 = p_0;  acc_s = RingShift(acc_{s-1}) + p_s;  result acc_{n-1}
//                            (rank r ends with the sum over the group of its own part)
//
// The pass runs on the partitioned per-rank graph (forward and backward are both there), so the
// gradients stay those of the undecomposed graph; only the summation order of a reduce-scatter's
// parts changes (a ring's instead of rank order). The schedule sees RingShift as a collective
// (start, wait) and places each step's products with their step (attribute "ring_step").
#pragma once

#include <functional>
#include <string>

#include "graph/graph.h"
#include "graph/sharding.h"

namespace oases {

struct CollectiveMatmulReport {
  int gathers = 0;   // all-gathers decomposed
  int scatters = 0;  // reduce-scatters decomposed
  int products = 0;  // products split into ring steps
  int shifts = 0;    // RingShift nodes made
};

// Decomposes every all-gather / reduce-scatter (one segment, over a group of 2 or more, of a
// dimension the products do not contract) next to matrix products of a part `selected` accepts
// (planner/hybrid.h part names: "embedding", "layer.3.attn", "layer.3.mlp", "head"). `specs`
// (by value id, may be null) grows with the new values. Collectives that do not fit are left.
Expected<CollectiveMatmulReport> decompose_collective_matmuls(Graph& g, std::vector<ShardingSpec>* specs,
                                                              const std::function<bool(const std::string& part)>& selected);

}  // namespace oases
