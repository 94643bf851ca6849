#include "graph/sharding_rules.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace oases {

ShardContext::ShardContext(const Graph& g, const Node& n, const Mesh& mesh, std::vector<ShardingSpec> inputs)
    : g_(g), n_(n), mesh_(mesh), in_(std::move(inputs)), required_(in_.size(), false) {
  out_.resize(n.outputs.size());
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] != kNoId) out_[i] = ShardingSpec::replicated(g.value(n.outputs[i]).shape.size());
  }
}

void ShardContext::require(int i, ShardingSpec s) {
  if (in_.at(static_cast<size_t>(i)) == s) return;
  in_[static_cast<size_t>(i)] = std::move(s);
  required_[static_cast<size_t>(i)] = true;
}

void ShardContext::set_out(int i, ShardingSpec s) {
  out_.at(static_cast<size_t>(i)) = std::move(s);
}

void ShardContext::require_no_partial() {
  for (int i = 0; i < num_inputs(); ++i) {
    if (has_input(i) && in(i).any_partial()) require(i, in(i).without_partial());
  }
}

void ShardContext::require_replicated_dims(int i, int64_t from, int64_t to) {
  ShardingSpec s = in(i);
  bool change = false;
  for (int64_t d = std::max<int64_t>(0, from); d < to && d < static_cast<int64_t>(s.rank()); ++d) {
    if (s.dims[d].axis >= 0) {
      s.dims[d] = DimSpec{};
      change = true;
    }
  }
  if (change) require(i, s);
}

std::string ShardContext::describe_inputs() const {
  std::vector<std::string> parts;
  for (int i = 0; i < num_inputs(); ++i) parts.push_back(has_input(i) ? in(i).to_string(&mesh_) : "-");
  return fmt::format("{}", fmt::join(parts, " x "));
}

Status shard_nonlinear(ShardContext& c) {
  return shard_elementwise(c, PartialPolicy::kNone);
}

Status shard_elementwise(ShardContext& c, PartialPolicy policy, int first_input) {
  const Node& n = c.node();
  Shape out = c.out_shape(0);
  size_t R = out.size();
  ShardingSpec o = ShardingSpec::replicated(R);
  uint32_t used_axes = 0;
  // dims
  for (size_t d = 0; d < R; ++d) {
    DimSpec chosen;
    for (int i = first_input; i < c.num_inputs(); ++i) {
      if (!c.has_input(i)) continue;
      Shape s = c.in_shape(i);
      if (s.size() + d < R) continue;
      size_t j = d - (R - s.size());
      if (s[j] != out[d]) continue;  // broadcast dim
      const DimSpec& ds = c.in(i).dims[j];
      if (ds.axis >= 0 && !((used_axes >> ds.axis) & 1u)) {
        chosen = ds;
        break;
      }
    }
    if (chosen.axis >= 0) used_axes |= 1u << chosen.axis;
    o.dims[d] = chosen;
    for (int i = first_input; i < c.num_inputs(); ++i) {
      if (!c.has_input(i)) continue;
      Shape s = c.in_shape(i);
      if (s.size() + d < R) continue;
      size_t j = d - (R - s.size());
      DimSpec want = s[j] == out[d] ? chosen : DimSpec{};
      if (c.in(i).dims[j] != want) c.require(i, c.in(i).with_dim(j, want.axis, want.segments));
    }
  }
  // partial sums
  for (int a = 0; a < c.mesh().num_axes(); ++a) {
    std::vector<int> partial_inputs;
    int present = 0;
    for (int i = first_input; i < c.num_inputs(); ++i) {
      if (!c.has_input(i)) continue;
      ++present;
      if (c.in(i).is_partial(a)) partial_inputs.push_back(i);
    }
    if (partial_inputs.empty()) continue;
    bool keep = false;
    if ((used_axes >> a) & 1u) {
      keep = false;
    } else if (policy == PartialPolicy::kAdditive) {
      keep = static_cast<int>(partial_inputs.size()) == present;
    } else if (policy == PartialPolicy::kMultiplicative) {
      keep = true;  // the first partial factor stays, the others are reduced below
    } else if (policy == PartialPolicy::kFirstOnly) {
      keep = partial_inputs[0] == first_input;
    }
    if (keep) {
      o.partial |= 1u << a;
      size_t from = policy == PartialPolicy::kAdditive ? partial_inputs.size() : 1;
      for (size_t k = from; k < partial_inputs.size(); ++k) c.require(partial_inputs[k], c.in(partial_inputs[k]).with_partial(a, false));
    } else {
      for (int i : partial_inputs) c.require(i, c.in(i).with_partial(a, false));
    }
  }
  for (int k = 0; k < c.num_outputs(); ++k) {
    if (c.has_output(k) && c.out_shape(k) == out) c.set_out(k, o);
  }
  (void)n;
  return Status::ok();
}

Status shard_same_as_input(ShardContext& c, PartialPolicy policy) {
  if (policy == PartialPolicy::kNone) c.require_no_partial();
  for (int k = 0; k < c.num_outputs(); ++k) {
    if (c.has_output(k) && c.out_shape(k).size() == c.in(0).rank()) c.set_out(k, c.in(0));
  }
  return Status::ok();
}

Status shard_reshape(ShardContext& c) {
  Shape in = c.in_shape(0), out = c.out_shape(0);
  ShardingSpec is = c.in(0);
  ShardingSpec os = ShardingSpec::replicated(out.size());
  os.partial = is.partial;
  ShardingSpec want = is;
  size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    // trivial size-1 dims stand alone and are replicated
    if (i < in.size() && in[i] == 1) {
      if (want.dims[i].axis >= 0) want.dims[i] = DimSpec{};
      ++i;
      continue;
    }
    if (j < out.size() && out[j] == 1) {
      ++j;
      continue;
    }
    if (i >= in.size() || j >= out.size()) break;
    size_t i0 = i, j0 = j;
    int64_t pi = in[i++], po = out[j++];
    while (pi != po) {
      if (pi < po && i < in.size()) {
        pi *= in[i++];
      } else if (po < pi && j < out.size()) {
        po *= out[j++];
      } else {
        break;
      }
    }
    DimSpec lead = is.dims[i0];
    for (size_t k = i0 + 1; k < i; ++k) {
      if (is.dims[k].axis >= 0) want.dims[k] = DimSpec{};  // only the outermost dim of a group may stay sharded
    }
    if (lead.axis >= 0) {
      int64_t parts = c.mesh().axis_size(lead.axis) * lead.segments;
      if (out[j0] % parts == 0) {
        os.dims[j0] = lead;
      } else {
        want.dims[i0] = DimSpec{};
      }
    }
  }
  if (want != is) c.require(0, want);
  c.set_out(0, os);
  return Status::ok();
}

Status shard_replicated_only(ShardContext& c) {
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (c.has_input(i)) c.require(i, ShardingSpec::replicated(c.in(i).rank()));
  }
  for (int k = 0; k < c.num_outputs(); ++k) {
    if (c.has_output(k)) c.set_out(k, ShardingSpec::replicated(c.out_shape(k).size()));
  }
  return Status::ok();
}

}  // namespace oases
