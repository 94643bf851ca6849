#include "tools/train_inputs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>

namespace fs = std::filesystem;

namespace oases {

Status bind_token_shapes(const TrainArgs& a, ImportOptions* opts, int64_t* batch, int64_t* seq) {
  ImportOptions probe_opts = *opts;
  probe_opts.require_bound_dims = false;
  OASES_ASSIGN_OR_RETURN(Graph probe, import_onnx_file(a.model, probe_opts));
  int64_t b = a.batch, t = a.seq;
  // token inputs [B, T]; images [B, C, H, W] (InputRole::kImage) take the batch size only
  auto is_image = [](const Value& val) { return is_floating(val.dtype) && val.shape.size() >= 3; };
  for (ValueId v : probe.inputs()) {
    const Value& val = probe.value(v);
    if (opts->input_shapes.count(val.name)) continue;
    if (is_image(val)) {
      for (size_t d = 1; d < val.shape.size(); ++d) {
        if (val.shape[d] < 0)
          return error("image input '{}' {} has a dynamic dim {}: give its shape with --dim", val.name, shape_str(val.shape), d);
      }
    } else if (!is_integer(val.dtype) || val.shape.size() != 2) {
      continue;
    }
    for (int d = 0; d < (is_image(val) ? 1 : 2); ++d) {
      int64_t fixed = val.shape[d];
      int64_t& want = d == 0 ? b : t;
      if (fixed >= 0) {
        if (want > 0 && want != fixed) {
          return error("the model fixes input '{}' to {}; give --batch {} --seq {} or export it with dynamic axes", val.name,
                       shape_str(val.shape), val.shape[0] >= 0 ? val.shape[0] : b, val.shape[1] >= 0 ? val.shape[1] : t);
        }
        want = fixed;
      }
    }
  }
  if (b <= 0) b = 8;
  if (t <= 0) t = 64;
  for (ValueId v : probe.inputs()) {
    const Value& val = probe.value(v);
    if (opts->input_shapes.count(val.name)) continue;
    if (is_integer(val.dtype) && val.shape.size() == 2) opts->input_shapes[val.name] = {b, t};
    if (is_image(val)) {
      Shape image = val.shape;
      image[0] = b;
      opts->input_shapes[val.name] = image;
    }
  }
  *batch = b;
  *seq = t;
  return Status::ok();
}

Status read_input_files(const TrainArgs& a, ImportOptions* opts, TrainSetup* s) {
  if (!fs::is_directory(a.inputs_dir)) return error("{}: no such folder", a.inputs_dir);
  std::vector<std::pair<int, std::string>> files;
  std::regex re("input_([0-9]+)\\.pb");
  for (const auto& e : fs::directory_iterator(a.inputs_dir)) {
    std::smatch m;
    std::string n = e.path().filename().string();
    if (std::regex_match(n, m, re)) files.push_back({std::stoi(m[1]), e.path().string()});
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) return error("{}: no input_N.pb files", a.inputs_dir);
  // an image classifier's targets (its logits [B, classes] give no tokens to shift)
  fs::path labels = fs::path(a.inputs_dir) / "labels.pb";
  if (fs::exists(labels)) {
    OASES_ASSIGN_OR_RETURN(auto t, read_tensor_file(labels.string()));
    if (!is_integer(t.second.dtype()) || t.second.rank() != 1) {
      return error("{}: class labels must be one integer per image, [B]; got {} {}", labels.string(), dtype_name(t.second.dtype()),
                   shape_str(t.second.shape()));
    }
    Tensor l(DType::kI64, t.second.shape());
    for (int64_t i = 0; i < l.numel(); ++i)
      l.mutable_data<int64_t>()[i] = static_cast<int64_t>(load_as_double(t.second.raw(), t.second.dtype(), i));
    s->class_labels = l;
  }
  ImportOptions probe_opts = *opts;
  probe_opts.require_bound_dims = false;
  OASES_ASSIGN_OR_RETURN(Graph probe, import_onnx_file(a.model, probe_opts));
  for (size_t i = 0; i < files.size(); ++i) {
    OASES_ASSIGN_OR_RETURN(auto t, read_tensor_file(files[i].second));
    std::string name = t.first;
    bool known = false;
    for (ValueId v : probe.inputs()) known |= probe.value(v).name == name;
    if (!known) {
      if (i >= probe.inputs().size()) return error("{} matches no model input", files[i].second);
      name = probe.value(probe.inputs()[i]).name;
    }
    s->fixed_feeds[name] = t.second;
    if (!opts->input_shapes.count(name)) opts->input_shapes[name] = t.second.shape();
    if (is_integer(t.second.dtype()) && t.second.rank() == 2 && s->batch == 0) {
      s->batch = t.second.shape()[0];
      s->seq = t.second.shape()[1];
    }
  }
  return Status::ok();
}

Status prepare_data(TrainSetup& s) {
  const TrainArgs& a = s.a;
  const TrainingGraph& train = s.gp().train;
  if (s.fixed_feeds.empty()) {
    auto roles = input_roles(train.graph, train.targets);
    if (!roles) return roles.status().with_context(a.model);
    s.roles = std::move(*roles);
  } else if (train.appended_loss) {
    auto token_roles = input_roles(train.graph, train.targets);
    if (!token_roles) return token_roles.status().with_context(a.model);
    const Shape& targets = train.graph.value(train.targets).shape;
    if (s.class_labels) {
      if (s.class_labels->shape() != targets) {
        return error("{}/labels.pb: {} labels, the model's targets are {}", a.inputs_dir, shape_str(s.class_labels->shape()),
                     shape_str(targets));
      }
      s.fixed_feeds["oases_targets"] = *s.class_labels;
    }
    // the decoder's input when there is one (an encoder-decoder model), else the token input
    for (InputRole::Kind kind : {InputRole::kDecoderTokens, InputRole::kTokens}) {
      for (const InputRole& r : *token_roles) {
        if (r.kind == kind && s.fixed_feeds.count(r.name) && !s.fixed_feeds.count("oases_targets")) {
          s.fixed_feeds["oases_targets"] = shifted_targets(s.fixed_feeds[r.name], a.ignore_index);
        }
      }
    }
    if (!s.fixed_feeds.count("oases_targets")) {
      if (targets.size() == 1) {
        return error(
            "{}: the logits are one row of class scores per input, so the loss needs class labels: put them in {}/labels.pb "
            "(int64 {})",
            a.model, a.inputs_dir, shape_str(targets));
      }
      return Status::error("cannot derive next-token targets from --inputs");
    }
  }
  if (!a.data.empty() || a.synthetic) {
    if (a.synthetic) {
      s.data = synthetic_tokens(std::max<int64_t>(1 << 20, (s.batch * (s.seq + 1)) * 16), std::max<int64_t>(s.vocab, 2), a.seed);
    } else {
      OASES_ASSIGN_OR_RETURN(s.data, load_tokens(a.data));
    }
    if (s.vocab > 0) OASES_RETURN_IF_ERROR(check_vocab(s.data, s.vocab));
    int64_t n = static_cast<int64_t>(s.data.tokens.size());
    s.split = n - static_cast<int64_t>(std::floor(static_cast<double>(n) * a.val_fraction));
    if (s.split < s.seq + 1) {
      return error("{}: {} tokens ({} after holding out {:.0f}% for validation) are fewer than one batch row of {} tokens",
                   a.synthetic ? "synthetic data" : a.data, n, s.split, a.val_fraction * 100, s.seq + 1);
    }
    s.have_val = n - s.split >= s.seq + 1;
  }
  return Status::ok();
}

}  // namespace oases
