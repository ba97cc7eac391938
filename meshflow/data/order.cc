// The three orders, each from DESIGN's Philox rule.
#include "meshflow/data/order.h"

#include <algorithm>
#include <numeric>

#include "meshflow/core/error.h"
#include "meshflow/core/random.h"

namespace meshflow {

namespace {

constexpr std::uint64_t kWord = std::uint64_t{1} << 32;

// Returns 2^32·w0 + w1 of Philox4x32-10 at counter (index, 0, 0, 0) under key (seed, stream).
std::uint64_t draw(std::uint32_t seed, std::uint32_t stream, std::uint64_t index) {
  const auto w = philox4x32_10(
      {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), 0, 0},
      {seed, stream});
  return (static_cast<std::uint64_t>(w[0]) << 32) | w[1];
}

}  // namespace

std::vector<std::uint32_t> shuffled_units(std::uint32_t seed, std::int64_t epoch,
                                          std::int64_t units) {
  MESHFLOW_CHECK(units >= 0 && static_cast<std::uint64_t>(units) <= kWord,
                 "{} units do not fit a 32-bit permutation", units);
  const auto stream = static_cast<std::uint32_t>(epoch + 1);
  std::vector<std::uint64_t> keys(static_cast<std::size_t>(units));
  for (std::size_t u = 0; u < keys.size(); ++u) keys[u] = draw(seed, stream, u);
  std::vector<std::uint32_t> order(keys.size());
  std::iota(order.begin(), order.end(), std::uint32_t{0});
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return keys[a] != keys[b] ? keys[a] < keys[b] : a < b;
  });
  return order;
}

std::shared_ptr<const std::vector<std::uint32_t>> ShuffleCache::epoch(const RowOrder& order,
                                                                      std::int64_t e) {
  std::lock_guard lock(mu_);
  if (units_ && order == order_ && e == epoch_) return units_;
  if (units_ && order == order_ && e < epoch_) {
    // A device still reading the end of an earlier epoch (devices read a batch that straddles
    // two epochs at once): its permutation is made for it alone, and the newer one stays.
    return std::make_shared<const std::vector<std::uint32_t>>(
        shuffled_units(order.seed, e, order.units));
  }
  units_.reset();  // the old permutation goes before the new one is made
  units_ = std::make_shared<const std::vector<std::uint32_t>>(
      shuffled_units(order.seed, e, order.units));
  epoch_ = e;
  order_ = order;
  return units_;
}

std::int64_t ShuffleCache::bytes() const {
  std::lock_guard lock(mu_);
  return units_ ? static_cast<std::int64_t>(units_->size() * sizeof(std::uint32_t)) : 0;
}

std::int64_t row_position(const RowOrder& order, std::int64_t row, ShuffleCache& cache) {
  return row_positions(order, row, 1, cache)[0];
}

std::vector<std::int64_t> row_positions(const RowOrder& order, std::int64_t first,
                                        std::int64_t count, ShuffleCache& cache) {
  MESHFLOW_CHECK(first >= 0 && count >= 0 && order.units > 0);
  std::vector<std::int64_t> out(static_cast<std::size_t>(count));
  const std::int64_t w = order.units;
  std::shared_ptr<const std::vector<std::uint32_t>> pi;
  std::int64_t pi_epoch = -1;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t j = first + i;
    std::int64_t unit = 0;
    switch (order.order) {
      case DataOrder::kSequential:
        unit = j % w;
        break;
      case DataOrder::kShuffled: {
        const std::int64_t e = j / w;
        if (e != pi_epoch) {
          pi = cache.epoch(order, e);
          pi_epoch = e;
        }
        unit = (*pi)[static_cast<std::size_t>(j % w)];
        break;
      }
      case DataOrder::kRandom:
        out[static_cast<std::size_t>(i)] =
            static_cast<std::int64_t>(draw(order.seed, 0xFFFFFFFFu, static_cast<std::uint64_t>(j)) %
                                      static_cast<std::uint64_t>(order.starts));
        continue;
    }
    out[static_cast<std::size_t>(i)] = unit * order.window;
  }
  return out;
}

}  // namespace meshflow
