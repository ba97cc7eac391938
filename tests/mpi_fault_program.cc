// A device that stalls or dies in the middle of an mpi job, for mpi_faults_test.py: the other
// devices must fail within the timeout (2 s here) instead of waiting forever.
// Usage: mpirun -n 4 mpi_fault_program stall|die
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "meshflow/comm/launch.h"

int main(int argc, char** argv) {
  using namespace meshflow;
  const std::string mode = argc > 1 ? argv[1] : "stall";
  launch({.backend = Backend::kMpi, .timeout = std::chrono::seconds(2)}, [&](Communicator& comm) {
    std::vector<float> data(1024, 1.0f);
    all_reduce(comm, {.send = reinterpret_cast<std::byte*>(data.data()),
                      .recv = reinterpret_cast<std::byte*>(data.data()),
                      .count = 1024});
    if (comm.device() == 1) {
      if (mode == "die") std::_Exit(3);
      std::this_thread::sleep_for(std::chrono::seconds(120));
    }
    all_reduce(comm, {.send = reinterpret_cast<std::byte*>(data.data()),
                      .recv = reinterpret_cast<std::byte*>(data.data()),
                      .count = 1024});
  });
  return 0;
}
