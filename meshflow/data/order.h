// The batch order (DESIGN.md "Data, evaluation and tokenizers"): which unit each global row of
// the run reads, a function of the data's size, the seed and the row alone, so batches are the
// same on any mesh, layout, micro-batch count and backend, and across resumes.
//
//   shuffled    row j reads unit π_e(j mod W), e = ⌊j / W⌋; π_e lists the units sorted by the
//               64-bit key 2^32·w0 + w1 of Philox4x32-10 with key (seed, e + 1) and counter
//               (u, 0, 0, 0), ties by u
//   sequential  row j reads unit j mod W
//   random      row j's window starts at (2^32·w0 + w1) mod (N − S − K + 1), key (seed, 2^32 − 1),
//               counter (j, 0, 0, 0)
//
// An index above 2^32 − 1 puts its high 32 bits in the counter's second word.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "meshflow/data/dataset.h"

namespace meshflow {

struct RowOrder {
  DataOrder order = DataOrder::kShuffled;
  std::uint32_t seed = 0;
  std::int64_t units = 0;   // W
  std::int64_t starts = 0;  // random: N − S − K + 1
  // A unit's first token is unit·window (token streams); sample arrays: 1 (a unit is a sample).
  std::int64_t window = 1;
  bool operator==(const RowOrder&) const = default;
};

// Returns π_e: the units 0 … W − 1 in epoch `epoch`'s shuffled order (W < 2^32).
std::vector<std::uint32_t> shuffled_units(std::uint32_t seed, std::int64_t epoch,
                                          std::int64_t units);

// The shuffled order's permutation of the newest epoch asked for, computed once per epoch and
// shared by every device of a process (4·W bytes); an earlier epoch asked for afterwards is made
// for that caller alone. Thread-safe.
class ShuffleCache {
 public:
  // Returns π_epoch for `order`.
  std::shared_ptr<const std::vector<std::uint32_t>> epoch(const RowOrder& order,
                                                          std::int64_t epoch);
  // Returns the bytes of the permutation it keeps (0 before the first use).
  std::int64_t bytes() const;

 private:
  mutable std::mutex mu_;
  std::int64_t epoch_ = -1;
  RowOrder order_;
  std::shared_ptr<const std::vector<std::uint32_t>> units_;
};

// Returns where global row `row` reads: its window's first token (token streams, before any
// shift) or its sample (sample arrays).
std::int64_t row_position(const RowOrder& order, std::int64_t row, ShuffleCache& cache);

// Returns the positions of rows first … first + count − 1, each as row_position gives it.
std::vector<std::int64_t> row_positions(const RowOrder& order, std::int64_t first,
                                        std::int64_t count, ShuffleCache& cache);

}  // namespace meshflow
