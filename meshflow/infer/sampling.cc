#include "meshflow/infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/core/random.h"

namespace meshflow {

void check_sampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    fail(ErrorKind::kInvalidArgument, "--temperature {} must be >= 0", o.temperature);
  if (o.top_k && *o.top_k < 1)
    fail(ErrorKind::kInvalidArgument, "--top-k {} must be >= 1", *o.top_k);
  if (o.top_p && !(*o.top_p > 0 && *o.top_p <= 1))
    fail(ErrorKind::kInvalidArgument, "--top-p {} must be in (0, 1]", *o.top_p);
}

double sampling_draw(std::uint64_t seed, std::int64_t i, std::int64_t r) {
  const auto word = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  const std::array<std::uint32_t, 4> w =
      philox4x32_10({word(i), word(r), 0, 0},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  return static_cast<double>(w[0] >> 8) / 16777216.0;
}

namespace {

// log Σ exp(x) over all of `logits`, in double.
double log_sum_exp(std::span<const float> logits) {
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  return mx + std::log(sum);
}

}  // namespace

Choice choose_token(std::span<const float> logits, const SamplingOptions& o, std::int64_t i,
                    std::int64_t r) {
  MESHFLOW_CHECK(!logits.empty());
  const auto n = static_cast<std::int64_t>(logits.size());
  const double lse = log_sum_exp(logits);
  auto choice = [&](std::int64_t t) {
    return Choice{t, static_cast<double>(logits[static_cast<std::size_t>(t)]) - lse};
  };
  if (o.temperature == 0) {
    // the first maximum: the lowest id on a tie
    return choice(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // The ids by (-z, id): z = logits / T orders as the logits do (T > 0).
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  const auto before = [&](std::int64_t a, std::int64_t b) {
    const float x = logits[static_cast<std::size_t>(a)], y = logits[static_cast<std::size_t>(b)];
    return x != y ? x > y : a < b;
  };
  const std::int64_t k = o.top_k ? std::min<std::int64_t>(*o.top_k, n) : n;
  if (k < n) {
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
    ids.resize(static_cast<std::size_t>(k));
  } else {
    std::sort(ids.begin(), ids.end(), before);
  }
  // p = softmax(z) over the kept ids, in double
  const double top =
      static_cast<double>(logits[static_cast<std::size_t>(ids.front())]) / o.temperature;
  std::vector<double> p(ids.size());
  double sum = 0;
  for (std::size_t j = 0; j < ids.size(); ++j)
    sum += p[j] = std::exp(
        static_cast<double>(logits[static_cast<std::size_t>(ids[j])]) / o.temperature - top);
  for (double& x : p) x /= sum;
  std::size_t kept = p.size();
  if (o.top_p) {
    double c = 0;
    for (std::size_t j = 0; j < p.size(); ++j) {
      c += p[j];
      if (c >= *o.top_p) {
        kept = j + 1;
        break;
      }
    }
    double s = 0;
    for (std::size_t j = 0; j < kept; ++j) s += p[j];
    for (std::size_t j = 0; j < kept; ++j) p[j] /= s;
  }
  const double u = sampling_draw(o.seed, i, r);
  double c = 0;
  for (std::size_t j = 0; j < kept; ++j) {
    c += p[j];
    if (c > u) return choice(ids[j]);
  }
  return choice(ids[kept - 1]);  // u within rounding of 1
}

}  // namespace meshflow
