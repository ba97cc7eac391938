// Degrees of layouts and the parallel operators' degree checks.
#include "meshflow/graph/parallel_op.h"

#include <fmt/format.h>

#include "meshflow/core/error.h"

namespace meshflow {

Degrees degrees(const Layout& layout) {
  Degrees d;
  d.shard.assign(layout.shape.size(), 1);
  for (std::size_t m = 0; m < layout.placements.size(); ++m) {
    const Placement p = layout.placements[m];
    const std::int64_t n = layout.mesh.shape[m];
    if (p.is_shard()) {
      d.shard[static_cast<std::size_t>(p.dim)] *= n;
    } else if (p.is_partial()) {
      d.partial *= n;
    } else {
      d.replica *= n;
    }
  }
  return d;
}

std::string to_string(const Degrees& d) {
  return fmt::format("shard [{}] partial {} replica {}", fmt::join(d.shard, ","), d.partial,
                     d.replica);
}

void check_parallel_op(const Node& node, const Layout& in, const Layout& out) {
  MESHFLOW_CHECK(node.kind == NodeKind::kParallel);
  const Degrees a = degrees(in);
  const Degrees b = degrees(out);
  const std::int64_t k = node.parallel.degree;
  const auto dim = static_cast<std::size_t>(node.parallel.dim);
  Degrees expected = a;
  std::string what;
  switch (node.parallel.type) {
    case ParallelType::kRepartition:
      expected.shard[dim] *= k;
      what = fmt::format("multiplies the shard degree of dim {} by {}", dim, k);
      break;
    case ParallelType::kCombine:
      if (a.shard[dim] % k == 0)
        expected.shard[dim] /= k;
      else
        expected.shard[dim] = 0;  // no layout has it: reported below
      what = fmt::format("divides the shard degree of dim {} ({}) by {}", dim, a.shard[dim], k);
      break;
    case ParallelType::kReplicate:
      expected.replica *= k;
      what = fmt::format("multiplies the replica degree ({}) by {}", a.replica, k);
      break;
    case ParallelType::kReduction:
      if (a.partial % k == 0)
        expected.partial /= k;
      else
        expected.partial = 0;
      what = fmt::format("divides the partial degree ({}) by {}", a.partial, k);
      break;
  }
  // The replica degree is free except for replicate, where it is the degree that changes.
  const bool fits =
      expected.shard == b.shard && expected.partial == b.partial &&
      (node.parallel.type != ParallelType::kReplicate || expected.replica == b.replica);
  if (fits) return;
  fail(ErrorKind::kInvalidArgument,
       "node \"{}\": {} degree {} does not fit: it {}, but {} ({}) -> {} ({})", node.name,
       to_string(node.parallel.type), k, what, to_string(in), to_string(a), to_string(out),
       to_string(b));
}

std::vector<Placement> gradient_placements(const Layout& layout) {
  std::vector<Placement> out = layout.placements;
  for (Placement& p : out) {
    if (p.is_partial()) p = Placement::replicate();
  }
  return out;
}

}  // namespace meshflow
