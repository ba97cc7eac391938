// Operator sweeps shared by the threads and mpi suites: every operator, forward and backward, on
// random layouts (uneven and empty shards, Partial operands with random terms) of meshes (4) and
// (2,2), against the single-device result (ops' kernels run on whole tensors).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "meshflow/comm/backend.h"
#include "meshflow/core/tensor.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"

namespace meshflow::testing {

struct Operand {
  Shape shape;
  DType dtype = DType::kFloat64;
  bool partial_ok = true;                            // may be drawn Partial
  std::function<void(Tensor&)> transform = nullptr;  // applied to every shard (denominators)
};

// Every device's shard of `layout`, random: replicas hold the same bytes and each Partial term
// is random, so the global value is what assemble() reduces them to.
std::vector<Tensor> random_shards(const Layout& layout, std::uint64_t seed,
                                  const std::function<void(Tensor&)>& transform = nullptr);

// Runs op forward and backward on `trials` random layouts of each of meshes (4) and (2,2) on
// `backend` (mpi: every world rank is the device of its rank), with EXPECTs against the
// single-device result.
void check_operator(Backend backend, const Op& op, const std::vector<Operand>& operands,
                    std::uint64_t seed, int trials = 4);

// The sweep over every operator; `trials` random layouts per operator and mesh.
void check_every_operator(Backend backend, int trials);

}  // namespace meshflow::testing
