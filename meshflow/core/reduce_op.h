// The reductions a Partial placement or a reducing collective can apply: sum, avg, max, min.
// Lives in core/ because both mesh/ (Partial(op)) and comm/ (all_reduce(op)) name it.
#pragma once

#include <string>
#include <string_view>

namespace meshflow {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

// Returns "sum", "avg", "max" or "min".
std::string_view to_string(ReduceOp op);

// Returns the op named `name` (sum, avg, max, min); throws Error naming `name` otherwise.
ReduceOp parse_reduce_op(std::string_view name);

}  // namespace meshflow

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "meshflow/core/dtype.h"

namespace meshflow {

// Writes out[i] = op(terms[0][i], terms[1][i], ...) for i < n, combining terms in the order
// given, so every caller that passes the same terms in the same order gets the same bits. avg
// is the sum divided by terms.size(). `out` may be any term itself (the same elements, as in an
// in-place all-reduce). Precondition: terms non-empty.
void reduce_terms(ReduceOp op, DType dtype, std::span<const std::byte* const> terms, std::byte* out,
                  std::int64_t n);

// One reduction equivalent to reducing Partial dims with ops `ops` (sizes `sizes`) together:
// when every op is sum or avg, a sum followed by division by the product of the avg dims'
// sizes; when all ops are equal, that op (divisor 1). Mixed ops have none (nullopt).
struct FlatReduction {
  ReduceOp op;
  std::int64_t divisor;
  bool operator==(const FlatReduction&) const = default;
};
std::optional<FlatReduction> flat_reduction(std::span<const ReduceOp> ops,
                                            std::span<const std::int64_t> sizes);

// Writes into `out` (n elements) the value of Partial terms laid out as the devices of a group
// along Partial mesh dims with sizes `sizes` and ops `ops`, `terms` in row-major order over
// those dims. When every op is sum or avg: the flat sum in that order divided by the product of
// the avg dims' sizes; when all ops are equal: the flat op; otherwise the innermost dim reduces
// first. `out` may be one of the terms.
void reduce_partial_terms(std::span<const ReduceOp> ops, std::span<const std::int64_t> sizes,
                          DType dtype, std::span<const std::byte* const> terms, std::byte* out,
                          std::int64_t n);

// Divides n elements of `data` by `divisor` (integers truncate toward zero, as NumPy's // does
// not; this matches C++ and MPI).
void divide_by(DType dtype, std::byte* data, std::int64_t n, std::int64_t divisor);

}  // namespace meshflow
