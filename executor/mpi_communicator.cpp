#include "executor/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "graph/status.h"

#ifdef OASES_WITH_MPI
#include <mpi.h>
#endif

namespace oases {

bool launched_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"}) {
    const char* s = std::getenv(v);
    if (s && std::atoi(s) > 1) return true;
  }
  return false;
}

#ifdef OASES_WITH_MPI

bool mpi_available() {
  return true;
}

namespace {

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI64: return MPI_INT64_T;
    case DType::kI32: return MPI_INT32_T;
    default: throw OasesError(fmt::format("MPI: type {} is not supported", dtype_name(dt)));
  }
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw OasesError(fmt::format("{} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
  }
}

// Polls with a deadline: a peer that died or hangs ends the job with an error, not a hang.
void mpi_wait(MPI_Request& req, double timeout, const std::function<std::string()>& what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  int done = 0;
  int spins = 0;
  while (!done) {
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string msg = fmt::format("{}: a peer did not take part within {:.0f} s; aborting the job", what(), timeout);
      std::fprintf(stderr, "error: %s\n", msg.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
      throw OasesError(msg);
    }
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class MpiRequest : public CommRequest {
 public:
  MpiRequest(MPI_Request req, double timeout, std::string what) : req_(req), timeout_(timeout), what_(std::move(what)) {}
  ~MpiRequest() override {
    // a request dropped without a wait (an error unwinding) must not leave MPI writing into
    // freed memory: cancel what can be cancelled
    if (req_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&req_);
      MPI_Request_free(&req_);
    }
  }
  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    mpi_wait(req_, timeout_, [&] { return what_; });
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

 private:
  MPI_Request req_;
  double timeout_;
  std::string what_;
};

int checked_count(int64_t bytes, const char* what) {
  if (bytes < 0 || bytes > std::numeric_limits<int>::max())
    throw OasesError(fmt::format("MPI {} of {} bytes: more than one message carries (2^31 - 1)", what, bytes));
  return static_cast<int>(bytes);
}

class MpiGroup : public CommGroup {
 public:
  MpiGroup(MPI_Comm comm, std::vector<int> members, int index, double timeout)
      : comm_(comm), members_(std::move(members)), index_(index), timeout_(timeout), seen_(members_.size(), 0) {
    // collective, and every member creates its groups in the same order
    check(MPI_Comm_dup(comm_, &notes_), "MPI_Comm_dup");
  }
  ~MpiGroup() override {
    for (auto& n : sent_) MPI_Request_free(&n.req);
    if (notes_ != MPI_COMM_NULL) MPI_Comm_free(&notes_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }

  void all_reduce(void* data, int64_t count, DType dt, ReduceOp op) override {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(dt), op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, comm_, &req),
          "MPI_Iallreduce");
    wait(req, "all-reduce");
  }
  void all_gather(const void* in, void* out, int64_t bytes) override {
    MPI_Request req;
    check(MPI_Iallgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, comm_, &req), "MPI_Iallgather");
    wait(req, "all-gather");
  }
  void reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) override {
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(in, out, static_cast<int>(count), mpi_type(dt), op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, comm_, &req),
          "MPI_Ireduce_scatter_block");
    wait(req, "reduce-scatter");
  }
  void all_to_all(const void* in, void* out, int64_t bytes) override {
    MPI_Request req;
    check(MPI_Ialltoall(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, comm_, &req), "MPI_Ialltoall");
    wait(req, "all-to-all");
  }
  void shift(const void* in, void* out, int64_t bytes, int offset) override {
    int n = size(), to = ((index_ + offset) % n + n) % n, from = ((index_ - offset) % n + n) % n;
    MPI_Request send, recv;
    int count = checked_count(bytes, "ring shift");
    check(MPI_Irecv(out, count, MPI_BYTE, from, kShiftTag, comm_, &recv), "MPI_Irecv");
    check(MPI_Isend(in, count, MPI_BYTE, to, kShiftTag, comm_, &send), "MPI_Isend");
    wait(recv, "ring shift (receive)");
    wait(send, "ring shift (send)");
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    MPI_Request req;
    check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
    wait(req, "broadcast");
  }
  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
    wait(req, "barrier");
  }
  std::unique_ptr<CommRequest> ibroadcast(void* data, int64_t bytes, int root) override {
    MPI_Request req;
    check(MPI_Ibcast(data, checked_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
    return std::make_unique<MpiRequest>(req, timeout_, fmt::format("broadcast in {}", describe()));
  }

 private:
  // Polls with a deadline: a peer that died or hangs ends the job with an error, not a hang. A
  // member that has waited a while tells the others (a note on notes_ with this collective's
  // number), so that the member that times out can name the ranks that never arrived.
  void wait(MPI_Request& req, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_);
    const auto note_after = start + std::chrono::duration<double>(std::min(1.0, timeout_ / 4));
    ++seq_;
    read_notes();
    bool noted = false;
    int done = 0;
    int spins = 0;
    while (!done) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) break;
      auto now = std::chrono::steady_clock::now();
      if (!noted && now > note_after) {
        send_notes();
        noted = true;
      }
      if (now > deadline) {
        read_notes();
        std::vector<int> missing;
        for (size_t j = 0; j < members_.size(); ++j) {
          if (static_cast<int>(j) != index_ && seen_[j] < seq_) missing.push_back(members_[j]);
        }
        std::string msg = fmt::format("{} in {}: waited {:g} s (--comm-timeout) for rank{} {}, which did not arrive; aborting the job",
                                      what, describe(), timeout_, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "));
        std::fprintf(stderr, "error: rank %d: %s\n", members_[static_cast<size_t>(index_)], msg.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 2);
        throw OasesError(msg);
      }
      if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // "I am waiting in collective seq_" to every other member; the buffers live until sent.
  void send_notes() {
    std::erase_if(sent_, [](Note& n) {
      int flag = 0;
      MPI_Test(&n.req, &flag, MPI_STATUS_IGNORE);
      return flag != 0;
    });
    for (size_t j = 0; j < members_.size(); ++j) {
      if (static_cast<int>(j) == index_) continue;
      sent_.push_back(Note{std::make_unique<int64_t>(seq_), MPI_REQUEST_NULL});
      check(MPI_Isend(sent_.back().seq.get(), 1, MPI_INT64_T, static_cast<int>(j), kNoteTag, notes_, &sent_.back().req), "MPI_Isend");
    }
  }
  void read_notes() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      check(MPI_Iprobe(MPI_ANY_SOURCE, kNoteTag, notes_, &flag, &st), "MPI_Iprobe");
      if (!flag) return;
      int64_t seq = 0;
      check(MPI_Recv(&seq, 1, MPI_INT64_T, st.MPI_SOURCE, kNoteTag, notes_, MPI_STATUS_IGNORE), "MPI_Recv");
      seen_[static_cast<size_t>(st.MPI_SOURCE)] = std::max(seen_[static_cast<size_t>(st.MPI_SOURCE)], seq);
    }
  }

  static constexpr int kNoteTag = 7;
  static constexpr int kShiftTag = 11;  // point to point on comm_ (collectives have their own context)
  struct Note {
    std::unique_ptr<int64_t> seq;
    MPI_Request req;
  };
  MPI_Comm comm_;
  std::vector<int> members_;
  int index_;
  double timeout_;
  MPI_Comm notes_ = MPI_COMM_NULL;  // a twin of comm_ for the waiting notes only
  int64_t seq_ = 0;                 // collectives started on this group (the same on every member)
  std::vector<int64_t> seen_;       // per member: the last collective it said it waits in
  std::vector<Note> sent_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &p2p_), "MPI_Comm_dup");
  }
  ~MpiCommunicator() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
      drop_channel_groups();
      if (p2p_ != MPI_COMM_NULL) MPI_Comm_free(&p2p_);
      MPI_Finalize();
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "mpi"; }
  std::unique_ptr<CommGroup> make_group(const std::vector<int>& ranks) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) throw OasesError(fmt::format("rank {} is not in the group it creates", rank_));
    MPI_Comm comm;
    // every rank calls this once per mesh axis, in the same order: MPI_Comm_split pairs the calls
    check(MPI_Comm_split(MPI_COMM_WORLD, *std::min_element(ranks.begin(), ranks.end()), static_cast<int>(it - ranks.begin()), &comm),
          "MPI_Comm_split");
    return std::make_unique<MpiGroup>(comm, ranks, static_cast<int>(it - ranks.begin()), timeout_s);
  }
  void abort(const std::string& why) override {
    std::fprintf(stderr, "error: rank %d: %s\n", rank_, why.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t bytes, int to, int tag) override {
    check_peer(to, tag, "send");
    MPI_Request req;
    check(MPI_Isend(data, checked_count(bytes, "send"), MPI_BYTE, to, tag, p2p(), &req), "MPI_Isend");
    return std::make_unique<MpiRequest>(req, timeout_s, fmt::format("send from rank {} to rank {} (tag {})", rank_, to, tag));
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t bytes, int from, int tag) override {
    check_peer(from, tag, "receive");
    MPI_Request req;
    check(MPI_Irecv(data, checked_count(bytes, "receive"), MPI_BYTE, from, tag, p2p(), &req), "MPI_Irecv");
    return std::make_unique<MpiRequest>(req, timeout_s, fmt::format("receive by rank {} from rank {} (tag {})", rank_, from, tag));
  }

 protected:
  std::unique_ptr<CommGroup> make_channel_group(const std::vector<int>& ranks, int tag) override {
    // Only the members call MPI_Comm_create_group (the tag keeps concurrent creations apart).
    MPI_Group world_group, group;
    check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
    check(MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group), "MPI_Group_incl");
    MPI_Comm comm;
    check(MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm), "MPI_Comm_create_group");
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    int index = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
    return std::make_unique<MpiGroup>(comm, ranks, index, timeout_s);
  }

 private:
  // Point-to-point traffic has a communicator of its own, so its tags never meet a collective's.
  MPI_Comm p2p() {
    if (p2p_ == MPI_COMM_NULL) throw OasesError("MPI point-to-point used before the communicator was set up");
    return p2p_;
  }
  void check_peer(int peer, int tag, const char* what) const {
    if (tag < 0 || tag > kMaxChannelTag)
      throw OasesError(fmt::format("MPI {}: channel tag {} is outside 0 … {}", what, tag, kMaxChannelTag));
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw OasesError(fmt::format("MPI {} by rank {}: peer {} is not another rank of the {}-rank world", what, rank_, peer, size_));
  }
  int rank_ = 0, size_ = 1;
  MPI_Comm p2p_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<Communicator> mpi_communicator(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  }
  return std::make_unique<MpiCommunicator>();
}

#else

bool mpi_available() {
  return false;
}

std::unique_ptr<Communicator> mpi_communicator(int*, char***) {
  throw OasesError("this build of Oases has no MPI (configure with -DOASES_MPI=ON)");
}

#endif

}  // namespace oases
