// The model summary oases-import prints: metadata, inputs and outputs, op histograms, parameters,
// FLOPs, transformer blocks. As JSON for programs, text and Graphviz DOT for people.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tools/model_loader.h"

namespace oases {

nlohmann::json model_summary_json(const LoadedModel& m, const std::string& path);
std::string model_summary_text(const nlohmann::json& s, bool verbose);
std::string graph_to_dot(const Graph& g);

}  // namespace oases
