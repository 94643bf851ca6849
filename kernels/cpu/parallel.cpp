#include "kernels/cpu/parallel.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OASES_PAUSE() _mm_pause()
#else
#define OASES_PAUSE() ((void)0)
#endif

namespace oases::kernels {

namespace {

thread_local int tl_threads = 0;       // set_num_threads of this thread (0: default)
thread_local bool tl_in_item = false;  // inside a work item

int default_threads() {
  static const int n = [] {
    if (const char* e = std::getenv("OMP_NUM_THREADS")) {
      int v = std::atoi(e);
      if (v > 0) return std::min(v, kMaxThreads);
    }
    return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxThreads);
  }();
  return n;
}

// The job word: epoch (24 bits) | item count (20 bits) | next unclaimed item (20 bits). A claim is
// a CAS on the whole word, so it can only succeed in the job it read: a worker holding a stale
// word from a finished job fails its CAS. The count lives in the word for the same reason.
constexpr int kIdxBits = 20;
constexpr uint64_t kIdxMask = (uint64_t{1} << kIdxBits) - 1;
constexpr int64_t kMaxItems = static_cast<int64_t>(kIdxMask);

inline uint64_t pack(uint64_t epoch, uint64_t n, uint64_t next) {
  return (epoch << (2 * kIdxBits)) | (n << kIdxBits) | next;
}
inline uint64_t count_of(uint64_t s) {
  return (s >> kIdxBits) & kIdxMask;
}
inline uint64_t next_of(uint64_t s) {
  return s & kIdxMask;
}
inline uint64_t epoch_of(uint64_t s) {
  return s >> (2 * kIdxBits);
}

class Pool {
 public:
  static Pool& get() {
    static Pool* p = new Pool();  // never destroyed: workers may still be asleep at exit
    return *p;
  }

  // Runs the loop on the pool when it is free, else serially; `threads` includes the caller.
  void run(int64_t items, FunctionRef<void(int64_t)> item, int threads) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) {
      serial(items, item);
      return;
    }
    grow(threads - 1);
    fn_ = &item;
    error_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    slots_.store(threads - 1);
    uint64_t epoch = (epoch_of(state_.load()) + 1) & ((uint64_t{1} << (64 - 2 * kIdxBits)) - 1);
    state_.store(pack(epoch, static_cast<uint64_t>(items), 0));
    if (sleepers_.load() > 0) {
      wake_.fetch_add(1);
      wake_.notify_all();
    }
    tl_in_item = true;
    int64_t mine = 0;
    for (int64_t i; (i = claim()) >= 0; ++mine) guarded(i);
    tl_in_item = false;
    // the rest was claimed by workers: wait for them to finish their items
    int64_t target = items - mine;
    while (done_.load(std::memory_order_acquire) < target) OASES_PAUSE();
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex busy_;  // one loop at a time
  std::mutex grow_mu_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};   // items finished by workers in the current job
  std::atomic<int> slots_{0};      // workers that may still join the current job
  std::atomic<uint32_t> wake_{0};  // bumped to wake sleeping workers
  std::atomic<int> sleepers_{0};
  const FunctionRef<void(int64_t)>* fn_ = nullptr;
  std::mutex error_mu_;
  std::exception_ptr error_;  // the first exception an item threw; rethrown by the caller
  std::atomic<bool> failed_{false};

  static void serial(int64_t items, FunctionRef<void(int64_t)> item) {
    bool saved = tl_in_item;
    tl_in_item = true;
    try {
      for (int64_t i = 0; i < items; ++i) item(i);
    } catch (...) {
      tl_in_item = saved;
      throw;
    }
    tl_in_item = saved;
  }

  void grow(int want) {
    if (static_cast<int>(workers_.size()) >= want) return;
    std::lock_guard<std::mutex> g(grow_mu_);
    while (static_cast<int>(workers_.size()) < want) workers_.emplace_back([this] { worker(); });
  }

  // Claims one item of the current job: its index, or -1 when none is left.
  int64_t claim() {
    uint64_t s = state_.load();
    while (next_of(s) < count_of(s)) {
      if (state_.compare_exchange_weak(s, s + 1)) return static_cast<int64_t>(next_of(s));
    }
    return -1;
  }

  // Runs item i unless an earlier item failed; keeps the first exception.
  void guarded(int64_t i) {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> g(error_mu_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true);
    }
  }

  void worker() {
    tl_in_item = true;               // a loop inside an item runs serially
    uint64_t joined = ~uint64_t{0};  // epoch of the job this worker holds a slot in
    for (;;) {
      uint64_t s = state_.load();
      if (next_of(s) < count_of(s)) {
        if (epoch_of(s) != joined) {  // first item of this job: take a slot, or sit it out
          if (slots_.fetch_sub(1) <= 0) {
            slots_.fetch_add(1);
            idle(epoch_of(s));
            continue;
          }
          joined = epoch_of(s);
        }
        int64_t i = claim();
        if (i >= 0) {
          guarded(i);
          done_.fetch_add(1, std::memory_order_release);
        }
        continue;
      }
      idle(epoch_of(s));
    }
  }

  // Waits for a job other than `epoch` with items left: spins a little (the next loop usually
  // follows within microseconds), then sleeps until woken.
  void idle(uint64_t epoch) {
    auto ready = [&] {
      uint64_t s = state_.load();
      return epoch_of(s) != epoch && next_of(s) < count_of(s);
    };
    for (int spin = 0; spin < 4000; ++spin) {
      if (ready()) return;
      OASES_PAUSE();
    }
    uint32_t w = wake_.load();
    sleepers_.fetch_add(1);
    if (!ready()) wake_.wait(w);
    sleepers_.fetch_sub(1);
  }
};

}  // namespace

int num_threads() {
  return tl_threads > 0 ? tl_threads : default_threads();
}

void set_num_threads(int n) {
  if (n < 0 || n > kMaxThreads) {
    throw std::invalid_argument("thread count " + std::to_string(n) + " is out of range (0 for the default, or 1 to " +
                                std::to_string(kMaxThreads) + ")");
  }
  tl_threads = n;
}

bool in_parallel() {
  return tl_in_item;
}

void parallel_for(int64_t items, FunctionRef<void(int64_t)> item) {
  if (items <= 0) return;
  int t = num_threads();
  if (items == 1 || t <= 1 || tl_in_item || items > kMaxItems) {
    bool saved = tl_in_item;
    tl_in_item = true;
    for (int64_t i = 0; i < items; ++i) item(i);
    tl_in_item = saved;
    return;
  }
  Pool::get().run(items, item, t);
}

}  // namespace oases::kernels
