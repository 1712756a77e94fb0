// Accuracy of backends/cpu/vector_moments.hpp (the branch-free moments and exp
// used by the tiled CPU kernels) against the scalar primitives of math/ (MATH.md
// §5; themselves checked against MPFR in test_moments.cpp) and against expl.
//
// Each segment quantity is e^{max} times a moment of a = -b; the test feeds
// knot exponentials 1 and e^{-b} (rounded to T) and compares
//   near = ν(-b), far = μ1(-b), dnear = ν2(-b), dfar = μ2(-b), coupling = κ(-b)
// with the scalar primitives, in ulps of the primitive's value, on both sides
// of the b = 2 switch (±3 ulps), at the limits (b = 0, tiny, huge) and on a
// log-spaced sweep. The forward weights take the signed d = y - x, so both
// orders are fed: the left knot the larger (d = -b: wx near, wy far) and the
// right one (d = b: wy near, wx far). Scalar and vector forms are checked
// separately.
//
// Bounds (measured maxima, printed, plus a margin): the polynomial branch is
// the Chebyshev interpolant (≤ 0.1 ulp from the function) plus Horner and the
// e^{max} product (~2 ulp); the closed form rounds b, r = 1/b (rcp14 + Newton
// on AVX-512, ≤ 1 ulp) and e^{-b} (1 ulp) and forms ≤ 6 operations, whose
// worst case is μ2 = (2μ1 - e^{-b})/b, which cancels ×1.8 at b = 2. Float:
// 6 ulp (8 for μ2); double: 6 ulp (8 for μ2).
#include <catch2/catch.hpp>

#include <continuum/backends/cpu/vector_moments.hpp>
#include <continuum/math/moments.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

using namespace continuum;
using namespace continuum::cpu_detail;

namespace {

template <class T>
double ulps(T got, T want) {
  if (got == want) return 0;
  if (!std::isfinite(got) || !std::isfinite(want)) return std::numeric_limits<double>::infinity();
  const T up = std::nextafter(std::fabs(want), std::numeric_limits<T>::infinity());
  const double ulp = double(up) - double(std::fabs(want));
  return std::fabs(double(got) - double(want)) / ulp;
}

template <class T>
std::vector<T> sample_b() {
  std::vector<T> b = {T(0), T(1e-30), T(1e-12), T(1e-7), T(1e-4), T(0.01), T(0.5), T(1), T(1.5), T(2),
                      T(3), T(5), T(10), T(30), T(100), T(1e4), T(1e8), T(1e20)};
  // ±3 ulps around the switch at b = 2.
  T x = T(2);
  for (int k = 0; k < 3; ++k) b.push_back(x = std::nextafter(x, T(0)));
  x = T(2);
  for (int k = 0; k < 3; ++k) b.push_back(x = std::nextafter(x, T(10)));
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(-8, 3);
  for (int k = 0; k < 2000; ++k) b.push_back(T(std::pow(10.0, u(rng))));
  return b;
}

struct MaxUlp {
  double near = 0, far = 0, dnear = 0, dfar = 0, coupling = 0;
  double worst_b[5] = {0, 0, 0, 0, 0};
  void take(int i, double& m, double u, double b) {
    if (u > m) {
      m = u;
      worst_b[i] = b;
    }
  }
};

template <class T>
void compare_one(T b, T near, T far, T dnear, T dfar, T cpl, MaxUlp& m) {
  const T a = -b;
  m.take(0, m.near, ulps(near, nu(a)), double(b));
  m.take(1, m.far, ulps(far, mu1(a)), double(b));
  m.take(2, m.dnear, ulps(dnear, nu2(a)), double(b));
  m.take(3, m.dfar, ulps(dfar, mu2(a)), double(b));
  m.take(4, m.coupling, ulps(cpl, kappa(a)), double(b));
}

template <class T>
T exp_neg(T b) {
  return T(std::exp(-static_cast<long double>(b)));
}

template <class T>
void report(const char* what, const MaxUlp& m) {
  std::printf("[vector_moments] %-6s %-6s max ulp: nu %.2f (b=%g)  mu1 %.2f (b=%g)  nu2 %.2f (b=%g)  mu2 %.2f (b=%g)"
              "  kappa %.2f (b=%g)\n",
              sizeof(T) == 4 ? "float" : "double", what, m.near, m.worst_b[0], m.far, m.worst_b[1], m.dnear,
              m.worst_b[2], m.dfar, m.worst_b[3], m.coupling, m.worst_b[4]);
}

template <class T>
void check_bounds(const MaxUlp& m) {
  CHECK(m.near <= 6);
  CHECK(m.far <= 6);
  CHECK(m.dnear <= 6);
  CHECK(m.dfar <= 8);
  CHECK(m.coupling <= 6);
}

}  // namespace

TEMPLATE_TEST_CASE("scalar segment terms match the moment primitives", "[vector_moments]", float, double) {
  using T = TestType;
  MaxUlp mf, mb;
  for (T b : sample_b<T>()) {
    const T ey = exp_neg(b);
    T wx, wy, vx, vy;
    segment_weights(-b, T(1), ey, wx, wy);  // left knot the larger
    segment_weights(b, ey, T(1), vx, vy);   // right knot the larger
    T lx, ly, ldx, ldy, lc, rx, ry, rdx, rdy, rc;
    segment_terms(-b, T(1), ey, lx, ly, ldx, ldy, lc);
    segment_terms(b, ey, T(1), rx, ry, rdx, rdy, rc);
    compare_one(b, wx, wy, ldx, ldy, lc, mf);
    compare_one(b, vy, vx, rdy, rdx, rc, mf);
    compare_one(b, lx, ly, ldx, ldy, lc, mb);
    compare_one(b, ry, rx, rdy, rdx, rc, mb);
  }
  report<T>("fwd", mf);
  report<T>("bwd", mb);
  check_bounds<T>(mf);
  check_bounds<T>(mb);
}

#if defined(CONTINUUM_CPU_SIMD)
TEMPLATE_TEST_CASE("vector segment terms match the moment primitives", "[vector_moments]", float, double) {
  using T = TestType;
  using VO = VectorOps<T>;
  using V = typename Simd<T>::v;
  constexpr int W = Simd<T>::W;
  const std::vector<T> bs = sample_b<T>();
  MaxUlp mf, mb;
  // Lanes mixed (both regimes in one vector) and uniform (one regime only):
  // sorted input makes most vectors uniform, the shuffled one mixes them.
  std::vector<T> sorted = bs;
  std::sort(sorted.begin(), sorted.end());
  const std::vector<T>* inputs[] = {&bs, &sorted};
  for (const std::vector<T>* input : inputs)
    for (std::size_t i = 0; i + W <= input->size(); i += W) {
      V b, ex, ey;
      for (int l = 0; l < W; ++l) {
        b[l] = (*input)[i + std::size_t(l)];
        ex[l] = T(1);
        ey[l] = exp_neg(b[l]);
      }
      V wx, wy, vx, vy;
      VO::segment_weights(-b, ex, ey, wx, wy);  // left knot the larger
      VO::segment_weights(b, ey, ex, vx, vy);   // right knot the larger
      V lx, ly, ldx, ldy, lc, rx, ry, rdx, rdy, rc;
      VO::segment_terms(-b, ex, ey, lx, ly, ldx, ldy, lc);
      VO::segment_terms(b, ey, ex, rx, ry, rdx, rdy, rc);
      for (int l = 0; l < W; ++l) {
        compare_one(b[l], wx[l], wy[l], ldx[l], ldy[l], lc[l], mf);
        compare_one(b[l], vy[l], vx[l], rdy[l], rdx[l], rc[l], mf);
        compare_one(b[l], lx[l], ly[l], ldx[l], ldy[l], lc[l], mb);
        compare_one(b[l], ry[l], rx[l], rdy[l], rdx[l], rc[l], mb);
      }
    }
  report<T>("vfwd", mf);
  report<T>("vbwd", mb);
  check_bounds<T>(mf);
  check_bounds<T>(mb);
}

TEMPLATE_TEST_CASE("vector exp matches expl and flushes below the normal range", "[vector_moments]", float,
                   double) {
  using T = TestType;
  using V = typename Simd<T>::v;
  constexpr int W = Simd<T>::W;
  const T lo = sizeof(T) == 4 ? T(-87.3) : T(-708.3);
  std::vector<T> xs = {T(0), T(-1e-30), T(-0.5), T(-1), T(-10), lo, T(1), T(10), T(60)};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(double(lo), 0.0);
  for (int k = 0; k < 4000; ++k) xs.push_back(T(u(rng)));
  double worst = 0, worst_x = 0;
  for (std::size_t i = 0; i + W <= xs.size(); i += W) {
    V x;
    for (int l = 0; l < W; ++l) x[l] = xs[i + std::size_t(l)];
    const V y = VectorOps<T>::exp_clamped(x);
    for (int l = 0; l < W; ++l) {
      const T want = T(std::exp(static_cast<long double>(x[l])));
      const double e = ulps(y[l], want);
      CHECK(y[l] == exp_clamped(x[l]));  // vector and scalar forms agree bit for bit
      if (e > worst) {
        worst = e;
        worst_x = double(x[l]);
      }
    }
  }
  std::printf("[vector_moments] %-6s exp max ulp %.2f (x=%g)\n", sizeof(T) == 4 ? "float" : "double", worst, worst_x);
  CHECK(worst <= 2);
  // Below the normal range: exactly 0 (no subnormal results).
  V x;
  for (int l = 0; l < W; ++l) x[l] = sizeof(T) == 4 ? T(-87.34 - l) : T(-708.4 - l);
  const V y = VectorOps<T>::exp_clamped(x);
  for (int l = 0; l < W; ++l) CHECK(y[l] == T(0));
  CHECK(exp_clamped(-std::numeric_limits<T>::infinity()) == T(0));
}

// exp_bf16 (softmax's weights on a bfloat16 unit, rounded to bfloat16 for P·V; MATH.md
// §10): 2^t for t = x ⊗ log2(e), n = ⌊t⌋ and f = t − n (one rounding where t < 0,
// ≤ 2^-25), 2^f of degree 4 (exp2_fraction) times 2^n exactly. Budget 2^-14
// relative (the bfloat16 stencil's ε). The fraction's polynomial: 2.9e-6 as
// fitted, held to 3.0e-6 with Horner's roundings; f's rounding adds ≤ 2^-25 ln 2
// (2.1e-8); t's rounding (2^-24 |t|) and log2(e)'s in float (2^-26) at most
// 1.25 · 2^-24 |x|: each x is held to 3.05e-6 + 1.25 · 2^-24 |x| (≤ 9.56e-6 down to
// x = −87.34). At 0 it is exactly 1 (the reference key's weight,
// held apart as 1: tiled.hpp), below the normal range exactly 0, and from t ≥ 128 +∞.
TEST_CASE("vector exp_bf16 within its bound, 1 at 0, 0 below the normal range", "[vector_moments]") {
  using V = Simd<float>::v;
  constexpr int W = Simd<float>::W;
  double worst_f = 0;
  for (int k = 0; k < (1 << 16); k += W) {
    V f;
    for (int l = 0; l < W; ++l) f[l] = float(k + l) / float(1 << 16);  // [0, 1) on a 2^-16 grid
    const V p = VectorOps<float>::exp2_fraction(f);
    for (int l = 0; l < W; ++l) worst_f = std::max(worst_f, std::abs(double(p[l]) / std::exp2(double(f[l])) - 1));
  }
  std::printf("[vector_moments] float  exp2_fraction max relative error %.3g\n", worst_f);
  CHECK(worst_f <= 3.0e-6);
  std::vector<float> xs = {0.0f, -1e-30f, -0.5f, -1.0f, -10.0f, -87.3f, 1.0f, 10.0f, 60.0f, 88.7f, -0.3465736f,
                           0.3465736f, -0.6931472f};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-87.3, 0.0);
  for (int k = 0; k < 20000; ++k) xs.push_back(float(u(rng)));
  std::uniform_real_distribution<double> near(-3.0, 0.0);  // the weights that matter most
  for (int k = 0; k < 20000; ++k) xs.push_back(float(near(rng)));
  while (xs.size() % W) xs.push_back(0.0f);
  double worst = 0, worst_x = 0;
  int over = 0;
  for (std::size_t i = 0; i < xs.size(); i += W) {
    V x;
    for (int l = 0; l < W; ++l) x[l] = xs[i + std::size_t(l)];
    const V y = VectorOps<float>::exp_bf16(x);
    for (int l = 0; l < W; ++l) {
      const double want = std::exp(double(x[l]));
      const double e = std::abs(double(y[l]) - want) / want;
      over += e > 3.05e-6 + 1.25 * std::ldexp(std::abs(double(x[l])), -24);
      if (e > worst) {
        worst = e;
        worst_x = double(x[l]);
      }
    }
  }
  std::printf("[vector_moments] float  exp_bf16 max relative error %.3g (x=%g)\n", worst, worst_x);
  CHECK(over == 0);
  CHECK(worst <= std::ldexp(1.0, -14));
  V x{};
  CHECK(VectorOps<float>::exp_bf16(x)[0] == 1.0f);
  for (int l = 0; l < W; ++l) x[l] = float(-87.34 - l);
  V y = VectorOps<float>::exp_bf16(x);
  for (int l = 0; l < W; ++l) CHECK(y[l] == 0.0f);
  for (int l = 0; l < W; ++l) x[l] = float(88.73 + l);  // t ≥ 128
  y = VectorOps<float>::exp_bf16(x);
  for (int l = 0; l < W; ++l) CHECK(y[l] == std::numeric_limits<float>::infinity());
}
#endif

// StencilAccuracy::bf16 (bfloat16 storage computed in float; vector_moments.hpp,
// MATH.md §10 "The bfloat16 stencil"): every term within 2^-14 of the function,
// relative (absolute in units of FLT_MIN below float's normal range), against the
// double primitives (≤ 1.2 ulp of double, test_moments.cpp).
// The budget: interpolant ≤ 1.4e-6 (forward h) and ≤ 1.0e-5 (backward) on its
// interval, Horner and the exponential's product a few float ulps (~2e-7), the
// closed forms' cancellation at the edges (|d| = 1/4 forward, b = 1/2 backward)
// ≤ 2.7e-5 (measured in an emulation; printed here). Inputs: the sweep above, ±3 ulps around both edges, and a dense sweep of
// [0, 4], where the regimes meet.
namespace {

std::vector<float> sample_b_bf16() {
  std::vector<float> b = sample_b<float>();
  for (float edge : {0.25f, 0.5f}) {
    float lo = edge, hi = edge;
    b.push_back(edge);
    for (int k = 0; k < 3; ++k) {
      b.push_back(lo = std::nextafter(lo, 0.0f));
      b.push_back(hi = std::nextafter(hi, 10.0f));
    }
  }
  for (int k = 0; k <= 4000; ++k) b.push_back(float(k) * 0.001f);
  return b;
}

struct MaxRel {
  double v[5] = {0, 0, 0, 0, 0};
  double at[5] = {0, 0, 0, 0, 0};
  void take(float b, float near, float far, float dnear, float dfar, float cpl) {
    const double a = -double(b);
    const double want[5] = {nu(a), mu1(a), nu2(a), mu2(a), kappa(a)};
    const float got[5] = {near, far, dnear, dfar, cpl};
    for (int i = 0; i < 5; ++i) {
      // Relative; below float's normal range (μ2 ~ 2/b³ at b = 1e20) absolute in units of FLT_MIN.
      const double e = std::fabs(double(got[i]) - want[i]) / std::max(want[i], double(FLT_MIN));
      if (!(e <= v[i])) {  // NaN counts as worst
        v[i] = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
        at[i] = double(b);
      }
    }
  }
  void report(const char* what, bool forward_only) const {
    std::printf("[vector_moments] bf16 %-5s max rel: nu %.2e (b=%g)  mu1 %.2e (b=%g)", what, v[0], at[0], v[1], at[1]);
    if (!forward_only)
      std::printf("  nu2 %.2e (b=%g)  mu2 %.2e (b=%g)  kappa %.2e (b=%g)", v[2], at[2], v[3], at[3], v[4], at[4]);
    std::printf("\n");
  }
  void check(bool forward_only) const {
    constexpr double kBound = 1.0 / 16384;  // 2^-14
    CHECK(v[0] <= kBound);
    CHECK(v[1] <= kBound);
    if (!forward_only) {
      CHECK(v[2] <= kBound);
      CHECK(v[3] <= kBound);
      CHECK(v[4] <= kBound);
    }
  }
};

}  // namespace

TEST_CASE("bf16-accuracy segment terms stay within 2^-14 of the moments", "[vector_moments]") {
  constexpr StencilAccuracy kBf16 = StencilAccuracy::bf16;
  const std::vector<float> bs = sample_b_bf16();
  MaxRel sf, sb;
  for (float b : bs) {
    const float ey = exp_neg(b);
    float wx, wy, vx, vy;
    segment_weights<float, kBf16>(-b, 1.0f, ey, wx, wy);  // left knot the larger
    segment_weights<float, kBf16>(b, ey, 1.0f, vx, vy);   // right knot the larger
    float lx, ly, ldx, ldy, lc, rx, ry, rdx, rdy, rc;
    segment_terms<float, kBf16>(-b, 1.0f, ey, lx, ly, ldx, ldy, lc);
    segment_terms<float, kBf16>(b, ey, 1.0f, rx, ry, rdx, rdy, rc);
    sf.take(b, wx, wy, 0, 0, 0);
    sf.take(b, vy, vx, 0, 0, 0);
    sb.take(b, lx, ly, ldx, ldy, lc);
    sb.take(b, ry, rx, rdy, rdx, rc);
  }
  sf.report("fwd", true);
  sb.report("bwd", false);
  sf.check(true);
  sb.check(false);
#if defined(CONTINUUM_CPU_SIMD)
  using VO = VectorOps<float>;
  using V = Simd<float>::v;
  constexpr int W = Simd<float>::W;
  std::vector<float> sorted = bs;
  std::sort(sorted.begin(), sorted.end());
  MaxRel vf, vb;
  for (const std::vector<float>* input : {&bs, static_cast<const std::vector<float>*>(&sorted)})
    for (std::size_t i = 0; i + W <= input->size(); i += W) {
      V b, ex, ey;
      for (int l = 0; l < W; ++l) {
        b[l] = (*input)[i + std::size_t(l)];
        ex[l] = exp_neg(b[l]);  // the other order of the knots: Ex the smaller
        ey[l] = 1.0f;
      }
      V wx, wy, vx, vy;
      VO::segment_weights<kBf16>(b, ex, ey, wx, wy);   // right knot the larger (ey = 1)
      VO::segment_weights<kBf16>(-b, ey, ex, vx, vy);  // left knot the larger
      V lx, ly, ldx, ldy, lc, rx, ry, rdx, rdy, rc;
      VO::segment_terms<kBf16>(-b, ey, ex, lx, ly, ldx, ldy, lc);  // left knot the larger
      VO::segment_terms<kBf16>(b, ex, ey, rx, ry, rdx, rdy, rc);   // right knot the larger
      for (int l = 0; l < W; ++l) {
        vf.take(b[l], wy[l], wx[l], 0, 0, 0);
        vf.take(b[l], vx[l], vy[l], 0, 0, 0);
        vb.take(b[l], lx[l], ly[l], ldx[l], ldy[l], lc[l]);
        vb.take(b[l], ry[l], rx[l], rdy[l], rdx[l], rc[l]);
      }
    }
  vf.report("vfwd", true);
  vb.report("vbwd", false);
  vf.check(true);
  vb.check(false);
#endif
}

#if defined(CONTINUUM_CPU_SIMD)
// exp_stencil_bf16 (the knots' exponentials of the bfloat16 stencil; MATH.md §10,
// "The bfloat16 stencil"): exp_clamped's reduction r = x − n · ln 2 (two parts)
// and scaling, e^r of degree 5 (minimax 7.4e-8 on |r| ≤ ln2/2; with the
// roundings of r and of Horner's steps 1.90e-7 measured with FMA, 2.00e-7
// without): each x is held to 2.1e-7. Exactly 1 at 0, exactly 0 below the
// normal range, finite where x > 0 (lanes past a row).
TEST_CASE("vector exp_stencil_bf16 within its bound, 1 at 0, 0 below the normal range", "[vector_moments]") {
  using V = Simd<float>::v;
  constexpr int W = Simd<float>::W;
  std::vector<float> xs = {0.0f, -1e-30f, -0.5f, -1.0f, -10.0f, -87.3f, -0.3465736f, -0.3465737f, -0.6931472f};
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<double> u(-87.3, 0.0), near(-3.0, 0.0);
  for (int k = 0; k < 40000; ++k) xs.push_back(float(u(rng)));
  for (int k = 0; k < 40000; ++k) xs.push_back(float(near(rng)));
  for (int k = 0; k <= 1 << 14; ++k) xs.push_back(-0.6931472f * float(k) / float(1 << 14));  // r over [−ln2/2, ln2/2]
  while (xs.size() % W) xs.push_back(0.0f);
  double worst = 0, worst_x = 0;
  for (std::size_t i = 0; i < xs.size(); i += W) {
    V x;
    for (int l = 0; l < W; ++l) x[l] = xs[i + std::size_t(l)];
    const V y = VectorOps<float>::exp_stencil_bf16(x);
    for (int l = 0; l < W; ++l) {
      const double want = std::exp(double(x[l]));
      const double e = std::abs(double(y[l]) - want) / want;
      if (!(e <= worst)) {
        worst = e;
        worst_x = double(x[l]);
      }
    }
  }
  std::printf("[vector_moments] float  exp_stencil_bf16 max relative error %.3g (x=%g)\n", worst, worst_x);
  CHECK(worst <= 2.1e-7);
  V x{};
  CHECK(VectorOps<float>::exp_stencil_bf16(x)[0] == 1.0f);
  for (int l = 0; l < W; ++l) x[l] = float(-87.34 - l);
  V y = VectorOps<float>::exp_stencil_bf16(x);
  for (int l = 0; l < W; ++l) CHECK(y[l] == 0.0f);
  for (int l = 0; l < W; ++l) x[l] = float(1 + 500 * l);
  y = VectorOps<float>::exp_stencil_bf16(x);
  for (int l = 0; l < W; ++l) CHECK(std::isfinite(y[l]));
}

// The forward weights as row_continuum_weights forms them at bfloat16's
// accuracy: knots x and y (floats; d = y − x in float), their exponentials from
// exp_stencil_bf16. The closed forms amplify the knots' errors by up to
// (|d − 1| + e^{−d}) / (d − 1 + e^{−d}) ≤ 75 at the edge |d| = 1/4, so the
// exponential's 2.1e-7 becomes ≤ 1.6e-5; with the terms' own error (above)
// every weight stays within 2^-14 of the double moments, relative, for knots
// down to the normal range's end. Pairs (M − b, M), both orders, M from 0 to
// −80.
TEST_CASE("bf16-accuracy forward weights from exp_stencil_bf16's knots stay within 2^-14", "[vector_moments]") {
  using VO = VectorOps<float>;
  using V = Simd<float>::v;
  constexpr int W = Simd<float>::W;
  const std::vector<float> bs = sample_b_bf16();
  double worst = 0, worst_b = 0, worst_m = 0;
  for (float M : {0.0f, -0.5f, -3.0f, -10.0f, -40.0f, -80.0f}) {
    std::vector<float> lo;
    for (float b : bs)
      if (M - b > -87.0f) lo.push_back(M - b);
    while (lo.size() % W) lo.push_back(M);
    for (std::size_t i = 0; i < lo.size(); i += W) {
      V x, y = VO::splat(M);
      for (int l = 0; l < W; ++l) x[l] = lo[i + std::size_t(l)];
      const V ex = VO::exp_stencil_bf16(x), ey = VO::exp_stencil_bf16(y);
      V wx, wy, vx, vy;
      VO::segment_weights<StencilAccuracy::bf16>(y - x, ex, ey, wx, wy);  // right knot the larger
      VO::segment_weights<StencilAccuracy::bf16>(x - y, ey, ex, vx, vy);  // left knot the larger
      for (int l = 0; l < W; ++l) {
        const double b = double(M) - double(x[l]);  // exact
        const double scale = std::exp(double(M));
        const double near = scale * nu(-b), far = scale * mu1(-b);
        for (const double e : {std::abs(double(wy[l]) - near) / near, std::abs(double(wx[l]) - far) / far,
                               std::abs(double(vx[l]) - near) / near, std::abs(double(vy[l]) - far) / far})
          if (!(e <= worst)) {
            worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
            worst_b = b;
            worst_m = double(M);
          }
      }
    }
  }
  std::printf("[vector_moments] bf16 fwd weights, knots from exp_stencil_bf16: max rel %.2e (b=%g, M=%g)\n", worst,
              worst_b, worst_m);
  CHECK(worst <= 1.0 / 16384);
}
#endif
