#include "executor/training.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>

#include <fmt/ranges.h>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "graph/autodiff.h"
#include "graph/parameters.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

bool is_scalar_float(const Value& v) {
  return is_floating(v.dtype) && v.numel() == 1 && v.shape.size() <= 1;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

Expected<TrainingGraph> build_training_graph(Graph g, const TrainingSpec& spec) {
  TrainingGraph tg;
  tg.roles = classify_initializers(g);
  OASES_RETURN_IF_ERROR(apply_parameter_overrides(g, tg.roles, spec.train, spec.freeze));
  if (spec.loss != "auto" && spec.loss != "cross_entropy") return error("unknown loss '{}' (auto or cross_entropy)", spec.loss);
  ValueId loss = kNoId, logits = kNoId;
  for (ValueId o : g.outputs()) {
    const Value& v = g.value(o);
    if (is_scalar_float(v) && loss == kNoId) loss = o;
    if (is_floating(v.dtype) && v.shape.size() >= 2 && logits == kNoId) logits = o;
  }
  if (spec.loss == "cross_entropy" || loss == kNoId) {
    if (logits == kNoId) {
      std::vector<std::string> outs;
      for (ValueId o : g.outputs()) outs.push_back(describe_value(g, o));
      return error(
          "the model has no scalar output to use as the loss and no logits output [..., V] to attach a "
          "cross-entropy loss to (outputs: {})",
          fmt::join(outs, ", "));
    }
    const Shape ls = g.value(logits).shape;
    if (shape_numel(ls) == 0) return error("logits output {} is empty: no cross-entropy loss to train on", describe_value(g, logits));
    int64_t vocab = ls.back();
    int64_t rows = shape_numel(ls) / vocab;
    Shape tshape(ls.begin(), ls.end() - 1);
    tg.targets = g.add_input("oases_targets", DType::kI64, tshape);
    auto add = [&](const std::string& op, std::vector<ValueId> ins, AttrMap a, DType dt, Shape s) {
      ValueId out = g.add_value(g.unique_name("oases_loss/" + op), dt, s, true);
      NodeId n = g.add_node(op, ins, {out}, std::move(a), g.unique_name("oases_loss/" + op));
      g.node(n).phase = Node::Phase::kLoss;
      g.node(n).scope = "loss";
      return out;
    };
    ValueId l2 = add("Reshape", {logits}, AttrMap{{"shape", Attribute::of_ints({rows, vocab})}}, g.value(logits).dtype, {rows, vocab});
    ValueId t2 = add("Reshape", {tg.targets}, AttrMap{{"shape", Attribute::of_ints({rows})}}, DType::kI64, {rows});
    loss = add("SoftmaxCrossEntropyLoss", {l2, t2},
               AttrMap{{"reduction", Attribute::of_string("mean")}, {"ignore_index", Attribute::of_int(spec.ignore_index)}},
               g.value(logits).dtype, {});
    tg.appended_loss = true;
    tg.vocab = vocab;
  }
  if (!is_floating(g.value(loss).dtype)) return error("loss '{}' is not floating-point", g.value(loss).name);
  {
    // sum / count instead of a mean: the same value, and a form that splits over data-parallel ranks
    auto rw = make_loss_sum_over_count_pass()->run(g);
    if (!rw) return rw.status();
  }
  if (spec.before_autodiff) {
    g.set_outputs({loss});
    OASES_ASSIGN_OR_RETURN(g, spec.before_autodiff(std::move(g)));
    loss = g.outputs().at(0);
  }

  // parameters vs buffers (graph/parameters.h), decided on the forward graph the exporter wrote;
  // the ValueIds of initializers survive the loss and before_autodiff rewrites
  std::vector<ValueId> candidates;
  for (const InitializerRole& r : tg.roles) {
    const Value& val = g.value(r.value);
    if (!r.trainable || val.dtype != DType::kF32) {
      tg.frozen.push_back(val.name);
      continue;
    }
    candidates.push_back(r.value);
  }
  if (candidates.empty()) {
    return error("there is no float32 initializer to train{}", tg.frozen.empty() ? "" : fmt::format(" ({} are frozen)", tg.frozen.size()));
  }
  OASES_ASSIGN_OR_RETURN(BackwardResult bw, build_backward(g, loss, candidates));
  std::vector<ValueId> outs{loss};
  for (ValueId p : candidates) {
    auto it = bw.grads.find(p);
    if (it == bw.grads.end()) {
      tg.frozen.push_back(g.value(p).name);  // does not influence the loss
      for (InitializerRole& r : tg.roles) {
        if (r.value == p) {
          r.trainable = false;
          r.reason = "does not influence the loss";
        }
      }
      continue;
    }
    tg.params.push_back(p);
    tg.grads.push_back(it->second);
    outs.push_back(it->second);
  }
  if (tg.params.empty()) return Status::error("no float32 initializer influences the loss");
  g.set_outputs(outs);
  DeadCodePass dce;
  auto d = dce.run(g);
  if (!d) return d.status();
  tg.loss = loss;
  tg.graph = std::move(g);
  return tg;
}

Expected<std::vector<InputRole>> input_roles(const Graph& g, ValueId appended_targets) {
  std::vector<InputRole> roles;
  bool have_tokens = false;
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    InputRole r;
    r.value = v;
    r.name = val.name;
    std::string n = lower(val.name);
    if (val.name == "oases_loss_scale") continue;  // fed by the Trainer (mixed precision)
    if (!is_integer(val.dtype)) {
      return error("input '{}' is {}: token batches can only feed integer inputs (use --inputs DIR to feed it)", val.name,
                   dtype_name(val.dtype));
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
  if (!have_tokens) return Status::error("the model has no integer input to feed token ids to");
  return roles;
}

std::map<std::string, Tensor> feeds_for_batch(const Graph& g, const std::vector<InputRole>& roles, const Batch& b) {
  std::map<std::string, Tensor> feeds;
  for (const InputRole& r : roles) {
    const Value& v = g.value(r.value);
    Tensor t(v.dtype, v.shape);
    int64_t n = t.numel();
    int64_t seq = v.shape.empty() ? 1 : v.shape.back();
    for (int64_t i = 0; i < n; ++i) {
      double x = 0;
      switch (r.kind) {
        case InputRole::kTokens:
        case InputRole::kDecoderTokens:
          x = static_cast<double>(b.inputs[static_cast<size_t>(i % static_cast<int64_t>(b.inputs.size()))]);
          break;
        case InputRole::kTargets:
          x = static_cast<double>(b.targets[static_cast<size_t>(i % static_cast<int64_t>(b.targets.size()))]);
          break;
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
  auto tr = std::unique_ptr<Trainer>(new Trainer(std::move(opt)));
  OASES_ASSIGN_OR_RETURN(tr->train_, Executor::create(tg.graph, eo));
  // the evaluation executor is made on first use (its arena is not needed otherwise); the
  // schedule is the training program's, evaluation runs in line
  tr->exec_opts_ = eo;
  tr->exec_opts_.order.clear();
  for (ValueId p : tg.params) tr->opt_.add(tg.graph.value(p).name, tr->train_->constant_storage(p));
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

Status Trainer::run_micro(const std::map<std::string, Tensor>& feeds, bool accumulate, double* loss) {
  train_->state().training = true;
  std::map<std::string, Tensor> buf;
  OASES_RETURN_IF_ERROR(train_->execute(with_loss_scale(train_->graph(), feeds, loss_scale_, &buf)));
  TensorView lv = train_->view(tg_.loss);
  *loss = load_as_double(lv.data, lv.dtype, 0) / (buf.empty() ? 1.0 : loss_scale_);
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
  auto t0 = std::chrono::steady_clock::now();
  if (micro.empty()) return Status::error("a step needs at least one micro-batch");
  StepStats st;
  bool accumulate = micro.size() > 1;
  micro_in_accum_ = 0;
  double total = 0;
  for (const auto& f : micro) {
    double l;
    train_->state().chunk = 0;
    OASES_RETURN_IF_ERROR(run_micro(f, accumulate, &l));
    total += l;
  }
  std::vector<const float*> grads;
  for (size_t i = 0; i < tg_.grads.size(); ++i) {
    grads.push_back(accumulate ? accum_[i].data<float>() : train_->view(tg_.grads[i]).as<float>());
  }
  bool scaled = train_->graph().find_value("oases_loss_scale") != kNoId;
  float scale = static_cast<float>(1.0 / (static_cast<double>(micro.size()) * (scaled ? loss_scale_ : 1.0)));
  if (before_update) OASES_RETURN_IF_ERROR(before_update());
  double norm = 0;
  if (global_norm) {
    std::vector<double> ss = opt_.sum_squares(grads);
    try {
      norm = global_norm(ss) * static_cast<double>(scale);
    } catch (const OasesError& e) {
      return Status::error(e.what());
    }
  } else {
    norm = opt_.grad_norm(grads, scale);
  }
  if (skip_nonfinite && !std::isfinite(norm)) {
    st.skipped = true;
    st.grad_norm = norm;
  } else {
    st.grad_norm = opt_.step_with_norm(grads, scale, norm);
  }
  st.lr = opt_.last_lr();
  st.loss = total / static_cast<double>(micro.size());
  train_->state().step++;
  st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

void Trainer::set_loss_scale(double s) {
  loss_scale_ = s;
}

Expected<double> Trainer::compute_gradients(const std::map<std::string, Tensor>& feeds) {
  double l;
  micro_in_accum_ = 0;
  accum_.clear();
  OASES_RETURN_IF_ERROR(run_micro(feeds, false, &l));
  return l;
}

Expected<double> Trainer::eval_loss(const std::map<std::string, Tensor>& feeds) {
  if (!eval_) {
    // the training graph cut down to the loss; its parameters share storage with the trainer's
    Graph eval = tg_.graph;
    eval.set_outputs({tg_.loss});
    DeadCodePass dce;
    auto d = dce.run(eval);
    if (!d) return d.status();
    OASES_ASSIGN_OR_RETURN(eval_, Executor::create(std::move(eval), exec_opts_));
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
  if (!accum_.empty() && micro_in_accum_ > 1) {
    t = accum_[i].clone();
    div *= static_cast<float>(micro_in_accum_);
  } else {
    t = train_->read(tg_.grads[i]);
  }
  if (div != 1.f) {
    float* p = t.mutable_data<float>();
    for (int64_t j = 0; j < t.numel(); ++j) p[j] /= div;
  }
  return t;
}

std::map<std::string, Tensor> Trainer::parameters() const {
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

// --- checkpoints ---------------------------------------------------------------------------

namespace {
constexpr char kMagic[8] = {'O', 'A', 'S', 'E', 'S', 'C', 'K', '1'};
constexpr uint64_t kMaxHeader = uint64_t{1} << 30;
}  // namespace

Status save_checkpoint(const Checkpoint& c, const std::string& path) {
  nlohmann::json h;
  h["format"] = "oases-checkpoint";
  h["version"] = 1;
  h["fingerprint"] = c.fingerprint;
  h["step"] = c.step;
  h["optimizer"] = {{"kind", c.optimizer_kind}, {"t", c.optimizer_t}};
  h["sampler_state"] = c.sampler_state;
  h["seed"] = c.seed;
  h["extra"] = nlohmann::json::parse(c.extra_json, nullptr, false);
  uint64_t offset = 0;
  for (const auto& [name, t] : c.tensors) {
    h["tensors"].push_back({{"name", name},
                            {"dtype", dtype_name(t.dtype())},
                            {"onnx_type", dtype_to_onnx(t.dtype())},
                            {"shape", t.shape()},
                            {"offset", offset},
                            {"bytes", t.nbytes()}});
    offset += t.nbytes();
  }
  std::string header = h.dump();
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return error("{}: cannot open for writing", tmp);
  uint64_t hl = header.size();
  bool ok = std::fwrite(kMagic, 1, 8, f) == 8 && std::fwrite(&hl, 8, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const auto& [name, t] : c.tensors) {
    if (!ok) break;
    ok = t.nbytes() == 0 || std::fwrite(t.raw(), 1, t.nbytes(), f) == t.nbytes();
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return error("{}: writing the checkpoint failed (disk full?)", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return error("{}: cannot rename {} over it", path, tmp);
  return Status::ok();
}

Expected<Checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: no such checkpoint", path);
  char magic[8];
  uint64_t hl = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&hl), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0) return error("{}: not an Oases checkpoint", path);
  if (hl > kMaxHeader) return error("{}: corrupt checkpoint header", path);
  std::string header(static_cast<size_t>(hl), '\0');
  in.read(header.data(), static_cast<std::streamsize>(hl));
  if (!in) return error("{}: truncated checkpoint", path);
  nlohmann::json h = nlohmann::json::parse(header, nullptr, false);
  if (h.is_discarded() || h.value("format", "") != "oases-checkpoint") return error("{}: corrupt checkpoint header", path);
  Checkpoint c;
  try {
    c.fingerprint = h.at("fingerprint").get<std::string>();
    c.step = h.at("step").get<int64_t>();
    c.optimizer_kind = h.at("optimizer").at("kind").get<std::string>();
    c.optimizer_t = h.at("optimizer").at("t").get<int64_t>();
    c.sampler_state = h.value("sampler_state", "");
    c.seed = h.value("seed", uint64_t{0});
    c.extra_json = h.contains("extra") ? h["extra"].dump() : "{}";
    uint64_t base = 16 + hl;
    for (const auto& e : h.value("tensors", nlohmann::json::array())) {
      DType dt = dtype_from_onnx(e.at("onnx_type").get<int>());
      Shape s = e.at("shape").get<Shape>();
      uint64_t bytes = e.at("bytes").get<uint64_t>();
      if (dt == DType::kUndefined || static_cast<uint64_t>(shape_numel(s)) * dtype_size(dt) != bytes || bytes > kMaxTensorBytes) {
        return error("{}: corrupt tensor entry '{}'", path, e.at("name").get<std::string>());
      }
      Tensor t(dt, s);
      in.seekg(static_cast<std::streamoff>(base + e.at("offset").get<uint64_t>()));
      in.read(static_cast<char*>(t.raw_mutable()), static_cast<std::streamsize>(bytes));
      if (!in) return error("{}: truncated checkpoint (tensor '{}')", path, e.at("name").get<std::string>());
      c.tensors[e.at("name").get<std::string>()] = t;
    }
  } catch (const nlohmann::json::exception& e) {
    return error("{}: corrupt checkpoint header: {}", path, e.what());
  }
  return c;
}

}  // namespace oases
