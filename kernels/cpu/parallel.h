// The CPU kernels' threads: one pool per process, on which every parallel loop of kernels/cpu and
// executor/cpu runs (OpenBLAS itself runs single-threaded; kernels::gemm splits large products
// into blocks on this pool).
//
// A loop is cut into work items; the calling thread and the pool's workers claim items one at a
// time, and the caller returns as soon as every item is done. A worker that wakes up late (the
// machine is busy, its core runs something else) finds nothing left to claim and is not waited
// for: unlike a fork-join team, whose end barrier waits for every member to arrive, a parallel
// loop never costs more than running it on the caller alone plus the items already claimed.
// Idle workers spin briefly, then sleep on a futex.
//
// Determinism: an item's result must not depend on which thread runs it. Reductions keep one
// partial per item (never per thread) and combine them in item order.
//
// Nested loops (a loop inside an item) run serially on the thread that reached them; a loop
// started while another thread is using the pool (ranks run as threads) runs serially too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace oases::kernels {

// A reference to a callable that the callee uses before returning (a loop body): a pointer to it
// and one call stub, where std::function would also instantiate a manager per lambda. Hundreds of
// kernels' loop bodies (op x element type) go through here, so that saved a large share of the
// elementwise glue's compile time. The callable must outlive the call it is passed to.
template <class Sig>
class FunctionRef;
template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, A...>)
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): a lambda converts as to std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, A... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...); }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

// Threads a parallel loop started from this thread may use, the caller included: the last
// set_num_threads of this thread, else OMP_NUM_THREADS, else the hardware's count.
int num_threads();
// Most threads a loop may use: a pool is this many OS threads, and far more than any machine
// this runs on has cores (asking for 100000 would fail in pthread_create with EAGAIN).
constexpr int kMaxThreads = 1024;
// For the calling thread (0: back to the default). The pool grows to the largest count asked for.
// Throws std::invalid_argument (naming the count and the range) outside [0, kMaxThreads].
void set_num_threads(int n);
// True inside a work item.
bool in_parallel();

// Runs item(i) for i in [0, items) on the pool; returns when all are done.
void parallel_for(int64_t items, FunctionRef<void(int64_t)> item);

// Splits [0, total) into about `pieces` contiguous ranges (at least `grain` long) and runs
// body(begin, end) on each, in parallel when there is more than one. The split depends only on
// total, grain and pieces.
template <class F>
void parallel_range(int64_t total, int64_t grain, int64_t pieces, F&& body) {
  if (total <= 0) return;
  int64_t n = std::max<int64_t>(1, std::min(pieces, total / std::max<int64_t>(1, grain)));
  if (n == 1) {
    body(int64_t{0}, total);
    return;
  }
  int64_t step = (total + n - 1) / n;
  n = (total + step - 1) / step;
  parallel_for(n, [&](int64_t i) { body(i * step, std::min(total, (i + 1) * step)); });
}

// parallel_range with pieces chosen from the thread count: a few per thread, so that a thread
// that is descheduled holds up little. For loops whose split does not change their results.
template <class F>
void parallel_range(int64_t total, int64_t grain, F&& body) {
  int t = in_parallel() ? 1 : num_threads();
  parallel_range(total, grain, t == 1 ? 1 : 4 * static_cast<int64_t>(t), std::forward<F>(body));
}

}  // namespace oases::kernels
