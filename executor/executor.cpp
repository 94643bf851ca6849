#include "executor/executor.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "executor/fusion.h"
#include "kernels/cpu/parallel.h"

namespace oases {

const CpuKernelRegistry& CpuKernelRegistry::global() {
  static const CpuKernelRegistry reg = [] {
    CpuKernelRegistry r;
    register_cpu_elementwise(r);
    register_cpu_layout(r);
    register_cpu_nn(r);
    register_cpu_grad(r);
    register_cpu_fused(r);
    return r;
  }();
  return reg;
}

void CpuKernelRegistry::add(const std::string& domain, const std::string& op, CpuKernelFn fn) {
  fns_[{domain, op}] = std::move(fn);
}

const CpuKernelFn* CpuKernelRegistry::find(const std::string& domain, const std::string& op) const {
  auto it = fns_.find({domain == "ai.onnx" ? std::string() : domain, op});
  return it == fns_.end() ? nullptr : &it->second;
}

std::vector<std::string> CpuKernelRegistry::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : fns_) out.push_back(k.first.empty() ? k.second : k.first + "." + k.second);
  return out;
}

Expected<Program> compile_program(Graph g, const ExecOptions& opts) {
  Program p;
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
  const bool fuse = opts.fuse && std::getenv("OASES_NO_FUSION") == nullptr;
  if (fuse) p.fusion = fuse_for_cpu(g, order, opts.keep);
  const CpuKernelRegistry& kr = CpuKernelRegistry::global();
  for (NodeId id : order) {
    const Node& n = g.node(id);
    const CpuKernelFn* fn = kr.find(n.domain, n.op_type);
    if (!fn) return error("{}: no CPU kernel for this op", n.describe());
    for (ValueId o : n.outputs) {
      if (o != kNoId && !g.value(o).has_shape) return error("{}: output '{}' has no shape", n.describe(), g.value(o).name);
    }
    p.instrs.push_back(Instr{Instr::Kind::kCompute, id});
    p.kernels.push_back(fn);
  }
  p.memory = MemoryPlan::build(g, order, opts.keep, fuse ? MemoryPlan::InplaceFn(inplace_input) : MemoryPlan::InplaceFn());
  p.graph = std::move(g);
  return p;
}

Expected<std::unique_ptr<Executor>> Executor::create(Graph g, const ExecOptions& opts) {
  OASES_ASSIGN_OR_RETURN(Program p, compile_program(std::move(g), opts));
  auto ex = std::unique_ptr<Executor>(new Executor());
  ex->prog_ = std::move(p);
  ex->arena_size_ = std::max<size_t>(64, ex->prog_.memory.arena_bytes);
  ex->arena_ = std::aligned_alloc(64, (ex->arena_size_ + 63) / 64 * 64);
  if (!ex->arena_) return error("cannot allocate the activation arena of {} bytes", ex->arena_size_);
  std::memset(ex->arena_, 0, ex->arena_size_);
  if (opts.threads > 0) kernels::set_num_threads(opts.threads);
  const Graph& gr = ex->prog_.graph;
  ex->contexts_.resize(ex->prog_.instrs.size());
  for (size_t i = 0; i < ex->prog_.instrs.size(); ++i) {
    const Node& n = gr.node(ex->prog_.instrs[i].node);
    KernelContext& c = ex->contexts_[i];
    c.graph = &gr;
    c.node = &n;
    c.state = &ex->state_;
    for (ValueId v : n.inputs) {
      TensorView tv;
      if (v != kNoId) {
        tv.dtype = gr.value(v).dtype;
        tv.shape = gr.value(v).shape;
      }
      c.in.push_back(tv);
    }
    for (ValueId v : n.outputs) {
      TensorView tv;
      if (v != kNoId) {
        tv.dtype = gr.value(v).dtype;
        tv.shape = gr.value(v).shape;
      }
      c.out.push_back(tv);
    }
  }
  return ex;
}

Executor::~Executor() { std::free(arena_); }

void* Executor::ptr_of(ValueId v) const {
  const ValueSlot& s = prog_.memory.slots[v];
  switch (s.kind) {
    case ValueSlot::Kind::kArena: return static_cast<char*>(arena_) + s.offset;
    case ValueSlot::Kind::kConstant: return const_cast<void*>(prog_.graph.value(v).constant.raw());
    case ValueSlot::Kind::kInput: return const_cast<void*>(input_ptrs_[v]);
    case ValueSlot::Kind::kView: return ptr_of(s.root);
    default: return nullptr;
  }
}

Expected<std::vector<Tensor>> Executor::run(const std::map<std::string, Tensor>& inputs) {
  OASES_RETURN_IF_ERROR(execute(inputs));
  std::vector<Tensor> outs;
  for (ValueId v : prog_.graph.outputs()) outs.push_back(read(v));
  return outs;
}

Status Executor::execute(const std::map<std::string, Tensor>& inputs) {
  const Graph& g = prog_.graph;
  input_ptrs_.assign(g.num_values(), nullptr);
  held_inputs_.clear();
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    auto it = inputs.find(val.name);
    if (it == inputs.end()) return error("input '{}' ({}{}) was not given", val.name, dtype_name(val.dtype), shape_str(val.shape));
    const Tensor& t = it->second;
    if (t.dtype() != val.dtype) {
      return error("input '{}' has type {}, the model expects {}", val.name, dtype_name(t.dtype()), dtype_name(val.dtype));
    }
    if (t.shape() != val.shape) {
      return error("input '{}' has shape {}, the model was prepared for {}", val.name, shape_str(t.shape()), shape_str(val.shape));
    }
    held_inputs_.push_back(t);
    input_ptrs_[v] = t.raw();
  }
  if (profiling_) node_ms_.assign(prog_.instrs.size(), 0.0);
  try {
    for (size_t i = 0; i < prog_.instrs.size(); ++i) {
      KernelContext& c = contexts_[i];
      const Node& n = *c.node;
      for (size_t s = 0; s < n.inputs.size(); ++s) c.in[s].data = n.inputs[s] == kNoId ? nullptr : ptr_of(n.inputs[s]);
      for (size_t s = 0; s < n.outputs.size(); ++s) c.out[s].data = n.outputs[s] == kNoId ? nullptr : ptr_of(n.outputs[s]);
      if (profiling_) {
        auto t0 = std::chrono::steady_clock::now();
        (*prog_.kernels[i])(c);
        node_ms_[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      } else {
        (*prog_.kernels[i])(c);
      }
    }
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  return Status::ok();
}

TensorView Executor::view(ValueId v) const {
  const Value& val = prog_.graph.value(v);
  return TensorView{val.dtype, val.shape, ptr_of(v)};
}

Tensor Executor::read(ValueId v) const {
  const Value& val = prog_.graph.value(v);
  if (val.is_constant()) return val.constant.clone();
  Tensor t(val.dtype, val.shape);
  const void* p = ptr_of(v);
  if (p && t.nbytes()) std::memcpy(t.raw_mutable(), p, t.nbytes());
  return t;
}

Expected<std::vector<Tensor>> CpuEvaluator::evaluate(const Graph& g, const Node& node, const std::vector<Tensor>& inputs) const {
  const CpuKernelFn* fn = CpuKernelRegistry::global().find(node.domain, node.op_type);
  if (!fn) return error("{}: no CPU kernel", node.describe());
  KernelContext c;
  c.graph = &g;
  c.node = &node;
  RunState st;
  c.state = &st;
  for (const Tensor& t : inputs) {
    TensorView tv;
    if (t.defined()) {
      tv.dtype = t.dtype();
      tv.shape = t.shape();
      tv.data = const_cast<void*>(t.raw());
    }
    c.in.push_back(tv);
  }
  std::vector<Tensor> outs;
  for (ValueId o : node.outputs) {
    if (o == kNoId) {
      outs.emplace_back();
      c.out.emplace_back();
      continue;
    }
    const Value& v = g.value(o);
    outs.emplace_back(v.dtype, v.shape);
    c.out.push_back(TensorView{v.dtype, v.shape, outs.back().raw_mutable()});
  }
  try {
    (*fn)(c);
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  return outs;
}

}  // namespace oases
