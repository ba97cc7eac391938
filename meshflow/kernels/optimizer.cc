// The fused update loops. Each loop body touches every array once per element and keeps the
// per-step coefficients in registers, so the compiler vectorises it and the pass runs at the
// memory's speed (this folder is built with -O3 -fno-math-errno so that sqrt vectorises).
#include "meshflow/kernels/optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"

namespace meshflow {

namespace {

// Calls body(begin, end) on parts of [0, n) split over the device's threads.
template <typename F>
void for_parts(std::size_t n, const F& body) {
  parallel_for(static_cast<std::int64_t>(n), kElementGrain, [&](std::int64_t b, std::int64_t e) {
    body(static_cast<std::size_t>(b), static_cast<std::size_t>(e));
  });
}

template <typename T>
void sgd(const UpdateRule& rule, const StepScalars& s, std::span<T> w, std::span<const T> g,
         std::span<Tensor* const> state) {
  const T lr = static_cast<T>(s.lr);
  const T scale = static_cast<T>(s.grad_scale);
  const std::size_t n = w.size();
  T* __restrict wp = w.data();
  const T* __restrict gp = g.data();
  if (state.empty()) {
    for_parts(n, [=](std::size_t begin, std::size_t end) {
      T* __restrict wl = wp;  // locals: the loop reads no pointer through the closure
      const T* __restrict gl = gp;
      for (std::size_t i = begin; i < end; ++i) wl[i] -= lr * (gl[i] * scale);
    });
    return;
  }
  const T momentum = static_cast<T>(rule.momentum);
  T* __restrict bp = state[0]->data<T>().data();
  for_parts(n, [=](std::size_t begin, std::size_t end) {
    T* __restrict wl = wp;
    T* __restrict bl = bp;
    const T* __restrict gl = gp;
    for (std::size_t i = begin; i < end; ++i) {
      const T b = momentum * bl[i] + gl[i] * scale;
      bl[i] = b;
      wl[i] -= lr * b;
    }
  });
}

template <typename T>
void adamw(const UpdateRule& rule, const StepScalars& s, std::span<T> w, std::span<const T> g,
           std::span<Tensor* const> state) {
  const double t = s.step;
  const T decay = static_cast<T>(1 - s.lr * rule.weight_decay);
  const T b1 = static_cast<T>(rule.beta1), one_minus_b1 = static_cast<T>(1 - rule.beta1);
  const T b2 = static_cast<T>(rule.beta2), one_minus_b2 = static_cast<T>(1 - rule.beta2);
  const T step_size = static_cast<T>(s.lr / (1 - std::pow(rule.beta1, t)));
  const T inv_bc2_sqrt = static_cast<T>(1 / std::sqrt(1 - std::pow(rule.beta2, t)));
  const T eps = static_cast<T>(rule.eps);
  const T scale = static_cast<T>(s.grad_scale);
  const std::size_t n = w.size();
  T* __restrict wp = w.data();
  const T* __restrict gp = g.data();
  T* __restrict mp = state[0]->data<T>().data();
  T* __restrict vp = state[1]->data<T>().data();
  for_parts(n, [=](std::size_t begin, std::size_t end) {
    T* __restrict wl = wp;
    T* __restrict ml = mp;
    T* __restrict vl = vp;
    const T* __restrict gl = gp;
    for (std::size_t i = begin; i < end; ++i) {
      const T gi = gl[i] * scale;
      const T m = b1 * ml[i] + one_minus_b1 * gi;
      const T v = b2 * vl[i] + one_minus_b2 * gi * gi;
      ml[i] = m;
      vl[i] = v;
      wl[i] = wl[i] * decay - step_size * m / (std::sqrt(v) * inv_bc2_sqrt + eps);
    }
  });
}

// Returns Σ x² in float64 with independent partial sums: the adds pipeline (and vectorise)
// without reassociating.
template <typename T>
double squares(std::span<const T> x) {
  constexpr std::size_t kLanes = 8;
  std::array<double, kLanes> acc{};
  const std::size_t body = x.size() / kLanes * kLanes;
  for (std::size_t i = 0; i < body; i += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      acc[l] += v * v;
    }
  }
  for (std::size_t i = body; i < x.size(); ++i) {
    const double v = static_cast<double>(x[i]);
    acc[0] += v * v;
  }
  double sum = 0;
  for (double a : acc) sum += a;
  return sum;
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

double sum_of_squares(const Tensor& t) {
  double total = 0;
  visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      // Parts over the device's threads, their sums added in part order.
      const std::span<const T> all = t.data<T>();
      const auto n = static_cast<std::int64_t>(all.size());
      const int parts = parallel_parts(n, kElementGrain);
      std::vector<double> part_sums(static_cast<std::size_t>(parts), 0.0);
      parallel_parts_for(n, parts, [&](int part, std::int64_t begin, std::int64_t end) {
        part_sums[static_cast<std::size_t>(part)] = squares(
            all.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin)));
      });
      for (double s : part_sums) total += s;
    } else {
      MESHFLOW_CHECK(false, "sum_of_squares on {}", to_string(t.dtype()));
    }
  });
  return total;
}

}  // namespace meshflow
