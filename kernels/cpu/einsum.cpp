#include "kernels/cpu/einsum.h"

#include <array>
#include <type_traits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layout.h"
#include "kernels/cpu/parallel.h"

namespace oases::kernels {

namespace {

using LabelSizes = std::array<int64_t, 128>;  // by label character; -1 where absent

template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// Positions in `labels` of each label of `order`.
std::vector<int64_t> positions(const std::string& labels, const std::string& order) {
  std::vector<int64_t> p;
  for (char ch : order) p.push_back(static_cast<int64_t>(labels.find(ch)));
  return p;
}

// The batched-GEMM form; false when the operands do not have it (repeated or broadcast labels,
// labels summed within one operand, empty dims).
template <class T>
bool einsum_as_gemm(const std::vector<const T*>& ins, const std::vector<std::vector<int64_t>>& shapes,
                    const std::vector<std::string>& labels, const std::string& out_labels, const LabelSizes& size, T* out) {
  if (ins.size() != 2) return false;
  const std::string &la = labels[0], &lb = labels[1];
  for (int k = 0; k < 2; ++k) {
    for (size_t p = 0; p < labels[k].size(); ++p) {
      char ch = labels[k][p];
      if (labels[k].find(ch) != p || shapes[k][p] != size[static_cast<unsigned char>(ch)] || shapes[k][p] == 0) return false;
    }
  }
  std::string batch, m, n, kk;
  for (char ch : out_labels) {
    bool a = la.find(ch) != std::string::npos, b = lb.find(ch) != std::string::npos;
    if (a && b) batch += ch;
    if (a && !b) m += ch;
    if (!a && b) n += ch;
  }
  for (char ch : la) {
    bool b = lb.find(ch) != std::string::npos, o = out_labels.find(ch) != std::string::npos;
    if (!o && !b) return false;  // summed within the first operand alone
    if (!o) kk += ch;
  }
  for (char ch : lb) {
    if (out_labels.find(ch) == std::string::npos && la.find(ch) == std::string::npos) return false;
  }
  auto prod = [&](const std::string& s) {
    int64_t p = 1;
    for (char ch : s) p *= size[static_cast<unsigned char>(ch)];
    return p;
  };
  const int64_t nb = prod(batch), nm = prod(m), nn = prod(n), nk = prod(kk);
  if (nb * nm * nn * nk == 0) return false;
  auto arrange = [&](const T* x, const std::vector<int64_t>& shape, const std::string& have, const std::string& want,
                     std::vector<T>& scratch) -> const T* {
    std::vector<int64_t> perm = positions(have, want);
    if (is_identity(perm)) return x;
    scratch.resize(static_cast<size_t>(prod(have)));
    transpose(x, shape, perm, scratch.data(), sizeof(T));
    return scratch.data();
  };
  std::vector<T> sa, sb, sc;
  const T* a = arrange(ins[0], shapes[0], la, batch + m + kk, sa);
  const T* b = arrange(ins[1], shapes[1], lb, batch + kk + n, sb);
  const std::string result = batch + m + n;
  std::vector<int64_t> out_perm = positions(result, out_labels);
  bool direct = is_identity(out_perm);
  if (!direct) sc.resize(static_cast<size_t>(nb * nm * nn));
  T* c = direct ? out : sc.data();
  matmul<T>(a, {nb, nm, nk}, b, {nb, nk, nn}, c, {nb, nm, nn});
  if (!direct) {
    std::vector<int64_t> rshape;
    for (char ch : result) rshape.push_back(size[static_cast<unsigned char>(ch)]);
    transpose(c, rshape, out_perm, out, sizeof(T));
  }
  return true;
}

}  // namespace

template <class T>
void einsum(const std::vector<const T*>& ins, const std::vector<std::vector<int64_t>>& shapes, const std::vector<std::string>& labels,
            const std::string& out_labels, T* out) {
  LabelSizes size;
  size.fill(-1);
  for (size_t k = 0; k < ins.size(); ++k) {
    for (size_t p = 0; p < labels[k].size(); ++p) {
      int64_t& s = size[static_cast<unsigned char>(labels[k][p])];
      if (s < 0 || s == 1) s = shapes[k][p];
    }
  }
  if (einsum_as_gemm<T>(ins, shapes, labels, out_labels, size, out)) return;

  std::string summed;
  for (const auto& l : labels) {
    for (char ch : l) {
      if (out_labels.find(ch) == std::string::npos && summed.find(ch) == std::string::npos) summed += ch;
    }
  }
  // per operand: its stride under each output label and each summed label (0 where broadcast
  // or absent; the sum of strides where a label repeats, which walks the diagonal)
  const size_t nin = ins.size(), no = out_labels.size(), ns = summed.size();
  std::vector<std::vector<int64_t>> out_st(nin, std::vector<int64_t>(no, 0)), sum_st(nin, std::vector<int64_t>(ns, 0));
  for (size_t k = 0; k < nin; ++k) {
    std::vector<int64_t> st = strides_of(shapes[k]);
    for (size_t p = 0; p < labels[k].size(); ++p) {
      char ch = labels[k][p];
      int64_t s = shapes[k][p] == 1 && size[static_cast<unsigned char>(ch)] != 1 ? 0 : st[p];
      size_t o = out_labels.find(ch);
      if (o != std::string::npos) {
        out_st[k][o] += s;
      } else {
        sum_st[k][summed.find(ch)] += s;
      }
    }
  }
  std::vector<int64_t> osize(no), ssize(ns);
  int64_t nout = 1, nsum = 1;
  for (size_t i = 0; i < no; ++i) nout *= osize[i] = size[static_cast<unsigned char>(out_labels[i])];
  for (size_t i = 0; i < ns; ++i) nsum *= ssize[i] = size[static_cast<unsigned char>(summed[i])];
  parallel_range(nout, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, nsum)), [&](int64_t o_begin, int64_t o_end) {
    for (int64_t o = o_begin; o < o_end; ++o) {
      std::vector<int64_t> off(nin, 0), idx(ns, 0);
      int64_t rem = o;
      for (int64_t d = static_cast<int64_t>(no) - 1; d >= 0; --d) {
        int64_t i = rem % osize[d];
        rem /= osize[d];
        for (size_t k = 0; k < nin; ++k) off[k] += i * out_st[k][d];
      }
      Acc<T> acc = 0;
      for (int64_t s = 0; s < nsum; ++s) {
        Acc<T> p = 1;
        for (size_t k = 0; k < nin; ++k) p *= static_cast<Acc<T>>(ins[k][off[k]]);
        acc += p;
        // odometer over the summed labels, last fastest
        for (int64_t d = static_cast<int64_t>(ns) - 1; d >= 0; --d) {
          for (size_t k = 0; k < nin; ++k) off[k] += sum_st[k][d];
          if (++idx[d] < ssize[d]) break;
          for (size_t k = 0; k < nin; ++k) off[k] -= ssize[d] * sum_st[k][d];
          idx[d] = 0;
        }
      }
      out[o] = static_cast<T>(acc);
    }
  });
}

template void einsum<float>(const std::vector<const float*>&, const std::vector<std::vector<int64_t>>&, const std::vector<std::string>&,
                            const std::string&, float*);
template void einsum<double>(const std::vector<const double*>&, const std::vector<std::vector<int64_t>>&, const std::vector<std::string>&,
                             const std::string&, double*);
template void einsum<int64_t>(const std::vector<const int64_t*>&, const std::vector<std::vector<int64_t>>&, const std::vector<std::string>&,
                              const std::string&, int64_t*);
template void einsum<int32_t>(const std::vector<const int32_t*>&, const std::vector<std::vector<int64_t>>&, const std::vector<std::string>&,
                              const std::string&, int32_t*);
template void einsum<uint32_t>(const std::vector<const uint32_t*>&, const std::vector<std::vector<int64_t>>&,
                               const std::vector<std::string>&, const std::string&, uint32_t*);
template void einsum<uint64_t>(const std::vector<const uint64_t*>&, const std::vector<std::vector<int64_t>>&,
                               const std::vector<std::string>&, const std::string&, uint64_t*);

}  // namespace oases::kernels
