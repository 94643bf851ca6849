#include "executor/communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/status.h"

namespace oases {

std::string CommGroup::describe() const {
  return fmt::format("group [{}] (member {} of {})", fmt::join(members(), ", "), rank(), size());
}

namespace {

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

void check_tag(int tag, const char* what) {
  if (tag < 0 || tag > Communicator::kMaxChannelTag)
    throw OasesError(fmt::format("{}: channel tag {} is outside 0 … {}", what, tag, Communicator::kMaxChannelTag));
}

}  // namespace

void CommGroup::shift(const void* in, void* out, int64_t bytes, int offset) {
  int n = size();
  std::vector<char> all(static_cast<size_t>(bytes) * static_cast<size_t>(n));
  all_gather(in, all.data(), bytes);
  int from = ((rank() - offset) % n + n) % n;
  std::memcpy(out, all.data() + static_cast<size_t>(from) * static_cast<size_t>(bytes), static_cast<size_t>(bytes));
}

std::unique_ptr<CommRequest> CommGroup::ibroadcast(void* data, int64_t bytes, int root) {
  broadcast(data, bytes, root);
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<CommRequest> Communicator::isend(const void*, int64_t, int, int) {
  throw OasesError(fmt::format("the {} communicator has no point-to-point transfers yet", kind()));
}

std::unique_ptr<CommRequest> Communicator::irecv(void*, int64_t, int, int) {
  throw OasesError(fmt::format("the {} communicator has no point-to-point transfers yet", kind()));
}

std::unique_ptr<CommGroup> Communicator::make_channel_group(const std::vector<int>&, int) {
  throw OasesError(fmt::format("the {} communicator has no channel groups yet", kind()));
}

std::unique_ptr<CommGroup> Communicator::make_member_group(const std::vector<int>& ranks, int tag) {
  check_tag(tag, "mesh group");
  if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end())
    throw OasesError(fmt::format("rank {} is not in group [{}] (tag {})", rank(), fmt::join(ranks, ", "), tag));
  return make_channel_group(ranks, tag);
}

CommGroup& Communicator::channel_group(const std::vector<int>& ranks, int tag) {
  check_tag(tag, "channel group");
  auto& g = channel_groups_[{ranks, tag}];
  if (!g) {
    if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end())
      throw OasesError(fmt::format("rank {} is not in channel group [{}] (tag {})", rank(), fmt::join(ranks, ", "), tag));
    g = make_channel_group(ranks, tag);
  }
  return *g;
}

void reduce_into(void* acc, const void* x, int64_t count, DType dt, ReduceOp op) {
  auto run = [&]<class T>() {
    T* a = static_cast<T*>(acc);
    const T* b = static_cast<const T*>(x);
    if (op == ReduceOp::kSum) {
      for (int64_t i = 0; i < count; ++i) a[i] += b[i];
    } else {
      for (int64_t i = 0; i < count; ++i) a[i] = b[i] > a[i] ? b[i] : a[i];
    }
  };
  switch (dt) {
    case DType::kF32: run.template operator()<float>(); break;
    case DType::kF64: run.template operator()<double>(); break;
    case DType::kI64: run.template operator()<int64_t>(); break;
    case DType::kI32: run.template operator()<int32_t>(); break;
    default: throw OasesError(fmt::format("reduction of {} is not supported", dtype_name(dt)));
  }
}

// --- local ------------------------------------------------------------------------------------

namespace {

// Rendezvous of the members of one group: each collective is a sequence of barriers; between them
// members read each other's posted pointers.
struct GroupState {
  explicit GroupState(std::vector<int> m) : members(std::move(m)), arrived_at(members.size(), kNever), ptrs(members.size(), nullptr) {}
  static constexpr uint64_t kNever = ~uint64_t{0};
  std::vector<int> members;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  // per member: the generation it last arrived at, so a timeout can name who is missing
  std::vector<uint64_t> arrived_at;
  std::vector<const void*> ptrs;
  std::vector<char> scratch;
};

}  // namespace

class LocalWorld {
 public:
  LocalWorld(int size, double timeout) : size_(size), timeout_(timeout) {}
  int size() const { return size_; }
  double timeout() const { return timeout_; }
  // tag -1: the groups of make_group; other tags: channel groups.
  std::shared_ptr<GroupState> group(const std::vector<int>& ranks, int tag = -1) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& g = groups_[{ranks, tag}];
    if (!g) g = std::make_shared<GroupState>(ranks);
    return g;
  }

  // Point to point: a message is copied into the mailbox of (from, to, tag) when sent, so a send
  // completes at once and a receive waits for it (in order).
  void post(int from, int to, int tag, const void* data, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mail_mu_);
    const char* p = static_cast<const char*>(data);
    mail_[{from, to, tag}].emplace_back(p, p + bytes);
    mail_cv_.notify_all();
  }
  void take(int from, int to, int tag, void* data, int64_t bytes) {
    std::unique_lock<std::mutex> lock(mail_mu_);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    auto& box = mail_[{from, to, tag}];
    std::string why;
    std::optional<ScopedWait> waiting;  // registered once it has to wait (not under the mail lock)
    bool extended = false;              // one more timeout given to a sender that waits for no one
    while (box.empty()) {
      if (!waiting) {
        lock.unlock();
        waiting.emplace(this, to, Waiting{nullptr, 0, fmt::format("receive from rank {} (tag {})", from, tag), from});
        lock.lock();
        continue;  // the message may have come meanwhile
      }
      if (aborted(&why)) throw OasesError(fmt::format("receive by rank {} from rank {} (tag {}) stopped: {}", to, from, tag, why));
      if (mail_cv_.wait_until(lock, deadline) == std::cv_status::timeout && box.empty()) {
        lock.unlock();
        // the sender may itself wait in a collective for the rank that holds everyone up: name it
        std::string chain = waiting_chain({from});
        if (chain.empty() && !extended) {
          // The sender waits for no one: it is still computing (a loaded machine, a later stage
          // that has not reached its collective yet), or stuck in its own code. Give it one more
          // timeout, so a rank that is merely slow is not taken for a hung one, and a rank it then
          // waits for is named (its own collective's timeout, or this chain, names it).
          extended = true;
          deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
          lock.lock();
          continue;
        }
        std::string msg =
            fmt::format("receive by rank {} from rank {} (tag {}): nothing arrived within {:.0f} s{}", to, from, tag,
                        extended ? 2 * timeout_ : timeout_,
                        chain.empty() ? fmt::format("; rank {} waits for no rank (busy, or stuck in its own code)", from) : chain);
        abort(msg);
        throw OasesError(msg);
      }
    }
    std::vector<char> m = std::move(box.front());
    box.pop_front();
    lock.unlock();
    if (static_cast<int64_t>(m.size()) != bytes)
      throw OasesError(
          fmt::format("receive by rank {} from rank {} (tag {}): {} bytes arrived, {} expected", to, from, tag, m.size(), bytes));
    if (bytes > 0) std::memcpy(data, m.data(), static_cast<size_t>(bytes));
  }
  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(why_mu_);
      if (aborted_.load()) return;
      why_ = why;
      aborted_.store(true);
    }
    // wake every waiter; never hold the world lock while taking a group lock
    std::vector<std::shared_ptr<GroupState>> groups;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [k, g] : groups_) groups.push_back(g);
    }
    for (auto& g : groups) {
      std::lock_guard<std::mutex> gl(g->mu);
      g->cv.notify_all();
    }
    std::lock_guard<std::mutex> ml(mail_mu_);
    mail_cv_.notify_all();
  }
  // Who waits where: a rank inside a collective's rendezvous (the group and the generation it waits
  // to complete) or inside a receive (the sender), so a timeout can follow the chain to the rank
  // that holds everyone up. A rank may wait in several at once (its compute thread in a receive or
  // a collective of one group, its communication thread in another's): each wait is its own entry.
  struct Waiting {
    std::shared_ptr<GroupState> group;  // null: a receive from `from`
    uint64_t generation = 0;
    std::string what;  // "all-reduce in group [0, 1] (member 0 of 2)", "receive from rank 2 (tag 7)"
    int from = -1;
  };
  using WaitToken = std::multimap<int, Waiting>::iterator;
  WaitToken set_waiting(int rank, Waiting w) {
    std::lock_guard<std::mutex> lock(wait_mu_);
    return waiting_.emplace(rank, std::move(w));
  }
  void clear_waiting(WaitToken t) {
    std::lock_guard<std::mutex> lock(wait_mu_);
    waiting_.erase(t);
  }
  // A wait registered for as long as this lives.
  class ScopedWait {
   public:
    ScopedWait(LocalWorld* w, int rank, Waiting what) : w_(w), t_(w->set_waiting(rank, std::move(what))) {}
    ScopedWait(const ScopedWait&) = delete;
    ScopedWait& operator=(const ScopedWait&) = delete;
    ~ScopedWait() { w_->clear_waiting(t_); }

   private:
    LocalWorld* w_;
    WaitToken t_;
  };
  // From the ranks `missing` a timed-out wait names: the chain of ranks each waiting for the next
  // ("rank 0 waits for rank 1 in all-reduce in group [0, 1] ..."), ending at one that waits
  // nowhere. Empty when the first missing rank is not waiting. Call with no group lock held.
  std::string waiting_chain(std::vector<int> missing) {
    std::string out;
    std::set<int> seen;
    for (int step = 0; step < size_ && missing.size() == 1 && seen.insert(missing[0]).second; ++step) {
      std::vector<Waiting> waits;
      {
        std::lock_guard<std::mutex> lock(wait_mu_);
        auto [b, e] = waiting_.equal_range(missing[0]);
        for (auto it = b; it != e; ++it) waits.push_back(it->second);
      }
      std::vector<int> next;
      const Waiting* on = nullptr;
      for (const Waiting& w : waits) {  // the first of its waits that still waits for someone
        if (!w.group) {
          next = {w.from};
        } else {
          std::lock_guard<std::mutex> lock(w.group->mu);
          if (w.group->generation != w.generation) continue;  // that wait has completed meanwhile
          for (size_t j = 0; j < w.group->members.size(); ++j) {
            if (w.group->arrived_at[j] != w.generation) next.push_back(w.group->members[j]);
          }
        }
        if (!next.empty()) {
          on = &w;
          break;
        }
      }
      if (!on) break;
      out += fmt::format("; rank {} waits for rank{} {} in {}", missing[0], next.size() == 1 ? "" : "s", fmt::join(next, ", "), on->what);
      missing = next;
    }
    return out;
  }

  // Cheap to call with a group lock held (takes no lock unless aborted).
  bool aborted(std::string* why) {
    if (!aborted_.load()) return false;
    if (why) {
      std::lock_guard<std::mutex> lock(why_mu_);
      *why = why_;
    }
    return true;
  }

 private:
  int size_;
  double timeout_;
  std::mutex mu_;
  std::map<std::pair<std::vector<int>, int>, std::shared_ptr<GroupState>> groups_;
  std::mutex mail_mu_;
  std::condition_variable mail_cv_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mail_;
  std::atomic<bool> aborted_{false};
  std::mutex why_mu_;
  std::mutex wait_mu_;
  std::multimap<int, Waiting> waiting_;
  std::string why_;
};

namespace {

class LocalRecv : public CommRequest {
 public:
  LocalRecv(std::shared_ptr<LocalWorld> w, int from, int to, int tag, void* data, int64_t bytes)
      : world_(std::move(w)), from_(from), to_(to), tag_(tag), data_(data), bytes_(bytes) {}
  void wait() override {
    if (done_) return;
    world_->take(from_, to_, tag_, data_, bytes_);
    done_ = true;
  }

 private:
  std::shared_ptr<LocalWorld> world_;
  int from_, to_, tag_;
  void* data_;
  int64_t bytes_;
  bool done_ = false;
};

class LocalGroup : public CommGroup {
 public:
  LocalGroup(std::shared_ptr<LocalWorld> w, std::shared_ptr<GroupState> s, int index, double timeout)
      : world_(std::move(w)), st_(std::move(s)), index_(index), timeout_(timeout) {}
  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(st_->members.size()); }
  const std::vector<int>& members() const override { return st_->members; }

  void all_reduce(void* data, int64_t count, DType dt, ReduceOp op) override {
    size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
    post(data, "all-reduce", [&] { st_->scratch.assign(bytes, 0); });
    // each member reduces its chunk of elements over all members, in member order
    int n = size();
    int64_t chunk = (count + n - 1) / n;
    int64_t lo = std::min<int64_t>(count, chunk * index_), hi = std::min<int64_t>(count, lo + chunk);
    size_t es = dtype_size(dt);
    if (hi > lo) {
      char* dst = st_->scratch.data() + lo * static_cast<int64_t>(es);
      std::memcpy(dst, static_cast<const char*>(st_->ptrs[0]) + lo * static_cast<int64_t>(es), static_cast<size_t>(hi - lo) * es);
      for (int m = 1; m < n; ++m) reduce_into(dst, static_cast<const char*>(st_->ptrs[m]) + lo * static_cast<int64_t>(es), hi - lo, dt, op);
    }
    sync("all-reduce");
    std::memcpy(data, st_->scratch.data(), bytes);
    sync("all-reduce");
  }

  void all_gather(const void* in, void* out, int64_t bytes) override {
    post(in, "all-gather", nullptr);
    for (int m = 0; m < size(); ++m) std::memcpy(static_cast<char*>(out) + m * bytes, st_->ptrs[m], static_cast<size_t>(bytes));
    sync("all-gather");
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) override {
    post(in, "reduce-scatter", nullptr);
    size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
    // straight into `out` unless it lies inside this member's input, which the others read until
    // the sync (then through a buffer of its own)
    const char* in_lo = static_cast<const char*>(in);
    const char* in_hi = in_lo + bytes * static_cast<size_t>(size());
    char* o = static_cast<char*>(out);
    const bool apart = o + bytes <= in_lo || o >= in_hi;
    std::vector<char> acc(apart ? 0 : bytes);
    char* dst = apart ? o : acc.data();
    std::memcpy(dst, static_cast<const char*>(st_->ptrs[0]) + index_ * bytes, bytes);
    for (int m = 1; m < size(); ++m) reduce_into(dst, static_cast<const char*>(st_->ptrs[m]) + index_ * bytes, count, dt, op);
    sync("reduce-scatter");
    if (!apart) std::memcpy(out, acc.data(), bytes);
  }

  // Point to point through the mailboxes: a rank waits for its predecessor only, not for the
  // whole group (a ring step of a collective matmul needs no rendezvous of every member).
  void shift(const void* in, void* out, int64_t bytes, int offset) override {
    int n = size(), to = ((index_ + offset) % n + n) % n, from = ((index_ - offset) % n + n) % n;
    const auto& m = st_->members;
    world_->post(m[static_cast<size_t>(index_)], m[static_cast<size_t>(to)], kShiftTag, in, bytes);
    world_->take(m[static_cast<size_t>(from)], m[static_cast<size_t>(index_)], kShiftTag, out, bytes);
  }
  static constexpr int kShiftTag = Communicator::kMaxChannelTag + 2;

  void all_to_all(const void* in, void* out, int64_t bytes) override {
    post(in, "all-to-all", nullptr);
    for (int m = 0; m < size(); ++m) {
      std::memcpy(static_cast<char*>(out) + m * bytes, static_cast<const char*>(st_->ptrs[m]) + index_ * bytes, static_cast<size_t>(bytes));
    }
    sync("all-to-all");
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    post(data, "broadcast", nullptr);
    if (index_ != root) std::memcpy(data, st_->ptrs[root], static_cast<size_t>(bytes));
    sync("broadcast");
  }

  void barrier() override { sync("barrier"); }

  // Non-blocking: the root posts one message per member (a mailbox tag of its own per channel
  // group), the members take theirs when they wait.
  std::unique_ptr<CommRequest> ibroadcast(void* data, int64_t bytes, int root) override {
    int tag = mail_tag_;
    const auto& m = st_->members;
    if (index_ == root) {
      for (int i = 0; i < size(); ++i) {
        if (i != root) world_->post(m[static_cast<size_t>(root)], m[static_cast<size_t>(i)], tag, data, bytes);
      }
      return std::make_unique<DoneRequest>();
    }
    return std::make_unique<LocalRecv>(world_, m[static_cast<size_t>(root)], m[static_cast<size_t>(index_)], tag, data, bytes);
  }
  int mail_tag_ = Communicator::kMaxChannelTag + 1;

 private:
  // Posts this member's pointer and waits for all; `first` runs once (under the lock) by the last
  // to arrive, before anyone proceeds.
  void post(const void* p, const char* what, const std::function<void()>& first) {
    std::unique_lock<std::mutex> lock(st_->mu);
    std::string why;
    if (world_->aborted(&why)) throw OasesError(fmt::format("{} in {} stopped: {}", what, describe(), why));
    st_->ptrs[static_cast<size_t>(index_)] = p;
    if (first && st_->arrived == size() - 1) first();
    wait_all(lock, what);
  }
  void sync(const char* what) {
    std::unique_lock<std::mutex> lock(st_->mu);
    wait_all(lock, what);
  }
  void wait_all(std::unique_lock<std::mutex>& lock, const char* what) {
    // after an abort (a peer failed or timed out) the group's rendezvous state is stale: no
    // collective may start, so nobody reads a departed member's buffers
    std::string why;
    if (world_->aborted(&why)) throw OasesError(fmt::format("{} in {} stopped: {}", what, describe(), why));
    uint64_t gen = st_->generation;
    st_->arrived_at[static_cast<size_t>(index_)] = gen;
    if (++st_->arrived == size()) {
      st_->arrived = 0;
      ++st_->generation;
      st_->cv.notify_all();
      return;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    int me = st_->members[static_cast<size_t>(index_)];
    LocalWorld::ScopedWait waiting(world_.get(), me, LocalWorld::Waiting{st_, gen, fmt::format("{} in {}", what, describe())});
    while (st_->generation == gen) {
      if (world_->aborted(&why)) throw OasesError(fmt::format("{} in {} stopped: {}", what, describe(), why));
      if (st_->cv.wait_until(lock, deadline) == std::cv_status::timeout && st_->generation == gen) {
        std::vector<int> missing;
        for (size_t j = 0; j < st_->members.size(); ++j) {
          if (st_->arrived_at[j] != gen) missing.push_back(st_->members[j]);
        }
        lock.unlock();
        // a missing rank may itself be stuck in another collective: name the chain to the culprit
        std::string msg = fmt::format("{} in {}: waited {:g} s (--comm-timeout) for rank{} {}, which did not arrive{}", what, describe(),
                                      timeout_, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), world_->waiting_chain(missing));
        world_->abort(msg);
        throw OasesError(msg);
      }
    }
  }

  std::shared_ptr<LocalWorld> world_;
  std::shared_ptr<GroupState> st_;
  int index_;
  double timeout_;
};

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalWorld> w, int rank) : world_(std::move(w)), rank_(rank) { timeout_s = world_->timeout(); }
  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  std::string kind() const override { return "local"; }
  const void* process_world() const override { return world_.get(); }
  std::unique_ptr<CommGroup> make_group(const std::vector<int>& ranks) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) throw OasesError(fmt::format("rank {} is not in group [{}]", rank_, fmt::join(ranks, ", ")));
    return std::make_unique<LocalGroup>(world_, world_->group(ranks), static_cast<int>(it - ranks.begin()), timeout_s);
  }
  void abort(const std::string& why) override { world_->abort(why); }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t bytes, int to, int tag) override {
    check_tag(tag, "send");
    check_peer(to, "send");
    world_->post(rank_, to, tag, data, bytes);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t bytes, int from, int tag) override {
    check_tag(tag, "receive");
    check_peer(from, "receive");
    return std::make_unique<LocalRecv>(world_, from, rank_, tag, data, bytes);
  }

 protected:
  std::unique_ptr<CommGroup> make_channel_group(const std::vector<int>& ranks, int tag) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    auto g = std::make_unique<LocalGroup>(world_, world_->group(ranks, tag), static_cast<int>(it - ranks.begin()), timeout_s);
    // broadcasts of this group use a mailbox tag no point-to-point message can have
    g->mail_tag_ = Communicator::kMaxChannelTag + 1 + tag;
    return g;
  }

 private:
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= world_->size() || peer == rank_)
      throw OasesError(fmt::format("{} by rank {}: peer {} is not another rank of the {}-rank world", what, rank_, peer, world_->size()));
  }
  std::shared_ptr<LocalWorld> world_;
  int rank_;
};

}  // namespace

std::shared_ptr<LocalWorld> make_local_world(int size, double timeout_s) {
  return std::make_shared<LocalWorld>(size, timeout_s);
}

std::unique_ptr<Communicator> local_communicator(const std::shared_ptr<LocalWorld>& world, int rank) {
  return std::make_unique<LocalCommunicator>(world, rank);
}

}  // namespace oases
