// Measuring a CUDA device for the planner (oases-profile --backend cuda): the device's rates
// (matrix products in fp32 and in 16 bits, memory streaming, a launch) and every op of a model's
// training program at the shapes its plans give rank 0, timed on the device with CUDA events.
//
// The nodes are the canonical graph's, unfused, as the planner prices them. Each distinct node
// (op, attributes and shapes: planner/profile.h node_key) runs alone, as a
// one-node program on the device: its constant inputs as the program has them (reshape targets,
// masks), float inputs random, integer inputs zero (valid indices and labels). So a plan for N
// GPUs is profiled on one: rank 0's program is built for the N ranks (its local shapes), never
// run whole, and its collectives are not timed (they need N devices; the cluster's links price
// them).
#pragma once

#include <map>
#include <string>

#include "graph/graph.h"
#include "planner/analysis.h"
#include "planner/cluster_spec.h"
#include "planner/profile.h"

namespace oases {

// The device's measured rates as a device-table entry (efficiencies 1: the rates are achieved
// ones), with its name and memory.
Expected<DeviceSpec> measure_cuda_device();
// The multi-tensor AdamW update of the device trainer, microseconds per MiB of fp32 parameters.
Expected<double> measure_cuda_optimizer();
// Samples (by node key) of every distinct compute node of rank 0's program for a uniform tp split
// over `ranks` ranks with `chunks` chunks in `dtype` (fp32 | bf16 | fp16), `reps` timed runs each
// (the median is kept). A node that cannot run alone (inputs that must hold computed shapes) is
// skipped and counted: the planner interpolates its time from the op's other samples.
struct DeviceOpsTimed {
  int timed = 0, skipped = 0;
  std::string first_error;  // of the first node skipped
};
Expected<DeviceOpsTimed> measure_model_ops_on_cuda(const Graph& forward, const std::string& model_path, const ModelAnalysis& a,
                                                   int64_t ranks, int64_t tp, int64_t chunks, const std::string& dtype, int reps,
                                                   std::map<std::string, OpSample>* acc);

}  // namespace oases
