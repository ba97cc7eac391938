// The conformance suite on the mpi backend; run by ctest under `mpirun -n 4` and `-n 3`. Every
// rank runs every check; a failure on any rank fails the job. Only rank 0 prints the report.
#include <gtest/gtest.h>

#include "meshflow/comm/launch.h"
#include "tests/comm_conformance.h"

namespace meshflow {
namespace {

class MpiConformance : public ::testing::TestWithParam<const conformance::Check*> {};

TEST_P(MpiConformance, Runs) {
  launch({.backend = Backend::kMpi, .timeout = std::chrono::seconds(60)}, [&](Communicator& comm) {
    GetParam()->run(comm, conformance::Env{.rank_order_reductions = false});
  });
}

std::vector<const conformance::Check*> params() {
  std::vector<const conformance::Check*> out;
  for (const auto& c : conformance::checks()) out.push_back(&c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Checks, MpiConformance, ::testing::ValuesIn(params()),
                         [](const auto& p) { return p.param->name; });

}  // namespace
}  // namespace meshflow
