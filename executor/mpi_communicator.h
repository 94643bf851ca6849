// The MPI communicator: one process per rank (mpirun, or srun under SLURM). Collectives use MPI's
// non-blocking calls polled against a deadline, so a dead or stuck peer ends the job with an error
// instead of a hang.
#pragma once

#include <memory>

#include "executor/communicator.h"

namespace oases {

// True when this process was started by mpirun/srun with more than one rank (OpenMPI, PMI/PMIx or
// SLURM environment variables).
bool launched_by_mpi_launcher();
// Initialises MPI (thread-multiple) once; the communicator finalises it when destroyed.
std::unique_ptr<Communicator> mpi_communicator(int* argc, char*** argv);
// Whether this build has MPI.
bool mpi_available();

}  // namespace oases
