// main() for GoogleTest binaries run under mpirun: every rank runs every test, only rank 0
// prints, and the job fails if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "meshflow/comm/mpi/launch.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = meshflow::mpi::world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any = failed;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  return any;
}
