// Embedding: embedding(ids[...] int32/int64, table[V, D]) = table[ids], shape [..., D], and the
// table's gradient embedding_grad(ids, g) {shape [V, D]}: g's rows added into the rows ids name.
// Sharding: ids' dims shard freely (the result keeps the shard); D shards through; a table
// sharded over V (vocabulary-parallel) gives a Partial(sum) result: each device writes the rows
// of ids it owns and zeros elsewhere, so the terms sum to table[ids]. The gradient's V is never
// sharded (every device adds its ids' rows; a batch shard makes it a Partial(sum) term).
#pragma once

#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

bool is_embedding_family(OpType type);  // embedding, embedding_grad

TensorSpec infer_embedding(const Op& op, const std::vector<TensorSpec>& inputs);
// offsets (op.h): the table's shard start gives the global row of local row 0.
Tensor embedding_kernel(const Op& op, const std::vector<const Tensor*>& in,
                        const std::vector<TensorSpec>& globals, const ShardOffsets& offsets);
DimLabels embedding_labels(const Op& op, const std::vector<TensorSpec>& inputs);

}  // namespace meshflow
