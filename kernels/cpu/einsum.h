// Einsum on equations spelt with letters only, one label string per operand and one for the
// output (the canonical form the op rule writes: "bij,bjk->bik", ellipses already replaced by
// letters). A label's size is that of its dims; an operand dim of 1 under a larger label
// broadcasts, and a label repeated within an operand walks that operand's diagonal.
//   Two operands whose labels split into batch (both and output), m (first and output),
//   n (second and output) and k (both, summed) run as one batched GEMM between transposes:
//     A [batch, m, k] · B [batch, k, n] -> [batch, m, n] -> output order.
//   Anything else runs as a loop over the output with the summed labels inside, accumulating in
//   double (in 64-bit integers for integer types).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oases::kernels {

template <class T>
void einsum(const std::vector<const T*>& ins, const std::vector<std::vector<int64_t>>& shapes, const std::vector<std::string>& in_labels,
            const std::string& out_labels, T* out);

}  // namespace oases::kernels
