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
// exponentials), d = y - x signed: every term comes from d with no compare of
// the knots (MATH.md §5, "The forward stencil in d"; §6, "The backward stencil
// in d"), through three functions of d,
//   h(d) = ∫₀¹ t e^{-d(1-t)} dt,  q(d) = ∫₀¹ t² e^{-d(1-t)} dt,  k(d) = ∫₀¹ t(1-t) e^{dt} dt:
//   weights       wy = Ey h(d),   wx = Ex h(-d)
//   derivatives   dwy = ∂wy/∂y = Ey q(d),  dwx = ∂wx/∂x = Ex q(-d)
//   coupling      c = ∂wx/∂y = ∂wy/∂x = Ex k(d);  wy = dwy + c, wx = dwx + c.
// Evaluation, per lane:
//  * |d| ≤ 2: h, q, k as polynomials in d, the interpolants at Chebyshev nodes
//    of [-2, 2] (scripts/gen_moments_bf16.py; degree 10 for float, 17 for
//    double; relative error ≤ 3.7e-9 / 1.0e-17, printed beside each array);
//    h(±d) and q(±d) at once from their even and odd parts in d².
//  * |d| > 2: closed forms from r = 1/d and the segment's mass
//    D = (Ey - Ex) r (no d², d³, so no overflow; integration by parts):
//      wy = (Ey - D) r,   wx = (D - Ex) r
//      dwy = (Ey - 2 wy) r,   dwx = (2 wx - Ex) r
//      c = ((d - 2) Ey + (d + 2) Ex) r³   (both terms of one sign for |d| > 2)
// Accuracy against the scalar primitives (math/moments.hpp) is measured by
// tests/unit/test_vector_moments.cpp (few ulp; see the bounds there).
//
// StencilAccuracy::bf16 (bfloat16 storage computed in float, MATH.md §10,
// "The bfloat16 stencil"): every term to a relative error of 2^-14 instead of
// a few float ulp. The closed forms lose about 12 ulp / d² (weights) and ~70
// ulp / |d|³ (derivatives, coupling) to cancellation, which is below 2^-14 for
// |d| ≥ 1/4 (forward) and |d| ≥ 1/2 (backward), so the series regime shrinks
// to |d| ≤ 1/4: h of degree 3 (relative error 1.4e-6), and |d| ≤ 1/2: q, k of
// degree 4 (3.1e-7, 2.1e-6). The series is short, so every vector evaluates
// both regimes and blends them without a branch (kBothRegimes). The closed
// forms' cancellation amplifies the knots' exponentials' errors too, growing
// like 1/d² and 1/|d|³ (a weight's by at most 75 at the forward's edge
// |d| = 1/4): the forward takes them from exp_stencil_bf16 (≤ 2.1e-7, so
// ≤ 1.6e-5 in a weight), the backward from exp_clamped.
//
// exp_clamped(x): e^x for x ≤ 88.7 (float) / 709 (double); returns exactly 0
// below the normal range (x < -87.34 / -708.40) instead of a subnormal, so the
// kernels never produce denormals from exp (MATH.md §10 "underflow flush"; appendix A, W11).
// Relative error ≤ 2 ulp on the rest (Cephes expf polynomial for float, degree-13
// Taylor on |r| ≤ ln2/2 for double). NaN is not propagated (callers mask). The
// vector form scales by 2^n with one vscalefps/vscalefpd where there is AVX-512
// (the same values as the exponent-bits product). exp_bf16: e^x to bfloat16's
// accuracy (softmax's weights on a bfloat16 unit), 2^⌊t⌋ · 2^f of degree 4,
// relative error ≤ 9.56e-6. exp_stencil_bf16: exp_clamped with e^r of degree 5
// instead of 7 (relative error ≤ 2.1e-7), for the bfloat16 stencil's knots.
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
  // The segment functions h, q, k (see the file comment) on d ∈ [-2, 2],
  // c0 + c1 d + …: interpolants at 11 Chebyshev nodes (scripts/gen_moments_bf16.py);
  // max relative error h 1.0e-9, q 2.0e-10, k 3.7e-9.
  static constexpr float h[11] = {0.5f, -0.166666668528113749749f, 0.0416666667987623420418f, -0.00833332403485704292592f, 0.00138888822895550625037f, -0.000198425684778592454193f, 0.0000248025092481123512712f, -0.00000274834728834666171429f, 2.75048615659602845545e-7f, -2.68787420670337264047e-8f, 2.21760375433514206591e-9f};
  static constexpr float q[11] = {0.333333333333333333333f, -0.0833333335975246840835f, 0.0166666666841849166793f, -0.00277777645791101250074f, 0.000396825309298021749994f, -0.0000496050184962247025424f, 0.00000551158615335798536703f, -5.5009723131920569109e-7f, 5.00345899679019681961e-8f, -4.43520750867028413182e-9f, 3.3844492419686223757e-10f};
  static constexpr float k[11] = {0.166666666666666666667f, 0.0833333349305890656659f, 0.0250000001145774253625f, 0.00555554757694603042518f, 0.000992062919657484500375f, 0.000148820666282367751651f, 0.0000192909230947543659042f, 0.0000021982500570274560232f, 2.25014025691700877349e-7f, 2.24435345583634422729e-8f, 1.87915883013827982834e-9f};
  // StencilAccuracy::bf16: h on d ∈ [-1/4, 1/4] (degree 3, 1.4e-6); q, k on
  // d ∈ [-1/2, 1/2] (degree 4, 3.1e-7 and 2.1e-6).
  static constexpr float h_bf16[4] = {0.499999321074252745032f, -0.16666656970132618103f, 0.0417535570437519413359f, -0.00834574355057846936544f};
  static constexpr float q_bf16[5] = {0.333333333333333333333f, -0.0833323611510195027648f, 0.0166665587145859474785f, -0.00279332190470188236103f, 0.000398551649556251788858f};
  static constexpr float k_bf16[5] = {0.166666666666666666667f, 0.0833304134096944661305f, 0.0249996218609238039039f, 0.00560223114783425572022f, 0.000998109302794689391657f};
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
  // h, q, k on d ∈ [-2, 2] (18 Chebyshev nodes; max relative error 2.7e-18,
  // 3.4e-19, 1.0e-17).
  static constexpr double h[18] = {0.500000000000000000855, -0.166666666666666666707, 0.0416666666666666320528, -0.00833333333333333169061, 0.00138888888888911958582, -0.0001984126984127093615, 0.0000248015873009954845985, -0.00000275573192237050037382, 2.75573193000131386638e-7, -2.50521084215282079288e-8, 2.08767515041734781549e-9, -1.60590412336816335124e-10, 1.14709777532190910817e-11, -7.64727395719519743283e-13, 4.77375802149607340684e-14, -2.80874092527476759172e-15, 1.63761263255169470069e-16, -8.58035784979426207328e-18};
  static constexpr double q[18] = {0.333333333333333333414, -0.083333333333333333337, 0.0166666666666666633812, -0.00277777777777777762888, 0.000396825396825418723, -0.0000496031746031755956034, 0.00000551146384474100074764, -5.51146384477171679373e-7, 5.01042168430564158577e-8, -4.17535140084493011666e-9, 3.21180824673632670247e-10, -2.29414888354296124766e-11, 1.52945479143903948657e-12, -9.55905461188535335347e-14, 5.61748185054953518343e-15, -3.12137767986063553746e-16, 1.71607156995885241466e-17, -8.54708806904188132926e-19};
  static constexpr double k[18] = {0.16666666666666666744, 0.0833333333333333333702, 0.0249999999999999686716, 0.00555555555555555406173, 0.000992063492063700862818, 0.000148809523809533765897, 0.0000192901234562544838509, 0.00000220458553789332869445, 2.2546897615707497078e-7, 2.08767570206832778122e-8, 1.76649432574371514524e-9, 1.37648923501386722647e-10, 9.9415229617800515951e-12, 6.69136849600666209748e-13, 4.21200983644111988849e-14, 2.49660315728870403797e-15, 1.46600547555580945923e-16, 7.72564904289007394036e-18};
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
  static constexpr const double (&q)[18] = VectorMath<double>::q;
  static constexpr const double (&k)[18] = VectorMath<double>::k;
};

/// The accuracy the segment terms are evaluated to: `full`, a few ulp of the
/// compute type; `bf16`, 2^-14 relative (bfloat16 storage computed in float;
/// see the file comment). Only float has a bf16 variant: double (bfloat16
/// storage with Compute::float64, and the rows float cannot hold) is always
/// `full`.
enum class StencilAccuracy { full, bf16 };

/// Where the series regime ends (|d| ≤ fwd_edge for the forward weights,
/// |d| ≤ bwd_edge for the backward terms) and the coefficients of h (forward)
/// and of q and k (backward), in d.
template <class T, StencilAccuracy A>
struct Series {
  using M = VectorMath<T>;
  static constexpr T fwd_edge = T(2), bwd_edge = T(2);
  static constexpr const auto& h = M::h;
  static constexpr const auto& q = M::q;
  static constexpr const auto& k = M::k;
};
template <>
struct Series<float, StencilAccuracy::bf16> {
  using M = VectorMath<float>;
  static constexpr float fwd_edge = 0.25f, bwd_edge = 0.5f;
  static constexpr const auto& h = M::h_bf16;
  static constexpr const auto& q = M::q_bf16;
  static constexpr const auto& k = M::k_bf16;
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
  const bool series = (d < T(0) ? -d : d) <= R::fwd_edge;
  const T r = T(1) / (series ? R::fwd_edge : d);  // the closed form's lanes only: no 1/0
  const T mass = (Ey - Ex) * r;
  wy = series ? Ey * hp : (Ey - mass) * r;
  wx = series ? Ex * hm : (mass - Ex) * r;
}

/// Forward and backward terms of one segment (MATH.md §6, "The backward
/// stencil in d"), d = y - x, Ex, Ey as for segment_weights: the weights wx,
/// wy (as segment_weights, here through the backward's edge), each weight's
/// derivative by its own knot's score, dwx = ∫₀¹ (1-t)² e^{x+dt} dt and
/// dwy = ∫₀¹ t² e^{x+dt} dt, and the coupling c = ∫₀¹ t(1-t) e^{x+dt} dt
/// (the derivative of either weight by the other knot's score).
/// |d| ≤ edge: dwy = Ey q(d), dwx = Ex q(-d), c = Ex k(d), wy = dwy + c,
/// wx = dwx + c; else (r = 1/d, the mass D = (Ey - Ex) r): wy = (Ey - D) r,
/// wx = (D - Ex) r, dwy = (Ey - 2 wy) r, dwx = (2 wx - Ex) r,
/// c = ((d - 2) Ey + (d + 2) Ex) r³.
template <class T, StencilAccuracy A = StencilAccuracy::full>
inline void segment_terms(T d, T Ex, T Ey, T& wx, T& wy, T& dwx, T& dwy, T& c) {
  using R = Series<T, A>;
  T qp, qm;
  horner_pm(R::q, d, qp, qm);
  const T sdy = Ey * qp, sdx = Ex * qm, sc = Ex * horner(R::k, d);
  const bool series = (d < T(0) ? -d : d) <= R::bwd_edge;
  const T r = T(1) / (series ? R::bwd_edge : d);  // the closed form's lanes only: no 1/0
  const T mass = (Ey - Ex) * r;
  const T cy = (Ey - mass) * r, cx = (mass - Ex) * r;
  wy = series ? sdy + sc : cy;
  wx = series ? sdx + sc : cx;
  dwy = series ? sdy : (Ey - T(2) * cy) * r;
  dwx = series ? sdx : (T(2) * cx - Ex) * r;
  c = series ? sc : (((d - T(2)) * Ey + (d + T(2)) * Ex) * r) * r * r;
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

  /// exp's argument reduction in float (exp_clamped, exp_stencil_bf16): t =
  /// x·log2(e) + kMagic, whose low bits hold n = round(x·log2 e), n itself,
  /// and r = x − n·ln 2 with ln 2 in two parts (Cody–Waite: n·kLn2Hi exact).
  static V reduce_float(V x, V& t, V& n) {
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kMagic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
    constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
    t = x * kLog2e + kMagic;
    n = t - kMagic;
    const V r = x - n * kLn2Hi;
    return r - n * kLn2Lo;
  }

  static V exp_clamped(V x) {
    if constexpr (kFloat) {
      V t, n;
      const V r = reduce_float(x, t, n);
      V p = splat(1.9875691500e-4f);
      p = p * r + 1.3981999507e-3f;
      p = p * r + 8.3334519073e-3f;
      p = p * r + 4.1665795894e-2f;
      p = p * r + 1.6666665459e-1f;
      p = p * r + 5.0000001201e-1f;
      const V y = (p * (r * r) + r) + 1.0f;
      return scale_by_exponent(y, t, n, x);
    } else {
      constexpr double kLog2e = 1.4426950408889634074;
      constexpr double kMagic = 6755399441055744.0;
      constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
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
      return scale_by_exponent(y, t, n, x);
    }
  }

  /// e^x to bfloat16's accuracy, for softmax's weights on a bfloat16 unit
  /// (rounded to bfloat16 for P·V; MATH.md §10): 2^t for t = x ⊗ log2(e),
  /// split into n = ⌊t⌋ and f = t − n ∈ [0, 1] (exact but for one rounding
  /// where t < 0, ≤ 2^-25); 2^f of degree 4 with p(0) = 1 (a relative minimax
  /// fit on [0, 1]: 2.9e-6, 3.0e-6 with Horner's roundings), times 2^n
  /// exactly. f's rounding adds ≤ 2^-25·ln 2 (2.1e-8), the roundings of t and
  /// of log2(e) in float at most 1.25 · 2^-24·|x| relative (6.5e-6 at the
  /// bottom of the range): ≤ 9.56e-6 < 2^-14 in all (test_vector_moments.cpp).
  /// Exactly 1 at 0; exactly 0 below the normal range (t < −126, x < −87.34);
  /// +∞ from t ≥ 128. Float only (bfloat16 storage computes in float).
  /// AVX-512: f from one vreduceps, 2^n from one masked vscalefps (the same
  /// values).
  static V exp_bf16(V x) {
    static_assert(kFloat, "exp_bf16: float lanes");
    const V t = x * 1.44269504088896341f;
#  if defined(__AVX512F__) && defined(__AVX512DQ__)
    if constexpr (kSimdBytes == 64) {
      const V f = (V)_mm512_reduce_ps((__m512)t, 0x09);  // t − ⌊t⌋ (round down, no precision flag)
      return (V)_mm512_maskz_scalef_ps(_mm512_cmp_ps_mask((__m512)t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ),
                                       (__m512)exp2_fraction(f), (__m512)t);
    }
#  endif
    const VI under = t < -126.0f;
    const V tc = t < -127.0f ? splat(-127.0f) : (t > 128.0f ? splat(128.0f) : t);
    constexpr float kMagic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
    const V near = (tc + kMagic) - kMagic;
    const V n = near > tc ? near - 1.0f : near;  // ⌊tc⌋, in [−127, 128]
    const V y = exp2_fraction(tc - n);
    const VI e = __builtin_convertvector(n, VI);
    const VI top = e > 127;  // n = 128: 2^127 · 2, +∞ as vscalefps gives
    typedef std::uint32_t VU __attribute__((vector_size(sizeof(V))));
    const V scaled = y * (V)((VU)((top ? 127 : e) + 127) << 23);
    return under ? V{} : (top ? scaled * 2.0f : scaled);
  }

  /// e^x for the knots of the bfloat16 stencil (row_continuum_weights with
  /// StencilAccuracy::bf16; MATH.md §10, "The bfloat16 stencil"): exp_clamped's
  /// reduction (n = round(x · log2 e), r = x − n · ln 2 in two parts) and
  /// scaling (2^n, 0 below the normal range, the same saturation), with e^r of
  /// degree 5 instead of 7: p(0) = 1, a relative minimax fit on |r| ≤ ln2/2
  /// (scripts/gen_moments_bf16.py), 7.4e-8; with the roundings of r and of
  /// Horner's steps 1.9e-7 measured (2.0e-7 without FMA). Relative error
  /// ≤ 2.1e-7 (test_vector_moments.cpp), in 12 vector operations instead of
  /// 15 (AVX-512). Exactly 1 at 0. Float only.
  static V exp_stencil_bf16(V x) {
    static_assert(kFloat, "exp_stencil_bf16: float lanes");
    V t, n;
    const V r = reduce_float(x, t, n);
    V p = splat(0.008325657807290554f);
    p = p * r + 0.04190809279680252f;
    p = p * r + 0.16666939854621887f;
    p = p * r + 0.49999043345451355f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return scale_by_exponent(p, t, n, x);
  }

  /// 2^f on [0, 1] for exp_bf16: degree 4, p(0) = 1 exactly.
  static V exp2_fraction(V f) {
    V p = splat(0.013426518999040127f);
    p = p * f + 0.052242740988731384f;
    p = p * f + 0.24128007888793945f;
    p = p * f + 0.6930448412895203f;
    return p * f + 1.0f;
  }

  /// y · 2^n for exp_clamped: n (integral) from t = x·log2(e) +
  /// kMagic, whose low bits hold it; 2^n saturates at 2^127 (2^1023); 0 where
  /// x is below the normal range (x < −87.34 / −708.40). AVX-512: one
  /// vscalefps (vscalefpd) with n clamped and the lanes masked (the same
  /// values: both scale exactly, then round once).
  static V scale_by_exponent(V y, V t, V n, V x) {
    constexpr T kUnder = kFloat ? T(-87.3365447505531) : T(-708.39641853226408);
#  if defined(__AVX512F__)
    if constexpr (kSimdBytes == 64) {
      (void)t;
      if constexpr (kFloat)
        return (V)_mm512_maskz_scalef_ps(_mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(kUnder), _CMP_NLT_UQ),
                                         (__m512)y, _mm512_min_ps((__m512)n, _mm512_set1_ps(127.0f)));
      else
        return (V)_mm512_maskz_scalef_pd(_mm512_cmp_pd_mask((__m512d)x, _mm512_set1_pd(kUnder), _CMP_NLT_UQ),
                                         (__m512d)y, _mm512_min_pd((__m512d)n, _mm512_set1_pd(1023.0)));
    }
#  endif
    (void)n;
    const VI under = x < kUnder;
    if constexpr (kFloat) {
      typedef std::uint32_t VU __attribute__((vector_size(sizeof(V))));
      constexpr std::int32_t kTop = __builtin_bit_cast(std::int32_t, 12582912.0f) + 127;
      VI e = (VI)t;
      e = e > kTop ? kTop : e;
      return under ? V{} : y * (V)((VU)(e + 127) << 23);
    } else {
      typedef std::uint64_t VU __attribute__((vector_size(sizeof(V))));
      constexpr std::int64_t kTop = __builtin_bit_cast(std::int64_t, 6755399441055744.0) + 1023;
      VI e = (VI)t;
      e = e > kTop ? kTop : e;
      return under ? V{} : y * (V)((VU)(e + 1023) << 52);
    }
  }

  /// 1/x for |x| ≥ 1/4 (finite or ±∞). AVX-512: 14-bit estimate refined by Newton
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

  /// |x| (clears the sign bit).
  static V vabs(V x) {
    using I = typename SimdInt<T>::type;
    return (V)((VI)x & (VI{} + std::numeric_limits<I>::max()));
  }

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

  /// Forward segment weights, as segment_weights() above (d = y - x signed).
  template <StencilAccuracy A = StencilAccuracy::full>
  static void segment_weights(V d, V Ex, V Ey, V& wx, V& wy) {
    using R = Series<T, A>;
    const int regime = kBothRegimes<A> ? 1 : series_lanes(vabs(d), R::fwd_edge);
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
    // The series lanes divide by the edge instead (their closed forms are
    // not selected): no 1/0, 0·∞ or NaN is formed.
    const VI series = d * d <= R::fwd_edge * R::fwd_edge;  // |d| ≤ edge (a power of 2: exact)
    const V r = reciprocal(regime == 0 ? d : series ? splat(R::fwd_edge) : d);
    const V mass = (Ey - Ex) * r;
    const V cy = (Ey - mass) * r, cx = (mass - Ex) * r;
    if (regime == 0) {
      wy = cy;
      wx = cx;
      return;
    }
    wy = series ? sy : cy;
    wx = series ? sx : cx;
  }

  /// Forward and backward segment terms, as segment_terms() above (lanes
  /// as in segment_weights).
  template <StencilAccuracy A = StencilAccuracy::full>
  static void segment_terms(V d, V Ex, V Ey, V& wx, V& wy, V& dwx, V& dwy, V& c) {
    using R = Series<T, A>;
    const V b = vabs(d);
    const int regime = kBothRegimes<A> ? 1 : series_lanes(b, R::bwd_edge);
    V sdy{}, sdx{}, sc{};
    if (regime != 0) {
      V qp, qm;
      horner_pm(R::q, d, qp, qm);
      sdy = Ey * qp;
      sdx = Ex * qm;
      sc = Ex * horner(R::k, d);
      if (regime == 2) {
        wy = sdy + sc;
        wx = sdx + sc;
        dwy = sdy;
        dwx = sdx;
        c = sc;
        return;
      }
    }
    const VI series = b <= R::bwd_edge;  // as in segment_weights: no 1/0
    const V r = reciprocal(regime == 0 ? d : series ? splat(R::bwd_edge) : d);
    const V mass = (Ey - Ex) * r;
    const V cy = (Ey - mass) * r, cx = (mass - Ex) * r;
    const V cdy = (Ey - T(2) * cy) * r, cdx = (T(2) * cx - Ex) * r;
    const V cc = (((d - T(2)) * Ey + (d + T(2)) * Ex) * r) * r * r;
    if (regime == 0) {
      wy = cy;
      wx = cx;
      dwy = cdy;
      dwx = cdx;
      c = cc;
      return;
    }
    wy = series ? sdy + sc : cy;
    wx = series ? sdx + sc : cx;
    dwy = series ? sdy : cdy;
    dwx = series ? sdx : cdx;
    c = series ? sc : cc;
  }
};
#endif  // CONTINUUM_CPU_SIMD

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
