// The fused update loops. Each loop body touches every array once per element and keeps the
// per-step coefficients in registers, so the compiler vectorises it and the pass runs at the
// memory's speed (this folder is built with -O3 -fno-math-errno so that sqrt vectorises).
#include "meshflow/kernels/optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vectorize.h"

namespace meshflow {

namespace {

// Calls body(begin, end) on parts of [0, n) split over the device's threads.
template <typename F>
void for_parts(std::size_t n, const F& body) {
  parallel_for(static_cast<std::int64_t>(n), kElementGrain, [&](std::int64_t b, std::int64_t e) {
    body(static_cast<std::size_t>(b), static_cast<std::size_t>(e));
  });
}

// The loops over one part, written once for float and double; the float ones run through
// their copies built per vector unit (kernels/vectorize.h), each with the loop inlined.
template <typename T>
[[gnu::always_inline]] inline void sgd_loop(T* __restrict w, const T* __restrict g, std::size_t n,
                                            T lr, T scale) {
  for (std::size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] * scale);
}

template <typename T>
[[gnu::always_inline]] inline void momentum_loop(T* __restrict w, T* __restrict buf,
                                                 const T* __restrict g, std::size_t n, T lr,
                                                 T scale, T momentum) {
  for (std::size_t i = 0; i < n; ++i) {
    const T b = momentum * buf[i] + g[i] * scale;
    buf[i] = b;
    w[i] -= lr * b;
  }
}

template <typename T>
struct AdamCoefficients {
  T decay, b1, one_minus_b1, b2, one_minus_b2, step_size, inv_bc2_sqrt, eps, scale;
};

template <typename T>
[[gnu::always_inline]] inline void adamw_loop(T* __restrict w, T* __restrict m, T* __restrict v,
                                              const T* __restrict g, std::size_t n,
                                              const AdamCoefficients<T>& c) {
  for (std::size_t i = 0; i < n; ++i) {
    const T gi = g[i] * c.scale;
    const T mi = c.b1 * m[i] + c.one_minus_b1 * gi;
    const T vi = c.b2 * v[i] + c.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * c.decay - c.step_size * mi / (std::sqrt(vi) * c.inv_bc2_sqrt + c.eps);
  }
}

// Returns Σ x² in float64 with independent partial sums: the adds pipeline (and vectorise)
// without reassociating.
template <typename T>
[[gnu::always_inline]] inline double squares_loop(const T* x, std::size_t n) {
  constexpr std::size_t kLanes = 8;
  std::array<double, kLanes> acc{};
  const std::size_t body = n / kLanes * kLanes;
  for (std::size_t i = 0; i < body; i += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      acc[l] += v * v;
    }
  }
  for (std::size_t i = body; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    acc[0] += v * v;
  }
  double sum = 0;
  for (double a : acc) sum += a;
  return sum;
}

MESHFLOW_VECTOR_CLONES
void sgd_f32(float* w, const float* g, std::size_t n, float lr, float scale) {
  sgd_loop(w, g, n, lr, scale);
}
MESHFLOW_VECTOR_CLONES
void momentum_f32(float* w, float* buf, const float* g, std::size_t n, float lr, float scale,
                  float momentum) {
  momentum_loop(w, buf, g, n, lr, scale, momentum);
}
MESHFLOW_VECTOR_CLONES
void adamw_f32(float* w, float* m, float* v, const float* g, std::size_t n,
               const AdamCoefficients<float>& c) {
  adamw_loop(w, m, v, g, n, c);
}
MESHFLOW_VECTOR_CLONES
double squares_f32(const float* x, std::size_t n) { return squares_loop(x, n); }

template <typename T>
constexpr bool kFloat = std::is_same_v<T, float>;

template <typename T>
void sgd(const UpdateRule& rule, const StepScalars& s, std::span<T> w, std::span<const T> g,
         std::span<Tensor* const> state) {
  const T lr = static_cast<T>(s.lr);
  const T scale = static_cast<T>(s.grad_scale);
  T* wp = w.data();
  const T* gp = g.data();
  if (state.empty()) {
    for_parts(w.size(), [=](std::size_t begin, std::size_t end) {
      if constexpr (kFloat<T>) {
        sgd_f32(wp + begin, gp + begin, end - begin, lr, scale);
      } else {
        sgd_loop(wp + begin, gp + begin, end - begin, lr, scale);
      }
    });
    return;
  }
  const T momentum = static_cast<T>(rule.momentum);
  T* bp = state[0]->data<T>().data();
  for_parts(w.size(), [=](std::size_t begin, std::size_t end) {
    if constexpr (kFloat<T>) {
      momentum_f32(wp + begin, bp + begin, gp + begin, end - begin, lr, scale, momentum);
    } else {
      momentum_loop(wp + begin, bp + begin, gp + begin, end - begin, lr, scale, momentum);
    }
  });
}

template <typename T>
void adamw(const UpdateRule& rule, const StepScalars& s, std::span<T> w, std::span<const T> g,
           std::span<Tensor* const> state) {
  const double t = s.step;
  const AdamCoefficients<T> c{
      .decay = static_cast<T>(1 - s.lr * rule.weight_decay),
      .b1 = static_cast<T>(rule.beta1),
      .one_minus_b1 = static_cast<T>(1 - rule.beta1),
      .b2 = static_cast<T>(rule.beta2),
      .one_minus_b2 = static_cast<T>(1 - rule.beta2),
      .step_size = static_cast<T>(s.lr / (1 - std::pow(rule.beta1, t))),
      .inv_bc2_sqrt = static_cast<T>(1 / std::sqrt(1 - std::pow(rule.beta2, t))),
      .eps = static_cast<T>(rule.eps),
      .scale = static_cast<T>(s.grad_scale)};
  T* wp = w.data();
  const T* gp = g.data();
  T* mp = state[0]->data<T>().data();
  T* vp = state[1]->data<T>().data();
  for_parts(w.size(), [=, &c](std::size_t begin, std::size_t end) {
    if constexpr (kFloat<T>) {
      adamw_f32(wp + begin, mp + begin, vp + begin, gp + begin, end - begin, c);
    } else {
      adamw_loop(wp + begin, mp + begin, vp + begin, gp + begin, end - begin, c);
    }
  });
}

}  // namespace

std::string_view to_string(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? "sgd" : "adamw";
}

std::optional<OptimizerKind> parse_optimizer_kind(std::string_view text) {
  if (text == "sgd") return OptimizerKind::kSgd;
  if (text == "adamw") return OptimizerKind::kAdamW;
  return std::nullopt;
}

std::vector<std::string> state_names(const UpdateRule& rule) {
  if (rule.kind == OptimizerKind::kAdamW) return {"exp_avg", "exp_avg_sq"};
  if (rule.momentum > 0) return {"momentum_buffer"};
  return {};
}

void update_shard(const UpdateRule& rule, const StepScalars& s, Tensor& weight, const Tensor& grad,
                  std::span<Tensor* const> state) {
  MESHFLOW_CHECK(weight.shape() == grad.shape() && weight.dtype() == grad.dtype(),
                 "update_shard: weight {} and gradient {} differ", to_string(weight.shape()),
                 to_string(grad.shape()));
  MESHFLOW_CHECK(state.size() == state_names(rule).size(), "update_shard: {} state tensors for {}",
                 state.size(), to_string(rule.kind));
  for (const Tensor* t : state) {
    MESHFLOW_CHECK(t->shape() == weight.shape() && t->dtype() == weight.dtype(),
                   "update_shard: a state tensor {} differs from its weight {}",
                   to_string(t->shape()), to_string(weight.shape()));
  }
  visit_dtype(weight.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      if (rule.kind == OptimizerKind::kSgd) {
        sgd<T>(rule, s, weight.data<T>(), grad.data<T>(), state);
      } else {
        adamw<T>(rule, s, weight.data<T>(), grad.data<T>(), state);
      }
    } else {
      MESHFLOW_CHECK(false, "update_shard on {}", to_string(weight.dtype()));
    }
  });
}

double clip_coefficient(const UpdateRule& rule, double norm_sq) {
  if (!rule.clip_grad_norm) return 1;
  constexpr double kEps = 1e-6;  // torch.nn.utils.clip_grad_norm_'s
  return std::min(1.0, *rule.clip_grad_norm / (std::sqrt(norm_sq) + kEps));
}

double sum_of_squares(const Tensor& t, std::int64_t first, std::int64_t last) {
  MESHFLOW_CHECK(0 <= first && first <= last && last <= t.numel(),
                 "sum_of_squares of [{}, {}) of {}", first, last, t.numel());
  double total = 0;
  visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      // Parts over the device's threads, their sums added in part order.
      const std::span<const T> all = t.data<T>().subspan(static_cast<std::size_t>(first),
                                                         static_cast<std::size_t>(last - first));
      const auto n = static_cast<std::int64_t>(all.size());
      const int parts = parallel_parts(n, kElementGrain);
      std::vector<double> part_sums(static_cast<std::size_t>(parts), 0.0);
      parallel_parts_for(n, parts, [&](int part, std::int64_t begin, std::int64_t end) {
        const T* x = all.data() + begin;
        const auto len = static_cast<std::size_t>(end - begin);
        if constexpr (kFloat<T>) {
          part_sums[static_cast<std::size_t>(part)] = squares_f32(x, len);
        } else {
          part_sums[static_cast<std::size_t>(part)] = squares_loop(x, len);
        }
      });
      for (double s : part_sums) total += s;
    } else {
      MESHFLOW_CHECK(false, "sum_of_squares on {}", to_string(t.dtype()));
    }
  });
  return total;
}

double sum_of_squares(const Tensor& t) { return sum_of_squares(t, 0, t.numel()); }

}  // namespace meshflow
