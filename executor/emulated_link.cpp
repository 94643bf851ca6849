#include "executor/emulated_link.h"

#include <sys/prctl.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "graph/status.h"

namespace oases {

namespace {

class EmulatedGroup : public CommGroup {
 public:
  EmulatedGroup(std::unique_ptr<CommGroup> inner, LinkModel link) : inner_(std::move(inner)), link_(link) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::vector<int>& members() const override { return inner_->members(); }
  void all_reduce(void* data, int64_t count, DType dt, ReduceOp op) override {
    auto t0 = Clock::now();
    inner_->all_reduce(data, count, dt, op);
    settle(t0, link_.all_reduce_s(static_cast<double>(count) * static_cast<double>(dtype_size(dt)), size()));
  }
  void all_gather(const void* in, void* out, int64_t bytes) override {
    auto t0 = Clock::now();
    inner_->all_gather(in, out, bytes);
    settle(t0, link_.gather_like_s(static_cast<double>(bytes) * size(), size()));
  }
  void reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) override {
    auto t0 = Clock::now();
    inner_->reduce_scatter(in, out, count, dt, op);
    settle(t0, link_.gather_like_s(static_cast<double>(count) * static_cast<double>(dtype_size(dt)) * size(), size()));
  }
  void all_to_all(const void* in, void* out, int64_t bytes) override {
    auto t0 = Clock::now();
    inner_->all_to_all(in, out, bytes);
    settle(t0, link_.gather_like_s(static_cast<double>(bytes) * size(), size()));
  }
  void shift(const void* in, void* out, int64_t bytes, int offset) override {
    auto t0 = Clock::now();
    inner_->shift(in, out, bytes, offset);
    settle(t0, link_.shift_s(static_cast<double>(bytes)));
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    auto t0 = Clock::now();
    inner_->broadcast(data, bytes, root);
    settle(t0, link_.broadcast_s(static_cast<double>(bytes), size()));
  }
  void barrier() override {
    auto t0 = Clock::now();
    inner_->barrier();
    settle(t0, link_.latency_us * 1e-6);
  }

 private:
  using Clock = std::chrono::steady_clock;
  // Completes `seconds` after the last member arrived (at t0, its own clock), sleeping, not spinning:
  // a link cannot move a collective's data before every member has handed in its part, so a rank
  // that arrived early waits for the late one and then for the link, as it would on the real one.
  // The inner collective returned on every member at about the same moment, so the time since the
  // last arrival is the least of the members' (now - t0): one more (8-byte) inner all-reduce, whose
  // cost the sleep absorbs. Each member measures only its own clock's differences, so members on
  // different hosts need no common clock.
  void settle(Clock::time_point t0, double seconds) {
    // Linux lets a sleeping thread oversleep by its timer slack (50 us by default) to batch
    // wake-ups; a collective's end is its emulated time, so ask for 1 us (once per thread)
    static thread_local const bool tight = prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0;
    (void)tight;
    const auto back = Clock::now();
    double since_last = -std::chrono::duration<double>(back - t0).count();  // negated: the max is the least
    if (inner_->size() > 1) inner_->all_reduce(&since_last, 1, DType::kF64, ReduceOp::kMax);
    const double wait = seconds + since_last;  // seconds - (time since the last member arrived)
    if (wait <= 0) return;
    std::this_thread::sleep_until(back + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)));
  }
  std::unique_ptr<CommGroup> inner_;
  LinkModel link_;
};

}  // namespace

std::unique_ptr<CommGroup> emulate_link(std::unique_ptr<CommGroup> inner, const LinkModel& link) {
  if (!link.enabled()) return inner;
  return std::make_unique<EmulatedGroup>(std::move(inner), link);
}

namespace {
std::vector<int>& hosts_storage() {
  static std::vector<int> h;
  return h;
}
}  // namespace

void set_emulated_hosts(std::vector<int> host_of) {
  hosts_storage() = std::move(host_of);
}

const std::vector<int>& emulated_hosts() {
  return hosts_storage();
}

LinkModel link_for_members(const std::vector<int>& members, const LinkModel& link) {
  const std::vector<int>& h = emulated_hosts();
  if (h.empty() || members.empty()) return link;
  for (int m : members) {
    if (m < 0 || static_cast<size_t>(m) >= h.size() || h[static_cast<size_t>(m)] != h[static_cast<size_t>(members.front())]) return link;
  }
  return LinkModel{};  // one host: not through the emulated link
}

}  // namespace oases
