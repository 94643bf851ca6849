// Plans rendered for people: one self-contained HTML page (no network: inline CSS and SVG) with
// every transformer block drawn as a lane of its layers coloured by split and its collectives
// marked, and a Graphviz DOT of the same.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace oases {

std::string plan_to_html(const nlohmann::json& plan);
std::string plan_to_dot(const nlohmann::json& plan);

}  // namespace oases
