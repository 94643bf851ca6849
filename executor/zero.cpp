#include "executor/zero.h"

#include <algorithm>
#include <cstring>

#include "graph/op_registry.h"
#include "graph/tiles.h"

namespace oases {

namespace {

// The distinct groups of the sharded parameters, each with its parameters in order (the same on
// every member: they run the same program).
std::vector<std::pair<CommGroup*, std::vector<size_t>>> by_group(const std::vector<std::optional<ZeroPiece>>& pieces) {
  std::vector<std::pair<CommGroup*, std::vector<size_t>>> out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!pieces[i]) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& g) { return g.first == pieces[i]->group; });
    if (it == out.end()) {
      out.push_back({pieces[i]->group, {}});
      it = out.end() - 1;
    }
    it->second.push_back(i);
  }
  return out;
}

// This member's piece of a parameter of `numel` elements shared over `group`.
ZeroPiece piece_of(CommGroup* group, int64_t numel) {
  ZeroPiece zp;
  zp.group = group;
  zp.numel = numel;
  zp.piece = flat_piece(numel, group->size());
  zp.offset = std::min(numel, zp.piece * group->rank());
  zp.length = flat_piece_length(numel, group->size(), group->rank());
  return zp;
}

// Gathered buffers of at most this many bytes (all members' pieces): bounds the temporary memory.
constexpr int64_t kGatherBucketBytes = int64_t{64} << 20;

}  // namespace

Expected<ZeroShards> ZeroShards::find(const Graph& program, const std::vector<ValueId>& params, const std::vector<ValueId>& grads,
                                      const std::vector<CommGroup*>& groups) {
  ZeroShards z;
  z.pieces_.resize(params.size());
  for (size_t i = 0; i < params.size() && i < grads.size(); ++i) {
    NodeId p = program.producer(grads[i]);
    if (p == kNoId) continue;
    const Node& n = program.node(p);
    if (n.domain != kOasesDomain || n.op_type != "FlatReduceScatter") continue;
    const Value& param = program.value(params[i]);
    int64_t axis = n.attrs.get_int("mesh_axis", -1);
    if (axis < 0 || static_cast<size_t>(axis) >= groups.size() || !groups[static_cast<size_t>(axis)]) {
      return error("gradient of '{}': its reduce-scatter runs over mesh axis {}, and this rank has no group for it", param.name, axis);
    }
    ZeroPiece zp = piece_of(groups[static_cast<size_t>(axis)], shape_numel(param.shape));
    if (program.value(grads[i]).shape != Shape{zp.piece}) {
      return error("gradient of '{}' is {}, the piece of {} elements over {} ranks is [{}]", param.name,
                   shape_str(program.value(grads[i]).shape), zp.numel, zp.group->size(), zp.piece);
    }
    z.pieces_[i] = zp;
    z.any_ = true;
  }
  return z;
}

void ZeroShards::add_whole(size_t i, CommGroup* group, int64_t numel) {
  if (pieces_.at(i) || group->size() <= 1) return;
  ZeroPiece zp = piece_of(group, numel);
  zp.whole_gradient = true;
  pieces_[i] = zp;
  any_ = true;
}

void ZeroShards::sum_over_groups(std::vector<double>* ss) const {
  for (const auto& [group, members] : by_group(pieces_)) {
    std::vector<double> mine;
    for (size_t i : members) mine.push_back(ss->at(i));
    group->all_reduce(mine.data(), static_cast<int64_t>(mine.size()), DType::kF64, ReduceOp::kSum);
    for (size_t k = 0; k < members.size(); ++k) (*ss)[members[k]] = mine[k];
  }
}

void ZeroShards::all_gather(const std::vector<Tensor*>& params) const {
  for (const GatherBucket& b : gather_buckets(params)) b.run();
}

std::vector<ZeroShards::GatherBucket> ZeroShards::gather_buckets(const std::vector<Tensor*>& params, const std::vector<int64_t>& first_use,
                                                                 const std::vector<int>& part) const {
  std::vector<GatherBucket> out;
  const bool ordered = first_use.size() == pieces_.size() && part.size() == pieces_.size();
  for (auto [group, members] : by_group(pieces_)) {
    const int64_t n = group->size();
    if (ordered) std::stable_sort(members.begin(), members.end(), [&](size_t a, size_t b) { return first_use[a] < first_use[b]; });
    size_t first = 0;
    while (first < members.size()) {
      // a bucket: parameters whose pieces, times the members, fit the bucket (at least one), of one part
      size_t last = first;
      int64_t row = 0;
      while (last < members.size() && (last == first || ((row + pieces_[members[last]]->piece) * n * 4 <= kGatherBucketBytes &&
                                                         (!ordered || part[members[last]] == part[members[first]])))) {
        row += pieces_[members[last]]->piece;
        ++last;
      }
      GatherBucket b;
      b.first_use = ordered ? first_use[members[first]] : 0;
      std::vector<std::pair<const ZeroPiece*, Tensor*>> mine;
      for (size_t k = first; k < last; ++k) {
        b.params.push_back(members[k]);
        mine.emplace_back(&*pieces_[members[k]], params[members[k]]);
      }
      CommGroup* g = group;
      b.run = [g, n, row, mine] {
        std::vector<float> send(static_cast<size_t>(row), 0.f), all(static_cast<size_t>(row * n));
        int64_t at = 0;
        for (const auto& [z, t] : mine) {
          if (z->length > 0) std::memcpy(send.data() + at, t->data<float>() + z->offset, static_cast<size_t>(z->length) * 4);
          at += z->piece;
        }
        g->all_gather(send.data(), all.data(), row * 4);
        for (int64_t j = 0; j < n; ++j) {
          at = j * row;
          for (const auto& [z, t] : mine) {
            int64_t len = flat_piece_length(z->numel, n, j);
            if (len > 0 && j != g->rank()) std::memcpy(t->mutable_data<float>() + j * z->piece, all.data() + at, static_cast<size_t>(len) * 4);
            at += z->piece;
          }
        }
      };
      out.push_back(std::move(b));
      first = last;
    }
  }
  if (ordered) std::stable_sort(out.begin(), out.end(), [](const GatherBucket& a, const GatherBucket& b) { return a.first_use < b.first_use; });
  return out;
}

Tensor ZeroShards::gather(size_t i, const float* mine, const Shape& shape) const {
  const ZeroPiece& z = *pieces_.at(i);
  const int64_t n = z.group->size();
  std::vector<float> send(static_cast<size_t>(z.piece), 0.f), all(static_cast<size_t>(z.piece * n));
  if (z.length > 0) std::memcpy(send.data(), mine, static_cast<size_t>(z.length) * 4);
  z.group->all_gather(send.data(), all.data(), z.piece * 4);
  Tensor whole(DType::kF32, shape);
  std::memcpy(whole.mutable_data<float>(), all.data(), static_cast<size_t>(z.numel) * 4);
  return whole;
}

Tensor ZeroShards::slice(size_t i, const Tensor& whole) const {
  const ZeroPiece& z = *pieces_.at(i);
  Tensor t(DType::kF32, {z.length});
  if (z.length > 0) std::memcpy(t.mutable_data<float>(), whole.data<float>() + z.offset, static_cast<size_t>(z.length) * 4);
  return t;
}

}  // namespace oases
