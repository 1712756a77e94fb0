// backends/cpu/vector_moments.hpp — branch-free, vectorisable versions of the
// exponential and of the segment weights of MATH.md §4–§5, for the tiled CPU
// kernels (backends/cpu/tiled.hpp).
//
// The scalar primitives in math/ (mu0 … nu2, segment_weight …) branch on the
// argument and call std::exp/expm1, which the compiler cannot vectorise. Here
// every function is straight-line code over plain scalars, meant to be called
// inside `#pragma omp simd` loops: both regimes are computed and the right one
// is selected per lane (a blend), and exp is a Cody–Waite reduction plus a
// polynomial with the 2^n scaling done on the exponent bits.
//
// Segment of two neighbouring knots with scores x (left), y (right) (already
// shifted by the row's reference m, so Ex = e^{x-m}, Ey = e^{y-m} are the knot
// exponentials).
// Forward weights (MATH.md §5, "The forward stencil in d"), from d = y - x
// signed, with no compare of the knots: wy = Ey h(d), wx = Ex h(-d),
// h(d) = (d - 1 + e^{-d})/d², for |d| ≤ 2 (float, double: the interpolant at
// 11 / 18 Chebyshev nodes, relative error 1.0e-9 / 2.7e-18, evaluated at d and
// -d at once from its even and odd parts); beyond, the segment's mass
// D = (Ey - Ex)/d gives wy = (Ey - D)/d, wx = (D - Ex)/d.
// Backward terms, with b = |x - y|, eM = max(Ex, Ey) = e^{max-m},
// eMin = min(Ex, Ey) = e^{max-m} e^{-b}:
//   near weight  eM ν(-b)   (the knot with the larger score)
//   far weight   eM μ1(-b)
//   near ∂/∂self eM ν2(-b),  far ∂/∂self eM μ2(-b),  coupling eM κ(-b).
// Evaluation, per lane:
//  * b ≤ 2: eM · P(b - 1), P a degree-8 (float) / degree-14 (double) polynomial,
//    the Chebyshev interpolant of the function on b ∈ [0, 2] (coefficients from
//    mpmath.chebyfit at 60 digits; max relative error 1e-8 (float) / 4e-18
//    (double) of the function's minimum on the interval, printed beside each
//    array). Centred at b = 1 the terms alternate but their absolute sum stays
//    below 2× the value, so Horner adds at most ~2 ulp.
//  * b > 2: the closed forms of MATH.md §5 written with eMin = eM e^{-b} (no second
//    exponential) and r = 1/b (no b², b³, so no overflow):
//      eM ν   = (eM (b-1) r + eMin r) r          (as the forward's, in b)
//      eM μ1  = (eM - (1+b) eMin) r r            (1+b)e^{-b} ≤ 0.41: no cancellation
//      eM κ   = ((b-2) r eM + (b+2) r eMin) r r  (both terms ≥ 0)
//      eM ν2  = eM ((b-1) r)² r + (eM - 2 eMin) r r r
//      eM μ2  = (2 eM μ1 - eMin) r               (loses ≤ ~1 ulp at b = 2)
// Accuracy against the scalar primitives (math/curve.hpp) is measured by
// tests/unit/test_vector_moments.cpp (few ulp; see the bounds there).
//
// StencilAccuracy::bf16 (bfloat16 storage computed in float, MATH.md §10,
// "The bfloat16 stencil"): every term to a relative error of 2^-14 instead of
// a few float ulp. The closed forms lose about 12 ulp / d² (forward weights)
// and ~70 ulp / b³ (κ, ν2, μ2) to cancellation, which is below 2^-14 for
// |d| ≥ 1/4 (forward) and b ≥ 1/2 (backward terms), so the series regime
// shrinks to |d| ≤ 1/4: h of degree 3 (relative error 1.4e-6), and b ≤ 1/2:
// degree 3 in b - 1/4 (ν2, μ2, κ; 5.7e-7, 1.0e-5, 3.2e-6). The series is short, so every vector evaluates both regimes and
// blends them without a branch (kBothRegimes); exp is the same (the closed
// forms amplify its error by the same 1/b², 1/b³).
//
// exp_clamped(x): e^x for x ≤ 88.7 (float) / 709 (double); returns exactly 0
// below the normal range (x < -87.34 / -708.40) instead of a subnormal, so the
// kernels never produce denormals from exp (MATH.md §10 "underflow flush"; appendix A, W11).
// Relative error ≤ 2 ulp on the rest (Cephes expf polynomial for float, degree-13
// Taylor on |r| ≤ ln2/2 for double). NaN is not propagated (callers mask).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "../../config.hpp"
#include "simd.hpp"
#include "isa.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

template <class T>
struct VectorMath;

template <>
struct VectorMath<float> {
  static inline float exp_clamped(float x) {
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kMagic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
    constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
    const bool under = x < -87.3365447505531f;
    const float t = x * kLog2e + kMagic;
    const float n = t - kMagic;
    float r = x - n * kLn2Hi;
    r = r - n * kLn2Lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = (p * (r * r) + r) + 1.0f;
    // t's bits are bits(kMagic) + n (low 9 bits of bits(kMagic): 0); with 127
    // added, their low 9 bits are n + 127, 2^n's exponent field once shifted
    // by 23 (n + 127 ≥ 1 where the result is not flushed: x ≥ -87.34 gives
    // n ≥ -126). One compare, add and shift.
    constexpr std::int32_t kTop = __builtin_bit_cast(std::int32_t, kMagic) + 127;
    std::int32_t e = __builtin_bit_cast(std::int32_t, t);
    e = e > kTop ? kTop : e;  // x > 88.38: 2^n saturates at 2^127 (callers stay below)
    const float scale = __builtin_bit_cast(float, std::uint32_t(e + 127) << 23);
    return under ? 0.0f : y * scale;
  }
  // The forward weights' h(d) = (d - 1 + e^{-d})/d² on d ∈ [-2, 2], c0 + c1 d + …:
  // the interpolant at 11 Chebyshev nodes (scripts/gen_moments_bf16.py); max
  // relative error 1.0e-9.
  static constexpr float h[11] = {0.5f, -0.166666668528113749749f, 0.0416666667987623420418f, -0.00833332403485704292592f, 0.00138888822895550625037f, -0.000198425684778592454193f, 0.0000248025092481123512712f, -0.00000274834728834666171429f, 2.75048615659602845545e-7f, -2.68787420670337264047e-8f, 2.21760375433514206591e-9f};
  // The backward terms: Chebyshev interpolants on b ∈ [0, 2] in t = b - 1, c0 + c1 t + … (mpmath).
  // nu2: 8.3e-12; mu2: 4.0e-10; kappa: 3.9e-11 (max abs error).
  static constexpr float nu2[9] = {0.264241117657115356809f, -0.0569644705591759140081f, 0.0102906177373653966141f, -0.00159307953247720473726f, 0.000215233199883218764829f, -0.0000257539656556881141966f, 0.00000276349058774268439519f, -0.000000273006195044258394490f, 0.0000000241765545048020617732f};
  static constexpr float mu2[9] = {0.160602794142788392022f, -0.113928937984686037759f, 0.0439181616286408447688f, -0.0118837399563572908651f, 0.00249723846981629780758f, -0.000430309527505770238402f, 0.0000629969961317264382699f, -0.00000823085461412251570996f, 0.000000923372913862732882544f};
  static constexpr float kappa[9] = {0.103638323514326964787f, -0.0466738525648153102376f, 0.0130463086735398620829f, -0.00275569523634685326414f, 0.000473689966413774221387f, -0.0000689652524902137843802f, 0.00000873174694623003050550f, -0.000000999434625122856925356f, 0.000000100238265764926104585f};
  // StencilAccuracy::bf16 (scripts/gen_moments_bf16.py): h on d ∈ [-1/4, 1/4]
  // in d (4 Chebyshev nodes; max relative error 1.4e-6), and interpolants on
  // b ∈ [0, 1/2] in t = b - 1/4 (ν2, μ2, κ), from mpmath.chebyfit at 60 digits;
  // max relative error on the interval: nu2 5.7e-7; mu2 1.0e-5; kappa 3.2e-6.
  static constexpr float h_bf16[4] = {0.499999321074252745032f, -0.16666656970132618103f, 0.0417535570437519413359f, -0.00834574355057846936544f};
  static constexpr float nu2_bf16[4] = {0.313499600849580774124f, -0.0754969486519073902147f, 0.0147459514237650038541f, -0.00241293239348970929749f};
  static constexpr float mu2_bf16[4] = {0.276669236239785122527f, -0.204855375303457746735f, 0.0815441655103563333131f, -0.0224830088127026837427f};
  static constexpr float kappa_bf16[4] = {0.147312359949398999787f, -0.0718157331913945730703f, 0.021234683111514619187f, -0.00465842676920657896736f};
};

template <>
struct VectorMath<double> {
  static inline double exp_clamped(double x) {
    constexpr double kLog2e = 1.4426950408889634074;
    constexpr double kMagic = 6755399441055744.0;  // 1.5·2^52
    constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
    const bool under = x < -708.39641853226408;
    const double t = x * kLog2e + kMagic;
    const double n = t - kMagic;
    double r = x - n * kLn2Hi;
    r = r - n * kLn2Lo;
    // Taylor to degree 13: remainder (ln2/2)^14/14! < 5e-18.
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    const double y = (p * (r * r) + r) + 1.0;
    // As float's: the low 12 bits of bits(t) + 1023, shifted by 52, are 2^n's.
    constexpr std::int64_t kTop = __builtin_bit_cast(std::int64_t, kMagic) + 1023;
    std::int64_t e = __builtin_bit_cast(std::int64_t, t);
    e = e > kTop ? kTop : e;  // x > 709.43: 2^n saturates at 2^1023 (callers stay below)
    const double scale = __builtin_bit_cast(double, std::uint64_t(e + 1023) << 52);
    return under ? 0.0 : y * scale;
  }
  // h on d ∈ [-2, 2] (18 Chebyshev nodes; max relative error 2.7e-18).
  static constexpr double h[18] = {0.500000000000000000855, -0.166666666666666666707, 0.0416666666666666320528, -0.00833333333333333169061, 0.00138888888888911958582, -0.0001984126984127093615, 0.0000248015873009954845985, -0.00000275573192237050037382, 2.75573193000131386638e-7, -2.50521084215282079288e-8, 2.08767515041734781549e-9, -1.60590412336816335124e-10, 1.14709777532190910817e-11, -7.64727395719519743283e-13, 4.77375802149607340684e-14, -2.80874092527476759172e-15, 1.63761263255169470069e-16, -8.58035784979426207328e-18};
  // The backward terms, on b ∈ [0, 2] in t = b - 1.
  // nu2: 8.8e-21; mu2: 1.1e-18; kappa: 6.7e-20 (max abs error).
  static constexpr double nu2[15] = {0.264241117657115356809, -0.0569644706284614273606, 0.0102906177425958896916, -0.00159307860903796563134, 0.000215233130167475345801, -0.0000257572864604172049400, 0.00000276374132930701885712, -0.000000268589547285742779367, 0.0000000238429616717358674333, -0.00000000194733310587624475106, 0.000000000147236138894376356698, -0.0000000000103604160356231248920, 0.000000000000681761250952841766204, -0.0000000000000426352935001486596378, 0.00000000000000247943311512481566688};
  static constexpr double mu2[15] = {0.160602794142788392022, -0.113928941256922869761, 0.0439181619281245490471, -0.0118836963516332892376, 0.00249723447864065957448, -0.000430466260341113826883, 0.0000630113454866284399083, -0.00000802263441105325282169, 0.000000904298972082174277068, -0.0000000914772533557253128160, 0.00000000839491029825846838226, -0.000000000705003297098003460436, 0.0000000000545946670976877444367, -0.00000000000398461917660559318199, 0.000000000000266457558354794632369};
  static constexpr double kappa[15] = {0.103638323514326964787, -0.0466738528858655384985, 0.0130463087003368791430, -0.00275569095774095402564, 0.000473689609267769796969, -0.0000689806353935694952355, 0.00000873303123624807418434, -0.000000978986341545705998168, 0.0000000985303311352675885333, -0.00000000900048650396064986604, 0.000000000752812344596557840484, -0.0000000000580704719881172024671, 0.00000000000415756614138229979668, -0.000000000000281576622317056923020, 0.0000000000000175984970773871063186};
};

/// long double: the widened compute type of the rows double cannot hold
/// (raw scores beyond DBL_MAX, MATH.md §10), scalar only. The interpolants are
/// double's (their error, ~1e-18 of each function, is far below what the
/// double outputs these rows are rounded to can show); exp is the library's,
/// with the same flush below the normal range.
template <>
struct VectorMath<long double> {
  static inline long double exp_clamped(long double x) {
    return x < -11355.0L ? 0.0L : std::exp(x);  // LDBL_MIN = e^{-11355.1}
  }
  static constexpr const double (&h)[18] = VectorMath<double>::h;
  static constexpr const double (&nu2)[15] = VectorMath<double>::nu2;
  static constexpr const double (&mu2)[15] = VectorMath<double>::mu2;
  static constexpr const double (&kappa)[15] = VectorMath<double>::kappa;
};

/// The accuracy the segment terms are evaluated to: `full`, a few ulp of the
/// compute type; `bf16`, 2^-14 relative (bfloat16 storage computed in float;
/// see the file comment). Only float has a bf16 variant: double (bfloat16
/// storage with Compute::float64, and the rows float cannot hold) is always
/// `full`.
enum class StencilAccuracy { full, bf16 };

/// Where the series regime ends (|d| ≤ fwd_edge, b ≤ bwd_edge) and the
/// coefficients: h for the forward weights, in d; the backward terms (ν2, μ2,
/// κ) in b - bwd_centre.
template <class T, StencilAccuracy A>
struct Series {
  using M = VectorMath<T>;
  static constexpr T fwd_edge = T(2), bwd_edge = T(2), bwd_centre = T(1);
  static constexpr const auto& h = M::h;
  static constexpr const auto& nu2 = M::nu2;
  static constexpr const auto& mu2 = M::mu2;
  static constexpr const auto& kappa = M::kappa;
};
template <>
struct Series<float, StencilAccuracy::bf16> {
  using M = VectorMath<float>;
  static constexpr float fwd_edge = 0.25f, bwd_edge = 0.5f, bwd_centre = 0.25f;
  static constexpr const auto& h = M::h_bf16;
  static constexpr const auto& nu2 = M::nu2_bf16;
  static constexpr const auto& mu2 = M::mu2_bf16;
  static constexpr const auto& kappa = M::kappa_bf16;
};

/// Horner evaluation of c[0] + c[1] t + … + c[N-1] t^{N-1}, in T.
template <class T, class C, int N>
inline T horner(const C (&c)[N], T t) {
  T p = T(c[N - 1]);
#pragma GCC unroll 16
  for (int k = N - 2; k >= 0; --k) p = p * t + T(c[k]);
  return p;
}

/// e^x, vectorisable; 0 below the normal range (see the file comment).
template <class T>
inline T exp_clamped(T x) {
  return VectorMath<T>::exp_clamped(x);
}

/// c[0] + c[1] d + … at d and at -d, from its even and odd parts in d²:
/// plus = E + d·O, minus = E - d·O.
template <class T, class C, int N>
inline void horner_pm(const C (&c)[N], T d, T& plus, T& minus) {
  const T d2 = d * d;
  T e = T(c[(N - 1) / 2 * 2]), o = T(c[(N - 2) / 2 * 2 + 1]);
#pragma GCC unroll 16
  for (int k = (N - 1) / 2 * 2 - 2; k >= 0; k -= 2) e = e * d2 + T(c[k]);
#pragma GCC unroll 16
  for (int k = (N - 2) / 2 * 2 - 1; k >= 1; k -= 2) o = o * d2 + T(c[k]);
  const T od = o * d;
  plus = e + od;
  minus = e - od;
}

/// Forward weights of one segment (MATH.md §5, "The forward stencil in d"):
/// knots x (left) and y (right), d = y - x finite, Ex, Ey their exponentials
/// (same shift); wx = ∫₀¹ (1-t) e^{x+dt} dt goes to x, wy = ∫₀¹ t e^{x+dt} dt
/// to y. |d| ≤ edge: wy = Ey h(d), wx = Ex h(-d), h(d) = (d - 1 + e^{-d})/d²
/// (Series::h); else, with the segment's mass D = (Ey - Ex)/d, wy = (Ey - D)/d
/// and wx = (D - Ex)/d. No branch on which knot is larger.
template <class T, StencilAccuracy A = StencilAccuracy::full>
inline void segment_weights(T d, T Ex, T Ey, T& wx, T& wy) {
  using R = Series<T, A>;
  T hp, hm;
  horner_pm(R::h, d, hp, hm);
  const T r = T(1) / d;  // used only where |d| > edge
  const T mass = (Ey - Ex) * r;
  const bool series = (d < T(0) ? -d : d) <= R::fwd_edge;
  wy = series ? Ey * hp : (Ey - mass) * r;
  wx = series ? Ex * hm : (mass - Ex) * r;
}

/// Forward and backward terms of one segment: the two weights (near, far),
/// the derivatives of each weight with respect to its own knot's score
/// (dnear = eM ν2, dfar = eM μ2), and the coupling eM κ (the derivative of
/// either weight with respect to the other knot's score).
template <class T, StencilAccuracy A = StencilAccuracy::full>
inline void segment_terms(T b, T Ex, T Ey, T& near, T& far, T& dnear, T& dfar, T& coupling) {
  using R = Series<T, A>;
  const T eM = Ex > Ey ? Ex : Ey;
  const T eMin = Ex > Ey ? Ey : Ex;
  const T t = b - T(1);
  const T tp = b - R::bwd_centre;
  const T pk = eM * horner(R::kappa, tp);
  const T pn2 = eM * horner(R::nu2, tp);
  const T pm2 = eM * horner(R::mu2, tp);
  const T r = T(1) / (b > R::bwd_edge ? b : R::bwd_edge);
  const T cn = (eM * (t * r) + eMin * r) * r;
  const T cf = ((eM - (T(1) + b) * eMin) * r) * r;
  const T ck = (((b - T(2)) * r) * eM + ((b + T(2)) * r) * eMin) * r * r;
  const T u = t * r;
  const T cn2 = eM * (u * u) * r + (((eM - T(2) * eMin) * r) * r) * r;
  const T cm2 = (T(2) * cf - eMin) * r;
  const bool series = b <= R::bwd_edge;
  near = series ? pn2 + pk : cn;
  far = series ? pm2 + pk : cf;
  dnear = series ? pn2 : cn2;
  dfar = series ? pm2 : cm2;
  coupling = series ? pk : ck;
}


#if defined(CONTINUUM_CPU_SIMD)
// ---------------------------------------------------------------------------
// The same functions on whole vectors (GCC/Clang vector extensions), the same
// operations in the same order as the scalar versions above; the kernels call
// these on full vectors and never mix the two within one call.
// ---------------------------------------------------------------------------
template <class T>
struct VectorOps {
  using S = Simd<T>;
  using V = typename S::v;
  using VI = typename S::vi;
  static constexpr bool kFloat = sizeof(T) == 4;

  static V splat(T x) { return V{} + x; }

  static V exp_clamped(V x) {
    if constexpr (kFloat) {
      constexpr float kLog2e = 1.44269504088896341f;
      constexpr float kMagic = 12582912.0f;
      constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
      const VI under = x < -87.3365447505531f;
      const V t = x * kLog2e + kMagic;
      const V n = t - kMagic;
      V r = x - n * kLn2Hi;
      r = r - n * kLn2Lo;
      V p = splat(1.9875691500e-4f);
      p = p * r + 1.3981999507e-3f;
      p = p * r + 8.3334519073e-3f;
      p = p * r + 4.1665795894e-2f;
      p = p * r + 1.6666665459e-1f;
      p = p * r + 5.0000001201e-1f;
      const V y = (p * (r * r) + r) + 1.0f;
      typedef std::uint32_t VU __attribute__((vector_size(sizeof(V))));
      constexpr std::int32_t kTop = __builtin_bit_cast(std::int32_t, kMagic) + 127;
      VI e = (VI)t;
      e = e > kTop ? kTop : e;
      const V scale = (V)((VU)(e + 127) << 23);
      return under ? V{} : y * scale;
    } else {
      constexpr double kLog2e = 1.4426950408889634074;
      constexpr double kMagic = 6755399441055744.0;
      constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
      const VI under = x < -708.39641853226408;
      const V t = x * kLog2e + kMagic;
      const V n = t - kMagic;
      V r = x - n * kLn2Hi;
      r = r - n * kLn2Lo;
      V p = splat(1.0 / 6227020800.0);
      p = p * r + 1.0 / 479001600.0;
      p = p * r + 1.0 / 39916800.0;
      p = p * r + 1.0 / 3628800.0;
      p = p * r + 1.0 / 362880.0;
      p = p * r + 1.0 / 40320.0;
      p = p * r + 1.0 / 5040.0;
      p = p * r + 1.0 / 720.0;
      p = p * r + 1.0 / 120.0;
      p = p * r + 1.0 / 24.0;
      p = p * r + 1.0 / 6.0;
      p = p * r + 0.5;
      const V y = (p * (r * r) + r) + 1.0;
      typedef std::uint64_t VU __attribute__((vector_size(sizeof(V))));
      constexpr std::int64_t kTop = __builtin_bit_cast(std::int64_t, kMagic) + 1023;
      VI e = (VI)t;
      e = e > kTop ? kTop : e;
      const V scale = (V)((VU)(e + 1023) << 52);
      return under ? V{} : y * scale;
    }
  }

  /// 1/x for |x| ≥ 1/4 (finite or ±∞; lanes nearer 0, which no caller
  /// selects, may give ±∞ or NaN). AVX-512: 14-bit estimate refined by Newton
  /// steps (one for float, two for double: error ≤ 2^-28 / 2^-56 before the
  /// final rounding); elsewhere a division.
  static V reciprocal(V x) {
#if defined(__AVX512F__)
    if constexpr (kSimdBytes == 64) {
      V r;
      if constexpr (kFloat)
        r = (V)_mm512_maskz_rcp14_ps((__mmask16)0xFFFF, (__m512)x);
      else
        r = (V)_mm512_maskz_rcp14_pd((__mmask8)0xFF, (__m512d)x);
      V e = T(1) - x * r;
      r = r + r * e;
      if constexpr (!kFloat) {
        e = T(1) - x * r;
        r = r + r * e;
      }
      return r;
    }
#endif
    return T(1) / x;
  }

  template <int N>
  static V horner(const T (&c)[N], V t) {
    V p = splat(c[N - 1]);
#pragma GCC unroll 16
    for (int k = N - 2; k >= 0; --k) p = p * t + c[k];
    return p;
  }

  static V vmax(V a, V b) { return a > b ? a : b; }
  /// |x| (clears the sign bit).
  static V vabs(V x) {
    using I = typename SimdInt<T>::type;
    return (V)((VI)x & (VI{} + std::numeric_limits<I>::max()));
  }
  static V vmin(V a, V b) { return a > b ? b : a; }

  /// Lanes with b ≤ edge (the polynomial regime): 0 = none, 1 = some, 2 = all.
  /// The kernels evaluate only the regime that occurs in a vector; the result
  /// is the same as evaluating both and blending (lane by lane the same ops).
  static int series_lanes(V b, T edge) {
#if defined(__AVX512F__)
    if constexpr (kSimdBytes == 64) {
      unsigned m;
      if constexpr (kFloat)
        m = _mm512_cmp_ps_mask((__m512)b, _mm512_set1_ps(edge), _CMP_LE_OQ);
      else
        m = _mm512_cmp_pd_mask((__m512d)b, _mm512_set1_pd(edge), _CMP_LE_OQ);
      constexpr unsigned all = (1u << S::W) - 1;
      return m == 0 ? 0 : m == all ? 2 : 1;
    }
#endif
#if defined(__AVX__)
    if constexpr (kSimdBytes == 32) {  // one compare and a movemask, not a loop over the lanes
      int m;
      if constexpr (kFloat)
        m = _mm256_movemask_ps(_mm256_cmp_ps((__m256)b, _mm256_set1_ps(edge), _CMP_LE_OQ));
      else
        m = _mm256_movemask_pd(_mm256_cmp_pd((__m256d)b, _mm256_set1_pd(edge), _CMP_LE_OQ));
      constexpr int all = (1 << S::W) - 1;
      return m == 0 ? 0 : m == all ? 2 : 1;
    }
#endif
    int n = 0;
    for (int i = 0; i < S::W; ++i) n += b[i] <= edge;
    return n == 0 ? 0 : n == S::W ? 2 : 1;
  }

  /// Whether both regimes are evaluated on every vector, without a branch: at
  /// bf16 accuracy (float) the series is 2–3 FMAs per term and its edges (1/4,
  /// 1/2) sit inside the common range of b, so most vectors hold both regimes
  /// and a branch on them would be mispredicted often; the blend gives each
  /// lane the same value as the branch would.
  template <StencilAccuracy A>
  static constexpr bool kBothRegimes = kFloat && A == StencilAccuracy::bf16;

  template <int N>
  static void horner_pm(const T (&c)[N], V d, V& plus, V& minus) {
    const V d2 = d * d;
    V e = splat(c[(N - 1) / 2 * 2]), o = splat(c[(N - 2) / 2 * 2 + 1]);
#pragma GCC unroll 16
    for (int k = (N - 1) / 2 * 2 - 2; k >= 0; k -= 2) e = e * d2 + c[k];
#pragma GCC unroll 16
    for (int k = (N - 2) / 2 * 2 - 1; k >= 1; k -= 2) o = o * d2 + c[k];
    const V od = o * d;
    plus = e + od;
    minus = e - od;
  }

  /// Forward segment weights, as segment_weights() above (d = y - x signed;
  /// the closed form's lanes with |d| ≤ edge, d = 0 among them, may hold
  /// inf or NaN and are not selected).
  template <StencilAccuracy A = StencilAccuracy::full>
  static void segment_weights(V d, V Ex, V Ey, V& wx, V& wy) {
    using R = Series<T, A>;
    const V b = vabs(d);
    const int regime = kBothRegimes<A> ? 1 : series_lanes(b, R::fwd_edge);
    V sy{}, sx{};
    if (regime != 0) {
      V hp, hm;
      horner_pm(R::h, d, hp, hm);
      sy = Ey * hp;
      sx = Ex * hm;
      if (regime == 2) {
        wy = sy;
        wx = sx;
        return;
      }
    }
    const V r = reciprocal(d);
    const V mass = (Ey - Ex) * r;
    const V cy = (Ey - mass) * r, cx = (mass - Ex) * r;
    if (regime == 0) {
      wy = cy;
      wx = cx;
      return;
    }
    const VI series = b <= R::fwd_edge;
    wy = series ? sy : cy;
    wx = series ? sx : cx;
  }

  /// Forward and backward segment terms, as segment_terms() above.
  template <StencilAccuracy A = StencilAccuracy::full>
  static void segment_terms(V b, V Ex, V Ey, V& near, V& far, V& dnear, V& dfar, V& coupling) {
    using R = Series<T, A>;
    const V eM = vmax(Ex, Ey), eMin = vmin(Ex, Ey);
    const V t = b - T(1);
    const int regime = kBothRegimes<A> ? 1 : series_lanes(b, R::bwd_edge);
    V pk{}, pn2{}, pm2{};
    if (regime != 0) {
      const V tp = b - R::bwd_centre;
      pk = eM * horner(R::kappa, tp);
      pn2 = eM * horner(R::nu2, tp);
      pm2 = eM * horner(R::mu2, tp);
      if (regime == 2) {
        near = pn2 + pk;
        far = pm2 + pk;
        dnear = pn2;
        dfar = pm2;
        coupling = pk;
        return;
      }
    }
    const V r = reciprocal(vmax(b, splat(R::bwd_edge)));
    const V cn = (eM * (t * r) + eMin * r) * r;
    const V cf = ((eM - (T(1) + b) * eMin) * r) * r;
    const V ck = (((b - T(2)) * r) * eM + ((b + T(2)) * r) * eMin) * r * r;
    const V u = t * r;
    const V cn2 = eM * (u * u) * r + (((eM - T(2) * eMin) * r) * r) * r;
    const V cm2 = (T(2) * cf - eMin) * r;
    if (regime == 0) {
      near = cn;
      far = cf;
      dnear = cn2;
      dfar = cm2;
      coupling = ck;
      return;
    }
    const VI series = b <= R::bwd_edge;
    near = series ? pn2 + pk : cn;
    far = series ? pm2 + pk : cf;
    dnear = series ? pn2 : cn2;
    dfar = series ? pm2 : cm2;
    coupling = series ? pk : ck;
  }
};
#endif  // CONTINUUM_CPU_SIMD

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
