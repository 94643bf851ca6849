// Node attributes: the ONNX attribute kinds the project uses, in a small ordered map.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/tensor.h"

namespace oases {

struct Attribute {
  enum class Kind { kInt, kFloat, kString, kInts, kFloats, kStrings, kTensor };
  Kind kind = Kind::kInt;
  int64_t i = 0;
  float f = 0.f;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<std::string> strings;
  Tensor t;

  static Attribute of_int(int64_t v) {
    Attribute a;
    a.kind = Kind::kInt;
    a.i = v;
    return a;
  }
  static Attribute of_float(float v) {
    Attribute a;
    a.kind = Kind::kFloat;
    a.f = v;
    return a;
  }
  static Attribute of_string(std::string v) {
    Attribute a;
    a.kind = Kind::kString;
    a.s = std::move(v);
    return a;
  }
  static Attribute of_ints(std::vector<int64_t> v) {
    Attribute a;
    a.kind = Kind::kInts;
    a.ints = std::move(v);
    return a;
  }
  static Attribute of_floats(std::vector<float> v) {
    Attribute a;
    a.kind = Kind::kFloats;
    a.floats = std::move(v);
    return a;
  }
  static Attribute of_strings(std::vector<std::string> v) {
    Attribute a;
    a.kind = Kind::kStrings;
    a.strings = std::move(v);
    return a;
  }
  static Attribute of_tensor(Tensor v) {
    Attribute a;
    a.kind = Kind::kTensor;
    a.t = std::move(v);
    return a;
  }

  std::string to_string() const;
};

class AttrMap {
 public:
  AttrMap() = default;
  AttrMap(std::initializer_list<std::pair<const std::string, Attribute>> init) : m_(init) {}

  bool has(const std::string& name) const { return m_.count(name) > 0; }
  const Attribute* find(const std::string& name) const {
    auto it = m_.find(name);
    return it == m_.end() ? nullptr : &it->second;
  }
  int64_t get_int(const std::string& name, int64_t def) const;
  float get_float(const std::string& name, float def) const;
  std::string get_string(const std::string& name, const std::string& def) const;
  std::vector<int64_t> get_ints(const std::string& name, const std::vector<int64_t>& def = {}) const;
  std::vector<float> get_floats(const std::string& name, const std::vector<float>& def = {}) const;

  void set(const std::string& name, Attribute a) { m_[name] = std::move(a); }
  void set_int(const std::string& name, int64_t v) { m_[name] = Attribute::of_int(v); }
  void set_float(const std::string& name, float v) { m_[name] = Attribute::of_float(v); }
  void set_string(const std::string& name, std::string v) { m_[name] = Attribute::of_string(std::move(v)); }
  void set_ints(const std::string& name, std::vector<int64_t> v) { m_[name] = Attribute::of_ints(std::move(v)); }
  void set_floats(const std::string& name, std::vector<float> v) { m_[name] = Attribute::of_floats(std::move(v)); }
  void erase(const std::string& name) { m_.erase(name); }

  auto begin() const { return m_.begin(); }
  auto end() const { return m_.end(); }
  size_t size() const { return m_.size(); }

 private:
  std::map<std::string, Attribute> m_;
};

}  // namespace oases
