// The decoder's graphs (DESIGN "Generation", the KV cache): a model file's own graph, cut to the
// ancestors of its logits and re-shaped to R samples of L positions. It follows dim 0 (the
// batch) and dim 1 (the position) of the token input through every node, as micro-batching
// follows dim 0: a reshape's entry for either takes the new size, a weight broadcast along the
// positions (a learned position table [S, D]) is read at the run's positions (an embedding of
// the positions input), and with a cache each causal attention becomes cached_attention over
// caches of C positions in the layout its k and v had (ops/attention.h). A node that mixes
// positions any other way (sums over them, normalises along them, attends without the causal
// mask, reshapes them into another dim) is refused naming it. Pure: builds a Pcg, runs nothing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshflow/graph/model_file.h"

namespace meshflow {

// The model file's "generate" object, checked against its graph.
struct GenerateNames {
  std::string tokens;  // the [B, S] integer token input
  std::string logits;  // the node of logits, [B, S, V] or [B·S, V]
};

// Returns the names; throws Error(kInvalidArgument) naming the model file when it has no
// "generate" object, or its names are not an integer [B, S] input and a floating node whose
// shape is [B, S, V] or [B·S, V].
GenerateNames generate_names(const Model& model);

struct DecoderShape {
  std::int64_t batch = 1;     // R: the samples
  std::int64_t length = 1;    // L: the positions one run computes
  std::int64_t capacity = 0;  // C: the caches' positions; 0: no cache (attention as the model)
};

// Where a cached attention keeps k and v: its caches' layouts (k's and v's operand layouts in
// the graph without a cache, at C positions).
struct CacheLayouts {
  Layout k, v;
};

struct DecoderGraph {
  Pcg pcg;                      // Stage::kBuilt; the logits its one output
  ValueId tokens = 0;           // [R, L] (Source::Kind::kProvided)
  ValueId positions = 0;        // [L] int64, the positions of the L tokens (kProvided)
  ValueId logits = 0;           // [R, L, V] or [R·L, V]: row r·L + j is sample r's position j
  std::int64_t context = 0;     // S: the token input's dim 1 in the model
  std::int64_t vocabulary = 0;  // V
  // Per causal attention node (by name): its caches (kZeros sources), with a cache.
  std::map<std::string, std::pair<ValueId, ValueId>> caches;
};

// Returns the decoder graph of `model` for `shape`; with a capacity, `layouts` gives every causal
// attention node's cache layouts (from decoder_cache_layouts). Throws Error(kInvalidArgument)
// naming the node that mixes positions, or an input other than the tokens the logits read.
DecoderGraph decoder_graph(const Model& model, const GenerateNames& names,
                           const DecoderShape& shape,
                           const std::map<std::string, CacheLayouts>& layouts = {});

// Returns, per causal attention node of `compiled` (a compiled decoder graph without a cache),
// the layouts its k and v operands have, re-shaped to `capacity` positions.
std::map<std::string, CacheLayouts> decoder_cache_layouts(const Pcg& compiled,
                                                          std::int64_t capacity);

}  // namespace meshflow
