// A batch's boxes: row r of the batch whose first row is global row `first_row` reads the unit
// the order gives row first_row + r (data/order.h); a data input's box of that batch is read
// from the split's maps alone (data/reader.h).
#pragma once

#include "meshflow/core/box.h"
#include "meshflow/core/tensor.h"
#include "meshflow/data/order.h"
#include "meshflow/data/reader.h"

namespace meshflow {

// Returns the order of `spec`'s train split for `inputs` (the split's units and starts).
RowOrder train_order(const DataSpec& spec, const std::vector<DataInput>& inputs);

// Returns the order evaluations read `val` in: sequential from its start.
RowOrder eval_order(const Split& val, const std::vector<DataInput>& inputs);

// Returns box `box` of input `in`'s batch whose row 0 is global row `first_row` of `order`.
Tensor read_box(const SplitReader& reader, const RowOrder& order, ShuffleCache& cache,
                const DataInput& in, std::int64_t first_row, const Box& box);

}  // namespace meshflow
