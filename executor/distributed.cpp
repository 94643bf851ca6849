#include "executor/distributed.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>

namespace oases {

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string binary_identity() {
#ifdef OASES_BUILD_ID
  return OASES_BUILD_ID;
#else
  return std::string(__DATE__) + " " + __TIME__;
#endif
}

Expected<std::unique_ptr<RankRuntime>> RankRuntime::create(Communicator* comm, const Mesh& mesh, const LinkModel& link) {
  auto rt = std::unique_ptr<RankRuntime>(new RankRuntime());
  rt->mesh_ = mesh;
  if (!comm) {
    if (mesh.size() != 1) return error("a {}-rank mesh ({}) needs a communicator", mesh.size(), mesh.to_string());
    return rt;
  }
  if (comm->size() != mesh.size()) {
    return error("the world has {} ranks but the mesh {} needs {} (tp x dp must equal the number of ranks)", comm->size(), mesh.to_string(),
                 mesh.size());
  }
  rt->comm_ = comm;
  rt->rank_ = comm->rank();
  try {
    for (int a = 0; a < mesh.num_axes(); ++a) {
      std::vector<int64_t> g = mesh.group(rt->rank_, a);
      std::vector<int> members(g.begin(), g.end());
      rt->axis_groups_.push_back(emulate_link(comm->make_group(members), link_for_members(members, link)));
      rt->axis_raw_.push_back(rt->axis_groups_.back().get());
    }
    std::vector<int> all(static_cast<size_t>(mesh.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    rt->world_ = comm->make_group(all);
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  return rt;
}

Expected<std::unique_ptr<RankRuntime>> RankRuntime::create(Communicator* comm, const PlacedMesh& placed, const LinkModel& link) {
  if (!comm) return create(nullptr, placed.mesh, link);
  if (Status st = placed.validate(comm->size()); !st) return st;
  int64_t me = placed.mesh_rank(comm->rank());
  if (me < 0) return error("world rank {} is not in the mesh {}", comm->rank(), placed.to_string());
  auto rt = std::unique_ptr<RankRuntime>(new RankRuntime());
  rt->mesh_ = placed.mesh;
  rt->comm_ = comm;
  rt->rank_ = static_cast<int>(me);
  auto world_ranks = [&](const std::vector<int64_t>& mesh_ranks) {
    std::vector<int> w;
    for (int64_t r : mesh_ranks) w.push_back(static_cast<int>(placed.ranks[static_cast<size_t>(r)]));
    return w;
  };
  try {
    const Mesh& mesh = placed.mesh;
    for (int a = 0; a < mesh.num_axes(); ++a) {
      std::vector<int> members = world_ranks(mesh.group(me, a));
      rt->axis_groups_.push_back(emulate_link(comm->make_member_group(members, kMeshGroupTag + a), link_for_members(members, link)));
      rt->axis_raw_.push_back(rt->axis_groups_.back().get());
    }
    std::vector<int64_t> all(static_cast<size_t>(mesh.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    rt->world_ = comm->make_member_group(world_ranks(all), kMeshGroupTag + mesh.num_axes());
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  return rt;
}

Tensor RankRuntime::gather(const Tensor& local, const ShardingSpec& spec, const Shape& global) {
  if (!distributed() || spec.is_replicated()) return local.clone();
  std::vector<char> all(local.nbytes() * static_cast<size_t>(size()));
  world_->all_gather(local.raw(), all.data(), static_cast<int64_t>(local.nbytes()));
  std::vector<Tensor> parts;
  for (int r = 0; r < size(); ++r) {
    Tensor t(local.dtype(), local.shape());
    std::memcpy(t.raw_mutable(), all.data() + static_cast<size_t>(r) * local.nbytes(), local.nbytes());
    parts.push_back(t);
  }
  ShardingSpec s = spec;
  s.partial = 0;
  return assemble_from_ranks(parts, s, mesh_, global);
}

Status RankRuntime::check_same(const std::string& what, uint64_t hash) {
  if (!distributed()) return Status::ok();
  std::vector<uint64_t> all(static_cast<size_t>(size()));
  try {
    world_->all_gather(&hash, all.data(), sizeof(uint64_t));
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  for (int r = 1; r < size(); ++r) {
    if (all[static_cast<size_t>(r)] != all[0]) {
      return error("rank {} runs another {} than rank 0 (hash {:016x} vs {:016x})", r, what, all[static_cast<size_t>(r)], all[0]);
    }
  }
  return Status::ok();
}

double RankRuntime::global_sum_squares(const std::vector<double>& ss, const std::vector<ShardingSpec>& specs) {
  if (!distributed()) {
    double t = 0;
    for (double x : ss) t += x;
    return t;
  }
  // bucket by the set of axes that split the parameter, sum each bucket over those axes
  std::map<uint32_t, double> buckets;
  for (size_t i = 0; i < ss.size(); ++i) {
    uint32_t mask = 0;
    for (const auto& d : specs[i].dims) {
      if (d.axis >= 0) mask |= 1u << d.axis;
    }
    buckets[mask] += ss[i];
  }
  // every rank holds the same buckets (same model), so the all-reduces pair up
  double total = 0;
  for (auto& [mask, v] : buckets) {
    double x = v;
    for (int a = 0; a < mesh_.num_axes(); ++a) {
      if ((mask >> a) & 1u) axis_raw_[static_cast<size_t>(a)]->all_reduce(&x, 1, DType::kF64, ReduceOp::kSum);
    }
    total += x;
  }
  return total;
}

std::vector<std::string> RankRuntime::gather_strings(const std::string& mine) {
  if (!distributed()) return {mine};
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(size()));
  world_->all_gather(&len, lens.data(), sizeof(int64_t));
  int64_t mx = *std::max_element(lens.begin(), lens.end());
  std::string padded = mine;
  padded.resize(static_cast<size_t>(mx));
  std::vector<char> all(static_cast<size_t>(mx) * static_cast<size_t>(size()));
  if (mx > 0) world_->all_gather(padded.data(), all.data(), mx);
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r)
    out.emplace_back(all.data() + static_cast<size_t>(r) * static_cast<size_t>(mx), static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

double RankRuntime::sum(double x) {
  if (!distributed()) return x;
  world_->all_reduce(&x, 1, DType::kF64, ReduceOp::kSum);
  return x;
}

namespace {

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <class T>
T take(const std::string& in, size_t* at) {
  T v{};
  if (*at + sizeof(T) > in.size()) throw OasesError("merge_tensors: a rank sent a cut message");
  std::memcpy(&v, in.data() + *at, sizeof(T));
  *at += sizeof(T);
  return v;
}

}  // namespace

std::map<std::string, Tensor> RankRuntime::merge_tensors(const std::map<std::string, Tensor>& mine) {
  std::string msg;
  for (const auto& [name, t] : mine) {
    put<int64_t>(msg, static_cast<int64_t>(name.size()));
    msg += name;
    put<int32_t>(msg, static_cast<int32_t>(t.dtype()));
    put<int64_t>(msg, static_cast<int64_t>(t.shape().size()));
    for (int64_t d : t.shape()) put<int64_t>(msg, d);
    msg.append(static_cast<const char*>(t.raw()), t.nbytes());
  }
  std::map<std::string, Tensor> out;
  for (const std::string& m : gather_strings(msg)) {
    size_t at = 0;
    while (at < m.size()) {
      int64_t len = take<int64_t>(m, &at);
      if (len < 0 || at + static_cast<size_t>(len) > m.size()) throw OasesError("merge_tensors: a rank sent a cut message");
      std::string name = m.substr(at, static_cast<size_t>(len));
      at += static_cast<size_t>(len);
      DType dt = static_cast<DType>(take<int32_t>(m, &at));
      Shape shape(static_cast<size_t>(take<int64_t>(m, &at)));
      for (int64_t& d : shape) d = take<int64_t>(m, &at);
      Tensor t(dt, shape);
      if (at + t.nbytes() > m.size()) throw OasesError("merge_tensors: a rank sent a cut message");
      std::memcpy(t.raw_mutable(), m.data() + at, t.nbytes());
      at += t.nbytes();
      auto [it, fresh] = out.emplace(name, t);
      if (!fresh && (it->second.shape() != t.shape() || it->second.dtype() != t.dtype() ||
                     std::memcmp(it->second.raw(), t.raw(), t.nbytes()) != 0))
        throw OasesError(fmt::format("'{}' differs between two ranks that both hold it (a tied weight's copies drifted apart)", name));
    }
  }
  return out;
}

void RankRuntime::abort(const std::string& why) {
  if (comm_) comm_->abort(why);
}

}  // namespace oases
