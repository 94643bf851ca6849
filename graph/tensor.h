// Shape helpers and a host Tensor: dtype, shape and shared, 64-byte aligned storage.
// Initializers kept as external data are loaded lazily, so planning (which reads shapes only)
// never touches weight files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/status.h"

namespace oases {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"
// numpy broadcasting of two shapes; error names both shapes.
Expected<Shape> broadcast_shapes(const Shape& a, const Shape& b);
// Normalises a possibly negative axis against `rank`; returns -1 when out of range.
int64_t normalize_axis(int64_t axis, int64_t rank);
// Row-major strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);

// Hard ceiling on one tensor (bytes), whatever the machine: bigger is an error, never a crash.
constexpr uint64_t kMaxTensorBytes = uint64_t{64} << 30;
// The machine's physical memory in bytes (sysconf), 0 when it cannot be read.
uint64_t physical_memory_bytes();
// The memory limit the tools allocate under: one tensor, and the executor's activation arena,
// must each fit in it. Default: half the machine's RAM (at most kMaxTensorBytes), so a tiny model
// asking for a huge tensor is refused before the machine starts swapping or the OOM killer fires.
uint64_t max_memory_bytes();
// Sets the limit (--max-memory); 0 restores the default.
void set_max_memory_bytes(uint64_t bytes);
// The largest single tensor: min(max_memory_bytes(), kMaxTensorBytes).
uint64_t max_tensor_bytes();
// Shapes-only work (oases-plan --gpus: the global graph is analysed, never run) may infer values
// far larger than any one machine holds (GPT-3's embedding output at batch 1536 x 2048 is 154 GB);
// with it on, shape inference bounds an output by kMaxShapeOnlyBytes instead. Allocations keep
// max_tensor_bytes().
constexpr uint64_t kMaxShapeOnlyBytes = uint64_t{1} << 50;
void set_shapes_only(bool on);
uint64_t max_inferred_bytes();
// Bytes of a tensor of this shape and dtype, or nullopt when a dim is negative or the product
// overflows 64 bits: shapes read from files are checked with it before anything is allocated.
std::optional<uint64_t> checked_nbytes(const Shape& s, DType t);

class Tensor {
 public:
  using Loader = std::function<Status(void* dst, size_t nbytes)>;

  Tensor() = default;
  // Zero-filled tensor owning its storage.
  Tensor(DType dtype, Shape shape);
  // Tensor whose bytes are produced by `loader` on first access (external data).
  static Tensor lazy(DType dtype, Shape shape, Loader loader);
  // Scalars and small vectors, for constants built in code.
  static Tensor scalar_f32(float v);
  static Tensor from_int64(const std::vector<int64_t>& v, Shape shape = {});
  static Tensor from_f32(const std::vector<float>& v, Shape shape = {});

  bool defined() const { return dtype_ != DType::kUndefined; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_loaded() const;
  bool is_lazy() const { return static_cast<bool>(loader_); }

  // Loads lazy data; the error names the source.
  Status load() const;
  // Raw bytes; loads lazy data first and throws OasesError if that fails.
  const void* raw() const;
  void* raw_mutable();
  template <class T>
  const T* data() const {
    return static_cast<const T*>(raw());
  }
  template <class T>
  T* mutable_data() {
    return static_cast<T*>(raw_mutable());
  }

  // A deep copy with its own storage.
  Tensor clone() const;
  // Same storage, another shape of equal element count.
  Tensor reshaped(Shape shape) const;
  // Integer contents (any integer dtype) as int64; floats are truncated.
  std::vector<int64_t> to_int64() const;
  std::vector<double> to_double() const;
  double item() const;  // first element as double
  // Converted copy (float16/bfloat16 through float32).
  Tensor cast(DType to) const;
  // Byte-wise equality of dtype, shape and contents.
  bool same_as(const Tensor& other) const;

 private:
  struct Storage;
  DType dtype_ = DType::kUndefined;
  Shape shape_;
  std::shared_ptr<Storage> storage_;
  Loader loader_;
};

}  // namespace oases
