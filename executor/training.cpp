#include "executor/training.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>

#include <fmt/ranges.h>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "executor/checkpoint.h"
#include "graph/autodiff.h"
#include "graph/blocks.h"
#include "graph/parameters.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

namespace {

// "nan" whatever its sign bit (fmt writes "-nan"), "inf", "-inf"
std::string non_finite_name(double x) {
  return std::isnan(x) ? "nan" : fmt::format("{}", x);
}

}  // namespace

void CheckpointGuard::after_step(int64_t step, double loss, bool updated) {
  if (updated) {
    // a new state: what was seen of the old one no longer holds
    refusal_.clear();
    validated_ = false;
  }
  if (!std::isfinite(loss)) {
    refusal_ = updated ? fmt::format("the loss at step {} is {}", step, non_finite_name(loss))
                       : fmt::format("the loss at step {} is {} and its update was skipped", step, non_finite_name(loss));
  }
}

void CheckpointGuard::after_validation(int64_t step, double loss) {
  validated_ = true;
  if (!std::isfinite(loss)) refusal_ = fmt::format("the validation loss after step {} is {}", step, non_finite_name(loss));
}

Status CheckpointGuard::refuse_save(const std::vector<std::string>& refusals, const std::string& path) {
  for (const std::string& why : refusals) {
    if (!why.empty()) return error("{}: not written: {} (a checkpoint is never saved from a non-finite state)", path, why);
  }
  return Status::ok();
}

Expected<std::vector<InputRole>> input_roles(const Graph& g, ValueId appended_targets) {
  std::vector<InputRole> roles;
  bool have_tokens = false, have_images = false;
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    InputRole r;
    r.value = v;
    r.name = val.name;
    std::string n = lower(val.name);
    if (val.name == "oases_loss_scale") continue;  // fed by the Trainer (mixed precision)
    if (is_floating(val.dtype) && val.shape.size() >= 3) {
      r.kind = InputRole::kImage;
      have_images = true;
      roles.push_back(r);
      continue;
    }
    if (!is_integer(val.dtype)) {
      return error("input '{}' is {} {}: token batches feed integer inputs and float images [B, C, H, W] (use --inputs DIR to feed it)",
                   val.name, dtype_name(val.dtype), shape_str(val.shape));
    }
    if (v == appended_targets || n.find("label") != std::string::npos || n.find("target") != std::string::npos) {
      r.kind = InputRole::kTargets;
    } else if (n.find("decoder_input") != std::string::npos) {
      // an encoder-decoder model (T5, BART): the decoder reads the sequence it predicts, so its
      // targets are its own inputs shifted left (decoder_input_ids[t] = targets[t - 1])
      r.kind = InputRole::kDecoderTokens;
    } else if (n.find("mask") != std::string::npos) {
      r.kind = InputRole::kOnes;
    } else if (n.find("position") != std::string::npos) {
      r.kind = InputRole::kPositions;
    } else if (n.find("token_type") != std::string::npos || n.find("segment") != std::string::npos) {
      r.kind = InputRole::kZeros;
    } else if (!have_tokens) {
      r.kind = InputRole::kTokens;
      have_tokens = true;
    } else {
      return error("cannot tell how to feed input '{}' from token batches (use --inputs DIR)", val.name);
    }
    roles.push_back(r);
  }
  if (!have_tokens && !have_images) return Status::error("the model has no integer input to feed token ids to, nor a float image input");
  return roles;
}

namespace {

// Standard normal pixels for image input `t` [B, ...]: row r from a generator seeded by the
// tokens of batch row r (see InputRole::kImage).
void fill_images(Tensor& t, const Batch& b) {
  int64_t rows = t.shape()[0], per = t.numel() / std::max<int64_t>(rows, 1);
  int64_t width = b.seq > 0 ? b.seq : static_cast<int64_t>(b.inputs.size());
  for (int64_t r = 0; r < rows; ++r) {
    uint64_t seed = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(r);
    for (int64_t j = 0; j < width && !b.inputs.empty(); ++j) {
      uint64_t tok = static_cast<uint64_t>(b.inputs[static_cast<size_t>((r * width + j) % static_cast<int64_t>(b.inputs.size()))]);
      seed = (seed ^ tok) * 0x100000001B3ull;
    }
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int64_t i = 0; i < per; ++i) store_from_double(t.raw_mutable(), t.dtype(), r * per + i, normal(gen));
  }
}

}  // namespace

std::map<std::string, Tensor> feeds_for_batch(const Graph& g, const std::vector<InputRole>& roles, const Batch& b) {
  std::map<std::string, Tensor> feeds;
  for (const InputRole& r : roles) {
    const Value& v = g.value(r.value);
    Tensor t(v.dtype, v.shape);
    if (r.kind == InputRole::kImage) {
      fill_images(t, b);
      feeds[r.name] = t;
      continue;
    }
    int64_t n = t.numel();
    int64_t seq = v.shape.empty() ? 1 : v.shape.back();
    // one label per row (an image classifier's [B] targets): the row's first target token
    bool per_row = r.kind == InputRole::kTargets && v.shape.size() == 1 && b.seq > 0;
    for (int64_t i = 0; i < n; ++i) {
      double x = 0;
      switch (r.kind) {
        case InputRole::kTokens:
        case InputRole::kDecoderTokens:
          x = static_cast<double>(b.inputs[static_cast<size_t>(i % static_cast<int64_t>(b.inputs.size()))]);
          break;
        case InputRole::kTargets: {
          int64_t at = per_row ? i * b.seq : i;
          x = static_cast<double>(b.targets[static_cast<size_t>(at % static_cast<int64_t>(b.targets.size()))]);
          break;
        }
        case InputRole::kImage: break;  // filled above
        case InputRole::kOnes: x = 1; break;
        case InputRole::kPositions: x = static_cast<double>(i % seq); break;
        case InputRole::kZeros: x = 0; break;
      }
      store_from_double(t.raw_mutable(), v.dtype, i, x);
    }
    feeds[r.name] = t;
  }
  return feeds;
}

Tensor shifted_targets(const Tensor& tokens, int64_t ignore_index) {
  Tensor t(DType::kI64, tokens.shape());
  int64_t seq = tokens.shape().empty() ? 1 : tokens.shape().back();
  int64_t n = tokens.numel();
  for (int64_t i = 0; i < n; ++i) {
    bool last = (i % seq) == seq - 1;
    t.mutable_data<int64_t>()[i] = last ? ignore_index : static_cast<int64_t>(load_as_double(tokens.raw(), tokens.dtype(), i + 1));
  }
  return t;
}

Expected<std::unique_ptr<Trainer>> Trainer::create(TrainingGraph tg, OptimizerConfig opt, int threads) {
  ExecOptions eo;
  eo.threads = threads;
  return create(std::move(tg), std::move(opt), eo);
}

Expected<std::unique_ptr<Trainer>> Trainer::create(TrainingGraph tg, OptimizerConfig opt, const ExecOptions& eo) {
  OASES_ASSIGN_OR_RETURN(Program compiled, compile_program(tg.graph, eo));
  return create(std::move(tg), std::move(opt), eo, std::move(compiled));
}

Expected<std::unique_ptr<Trainer>> Trainer::create(TrainingGraph tg, OptimizerConfig opt, const ExecOptions& eo, Program compiled) {
  auto tr = std::unique_ptr<Trainer>(new Trainer(std::move(opt)));
  OASES_ASSIGN_OR_RETURN(tr->train_, Executor::create(std::move(compiled), eo));
  // the evaluation executor is made on first use (its arena is not needed otherwise); the
  // schedule is the training program's, evaluation runs in line
  tr->exec_opts_ = eo;
  tr->exec_opts_.order.clear();
  for (ValueId p : tg.params) tr->opt_.add(tg.graph.value(p).name, tr->train_->constant_storage(p));
  OASES_ASSIGN_OR_RETURN(tr->zero_, ZeroShards::find(tr->train_->graph(), tg.params, tg.grads, eo.groups));
  for (size_t i = 0; i < tr->zero_.size(); ++i) {
    if (const auto& z = tr->zero_.piece(i)) tr->opt_.set_range(i, z->offset, z->length);
  }
  if (tr->zero_.any() && tr->train_->device_runner()) {
    return Status::error("the distributed optimizer (--zero 1) keeps its state on the host's ranks; the device trainer does not run it yet");
  }
  if (DeviceRunner* dr = tr->train_->device_runner()) {
    auto dt = make_device_trainer(*dr, tr->train_->graph(), tg.params, tg.grads, tg.loss, tr->opt_);
    if (dt) {
      tr->dev_ = std::move(*dt);
    } else {
      tr->device_notes_ = "training state on the host (" + dt.status().message() + ")";
    }
  }
  tr->tg_ = std::move(tg);
  return tr;
}

namespace {
// Feeds plus the loss-scale input when the graph has one (graph/passes/mixed_precision.h).
const std::map<std::string, Tensor>& with_loss_scale(const Graph& g, const std::map<std::string, Tensor>& feeds, double s,
                                                     std::map<std::string, Tensor>* buf) {
  if (g.find_value("oases_loss_scale") == kNoId || !g.value(g.find_value("oases_loss_scale")).is_input) return feeds;
  *buf = feeds;
  Tensor t(DType::kF32, {});
  t.mutable_data<float>()[0] = static_cast<float>(s);
  (*buf)["oases_loss_scale"] = t;
  return *buf;
}
}  // namespace

const std::vector<Executor::ConstantWrite>& Trainer::gather_writes() {
  if (!gather_writes_.empty() || !zero_.any()) return gather_writes_;
  std::vector<Tensor*> params;
  for (size_t i = 0; i < opt_.size(); ++i) params.push_back(&opt_.value(i));
  // each parameter's first reader in the program and its block: buckets in order of use, one block each
  const Program& prog = train_->program();
  std::vector<int64_t> first_use(params.size(), static_cast<int64_t>(prog.instrs.size()));
  std::vector<int> block(params.size(), -1);
  std::map<ValueId, size_t> index;
  for (size_t i = 0; i < tg_.params.size(); ++i) index.emplace(tg_.params[i], i);
  for (size_t k = prog.instrs.size(); k-- > 0;) {
    const Node& n = prog.graph.node(prog.instrs[k].node);
    for (ValueId v : n.inputs) {
      auto it = index.find(v);
      if (it == index.end()) continue;
      first_use[it->second] = static_cast<int64_t>(k);
      block[it->second] = block_of_scope(n.scope);
    }
  }
  for (ZeroShards::GatherBucket& b : zero_.gather_buckets(params, first_use, block)) {
    Executor::ConstantWrite w;
    for (size_t i : b.params) w.writes.push_back(tg_.params[i]);
    w.run = std::move(b.run);
    gather_writes_.push_back(std::move(w));
  }
  return gather_writes_;
}

void Trainer::hand_gathers_to_next_run() {
  if (!gathers_pending_) return;
  gathers_pending_ = false;
  train_->defer_constant_writes(gather_writes());
}

void Trainer::finish_gathers() {
  if (!gathers_pending_) return;
  gathers_pending_ = false;
  for (const Executor::ConstantWrite& w : gather_writes()) w.run();
}

Status Trainer::run_micro(const std::map<std::string, Tensor>& feeds, bool accumulate, double* loss, bool training) {
  train_->state().training = training;
  hand_gathers_to_next_run();
  std::map<std::string, Tensor> buf;
  OASES_RETURN_IF_ERROR(train_->execute(with_loss_scale(train_->graph(), feeds, loss_scale_, &buf)));
  *loss = 0;  // a pipeline stage before the last has no loss
  if (tg_.loss != kNoId) {
    TensorView lv = train_->view(tg_.loss);
    *loss = load_as_double(lv.data, lv.dtype, 0) / (buf.empty() ? 1.0 : loss_scale_);
  }
  if (accumulate) {
    if (accum_.empty()) {
      for (ValueId gv : tg_.grads) accum_.emplace_back(DType::kF32, tg_.graph.value(gv).shape);
    }
    for (size_t i = 0; i < tg_.grads.size(); ++i) {
      TensorView g = train_->view(tg_.grads[i]);
      float* a = accum_[i].mutable_data<float>();
      const float* s = g.as<float>();
      int64_t n = g.numel();
      if (micro_in_accum_ == 0) {
        std::memcpy(a, s, static_cast<size_t>(n) * 4);
      } else {
        for (int64_t j = 0; j < n; ++j) a[j] += s[j];
      }
    }
    ++micro_in_accum_;
  }
  return Status::ok();
}

Expected<StepStats> Trainer::step(const std::vector<std::map<std::string, Tensor>>& micro, const std::function<Status()>& before_update) {
  if (micro.empty()) return Status::error("a step needs at least one micro-batch");
  if (dev_) return device_step(micro, before_update);
  auto t0 = std::chrono::steady_clock::now();
  StepStats st;
  bool accumulate = micro.size() > 1;
  micro_in_accum_ = 0;
  double total = 0;
  for (const auto& f : micro) {
    double l;
    train_->state().chunk = 0;
    auto r0 = std::chrono::steady_clock::now();
    OASES_RETURN_IF_ERROR(run_micro(f, accumulate, &l));
    st.run_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count();
    total += l;
  }
  std::vector<const float*> grads;
  for (size_t i = 0; i < tg_.grads.size(); ++i) {
    grads.push_back(accumulate ? accum_[i].data<float>() : train_->view(tg_.grads[i]).as<float>());
    const auto& z = zero_.piece(i);
    if (z && z->whole_gradient) grads.back() += z->offset;  // the update reads its piece of the whole gradient
  }
  bool scaled = train_->graph().find_value("oases_loss_scale") != kNoId;
  float scale = static_cast<float>(1.0 / (static_cast<double>(micro.size()) * (scaled ? loss_scale_ : 1.0)));
  if (before_update) OASES_RETURN_IF_ERROR(before_update());
  // the update's spans in the trace (--trace): this rank's compute outside the program, and its
  // wait for the other ranks' sums of squares (a pipeline's stages, a ZeRO group)
  Executor& ex = *train_;
  double mark_us = ex.now_us();
  auto mark = [&](const char* label, const char* category) {
    double now = ex.now_us();
    ex.add_event(TraceEvent{kNoId, 0, category, mark_us, now - mark_us, label});
    mark_us = now;
  };
  double norm = 0;
  double loss = total / static_cast<double>(micro.size());
  bool bad_loss = skip_nonfinite && !std::isfinite(loss);
  if (global_norm || zero_.any()) {
    std::vector<double> ss = opt_.sum_squares(grads);
    mark("gradient norm", "compute");
    if (bad_loss) ss.assign(ss.size(), NAN);
    try {
      zero_.sum_over_groups(&ss);  // a piece's Σ g² summed over its group: the whole gradient's
      if (global_norm) {
        norm = global_norm(ss) * static_cast<double>(scale);
      } else {
        double total = 0;
        for (double x : ss) total += x;
        norm = std::sqrt(total) * static_cast<double>(scale);
      }
    } catch (const OasesError& e) {
      return Status::error(e.what());
    }
    mark("wait gradient norm", "wait");
  } else {
    norm = opt_.grad_norm(grads, scale);
    if (bad_loss) norm = NAN;
    mark("gradient norm", "compute");
  }
  if (skip_nonfinite && !std::isfinite(norm)) {
    st.skipped = true;
    st.grad_norm = norm;
  } else {
    st.grad_norm = opt_.step_with_norm(grads, scale, norm);
    // every member's updated piece back into every rank's whole parameters: by the next run,
    // beside its first instructions (hand_gathers_to_next_run), or when something reads them first
    if (zero_.any()) gathers_pending_ = true;
    train_->constants_changed();  // a device program without resident state uploads them again
    mark("optimizer step", "compute");
  }
  st.lr = opt_.last_lr();
  st.loss = loss;
  train_->state().step++;
  st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  st.update_ms = st.ms - st.run_ms;
  // the whole step, around its spans: where one step ends and the next begins in the trace
  ex.add_event(TraceEvent{kNoId, 0, "step", ex.now_us() - 1000.0 * st.ms, 1000.0 * st.ms, fmt::format("step {}", train_->state().step)});
  return st;
}

Expected<StepStats> Trainer::device_step(const std::vector<std::map<std::string, Tensor>>& micro,
                                         const std::function<Status()>& before_update) {
  auto t0 = std::chrono::steady_clock::now();
  StepStats st;
  OASES_RETURN_IF_ERROR(push_to_device());
  const int count = static_cast<int>(micro.size());
  const bool scaled = train_->graph().find_value("oases_loss_scale") != kNoId;
  const float scale = static_cast<float>(1.0 / (static_cast<double>(count) * (scaled ? loss_scale_ : 1.0)));
  train_->state().training = true;
  try {
    const bool timed = train_->node_timing() || train_->tracing();
    double origin = 0;  // the last micro-batch's enqueue: its spans are the ones read back
    for (int m = 0; m < count; ++m) {
      std::map<std::string, Tensor> buf;
      const auto& feeds = with_loss_scale(train_->graph(), micro[static_cast<size_t>(m)], loss_scale_, &buf);
      OASES_ASSIGN_OR_RETURN(std::vector<const void*> ptrs, train_->input_pointers(feeds));
      train_->state().chunk = 0;
      origin = train_->now_us();
      dev_->micro_batch(ptrs, m, count, timed);
    }
    device_grads_ = true;
    micro_in_accum_ = count;
    accum_.clear();
    DeviceStepPlan plan;
    plan.knobs = opt_.next_knobs();
    plan.grad_scale = scale;
    plan.skip_nonfinite = skip_nonfinite;
    double host_norm = 0;
    const double* norm_from_host = nullptr;
    if (before_update || global_norm) {
      double loss_sum = 0;
      std::vector<double> ss = dev_->sum_squares(&loss_sum);
      if (before_update) OASES_RETURN_IF_ERROR(before_update());
      if (global_norm) {
        if (skip_nonfinite && !std::isfinite(loss_sum)) ss.assign(ss.size(), NAN);
        host_norm = global_norm(ss) * static_cast<double>(scale);
        norm_from_host = &host_norm;
      }
    }
    DeviceStepOutcome out = dev_->update(plan, norm_from_host);
    host_stale_ = true;
    if (!out.skipped) opt_.record_step(plan.knobs);
    st.skipped = out.skipped;
    st.grad_norm = out.norm;
    st.loss = out.loss_sum / (scaled ? loss_scale_ : 1.0) / static_cast<double>(count);
    st.run_ms = out.run_ms;
    st.update_ms = out.update_ms;
    st.device = true;
    if (train_->node_timing()) {
      std::vector<double> ms;
      train_->device_runner()->read_timing(&ms);
      train_->set_node_ms(std::move(ms));
    }
    if (train_->tracing()) train_->add_device_events(origin);
  } catch (const OasesError& e) {
    return Status::error(e.what());
  } catch (const std::exception& e) {
    return Status::error(e.what());
  }
  st.lr = opt_.last_lr();
  train_->state().step++;
  st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

void Trainer::host_state(std::vector<Tensor*>* params, std::vector<std::vector<Tensor*>>* moments) {
  for (size_t i = 0; i < opt_.size(); ++i) {
    params->push_back(&opt_.value(i));
    moments->push_back(opt_.moments(i));
  }
}

void Trainer::pull_from_device() {
  if (!dev_ || !host_stale_) return;
  std::vector<Tensor*> params;
  std::vector<std::vector<Tensor*>> moments;
  host_state(&params, &moments);
  dev_->download(params, moments);
  host_stale_ = false;
}

Status Trainer::push_to_device() {
  if (!dev_ || !device_stale_) return Status::ok();
  std::vector<Tensor*> params;
  std::vector<std::vector<Tensor*>> moments;
  host_state(&params, &moments);
  try {
    dev_->upload(params, moments);
  } catch (const std::exception& e) {
    return Status::error(e.what());
  }
  device_stale_ = false;
  return Status::ok();
}

void Trainer::zero_whole_gradients(CommGroup* group, const std::vector<bool>& replicated) {
  for (size_t i = 0; i < opt_.size() && i < replicated.size(); ++i) {
    if (!replicated[i] || zero_.piece(i)) continue;
    zero_.add_whole(i, group, opt_.value(i).numel());
    if (const auto& z = zero_.piece(i)) opt_.set_range(i, z->offset, z->length);
  }
}

std::map<std::string, Tensor> Trainer::optimizer_state() {
  pull_from_device();
  std::map<std::string, Tensor> s = opt_.state();
  // the pieces made whole, parameter by parameter in order (every member of a group the same)
  for (size_t i = 0; i < zero_.size(); ++i) {
    if (!zero_.piece(i)) continue;
    const Tensor& value = opt_.value(i);
    for (const char* suffix : kOptimizerStateSuffixes) {
      auto it = s.find(param_name(i) + suffix);
      if (it != s.end()) it->second = zero_.gather(i, it->second.data<float>(), value.shape());
    }
  }
  return s;
}

Status Trainer::set_optimizer_state(const std::map<std::string, Tensor>& s_in, int64_t t) {
  const std::map<std::string, Tensor>* s = &s_in;
  std::map<std::string, Tensor> pieces;
  if (zero_.any()) {
    // whole tensors in, this rank's pieces kept (a tensor of another shape is left for
    // Optimizer::set_state to refuse by name)
    pieces = s_in;
    for (size_t i = 0; i < zero_.size(); ++i) {
      if (!zero_.piece(i)) continue;
      for (const char* suffix : kOptimizerStateSuffixes) {
        auto it = pieces.find(param_name(i) + suffix);
        if (it != pieces.end() && it->second.dtype() == DType::kF32 && it->second.shape() == opt_.value(i).shape()) {
          it->second = zero_.slice(i, it->second);
        }
      }
    }
    s = &pieces;
  }
  OASES_RETURN_IF_ERROR(opt_.set_state(*s, t));
  if (dev_) {
    host_stale_ = false;
    device_stale_ = true;
  } else {
    train_->constants_changed();
  }
  return Status::ok();
}

std::string Trainer::device_notes() const {
  return dev_ ? "training state on the device; " + dev_->notes() : device_notes_;
}

size_t Trainer::peak_device_bytes() const {
  return dev_ ? dev_->peak_device_bytes() : 0;
}

void Trainer::set_loss_scale(double s) {
  loss_scale_ = s;
}

Expected<double> Trainer::compute_gradients(const std::map<std::string, Tensor>& feeds) {
  double l;
  micro_in_accum_ = 0;
  accum_.clear();
  device_grads_ = false;
  OASES_RETURN_IF_ERROR(push_to_device());
  OASES_RETURN_IF_ERROR(run_micro(feeds, false, &l));
  return l;
}

Expected<double> Trainer::program_loss(const std::map<std::string, Tensor>& feeds) {
  double l;
  micro_in_accum_ = 0;
  accum_.clear();
  device_grads_ = false;
  OASES_RETURN_IF_ERROR(push_to_device());
  OASES_RETURN_IF_ERROR(run_micro(feeds, false, &l, false));
  return l;
}

Expected<double> Trainer::eval_loss(const std::map<std::string, Tensor>& feeds) {
  if (tg_.loss == kNoId) return Status::error("this program has no loss (a pipeline stage before the last): use program_loss");
  try {
    finish_gathers();  // the eval program reads the parameters too
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  if (!eval_) {
    // the training graph cut down to the loss; its parameters share storage with the trainer's
    Graph eval = tg_.graph;
    eval.set_outputs({tg_.loss});
    DeadCodePass dce;
    auto d = dce.run(eval);
    if (!d) return d.status();
    OASES_ASSIGN_OR_RETURN(eval_, Executor::create(std::move(eval), exec_opts_));
  }
  if (dev_) {
    // the evaluation program's constants are the host copies: bring them up to date, re-upload
    pull_from_device();
    eval_->constants_changed();
  }
  eval_->state().training = false;
  std::map<std::string, Tensor> buf;
  OASES_RETURN_IF_ERROR(eval_->execute(with_loss_scale(eval_->graph(), feeds, 1.0, &buf)));
  TensorView lv = eval_->view(eval_->graph().outputs()[0]);
  return load_as_double(lv.data, lv.dtype, 0);
}

Tensor Trainer::gradient(size_t i) const {
  Tensor t;
  bool scaled = train_->graph().find_value("oases_loss_scale") != kNoId;
  float div = scaled ? static_cast<float>(loss_scale_) : 1.f;
  if (device_grads_) {
    t = dev_->gradient(i);
    if (micro_in_accum_ > 1) div *= static_cast<float>(micro_in_accum_);
  } else if (!accum_.empty() && micro_in_accum_ > 1) {
    t = accum_[i].clone();
    div *= static_cast<float>(micro_in_accum_);
  } else {
    t = train_->read(tg_.grads[i]);
  }
  if (zero_.piece(i) && !zero_.piece(i)->whole_gradient) t = zero_.gather(i, t.data<float>(), tg_.graph.value(tg_.params[i]).shape);
  if (div != 1.f) {
    float* p = t.mutable_data<float>();
    for (int64_t j = 0; j < t.numel(); ++j) p[j] /= div;
  }
  return t;
}

std::map<std::string, Tensor> Trainer::parameters() {
  finish_gathers();
  pull_from_device();
  std::map<std::string, Tensor> m;
  for (ValueId p : tg_.params) m[tg_.graph.value(p).name] = train_->graph().value(p).constant;
  return m;
}

std::string Trainer::fingerprint() const {
  std::string s;
  for (ValueId p : tg_.params) {
    const Value& v = tg_.graph.value(p);
    s += fmt::format("{}:{}{};", v.name, dtype_name(v.dtype), shape_str(v.shape));
  }
  return s;
}

}  // namespace oases
