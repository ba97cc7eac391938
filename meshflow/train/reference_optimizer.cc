// torch.optim's single-tensor update loops, element by element in double.
#include "meshflow/train/reference_optimizer.h"

#include <cmath>

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> out;
  visit_dtype(t.dtype(), [&](auto zero) {
    for (auto x : t.data<decltype(zero)>()) out.push_back(static_cast<double>(x));
  });
  return out;
}

void assign(Tensor& t, const std::vector<double>& values) {
  visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    std::span<T> d = t.data<T>();
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<T>(values[i]);
  });
}

}  // namespace

double reference_step(ReferenceOptimizer& o, std::map<std::string, Tensor*> weights,
                      const std::map<std::string, Tensor>& grads, int step, double loss) {
  double norm_sq = 0;
  for (const auto& [name, g] : grads)
    for (double x : as_doubles(g)) norm_sq += x * x;
  if (!std::isfinite(norm_sq) || !std::isfinite(loss)) return norm_sq;
  const Optimizer& opt = o.optimizer;
  const UpdateRule& r = opt.rule;
  // torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1.
  const double clip =
      r.clip_grad_norm ? std::min(1.0, *r.clip_grad_norm / (std::sqrt(norm_sq) + 1e-6)) : 1.0;
  const double lr = learning_rate(opt, step);
  for (const auto& [name, grad] : grads) {
    Tensor& w_tensor = *weights.at(name);
    std::vector<double> w = as_doubles(w_tensor), g = as_doubles(grad);
    for (double& x : g) x *= clip;
    std::vector<std::vector<double>>& state = o.state[name];
    if (state.empty()) state.assign(state_names(r).size(), std::vector<double>(w.size(), 0.0));
    if (r.kind == OptimizerKind::kSgd) {
      // torch.optim.SGD (dampening 0, no nesterov): buf = g at the first step, then
      // buf = momentum * buf + g; p -= lr * buf.
      for (std::size_t i = 0; i < w.size(); ++i) {
        double d = g[i];
        if (r.momentum > 0) {
          double& buf = state[0][i];
          buf = step == 1 ? g[i] : r.momentum * buf + g[i];
          d = buf;
        }
        w[i] -= lr * d;
      }
    } else {
      // torch.optim.AdamW: p *= 1 - lr * wd; m.lerp_(g, 1 - b1); v = b2 * v + (1 - b2) * g * g;
      // p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
      const double bc1 = 1 - std::pow(r.beta1, step), bc2 = 1 - std::pow(r.beta2, step);
      for (std::size_t i = 0; i < w.size(); ++i) {
        double& m = state[0][i];
        double& v = state[1][i];
        w[i] *= 1 - lr * r.weight_decay;
        m += (g[i] - m) * (1 - r.beta1);
        v = r.beta2 * v + (1 - r.beta2) * g[i] * g[i];
        w[i] -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + r.eps);
      }
    }
    assign(w_tensor, w);
  }
  return norm_sq;
}

}  // namespace meshflow
