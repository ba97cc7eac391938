// The parallel computation graph (PCG): values with layouts, produced by nodes that are sources
// (inputs, weights), operators of ops/, FlexFlow's parallel operators, data movements and weight
// updates. A Pcg is a plain value: built by the functions below (or from a model file,
// graph/model_file.h), transformed by the passes (one file each) and checked by verify between
// them. Node i produces value i; nodes are in topological order (a node reads only earlier ones).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/kernels/optimizer.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow {

using ValueId = int;

enum class NodeKind {
  kInput,     // data fed to the model (no gradient)
  kWeight,    // trainable
  kCompute,   // an operator of ops/
  kParallel,  // repartition, combine, replicate, reduction
  kMove,      // a change of layout inserted by a pass (copy insertion, backward, update)
  kState,     // optimizer state of a weight ("w1.exp_avg"): zeros, written by its update
  kGradNorm,  // the gradients' squared global L2 norm, each device's term (Partial(sum))
  kUpdate,    // the optimizer's step on a weight and its state (in place)
};

// Which pass of a training step a node belongs to.
enum class Phase { kForward, kBackward, kUpdate };

enum class ParallelType { kRepartition, kCombine, kReplicate, kReduction };

// FlexFlow's parallel operators in terms of degrees (see check_parallel_op).
struct ParallelOp {
  ParallelType type = ParallelType::kReplicate;
  int dim = 0;  // repartition, combine
  int degree = 1;
  bool operator==(const ParallelOp&) const = default;
};

// Where a source's values come from. Seeded initialisers give the same global tensor on any
// mesh (DESIGN.md's Philox rule, graph/source.h).
struct Source {
  // kProvided: filled by the caller after the sources load (a resumed run's checkpoint,
  // train/checkpoint.h); loading leaves it empty. kData: a data input ("input": {"data": NAME}),
  // whose batch the trainer feeds each step (train/data_feed.h); loading leaves it empty too.
  enum class Kind { kNpy, kFolder, kNormal, kUniform, kZeros, kFill, kProvided, kData };
  Kind kind = Kind::kZeros;
  std::filesystem::path path;  // kNpy, kFolder
  double a = 0, b = 0;         // normal: (std, -); uniform: (lo, hi); fill: (value, -)
  std::uint64_t seed = 0;
  std::string data;        // kData: "window" or a sample array's name
  std::int64_t shift = 0;  // kData: a window's shift
  static Source normal(double std, std::uint64_t seed) {
    return {.kind = Kind::kNormal, .a = std, .seed = seed};
  }
  bool operator==(const Source&) const = default;
};

// Set by decompose_collectives (--overlap) on a row product (ops/matmul.h) that runs the
// collective beside it as a decomposed loop overlapped with its blocks (runtime/overlap.h): the
// all-gather over mesh dim `mesh_dim` that moves its operand 0 to it (a kMove or kParallel node,
// whose value the loop makes too), or the reduce-scatter over it that its result alone feeds
// (the product's own Partial value is never made).
struct Decomposition {
  enum class Kind { kGatherOperand, kScatterResult };
  Kind kind = Kind::kGatherOperand;
  int mesh_dim = 0;
  GatherForm form = GatherForm::kPermute;  // kGatherOperand (a reduce-scatter is a ring)
  ValueId move = 0;                        // the movement node it runs
  bool operator==(const Decomposition&) const = default;
};

struct Node {
  std::string name;  // unique in the graph
  NodeKind kind = NodeKind::kCompute;
  Phase phase = Phase::kForward;
  std::vector<ValueId> inputs;
  TensorSpec spec;      // the value's global shape and dtype
  Op op;                // kCompute
  ParallelOp parallel;  // kParallel
  Source source;        // kInput, kWeight, kState
  // kInput: split into micro-batches along dim 0 (false: a mask, a constant target); after
  // split_micro_batches, the number of micro-batches its spec is one of (its source holds
  // micro_batches times the spec's dim 0).
  bool batch = true;
  int micro_batches = 1;
  UpdateRule update;  // kUpdate
  // Pins: sources and parallel ops name their layout; a compute node may pin its mesh and its
  // result's placements; a move names its target (placements unset: keep the input's).
  std::optional<DeviceMesh> mesh;
  std::optional<std::vector<Placement>> placements;
  // A compute node's preferred result placements on its mesh, set by expand_backward (a
  // gradient prefers its forward value's layout, Partial read as Replicate, and a Partial
  // gradient of a replicated value is fine as it is): layout inference prices each strategy's
  // result by its move there, as it does a pin's, but does not move it.
  std::optional<std::vector<Placement>> prefer;
  // For moves: the value moved and the node it is moved for (explain's "value"/"consumer").
  std::string moved_value, consumer;
  // Filled by infer_layouts: the value's layout, and for compute and update nodes the layouts
  // their operands must have (copy insertion makes the inputs' layouts equal them) and, for
  // compute nodes, the layout the kernel gives (copy insertion moves it to a pin).
  std::optional<Layout> layout;
  std::vector<Layout> operand_layouts;
  std::optional<Layout> result_layout;  // compute: what its kernel makes (not the pin's)
  std::optional<Decomposition> decomposed;
  // ZeRO (graph/passes.h's add_update and shard_weights). A kMove with `replaces`: once made,
  // its value replaces that weight's (ZeRO-1's all-gather of the updated shard, read by the
  // next step). A kMove with `zero_gather`: a ZeRO-3 weight gathered for one use (memory kind
  // "gathered"), dropped after it.
  std::optional<ValueId> replaces;
  bool zero_gather = false;
  // Activation recomputation (graph/passes.h's recompute_activations). `checkpoint`: the model
  // file's "checkpoint": true, a value every policy keeps (the start of the next segment under
  // full). `recomputes`: a backward copy of that forward node, run again just before the
  // backward tasks that read it ("recompute:<node>", memory kind "activations").
  bool checkpoint = false;
  std::optional<ValueId> recomputes;
  bool operator==(const Node&) const = default;
};

struct Pcg {
  std::vector<Node> nodes;
  // The values a user can name: the model's names, and gradients as "grad:<name>" once
  // expand_backward ran. Passes that insert nodes keep it pointing at the value meant.
  std::map<std::string, ValueId> names;
  std::optional<ValueId> loss;
  std::vector<ValueId> outputs;
  bool operator==(const Pcg&) const = default;
};

// Returns "repartition", "combine", "replicate", "reduction"; parses them (throws Error).
std::string_view to_string(ParallelType type);
std::optional<ParallelType> parse_parallel_type(std::string_view name);
std::string_view to_string(Phase phase);

// Returns the value named `name`; throws Error naming it when there is none.
ValueId find_value(const Pcg& pcg, const std::string& name);

// Returns the graph as text, one node per line (golden tests):
//   "h = linear(x, w1)  [forward]  2x2@0,1,2,3 S(0),S(1) f32[64,128]"
std::string to_text(const Pcg& pcg);

// Building (the C++ API the model file uses). Each function checks its node now and throws
// Error naming it: a duplicate or empty name, an unknown input, an operand count or shapes the
// operator does not take, placements that do not fit the mesh or the tensor.
ValueId add_input(Pcg& pcg, std::string name, TensorSpec spec, DeviceMesh mesh,
                  std::vector<Placement> placements, Source source);
ValueId add_weight(Pcg& pcg, std::string name, TensorSpec spec, DeviceMesh mesh,
                   std::vector<Placement> placements, Source source);
ValueId add_compute(Pcg& pcg, std::string name, Op op, std::vector<ValueId> inputs,
                    std::optional<DeviceMesh> mesh = std::nullopt,
                    std::optional<std::vector<Placement>> placements = std::nullopt);
ValueId add_parallel(Pcg& pcg, std::string name, ParallelOp parallel, ValueId input,
                     std::optional<DeviceMesh> mesh, std::vector<Placement> placements);
// Marks the loss (a scalar floating-point value) and the outputs.
void set_loss(Pcg& pcg, ValueId loss);
void add_output(Pcg& pcg, ValueId value);

// The stage a graph is in, for verify: what must already be filled.
enum class Stage {
  kBuilt,    // specs and pins only
  kLaidOut,  // every node has a layout
  kCopied,   // and every operand's layout is what its consumer needs (and every
             // decomposition is one decompose_collectives would make)
};

// Checks the graph's invariants for `stage` (topological order, arity, unique names, specs
// consistent with ops' shape rules, layouts matching specs and pins, ...); throws
// Error(kInternal) naming the node and the broken invariant. Run between passes.
void verify(const Pcg& pcg, Stage stage);

// For a pass that rebuilt `before`'s node list into `after` (`remap`: old id -> new id): points
// after's names, loss and outputs at the values before's named.
void carry_names(const Pcg& before, const std::vector<ValueId>& remap, Pcg& after);

// Returns the layout a node's pins give it: sources and parallel ops (for which they are
// required). `input` is the layout of the node's input (parallel ops: the default mesh).
Layout pinned_layout(const Node& node, const Layout* input);

}  // namespace meshflow
