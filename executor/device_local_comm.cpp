#include "executor/device_local_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/status.h"

namespace oases {

namespace {

class HostOps : public DeviceOps {
 public:
  std::string name() const override { return "host"; }
  Event record(Stream) override { return nullptr; }
  void wait(Stream, Event) override {}
  void release(Event) override {}
  void copy(void* dst, const void* src, int64_t bytes, Stream) override {
    if (dst != src && bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  void reduce(void* acc, const void* x, int64_t count, DType dt, ReduceOp op, Stream) override { reduce_into(acc, x, count, dt, op); }
  void* scratch(int64_t bytes, Stream) override { return std::malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1))); }
  void free_scratch(void* p, Stream) override { std::free(p); }
};

bool overlap(const void* a, int64_t abytes, const void* b, int64_t bbytes) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return x < y + bbytes && y < x + abytes;
}

// What a member brings to one phase of a collective: its buffers and the event after which they
// may be read (phase 0), or after which it has read the others' (phase 1).
struct Post {
  const void* in = nullptr;
  void* out = nullptr;
  DeviceOps::Event ev = nullptr;
};

}  // namespace

// A transfer between two ranks: posted by one side, completed by the other, which enqueues the
// copy on its own stream after the first side's event and records `done`.
struct DeviceTransfer {
  std::shared_ptr<DeviceOps> ops;
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
  bool send_posted = false, recv_posted = false;
  DeviceOps::Event first = nullptr;  // the first side's: its buffer ready (send) or free to write (receive)
  DeviceOps::Event done = nullptr;   // after the copy
  bool copied = false;               // the copy is enqueued and `done` recorded
  std::string error;                 // a mismatch found when the second side came
  ~DeviceTransfer() {
    if (first) ops->release(first);
    if (done) ops->release(done);
  }
};

class DeviceLocalWorld {
 public:
  DeviceLocalWorld(int size, std::shared_ptr<DeviceOps> ops, double timeout) : size_(size), ops_(std::move(ops)), timeout_(timeout) {}
  int size() const { return size_; }
  DeviceOps& ops() { return *ops_; }
  const std::shared_ptr<DeviceOps>& ops_ptr() const { return ops_; }
  double timeout() const { return timeout_; }

  // Waits (host) until `ready` holds, giving up after the timeout or on abort with an error
  // naming `what`. `lock` is held on entry and return.
  void wait_until(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready, const std::string& what) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_));
    while (!ready()) {
      if (!abort_why_.empty()) throw OasesError(fmt::format("{}: aborted: {}", what, abort_why_));
      if (cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(50))) ==
              std::cv_status::timeout &&
          std::chrono::steady_clock::now() >= deadline && !ready()) {
        std::string why = fmt::format("{}: nothing for {:.0f} s; a peer may have failed or hung", what, timeout_);
        abort_why_ = why;
        cv_.notify_all();
        throw OasesError(why);
      }
    }
  }

  // Member `index`'s post for phase `ph` of round `seq` of the group keyed (ranks, tag); returns every
  // member's once all have posted.
  std::vector<Post> meet(const std::vector<int>& ranks, int tag, uint64_t seq, int ph, int index, Post p, const std::string& what) {
    std::unique_lock<std::mutex> lock(mu_);
    Round& r = rounds_[{ranks, tag, seq}];
    if (r.posts[ph].empty()) r.posts[ph].resize(ranks.size());
    r.posts[ph][static_cast<size_t>(index)] = p;
    ++r.count[ph];
    cv_.notify_all();
    const size_t n = ranks.size();
    Round* rp = &r;
    wait_until(lock, [&] { return rp->count[ph] == static_cast<int>(n); }, what);
    std::vector<Post> all = rp->posts[ph];
    if (ph == 1 && ++rp->left == static_cast<int>(n)) rounds_.erase({ranks, tag, seq});
    return all;
  }

  // Member `index`'s next call on the group keyed (ranks, tag): counted per group, not per group
  // object, so that two objects of one group (made by different owners) keep one order.
  uint64_t next_call(const std::vector<int>& ranks, int tag, int index) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint64_t>& c = calls_[{ranks, tag}];
    if (c.empty()) c.resize(ranks.size(), 0);
    return c[static_cast<size_t>(index)]++;
  }

  std::mutex& mu() { return mu_; }
  std::condition_variable& cv() { return cv_; }
  std::deque<std::shared_ptr<DeviceTransfer>>& box(int from, int to, int tag) { return boxes_[{from, to, tag}]; }

  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_why_.empty()) abort_why_ = why;
    cv_.notify_all();
  }

 private:
  struct Round {
    std::vector<Post> posts[2];
    int count[2] = {0, 0};
    int left = 0;
  };
  int size_;
  std::shared_ptr<DeviceOps> ops_;
  double timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string abort_why_;
  std::map<std::tuple<std::vector<int>, int, uint64_t>, Round> rounds_;
  std::map<std::pair<std::vector<int>, int>, std::vector<uint64_t>> calls_;  // per group, each member's calls so far
  std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<DeviceTransfer>>> boxes_;  // unmatched, in order
};

namespace {

class DeviceLocalGroup : public StreamGroup {
 public:
  DeviceLocalGroup(std::shared_ptr<DeviceLocalWorld> w, std::vector<int> members, int index, int tag)
      : w_(std::move(w)), members_(std::move(members)), index_(index), tag_(tag) {}
  ~DeviceLocalGroup() override {
    if (prev_read_) w_->ops().release(prev_read_);
  }
  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  void set_stream(void* s) override { stream_ = s; }

  void all_reduce(void* data, int64_t count, DType dt, ReduceOp op) override {
    const int64_t bytes = count * static_cast<int64_t>(dtype_size(dt));
    void* tmp = nullptr;
    run(
        "all-reduce", data, data,
        [&](const std::vector<Post>& p) {
          tmp = ops().scratch(bytes, stream_);
          ops().copy(tmp, p[0].in, bytes, stream_);
          for (size_t j = 1; j < p.size(); ++j) ops().reduce(tmp, p[j].in, count, dt, op, stream_);
        },
        [&] {
          ops().copy(data, tmp, bytes, stream_);
          ops().free_scratch(tmp, stream_);
        });
  }

  void all_gather(const void* in, void* out, int64_t bytes) override {
    run("all-gather", in, out, [&](const std::vector<Post>& p) {
      for (size_t j = 0; j < p.size(); ++j) ops().copy(static_cast<char*>(out) + static_cast<int64_t>(j) * bytes, p[j].in, bytes, stream_);
    });
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) override {
    const int64_t bytes = count * static_cast<int64_t>(dtype_size(dt)), at = static_cast<int64_t>(index_) * bytes;
    void* tmp = nullptr;
    run(
        "reduce-scatter", in, out,
        [&](const std::vector<Post>& p) {
          tmp = ops().scratch(bytes, stream_);
          ops().copy(tmp, static_cast<const char*>(p[0].in) + at, bytes, stream_);
          for (size_t j = 1; j < p.size(); ++j) ops().reduce(tmp, static_cast<const char*>(p[j].in) + at, count, dt, op, stream_);
        },
        [&] {
          ops().copy(out, tmp, bytes, stream_);
          ops().free_scratch(tmp, stream_);
        });
  }

  void all_to_all(const void* in, void* out, int64_t bytes) override {
    const int64_t all = bytes * size(), at = static_cast<int64_t>(index_) * bytes;
    const bool through = overlap(in, all, out, all);
    void* tmp = nullptr;
    run(
        "all-to-all", in, out,
        [&](const std::vector<Post>& p) {
          char* dst = static_cast<char*>(through ? (tmp = ops().scratch(all, stream_)) : out);
          for (size_t j = 0; j < p.size(); ++j) ops().copy(dst + static_cast<int64_t>(j) * bytes, static_cast<const char*>(p[j].in) + at, bytes, stream_);
        },
        [&] {
          if (!tmp) return;
          ops().copy(out, tmp, all, stream_);
          ops().free_scratch(tmp, stream_);
        });
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    if (root < 0 || root >= size()) throw OasesError(fmt::format("device-local broadcast of {}: root {} is not a member", describe(), root));
    run("broadcast", data, data, [&](const std::vector<Post>& p) {
      if (index_ != root) ops().copy(data, p[static_cast<size_t>(root)].in, bytes, stream_);
    });
  }

  void shift(const void* in, void* out, int64_t bytes, int offset) override {
    const int n = size(), from = ((index_ - offset) % n + n) % n;
    const bool through = overlap(in, bytes, out, bytes) && from != index_;
    void* tmp = nullptr;
    run(
        "ring shift", in, out,
        [&](const std::vector<Post>& p) {
          void* dst = through ? (tmp = ops().scratch(bytes, stream_)) : out;
          ops().copy(dst, p[static_cast<size_t>(from)].in, bytes, stream_);
        },
        [&] {
          if (!tmp) return;
          ops().copy(out, tmp, bytes, stream_);
          ops().free_scratch(tmp, stream_);
        });
  }

  void barrier() override {
    run("barrier", nullptr, nullptr, [](const std::vector<Post>&) {});
  }

 private:
  DeviceOps& ops() { return w_->ops(); }

  // One collective: every member's buffers and their ready events meet (the host waits for all
  // members to issue it); this member's stream waits for the others' and `reads` enqueues its
  // reads of their buffers; the events after every member's reads meet, and `after` (writes over
  // a buffer others read) follows them on the stream, as does everything the caller enqueues next.
  void run(const char* what, const void* in, void* out, const std::function<void(const std::vector<Post>&)>& reads,
           const std::function<void()>& after = {}) {
    const uint64_t seq = w_->next_call(members_, tag_, index_);
    const std::string who = fmt::format("device-local {} of {} (call {})", what, describe(), seq);
    DeviceOps::Event ready = ops().record(stream_);
    std::vector<Post> p = w_->meet(members_, tag_, seq, 0, index_, Post{in, out, ready}, who);
    if (prev_read_) ops().release(prev_read_);  // every member waited on it before coming here
    prev_read_ = nullptr;
    for (size_t j = 0; j < p.size(); ++j) {
      if (static_cast<int>(j) != index_) ops().wait(stream_, p[j].ev);
    }
    reads(p);
    DeviceOps::Event read = ops().record(stream_);
    std::vector<Post> r = w_->meet(members_, tag_, seq, 1, index_, Post{nullptr, nullptr, read}, who);
    ops().release(ready);  // every member enqueued its wait on it before its phase-1 post
    for (size_t j = 0; j < r.size(); ++j) {
      if (static_cast<int>(j) != index_) ops().wait(stream_, r[j].ev);
    }
    if (after) after();
    prev_read_ = read;
  }

  std::shared_ptr<DeviceLocalWorld> w_;
  std::vector<int> members_;
  int index_;
  int tag_;
  DeviceOps::Stream stream_ = nullptr;
  DeviceOps::Event prev_read_ = nullptr;  // this member's last reads-done event, released at the next call
};

// One side of a transfer. wait(): the host waits until the other side has been issued; a side
// that did not enqueue the copy orders its stream after it.
class TransferRequest : public CommRequest {
 public:
  TransferRequest(std::shared_ptr<DeviceLocalWorld> w, std::shared_ptr<DeviceTransfer> t, DeviceOps::Stream s, bool copied, std::string what)
      : w_(std::move(w)), t_(std::move(t)), stream_(s), copied_(copied), what_(std::move(what)) {}
  void wait() override {
    if (waited_) return;
    {
      std::unique_lock<std::mutex> lock(w_->mu());
      DeviceTransfer* t = t_.get();
      w_->wait_until(lock, [t] { return t->copied || !t->error.empty(); }, what_);
      if (!t_->error.empty()) throw OasesError(t_->error);
    }
    if (!copied_) w_->ops().wait(stream_, t_->done);
    waited_ = true;
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(w_->mu());
    return t_->copied;
  }

 private:
  std::shared_ptr<DeviceLocalWorld> w_;
  std::shared_ptr<DeviceTransfer> t_;
  DeviceOps::Stream stream_;
  bool copied_;
  std::string what_;
  bool waited_ = false;
};

class DeviceLocalCommunicator : public Communicator {
 public:
  DeviceLocalCommunicator(std::shared_ptr<DeviceLocalWorld> w, int rank) : w_(std::move(w)), rank_(rank) { timeout_s = w_->timeout(); }
  int rank() const override { return rank_; }
  int size() const override { return w_->size(); }
  std::string kind() const override { return "device-local"; }
  std::unique_ptr<CommGroup> make_group(const std::vector<int>& ranks) override { return group(ranks, -1); }
  void abort(const std::string& why) override { w_->abort(why); }
  void set_stream(DeviceOps::Stream s) override { stream_ = s; }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t bytes, int to, int tag) override {
    return transfer(true, const_cast<void*>(data), bytes, to, tag);
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t bytes, int from, int tag) override { return transfer(false, data, bytes, from, tag); }

 protected:
  std::unique_ptr<CommGroup> make_channel_group(const std::vector<int>& ranks, int tag) override { return group(ranks, tag); }

 private:
  std::unique_ptr<CommGroup> group(const std::vector<int>& ranks, int tag) {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) throw OasesError(fmt::format("rank {} is not in group [{}]", rank_, fmt::join(ranks, ", ")));
    for (int r : ranks) {
      if (r < 0 || r >= size()) throw OasesError(fmt::format("group [{}]: rank {} is outside the world of {}", fmt::join(ranks, ", "), r, size()));
    }
    auto g = std::make_unique<DeviceLocalGroup>(w_, ranks, static_cast<int>(it - ranks.begin()), tag);
    g->set_stream(stream_);
    return g;
  }

  std::unique_ptr<CommRequest> transfer(bool send, void* data, int64_t bytes, int peer, int tag) {
    if (peer < 0 || peer >= size()) throw OasesError(fmt::format("device-local transfer with rank {}: the world has ranks 0 … {}", peer, size() - 1));
    if (tag < 0 || tag > kMaxChannelTag) throw OasesError(fmt::format("device-local transfer tag {} is outside 0 … {}", tag, kMaxChannelTag));
    const int from = send ? rank_ : peer, to = send ? peer : rank_;
    const std::string what = fmt::format("device-local {} of {} bytes {} rank {} (tag {})", send ? "send" : "receive", bytes,
                                         send ? "to" : "from", peer, tag);
    DeviceOps& o = w_->ops();
    std::shared_ptr<DeviceTransfer> t;
    {
      std::lock_guard<std::mutex> lock(w_->mu());
      auto& q = w_->box(from, to, tag);
      if (!q.empty() && (send ? q.front()->recv_posted : q.front()->send_posted)) {
        t = q.front();
        q.pop_front();
      } else {
        t = std::make_shared<DeviceTransfer>();
        t->ops = w_->ops_ptr();
        t->bytes = bytes;
        if (send) {
          t->src = data;
          t->send_posted = true;
        } else {
          t->dst = data;
          t->recv_posted = true;
        }
        t->first = o.record(stream_);
        q.push_back(t);
        return std::make_unique<TransferRequest>(w_, t, stream_, false, what);
      }
    }
    // the second side: the copy on this stream, after the first side's event
    if (t->bytes != bytes) {
      std::lock_guard<std::mutex> lock(w_->mu());
      t->error = fmt::format("device-local transfer from rank {} to rank {} (tag {}): {} bytes sent into a receive of {}", from, to, tag,
                             send ? bytes : t->bytes, send ? t->bytes : bytes);
      w_->cv().notify_all();
      throw OasesError(t->error);
    }
    if (send) {
      t->src = data;
    } else {
      t->dst = data;
    }
    o.wait(stream_, t->first);
    o.copy(t->dst, t->src, bytes, stream_);
    DeviceOps::Event done = o.record(stream_);
    {
      std::lock_guard<std::mutex> lock(w_->mu());
      (send ? t->send_posted : t->recv_posted) = true;
      t->done = done;
      t->copied = true;
      w_->cv().notify_all();
    }
    return std::make_unique<TransferRequest>(w_, t, stream_, true, what);
  }

  std::shared_ptr<DeviceLocalWorld> w_;
  int rank_;
  DeviceOps::Stream stream_ = nullptr;
};

}  // namespace

std::shared_ptr<DeviceOps> host_device_ops() {
  return std::make_shared<HostOps>();
}

std::shared_ptr<DeviceLocalWorld> make_device_local_world(int size, std::shared_ptr<DeviceOps> ops, double timeout_s) {
  if (size < 1) throw OasesError(fmt::format("a device-local world needs at least one rank, got {}", size));
  return std::make_shared<DeviceLocalWorld>(size, std::move(ops), timeout_s);
}

std::unique_ptr<Communicator> device_local_communicator(const std::shared_ptr<DeviceLocalWorld>& world, int rank) {
  if (rank < 0 || rank >= world->size()) throw OasesError(fmt::format("rank {} of a device-local world of {}", rank, world->size()));
  return std::make_unique<DeviceLocalCommunicator>(world, rank);
}

void set_device_local_stream(CommGroup& g, DeviceOps::Stream s) {
  auto* d = dynamic_cast<DeviceLocalGroup*>(&g);
  if (!d) throw OasesError(fmt::format("{} is not a device-local group", g.describe()));
  d->set_stream(s);
}

void set_device_local_stream(Communicator& c, DeviceOps::Stream s) {
  auto* d = dynamic_cast<DeviceLocalCommunicator*>(&c);
  if (!d) throw OasesError(fmt::format("the {} communicator is not device-local", c.kind()));
  d->set_stream(s);
}

}  // namespace oases
