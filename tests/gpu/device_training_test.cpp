// Training state resident on the GPU (executor/device.h DeviceTrainer, kernels/cuda/optim.h):
// the multi-tensor update against the CPU kernels bit for bit, the state's round trip between the
// device and the host (checkpoints), accumulation, clipping and skipped steps against the CPU
// trainer, CUDA graph replay against direct launches. Needs a CUDA device: SKIPPED without one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/cpu/optim.h"
#include "executor/cuda/device_trainer.h"
#include "tests/gpu/gpu_test_common.h"

namespace oases {
namespace {

using gpu_test::Loaded;

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

Loaded load(const std::string& name, bool loss_scale_input = false) {
  return gpu_test::load_small_model(name, DType::kF32, loss_scale_input);
}

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

// Device copies of a few tensors with the multi-tensor tables over them.
// The multi-tensor AdamW and SGD updates give the CPU kernels' bits (no clipping: the norm's
// summation order differs between the devices), over tensors of odd sizes, one spanning several
// blocks, with and without weight decay; the norm agrees to double rounding; clipping scales alike.
TEST(DeviceOptimizer, UpdatesGiveTheCpuKernelsBits) {
  REQUIRE_GPU();
  const std::vector<int64_t> sizes = {1, 7, 1000, (1 << 16) * 2 + 3, 4096};
  for (bool adamw : {true, false}) {
    for (double clip : {0.0, 0.05}) {
      cuda::DeviceBuffers ds;
      std::vector<std::vector<float>> hp, hg, hm, hv;
      std::vector<float*> dp, dm, dv;
      std::vector<const float*> dg;
      std::vector<uint8_t> decay;
      for (size_t i = 0; i < sizes.size(); ++i) {
        hp.push_back(random_floats(sizes[i], 11 + i, 1.f));
        hg.push_back(random_floats(sizes[i], 101 + i, 1e-3f));
        hm.push_back(random_floats(sizes[i], 201 + i, 1e-4f));
        hv.push_back(random_floats(sizes[i], 301 + i, 1e-4f));
        for (float& x : hv.back()) x = x * x;
        dp.push_back(ds.put(hp.back()));
        dg.push_back(ds.put(hg.back()));
        dm.push_back(ds.put(hm.back()));
        dv.push_back(ds.put(hv.back()));
        decay.push_back(i % 2 == 0);
      }
      auto tables = cuda::multi_tensor_tables(ds, dp, dg, dm, dv, sizes, decay, cuda::kChunk);
      ASSERT_TRUE(tables) << tables.status().message();
      const cuda::MultiTensorTables& tt = *tables;
      OptimizerConfig cfg;
      cfg.kind = adamw ? "adamw" : "sgd";
      cfg.weight_decay = 0.1;
      cfg.clip = clip;
      cfg.nesterov = true;
      Optimizer host(cfg);
      for (int step = 0; step < 3; ++step) host.record_step(host.next_knobs());  // t = 4: bias corrections are not 1
      OptimizerKnobs k = host.next_knobs();
      cuda::StepScalars sc = cuda::step_scalars(k, 0.5f);
      auto* dsc = ds.put(std::vector<cuda::StepScalars>{sc});
      auto* dout = ds.alloc<cuda::StepOutcome>(1);
      auto* partials = ds.alloc<double>(static_cast<size_t>(tt.blocks));
      auto* per_tensor = ds.alloc<double>(sizes.size());
      cuda::multi_tensor_norm(tt, false, dsc, partials, per_tensor, dout, nullptr);
      cuda::multi_tensor_update(tt, false, dsc, dout, nullptr);
      CK(cudaDeviceSynchronize());
      cuda::StepOutcome out;
      CK(cudaMemcpy(&out, dout, sizeof(out), cudaMemcpyDeviceToHost));
      // the CPU: the same norm, scale and kernels
      double ss = 0;
      for (size_t i = 0; i < sizes.size(); ++i) ss += kernels::sum_squares(hg[i].data(), sizes[i]);
      double norm = std::sqrt(ss) * 0.5;
      EXPECT_NEAR(out.norm, norm, 1e-12 * norm) << "adamw " << adamw;
      EXPECT_EQ(out.skipped, 0);
      float scale = 0.5f;
      if (clip > 0 && out.norm > clip) scale = static_cast<float>(0.5 * clip / (out.norm + 1e-6));  // the device's norm: same scale
      for (size_t i = 0; i < sizes.size(); ++i) {
        float wd = decay[i] ? k.weight_decay : 0.f;
        if (adamw) {
          kernels::adamw_update(hp[i].data(), hg[i].data(), hm[i].data(), hv[i].data(), sizes[i], k.lr, k.beta1, k.beta2, k.eps, wd, k.t,
                                scale);
        } else {
          kernels::sgd_update(hp[i].data(), hg[i].data(), hm[i].data(), sizes[i], k.lr, k.momentum, wd, k.nesterov, k.first, scale);
        }
        std::vector<float> gp(hp[i].size()), gm(hm[i].size()), gv(hv[i].size());
        CK(cudaMemcpy(gp.data(), dp[i], gp.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gm.data(), dm[i], gm.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gv.data(), dv[i], gv.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::memcmp(gp.data(), hp[i].data(), gp.size() * 4), 0) << "parameter " << i << " adamw " << adamw << " clip " << clip;
        EXPECT_EQ(std::memcmp(gm.data(), hm[i].data(), gm.size() * 4), 0) << "moment " << i << " adamw " << adamw;
        if (adamw) {
          EXPECT_EQ(std::memcmp(gv.data(), hv[i].data(), gv.size() * 4), 0) << "second moment " << i;
        }
      }
    }
  }
}

std::map<std::string, Tensor> clone_all(const std::map<std::string, Tensor>& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [k, v] : m) out[k] = v.clone();
  return out;
}

void expect_same_bits(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [k, v] : a) {
    ASSERT_TRUE(b.count(k)) << what << ": " << k;
    ASSERT_EQ(v.nbytes(), b.at(k).nbytes()) << what << ": " << k;
    EXPECT_EQ(std::memcmp(v.raw(), b.at(k).raw(), v.nbytes()), 0) << what << ": " << k;
  }
}

// Restores `state` (parameters and optimizer state) into `tr` as restore_training_state does.
void restore(Trainer& tr, const std::map<std::string, Tensor>& params, const std::map<std::string, Tensor>& opt, int64_t t) {
  auto mine = tr.parameters();
  for (auto& [k, v] : mine) std::memcpy(v.raw_mutable(), params.at(k).raw(), v.nbytes());
  Status st = tr.set_optimizer_state(opt, t);
  ASSERT_TRUE(st.is_ok()) << st.message();
}

// GPU state -> host (a checkpoint) -> CPU trainer -> host -> a fresh GPU trainer -> host: every
// bit survives; the GPU trainer resumed from it computes the same next loss as the one that went
// on (the forward pass from the same bits), and the CPU one follows closely.
TEST(DeviceTraining, StateComesBackBitForBitAcrossDevices) {
  REQUIRE_GPU();
  Loaded a = load("gpt2_tiny"), b = load("gpt2_tiny"), c = load("gpt2_tiny");
  ExecOptions gpu;
  gpu.device = "cuda";
  auto ga = Trainer::create(a.tg, OptimizerConfig{}, gpu);
  ASSERT_TRUE(ga) << ga.status().message();
  EXPECT_NE((*ga)->device_notes().find("on the device"), std::string::npos) << (*ga)->device_notes();
  for (int s = 0; s < 3; ++s) ASSERT_TRUE((*ga)->step({a.feeds}));
  auto params = clone_all((*ga)->parameters());
  auto opt = clone_all((*ga)->optimizer_state());
  int64_t t = (*ga)->optimizer().steps_taken();
  EXPECT_EQ(t, 3);
  auto cpu = Trainer::create(b.tg, OptimizerConfig{});
  ASSERT_TRUE(cpu);
  restore(**cpu, params, opt, t);
  expect_same_bits((*cpu)->parameters(), params, "GPU -> CPU parameters");
  expect_same_bits((*cpu)->optimizer_state(), opt, "GPU -> CPU optimizer state");
  auto gc = Trainer::create(c.tg, OptimizerConfig{}, gpu);
  ASSERT_TRUE(gc);
  restore(**gc, (*cpu)->parameters(), (*cpu)->optimizer_state(), t);
  auto next_a = (*ga)->step({a.feeds});
  auto next_c = (*gc)->step({a.feeds});
  auto next_cpu = (*cpu)->step({a.feeds});
  ASSERT_TRUE(next_a && next_c && next_cpu);
  EXPECT_EQ(next_c->loss, next_a->loss) << "the resumed GPU trainer's forward pass saw other bits";
  EXPECT_NEAR(next_cpu->loss, next_a->loss, 1e-4 * std::abs(next_a->loss));
  // the state the resumed trainer uploaded and updated comes back: one step from the same state
  auto pa = (*ga)->parameters(), pc = (*gc)->parameters();
  for (const auto& [k, v] : pa) {
    const float* x = v.data<float>();
    const float* y = pc.at(k).data<float>();
    for (int64_t i = 0; i < v.numel(); ++i) ASSERT_NEAR(y[i], x[i], 1e-6 * (1 + std::abs(x[i]))) << k;
  }
}

// Accumulation over micro-batches, clipping that applies, weight decay and SGD with Nesterov
// momentum follow the CPU trainer; a step with non-finite gradients changes nothing on the device.
TEST(DeviceTraining, AccumulationClippingAndSkipsFollowTheCpu) {
  REQUIRE_GPU();
  for (const char* kind : {"adamw", "sgd"}) {
    Loaded a = load("gpt2_tiny", true), b = load("gpt2_tiny", true);
    OptimizerConfig cfg;
    cfg.kind = kind;
    cfg.lr = 1e-2;
    cfg.clip = 0.05;
    cfg.weight_decay = 0.1;
    cfg.nesterov = true;
    ExecOptions gpu;
    gpu.device = "cuda";
    auto x = Trainer::create(a.tg, cfg);
    auto y = Trainer::create(b.tg, cfg, gpu);
    ASSERT_TRUE(x && y);
    for (int s = 0; s < 5; ++s) {
      auto sx = (*x)->step({a.feeds, a.feeds});
      auto sy = (*y)->step({a.feeds, a.feeds});
      ASSERT_TRUE(sx) << sx.status().message();
      ASSERT_TRUE(sy) << sy.status().message();
      EXPECT_NEAR(sy->loss, sx->loss, 1e-3 * std::abs(sx->loss)) << kind << " step " << s + 1;
      EXPECT_NEAR(sy->grad_norm, sx->grad_norm, 1e-3 * sx->grad_norm) << kind << " step " << s + 1;
      EXPECT_GT(sx->grad_norm, cfg.clip) << "clipping must apply for this test to mean anything";
    }
    // the last step's accumulated gradients, each within 1e-3 of its largest element
    for (size_t i = 0; i < a.tg.params.size(); ++i) {
      Tensor gx = (*x)->gradient(i), gy = (*y)->gradient(i);
      double top = 1e-12, err = 0;
      for (int64_t j = 0; j < gx.numel(); ++j) {
        top = std::max(top, std::abs(double(gx.data<float>()[j])));
        err = std::max(err, std::abs(double(gy.data<float>()[j]) - gx.data<float>()[j]));
      }
      EXPECT_LE(err, 1e-3 * top) << kind << " " << (*x)->param_name(i);
    }
    (*y)->skip_nonfinite = true;
    (*y)->set_loss_scale(std::numeric_limits<double>::infinity());
    auto before = clone_all((*y)->parameters());
    int64_t t = (*y)->optimizer().steps_taken();
    auto st = (*y)->step({a.feeds});
    ASSERT_TRUE(st) << st.status().message();
    EXPECT_TRUE(st->skipped);
    EXPECT_EQ((*y)->optimizer().steps_taken(), t);
    expect_same_bits((*y)->parameters(), before, "a skipped step");
  }
}

// Replaying the captured graphs gives what launching the kernels one by one gives; the captured
// trainer says it replayed them.
TEST(DeviceTraining, GraphReplayMatchesDirectLaunches) {
  REQUIRE_GPU();
  Loaded a = load("gpt2_tiny"), b = load("gpt2_tiny");
  ExecOptions gpu;
  gpu.device = "cuda";
  ::setenv("OASES_CUDA_GRAPH", "0", 1);
  auto direct = Trainer::create(a.tg, OptimizerConfig{}, gpu);
  ::unsetenv("OASES_CUDA_GRAPH");
  auto graphs = Trainer::create(b.tg, OptimizerConfig{}, gpu);
  ASSERT_TRUE(direct && graphs);
  for (int s = 0; s < 6; ++s) {
    auto x = (*direct)->step({a.feeds, a.feeds});
    auto y = (*graphs)->step({a.feeds, a.feeds});
    ASSERT_TRUE(x && y);
    EXPECT_NEAR(y->loss, x->loss, 1e-6 * std::abs(x->loss)) << "step " << s + 1;
  }
  EXPECT_NE((*direct)->device_notes().find("OASES_CUDA_GRAPH=0"), std::string::npos) << (*direct)->device_notes();
  EXPECT_NE((*graphs)->device_notes().find("captured"), std::string::npos) << (*graphs)->device_notes();
  EXPECT_EQ((*graphs)->device_notes().find("off"), std::string::npos) << (*graphs)->device_notes();
  EXPECT_GT((*graphs)->peak_device_bytes(), 0u);
}

}  // namespace
}  // namespace oases
