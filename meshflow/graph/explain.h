// What a compiled model does, for `meshflow explain`: every named value's layout, and every
// change of layout that moves data between devices (explicit parallel ops, copies between
// meshes, strategy changes, reductions of gradients) with its plan's step kinds, or for a
// collective decomposed around a product (--overlap) its permutes or broadcasts. A change each
// device makes alone (a plan of local steps only) is no move.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/graph/compile.h"
#include "meshflow/graph/memory.h"
#include "meshflow/graph/pcg.h"
#include "meshflow/graph/step_time.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

struct MoveReport {
  std::string value, consumer;
  Phase phase = Phase::kForward;
  Layout from, to;
  std::vector<StepKind> steps;  // local steps omitted
  // A decomposed collective (--overlap): steps are its n - 1 permutes, n broadcasts or one
  // in_place (blocks read where they lie), the product it overlaps is named, and est_s is the
  // communication the timeline leaves exposed.
  std::string overlapped_with;
  // With --overlap, a collective the patterns let a product decompose but the cost model kept
  // whole: the loop's timeline it weighed against the collective then the product.
  std::optional<OverlapEstimate> kept_whole;
  // ZeRO-3: a weight gathered for one use is dropped right after it (that consumer's name).
  std::string freed_after;
  double est_s = 0;
};

struct Explanation {
  std::vector<std::pair<std::string, Layout>> values;  // in graph order
  std::vector<MoveReport> moves;                       // in graph order
  // Training: the device whose tensors peak highest in a step (graph/memory.h's estimate).
  std::optional<DeviceMemory> memory;
  // Training: the slowest device's estimated step (graph/step_time.h).
  std::optional<StepTime> step_time;
  // Training: the nodes backward recomputes, per segment (graph/passes.h's recomputed_segments;
  // empty under --recompute none).
  std::vector<RecomputedSegment> recompute;
};

// Returns the explanation of `pcg` (Stage::kCopied); with `overlap` (the options it was
// decomposed with), the collectives kept whole say why.
Explanation explain(const Pcg& pcg, const PlanOptions& options = {},
                    const DecomposeOptions* overlap = nullptr);

// Returns what `meshflow explain` shows for a built graph: `pcg` compiled with `options` for
// training when it names a loss (with the step's memory estimate), for the forward pass
// otherwise, then explained.
Explanation explain_compiled(const Pcg& pcg, const CompileOptions& options);

// DESIGN's `explain --json` object: {"values": {...}, "moves": [...]}, and for training
// "est_step_s", "memory_per_device_bytes", "memory": {"weights", "gradients", "optimizer_state",
// "activations", "gathered", "snapshot"} and "recompute": [{"segment", "nodes"}].
nlohmann::json to_json(const Explanation& e);

// Returns the mesh's explicit text form, "2x2@0,1,2,3" (explain names meshes by it).
std::string explicit_text(const DeviceMesh& mesh);

// Returns {"mesh": explicit_text, "placements": [...]}, as explain and run's JSON give a layout.
nlohmann::json layout_json(const Layout& layout);

// Returns the text `meshflow explain` prints.
std::string to_text(const Explanation& e);

}  // namespace meshflow
