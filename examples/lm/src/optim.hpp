// optim.hpp — AdamW with decoupled weight decay (Loshchilov & Hutter), linear
// warm-up then cosine decay of the learning rate, and global-norm clipping.
#pragma once

#include <cmath>
#include <vector>

#include "config.hpp"
#include "model.hpp"

namespace lm {

/// Learning rate at optimiser step `step` (0-based): linear warm-up to cfg.lr
/// over warmup_steps, then cosine decay to lr·min_lr_ratio at the last step.
inline double learning_rate(const Config& c, int step) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps);
  const int decay = std::max(1, c.steps - c.warmup_steps);
  const double progress = std::min(1.0, double(step - c.warmup_steps) / double(decay));
  const double lo = c.lr * c.min_lr_ratio;
  return lo + 0.5 * (1.0 + std::cos(3.141592653589793 * progress)) * (c.lr - lo);
}

/// Scales `g` so its global L2 norm is at most max_norm (0 = no clipping);
/// returns the norm before clipping. Serial sum: deterministic.
template <class T>
double clip_grad_norm(std::vector<T>& g, double max_norm) {
  double s = 0;
  for (T v : g) s += double(v) * double(v);
  const double norm = std::sqrt(s);
  if (max_norm > 0 && norm > max_norm) {
    const T f = T(max_norm / (norm + 1e-12));
    for (T& v : g) v *= f;
  }
  return norm;
}

template <class T>
class AdamW {
 public:
  AdamW(const Layout& layout, const Config& c)
      : cfg_(c), m_(layout.total, T(0)), v_(layout.total, T(0)),
        decay_(layout.total, 0) {
    for (const auto& t : layout.tensors)
      std::fill(decay_.begin() + std::ptrdiff_t(t.offset),
                decay_.begin() + std::ptrdiff_t(t.offset + t.size), t.decay ? 1 : 0);
  }

  void step(std::vector<T>& p, const std::vector<T>& g, double lr) {
    ++t_;
    const double b1 = cfg_.beta1, b2 = cfg_.beta2;
    const double c1 = 1.0 / (1.0 - std::pow(b1, t_)), c2 = 1.0 / (1.0 - std::pow(b2, t_));
    const T wd = T(lr * cfg_.weight_decay), a = T(lr), eps = T(cfg_.adam_eps);
    const std::ptrdiff_t n = std::ptrdiff_t(p.size());
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) {
      m_[i] = T(b1) * m_[i] + T(1 - b1) * g[i];
      v_[i] = T(b2) * v_[i] + T(1 - b2) * g[i] * g[i];
      const T mh = m_[i] * T(c1), vh = v_[i] * T(c2);
      if (decay_[i]) p[i] -= wd * p[i];
      p[i] -= a * mh / (std::sqrt(vh) + eps);
    }
  }

 private:
  Config cfg_;
  std::vector<T> m_, v_;
  std::vector<unsigned char> decay_;
  int t_ = 0;
};

}  // namespace lm
