// The training graph of a model: the forward graph with a loss (the model's scalar output, or an
// appended cross-entropy over its logits) and the generated backward pass, outputs [loss, grads...].
// A pure graph transform (graph/autodiff.h): the executor runs it, the planner partitions it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/parameters.h"

namespace oases {

struct TrainingSpec {
  std::string loss = "auto";    // auto: the model's scalar output if it has one, else cross_entropy
  int64_t ignore_index = -100;  // for the appended cross-entropy
  std::string freeze;           // ECMAScript regex of initializer names to hold fixed (wins over train)
  std::string train;            // ECMAScript regex of initializer names to train though they look like buffers
  // Runs on the forward + loss graph (outputs: [loss]) before the backward pass is made; the
  // tools use it to split the batch into micro-batch chunks (planner/chunking.h). Must keep the
  // ValueIds of initializers and inputs, and leave the loss as output 0.
  std::function<Expected<Graph>(Graph)> before_autodiff;
};

struct TrainingGraph {
  Graph graph;  // forward + loss + backward; outputs = [loss, grads...]
  ValueId loss = kNoId;
  std::vector<ValueId> params;  // trainable initializers
  std::vector<ValueId> grads;   // gradient of params[i]
  ValueId targets = kNoId;      // input added for the appended loss ("oases_targets")
  bool appended_loss = false;
  // the logits' width (appended loss), else the rows of the widest 2-D table an initializer Gather
  // reads (the token embedding of a model with its own loss): what token ids must stay below
  int64_t vocab = 0;
  std::vector<std::string> frozen;  // float initializers held fixed
  // every float initializer: trained or not, and why (graph/parameters.h; describe_parameter_split)
  std::vector<InitializerRole> roles;
};

// Adds the loss (when the model has no scalar output) and the backward pass.
Expected<TrainingGraph> build_training_graph(Graph g, const TrainingSpec& spec);

}  // namespace oases
