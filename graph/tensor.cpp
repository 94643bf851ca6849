#include "graph/tensor.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace oases {

int64_t shape_numel(const Shape& s) {
  // a zero anywhere makes the tensor empty, whatever the other dims (an untrusted [huge, 2, 0] must
  // not overflow on the way there); a count past int64 saturates (no tensor that large is made:
  // checked_nbytes refuses it first)
  for (int64_t d : s) {
    if (d == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t d : s) {
    if (__builtin_mul_overflow(n, d, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

namespace {
std::atomic<uint64_t> g_max_memory_bytes{0};  // 0: the default
}  // namespace

uint64_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

uint64_t max_memory_bytes() {
  if (uint64_t set = g_max_memory_bytes.load(std::memory_order_relaxed)) return set;
  static const uint64_t by_default = [] {
    uint64_t ram = physical_memory_bytes();
    return ram == 0 ? kMaxTensorBytes : std::min(kMaxTensorBytes, ram / 2);
  }();
  return by_default;
}

void set_max_memory_bytes(uint64_t bytes) {
  g_max_memory_bytes.store(bytes, std::memory_order_relaxed);
}

uint64_t max_tensor_bytes() {
  return std::min(max_memory_bytes(), kMaxTensorBytes);
}

namespace {
std::atomic<bool> g_shapes_only{false};
}

void set_shapes_only(bool on) {
  g_shapes_only.store(on, std::memory_order_relaxed);
}

uint64_t max_inferred_bytes() {
  return g_shapes_only.load(std::memory_order_relaxed) ? kMaxShapeOnlyBytes : max_tensor_bytes();
}

std::optional<uint64_t> checked_nbytes(const Shape& s, DType t) {
  bool empty = false;
  for (int64_t d : s) {
    if (d < 0) return std::nullopt;
    empty |= d == 0;
  }
  if (empty) return 0;
  uint64_t n = dtype_size(t);
  for (int64_t d : s) {
    if (n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string shape_str(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

Expected<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da == db || db == 1) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else {
      return error("shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
    }
  }
  return out;
}

int64_t normalize_axis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return -1;
  return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

struct Tensor::Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool loaded = false;
  std::mutex mu;
  explicit Storage(size_t n) : bytes(n) {}
  ~Storage() { std::free(ptr); }
  void allocate() {
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0) n = 64;
    ptr = std::aligned_alloc(64, n);
    if (!ptr) throw OasesError(fmt::format("out of memory allocating a tensor of {} bytes", bytes));
    std::memset(ptr, 0, n);
  }
};

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_) {
    if (d < 0) throw OasesError(fmt::format("negative dimension in tensor shape {}", shape_str(shape_)));
  }
  std::optional<uint64_t> nbytes = checked_nbytes(shape_, dtype);
  if (!nbytes || *nbytes > max_tensor_bytes()) {
    throw OasesError(fmt::format("tensor of shape {} ({}) exceeds the limit of {} bytes (--max-memory)", shape_str(shape_),
                                 nbytes ? fmt::format("{} bytes", *nbytes) : std::string("more bytes than 64 bits count"),
                                 max_tensor_bytes()));
  }
  const uint64_t bytes = *nbytes;
  storage_ = std::make_shared<Storage>(bytes);
  storage_->allocate();
  storage_->loaded = true;
}

Tensor Tensor::lazy(DType dtype, Shape shape, Loader loader) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(t.shape_)) * dtype_size(dtype));
  t.loader_ = std::move(loader);
  return t;
}

Tensor Tensor::scalar_f32(float v) {
  Tensor t(DType::kF32, {});
  *t.mutable_data<float>() = v;
  return t;
}

Tensor Tensor::from_int64(const std::vector<int64_t>& v, Shape shape) {
  if (shape.empty() && v.size() != 1) shape = {static_cast<int64_t>(v.size())};
  Tensor t(DType::kI64, shape);
  if (!v.empty()) std::memcpy(t.raw_mutable(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

Tensor Tensor::from_f32(const std::vector<float>& v, Shape shape) {
  if (shape.empty() && v.size() != 1) shape = {static_cast<int64_t>(v.size())};
  Tensor t(DType::kF32, shape);
  if (!v.empty()) std::memcpy(t.raw_mutable(), v.data(), v.size() * sizeof(float));
  return t;
}

bool Tensor::is_loaded() const {
  return storage_ && storage_->loaded;
}

Status Tensor::load() const {
  if (!storage_) return Status::error("tensor has no storage");
  std::lock_guard<std::mutex> lock(storage_->mu);
  if (storage_->loaded) return Status::ok();
  if (storage_->bytes > max_tensor_bytes()) {
    return error("tensor of shape {} ({} bytes) exceeds the limit of {} bytes (--max-memory)", shape_str(shape_), storage_->bytes,
                 max_tensor_bytes());
  }
  storage_->allocate();
  if (loader_) {
    Status s = loader_(storage_->ptr, storage_->bytes);
    if (!s.is_ok()) {
      std::free(storage_->ptr);
      storage_->ptr = nullptr;
      return s;
    }
  }
  storage_->loaded = true;
  return Status::ok();
}

const void* Tensor::raw() const {
  if (!storage_) throw OasesError("access to an undefined tensor");
  if (!storage_->loaded) {
    Status s = load();
    if (!s.is_ok()) throw OasesError(s.message());
  }
  return storage_->ptr;
}

void* Tensor::raw_mutable() {
  return const_cast<void*>(raw());
}

Tensor Tensor::clone() const {
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.raw_mutable(), raw(), nbytes());
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel()) {
    throw OasesError(fmt::format("cannot reshape {} to {}", shape_str(shape_), shape_str(shape)));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

std::vector<int64_t> Tensor::to_int64() const {
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  const void* p = raw();
  if (dtype_ == DType::kI64) {
    if (!v.empty()) std::memcpy(v.data(), p, v.size() * 8);  // (memcpy of null is undefined even for 0 bytes)
  } else {
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_int64(p, dtype_, static_cast<int64_t>(i));
  }
  return v;
}

std::vector<double> Tensor::to_double() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  const void* p = raw();
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_double(p, dtype_, static_cast<int64_t>(i));
  return v;
}

double Tensor::item() const {
  if (numel() < 1) throw OasesError("item() of an empty tensor");
  return load_as_double(raw(), dtype_, 0);
}

Tensor Tensor::cast(DType to) const {
  if (to == dtype_) return clone();
  Tensor t(to, shape_);
  const void* src = raw();
  void* dst = t.raw_mutable();
  int64_t n = numel();
  if (dtype_ == DType::kI64 && to == DType::kI32) {
    for (int64_t i = 0; i < n; ++i) static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(static_cast<const int64_t*>(src)[i]);
  } else if ((dtype_ == DType::kI64 || dtype_ == DType::kU64) && is_integer(to)) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = static_cast<const int64_t*>(src)[i];
      store_from_double(dst, to, i, 0);
      switch (to) {
        case DType::kU64: static_cast<uint64_t*>(dst)[i] = static_cast<uint64_t>(v); break;
        case DType::kI64: static_cast<int64_t*>(dst)[i] = v; break;
        default: store_from_double(dst, to, i, static_cast<double>(v));
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) store_from_double(dst, to, i, load_as_double(src, dtype_, i));
  }
  return t;
}

bool Tensor::same_as(const Tensor& other) const {
  if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
  if (nbytes() == 0) return true;
  return std::memcmp(raw(), other.raw(), nbytes()) == 0;
}

}  // namespace oases
