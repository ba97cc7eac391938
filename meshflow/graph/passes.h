// The passes that compile a model's PCG, each a pure function from graph to graph in its own
// file, asserting its before and after invariants (verify, graph/pcg.h). In order:
//
//   fold_transposes  reads a transpose feeding a product through BLAS's transpose flag
//   infer_layouts    fills every node's layout by sharding propagation (ops/strategy.h)
//   expand_backward  adds the backward pass from the loss (ops/gradient.h's programs)
//   add_update       adds the optimizer's update per weight that has a gradient, its state, and
//                    the squared global gradient norm the updates read
//   expand_vocab_parallel  replaces each loss whose strategy shards the classes by its steps
//   insert_copies    inserts a move wherever a value is needed in another layout or mesh
//   recompute_activations  (--recompute) copies the forward values backward reads again into
//                    backward, made just before their readers instead of kept
//   decompose_collectives  (--overlap) runs all-gathers into and reduce-scatters out of matrix
//                    products as loops overlapped with the product's blocks
//
// then graph/task_graph.h expands the result into per-device tasks.
#pragma once

#include <optional>
#include <string_view>

#include "meshflow/graph/pcg.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

// Transposes folded into products. Before: Stage::kBuilt, forward nodes only (a graph with a
// layout or a backward node is returned as it is). After: Stage::kBuilt; each matmul or
// bias-free linear whose operand 1 is a pin-free transpose of a 2-d value (operand 0 of rank 2
// or more) reads that value as matmul_grad_a (a @ bᵀ, BLAS's transpose flag), else each whose
// operand 0 is one (operand 1 2-d) as matmul_grad_b (aᵀ @ b); the transposes then read by no
// node, loss or output are dropped with their names. Its results and gradients equal the
// unfolded graph's.
Pcg fold_transposes(Pcg pcg);

// Layout inference. Before: Stage::kBuilt (some nodes may already have layouts: they keep
// them). After: Stage::kLaidOut. Sources, parallel ops and moves take their pins (parallel ops
// checked against their degrees); a compute node on mesh M sees its inputs on M with their own
// placements and takes the cheapest strategy (operand_layouts, result_layout), its layout being
// its pin when it has one; an update takes its weight's layout for both operands. Throws Error
// naming the node when a degree or an operator's operands do not fit.
Pcg infer_layouts(Pcg pcg, const PlanOptions& options = {});

// Backward expansion. Before: Stage::kLaidOut, a loss, only forward nodes. After: Stage::kBuilt
// for the new nodes (infer_layouts lays them out), every node added in Phase::kBackward except
// the forward ones below, and names "grad:<v>" for every weight v the loss depends on (and every
// forward value on the way). A gradient program's step that reads only the node's operands
// (layer norm's statistics) is a forward node "<node>:<operator>" on the node's mesh, added
// before any backward node, so that the forward kernel makes it in its own pass (ops/op.h's
// runs_together) and the backward reads it.
// The loss's gradient is a constant 1 on the loss's mesh; a compute node's operand gradients
// are its gradient program's steps on the node's mesh (only those the weights need); a
// parallel op's is a move of its gradient to gradient_placements of its input; a gradient made
// on another mesh than its value's is moved there keeping its placements; several
// contributions are summed by add nodes. Every step or sum that makes an operand's gradient on
// that operand's mesh has `prefer` = gradient_placements of the operand's layout. Throws Error
// when the graph has no loss.
Pcg expand_backward(Pcg pcg);

// The update phase. Before: Stage::kLaidOut, expand_backward ran. After: Stage::kLaidOut, with
// every added node in Phase::kUpdate and laid out, per weight w with a gradient (none added when
// no weight has one):
//   - "move:grad:w@<kind>:w", the gradient moved into w's layout where it is not there (a
//     Partial gradient reduced: data parallelism's all-reduce);
//   - the state tensors "w.<state>" (kernels/optimizer.h's state_names: "w.exp_avg", ...),
//     kState sources of zeros in w's layout, named in `names`;
//   - "<kind>:w" = update(w, gradient, squared norm, state...), in w's layout, `update` = rule;
// and once: "update:grad_norm_sq:terms" (kGradNorm), each device's term of the squared global
// L2 norm of the gradients in their weights' layouts (the loss in its own layout is an operand
// too: a device holding a non-finite loss term makes its term NaN), Partial(sum) on a 1-d mesh
// of every device holding a gradient or the loss, and its all-reduce "update:grad_norm_sq"
// (Replicate), which every update reads (to clip, and to skip a non-finite step). Throws Error
// when a tensor already has a state's name.
//
// With `zero` (--zero 0|1|3) the update runs in the weight's ZeRO layout (zero_layout), its
// state lives there and the gradient is moved there (a Partial one reduce-scattered); at
// ZeRO-3 that move is in Phase::kBackward (it runs with each micro-batch, the sharded gradient
// being what accumulates). At ZeRO-1 a weight whose ZeRO layout differs from its layout is
// updated as "zero:w", its chunk (a local slice, a move), and "zero:w:gather" all-gathers the
// updated chunk back into the weight (Node::replaces). At ZeRO-3 the update reads the weight
// in its ZeRO layout: shard_weights then makes that the weight's own.
Pcg add_update(Pcg pcg, const UpdateRule& rule = {}, int zero = 0);

// The ZeRO layout of a weight in `layout` (docs/training.md): each mesh dim where it is
// Replicate (its ZeRO dims), in mesh-dim order, becomes S(d), d the outermost tensor dim not yet
// sharded on another mesh dim whose extent the mesh dim divides; when none divides, the largest
// free dim (the lower on a tie); dim 0 when none is free. A scalar keeps its layout.
Layout zero_layout(const Layout& layout);

// FSDP (--zero 3). Before: Stage::kLaidOut, add_update ran with zero 3. After: Stage::kLaidOut,
// and every weight whose update runs in another layout than the weight's (its ZeRO layout)
// lives in that layout, pins included; every forward or backward node that read it reads
// instead a gather made for it alone ("gather:<w>@<node>", Node::zero_gather, a move to the
// layout the node needs, in the node's phase), dropped after that use. The gathers of the k-th
// node that reads such weights are placed before the (k-1)-th (one use ahead: FSDP2's
// prefetch, so at most two nodes' gathered weights are held at a time). Each such weight's
// gradient move into its shard (add_update's backward reduce-scatter) is placed right after the
// gradient is made, so at most one unsharded gradient is held at a time.
Pcg shard_weights(Pcg pcg);

// The name of add_update's all-reduced squared gradient norm.
inline constexpr std::string_view kGradNormName = "update:grad_norm_sq";

// Returns add_update's all-reduced squared gradient norm in `pcg`, none when nothing is trained.
std::optional<ValueId> find_grad_norm(const Pcg& pcg);

// Micro-batching (train --micro-batches M). Before and after: Stage::kBuilt with a loss. Every
// input with `batch` has dim 0 divided by M and micro_batches = M; every other spec is
// re-inferred. The batch dim is followed from the inputs through every node (broadcasting,
// reshapes that write dim 0 as -1, transposes); a node that contracts, reduces or normalises
// over it, a reshape that fixes it, or a sum over it is refused with an Error naming the node,
// except the loss itself, which must be a mean over the rows (softmax_cross_entropy, mse, mean).
// M = 1 returns the graph unchanged.
Pcg split_micro_batches(Pcg pcg, int micro_batches);

// Vocabulary-parallel expansion. Before: Stage::kLaidOut. After: Stage::kLaidOut, and no compute
// node needs lowering (ops/vocab_parallel.h): each softmax_cross_entropy or its gradient whose
// operand layouts shard the classes is replaced by lower's steps, laid out as it chose, each
// pinned to its layout ("<node>:max", "<node>:stats"), the last keeping the node's name, pin and
// layout. A gradient's statistics that would repeat the forward's (the same operator on the
// same values in the same layouts) are the forward's.
Pcg expand_vocab_parallel(Pcg pcg, const PlanOptions& options = {});

// Copy insertion. Before: Stage::kLaidOut. After: Stage::kCopied: a move node
// ("move:<value>@<consumer>") before every operand whose layout is not the one its consumer
// needs (one per value and layout), and after every compute node whose kernel's layout is not
// its pin (the node becomes "<name>:kernel" and the move takes its name); names, loss and
// outputs follow.
Pcg insert_copies(Pcg pcg);

// Activation recomputation (--recompute; DESIGN's "Activation recomputation").
enum class Recompute { kNone, kSelective, kFull };

// Returns "none", "selective", "full".
std::string_view to_string(Recompute r);

// Returns the policy named `text`; throws Error naming it otherwise.
Recompute parse_recompute(std::string_view text);

// Returns whether a forward node of `pcg` is marked "checkpoint": true (full needs one).
bool marks_checkpoint(const Pcg& pcg);

// Returns whether `policy` keeps compute node `n`'s result from forward to backward: kNone
// every one; kSelective products (linear, matmul and the folded ones, attention), adds and
// marked nodes; kFull marked nodes only. (recompute_activations also keeps sources, some moves,
// and under selective what recomputing would not save.)
bool keeps_result(Recompute policy, const Node& n);

// Before and after: Stage::kCopied, before decompose_collectives. Per forward value that a
// backward node reads and `policy` does not keep, a copy of its node ("recompute:<node>",
// Phase::kBackward, Node::recomputes) is inserted just before the first backward node that
// reads it, with the copies of the unkept values it reads before it; every backward node
// reads the copies. Every policy keeps sources and marked values (Node::checkpoint); selective
// also keeps products (linear, matmul, attention), adds and moves, and recomputes the rest only
// from sources, values backward reads anyway and other recomputed values (so it never keeps a
// value that kNone drops: a view of a product backward does not read stays kept); full keeps
// only moves that bring a value from other devices (a stage's input). So every copy reads kept
// values or
// copies, each copy is made once per micro-batch, and the forward value is dropped after its
// last forward reader. kNone returns the graph unchanged. Throws Error naming the option for
// kFull on a graph that marks nothing.
Pcg recompute_activations(Pcg pcg, Recompute policy);

// The recomputed nodes of one backward segment, in the order backward recomputes them. A
// forward node's segment is the most marked values on a path from a source to it (a marked
// node ends its segment): segment i lies between the i-th and the (i+1)-th marks.
struct RecomputedSegment {
  int segment = 0;
  std::vector<std::string> nodes;
  bool operator==(const RecomputedSegment&) const = default;
};

// Returns the segments of `pcg` (recompute_activations ran) that recompute a node, ascending.
std::vector<RecomputedSegment> recomputed_segments(const Pcg& pcg);

// Collective decomposition (--overlap). Before and after: Stage::kCopied. Sets `decomposed` on
// every row product (ops/matmul.h) of a floating-point operand 0 of rank >= 2 that
//   - is the first consumer of a movement of its operand 0 that is an all-gather of a dim-0
//     shard over one mesh dim j (S(0) -> R on j, every other placement the same, and no mesh
//     dim after j sharding dim 0, so j's chunks are each device's row blocks), with the form
//     whose cost-model timeline (plan/cost_model.h) is shortest among permute, broadcast and,
//     where devices share memory, in_place (or options.gather_form); or
//   - has a Partial(sum) result whose only consumer is a reduce-scatter of it to dim 0 over one
//     mesh dim j (P(sum) -> S(0) on j, the same conditions), unless the result is an output,
//     the loss or a weight's gradient (which reports read);
// and whose loop's timeline is shorter than the collective then the product (unless
// options.always). Nothing else changes: expand_shards gives the product and its movement one
// task. Throws Error when options.gather_form is in_place and the devices do not share memory.
struct DecomposeOptions {
  // The devices share one address space (the threads backend): in_place is a candidate.
  bool shared_memory = false;
  // Every decomposed all-gather takes this form instead of the cost model's choice.
  std::optional<GatherForm> gather_form;
  // Decompose every product the patterns allow, even where the cost model estimates the loop
  // no shorter than the collective then the product (a caller who knows better: tests,
  // benchmarks, `--gather-form`).
  bool always = false;
};
Pcg decompose_collectives(Pcg pcg, const PlanOptions& plan = {},
                          const DecomposeOptions& options = {});

// The cost model's view of decomposing compute node `c` as `d` allows (decomposable): `d` with
// its form chosen (gathers), that form's timeline, and whether the loop is the shorter.
struct DecompositionChoice {
  Decomposition decomposition;
  OverlapEstimate estimate;
  bool pays = false;  // estimate.overlapped_s < estimate.sequential_s
};
DecompositionChoice choose_decomposition(const Pcg& pcg, const Node& c, const Decomposition& d,
                                         const MachineModel& machine,
                                         const DecomposeOptions& options);

// Returns, per node, the decomposition decompose_collectives' patterns allow it (form unset:
// permute); verify checks every decomposition against it.
std::vector<std::optional<Decomposition>> decomposable(const Pcg& pcg);

// Returns the cost model's view of compute node `c`'s decomposition `d`: per block, the bytes
// that travel and the product's flops on one device.
OverlapCostInput overlap_cost_input(const Pcg& pcg, const Node& c, const Decomposition& d);

}  // namespace meshflow
