#include "graph/attribute.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace oases {

std::string Attribute::to_string() const {
  switch (kind) {
    case Kind::kInt: return std::to_string(i);
    case Kind::kFloat: return fmt::format("{}", f);
    case Kind::kString: return fmt::format("\"{}\"", s);
    case Kind::kInts: return fmt::format("[{}]", fmt::join(ints, ", "));
    case Kind::kFloats: return fmt::format("[{}]", fmt::join(floats, ", "));
    case Kind::kStrings: return fmt::format("[{}]", fmt::join(strings, ", "));
    case Kind::kTensor: return fmt::format("tensor<{}>{}", dtype_name(t.dtype()), shape_str(t.shape()));
  }
  return "?";
}

int64_t AttrMap::get_int(const std::string& name, int64_t def) const {
  const Attribute* a = find(name);
  if (!a) return def;
  if (a->kind == Attribute::Kind::kFloat) return static_cast<int64_t>(a->f);
  return a->i;
}

float AttrMap::get_float(const std::string& name, float def) const {
  const Attribute* a = find(name);
  if (!a) return def;
  if (a->kind == Attribute::Kind::kInt) return static_cast<float>(a->i);
  return a->f;
}

std::string AttrMap::get_string(const std::string& name, const std::string& def) const {
  const Attribute* a = find(name);
  return a ? a->s : def;
}

std::vector<int64_t> AttrMap::get_ints(const std::string& name, const std::vector<int64_t>& def) const {
  const Attribute* a = find(name);
  if (!a) return def;
  if (a->kind == Attribute::Kind::kInt) return {a->i};
  return a->ints;
}

std::vector<float> AttrMap::get_floats(const std::string& name, const std::vector<float>& def) const {
  const Attribute* a = find(name);
  if (!a) return def;
  if (a->kind == Attribute::Kind::kFloat) return {a->f};
  return a->floats;
}

}  // namespace oases
