// `meshflow autoshard` (DESIGN's "Automatic sharding"): the placements of every tensor and node,
// the ZeRO level and the micro-batch count that minimise the step's estimate (est_step_s) with
// the per-device memory within a limit. docs/autoshard.md is the user's account.
//
// The search is a choice problem (auto/search.h) built from the model, pure data:
//   - a variable per compute node: its choices are the operator's own sharding strategies
//     (ops/strategy.h) on the node's mesh, each with the result it makes (and, where the model
//     pins the node, that result moved to the pin); a weight or input read by that node alone
//     takes the layout the strategy wants (no move);
//   - a variable per source read more than once (its choices: the layouts its readers'
//     strategies want, and its own), and per parallel op (its own layout, its one choice);
//   - per choice: its kernel's seconds forward and backward (the cost model's kernel_seconds
//     of its shards, the backward one kernel per operand with a gradient), the move of its result
//     to a pin, and for each weight it owns the gradient's reduction into the weight's layout
//     (its ZeRO layout at ZeRO 1 and 3), the update, and at ZeRO 3 the gathers before each use;
//     and its bytes under the additive memory model (below);
//   - per operand edge: the planner's estimate of moving the producer's choice to the
//     consumer's, and of moving the gradient back (Partial where the consumer's strategy shards
//     a dim the operand lacks).
// Per-micro-batch terms count M times. The memory model sums, per device, the largest shard of:
// every forward value of one micro-batch that the recomputation policy keeps (kept until its
// backward; a value it recomputes costs its kernel's forward seconds once more instead), every
// micro-batch of the inputs, and each weight's bytes with its gradient and optimizer state
// (state and, at ZeRO 3, weight and gradient in the ZeRO layout).
//
// The policy is searched too where it is not given (AutoshardOptions::recompute, the model's
// "train" object): without a memory limit none (recomputation only adds work); with one, each
// of none, selective and full (where the model marks a node) is searched and priced, and the
// fastest choice that fits wins, so none whenever it fits at the lowest estimate.
//
// Every (ZeRO, M) pair searched is solved (the ZeRO levels at once, on threads); the best choice,
// and the next where the search puts it within 1%, are written as model files and priced by the
// compiler itself (graph/explain.h's explain_compiled): the result reports that estimate and
// peak, so est_step_s equals `explain --json`'s on the written file. The model's own placements
// are priced the same way and chosen where they are better.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshflow/auto/search.h"
#include "meshflow/graph/passes.h"
#include "meshflow/graph/pcg.h"
#include "meshflow/ops/strategy.h"
#include "meshflow/plan/plan_cache.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

struct AutoshardOptions {
  // One mesh of this shape ("4", "2x2") for the whole model instead of its own meshes.
  std::optional<std::string> mesh;
  std::optional<std::int64_t> memory_limit;  // bytes per device
  UpdateRule update;                         // the optimizer the step runs
  std::optional<int> zero;                   // fixed where given
  std::optional<int> micro_batches;          // fixed where given
  std::optional<Recompute> recompute;        // fixed where given
  PlanOptions plan;                          // the machine description
  int threads_per_device = 0;
};

// The choice problem of a built graph (Stage::kBuilt, with a loss) for one ZeRO level and
// micro-batch count, and what each variable's choices mean.
struct PlacementProblem {
  ChoiceProblem problem;
  struct Meaning {
    ValueId node = 0;
    std::vector<Layout> results;  // per choice: the node's (or source's) layout
    // Per choice: the layouts its private sources take (operand index, layout).
    std::vector<std::vector<std::pair<int, Layout>>> sources;
  };
  std::vector<Meaning> meanings;  // per variable
};

// What one search computes once: the planner's estimate of each move between two layouts and
// each operator's strategies on its operands' shapes (every ZeRO level and micro-batch count,
// and every block of a model made of equal blocks, meets the same ones again).
class SearchCache {
 public:
  explicit SearchCache(const PlanOptions& options) : options_(options), plans_(options) {}
  // Returns the layout's number (the same for equal layouts).
  int id(const Layout& layout);
  // Returns the estimated seconds of moving a value from layout `from` to layout `to` (ids), 0
  // where they are equal, or kInfeasibleSeconds where no plan makes it (a shard cannot become
  // a partial term).
  double seconds(int from, int to);
  // Returns ops/strategy.h's strategies(op, inputs).
  const std::vector<Strategy>& strategies(const Op& op, const std::vector<Layout>& inputs);

 private:
  struct Hash {
    std::size_t operator()(const Layout& l) const { return hash_value(l); }
  };
  struct StrategyKey {
    Op op;
    std::vector<Layout> inputs;
    bool operator==(const StrategyKey&) const = default;
  };
  struct StrategyHash {
    std::size_t operator()(const StrategyKey& k) const;
  };
  PlanOptions options_;
  PlanCache plans_;
  std::vector<Layout> layouts_;
  std::unordered_map<Layout, int, Hash> ids_;
  std::unordered_map<std::int64_t, double> seconds_;
  std::unordered_map<StrategyKey, std::vector<Strategy>, StrategyHash> strategies_;
};

// The seconds of a choice no program makes: no sum of real seconds reaches it.
inline constexpr double kInfeasibleSeconds = 1e18;

// Builds the problems for `pcg` (micro-batches already split where M > 1) with `cache`, one per
// ZeRO level of `zeros`, in that order: their operand edges' tables are priced once.
std::vector<PlacementProblem> placement_problems(const Pcg& pcg, const std::vector<int>& zeros,
                                                 int micro_batches, const AutoshardOptions& options,
                                                 SearchCache& cache);

struct AutoshardResult {
  nlohmann::json model;  // the written model file, paths relative to the folder it goes to
  double est_step_s = 0;
  std::optional<double> given_est_step_s;  // the model's own placements (null: they do not fit)
  std::int64_t memory_per_device_bytes = 0;
  int zero = 0, micro_batches = 1;
  Recompute recompute = Recompute::kNone;
  double search_s = 0;     // reading the model, building and solving every (ZeRO, M) problem
  double priced_s = 0;     // the compiler pricing the choice and the model's own placements
  bool exact = true;       // the search was exact on every (ZeRO, M) it solved
  bool given_won = false;  // the model's own placements were the best
  std::vector<std::pair<std::string, Layout>> values;  // the written file's, in graph order
};

// Chooses for the model file at `model`, writing paths relative to `out_dir`. Throws Error
// (kInvalidArgument) when no choice fits the memory limit, giving the least memory any choice
// needs.
AutoshardResult autoshard(const std::filesystem::path& model, const AutoshardOptions& options,
                          const std::filesystem::path& out_dir);

// DESIGN's `autoshard --json` object.
nlohmann::json to_json(const AutoshardResult& result);

}  // namespace meshflow
