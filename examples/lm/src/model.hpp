// model.hpp — the byte-level decoder-only Transformer of the experiment
// (MATH.md §9), forward only: the model a checkpoint of the PyTorch trainer
// (experiments/tinystories) describes, run on the CPU with every attention
// through the library's operator. Templated on the scalar type (float; double
// where a test wants it).
//
//   x0     = wte[byte] + wpe[position]                       embeddings
//   per block l:
//     h1   = LayerNorm(x; ln_1)                              pre-LN, eps 1e-5
//     qkv  = h1 · W_qkv + b_qkv                              [N, 3C], columns [q | k | v]
//     att  = Attention(q, k, v; causal, τ, scale 1/sqrt(Dh)) library operator
//     x    = x + att · W_o + b_o
//     h2   = LayerNorm(x; ln_2)
//     x    = x + GELU(h2 · W_fc + b_fc) · W_proj + b_proj    exact-erf GELU, width F
//   logits = LayerNorm(x; ln_f) · wteᵀ                        tied output projection
//
// Heads: head h of q (k, v) is columns [h·Dh, (h+1)·Dh) of the q (k, v)
// block; att's columns are the heads concatenated in the same order.
// Temperature (MATH.md §8): the config's fixed τ; or a learned per-layer
// τ = exp(log_temperature) (continuum, softmax, fixed focal); or focal
// attention's per-token τ_i = clip(h1_i·w + b, τ_min, τ_max), shared by the
// heads of a token, passed as a per-query [B, H, L] temperature.
//
// Shapes: N = B·L rows (batch-major), C = d_model, H heads, Dh = C/H, F = mlp_mult·C.
// Weights are stored [in, out]: a layer is y = x·W + b on row vectors.
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

namespace lm {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapMat = Eigen::Map<const Mat<T>>;
template <class T>
using MapRow = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

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
};

/// The parameter layout implied by a configuration: the checkpoint contract
/// (names follow GPT-2; README.md, "Checkpoint format").
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
    auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
      std::size_t n = 1;
      for (auto s : shape) n *= std::size_t(s);
      tensors.push_back({name, shape, total, n});
      total += n;
      return tensors.size() - 1;
    };
    wte = add("wte", {256, C});
    wpe = add("wpe", {c.context, C});
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      Block b;
      b.ln1_g = add(p + "ln_1.weight", {C});
      b.ln1_b = add(p + "ln_1.bias", {C});
      b.w_qkv = add(p + "attn.c_attn.weight", {C, 3 * C});
      b.b_qkv = add(p + "attn.c_attn.bias", {3 * C});
      b.w_o = add(p + "attn.c_proj.weight", {C, C});
      b.b_o = add(p + "attn.c_proj.bias", {C});
      b.ln2_g = add(p + "ln_2.weight", {C});
      b.ln2_b = add(p + "ln_2.bias", {C});
      b.w_fc = add(p + "mlp.c_fc.weight", {C, F});
      b.b_fc = add(p + "mlp.c_fc.bias", {F});
      b.w_proj = add(p + "mlp.c_proj.weight", {F, C});
      b.b_proj = add(p + "mlp.c_proj.bias", {C});
      blocks.push_back(b);
    }
    lnf_g = add("ln_f.weight", {C});
    lnf_b = add("ln_f.bias", {C});
    // Kernel-specific parameters last. A checkpoint's tensors are matched by
    // name; their order in the file does not matter.
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".attn.";
      if (c.focal_learned()) {
        blocks[l].focal_w = long(add(p + "focal.weight", {C}));
        blocks[l].focal_b = long(add(p + "focal.bias", {1}));
      } else if (c.scalar_learned()) {
        blocks[l].log_tau = long(add(p + "log_temperature", {1}));
      }
    }
  }
};

template <class T>
class Model {
 public:
  /// Validates `cfg`; all parameters start at zero (load_checkpoint fills them).
  explicit Model(const Config& cfg)
      : cfg_((cfg.validate(), cfg)), layout_(cfg), params_(layout_.total, T(0)) {}

  const Config& config() const { return cfg_; }
  const Layout& layout() const { return layout_; }
  std::vector<T>& params() { return params_; }
  const std::vector<T>& params() const { return params_; }
  std::size_t num_params() const { return layout_.total; }
  /// The parameters of tensor `name` (throws std::out_of_range if absent).
  T* tensor(const std::string& name) {
    for (const auto& t : layout_.tensors)
      if (t.name == name) return params_.data() + t.offset;
    throw std::out_of_range("model: no tensor '" + name + "'");
  }
  /// OpenMP threads of the operator calls (0 = the runtime's default).
  void set_num_threads(int n) { threads_ = n; }

  /// Forward over B sequences of L ≤ context bytes (inputs [B·L], batch-major,
  /// positions 0 … L−1 in every sequence); logits() is then [B·L, 256]. With
  /// `targets` ([B·L]) also the per-position NLL −log softmax(logits)[target]
  /// in nats (nll(), computed in double from the logits) and returns its mean.
  double forward(const std::uint8_t* inputs, const std::uint8_t* targets, int B, int L);

  const Mat<T>& logits() const { return logits_; }
  const std::vector<double>& nll() const { return nll_; }
  /// Per-token temperatures of layer l in the last forward (focal), [B, H, L].
  const std::vector<T>& temperatures(int l) const { return tau_[std::size_t(l)]; }

  /// Key/value cache for incremental decoding (B = 1): per layer [H, cap, Dh].
  struct KVCache {
    int capacity = 0, length = 0;
    std::vector<std::vector<T>> k, v;
  };
  KVCache make_cache() const {
    KVCache c;
    c.capacity = cfg_.context;
    c.k.assign(std::size_t(cfg_.n_layer), std::vector<T>(std::size_t(cfg_.context) * cfg_.d_model));
    c.v = c.k;
    return c;
  }
  /// Runs n new tokens (positions cache.length …) through the model against
  /// the cache, appending their keys/values; returns their logits [n, 256].
  /// n = 1 is the decode step: one query row against the cached keys and
  /// values (Lq = 1, causal, bottom-right aligned).
  Mat<T> forward_cached(const std::uint8_t* tokens, int n, KVCache& cache);

 private:
  const T* p(std::size_t tensor) const { return params_.data() + layout_.tensors[tensor].offset; }
  MapMat<T> pm(std::size_t t) const {
    const auto& ti = layout_.tensors[t];
    return MapMat<T>(p(t), ti.shape[0], ti.shape[1]);
  }
  MapRow<T> pr(std::size_t t) const { return MapRow<T>(p(t), Eigen::Index(layout_.tensors[t].size)); }

  static constexpr double ln_eps = 1e-5;
  static void layer_norm(const Mat<T>& x, const T* g, const T* b, Mat<T>& y);
  static T gelu(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476))); }

  /// Temperature of layer l for B×L queries whose normalised inputs are h1
  /// (fills tau with [B, H, L] values when per-query).
  continuum::Temperature<T> temperature(int l, const Mat<T>& h1, int B, int L,
                                        std::vector<T>& tau) const;
  /// x += MLP(LayerNorm(x; ln_2)) of block l.
  void mlp(int l, Mat<T>& x) const;

  Config cfg_;
  Layout layout_;
  std::vector<T> params_;
  int threads_ = 0;
  Mat<T> logits_;
  std::vector<double> nll_;
  std::vector<std::vector<T>> tau_;
};

// ---------------------------------------------------------------------------

template <class T>
void Model<T>::layer_norm(const Mat<T>& x, const T* g, const T* b, Mat<T>& y) {
  const Eigen::Index N = x.rows(), C = x.cols();
  y.resize(N, C);
#pragma omp parallel for schedule(static) if (N >= 64)
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* xr = x.data() + n * C;
    T mean = 0;
    for (Eigen::Index c = 0; c < C; ++c) mean += xr[c];
    mean /= T(C);
    T var = 0;  // biased, as torch.nn.LayerNorm
    for (Eigen::Index c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= T(C);
    const T r = T(1) / std::sqrt(var + T(ln_eps));
    T* yr = y.data() + n * C;
    for (Eigen::Index c = 0; c < C; ++c) yr[c] = (xr[c] - mean) * r * g[c] + b[c];
  }
}

template <class T>
continuum::Temperature<T> Model<T>::temperature(int l, const Mat<T>& h1, int B, int L,
                                                std::vector<T>& tau) const {
  continuum::Temperature<T> t;
  const auto& blk = layout_.blocks[std::size_t(l)];
  if (blk.focal_w >= 0) {
    const int C = cfg_.d_model, H = cfg_.n_head;
    const T* w = p(std::size_t(blk.focal_w));
    const T bias = p(std::size_t(blk.focal_b))[0];
    tau.resize(std::size_t(B) * H * L);
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < L; ++s) {
        const T* h = h1.data() + (std::size_t(b) * L + s) * C;
        T raw = bias;
        for (int c = 0; c < C; ++c) raw += h[c] * w[c];
        const T v = std::min(std::max(raw, T(cfg_.focal_tau_min)), T(cfg_.focal_tau_max));
        for (int hh = 0; hh < H; ++hh) tau[(std::size_t(b) * H + hh) * L + s] = v;
      }
    t.shape = continuum::TemperatureShape::per_query;
    t.data = tau.data();
  } else if (blk.log_tau >= 0) {
    tau.clear();
    t.value = std::exp(p(std::size_t(blk.log_tau))[0]);
  } else {
    tau.clear();
    t.value = T(cfg_.temperature);
  }
  return t;
}

template <class T>
void Model<T>::mlp(int l, Mat<T>& x) const {
  const auto& blk = layout_.blocks[std::size_t(l)];
  Mat<T> h2, f(x.rows(), std::int64_t(cfg_.mlp_mult) * cfg_.d_model);
  layer_norm(x, p(blk.ln2_g), p(blk.ln2_b), h2);
  gemm(f, h2, pm(blk.w_fc), false);
  f.rowwise() += pr(blk.b_fc);
  {
    const Eigen::Index n = f.size();
    T* d = f.data();
#pragma omp parallel for schedule(static) if (n >= 4096)
    for (Eigen::Index i = 0; i < n; ++i) d[i] = gelu(d[i]);
  }
  gemm(x, f, pm(blk.w_proj), true);
  x.rowwise() += pr(blk.b_proj);
}

template <class T>
double Model<T>::forward(const std::uint8_t* inputs, const std::uint8_t* targets, int B, int L) {
  if (L < 1 || L > cfg_.context || B < 1)
    throw std::invalid_argument("forward: sequence length " + std::to_string(L) +
                                " outside [1, context=" + std::to_string(cfg_.context) +
                                "] or no sequence");
  const int C = cfg_.d_model, H = cfg_.n_head, Dh = cfg_.head_dim();
  const Eigen::Index N = Eigen::Index(B) * L;
  tau_.resize(std::size_t(cfg_.n_layer));

  Mat<T> x(N, C);
  {
    const T* wte = p(layout_.wte);
    const T* wpe = p(layout_.wpe);
#pragma omp parallel for schedule(static) if (N >= 64)
    for (Eigen::Index n = 0; n < N; ++n) {
      const T* e = wte + std::size_t(inputs[n]) * C;
      const T* q = wpe + std::size_t(n % L) * C;
      T* xr = x.data() + n * C;
      for (int c = 0; c < C; ++c) xr[c] = e[c] + q[c];
    }
  }

  Mat<T> h1, qkv(N, 3 * C), att(N, C);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const auto& blk = layout_.blocks[std::size_t(l)];
    layer_norm(x, p(blk.ln1_g), p(blk.ln1_b), h1);
    gemm(qkv, h1, pm(blk.w_qkv), false);
    qkv.rowwise() += pr(blk.b_qkv);

    continuum::ForwardArgs<T> a;
    using View = continuum::TensorView<const T>;
    const T* q = qkv.data();
    const std::int64_t sb = std::int64_t(L) * 3 * C;
    a.query = View{q, B, H, L, Dh, sb, Dh, 3 * C};
    a.key = View{q + C, B, H, L, Dh, sb, Dh, 3 * C};
    a.value = View{q + 2 * C, B, H, L, Dh, sb, Dh, 3 * C};
    a.out = continuum::TensorView<T>::bshd(att.data(), B, L, H, Dh);
    a.kernel = cfg_.kernel();
    a.temperature = temperature(l, h1, B, L, tau_[std::size_t(l)]);
    a.visibility.causal = true;
    a.num_threads = threads_;
    continuum::attention_forward(continuum::cpu, a);

    gemm(x, att, pm(blk.w_o), true);
    x.rowwise() += pr(blk.b_o);
    mlp(l, x);
  }
  Mat<T> hf;
  layer_norm(x, p(layout_.lnf_g), p(layout_.lnf_b), hf);
  logits_.resize(N, 256);
  gemm(logits_, hf, pm(layout_.wte).transpose(), false);

  nll_.clear();
  if (!targets) return 0.0;
  nll_.assign(std::size_t(N), 0.0);
  const Eigen::Index V = logits_.cols();
#pragma omp parallel for schedule(static) if (N >= 64)
  for (Eigen::Index n = 0; n < N; ++n) {
    const T* z = logits_.data() + n * V;
    T m = z[0];
    for (Eigen::Index v = 1; v < V; ++v) m = std::max(m, z[v]);
    double s = 0;
    for (Eigen::Index v = 0; v < V; ++v) s += std::exp(double(z[v]) - double(m));
    nll_[std::size_t(n)] = double(m) + std::log(s) - double(z[targets[n]]);
  }
  double total = 0;
  for (double v : nll_) total += v;
  return total / double(N);
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
  Mat<T> h1, qkv(n, 3 * C), att(n, C);
  std::vector<T> tau;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const auto& blk = layout_.blocks[std::size_t(l)];
    layer_norm(x, p(blk.ln1_g), p(blk.ln1_b), h1);
    gemm(qkv, h1, pm(blk.w_qkv), false);
    qkv.rowwise() += pr(blk.b_qkv);
    // Append the new keys/values to the cache, [H, cap, Dh].
    auto& K = cache.k[std::size_t(l)];
    auto& Vc = cache.v[std::size_t(l)];
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < Dh; ++d) {
          const std::size_t at = (std::size_t(h) * cache.capacity + P + i) * Dh + d;
          K[at] = qkv(i, C + h * Dh + d);
          Vc[at] = qkv(i, 2 * C + h * Dh + d);
        }
    continuum::ForwardArgs<T> a;
    using View = continuum::TensorView<const T>;
    const std::int64_t cap = cache.capacity;
    a.query = View{qkv.data(), 1, H, n, Dh, std::int64_t(n) * 3 * C, Dh, 3 * C};
    a.key = View{K.data(), 1, H, P + n, Dh, H * cap * Dh, cap * Dh, Dh};
    a.value = View{Vc.data(), 1, H, P + n, Dh, H * cap * Dh, cap * Dh, Dh};
    a.out = continuum::TensorView<T>::bshd(att.data(), 1, n, H, Dh);
    a.kernel = cfg_.kernel();
    a.temperature = temperature(l, h1, 1, n, tau);
    a.visibility.causal = true;  // bottom-right: query i sees keys [0, P + i + 1)
    a.num_threads = threads_;
    continuum::attention_forward(continuum::cpu, a);
    gemm(x, att, pm(blk.w_o), true);
    x.rowwise() += pr(blk.b_o);
    mlp(l, x);
  }
  cache.length = P + n;
  Mat<T> hf, out(n, 256);
  layer_norm(x, p(layout_.lnf_g), p(layout_.lnf_b), hf);
  gemm(out, hf, pm(layout_.wte).transpose(), false);
  return out;
}

}  // namespace lm
