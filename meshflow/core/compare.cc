// Tensor comparison.
#include "meshflow/core/compare.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

std::optional<std::string> compare_meta(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    return fmt::format("dtype {} vs {}", to_string(a.dtype()), to_string(b.dtype()));
  }
  if (a.shape() != b.shape()) {
    return fmt::format("shape {} vs {}", to_string(a.shape()), to_string(b.shape()));
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> compare_exact(const Tensor& a, const Tensor& b) {
  if (auto meta = compare_meta(a, b)) return meta;
  if (std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0) return std::nullopt;
  return visit_dtype(a.dtype(), [&](auto zero) -> std::optional<std::string> {
    using T = decltype(zero);
    auto x = a.data<T>();
    auto y = b.data<T>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::memcmp(&x[i], &y[i], sizeof(T)) != 0) {
        return fmt::format("element {} differs: {} vs {}", i, x[i], y[i]);
      }
    }
    return std::nullopt;
  });
}

std::optional<std::string> compare_close(const Tensor& a, const Tensor& b, double rtol,
                                         double atol) {
  if (auto meta = compare_meta(a, b)) return meta;
  if (!is_floating(a.dtype())) return compare_exact(a, b);
  return visit_dtype(a.dtype(), [&](auto zero) -> std::optional<std::string> {
    using T = decltype(zero);
    auto x = a.data<T>();
    auto y = b.data<T>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      double dx = x[i], dy = y[i];
      double err = std::abs(dx - dy);
      if (!(err <= atol + rtol * std::abs(dy)) && !(std::isnan(dx) && std::isnan(dy))) {
        return fmt::format("element {} differs: {} vs {} (|diff| {:.3g} > atol {} + rtol {})", i,
                           dx, dy, err, atol, rtol);
      }
    }
    return std::nullopt;
  });
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  MESHFLOW_CHECK(!compare_meta(a, b), "max_abs_difference: {}", *compare_meta(a, b));
  double m = 0;
  visit_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    auto x = a.data<T>();
    auto y = b.data<T>();
    for (std::size_t i = 0; i < x.size(); ++i)
      m = std::max(m, std::abs(static_cast<double>(x[i]) - static_cast<double>(y[i])));
  });
  return m;
}

}  // namespace meshflow
