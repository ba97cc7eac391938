// Placement: how a tensor sits on one mesh dim: Shard(d), Replicate, or Partial(op); text forms.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "meshflow/core/reduce_op.h"

namespace meshflow {

// Invariant: `dim` is meaningful only for kShard (0 otherwise), `op` only for kPartial (kSum
// otherwise), so equal placements compare equal.
struct Placement {
  enum class Kind { kShard, kReplicate, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = 0;  // tensor dim, for kShard; may be negative until a Layout normalises it
  ReduceOp op = ReduceOp::kSum;

  static Placement shard(int dim) { return {Kind::kShard, dim, ReduceOp::kSum}; }
  static Placement replicate() { return {}; }
  static Placement partial(ReduceOp op = ReduceOp::kSum) { return {Kind::kPartial, 0, op}; }

  bool is_shard() const { return kind == Kind::kShard; }
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_partial() const { return kind == Kind::kPartial; }
  auto operator<=>(const Placement&) const = default;
};

// Returns the canonical text form: "S(0)", "R" or "P(sum)".
std::string to_string(const Placement& p);

// Returns placements joined by commas: "S(0),R".
std::string to_string(const std::vector<Placement>& ps);

// Returns the placement written in any accepted form: S(0), S0, Shard(0), R, Replicate(),
// P (= sum), P(avg), Partial(max), Partial(). Spaces are ignored. Throws Error naming `text`.
Placement parse_placement(std::string_view text);

// Returns the comma-separated placements, optionally within [ ] brackets: "S(0),R".
std::vector<Placement> parse_placements(std::string_view text);

}  // namespace meshflow
