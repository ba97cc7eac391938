// The collective conformance suite: the same checks run on every backend (threads in-process,
// mpi under mpirun). Each check runs on every device of a world communicator and reports
// failures through GoogleTest assertions.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"

namespace meshflow::conformance {

struct Env {
  // True when the backend reduces terms in rank order (threads), so float sums are compared
  // bit for bit against a rank-order reference; otherwise within a tolerance (MPI).
  bool rank_order_reductions = true;
};

struct Check {
  std::string name;
  std::function<void(Communicator&, const Env&)> run;
};

// Returns every check of the suite.
const std::vector<Check>& checks();

}  // namespace meshflow::conformance
