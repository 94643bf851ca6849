// The communicator suite (tests/common/comm_suite.h) on the MPI implementation: run under
// `mpirun -np N`; exit 0 when every rank passes.
#include <cstdio>

#include "../common/comm_suite.h"
#include "executor/mpi_communicator.h"

int main(int argc, char** argv) {
  auto comm = oases::mpi_communicator(&argc, &argv);
  comm->timeout_s = 60;
  auto failures = oases::testing::run_comm_suite(*comm);
  for (const auto& f : failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
  if (failures.empty() && comm->rank() == 0) std::printf("communicator suite passed on %d MPI ranks\n", comm->size());
  return failures.empty() ? 0 : 1;
}
