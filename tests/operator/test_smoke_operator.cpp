// Smoke tests of the CPU operator against a naive, materialising double
// implementation written here (same MATH.md §4 formulas, no tiling, no online
// maximum), central finite differences for the backward, empty rows, thread
// counts and the KV-cache decode identity. The thorough multiprecision
// reference tests live in tests/operator/ and tests/property/ (ref).
#include <catch2/catch.hpp>

#include <continuum/continuum.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace continuum;

namespace {

struct Problem {
  index_t B = 1, Hq = 1, Hk = 1, Lq = 4, Lk = 4, D = 3, Dv = 2;
  std::vector<double> q, k, v, tau;  // BHSD; tau per query [B, Hq, Lq]
  Visibility vis{};
  std::vector<index_t> rlo, rhi;
  Kernel kernel = Kernel::continuum;
  double scale = 0.0;  // 0: default
};

Problem make_problem(index_t B, index_t Hq, index_t Hk, index_t Lq, index_t Lk, index_t D, index_t Dv,
                     unsigned seed, double amp = 1.0) {
  Problem p;
  p.B = B; p.Hq = Hq; p.Hk = Hk; p.Lq = Lq; p.Lk = Lk; p.D = D; p.Dv = Dv;
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-amp, amp), ut(0.3, 1.5);
  p.q.resize(B * Hq * Lq * D); p.k.resize(B * Hk * Lk * D); p.v.resize(B * Hk * Lk * Dv);
  p.tau.resize(B * Hq * Lq);
  for (auto& x : p.q) x = u(g);
  for (auto& x : p.k) x = u(g);
  for (auto& x : p.v) x = u(g);
  for (auto& x : p.tau) x = ut(g);
  return p;
}

// Naive materialising forward in double: out [B,Hq,Lq,Dv], lse [B,Hq,Lq].
void naive_forward(const Problem& p, std::vector<double>& out, std::vector<double>& lse,
                   std::vector<double>* probs = nullptr) {
  out.assign(p.B * p.Hq * p.Lq * p.Dv, 0.0);
  lse.assign(p.B * p.Hq * p.Lq, -INFINITY);
  if (probs) probs->assign(p.B * p.Hq * p.Lq * p.Lk, 0.0);
  Visibility vis = p.vis;
  if (!p.rlo.empty()) { vis.range_lo = p.rlo.data(); vis.range_hi = p.rhi.data(); }
  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(double(p.D));
  for (index_t b = 0; b < p.B; ++b)
    for (index_t h = 0; h < p.Hq; ++h) {
      const index_t hk = h / (p.Hq / p.Hk);
      for (index_t i = 0; i < p.Lq; ++i) {
        const KeyRange r = visible_range(vis, b, i, p.Lq, p.Lk);
        if (r.empty()) continue;
        const index_t row = (b * p.Hq + h) * p.Lq + i;
        const double c = scale / p.tau[row];
        std::vector<double> s(p.Lk, 0.0), a(p.Lk, 0.0);
        double m = -INFINITY;
        for (index_t j = r.lo; j < r.hi; ++j) {
          double d = 0;
          for (index_t e = 0; e < p.D; ++e)
            d += p.q[row * p.D + e] * p.k[((b * p.Hk + hk) * p.Lk + j) * p.D + e];
          s[j] = c * d;
          m = std::max(m, s[j]);
        }
        double Z = 0;
        for (index_t j = r.lo; j < r.hi; ++j) {
          const bool hl = j - 1 >= r.lo, hr = j + 1 < r.hi;
          const double l = hl ? s[j - 1] - m : 0, x = s[j] - m, rr = hr ? s[j + 1] - m : 0;
          a[j] = p.kernel == Kernel::continuum ? ContinuumStencil::weight(l, x, rr, hl, hr)
                                               : SoftmaxStencil::weight(l, x, rr, hl, hr);
          Z += a[j];
        }
        for (index_t j = r.lo; j < r.hi; ++j) {
          const double P = a[j] / Z;
          if (probs) (*probs)[row * p.Lk + j] = P;
          for (index_t e = 0; e < p.Dv; ++e)
            out[row * p.Dv + e] += P * p.v[((b * p.Hk + hk) * p.Lk + j) * p.Dv + e];
        }
        lse[row] = m + std::log(Z);
      }
    }
}

/// dO [B, Hq, Lq, Dv] uniform in [-1, 1) from seed.
std::vector<double> random_dout(const Problem& p, unsigned seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> dout(p.B * p.Hq * p.Lq * p.Dv);
  for (auto& x : dout) x = u(g);
  return dout;
}

/// L = Σ dO∘O of the naive forward: the loss of the finite-difference tests.
double naive_loss(const Problem& p, const std::vector<double>& dout) {
  std::vector<double> o, l;
  naive_forward(p, o, l);
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * dout[i];
  return s;
}

/// (L(p + h) − L(p − h)) / (2h) for the perturbations pp, pm of p.
double naive_difference(const Problem& pp, const Problem& pm, double h, const std::vector<double>& dout) {
  return (naive_loss(pp, dout) - naive_loss(pm, dout)) / (2 * h);
}

template <class T>
struct Run {
  std::vector<T> q, k, v, tau, out, lse, probs, cm, dout, dq, dk, dv, dtau;
};

template <class T>
ForwardArgs<T> forward_args(const Problem& p, Run<T>& r, TemperatureShape ts = TemperatureShape::per_query) {
  r.q.assign(p.q.begin(), p.q.end());
  r.k.assign(p.k.begin(), p.k.end());
  r.v.assign(p.v.begin(), p.v.end());
  r.tau.assign(p.tau.begin(), p.tau.end());
  r.out.assign(p.B * p.Hq * p.Lq * p.Dv, T(-7));
  r.lse.assign(p.B * p.Hq * p.Lq, T(-7));
  ForwardArgs<T> a;
  a.query = TensorView<T>::bhsd(r.q.data(), p.B, p.Hq, p.Lq, p.D);
  a.key = TensorView<T>::bhsd(r.k.data(), p.B, p.Hk, p.Lk, p.D);
  a.value = TensorView<T>::bhsd(r.v.data(), p.B, p.Hk, p.Lk, p.Dv);
  a.out = TensorView<T>::bhsd(r.out.data(), p.B, p.Hq, p.Lq, p.Dv);
  a.lse = r.lse.data();
  a.kernel = p.kernel;
  a.temperature.shape = ts;
  a.temperature.data = r.tau.data();
  a.temperature.value = p.tau.empty() ? T(1) : T(p.tau[0]);
  if (p.scale > 0) a.scale = p.scale;
  a.visibility = p.vis;
  if (!p.rlo.empty()) { a.visibility.range_lo = p.rlo.data(); a.visibility.range_hi = p.rhi.data(); }
  return a;
}

template <class T>
BackwardArgs<T> backward_args(const Problem& p, Run<T>& r, const std::vector<double>& dout) {
  ForwardArgs<T> f = forward_args<T>(p, r);
  attention_forward(cpu, f);
  r.dout.assign(dout.begin(), dout.end());
  r.dq.assign(r.q.size(), T(-7)); r.dk.assign(r.k.size(), T(-7)); r.dv.assign(r.v.size(), T(-7));
  r.dtau.assign(r.tau.size(), T(-7));
  BackwardArgs<T> a;
  a.query = f.query; a.key = f.key; a.value = f.value; a.out = f.out;
  a.grad_out = TensorView<T>::bhsd(r.dout.data(), p.B, p.Hq, p.Lq, p.Dv);
  a.lse = r.lse.data();
  a.grad_query = TensorView<T>::bhsd(r.dq.data(), p.B, p.Hq, p.Lq, p.D);
  a.grad_key = TensorView<T>::bhsd(r.dk.data(), p.B, p.Hk, p.Lk, p.D);
  a.grad_value = TensorView<T>::bhsd(r.dv.data(), p.B, p.Hk, p.Lk, p.Dv);
  a.grad_temperature = r.dtau.data();
  static_cast<continuum::AttentionOptions<T>&>(a) = f;  // the forward's options
  return a;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}
template <class T>
std::vector<double> to_double(const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); }

void set_vis(Problem& p, int mode) {
  p.vis = Visibility{};
  p.rlo.clear(); p.rhi.clear();
  if (mode == 1) p.vis.causal = true;
  if (mode == 2) { p.vis.causal = true; p.vis.window_left = 6; }  // 7 keys
  if (mode == 3) {
    std::mt19937 g(5);
    for (index_t b = 0; b < p.B; ++b)
      for (index_t i = 0; i < p.Lq; ++i) {
        index_t lo = g() % (p.Lk + 1), hi = g() % (p.Lk + 1);
        if (lo > hi) std::swap(lo, hi);
        if (i % 5 == 0) hi = lo;  // some empty rows
        p.rlo.push_back(lo); p.rhi.push_back(hi);
      }
  }
  if (mode == 4) { p.vis.window_left = 1; p.vis.window_right = 1; }  // 3 keys around the diagonal
}

}  // namespace

TEST_CASE("forward matches the naive double implementation", "[operator][smoke]") {
  for (int kern = 0; kern < 2; ++kern)
    for (int mode = 0; mode < 5; ++mode) {
      Problem p = make_problem(2, 4, 2, 37, 150, 5, 3, 11 + mode, 2.0);
      p.kernel = kern ? Kernel::softmax : Kernel::continuum;
      set_vis(p, mode);
      std::vector<double> ref_o, ref_lse, ref_p;
      naive_forward(p, ref_o, ref_lse, &ref_p);
      Run<double> rd;
      auto ad = forward_args<double>(p, rd);
      rd.probs.assign(p.B * p.Hq * p.Lq * p.Lk, -1.0);
      rd.cm.assign(p.B * p.Hq * p.Lq * p.Lk, -1.0);
      ad.probs = rd.probs.data(); ad.cell_mass = rd.cm.data();
      attention_forward(cpu, ad);
      INFO("kernel " << kern << " mode " << mode);
      CHECK(max_abs_diff(to_double(rd.out), ref_o) < 1e-13);
      CHECK(max_abs_diff(to_double(rd.probs), ref_p) < 1e-14);
      for (size_t i = 0; i < ref_lse.size(); ++i) {
        if (std::isinf(ref_lse[i])) CHECK(rd.lse[i] == ref_lse[i]);
        else CHECK(std::abs(rd.lse[i] - ref_lse[i]) < 1e-13);
      }
      // π rows sum to 1 (or 0 when empty).
      for (index_t row = 0; row < p.B * p.Hq * p.Lq; ++row) {
        double sp = 0, sm = 0;
        for (index_t j = 0; j < p.Lk; ++j) { sp += rd.probs[row * p.Lk + j]; sm += rd.cm[row * p.Lk + j]; }
        CHECK(std::abs(sm - sp) < 1e-13);
        CHECK((std::abs(sp - 1) < 1e-13 || sp == 0.0));
      }
      Run<float> rf;
      auto af = forward_args<float>(p, rf);
      af.compute = Compute::float64;
      attention_forward(cpu, af);
      // float storage: inputs as floats; computed in double, so vs the double
      // naive on the *rounded* inputs the error is one output rounding.
      Problem pf = p;
      for (auto& x : pf.q) x = float(x);
      for (auto& x : pf.k) x = float(x);
      for (auto& x : pf.v) x = float(x);
      for (auto& x : pf.tau) x = float(x);
      std::vector<double> ref_of, ref_lf;
      naive_forward(pf, ref_of, ref_lf);
      for (size_t i = 0; i < ref_of.size(); ++i)
        CHECK(std::abs(rf.out[i] - ref_of[i]) <= 1e-6 * std::abs(ref_of[i]) + 1e-12);
    }
}

TEST_CASE("layouts: BSHD and packed QKV give the BHSD result", "[operator][smoke]") {
  Problem p = make_problem(2, 4, 4, 19, 19, 8, 8, 3);
  p.vis.causal = true;
  Run<double> r;
  auto a = forward_args<double>(p, r, TemperatureShape::scalar);
  attention_forward(cpu, a);
  // packed [B, L, 3, H, D]
  const index_t B = 2, L = 19, H = 4, D = 8;
  std::vector<double> qkv(B * L * 3 * H * D), out(B * L * H * D);
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < L; ++t)
      for (index_t h = 0; h < H; ++h)
        for (index_t e = 0; e < D; ++e) {
          const index_t src = ((b * H + h) * L + t) * D + e;
          qkv[(((b * L + t) * 3 + 0) * H + h) * D + e] = p.q[src];
          qkv[(((b * L + t) * 3 + 1) * H + h) * D + e] = p.k[src];
          qkv[(((b * L + t) * 3 + 2) * H + h) * D + e] = p.v[src];
        }
  ForwardArgs<double> pk = a;
  auto view = [&](index_t which) {
    return TensorView<const double>{qkv.data() + which * H * D, B, H, L, D, L * 3 * H * D, D, 3 * H * D, 1};
  };
  pk.query = view(0); pk.key = view(1); pk.value = view(2);
  pk.out = TensorView<double>::bshd(out.data(), B, L, H, D);
  std::vector<double> lse2(B * H * L);
  pk.lse = lse2.data();
  attention_forward(cpu, pk);
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < L; ++t)
      for (index_t h = 0; h < H; ++h)
        for (index_t e = 0; e < D; ++e)
          CHECK(out[((b * L + t) * H + h) * D + e] == r.out[((b * H + h) * L + t) * D + e]);
}

TEST_CASE("backward matches central finite differences (double)", "[operator][smoke]") {
  for (int kern = 0; kern < 2; ++kern)
    for (int mode = 0; mode < 5; ++mode) {
      Problem p = make_problem(1, 2, 1, 9, 11, 3, 2, 100 + mode, 1.5);
      p.kernel = kern ? Kernel::softmax : Kernel::continuum;
      set_vis(p, mode);
      if (mode == 2) p.vis.window_left = 2;
      const std::vector<double> dout = random_dout(p, 7);
      Run<double> r;
      auto ba = backward_args<double>(p, r, dout);
      attention_backward(cpu, ba);
      const double h = 1e-6;
      double worst = 0;
      auto fd = [&](std::vector<double> Problem::*field, const std::vector<double>& got) {
        for (size_t i = 0; i < (p.*field).size(); ++i) {
          Problem pp = p, pm = p;
          (pp.*field)[i] += h; (pm.*field)[i] -= h;
          const double num = naive_difference(pp, pm, h, dout);
          worst = std::max(worst, std::abs(num - got[i]) / (1 + std::abs(num)));
        }
      };
      fd(&Problem::q, r.dq); fd(&Problem::k, r.dk); fd(&Problem::v, r.dv); fd(&Problem::tau, r.dtau);
      INFO("kernel " << kern << " mode " << mode << " worst " << worst);
      CHECK(worst < 1e-7);
    }
}

TEST_CASE("empty rows: zeros, -inf, no NaN, zero gradients", "[operator][smoke]") {
  Problem p = make_problem(1, 1, 1, 5, 3, 4, 2, 9);
  p.vis.causal = true;  // Lq > Lk: rows 0, 1 empty
  std::vector<double> dout(p.Lq * p.Dv, 1.0);
  Run<float> r;
  auto ba = backward_args<float>(p, r, dout);
  for (int i = 0; i < 2; ++i) {
    CHECK(r.lse[i] == -std::numeric_limits<float>::infinity());
    CHECK(r.out[i * 2] == 0.0f);
    CHECK(r.out[i * 2 + 1] == 0.0f);
  }
  attention_backward(cpu, ba);
  for (int i = 0; i < 2 * 4; ++i) CHECK(r.dq[i] == 0.0f);
  CHECK(r.dtau[0] == 0.0f);
  CHECK(r.dtau[1] == 0.0f);
  for (float x : r.dq) CHECK(std::isfinite(x));
  for (float x : r.dk) CHECK(std::isfinite(x));
  // Lk = 0 and Lq = 0.
  Problem e = make_problem(2, 2, 1, 2, 0, 4, 3, 1);
  Run<double> re;
  auto fe = forward_args<double>(e, re);
  attention_forward(cpu, fe);
  for (double x : re.out) CHECK(x == 0.0);
  for (double x : re.lse) CHECK(x == -INFINITY);
  Problem z = make_problem(2, 2, 1, 0, 5, 4, 3, 1);
  Run<double> rz;
  auto fz = forward_args<double>(z, rz);
  attention_forward(cpu, fz);
}

TEST_CASE("thread counts 1, 2, 3, 16 are bitwise identical", "[operator][smoke]") {
  // B·Hk = 6 work items: 1–3 threads take the fused backward (one item per
  // (batch, KV head)), 16 threads the split one (query blocks own dQ, key
  // tiles own dK/dV); both must give the same bits.
  Problem p = make_problem(2, 3, 3, 257, 257, 16, 16, 21);
  p.vis.causal = true;
  const std::vector<double> dout = random_dout(p, 8);
  std::vector<Run<float>> runs(4);
  const int threads[4] = {1, 2, 3, 16};
  for (int t = 0; t < 4; ++t) {
    auto ba = backward_args<float>(p, runs[t], dout);
    ba.num_threads = threads[t];
    attention_backward(cpu, ba);
  }
  for (int t = 1; t < 4; ++t) {
    INFO("threads " << threads[t]);
    CHECK(std::memcmp(runs[t].out.data(), runs[0].out.data(), runs[0].out.size() * 4) == 0);
    CHECK(std::memcmp(runs[t].dq.data(), runs[0].dq.data(), runs[0].dq.size() * 4) == 0);
    CHECK(std::memcmp(runs[t].dk.data(), runs[0].dk.data(), runs[0].dk.size() * 4) == 0);
    CHECK(std::memcmp(runs[t].dv.data(), runs[0].dv.data(), runs[0].dv.size() * 4) == 0);
    CHECK(std::memcmp(runs[t].dtau.data(), runs[0].dtau.data(), runs[0].dtau.size() * 4) == 0);
  }
}

TEST_CASE("KV-cache decode equals the full causal forward bit for bit", "[operator][smoke]") {
  for (index_t W : {0, 4}) {
    Problem p = make_problem(1, 2, 1, 100, 100, 8, 8, 31);
    p.vis.causal = true;
    p.vis.window_left = W - 1;  // W keys; 0: no window
    Run<float> full;
    auto fa = forward_args<float>(p, full, TemperatureShape::scalar);
    attention_forward(cpu, fa);
    for (index_t t = 0; t < p.Lq; ++t) {
      // decode step t: query t, cache keys [0, t]
      ForwardArgs<float> d = fa;
      std::vector<float> o(p.Hq * p.Dv), l(p.Hq);
      d.query = TensorView<const float>{full.q.data() + t * p.D, 1, p.Hq, 1, p.D, 0, p.Lq * p.D, p.D, 1};
      d.key.seq = t + 1;
      d.value.seq = t + 1;
      d.out = TensorView<float>::bhsd(o.data(), 1, p.Hq, 1, p.Dv);
      d.lse = l.data();
      attention_forward(cpu, d);
      for (index_t h = 0; h < p.Hq; ++h) {
        for (index_t e = 0; e < p.Dv; ++e) CHECK(o[h * p.Dv + e] == full.out[(h * p.Lq + t) * p.Dv + e]);
        CHECK(l[h] == full.lse[h * p.Lq + t]);
      }
    }
  }
}

TEST_CASE("extreme magnitudes: W12 tiny temperature, W13 huge q/k", "[operator][smoke]") {
  // W13: float, D = 4, q = k0 = [1e19]x4, k1 = [0.9e19]x4, k2 = -k0.
  for (float tau : {1.0f, 2.0f}) {
    std::vector<float> q(4, 1e19f), k(12), v = {1, 2, 3, 4, 5, 6}, o(2), lse(1);
    for (int e = 0; e < 4; ++e) { k[e] = 1e19f; k[4 + e] = 0.9e19f; k[8 + e] = -1e19f; }
    ForwardArgs<float> a;
    a.query = TensorView<float>::bhsd(q.data(), 1, 1, 1, 4);
    a.key = TensorView<float>::bhsd(k.data(), 1, 1, 3, 4);
    a.value = TensorView<float>::bhsd(v.data(), 1, 1, 3, 2);
    a.out = TensorView<float>::bhsd(o.data(), 1, 1, 1, 2);
    a.lse = lse.data();
    a.temperature.value = tau;
    attention_forward(cpu, a);
    CHECK(std::isfinite(o[0]));
    CHECK(std::isfinite(lse[0]));  // log Z ≈ 2e38/τ fits in float
    INFO("o = " << o[0] << ", " << o[1] << " lse " << lse[0]);
    CHECK(std::abs(o[0] - 1.0f) < 1e-6f);
    CHECK(std::abs(o[1] - 2.0f) < 1e-6f);
  }
  // W12: Lk = 5, scores O(10), tiny τ, float and double; backward finite.
  for (double tau : {1e-3, 1e-6, 1e-30, 1e-38, 1.4e-45}) {
    Problem p = make_problem(1, 1, 1, 3, 5, 2, 2, 77, 3.0);
    for (auto& t : p.tau) t = tau;
    std::vector<double> dout(p.Lq * p.Dv, 1.0);
    Run<float> r;
    auto ba = backward_args<float>(p, r, dout);
    attention_backward(cpu, ba);
    for (float x : r.out) CHECK(std::isfinite(x));
    for (float x : r.dq) CHECK(std::isfinite(x));
    for (float x : r.dk) CHECK(std::isfinite(x));
    for (float x : r.dv) CHECK(std::isfinite(x));
    for (float x : r.dtau) CHECK(!std::isnan(x));
    Run<double> rd;
    auto bd = backward_args<double>(p, rd, dout);
    attention_backward(cpu, bd);
    for (double x : rd.out) CHECK(std::isfinite(x));
    for (double x : rd.dq) CHECK(std::isfinite(x));
    for (double x : rd.dtau) CHECK(std::isfinite(x));
    // τ → 0: the output tends to the value of the argmax key (MATH.md §7.6).
    if (tau <= 1e-30) {
      for (index_t i = 0; i < p.Lq; ++i) {
        index_t best = 0;
        double bs = -INFINITY;
        for (index_t j = 0; j < p.Lk; ++j) {
          const double d = double(float(p.q[i * 2])) * double(float(p.k[j * 2])) +
                           double(float(p.q[i * 2 + 1])) * double(float(p.k[j * 2 + 1]));
          if (d > bs) { bs = d; best = j; }
        }
        for (index_t e = 0; e < 2; ++e) CHECK(r.out[i * 2 + e] == float(p.v[best * 2 + e]));
      }
    }
  }
  // Double storage with score gaps c·Δr that overflow double:
  // every weight underflows; the output is the argmax value, gradients finite.
  // (τ = 5e-309, subnormal: c = scale/τ ≈ 1.4e308 is still finite.)
  {
    Problem p = make_problem(1, 1, 1, 3, 5, 2, 2, 77, 3.0);
    for (auto& t : p.tau) t = 5e-309;  // c = 1.4e308
    std::vector<double> dout(p.Lq * p.Dv, 1.0);
    Run<double> rd;
    auto bd = backward_args<double>(p, rd, dout);
    attention_backward(cpu, bd);
    for (double x : rd.out) CHECK(std::isfinite(x));
    for (double x : rd.lse) CHECK(!std::isnan(x));
    for (double x : rd.dq) CHECK(std::isfinite(x));
    for (double x : rd.dk) CHECK(std::isfinite(x));
    for (double x : rd.dv) CHECK(std::isfinite(x));
    for (double x : rd.dtau) CHECK(std::isfinite(x));
    // P rows sum to 1, so Σ_j dV_j = Σ_i dO_i (= Lq here), also in the limit.
    for (index_t e = 0; e < 2; ++e) {
      double s = 0;
      for (index_t j = 0; j < p.Lk; ++j) s += rd.dv[j * 2 + e];
      CHECK(std::abs(s - 3.0) < 1e-12);
    }
  }
}

TEST_CASE("bad input throws std::invalid_argument naming the argument", "[operator][smoke]") {
  Problem p = make_problem(1, 4, 2, 5, 6, 3, 2, 1);
  Run<float> r;
  auto good = forward_args<float>(p, r);
  auto expect_throw = [](const ForwardArgs<float>& a, const char* needle) {
    try {
      attention_forward(cpu, a);
      FAIL("no exception for " << needle);
    } catch (const std::invalid_argument& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  { auto a = good; a.key.heads = 3; expect_throw(a, "key"); }
  { auto a = good; a.value.seq = 5; expect_throw(a, "value"); }
  { auto a = good; a.out.dim = 3; expect_throw(a, "out"); }
  { auto a = good; a.query.stride_dim = 2; expect_throw(a, "query"); }
  { auto a = good; a.temperature.shape = TemperatureShape::scalar; a.temperature.value = 0; expect_throw(a, "temperature"); }
  { auto a = good; r.tau[7] = -1; expect_throw(a, "temperature[0, 1, 2]"); r.tau[7] = 1; }
  { auto a = good; r.tau[3] = NAN; expect_throw(a, "temperature[0, 0, 3]"); r.tau[3] = 1; }
  { auto a = good; a.scale = -1.0; expect_throw(a, "scale"); }
  { auto a = good; a.scale = INFINITY; expect_throw(a, "scale"); }
  std::vector<index_t> lo(5, 0), hi(5, 7);
  { auto a = good; a.visibility.range_lo = lo.data(); a.visibility.range_hi = hi.data(); expect_throw(a, "range"); }
  { auto a = good; a.query.data = nullptr; expect_throw(a, "query"); }
  { auto a = good; a.out.data = r.q.data(); expect_throw(a, "out"); }
  { auto a = good; a.out.stride_seq = 1; expect_throw(a, "out"); }
  { auto a = good; a.lse = r.out.data(); expect_throw(a, "lse"); }
  CHECK_NOTHROW(attention_forward(cpu, good));
}

TEST_CASE("backward across key tiles and query blocks: sampled finite differences", "[operator][smoke]") {
  // Lk = 150 spans two key tiles of the backward (126 keys for continuum, 128
  // for softmax); GQA 4:2; per-head τ (dτ summed over batch and queries).
  // Coordinates sampled at the ends and on both sides of 63/64 and 126–129.
  for (int mode : {0, 1, 2, 3}) {
    Problem p = make_problem(2, 4, 2, 40, 150, 3, 2, 300 + mode, 1.5);
    set_vis(p, mode);
    for (index_t b = 0; b < p.B; ++b)
      for (index_t h = 0; h < p.Hq; ++h)
        for (index_t i = 0; i < p.Lq; ++i) p.tau[(b * p.Hq + h) * p.Lq + i] = 0.4 + 0.2 * h;
    const std::vector<double> dout = random_dout(p, static_cast<unsigned>(17 + mode));
    Run<double> r;
    auto ba = backward_args<double>(p, r, dout);
    std::vector<double> head_tau = {0.4, 0.6, 0.8, 1.0};
    ba.temperature.shape = TemperatureShape::per_head;
    ba.temperature.data = head_tau.data();
    std::vector<double> dtau_h(4);
    ba.grad_temperature = dtau_h.data();
    attention_backward(cpu, ba);
    const double h = 1e-6;
    double worst = 0;
    auto check_coord = [&](std::vector<double> Problem::*field, size_t idx, double got) {
      Problem pp = p, pm = p;
      (pp.*field)[idx] += h; (pm.*field)[idx] -= h;
      const double num = naive_difference(pp, pm, h, dout);
      worst = std::max(worst, std::abs(num - got) / (1 + std::abs(num)));
    };
    for (index_t j : {0, 1, 62, 63, 64, 65, 126, 127, 128, 129, 149})
      for (index_t b = 0; b < 2; ++b)
        for (index_t hk = 0; hk < 2; ++hk) {
          const size_t kidx = ((b * 2 + hk) * p.Lk + j) * p.D + (j % 3);
          const size_t vidx = ((b * 2 + hk) * p.Lk + j) * p.Dv + (j % 2);
          check_coord(&Problem::k, kidx, r.dk[kidx]);
          check_coord(&Problem::v, vidx, r.dv[vidx]);
        }
    for (index_t i : {0, 15, 16, 17, 31, 32, 39})
      for (index_t hq = 0; hq < 4; ++hq) {
        const size_t qidx = ((1 * 4 + hq) * p.Lq + i) * p.D + (i % 3);
        check_coord(&Problem::q, qidx, r.dq[qidx]);
      }
    // per-head dτ: perturb every τ of head h together
    for (index_t hq = 0; hq < 4; ++hq) {
      Problem pp = p, pm = p;
      for (index_t b = 0; b < p.B; ++b)
        for (index_t i = 0; i < p.Lq; ++i) {
          pp.tau[(b * p.Hq + hq) * p.Lq + i] += h;
          pm.tau[(b * p.Hq + hq) * p.Lq + i] -= h;
        }
      const double num = naive_difference(pp, pm, h, dout);
      worst = std::max(worst, std::abs(num - dtau_h[hq]) / (1 + std::abs(num)));
    }
    INFO("mode " << mode << " worst " << worst);
    CHECK(worst < 1e-7);
  }
}

TEST_CASE("padded rows (stride D+1, NaN padding) are never read (W06)", "[operator][smoke]") {
  for (index_t D : {1, 3, 9, 17, 65}) {
    Problem p = make_problem(1, 1, 1, 7, 7, D, D, 40 + D);
    p.vis.causal = D % 2 == 1;
    Run<double> r;
    auto a = forward_args<double>(p, r, TemperatureShape::scalar);
    attention_forward(cpu, a);
    std::vector<double> qp(7 * (D + 1), NAN), kp(7 * (D + 1), NAN), vp(7 * (D + 1), NAN);
    for (index_t t = 0; t < 7; ++t)
      for (index_t e = 0; e < D; ++e) {
        qp[t * (D + 1) + e] = p.q[t * D + e];
        kp[t * (D + 1) + e] = p.k[t * D + e];
        vp[t * (D + 1) + e] = p.v[t * D + e];
      }
    auto padded = [&](std::vector<double>& x) {
      return TensorView<const double>{x.data(), 1, 1, 7, D, 0, 0, D + 1, 1};
    };
    ForwardArgs<double> b = a;
    std::vector<double> o(7 * D), l(7);
    b.query = padded(qp); b.key = padded(kp); b.value = padded(vp);
    b.out = TensorView<double>::bhsd(o.data(), 1, 1, 7, D);
    b.lse = l.data();
    attention_forward(cpu, b);
    for (index_t e = 0; e < 7 * D; ++e) CHECK(o[e] == r.out[e]);
  }
}

TEST_CASE("non-finite inputs reach only the rows that see them", "[operator][smoke]") {
  Problem p = make_problem(1, 1, 1, 8, 8, 4, 2, 5);
  p.vis.causal = true;
  p.k[5 * 4 + 1] = NAN;  // key 5: rows 5..7 see it
  p.v[6 * 2 + 0] = INFINITY;  // value 6: rows 6..7
  Run<float> r;
  auto a = forward_args<float>(p, r);
  attention_forward(cpu, a);
  for (index_t i = 0; i < 5; ++i) {
    CHECK(std::isfinite(r.out[i * 2]));
    CHECK(std::isfinite(r.lse[i]));
  }
  for (index_t i = 5; i < 8; ++i) CHECK(std::isnan(r.out[i * 2 + 1]));
  // Backward: dQ of rows 0..4 (which see neither key 5 nor value 6) stays finite.
  std::vector<double> dout(p.Lq * p.Dv, 1.0);
  Run<float> rb;
  auto ba = backward_args<float>(p, rb, dout);
  attention_backward(cpu, ba);
  for (index_t i = 0; i < 5 * 4; ++i) CHECK(std::isfinite(rb.dq[i]));
  for (index_t i = 0; i < 5; ++i) CHECK(std::isfinite(rb.dtau[i]));
  CHECK(std::isnan(rb.dq[5 * 4]));
}

TEST_CASE("called inside the caller's OpenMP region: serial, same result", "[operator][smoke]") {
  Problem p = make_problem(2, 2, 2, 200, 200, 8, 8, 6);
  p.vis.causal = true;
  Run<float> r0;
  auto a0 = forward_args<float>(p, r0);
  attention_forward(cpu, a0);
  std::vector<Run<float>> rs(4);
  std::vector<ForwardArgs<float>> as;
  for (auto& r : rs) as.push_back(forward_args<float>(p, r));
#if defined(_OPENMP)
#  pragma omp parallel for num_threads(2)
#endif
  for (int t = 0; t < 4; ++t) attention_forward(cpu, as[t]);
  for (auto& r : rs) CHECK(std::memcmp(r.out.data(), r0.out.data(), r0.out.size() * 4) == 0);
}

TEST_CASE("tiny temperature: gradients keep their relative accuracy (W12, analytic)", "[operator][smoke]") {
  // q = (1, 0), raw scores r = (3, -2, 10, 6, -8), scale 1, v_j = (j+1, -j),
  // dO = (1, 1/2). For gaps δ = Δr/τ ≫ 1 the weights are rational up to
  // e^{-δ} terms: α_2 = 1/δ_l + 1/δ_r = Z, α_1 = 1/δ_l², α_3 = 1/δ_r² (δ_l = 12/τ,
  // δ_r = 4/τ), so L = dO·o = dO·v_2 + τ (−1/2·1/48 + 1/2·3/16) = dO·v_2 + τ/12:
  // dL/dτ = 1/12 and dL/dq_0 = −τ/12 exactly (up to e^{-δ}), at every τ ≤ 1e-3.
  const double s1[5] = {3, -2, 10, 6, -8};
  auto run = [&](auto zero, double tau, double& dtau, double& dq0) {
    using T = decltype(zero);
    T q[2] = {1, 0}, k[10], v[10], o[2], lse[1], dO[2] = {1, 0.5}, dq[2], dk[10], dv[10], dt[1];
    for (int j = 0; j < 5; ++j) { k[2 * j] = T(s1[j]); k[2 * j + 1] = 0; v[2 * j] = T(j + 1); v[2 * j + 1] = T(-j); }
    ForwardArgs<T> a;
    a.query = TensorView<T>::bhsd(q, 1, 1, 1, 2); a.key = TensorView<T>::bhsd(k, 1, 1, 5, 2);
    a.value = TensorView<T>::bhsd(v, 1, 1, 5, 2); a.out = TensorView<T>::bhsd(o, 1, 1, 1, 2); a.lse = lse;
    a.temperature.value = T(tau); a.scale = 1.0;
    attention_forward(cpu, a);
    BackwardArgs<T> b;
    b.query = a.query; b.key = a.key; b.value = a.value; b.out = a.out;
    b.grad_out = TensorView<T>::bhsd(dO, 1, 1, 1, 2);
    b.grad_query = TensorView<T>::bhsd(dq, 1, 1, 1, 2); b.grad_key = TensorView<T>::bhsd(dk, 1, 1, 5, 2);
    b.grad_value = TensorView<T>::bhsd(dv, 1, 1, 5, 2); b.grad_temperature = dt;
    b.temperature = a.temperature; b.scale = 1.0;
    attention_backward(cpu, b);
    dtau = dt[0];
    dq0 = dq[0] / double(T(tau));
  };
  for (double tau : {1e-3, 1e-6, 1e-20, 1e-30, 1e-38, 1e-100}) {
    double dtau, dq0;
    run(0.0, tau, dtau, dq0);
    INFO("double tau " << tau << " dtau " << dtau << " dq0/tau " << dq0);
    CHECK(std::abs(dtau - 1.0 / 12) <= 1e-14);
    CHECK(std::abs(dq0 + 1.0 / 12) <= 1e-14);
    if (tau < 1e-40) continue;  // float: τ = 1e-38 is subnormal, still valid
    run(0.0f, tau, dtau, dq0);
    INFO("float tau " << tau << " dtau " << dtau << " dq0/tau " << dq0);
    CHECK(std::abs(dtau - 1.0 / 12) <= 1e-7);
    CHECK(std::abs(dq0 + 1.0 / 12) <= 1e-7);
  }
}
