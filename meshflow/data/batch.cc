// Boxes of batches: positions from the order, bytes from the maps.
#include "meshflow/data/batch.h"

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

// Returns the order `order` with `seed` over `split`'s units for `inputs`.
RowOrder order_over(const Split& split, const std::vector<DataInput>& inputs, DataOrder order,
                    std::uint32_t seed) {
  return {.order = order,
          .seed = seed,
          .units = units_of(split, inputs),
          .starts = random_starts_of(split, inputs),
          .window = split.is_stream() ? window_of(inputs) : 1};
}

}  // namespace

RowOrder train_order(const DataSpec& spec, const std::vector<DataInput>& inputs) {
  return order_over(spec.train, inputs, spec.order, spec.seed);
}

RowOrder eval_order(const Split& val, const std::vector<DataInput>& inputs) {
  return order_over(val, inputs, DataOrder::kSequential, 0);
}

Tensor read_box(const SplitReader& reader, const RowOrder& order, ShuffleCache& cache,
                const DataInput& in, std::int64_t first_row, const Box& box) {
  MESHFLOW_CHECK(box.extent.size() == in.shape.size());
  Tensor out = Tensor::uninitialized(in.dtype, box.extent);
  if (out.numel() == 0) return out;
  const std::vector<std::int64_t> positions =
      row_positions(order, first_row + box.offset[0], box.extent[0], cache);
  if (reader.is_stream()) {
    reader.read_windows(positions, in.shift + box.offset[1], out);
  } else {
    reader.read_samples(in.name, positions,
                        std::vector<std::int64_t>(box.offset.begin() + 1, box.offset.end()), out);
  }
  return out;
}

}  // namespace meshflow
