// model.hpp — a byte-level decoder-only Transformer (MATH.md §9), written layer by
// layer with an explicit forward and backward, templated on the scalar type
// (float for training, double for the whole-model gradient check).
//
//   x0     = wte[byte] + wpe[position]                       embeddings
//   per block l:
//     h1   = LayerNorm(x; ln1)                               pre-LN
//     qkv  = h1 · W_qkv + b_qkv                              [N, 3C], packed
//     att  = Attention(q, k, v; causal, τ)                   library operator
//     x    = x + att · W_o + b_o
//     h2   = LayerNorm(x; ln2)
//     x    = x + GELU(h2 · W_fc + b_fc) · W_proj + b_proj    MLP, width mlp_mult·C
//   logits = LayerNorm(x; lnf) · wteᵀ                         tied output projection
//   loss   = mean over positions of −log softmax(logits)[target]   (nats)
//
// Temperature (MATH.md §8): a fixed τ; or a learned per-layer log τ (continuum,
// softmax; dτ from the operator, chain rule dθ = dτ·τ); or focal attention's
// learned per-token τ_i = clip(h1_i·w + b, τ_min, τ_max), shared by the heads of
// a token, passed as a per-query [B, H, L] temperature. (The bias b, initialised
// to the configured τ with w = 0, is our addition so that training starts at
// the same τ as the other kernels; MATH.md's causal form is the case b = 0.)
// Scores always keep the operator's default scale 1/sqrt(head_dim).
//
// Shapes: N = B·L rows (batch-major), C = d_model, H heads, Dh = C/H, F = mlp_mult·C.
// Weights are stored [in, out] so a layer is y = x·W + b on row vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/Dense>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <continuum/continuum.hpp>
#include "config.hpp"
#include "rng.hpp"

namespace lm {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapMat = Eigen::Map<Mat<T>>;
template <class T>
using MapRow = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;

/// out = a·b (or out += a·b), parallelised over blocks of output rows: each
/// OpenMP thread runs Eigen's single-threaded product on its own rows (Eigen's
/// multi-threaded GEMM busy-waits, which collapses on a shared machine). The
/// row partition depends only on the thread count, so results are bitwise
/// reproducible for a fixed count. `out` must already have its shape.
template <class Out, class A, class B>
void gemm(Out&& out, const A& a, const B& b, bool accumulate) {
  const Eigen::Index R = out.rows();
#ifdef _OPENMP
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  const int nt = 1;
#endif
  if (nt <= 1 || R < 64) {
    if (accumulate) out.noalias() += a * b;
    else out.noalias() = a * b;
    return;
  }
#pragma omp parallel num_threads(nt)
  {
#ifdef _OPENMP
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
    const int t = 0, n = 1;
#endif
    const Eigen::Index r0 = R * t / n, r1 = R * (t + 1) / n;
    if (r1 > r0) {
      if (accumulate) out.middleRows(r0, r1 - r0).noalias() += a.middleRows(r0, r1 - r0) * b;
      else out.middleRows(r0, r1 - r0).noalias() = a.middleRows(r0, r1 - r0) * b;
    }
  }
}

/// One named parameter tensor inside the flat parameter buffer.
struct TensorInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0, size = 0;
  bool decay = false;  ///< AdamW weight decay applies (matrices and embeddings)
};

/// The parameter layout implied by a configuration (names follow GPT-2).
struct Layout {
  struct Block {
    std::size_t ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj;
    long log_tau = -1, focal_w = -1, focal_b = -1;  ///< indices into tensors, -1 = absent
  };
  std::vector<TensorInfo> tensors;
  std::size_t wte = 0, wpe = 0, lnf_g = 0, lnf_b = 0;
  std::vector<Block> blocks;
  std::size_t total = 0;

  explicit Layout(const Config& c) {
    const std::int64_t C = c.d_model, F = std::int64_t(c.mlp_mult) * c.d_model;
    auto add = [&](const std::string& name, std::vector<std::int64_t> shape, bool decay) {
      std::size_t n = 1;
      for (auto s : shape) n *= std::size_t(s);
      tensors.push_back({name, shape, total, n, decay});
      total += n;
      return tensors.size() - 1;
    };
    wte = add("wte", {256, C}, true);
    wpe = add("wpe", {c.context, C}, true);
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      Block b;
      b.ln1_g = add(p + "ln_1.weight", {C}, false);
      b.ln1_b = add(p + "ln_1.bias", {C}, false);
      b.w_qkv = add(p + "attn.c_attn.weight", {C, 3 * C}, true);
      b.b_qkv = add(p + "attn.c_attn.bias", {3 * C}, false);
      b.w_o = add(p + "attn.c_proj.weight", {C, C}, true);
      b.b_o = add(p + "attn.c_proj.bias", {C}, false);
      b.ln2_g = add(p + "ln_2.weight", {C}, false);
      b.ln2_b = add(p + "ln_2.bias", {C}, false);
      b.w_fc = add(p + "mlp.c_fc.weight", {C, F}, true);
      b.b_fc = add(p + "mlp.c_fc.bias", {F}, false);
      b.w_proj = add(p + "mlp.c_proj.weight", {F, C}, true);
      b.b_proj = add(p + "mlp.c_proj.bias", {C}, false);
      blocks.push_back(b);
    }
    lnf_g = add("ln_f.weight", {C}, false);
    lnf_b = add("ln_f.bias", {C}, false);
    // Kernel-specific parameters last, so the shared ones have the same layout
    // (and the same initial values for a seed) for every kernel.
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".attn.";
      if (c.focal_learned()) {
        blocks[l].focal_w = long(add(p + "focal.weight", {C}, false));
        blocks[l].focal_b = long(add(p + "focal.bias", {1}, false));
      } else if (c.scalar_learned()) {
        blocks[l].log_tau = long(add(p + "log_temperature", {1}, false));
      }
    }
  }
};

template <class T>
class Model {
 public:
  explicit Model(const Config& cfg)
      : cfg_((cfg.validate(), cfg)), layout_(cfg), params_(layout_.total, T(0)),
        grads_(layout_.total, T(0)) {}

  const Config& config() const { return cfg_; }
  const Layout& layout() const { return layout_; }
  std::vector<T>& params() { return params_; }
  const std::vector<T>& params() const { return params_; }
  std::vector<T>& grads() { return grads_; }
  std::size_t num_params() const { return layout_.total; }

  /// GPT-2 style initialisation from `seed`: N(0, init_std) for matrices and
  /// embeddings (residual projections scaled by 1/sqrt(2·n_layer)), zero
  /// biases, unit LayerNorm gains; τ parameters start at cfg.temperature.
  void init(std::uint64_t seed) {
    Rng rng(seed, /*stream=*/1);
    const double sd = cfg_.init_std, sd_res = sd / std::sqrt(2.0 * cfg_.n_layer);
    for (std::size_t t = 0; t < layout_.tensors.size(); ++t) {
      const auto& ti = layout_.tensors[t];
      T* p = params_.data() + ti.offset;
      const bool gain = ti.name.find("ln_") != std::string::npos &&
                        ti.name.find(".weight") != std::string::npos;
      const bool residual = ti.name.find("c_proj.weight") != std::string::npos;
      if (ti.name.find("log_temperature") != std::string::npos) {
        p[0] = T(std::log(cfg_.temperature));
      } else if (ti.name.find("focal.bias") != std::string::npos) {
        p[0] = T(cfg_.temperature);
      } else if (ti.name.find("focal.weight") != std::string::npos) {
        std::fill(p, p + ti.size, T(0));
      } else if (gain) {
        std::fill(p, p + ti.size, T(1));
      } else if (ti.shape.size() == 1) {
        std::fill(p, p + ti.size, T(0));
      } else {
        const double s = residual ? sd_res : sd;
        for (std::size_t i = 0; i < ti.size; ++i) p[i] = T(s * rng.normal());
      }
    }
  }

  /// Forward over B sequences of L ≤ context bytes (inputs [B·L], batch-major).
  /// With `targets` returns the mean NLL in nats and keeps per-position NLLs
  /// (nll()); with keep_cache the activations needed by backward() are kept.
  double forward(const std::uint8_t* inputs, const std::uint8_t* targets, int B, int L,
                 bool keep_cache);
  /// Gradients of the last forward's mean loss into grads() (overwritten).
  void backward();

  const Mat<T>& logits() const { return logits_; }
  const std::vector<double>& nll() const { return nll_; }
  /// The per-token temperatures of layer l from the last forward (focal), [B,H,L].
  const std::vector<T>& temperatures(int l) const { return cache_[l].tau; }

  /// Key/value cache for incremental decoding (B = 1): per layer [H, cap, Dh].
  struct KVCache {
    int capacity = 0, length = 0;
    std::vector<std::vector<T>> k, v;
  };
  KVCache make_cache() const {
    KVCache c;
    c.capacity = cfg_.context;
    c.k.assign(cfg_.n_layer, std::vector<T>(std::size_t(cfg_.context) * cfg_.d_model));
    c.v = c.k;
    return c;
  }
  /// Run n new tokens (positions cache.length …) through the model against the
  /// cache, appending their keys/values; returns the logits [n, 256]. One
  /// query row per step when n = 1 (Lq = 1, causal, bottom-right aligned).
  Mat<T> forward_cached(const std::uint8_t* tokens, int n, KVCache& cache);

  /// Optional inspection: after forward(), fill [B,H,L,L] P and π for a layer
  /// by re-running its attention with probs/cell_mass outputs.
  void attention_maps(int layer, std::vector<T>& probs, std::vector<T>& cell_mass);

 private:
  struct BlockCache {
    Mat<T> xhat1, h1, qkv, att, xhat2, h2, f, g;
    std::vector<T> rstd1, rstd2, lse, tau, tau_raw;
  };

  T* p(std::size_t tensor) { return params_.data() + layout_.tensors[tensor].offset; }
  T* gp(std::size_t tensor) { return grads_.data() + layout_.tensors[tensor].offset; }
  MapMat<T> pm(std::size_t t) {
    const auto& ti = layout_.tensors[t];
    return MapMat<T>(p(t), ti.shape[0], ti.shape[1]);
  }
  MapMat<T> gm(std::size_t t) {
    const auto& ti = layout_.tensors[t];
    return MapMat<T>(gp(t), ti.shape[0], ti.shape[1]);
  }
  MapRow<T> pr(std::size_t t) { return MapRow<T>(p(t), layout_.tensors[t].size); }
  MapRow<T> gr(std::size_t t) { return MapRow<T>(gp(t), layout_.tensors[t].size); }

  static constexpr double ln_eps = 1e-5;
  static void layer_norm(const Mat<T>& x, const T* g, const T* b, Mat<T>& xhat, Mat<T>& y,
                         std::vector<T>& rstd);
  static void layer_norm_backward(const Mat<T>& dy, const Mat<T>& xhat,
                                  const std::vector<T>& rstd, const T* g, T* dg, T* db,
                                  Mat<T>& dx_accum);
  static T gelu(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476))); }
  static T gelu_grad(T x) {
    const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.7071067811865476)));
    const T pdf = T(0.3989422804014327) * std::exp(T(-0.5) * x * x);
    return cdf + x * pdf;
  }

  /// Temperature argument of layer l for B×L queries (fills bc.tau when per-query).
  continuum::Temperature<T> temperature(int l, BlockCache& bc, int B, int L);

  Config cfg_;
  Layout layout_;
  std::vector<T> params_, grads_;
  // Last forward.
  int B_ = 0, L_ = 0;
  std::vector<std::uint8_t> inputs_, targets_;
  std::vector<BlockCache> cache_;
  Mat<T> x_final_, xhatf_, hf_, logits_;
  std::vector<T> rstdf_;
  std::vector<double> nll_;
};

// ---------------------------------------------------------------------------

template <class T>
void Model<T>::layer_norm(const Mat<T>& x, const T* g, const T* b, Mat<T>& xhat, Mat<T>& y,
                          std::vector<T>& rstd) {
  const Eigen::Index N = x.rows(), C = x.cols();
  xhat.resize(N, C);
  y.resize(N, C);
  rstd.resize(std::size_t(N));
#pragma omp parallel for schedule(static)
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* xr = x.data() + n * C;
    T mean = 0;
    for (Eigen::Index c = 0; c < C; ++c) mean += xr[c];
    mean /= T(C);
    T var = 0;
    for (Eigen::Index c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= T(C);
    const T r = T(1) / std::sqrt(var + T(ln_eps));
    rstd[std::size_t(n)] = r;
    T* xh = xhat.data() + n * C;
    T* yr = y.data() + n * C;
    for (Eigen::Index c = 0; c < C; ++c) {
      xh[c] = (xr[c] - mean) * r;
      yr[c] = xh[c] * g[c] + b[c];
    }
  }
}

template <class T>
void Model<T>::layer_norm_backward(const Mat<T>& dy, const Mat<T>& xhat,
                                   const std::vector<T>& rstd, const T* g, T* dg, T* db,
                                   Mat<T>& dx) {
  const Eigen::Index N = dy.rows(), C = dy.cols();
  // Parameter gradients: column sums (serial: deterministic).
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* d = dy.data() + n * C;
    const T* xh = xhat.data() + n * C;
    for (Eigen::Index c = 0; c < C; ++c) {
      dg[c] += d[c] * xh[c];
      db[c] += d[c];
    }
  }
#pragma omp parallel for schedule(static)
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* d = dy.data() + n * C;
    const T* xh = xhat.data() + n * C;
    T mean_d = 0, mean_dx = 0;
    for (Eigen::Index c = 0; c < C; ++c) {
      const T dxh = d[c] * g[c];
      mean_d += dxh;
      mean_dx += dxh * xh[c];
    }
    mean_d /= T(C);
    mean_dx /= T(C);
    T* out = dx.data() + n * C;
    const T r = rstd[std::size_t(n)];
    for (Eigen::Index c = 0; c < C; ++c)
      out[c] += r * (d[c] * g[c] - mean_d - xh[c] * mean_dx);
  }
}

template <class T>
continuum::Temperature<T> Model<T>::temperature(int l, BlockCache& bc, int B, int L) {
  continuum::Temperature<T> t;
  const auto& blk = layout_.blocks[l];
  if (blk.focal_w >= 0) {
    const int C = cfg_.d_model, H = cfg_.n_head;
    const T* w = p(std::size_t(blk.focal_w));
    const T bias = p(std::size_t(blk.focal_b))[0];
    bc.tau_raw.resize(std::size_t(B) * L);
    bc.tau.resize(std::size_t(B) * H * L);
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < L; ++s) {
        const T* h = bc.h1.data() + (std::size_t(b) * L + s) * C;
        T raw = bias;
        for (int c = 0; c < C; ++c) raw += h[c] * w[c];
        bc.tau_raw[std::size_t(b) * L + s] = raw;
        const T tau = std::min(std::max(raw, T(cfg_.focal_tau_min)), T(cfg_.focal_tau_max));
        for (int hh = 0; hh < H; ++hh) bc.tau[(std::size_t(b) * H + hh) * L + s] = tau;
      }
    t.shape = continuum::TemperatureShape::per_query;
    t.data = bc.tau.data();
  } else if (blk.log_tau >= 0) {
    t.value = std::exp(p(std::size_t(blk.log_tau))[0]);
  } else {
    t.value = T(cfg_.temperature);
  }
  return t;
}

template <class T>
double Model<T>::forward(const std::uint8_t* inputs, const std::uint8_t* targets, int B, int L,
                         bool keep_cache) {
  if (L < 1 || L > cfg_.context)
    throw std::invalid_argument("forward: sequence length " + std::to_string(L) +
                                " outside [1, context=" + std::to_string(cfg_.context) + "]");
  const int C = cfg_.d_model, H = cfg_.n_head, Dh = cfg_.head_dim();
  const Eigen::Index N = Eigen::Index(B) * L;
  B_ = B;
  L_ = L;
  inputs_.assign(inputs, inputs + N);
  if (targets) targets_.assign(targets, targets + N);
  cache_.resize(std::size_t(cfg_.n_layer));

  Mat<T> x(N, C);
  {
    const T* wte = p(layout_.wte);
    const T* wpe = p(layout_.wpe);
#pragma omp parallel for schedule(static)
    for (Eigen::Index n = 0; n < N; ++n) {
      const T* e = wte + std::size_t(inputs[n]) * C;
      const T* q = wpe + std::size_t(n % L) * C;
      T* xr = x.data() + n * C;
      for (int c = 0; c < C; ++c) xr[c] = e[c] + q[c];
    }
  }

  for (int l = 0; l < cfg_.n_layer; ++l) {
    const auto& blk = layout_.blocks[std::size_t(l)];
    BlockCache& bc = cache_[std::size_t(l)];
    layer_norm(x, p(blk.ln1_g), p(blk.ln1_b), bc.xhat1, bc.h1, bc.rstd1);
    bc.qkv.resize(N, 3 * C);
    gemm(bc.qkv, bc.h1, pm(blk.w_qkv), false);
    bc.qkv.rowwise() += pr(blk.b_qkv);
    bc.att.resize(N, C);
    bc.lse.resize(std::size_t(N) * H);

    continuum::ForwardArgs<T> a;
    const T* qkv = bc.qkv.data();
    using View = continuum::TensorView<const T>;
    a.query = View{qkv, B, H, L, Dh, std::int64_t(L) * 3 * C, Dh, 3 * C};
    a.key = View{qkv + C, B, H, L, Dh, std::int64_t(L) * 3 * C, Dh, 3 * C};
    a.value = View{qkv + 2 * C, B, H, L, Dh, std::int64_t(L) * 3 * C, Dh, 3 * C};
    a.out = continuum::TensorView<T>::bshd(bc.att.data(), B, L, H, Dh);
    a.lse = bc.lse.data();
    a.kernel = cfg_.kernel();
    a.temperature = temperature(l, bc, B, L);
    a.visibility.causal = true;
    a.num_threads = cfg_.threads;
    continuum::attention_forward(continuum::cpu, a);

    gemm(x, bc.att, pm(blk.w_o), true);
    x.rowwise() += pr(blk.b_o);
    layer_norm(x, p(blk.ln2_g), p(blk.ln2_b), bc.xhat2, bc.h2, bc.rstd2);
    bc.f.resize(N, std::int64_t(cfg_.mlp_mult) * C);
    gemm(bc.f, bc.h2, pm(blk.w_fc), false);
    bc.f.rowwise() += pr(blk.b_fc);
    bc.g.resize(bc.f.rows(), bc.f.cols());
    {
      const Eigen::Index n = bc.f.size();
      const T* f = bc.f.data();
      T* g = bc.g.data();
#pragma omp parallel for schedule(static)
      for (Eigen::Index i = 0; i < n; ++i) g[i] = gelu(f[i]);
    }
    gemm(x, bc.g, pm(blk.w_proj), true);
    x.rowwise() += pr(blk.b_proj);
    if (!keep_cache) {
      // Keep only what a later attention_maps() call needs.
      bc.xhat1.resize(0, 0); bc.att.resize(0, 0);
      bc.xhat2.resize(0, 0); bc.h2.resize(0, 0);
      bc.f.resize(0, 0); bc.g.resize(0, 0);
    }
  }
  x_final_ = x;
  layer_norm(x, p(layout_.lnf_g), p(layout_.lnf_b), xhatf_, hf_, rstdf_);
  logits_.resize(N, 256);
  gemm(logits_, hf_, pm(layout_.wte).transpose(), false);

  if (!targets) return 0.0;
  nll_.assign(std::size_t(N), 0.0);
  const Eigen::Index V = logits_.cols();
#pragma omp parallel for schedule(static)
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* z = logits_.data() + n * V;
    T m = z[0];
    for (Eigen::Index v = 1; v < V; ++v) m = std::max(m, z[v]);
    double s = 0;
    for (Eigen::Index v = 0; v < V; ++v) s += std::exp(double(z[v] - m));
    nll_[std::size_t(n)] = double(m) + std::log(s) - double(z[targets[n]]);
  }
  double total = 0;
  for (double v : nll_) total += v;
  return total / double(N);
}

template <class T>
void Model<T>::backward() {
  if (targets_.size() != std::size_t(B_) * L_ || cache_.empty() || cache_[0].xhat1.size() == 0)
    throw std::logic_error("backward: needs a forward with targets and keep_cache");
  const int B = B_, L = L_, C = cfg_.d_model, H = cfg_.n_head, Dh = cfg_.head_dim();
  const Eigen::Index N = Eigen::Index(B) * L, V = logits_.cols();
  std::fill(grads_.begin(), grads_.end(), T(0));

  // d loss / d logits = (softmax − onehot) / N.
  Mat<T> dlogits(N, V);
#pragma omp parallel for schedule(static)
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* z = logits_.data() + n * V;
    T* d = dlogits.data() + n * V;
    T m = z[0];
    for (Eigen::Index v = 1; v < V; ++v) m = std::max(m, z[v]);
    T s = 0;
    for (Eigen::Index v = 0; v < V; ++v) s += (d[v] = std::exp(z[v] - m));
    const T inv = T(1) / (s * T(N));
    for (Eigen::Index v = 0; v < V; ++v) d[v] *= inv;
    d[targets_[std::size_t(n)]] -= T(1) / T(N);
  }
  gemm(gm(layout_.wte), dlogits.transpose(), hf_, true);
  Mat<T> dhf(N, C);
  gemm(dhf, dlogits, pm(layout_.wte), false);
  Mat<T> dx = Mat<T>::Zero(N, C);
  layer_norm_backward(dhf, xhatf_, rstdf_, p(layout_.lnf_g), gp(layout_.lnf_g),
                      gp(layout_.lnf_b), dx);

  Mat<T> tmp, dqkv, dq, dk, dv;
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const auto& blk = layout_.blocks[std::size_t(l)];
    BlockCache& bc = cache_[std::size_t(l)];
    // MLP: x += GELU(h2·W_fc + b_fc)·W_proj + b_proj.
    gemm(gm(blk.w_proj), bc.g.transpose(), dx, true);
    gr(blk.b_proj) += dx.colwise().sum();
    tmp.resize(N, bc.g.cols());
    gemm(tmp, dx, pm(blk.w_proj).transpose(), false);  // d g
    {
      const Eigen::Index n = tmp.size();
      const T* f = bc.f.data();
      T* d = tmp.data();
#pragma omp parallel for schedule(static)
      for (Eigen::Index i = 0; i < n; ++i) d[i] *= gelu_grad(f[i]);
    }
    gemm(gm(blk.w_fc), bc.h2.transpose(), tmp, true);
    gr(blk.b_fc) += tmp.colwise().sum();
    Mat<T> dh2(N, C);
    gemm(dh2, tmp, pm(blk.w_fc).transpose(), false);
    layer_norm_backward(dh2, bc.xhat2, bc.rstd2, p(blk.ln2_g), gp(blk.ln2_g), gp(blk.ln2_b), dx);

    // Attention: x += Attention(h1·W_qkv + b_qkv)·W_o + b_o.
    gemm(gm(blk.w_o), bc.att.transpose(), dx, true);
    gr(blk.b_o) += dx.colwise().sum();
    Mat<T> datt(N, C);
    gemm(datt, dx, pm(blk.w_o).transpose(), false);
    dqkv.resize(N, 3 * C);

    continuum::BackwardArgs<T> a;
    using View = continuum::TensorView<const T>;
    const T* qkv = bc.qkv.data();
    const std::int64_t sb = std::int64_t(L) * 3 * C;
    a.query = View{qkv, B, H, L, Dh, sb, Dh, 3 * C};
    a.key = View{qkv + C, B, H, L, Dh, sb, Dh, 3 * C};
    a.value = View{qkv + 2 * C, B, H, L, Dh, sb, Dh, 3 * C};
    a.out = continuum::TensorView<T>::bshd(bc.att.data(), B, L, H, Dh);
    a.grad_out = continuum::TensorView<T>::bshd(datt.data(), B, L, H, Dh);
    a.lse = bc.lse.data();
    // dQ, dK, dV in three [N, C] buffers (the operator rejects output views
    // whose address ranges interleave, as packed dQKV columns would), then
    // assembled into dqkv's column blocks.
    dq.resize(N, C);
    dk.resize(N, C);
    dv.resize(N, C);
    a.grad_query = continuum::TensorView<T>::bshd(dq.data(), B, L, H, Dh);
    a.grad_key = continuum::TensorView<T>::bshd(dk.data(), B, L, H, Dh);
    a.grad_value = continuum::TensorView<T>::bshd(dv.data(), B, L, H, Dh);
    a.kernel = cfg_.kernel();
    a.visibility.causal = true;
    a.num_threads = cfg_.threads;
    T dtau_scalar = 0;
    std::vector<T> dtau;
    if (blk.focal_w >= 0) {
      a.temperature.shape = continuum::TemperatureShape::per_query;
      a.temperature.data = bc.tau.data();
      dtau.assign(bc.tau.size(), T(0));
      a.grad_temperature = dtau.data();
    } else if (blk.log_tau >= 0) {
      a.temperature.value = std::exp(p(std::size_t(blk.log_tau))[0]);
      a.grad_temperature = &dtau_scalar;
    } else {
      a.temperature.value = T(cfg_.temperature);
    }
    continuum::attention_backward(continuum::cpu, a);
    dqkv.leftCols(C) = dq;
    dqkv.middleCols(C, C) = dk;
    dqkv.rightCols(C) = dv;

    gemm(gm(blk.w_qkv), bc.h1.transpose(), dqkv, true);
    gr(blk.b_qkv) += dqkv.colwise().sum();
    Mat<T> dh1(N, C);
    gemm(dh1, dqkv, pm(blk.w_qkv).transpose(), false);
    if (blk.log_tau >= 0) {
      // τ = exp(θ): dθ = dτ · τ.
      gp(std::size_t(blk.log_tau))[0] += dtau_scalar * a.temperature.value;
    } else if (blk.focal_w >= 0) {
      // τ_i = clip(h1_i·w + b): gradient only where the clip is inactive.
      const T* w = p(std::size_t(blk.focal_w));
      T* dw = gp(std::size_t(blk.focal_w));
      T* db = gp(std::size_t(blk.focal_b));
      for (int b = 0; b < B; ++b)
        for (int s = 0; s < L; ++s) {
          const std::size_t n = std::size_t(b) * L + s;
          const T raw = bc.tau_raw[n];
          if (!(raw > T(cfg_.focal_tau_min) && raw < T(cfg_.focal_tau_max))) continue;
          T g = 0;
          for (int hh = 0; hh < H; ++hh) g += dtau[(std::size_t(b) * H + hh) * L + s];
          db[0] += g;
          const T* h = bc.h1.data() + n * C;
          T* dh = dh1.data() + n * C;
          for (int c = 0; c < C; ++c) {
            dw[c] += g * h[c];
            dh[c] += g * w[c];
          }
        }
    }
    layer_norm_backward(dh1, bc.xhat1, bc.rstd1, p(blk.ln1_g), gp(blk.ln1_g), gp(blk.ln1_b), dx);
  }

  // Embeddings (serial scatter-add: deterministic).
  T* dwte = gp(layout_.wte);
  T* dwpe = gp(layout_.wpe);
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* d = dx.data() + n * C;
    T* e = dwte + std::size_t(inputs_[std::size_t(n)]) * C;
    T* q = dwpe + std::size_t(n % L) * C;
    for (int c = 0; c < C; ++c) {
      e[c] += d[c];
      q[c] += d[c];
    }
  }
}

template <class T>
Mat<T> Model<T>::forward_cached(const std::uint8_t* tokens, int n, KVCache& cache) {
  const int C = cfg_.d_model, H = cfg_.n_head, Dh = cfg_.head_dim();
  const int P = cache.length;
  if (n < 1 || P + n > cache.capacity)
    throw std::invalid_argument("forward_cached: " + std::to_string(P + n) +
                                " tokens exceed the cache capacity " +
                                std::to_string(cache.capacity));
  Mat<T> x(n, C);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < C; ++c)
      x(i, c) = pm(layout_.wte)(tokens[i], c) + pm(layout_.wpe)(P + i, c);
  BlockCache bc;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const auto& blk = layout_.blocks[std::size_t(l)];
    layer_norm(x, p(blk.ln1_g), p(blk.ln1_b), bc.xhat1, bc.h1, bc.rstd1);
    bc.qkv.noalias() = bc.h1 * pm(blk.w_qkv);
    bc.qkv.rowwise() += pr(blk.b_qkv);
    // Append the new keys/values to the cache, [H, cap, Dh].
    auto& K = cache.k[std::size_t(l)];
    auto& Vc = cache.v[std::size_t(l)];
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < Dh; ++d) {
          const std::size_t at = (std::size_t(h) * cache.capacity + P + i) * Dh + d;
          K[at] = bc.qkv(i, C + h * Dh + d);
          Vc[at] = bc.qkv(i, 2 * C + h * Dh + d);
        }
    bc.att.resize(n, C);
    bc.lse.resize(std::size_t(n) * H);
    continuum::ForwardArgs<T> a;
    using View = continuum::TensorView<const T>;
    const std::int64_t cap = cache.capacity;
    a.query = View{bc.qkv.data(), 1, H, n, Dh, std::int64_t(n) * 3 * C, Dh, 3 * C};
    a.key = View{K.data(), 1, H, P + n, Dh, H * cap * Dh, cap * Dh, Dh};
    a.value = View{Vc.data(), 1, H, P + n, Dh, H * cap * Dh, cap * Dh, Dh};
    a.out = continuum::TensorView<T>::bshd(bc.att.data(), 1, n, H, Dh);
    a.lse = bc.lse.data();
    a.kernel = cfg_.kernel();
    a.temperature = temperature(l, bc, 1, n);
    a.visibility.causal = true;  // bottom-right: query i sees keys [0, P + i + 1)
    a.num_threads = cfg_.threads;
    continuum::attention_forward(continuum::cpu, a);
    x.noalias() += bc.att * pm(blk.w_o);
    x.rowwise() += pr(blk.b_o);
    layer_norm(x, p(blk.ln2_g), p(blk.ln2_b), bc.xhat2, bc.h2, bc.rstd2);
    bc.f.noalias() = bc.h2 * pm(blk.w_fc);
    bc.f.rowwise() += pr(blk.b_fc);
    bc.g = bc.f.unaryExpr([](T v) { return gelu(v); });
    x.noalias() += bc.g * pm(blk.w_proj);
    x.rowwise() += pr(blk.b_proj);
  }
  cache.length = P + n;
  Mat<T> xh, hf;
  std::vector<T> r;
  layer_norm(x, p(layout_.lnf_g), p(layout_.lnf_b), xh, hf, r);
  return hf * pm(layout_.wte).transpose();
}

template <class T>
void Model<T>::attention_maps(int l, std::vector<T>& probs, std::vector<T>& cell_mass) {
  if (l < 0 || l >= cfg_.n_layer || cache_.size() != std::size_t(cfg_.n_layer))
    throw std::invalid_argument("attention_maps: no forward for layer " + std::to_string(l));
  const int B = B_, L = L_, C = cfg_.d_model, H = cfg_.n_head, Dh = cfg_.head_dim();
  BlockCache& bc = cache_[std::size_t(l)];
  probs.assign(std::size_t(B) * H * L * L, T(0));
  cell_mass.assign(probs.size(), T(0));
  std::vector<T> out(std::size_t(B) * L * C), lse(std::size_t(B) * H * L);
  continuum::ForwardArgs<T> a;
  using View = continuum::TensorView<const T>;
  const T* qkv = bc.qkv.data();
  const std::int64_t sb = std::int64_t(L) * 3 * C;
  a.query = View{qkv, B, H, L, Dh, sb, Dh, 3 * C};
  a.key = View{qkv + C, B, H, L, Dh, sb, Dh, 3 * C};
  a.value = View{qkv + 2 * C, B, H, L, Dh, sb, Dh, 3 * C};
  a.out = continuum::TensorView<T>::bshd(out.data(), B, L, H, Dh);
  a.lse = lse.data();
  a.kernel = cfg_.kernel();
  a.temperature = temperature(l, bc, B, L);
  a.visibility.causal = true;
  a.probs = probs.data();
  a.cell_mass = cell_mass.data();
  a.num_threads = cfg_.threads;
  continuum::attention_forward(continuum::cpu, a);
}

}  // namespace lm
