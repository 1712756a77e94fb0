// 16-bit storage on the CPU, bfloat16 and float16 (backends/cpu/storage16.hpp,
// docs/MATH.md §10): the call is converted to float once, the float kernels
// run, and each output is rounded once to the storage type (lse and dτ stay
// float).
//
// Error bound, derived: the inputs are 16-bit, so the reference is fed exactly
// those values (the rounding of the caller's data to 16 bits is the caller's,
// not the operator's). The float computation then has the float bounds of
// harness.hpp (forward_tolerance / backward_tolerance), and rounding an output
// x to the storage type (round to nearest even) adds at most u·|x|, with
// u = 2^-8 for bfloat16 (8 significant bits) and u = 2^-11 for float16 (11;
// the outputs here are far inside float16's normal range, 2^-14 to 65504).
// Relative to each tensor's max-abs:
//   out, dQ, dK, dV:  float bound + u;   lse, dτ (float):  the float bound.
// With Compute::float64 the double result is rounded to float, then to 16
// bits: u + 2^-24 + the double bound.
//
// The continuum stencil of a bfloat16 call computed in float is evaluated to
// bfloat16's accuracy (StencilAccuracy::bf16, vector_moments.hpp): each segment
// term within ε = 2^-14 of its value, relative (test_vector_moments.cpp). Each
// weight α_j = L_j + R_j then carries a relative error ≤ ε, and so does
// Z = Σ α_j: the output o = Σ α_j v_j / Z moves by |Σ α_j η_j (v_j − o)| / Z ≤
// ε · max_j |v_j − o| ≤ 2ε · max|v|, and lse = log Z by ≤ ε (absolute). In the
// backward each summand of dQ, dK, dV and dτ is a product of a weight or
// derivative term and Z⁻¹ (≤ 2ε, relative, for each of P and dS, ≤ 4ε for the
// summand), amplified by at most 3 where dP − Dl cancels (the float argument of
// harness.hpp's backward_tolerance): 12ε of each gradient's max-abs. Softmax
// and focal have no such stencil (e^s is float's) except on a bfloat16 unit,
// below; Compute::float64 keeps the double stencil, and float16 keeps float's
// (12ε = 1.5 · 2^-11 would exceed its rounding): their bounds have no such term.
//
// On a bfloat16 unit (cpu_dispatch's "avx512bf16" and "amx",
// backends/cpu/bf16_products.hpp) the forward's P·V product takes the weights rounded to bfloat16, W̃_j = W_j (1 + δ_j) with
// |δ_j| ≤ u, while l = Σ W_j stays float: the output moves by at most
// |Σ_j W_j δ_j v_j| / l ≤ u · max_j |v_j|, one more u · max|v| in absolute
// terms. (Q·K's products are exact in float; the sum and c_i ⊗ S_raw have the
// float bound's form.) There softmax's and focal's weights e^{s−m} are
// evaluated to bfloat16's accuracy too (vector_moments.hpp, exp_bf16: relative
// error ≤ 9.56e-6 < ε, test_vector_moments.cpp), W_j (1 + η_j) in W̃ and in l
// alike: the continuum stencil's argument with the same ε, so the same 2ε ·
// max|v| (out), ε (lse) and 12ε (the backward, through lse and the row
// statistics) apply. The backward's score products S and dP take bfloat16
// inputs (exact products, another order of summation: the float bound), and
// its three accumulations take P, c_i·dS and dS rounded to bfloat16, each term
// (1 + δ), |δ| ≤ u, beside operands that are bfloat16 already (dO, q, k):
//   |ΔdV_j| ≤ u Σ_i P_ij |dO_i| ≤ u · max_j Σ_i P_ij · max|dO|,
//   |ΔdK_j| ≤ u Σ_i |c_i dS_ij| |q_i| ≤ u · c_max · max_j Σ_i |dS_ij| · max|q|,
//   |ΔdQ_i| ≤ u c_i Σ_j |dS_ij| |k_j| ≤ u · c_max · max_i Σ_j |dS_ij| · max|k|,
// one more u times the gradient's term scale (harness.hpp, grad_term_scales,
// from the reference's P and dS), on top of the output rounding u · max-abs.
// The forward's row statistics come from the same W̃: the far keys' Σ W̃_j
// (v_j − v_ref) (MATH.md §6) gives each row's δ = Σ_j P_ij h_ij (h_ij = dP_ij −
// dP_i,ref) an error |Δδ_i| ≤ u Σ_j P_ij |h_ij| = u H_i, which moves every dS_ij
// of the row by P_ij Δδ_i:
//   |ΔdQ_i| ≤ u c_i H_i Σ_j P_ij |k_j| ≤ u · c_max · max_i H_i · max|k|,
//   |ΔdK_j| ≤ u Σ_i c_i P_ij H_i |q_i| ≤ u · c_max · max_j Σ_i P_ij H_i · max|q|,
// added to dQ's and dK's term scales (harness.hpp, delta_term_scales); dV
// does not involve δ. dτ is summed from the float dS, corrected after the
// sweep with the δ of the backward's own float P and dP (MATH.md §6, "dτ and
// the error of δ"): the float bound. Both units' instructions flush
// denormal inputs and outputs to zero: a flushed term is below 2^-126 times
// the largest operand in absolute size, far below the bound here; the
// concentrated case below (τ = 0.01, scores 100s apart) has weights far into
// that range and is held to the same bound.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cfenv>
#include <cmath>
#include <functional>
#include <cstring>
#include <thread>
#if defined(__x86_64__)
#  include <immintrin.h>
#endif

#include "operator/harness.hpp"

using namespace harness;
using continuum::bfloat16;
using continuum::float16;
using continuum::index_t;

namespace {

template <class S>
constexpr const char* storage_name() {
  return std::is_same<S, bfloat16>::value ? "bfloat16" : "float16";
}
/// The unit roundoff of storage type S (round to nearest even).
template <class S>
double unit_roundoff() {
  return std::ldexp(1.0, -std::numeric_limits<S>::digits);
}
static_assert(std::numeric_limits<bfloat16>::digits == 8 && std::numeric_limits<float16>::digits == 11,
              "significant bits of the 16-bit storage types");

/// A 16-bit copy (storage type S) of a float test tensor, same layout
/// (padding included).
template <class S>
struct Tensor16 {
  std::vector<S> buf;
  continuum::TensorView<S> view;
  explicit Tensor16(const Tensor<float>& t) : buf(t.buf.size()) {
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = S(t.buf[i]);
    const auto& v = t.view;
    view = {buf.data(), v.batch, v.heads, v.seq, v.dim, v.stride_batch, v.stride_head, v.stride_seq, v.stride_dim};
  }
  std::vector<float> contiguous() const {
    std::vector<float> out;
    for (index_t b = 0; b < view.batch; ++b)
      for (index_t h = 0; h < view.heads; ++h)
        for (index_t s = 0; s < view.seq; ++s)
          for (index_t d = 0; d < view.dim; ++d) out.push_back(float(view.row(b, h, s)[d]));
    return out;
  }
};

/// Rounds every input of c to S in place (so that c's reference problem is the
/// one the 16-bit call computes).
template <class S = bfloat16>
void round_inputs(Case<float>& c) {
  auto f = [](float& x) { x = float(S(x)); };
  c.q.for_each(f);
  c.k.for_each(f);
  c.v.for_each(f);
  c.dout.for_each(f);
}

template <class S = bfloat16>
void setup(Case<float>& c, int shape, int vis, int kernel, std::uint64_t salt) {
  // (shape 1: a row over two key tiles of the forward, six of the backward)
  static const index_t L[][2] = {{33, 70}, {1, continuum::cpu_detail::tiled::kBc + 140}, {70, 70}, {70, 140}};
  c.B = shape == 0 ? 2 : 1;
  c.Hq = 4;
  c.Hk = shape == 1 ? 1 : 2;  // GQA
  c.Lq = L[shape][0];
  c.Lk = L[shape][1];
  // shape 3: head_dim and value width that are not whole 16-column blocks of
  // the bfloat16 units, 2 query blocks and 2 key tiles of the backward.
  c.D = shape == 3 ? 20 : 16;
  c.Dv = shape == 2 ? 8 : shape == 3 ? 36 : 16;
  c.bshd = shape == 2;
  c.vis = visibility_code(vis);
  c.kernel = kernel == 0 ? continuum::Kernel::continuum : continuum::Kernel::softmax;
  c.tau = 0.3f;
  c.alloc();
  auto rng = rng_for(salt);
  c.fill_uniform(rng);
  round_inputs<S>(c);
}

template <class S = bfloat16>
struct Call16 {
  Tensor16<S> q, k, v, dout, o, dq, dk, dv;
  explicit Call16(const Case<float>& c)
      : q(c.q), k(c.k), v(c.v), dout(c.dout), o(c.o), dq(c.dq), dk(c.dk), dv(c.dv) {}
};
using Bf16Call = Call16<bfloat16>;

/// The options of c's float call, for a 16-bit call (accum_t of both 16-bit
/// types is float: the temperature is the same).
template <class Args>
void copy_options(Case<float>& c, Args& a) {
  const auto f = c.forward_args();
  a.kernel = f.kernel;
  a.temperature = f.temperature;
  a.scale = f.scale;
  a.visibility = f.visibility;
  a.compute = c.compute;
  a.num_threads = c.threads;
}

/// Query i of c (batch 0, every head) as a KV-cache decode step: one query
/// that sees keys [0, i + off], K and V as c stores them.
Case<float> decode_step(const Case<float>& c, index_t i, index_t off) {
  Case<float> d = c;
  d.Lq = 1;
  d.alloc();
  for (index_t h = 0; h < c.Hq; ++h)
    std::copy(c.q.view.row(0, h, i), c.q.view.row(0, h, i) + c.D, d.q.view.row(0, h, 0));
  d.k = c.k;
  d.v = c.v;
  d.range_lo.assign(1, 0);
  d.range_hi.assign(1, i + off + 1);
  d.vis = continuum::Visibility{};
  return d;
}

template <class S>
void forward16(Case<float>& c, Call16<S>& x, std::vector<float>& lse, continuum::RowStats<float> stats = {}) {
  continuum::ForwardArgs<S> a;
  a.row_stats = stats;
  copy_options(c, a);
  a.query = x.q.view;
  a.key = x.k.view;
  a.value = x.v.view;
  a.out = x.o.view;
  lse.assign(c.lse.size(), std::numeric_limits<float>::quiet_NaN());
  a.lse = lse.data();
  continuum::attention_forward(continuum::cpu, a);
}

template <class S>
void backward16(Case<float>& c, Call16<S>& x, std::vector<float>& dtau,
                continuum::RowStats<const float> stats = {}) {
  continuum::BackwardArgs<S> a;
  a.row_stats = stats;
  copy_options(c, a);
  a.query = x.q.view;
  a.key = x.k.view;
  a.value = x.v.view;
  a.out = x.o.view;
  a.grad_out = x.dout.view;
  a.grad_query = x.dq.view;
  a.grad_key = x.dk.view;
  a.grad_value = x.dv.view;
  dtau.assign(1, std::numeric_limits<float>::quiet_NaN());
  a.grad_temperature = dtau.data();
  continuum::attention_backward(continuum::cpu, a);
}

#if defined(CONTINUUM_CPU_DISPATCH)
namespace cd = continuum::cpu_dispatch;
/// The bfloat16 units this CPU runs (AVX512-BF16, AMX); skips are reported.
std::vector<cd::Isa> bf16_units() {
  std::vector<cd::Isa> out;
  if (cd::supported(cd::Isa::avx512bf16)) out.push_back(cd::Isa::avx512bf16);
  else WARN("skipped: bfloat16 on AVX512-BF16 (this CPU has no AVX512-BF16)");
  if (cd::supported(cd::Isa::amx)) out.push_back(cd::Isa::amx);
  else WARN("skipped: bfloat16 on AMX (this CPU or kernel has no AMX-BF16 tiles for this process)");
  return out;
}

/// The units this CPU can run storage type S on: the vector path (the best
/// kernels without a bfloat16 unit) and, for bfloat16, its units.
template <class S>
std::vector<cd::Isa> units16() {
  std::vector<cd::Isa> out;
  for (cd::Isa i : {cd::Isa::avx512, cd::Isa::avx2, cd::Isa::sse2})
    if (cd::supported(i)) {
      out.push_back(i);
      break;
    }
  if (!std::is_same<S, bfloat16>::value) return out;  // the units take bfloat16 only
  for (cd::Isa i : bf16_units()) out.push_back(i);
  return out;
}
#endif

#if defined(CONTINUUM_CPU_AMX) || (defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)))
#  define TEST_AMX_CONFIG 1
/// This thread's AMX tile configuration (64 bytes), set, read and released.
__attribute__((noinline, target("amx-tile"))) void load_tile_config(const unsigned char* c) {
  __asm__ __volatile__("" ::: "memory");
  _tile_loadconfig(c);
}
__attribute__((noinline, target("amx-tile"))) void store_tile_config(unsigned char* c) {
  _tile_storeconfig(c);
  __asm__ __volatile__("" ::: "memory");
}
__attribute__((noinline, target("amx-tile"))) void release_tiles() { _tile_release(); }
#endif

/// " avx512bf16", " amx": the bfloat16 unit the selected kernels use.
std::string unit_label() {
#if defined(CONTINUUM_CPU_DISPATCH)
  return std::string(" ") + cd::name(cd::selected());
#else
  return continuum::cpu_detail::bf16::amx_usable() ? " amx" : " avx512bf16";
#endif
}

/// The bfloat16 units a test runs on, one after the other (none, with a
/// warning, where the CPU has none); the caller's selection is restored.
struct UnitTests {
#if defined(CONTINUUM_CPU_DISPATCH)
  using Unit = cd::Isa;
  RestoreIsa restore;
  std::vector<Unit> list = bf16_units();
  void select(Unit u) const { cd::select(u); }
  bool is_amx(Unit u) const { return u == cd::Isa::amx; }
#else
  using Unit = int;  // the build's own kernels: one unit or none
  std::vector<Unit> list = on_bf16_unit() ? std::vector<Unit>{0} : std::vector<Unit>{};
  UnitTests() {
    if (list.empty())
      WARN("skipped: no bfloat16 unit this build takes (AMX-BF16, or AVX512-BF16 on AMD's CPUs) for this process");
  }
  void select(Unit) const {}
  bool is_amx(Unit) const { return continuum::cpu_detail::bf16::amx_usable(); }
#endif
};

double max_abs_of(const Tensor<float>& t) {
  double m = 0;
  for (float x : t.buf) m = std::max(m, double(std::fabs(x)));
  return m;
}

/// The 256-bit reference of a case: its problem, forward and backward, and
/// the term scales the bfloat16 units' gradient bound is relative to (header;
/// MATH.md §10): harness.hpp's grad_term_scales, with delta_term_scales' δ
/// terms added to dq and dk.
struct ReferenceRun {
  continuum::reference::Problem<mp> p;
  continuum::reference::ForwardResult<mp> f;
  continuum::reference::BackwardResult<mp> g;
  GradTermScales terms;
  template <class C>
  explicit ReferenceRun(C& c)
      : p(c.template problem<mp>()),
        f(continuum::reference::forward(p)),
        g(continuum::reference::backward(p, c.template grad_out_ref<mp>())),
        terms(grad_term_scales(p, f, g, max_abs_of(c.dout))) {
    const DeltaTermScales e = delta_term_scales(p, f, c.template grad_out_ref<mp>());
    terms.dq += e.dq;
    terms.dk += e.dk;
  }
};

/// The bfloat16 units' gradient bound (header) on dQ, dK, dV: the float bound
/// btol, the output rounding u and the bf16 stencil's 12 ε of each max-abs,
/// plus u times each gradient's term scale (and an absolute floor).
void check_unit_gradients(const Error& dq, const Error& dk, const Error& dv, double btol, double u,
                          double eps_stencil, const GradTermScales& terms, double floor = 0) {
  CHECK(dq.max_abs <= (btol + u + 12 * eps_stencil) * dq.ref_scale + u * terms.dq + floor);
  CHECK(dk.max_abs <= (btol + u + 12 * eps_stencil) * dk.ref_scale + u * terms.dk + floor);
  CHECK(dv.max_abs <= (btol + u + 12 * eps_stencil) * dv.ref_scale + u * terms.dv + floor);
}

}  // namespace

TEMPLATE_TEST_CASE("16-bit storage: forward and backward within one rounding of the float bound",
                   "[operator][bfloat16][float16]", bfloat16, float16) {
  using S = TestType;
  use_mp_precision();
#if defined(CONTINUUM_CPU_DISPATCH)
  RestoreIsa restore;
  const std::vector<cd::Isa> units = units16<S>();
#endif
  const int shape = GENERATE(0, 1, 2, 3);
  const int vis = GENERATE(0, 4, 6);  // full, causal window of 5, window (0, 2)
  const int kernel = GENERATE(0, 1);
  Case<float> c;
  setup<S>(c, shape, vis, kernel, 1000 + 10 * shape + vis);
  const ReferenceRun ref(c);
  const auto& f = ref.f;
  const auto& g = ref.g;
  const GradTermScales& terms = ref.terms;
  const double max_s = max_abs(f.scores);
  const double u = unit_roundoff<S>();
  constexpr bool bf16 = std::is_same<S, bfloat16>::value;
#if defined(CONTINUUM_CPU_DISPATCH)
  for (cd::Isa unit : units)
#endif
  for (const bool in_double : {false, true}) {
#if defined(CONTINUUM_CPU_DISPATCH)
    cd::select(unit);
#endif
    c.compute = in_double ? continuum::Compute::float64 : continuum::Compute::automatic;
    // A bfloat16 unit (float compute only): one more u · max|v| from W̃ (header).
    const double unit_out = !in_double && bf16 && on_bf16_unit() ? u * max_abs_of(c.v) : 0.0;
    // The bf16-accuracy stencil (bfloat16, float compute: continuum; on a unit, softmax's e^s too; header).
    const double eps_stencil = bf16 && !in_double && (kernel == 0 || unit_out > 0) ? std::ldexp(1.0, -14) : 0.0;
    const double stencil_out = 2 * eps_stencil * max_abs_of(c.v), stencil_grad = 12 * eps_stencil;
    Call16<S> x(c);
    std::vector<float> lse, dtau;
    forward16(c, x, lse);
    backward16(c, x, dtau);
    const double ftol = in_double ? std::ldexp(1.0, -24) + forward_tolerance<double>(max_s, c.D)
                                  : forward_tolerance<float>(max_s, c.D);
    const double btol = in_double ? std::ldexp(1.0, -24) + backward_tolerance<double>(max_s, c.D)
                                  : backward_tolerance<float>(max_s, c.D);
    const std::string label =
        std::string(storage_name<S>()) + (unit_out > 0 ? unit_label() : "") + (in_double ? "/compute float64" : "");
    INFO(label << " shape " << shape << " vis " << vis << " kernel " << kernel << " max|s| " << max_s);

    const Error out = compare(x.o.contiguous(), f.out), l = compare(lse, f.lse);
    record("forward out " + label, out.rel());
    CHECK(out.max_abs <= (ftol + u) * out.ref_scale + unit_out + stencil_out);
    CHECK(l.max_abs <= ftol * std::max(1.0, l.ref_scale) + eps_stencil);

    const Error dq = compare(x.dq.contiguous(), g.grad_query), dk = compare(x.dk.contiguous(), g.grad_key),
                dv = compare(x.dv.contiguous(), g.grad_value), dt = compare(dtau, g.grad_temperature);
    record("backward dQ " + label, dq.rel());
    record("backward dK " + label, dk.rel());
    record("backward dV " + label, dv.rel());
    record("backward dtau " + label, dt.rel());
    // A bfloat16 unit: one more u times each gradient's term scale (header).
    const double unit_grad = unit_out > 0 ? u : 0.0;
    CHECK(dq.max_abs <= (btol + u + stencil_grad) * dq.ref_scale + unit_grad * terms.dq);
    CHECK(dk.max_abs <= (btol + u + stencil_grad) * dk.ref_scale + unit_grad * terms.dk);
    CHECK(dv.max_abs <= (btol + u + stencil_grad) * dv.ref_scale + unit_grad * terms.dv);
    CHECK(dt.max_abs <= (btol + stencil_grad) * std::max(dt.ref_scale, 1e-300));
  }
}

TEMPLATE_TEST_CASE("16-bit storage: hidden keys never change a bit, and the thread count neither",
                   "[operator][bfloat16][float16]", bfloat16, float16) {
  using S = TestType;
  // Explicit ranges end 5 keys early: the last 5 keys and values are hidden
  // from every query. NaN, Inf and 1e30 there must leave every output and
  // gradient bitwise as with zeros; 1, 2 and 3 threads give the same bits.
  const int kernel = GENERATE(0, 1);
  Case<float> c;
  setup<S>(c, 0, 0, kernel, 77);
  c.range_lo.assign(std::size_t(c.B * c.Lq), 0);
  c.range_hi.assign(std::size_t(c.B * c.Lq), c.Lk - 5);
  std::vector<std::vector<float>> first;
  for (float junk : {0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e30f})
    for (int threads : {1, 2, 3}) {
      c.threads = threads;
      for (index_t b = 0; b < c.B; ++b)
        for (index_t h = 0; h < c.Hk; ++h)
          for (index_t j = c.Lk - 5; j < c.Lk; ++j)
            for (index_t d = 0; d < c.D; ++d) {
              c.k.view.row(b, h, j)[d] = junk;
              c.v.view.row(b, h, j)[d] = junk;
            }
      Call16<S> x(c);
      std::vector<float> lse, dtau;
      forward16(c, x, lse);
      backward16(c, x, dtau);
      const std::vector<std::vector<float>> now = {x.o.contiguous(),  lse, x.dq.contiguous(),
                                                   x.dk.contiguous(), x.dv.contiguous(), dtau};
      INFO("kernel " << kernel << " junk " << junk << " threads " << threads);
      if (first.empty()) {
        first = now;
        continue;
      }
      for (std::size_t t = 0; t < now.size(); ++t) CHECK(bitwise_equal(now[t], first[t]));
    }
}

TEMPLATE_TEST_CASE("16-bit storage: a thread's reused conversion blocks change no bit",
                   "[operator][bfloat16][float16]", bfloat16, float16) {
  using S = TestType;
  // A 16-bit call's float copies come from its thread's spare blocks
  // (cpu/spare_pool.hpp, SparePool), left as the previous call wrote them. Call A
  // (every input NaN, a larger shape) leaves NaN in every block; call B
  // (another shape and layout, 2 threads) then reuses them, and must give the
  // bits B gives on a thread that has run nothing before. With
  // Compute::float64 the copies are double blocks (the other pool).
  const int kernel = GENERATE(0, 1);
  const auto compute = GENERATE(continuum::Compute::automatic, continuum::Compute::float64);
  Case<float> a, b;
  setup<S>(a, 0, 0, kernel, 91);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Tensor<float>* t : {&a.q, &a.k, &a.v, &a.dout}) t->for_each([&](float& x) { x = nan; });
  setup<S>(b, 2, 1, kernel, 92);
  a.compute = b.compute = compute;
  b.threads = 2;
  auto run = [](Case<float>& c) {
    Call16<S> x(c);
    std::vector<float> lse, dtau;
    forward16(c, x, lse);
    backward16(c, x, dtau);
    return std::vector<std::vector<float>>{x.o.contiguous(),  lse, x.dq.contiguous(),
                                           x.dk.contiguous(), x.dv.contiguous(), dtau};
  };
  std::vector<std::vector<float>> fresh, reused, again, poisoned;
  std::thread([&] { fresh = run(b); }).join();
  std::thread([&] {
    poisoned = run(a);
    reused = run(b);
    again = run(b);
  }).join();
  CHECK(std::isnan(poisoned[0][0]));  // call A did run on NaN
  REQUIRE(fresh.size() == reused.size());
  for (std::size_t t = 0; t < fresh.size(); ++t) {
    INFO("kernel " << kernel << " compute float64 " << (compute == continuum::Compute::float64) << " output " << t);
    CHECK(bitwise_equal(reused[t], fresh[t]));
    CHECK(bitwise_equal(again[t], fresh[t]));
  }
}

TEMPLATE_TEST_CASE("16-bit storage: the forward reads keys and values as stored, and gives the float call's values "
                   "rounded once (decode over a split KV cache, windows, strides)",
                   "[operator][bfloat16][float16]", bfloat16, float16) {
  using S = TestType;
  // The 16-bit forward widens each query row where it scales it and each key
  // and value tile where it packs it, and rounds each output row where it
  // finishes it (tiled.hpp, Stored), not whole tensors; the float call on the
  // same values reads them as they are. Same floats, same operations: where
  // both evaluate the same stencil (float16: every kernel; bfloat16: softmax,
  // e^s in both; bfloat16's continuum stencil is its own, MATH.md §10) the
  // 16-bit out is the float out rounded once, bit for bit, and lse equal.
  // Shapes: a GQA decode step (1 query, 8 heads on 2, 2·2048 + 37 keys: split
  // into 3 chunks, halo at each chunk start), the same under a sliding window
  // that starts mid-chunk, and a prefill block (Lq = Lk = 70, window (5, 2),
  // head_dim 16, Dv 8). Every row of K and V has 3 NaN padding elements.
  const int shape = GENERATE(0, 1, 2);
  std::vector<continuum::Kernel> kernels = {continuum::Kernel::softmax};
  if (std::is_same<S, float16>::value) kernels.push_back(continuum::Kernel::continuum);
  for_each_vector_isa<S>(storage_name<S>(), "this build's bfloat16 kernels use a bfloat16 unit, whose products are "
                         "not the float call's", [&] {
    for (const continuum::Kernel kernel : kernels) {
      Case<float> c;
      c.B = 1;
      c.Hq = shape == 2 ? 4 : 8;
      c.Hk = 2;
      c.Lq = shape == 2 ? 70 : 1;
      c.Lk = shape == 2 ? 70 : 2 * 2048 + 37;
      c.D = 16;
      c.Dv = shape == 2 ? 8 : 16;
      c.pad = 3;
      c.vis.causal = shape != 2;
      if (shape == 1) c.vis.window_left = 3000;  // keys [1132, 4133): chunks 0 (part), 1, 2
      if (shape == 2) c.vis.window_left = 5, c.vis.window_right = 2;
      c.kernel = kernel;
      c.tau = 0.3f;
      c.alloc();
      auto rng = rng_for(131 + shape);
      c.fill_uniform(rng, -2, 2);
      round_inputs<S>(c);
      Call16<S> x(c);
      std::vector<float> lse;
      forward16(c, x, lse);
      c.forward();
      const std::vector<float> want = c.o.contiguous(), got = x.o.contiguous();
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        const S w = S(want[i]);
        if (Eigen::numext::bit_cast<std::uint16_t>(S(got[i])) != Eigen::numext::bit_cast<std::uint16_t>(w) &&
            wrong++ < 5)
          UNSCOPED_INFO("out[" << i << "] = " << got[i] << ", float call rounded " << float(w));
      }
      INFO("shape " << shape << " kernel " << int(kernel));
      CHECK(wrong == 0);
      CHECK(bitwise_equal(lse, c.lse));
    }
  });
}

TEST_CASE("bfloat16 units: concentrated attention, decode rows, a split KV cache, FP state and tile state",
          "[operator][bfloat16]") {
  const UnitTests units;
  if (units.list.empty()) return;
  use_mp_precision();
  const int kernel = GENERATE(0, 1);
  // τ = 0.01 and a causal mask (bottom-right: row i sees keys [0, i + off])
  // over 2 key tiles of the forward, 5 of the backward and 2 query tiles of
  // the backward: scores ~100 apart, so most weights are far below 2^-126
  // (flushed by the instruction) and the rest concentrated; every query row
  // is checked against the reference.
  Case<float> c;
  setup(c, 1, 1, kernel, 4242);
  const index_t kBc = continuum::cpu_detail::tiled::kBc;
  c.Lq = 70;
  c.Lk = kBc + 22;
  const index_t off = c.Lk - c.Lq;
  c.tau = 0.01f;
  c.alloc();
  auto rng = rng_for(4243);
  c.fill_uniform(rng);
  round_inputs(c);
  const ReferenceRun ref(c);
  const auto& f = ref.f;
  const auto& g = ref.g;
  const GradTermScales& terms = ref.terms;
  const double u = std::ldexp(1.0, -8);
  // The bf16-accuracy stencil's terms (on a unit, softmax's e^s too; see the header).
  const double eps_stencil = std::ldexp(1.0, -14);
  for (const auto unit : units.list) {
    units.select(unit);
    const bool tiles = units.is_amx(unit);
    const std::string label = "bfloat16" + unit_label() + " tau 0.01";
    INFO(label << " kernel " << kernel);
    Bf16Call x(c);
    std::vector<float> lse;
#if defined(__x86_64__)
    const unsigned mxcsr = _mm_getcsr();
#endif
#if defined(TEST_AMX_CONFIG)
    // A caller's own tile configuration (palette 1, tile 0: 3 rows × 12 bytes)
    // is this thread's again after the call (the kernel saves and restores it).
    alignas(64) unsigned char mine[64] = {}, after[64] = {};
    mine[0] = 1;
    mine[16] = 12;
    mine[48] = 3;
    if (tiles) load_tile_config(mine);
#endif
    forward16(c, x, lse);
#if defined(TEST_AMX_CONFIG)
    if (tiles) {
      store_tile_config(after);
      release_tiles();
      CHECK(std::memcmp(mine, after, 64) == 0);
    }
#endif
    (void)tiles;
#if defined(__x86_64__)
    // The caller's FP control state is unchanged (rounding, FTZ, DAZ, exception
    // masks: the units flush denormals without MXCSR); the status flags (bits
    // 0–5) record the underflows the float stencil raises, as on every path.
    CHECK((_mm_getcsr() & ~0x3fu) == (mxcsr & ~0x3fu));
#endif
    const Error out = compare(x.o.contiguous(), f.out);
    record("forward out " + label, out.rel());
    CHECK(out.max_abs <= (forward_tolerance<float>(max_abs(f.scores), c.D) + u) * out.ref_scale +
                             (u + 2 * eps_stencil) * max_abs_of(c.v));
    // The backward's score products (S, dP) on the unit add no rounding (their
    // inputs are bfloat16); its accumulations take P and dS rounded to
    // bfloat16: the float bound, the output rounding and u times each
    // gradient's term scale (header).
    {
      std::vector<float> dtau;
      backward16(c, x, dtau);
      const double btol = backward_tolerance<float>(max_abs(f.scores), c.D);
      const Error dq = compare(x.dq.contiguous(), g.grad_query), dk = compare(x.dk.contiguous(), g.grad_key),
                  dv = compare(x.dv.contiguous(), g.grad_value);
      record("backward dQ " + label, dq.rel());
      record("backward dK " + label, dk.rel());
      record("backward dV " + label, dv.rel());
      check_unit_gradients(dq, dk, dv, btol, u, eps_stencil, terms);
    }
    // A KV-cache decode step (one query, the keys it sees, K and V read as
    // stored) gives the full forward's row bit for bit on the unit too: rows
    // that see one key tile, a tile and one key, and the most keys.
    for (index_t i : {index_t(0), kBc - 1 - off, kBc - off, c.Lq - 1}) {
      Case<float> d = decode_step(c, i, off);
      Bf16Call y(d);
      std::vector<float> l1;
      forward16(d, y, l1);
      const std::vector<float> full = x.o.contiguous(), one = y.o.contiguous();
      for (index_t h = 0; h < c.Hq; ++h) {
        INFO("query " << i << " head " << h);
        const float* a = full.data() + (h * c.Lq + i) * c.Dv;
        const float* b = one.data() + h * c.Dv;
        CHECK(std::memcmp(a, b, sizeof(float) * std::size_t(c.Dv)) == 0);
      }
    }
  }
}

TEST_CASE("bfloat16 units: a head's key tiles, packed once for its row blocks, change no bit",
          "[operator][bfloat16]") {
  // With several row blocks (tasks) per head, a thread packs each key tile of
  // the head once, every key of it, and its tasks share it (tiled.hpp,
  // pack_tile_bf16); a task alone packs only the keys its rows see. 600
  // queries (3 row blocks) on 637 keys under a bottom-right causal mask, GQA
  // (2 query heads on 1): decode steps (one query, a task of its own) give the
  // full forward's rows bit for bit, and so does 1 thread against 2. A NaN in
  // K and V at key 617 (seen by queries 580 on) leaves every other row's bits
  // as they were: its tile is packed per task instead.
  const UnitTests units;
  if (units.list.empty()) return;
  const int kernel = GENERATE(0, 1);
  Case<float> c;
  setup(c, 0, 0, kernel, 4343);
  c.B = 1;
  c.Hq = 2;
  c.Hk = 1;
  c.Lq = 600;
  c.Lk = 637;
  c.vis = continuum::Visibility{};
  c.vis.causal = true;
  c.alloc();
  auto rng = rng_for(4344);
  c.fill_uniform(rng);
  round_inputs(c);
  const index_t off = c.Lk - c.Lq, nan_key = 617;
  Case<float> poisoned = c;
  for (index_t d = 0; d < c.D; ++d) poisoned.k.at(0, 0, nan_key, d) = std::numeric_limits<float>::quiet_NaN();
  for (index_t d = 0; d < c.Dv; ++d) poisoned.v.at(0, 0, nan_key, d) = std::numeric_limits<float>::quiet_NaN();
  for (const auto unit : units.list) {
    units.select(unit);
    INFO("bfloat16" << unit_label() << " kernel " << kernel);
    auto run = [](Case<float>& x, int threads) {
      x.threads = threads;
      Bf16Call call(x);
      std::vector<float> lse;
      forward16(x, call, lse);
      std::vector<float> out = call.o.contiguous();
      out.insert(out.end(), lse.begin(), lse.end());
      return out;
    };
    const std::vector<float> two = run(c, 2), one = run(c, 1), bad = run(poisoned, 2);
    CHECK(bitwise_equal(one, two));
    for (index_t i : {index_t(0), index_t(255), index_t(256), index_t(511), index_t(512), index_t(599)}) {
      Case<float> d = decode_step(c, i, off);
      Bf16Call y(d);
      std::vector<float> l1;
      forward16(d, y, l1);
      const std::vector<float> row = y.o.contiguous();
      for (index_t h = 0; h < c.Hq; ++h) {
        INFO("query " << i << " head " << h);
        CHECK(std::memcmp(two.data() + (h * c.Lq + i) * c.Dv, row.data() + h * c.Dv, sizeof(float) * c.Dv) == 0);
      }
    }
    std::size_t changed = 0, not_nan = 0;
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i)
        for (index_t d = 0; d < c.Dv; ++d) {
          const std::size_t at = std::size_t((h * c.Lq + i) * c.Dv + d);
          if (i + off >= nan_key) not_nan += !std::isnan(bad[at]);
          else changed += std::memcmp(&bad[at], &two[at], sizeof(float)) != 0;
        }
    CHECK(changed == 0);
    CHECK(not_nan == 0);
  }
}

TEST_CASE("bfloat16 units: a row that sees no key of a tile keeps its bits beside rows that see it",
          "[operator][bfloat16]") {
  // The unit flushes a denormal partial sum to a signed zero, and -0 + +0 is
  // +0: a row whose O holds -0 comes out +0 after a pass of the unit (with
  // zero weights) over a key tile it does not see, a pass it makes because
  // another row of its 64-row sub-block (kBs) sees that tile; a decode step
  // of the row alone skips the tile and keeps -0. Its out and its row
  // statistics' far_diff are written with either zero as +0 (unsigned_zero),
  // so the row's bits are its own. Here (softmax, scale/τ = 1, causal, Lk =
  // kBc + 34, Lq = 70: rows 0-35 see key tile 0 only, row 35 all of it, rows
  // 36-69 both tiles, all in the first sub-block but rows 64-69) row 35's
  // scores are all 0 (q = e_0, every k_0 = 0), so its weights are 1, and
  // columns 0 and 1 of the values are -0 in tile 0 and +0 in tile 1, except
  // key 10's -2^-125 and key 20's 2^-125 - 2^-133 (normal products whose
  // partial sum -2^-133 is flushed to -0) and key 0, the reference key, whose
  // term is added in float: -0 in column 0, +0 in column 1. Every row's out
  // and statistics must equal its decode step's bit for bit. (Without
  // unsigned_zero in the forward's out, row 35's out[0] = -0 + v_0[0] is +0,
  // its decode step's -0; without it in far_diff, far_diff[1] = -v_0[1] + o[1]
  // is +0 and -0. Each column's other zero hides the fault of the other.)
  const UnitTests units;
  if (units.list.empty()) return;
  const index_t kBc = continuum::cpu_detail::tiled::kBc;
  Case<float> c;
  setup(c, 1, 1, 1, 5151);
  c.Hq = c.Hk = 1;
  c.Lq = 70;
  c.Lk = kBc + 34;
  c.tau = 1.0f;
  c.scale = 1.0;
  c.alloc();
  auto rng = rng_for(5152);
  c.fill_uniform(rng);
  round_inputs(c);
  const index_t off = c.Lk - c.Lq, row = 35, width = continuum::row_stats_width(c.Dv);
  const float big = std::ldexp(1.0f, -125), small = std::ldexp(1.0f, -125) - std::ldexp(1.0f, -133);
  REQUIRE(float(bfloat16(small)) == small);
  for (index_t j = 0; j < c.Lk; ++j) {
    c.k.view.row(0, 0, j)[0] = 0.0f;
    for (index_t d = 0; d < 2; ++d)
      c.v.view.row(0, 0, j)[d] = j == 10 ? -big : j == 20 ? small : (j == 0 && d == 1) || j >= kBc ? 0.0f : -0.0f;
  }
  for (index_t d = 0; d < c.D; ++d) c.q.view.row(0, 0, row)[d] = d == 0 ? 1.0f : 0.0f;
  for (const auto unit : units.list) {
    units.select(unit);
    INFO("bfloat16" << unit_label());
    Bf16Call x(c);
    std::vector<float> lse, stats(std::size_t(c.Lq * width));
    std::vector<index_t> ref(std::size_t(c.Lq));
    forward16(c, x, lse, continuum::RowStats<float>{stats.data(), ref.data()});
    const std::vector<float> full = x.o.contiguous();
    CHECK(full[std::size_t(row * c.Dv)] == 0.0f);  // the sum's exact value, -2^-133 / 508, is flushed
    CHECK(full[std::size_t(row * c.Dv + 1)] == 0.0f);
    CHECK(ref[std::size_t(row)] == 0);
    for (index_t i = 0; i < c.Lq; ++i) {
      Case<float> d = decode_step(c, i, off);
      Bf16Call y(d);
      std::vector<float> l1, s1(static_cast<std::size_t>(width));
      std::vector<index_t> r1(1);
      forward16(d, y, l1, continuum::RowStats<float>{s1.data(), r1.data()});
      const std::vector<float> one = y.o.contiguous();
      INFO("query " << i);
      CHECK(std::memcmp(full.data() + i * c.Dv, one.data(), sizeof(float) * std::size_t(c.Dv)) == 0);
      CHECK(std::memcmp(stats.data() + i * width, s1.data(), sizeof(float) * std::size_t(width)) == 0);
      CHECK(ref[std::size_t(i)] == r1[0]);
    }
  }
}

TEST_CASE("bfloat16 units: operands small enough for the unit to flush go without it, within the bound",
          "[operator][bfloat16]") {
  // The units treat denormal inputs, products and partial sums as 0. With
  // q, k (or dO, v) of size 1e-19 every product q_d k_d (dO_d v_d) is below
  // 2^-126, so the unit's q·k (dP) would be exactly 0, and c = scale / τ of
  // 2e37 makes that an O(1) error in the scores (or in dQ, dK). Such rows
  // must go without the unit (row_eligibility, unit_flush_negligible; the
  // vector path forms (c q)·k and never flushes): forward and backward
  // within the units' bound of the header. (Before the check: out off by
  // 1.8 with max|v| 2.6, softmax dQ all zeros against max|dQ| 0.9.)
  const UnitTests units;
  if (units.list.empty()) return;
  use_mp_precision();
  const int kernel = GENERATE(0, 1);
  const int which = GENERATE(0, 1, 2);  // tiny q, k; tiny dO, v with q = 0; tiny q, k and τ = 1.2e-38
  Case<float> c;
  setup(c, 0, 0, kernel, 6060 + which);
  auto rng = rng_for(6070 + which);
  std::uniform_int_distribution<int> sign(0, 1);
  const auto tiny = [&](float& x) { x = sign(rng) ? 1e-19f : -1e-19f; };
  if (which == 1) {
    c.q.for_each([](float& x) { x = 0; });
    c.v.for_each(tiny);
    c.dout.for_each(tiny);
  } else {
    c.q.for_each(tiny);
    c.k.for_each(tiny);
  }
  if (which == 2) c.tau = 1.2e-38f;
  else c.scale = 2e37;
  round_inputs(c);
  const ReferenceRun ref(c);
  const auto& f = ref.f;
  const auto& g = ref.g;
  const GradTermScales& terms = ref.terms;
  const double u = std::ldexp(1.0, -8), eps_stencil = std::ldexp(1.0, -14);
  const double max_s = max_abs(f.scores);
  for (const auto unit : units.list) {
    units.select(unit);
    INFO("bfloat16" << unit_label() << " kernel " << kernel << " case " << which << " max|s| " << max_s);
    Bf16Call x(c);
    std::vector<float> lse, dtau;
    forward16(c, x, lse);
    backward16(c, x, dtau);
    const Error out = compare(x.o.contiguous(), f.out);
    record("forward out bfloat16" + unit_label() + " tiny operands", out.rel());
    CHECK(out.max_abs <= (forward_tolerance<float>(max_s, c.D) + u) * out.ref_scale +
                             (u + 2 * eps_stencil) * max_abs_of(c.v));
    const double btol = backward_tolerance<float>(max_s, c.D);
    const Error dq = compare(x.dq.contiguous(), g.grad_query), dk = compare(x.dk.contiguous(), g.grad_key),
                dv = compare(x.dv.contiguous(), g.grad_value);
    record("backward dQ bfloat16" + unit_label() + " tiny operands", dq.rel());
    check_unit_gradients(dq, dk, dv, btol, u, eps_stencil, terms);
    // A decode step (one query of batch 0 on every head, every key: a task of
    // a GQA group's 2 rows, which measures its rows' eligibility as it reads
    // the keys) goes without the unit where the full call did: the full
    // call's rows, bit for bit.
    for (const index_t i : {index_t(0), c.Lq - 1}) {
      continuum::ForwardArgs<bfloat16> a;
      copy_options(c, a);
      a.query = x.q.view;
      a.query.batch = 1;
      a.query.seq = 1;
      a.query.data = x.q.view.row(0, 0, i);
      a.key = x.k.view;
      a.value = x.v.view;
      a.key.batch = a.value.batch = 1;
      std::vector<bfloat16> o(std::size_t(c.Hq * c.Dv));
      std::vector<float> l(std::size_t(c.Hq));
      a.out = continuum::TensorView<bfloat16>::bhsd(o.data(), 1, c.Hq, 1, c.Dv);
      a.lse = l.data();
      continuum::attention_forward(continuum::cpu, a);
      for (index_t h = 0; h < c.Hq; ++h) {
        INFO("decode step of query " << i << ", head " << h);
        CHECK(std::memcmp(o.data() + h * c.Dv, x.o.view.row(0, h, i), sizeof(bfloat16) * std::size_t(c.Dv)) == 0);
        CHECK(std::memcmp(&l[std::size_t(h)], &lse[std::size_t(h * c.Lq + i)], sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("bfloat16 units: values with a common offset leave δ's error relative to v − v_ref",
          "[operator][bfloat16]") {
  // Every value row is 32 + a small part (bfloat16 steps of 1/4): dP_ij =
  // dO_i · v_j is dominated by dO_i · 32, the same for every key, while
  // h_ij = dP_ij − dP_i,ref is not. The row statistics' far sums take the
  // weights rounded to bfloat16 as o does, so Σ W̃_j (v_j − v_ref) must pair
  // each W̃_j with its own term (MATH.md §6): δ's error is then u Σ_j P_ij
  // |h_ij| (the header's δ term), not u Σ_j P_ij |dP_ij| (without the pairing
  // dQ's error here was 0.19 against a bound of 0.11; with it, 0.011).
  // Concentrated (τ = 0.1) so that the rounding errors of the few heavy
  // weights do not average out.
  const UnitTests units;
  if (units.list.empty()) return;
  use_mp_precision();
  const int kernel = GENERATE(0, 1);
  Case<float> c;
  setup(c, 3, 0, kernel, 7070);
  c.tau = 0.1f;
  c.v.for_each([](float& x) { x = 32.0f + std::round(4.0f * x) / 4.0f; });
  round_inputs(c);
  const ReferenceRun ref(c);
  const auto& f = ref.f;
  const auto& g = ref.g;
  const GradTermScales& terms = ref.terms;
  const double u = std::ldexp(1.0, -8), eps_stencil = std::ldexp(1.0, -14);
  const double max_s = max_abs(f.scores);
  for (const auto unit : units.list) {
    units.select(unit);
    const std::string label = "bfloat16" + unit_label() + " offset values";
    INFO(label << " kernel " << kernel << " max|s| " << max_s);
    Bf16Call x(c);
    std::vector<float> lse, dtau;
    forward16(c, x, lse);
    backward16(c, x, dtau);
    const double btol = backward_tolerance<float>(max_s, c.D);
    const Error dq = compare(x.dq.contiguous(), g.grad_query), dk = compare(x.dk.contiguous(), g.grad_key),
                dv = compare(x.dv.contiguous(), g.grad_value), dt = compare(dtau, g.grad_temperature);
    record("backward dQ " + label, dq.rel());
    record("backward dK " + label, dk.rel());
    record("backward dtau " + label, dt.rel());
    check_unit_gradients(dq, dk, dv, btol, u, eps_stencil, terms);
    CHECK(dt.max_abs <= (btol + 12 * eps_stencil) * std::max(dt.ref_scale, 1e-300));
  }
}

TEST_CASE("bfloat16 units: a backward whose P or dS is a bfloat16 denormal, or whose c·dS is near overflow",
          "[operator][bfloat16]") {
  // A reviewer's inputs (batch 1, one head, bfloat16 values). (a) scale 1e-37
  // with q ~ 1e19: c·dS ~ 2e-39 is a bfloat16 denormal, which the unit reads
  // as 0 (dK came out 0 against ~1e-19). (b) a far key (score −69) and
  // dO = 5e-9: dS ~ 1e-39 (dQ came out 0). (c) scale 1e19 with |dS| ~ 4e20:
  // c·dS overflows float (dK came out ±inf and NaN). Each must match the
  // reference within the units' bound (header): (a), (b) by the denormal
  // elements' terms added in float after the unit's sum
  // (accumulate_backward_bf16), (c) by the row's going to double
  // (row_eligibility).
  const UnitTests units;
  if (units.list.empty()) return;
  use_mp_precision();
  struct Input {
    index_t Lq, Lk, D, Dv;
    double scale;
    std::vector<float> q, k, v, dout;
  };
  const std::vector<Input> inputs = {
      {4, 3, 1, 2, 1e-37, {1e19f, -1e19f, 5e18f, 1e19f}, {0, 1e18f, 2e18f}, {1e18f, 0, 1e18f, 1, 1e18f, -2},
       {0, 0.1f, 0, 0.1f, 0, 0.1f, 0, 0.1f}},
      {4, 2, 2, 1, 1, {1e-16f, 0, 1e-16f, 0, 1e-16f, 0, 1e-16f, 0}, {0, 0, -69e16f, 1e19f}, {1, -1},
       {5e-9f, 5e-9f, 5e-9f, 5e-9f}},
      {1, 2, 2, 2, 1e19, {1e-17f, 0}, {0.01f, 0, 0, 0.01f}, {2e10f, 0, -2e10f, 0}, {1e10f, 0}},
  };
  const int which = GENERATE(0, 1, 2);
  const int kernel = GENERATE(0, 1);
  const Input& in = inputs[std::size_t(which)];
  Case<float> c;
  c.B = c.Hq = c.Hk = 1;
  c.Lq = in.Lq;
  c.Lk = in.Lk;
  c.D = in.D;
  c.Dv = in.Dv;
  c.scale = in.scale;
  c.tau = 1.0f;
  c.kernel = kernel == 0 ? continuum::Kernel::continuum : continuum::Kernel::softmax;
  c.alloc();
  const auto put = [](Tensor<float>& t, const std::vector<float>& x, index_t L, index_t n) {
    for (index_t i = 0; i < L; ++i)
      for (index_t d = 0; d < n; ++d) t.view.row(0, 0, i)[d] = x[std::size_t(i * n + d)];
  };
  put(c.q, in.q, in.Lq, in.D);
  put(c.k, in.k, in.Lk, in.D);
  put(c.v, in.v, in.Lk, in.Dv);
  put(c.dout, in.dout, in.Lq, in.Dv);
  round_inputs(c);
  const ReferenceRun ref(c);
  const auto& f = ref.f;
  const auto& g = ref.g;
  const GradTermScales& terms = ref.terms;
  const double u = std::ldexp(1.0, -8), eps_stencil = std::ldexp(1.0, -14);
  const double btol = backward_tolerance<float>(max_abs(f.scores), c.D);
  for (const auto unit : units.list) {
    units.select(unit);
    INFO("bfloat16" << unit_label() << " input " << which << " kernel " << kernel);
    Bf16Call x(c);
    std::vector<float> lse, dtau;
    forward16(c, x, lse);
    backward16(c, x, dtau);
    const Error dq = compare(x.dq.contiguous(), g.grad_query), dk = compare(x.dk.contiguous(), g.grad_key),
                dv = compare(x.dv.contiguous(), g.grad_value);
    INFO("dQ " << dq.max_abs << "/" << dq.ref_scale << " dK " << dk.max_abs << "/" << dk.ref_scale << " dV "
               << dv.max_abs << "/" << dv.ref_scale);
    // (+ float's smallest denormal: input (b)'s dK is ~4e-54, which no float
    // holds; the float call gives 0 too.)
    const double floor = std::numeric_limits<float>::denorm_min();
    check_unit_gradients(dq, dk, dv, btol, u, eps_stencil, terms, floor);
    // Element by element (MATH.md §10): each moves by at most u times the sum
    // of the sizes of its own terms beyond the float bound — dK_j[d]:
    // Σ_i |c dS_ij| |q_i[d]|, dQ_i[d]: c Σ_j |dS_ij| |k_j[d]|, dV_j[d]:
    // Σ_i P_ij |dO_i[d]|. (A term whose A side the unit reads as 0 is added
    // in float from its unrounded value; rounding it to a bfloat16 denormal
    // first gave input (a)'s dK errors of 6.0e-22 to 8.5e-22 against these
    // tolerances of 1.3e-22 to 1.6e-22 on AVX512-BF16.)
    const auto ld = [](const mp& x) { return static_cast<double>(to_ld(x)); };
    const double cc = in.scale;  // τ = 1
    const auto elem = [&](const std::vector<float>& got, const auto& ref, index_t n, index_t w, auto&& term_sum,
                          const char* name, double scale_tol) {
      for (index_t r = 0; r < n; ++r)
        for (index_t d = 0; d < w; ++d) {
          const double err = std::fabs(double(got[std::size_t(r * w + d)]) - ld(ref[std::size_t(r * w + d)]));
          const double tol = scale_tol + u * term_sum(r, d) + floor;
          INFO(name << "[" << r << "][" << d << "] error " << err << " tolerance " << tol);
          CHECK(err <= tol);
        }
    };
    const auto P = [&](index_t i, index_t j) { return ld(ref.f.probs[std::size_t(i * in.Lk + j)]); };
    const auto dS = [&](index_t i, index_t j) { return ld(ref.g.grad_scores[std::size_t(i * in.Lk + j)]); };
    const auto at = [](const Tensor<float>& t, index_t i, index_t d) { return double(t.view.row(0, 0, i)[d]); };
    elem(x.dk.contiguous(), g.grad_key, in.Lk, in.D, [&](index_t j, index_t d) {
      double t = 0;
      for (index_t i = 0; i < in.Lq; ++i) t += std::fabs(cc * dS(i, j)) * std::fabs(at(c.q, i, d));
      return t;
    }, "dK", btol * dk.ref_scale);
    elem(x.dq.contiguous(), g.grad_query, in.Lq, in.D, [&](index_t i, index_t d) {
      double t = 0;
      for (index_t j = 0; j < in.Lk; ++j) t += std::fabs(dS(i, j)) * std::fabs(at(c.k, j, d));
      return std::fabs(cc) * t;
    }, "dQ", btol * dq.ref_scale);
    elem(x.dv.contiguous(), g.grad_value, in.Lk, in.Dv, [&](index_t j, index_t d) {
      double t = 0;
      for (index_t i = 0; i < in.Lq; ++i) t += P(i, j) * std::fabs(at(c.dout, i, d));
      return t;
    }, "dV", btol * dv.ref_scale);
  }
}

TEST_CASE("bfloat16 units: data a gradient element cannot see changes none of its bits, flushed or denormal",
          "[operator][bfloat16][masking]") {
  // Softmax, scale 1, τ 1, bfloat16 values. The unit flushes a denormal
  // partial sum to −0; the 0 · x terms of data the element cannot see (keys
  // its row does not see, for dQ; rows that do not see its key, for dK and
  // dV) come after it, and x's sign would decide the zero's sign. Each
  // section runs variants that change only such data; the element must keep
  // its bits, rounding to nearest and downward (where −0 + 0 is −0). Both
  // sums are exact in float: the float call gives a denormal of about 2^-130.
  const UnitTests units;
  if (units.list.empty()) return;
  Case<float> c;
  c.B = c.Hq = c.Hk = 1;
  c.D = 2;
  c.Dv = 1;
  c.scale = 1;
  c.tau = 1.0f;
  c.kernel = continuum::Kernel::softmax;
  const auto set = [](Tensor<float>& t, index_t i, std::vector<float> x) {
    for (std::size_t d = 0; d < x.size(); ++d) t.view.row(0, 0, i)[d] = x[d];
  };
  std::function<float(const Bf16Call&)> element;  // the element that must keep its bits
  std::vector<std::function<void()>> variants;    // each changes only data it cannot see
  bool nonzero = false;                           // the element is P_04·dO_0 ≈ 9e-39, not 0
  SECTION("dQ: keys the row cannot see") {
    // Row 0 sees keys 0 and 1: q0 = (0, 8), k0 = (1, 10), k1 = (1 + 2^-7, 0),
    // so P1 ≈ e^-80; v0 = 1, v1 = 1 − 2^-8, dO_0 = 1: dS_00 = −dS_01 ≈ 2^-123,
    // and dQ_0[0] = dS_01 (1 + 2^-7) + dS_00 = −dS_00·2^-7 is a denormal. Row
    // 1 sees keys 2…31 (k_j[0] = −1, so 0·k_j[0] = −0); key 31's k[0] is ±1.
    c.Lq = 2;
    c.Lk = 32;
    c.alloc();
    c.range_lo = {0, 2};
    c.range_hi = {2, 32};
    set(c.q, 0, {0, 8});
    set(c.q, 1, {0.5f, 0.25f});
    set(c.dout, 0, {1});
    set(c.dout, 1, {0.5f});
    set(c.k, 0, {1, 10});
    set(c.k, 1, {1 + std::ldexp(1.0f, -7), 0});
    set(c.v, 0, {1});
    set(c.v, 1, {1 - std::ldexp(1.0f, -8)});
    for (index_t j = 2; j < c.Lk; ++j) {
      set(c.k, j, {-1, 0.125f * float(j % 4)});
      set(c.v, j, {0.25f * float(j % 3)});
    }
    element = [](const Bf16Call& x) { return float(x.dq.view.row(0, 0, 0)[0]); };
    variants = {[&] { c.k.view.row(0, 0, 31)[0] = 1; }, [&] { c.k.view.row(0, 0, 31)[0] = -1; }};
  }
  SECTION("dV: rows that cannot see the key") {
    // Rows 0 and 1 see keys 0 and 1: q = (0, 8.625), k0 = (0, 10), k1 = 0, so
    // P_i1 ≈ e^-86.25 ≈ 2^-124 in both rows; dO_0 = 1, dO_1 = −(1 + 2^-7):
    // dV_1 = P·(1 − 1 − 2^-7) is a denormal. Rows 2…63 see keys 2 and 3
    // (dO[0] = −1, so 0·dO[0] = −0); row 63's dO is ±1 (64 rows: the whole
    // query block, so no zero padding row comes after it), and row 63 also
    // sees key 4, whose weight there is a bfloat16 denormal (k4 = (−173, 0):
    // s − m = −87, P ≈ e^-87 / 1.78 ≈ 9e-39) or not (k4 = (−1, 0)): the unit
    // reads such a weight as 0, and its term must be added without changing
    // how dV_1 is computed.
    c.Lq = 64;
    c.Lk = 5;
    c.alloc();
    c.range_lo.assign(64, 2);
    c.range_hi.assign(64, 4);
    c.range_lo[0] = c.range_lo[1] = 0;
    c.range_hi[0] = c.range_hi[1] = 2;
    c.range_hi[63] = 5;
    set(c.k, 0, {0, 10});
    set(c.k, 1, {0, 0});
    set(c.k, 2, {1, 0});
    set(c.k, 3, {0, 1});
    for (index_t j = 0; j < c.Lk; ++j) set(c.v, j, {0.5f + 0.25f * float(j)});
    for (index_t i = 0; i < c.Lq; ++i) {
      set(c.q, i, i < 2 ? std::vector<float>{0, 8.625f} : std::vector<float>{0.5f, 0.25f});
      set(c.dout, i, {i == 0 ? 1.0f : i == 1 ? -(1 + std::ldexp(1.0f, -7)) : -1.0f});
    }
    element = [](const Bf16Call& x) { return float(x.dv.view.row(0, 0, 1)[0]); };
    const auto row63 = [&](float dout, float k4) {
      c.dout.view.row(0, 0, 63)[0] = dout;
      set(c.k, 4, {k4, 0});
    };
    variants = {[=] { row63(1, -1); }, [=] { row63(-1, -1); }, [=] { row63(-1, -173); }, [=] { row63(1, -173); }};
  }
  SECTION("dV: a weight the unit reads as 0, and a later query block") {
    // Row 0 sees keys 2…4 (q0 = (0.5, 0.25), k4 = (−173, 0): P_04 ≈ 9e-39,
    // which the unit reads as 0; dO_0 = 1), so dV_4 = P_04 is a float denormal
    // added apart from the unit's sums. Row 64 sees only key 3, and whether
    // the second query block (rows 64…127) makes a pass of the unit over the
    // key tile depends on it: with q_64 NaN (row 64's own outputs then NaN)
    // it does not. dV_4 must not depend on it (a later pass flushed the
    // denormal when the term was added into the unit's accumulator).
    c.Lq = 128;
    c.Lk = 5;
    c.alloc();
    c.range_lo.assign(128, 0);
    c.range_hi.assign(128, 0);
    c.range_lo[0] = 2;
    c.range_hi[0] = 5;
    c.range_lo[64] = 3;
    c.range_hi[64] = 4;
    set(c.k, 2, {1, 0});
    set(c.k, 3, {0, 1});
    set(c.k, 4, {-173, 0});
    for (index_t j = 0; j < c.Lk; ++j) set(c.v, j, {0.5f + 0.25f * float(j)});
    for (index_t i = 0; i < c.Lq; ++i) {
      set(c.q, i, {0.5f, 0.25f});
      set(c.dout, i, {1});
    }
    element = [](const Bf16Call& x) { return float(x.dv.view.row(0, 0, 4)[0]); };
    nonzero = true;
    variants = {[&] { set(c.q, 64, {0.5f, 0.25f}); },
                [&] { set(c.q, 64, {std::numeric_limits<float>::quiet_NaN(), 0.25f}); }};
  }
  round_inputs(c);
  struct Mode {
    const char* name;
    int round;
  };
  for (const Mode mode : {Mode{"to nearest", FE_TONEAREST}, Mode{"downward", FE_DOWNWARD}})
    for (const auto unit : units.list) {
      units.select(unit);
      std::vector<float> got;
      for (const auto& variant : variants) {
        variant();
        Bf16Call x(c);
        std::vector<float> lse, dtau;
        const int restore = std::fegetround();
        REQUIRE(std::fesetround(mode.round) == 0);
        forward16(c, x, lse);
        backward16(c, x, dtau);
        std::fesetround(restore);
        got.push_back(element(x));
        INFO("bfloat16" << unit_label() << ", rounding " << mode.name << ", variant " << got.size() - 1
                        << ": element " << got.back());
        CHECK(std::fabs(got.back()) < 1e-37f);  // 0, or the float call's denormal
        if (nonzero) CHECK(got.back() != 0.0f);
        CHECK(bitwise_equal(std::vector<float>{got.back()}, std::vector<float>{got.front()}));
      }
    }
}

TEST_CASE("bfloat16 units: a decode step over a split KV cache (GQA, chunk halos, a window) within the bound",
          "[operator][bfloat16]") {
  // One query on 8 heads over 2 KV heads and 2·2048 + 37 keys: the forward
  // splits the keys into 3 chunks (each chunk's first tile takes its halo
  // score on the unit), reads K and V as stored, and packs each tile for the
  // unit. Against the double reference: the float bound, one output rounding,
  // W̃'s u · max|v| and the bf16 stencil's 2ε · max|v| (header).
  const UnitTests units;
  if (units.list.empty()) return;
  const int kernel = GENERATE(0, 1);
  const int window = GENERATE(0, 1);
  Case<float> c;
  c.B = 1;
  c.Hq = 8;
  c.Hk = 2;
  c.Lq = 1;
  c.Lk = 2 * 2048 + 37;
  c.D = 24;  // not a multiple of the units' 32-element depth step
  c.Dv = 20;  // nor of their 16-column output blocks
  c.pad = 3;
  c.vis.causal = true;
  if (window) c.vis.window_left = 3000;  // keys [1132, 4133): chunk 0 in part, 1, 2
  c.kernel = kernel == 0 ? continuum::Kernel::continuum : continuum::Kernel::softmax;
  c.tau = 0.3f;
  c.alloc();
  auto rng = rng_for(5151 + window);
  c.fill_uniform(rng, -2, 2);
  round_inputs(c);
  const auto f = continuum::reference::forward(c.problem<double>());
  const double u = std::ldexp(1.0, -8), eps_stencil = std::ldexp(1.0, -14);
  for (const auto unit : units.list) {
    units.select(unit);
    INFO("bfloat16" << unit_label() << " kernel " << kernel << " window " << window);
    Bf16Call x(c);
    std::vector<float> lse;
    forward16(c, x, lse);
    const Error out = compare(x.o.contiguous(), f.out), l = compare(lse, f.lse);
    record("forward out bfloat16" + unit_label() + " split decode", out.rel());
    CHECK(out.max_abs <= (forward_tolerance<float>(max_abs(f.scores), c.D) + u) * out.ref_scale +
                             (u + 2 * eps_stencil) * max_abs_of(c.v));
    CHECK(l.max_abs <= forward_tolerance<float>(max_abs(f.scores), c.D) * std::max(1.0, l.ref_scale) + eps_stencil);
  }
}

TEST_CASE("bfloat16 units: a decode step measures its rows' eligibility where it reads its keys",
          "[operator][bfloat16]") {
  // A task of a few rows (all of a head group's: a decode step) measures the
  // magnitudes of the keys its rows see as it reads each tile (measure_keys)
  // and drops the rows the float kernels do not take at the end, so on a unit
  // it has packed the keys of rows it will not write. Those must change no
  // other row: a key whose value holds a NaN is packed as zeros (a row beside
  // it adds 0 · v for it, which a NaN would make NaN), a value row of 1e29 (a
  // row that sees it goes to double) adds an exact 0.
  //
  // Block: 4 query rows of 4 query heads on 2 KV heads (tasks of 8 rows),
  // causal over t0 + 4 keys; in KV head 1, key t0 + 2's value row is 1e29
  // (rows 2 and 3 see it) and key t0 + 3's value holds a NaN (row 3 sees it):
  // row 3 is NaN, row 2 the Compute::float64 call's row, rows 0 and 1 stay on
  // the unit. Every row must be the full causal forward's (row blocks of 64:
  // row_eligibility's states), bit for bit. t0 = kBc − 2 puts the last two
  // rows' ends in the next key tile.
  const UnitTests units;
  if (units.list.empty()) return;
  const int kernel = GENERATE(0, 1);
  const index_t kBc = continuum::cpu_detail::tiled::kBc;
  const index_t t0 = GENERATE_COPY(index_t(100), kBc - 2);
  const index_t Hq = 4, n = kBc + 44, D = 16, rows = 4;
  Case<float> full;
  full.Hq = Hq;
  full.Hk = 2;
  full.Lq = full.Lk = n;
  full.D = full.Dv = D;
  full.vis.causal = true;
  full.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  full.tau = 0.3f;
  full.alloc();
  auto rng = rng_for(6161);
  full.fill_uniform(rng);
  for (index_t d = 0; d < D; ++d) full.v.view.row(0, 1, t0 + 2)[d] = 1e29f;
  full.v.view.row(0, 1, t0 + 3)[5] = std::numeric_limits<float>::quiet_NaN();
  round_inputs(full);
  for (const auto unit : units.list) {
    units.select(unit);
    Bf16Call x(full);
    std::vector<float> full_lse;
    forward16(full, x, full_lse);
    const std::vector<float> full_o = x.o.contiguous();
    std::vector<float> out[2], lse[2];
    for (int exact : {0, 1}) {
      continuum::ForwardArgs<bfloat16> a;
      copy_options(full, a);
      a.compute = exact ? continuum::Compute::float64 : continuum::Compute::automatic;
      a.query = x.q.view;
      a.query.data = x.q.view.row(0, 0, t0);
      a.query.seq = rows;
      a.key = x.k.view;
      a.value = x.v.view;
      a.key.seq = a.value.seq = t0 + rows;
      std::vector<bfloat16> o(std::size_t(Hq * rows * D), bfloat16(0.0f));
      lse[exact].assign(std::size_t(Hq * rows), 0.f);
      a.out = continuum::TensorView<bfloat16>::bhsd(o.data(), 1, Hq, rows, D);
      a.lse = lse[exact].data();
      continuum::attention_forward(continuum::cpu, a);
      for (const bfloat16 y : o) out[exact].push_back(float(y));
    }
    for (index_t h = 0; h < Hq; ++h)
      for (index_t i = 0; i < rows; ++i) {
        INFO("bfloat16" << unit_label() << " kernel " << kernel << ", t0 " << t0 << ", head " << h << ", row " << i);
        const std::size_t at = std::size_t((h * rows + i) * D), row = std::size_t(h * rows + i);
        CHECK(std::memcmp(&out[0][at], full_o.data() + (h * n + t0 + i) * D, std::size_t(D) * sizeof(float)) == 0);
        CHECK(std::memcmp(&lse[0][row], &full_lse[std::size_t(h * n + t0 + i)], sizeof(float)) == 0);
        const bool nan_row = h >= 2 && i == 3, declined = h >= 2 && i == 2;
        CHECK(std::isnan(out[0][at]) == nan_row);
        CHECK(std::isnan(lse[0][row]) == nan_row);
        if (!nan_row) CHECK(std::isfinite(out[0][at]));
        if (declined) CHECK(std::memcmp(&out[0][at], &out[1][at], std::size_t(D) * sizeof(float)) == 0);
      }
  }
}

TEST_CASE("bfloat16 units: a split decode step measures its rows' eligibility chunk by chunk",
          "[operator][bfloat16]") {
  // Over 2·kSplitKeys + 37 cached keys (three chunks, each a task that
  // measures what its rows see), batch 0's KV head 0 has a NaN in key 5's
  // value (its rows are NaN), its KV head 1 a value row of 1e29 at key 3000 in
  // the second chunk (its rows go to double: the Compute::float64 call's rows,
  // bit for bit); batch 1 sees keys [100, Lk) and has a NaN in key 50's value,
  // which it cannot see: its rows are those of the same call without that
  // NaN. Bitwise the same on 1, 2 and 3 threads.
  using continuum::cpu_detail::tiled::kSplitKeys;
  const UnitTests units;
  if (units.list.empty()) return;
  const int kernel = GENERATE(0, 1);
  const index_t Lk = 2 * kSplitKeys + 37, Hq = 4, Dv = 8;
  const auto make = [&](Case<float>& c, int threads, bool hidden_nan, bool exact) {
    c.B = 2;
    c.Hq = Hq;
    c.Hk = 2;
    c.Lq = 1;
    c.Lk = Lk;
    c.D = 16;
    c.Dv = Dv;
    c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
    c.tau = 0.3f;
    c.range_lo = {0, 100};
    c.range_hi = {Lk, Lk};
    c.threads = threads;
    c.compute = exact ? continuum::Compute::float64 : continuum::Compute::automatic;
    c.alloc();
    auto rng = rng_for(929);
    c.fill_uniform(rng);
    c.v.view.row(0, 0, 5)[2] = std::numeric_limits<float>::quiet_NaN();
    for (index_t d = 0; d < Dv; ++d) c.v.view.row(0, 1, 3000)[d] = 1e29f;
    if (hidden_nan) c.v.view.row(1, 0, 50)[0] = std::numeric_limits<float>::quiet_NaN();
    round_inputs(c);
  };
  const auto run = [](Case<float>& c, std::vector<float>& lse) {
    Bf16Call x(c);
    forward16(c, x, lse);
    return x.o.contiguous();
  };
  for (const auto unit : units.list) {
    units.select(unit);
    Case<float> exact, clean;
    make(exact, 1, true, true);
    make(clean, 1, false, false);
    std::vector<float> exact_lse, clean_lse;
    const std::vector<float> exact_o = run(exact, exact_lse), clean_o = run(clean, clean_lse);
    std::vector<float> o1, l1;
    for (int threads : {1, 2, 3}) {
      Case<float> c;
      make(c, threads, true, false);
      std::vector<float> lse;
      const std::vector<float> o = run(c, lse);
      for (index_t h = 0; h < Hq; ++h) {
        INFO("bfloat16" << unit_label() << " kernel " << kernel << ", threads " << threads << ", head " << h);
        const std::size_t b0 = std::size_t(h * Dv), b1 = std::size_t((Hq + h) * Dv);
        if (h < 2) {  // batch 0, KV head 0: sees the NaN
          CHECK(std::isnan(o[b0]));
          CHECK(std::isnan(lse[std::size_t(h)]));
        } else {  // batch 0, KV head 1: declined to double
          CHECK(std::isfinite(o[b0]));
          CHECK(std::memcmp(&o[b0], &exact_o[b0], std::size_t(Dv) * sizeof(float)) == 0);
          CHECK(std::memcmp(&lse[std::size_t(h)], &exact_lse[std::size_t(h)], sizeof(float)) == 0);
        }
        CHECK(std::isfinite(o[b1]));  // batch 1: the hidden NaN changes nothing
        CHECK(std::memcmp(&o[b1], &clean_o[b1], std::size_t(Dv) * sizeof(float)) == 0);
        CHECK(std::memcmp(&lse[std::size_t(Hq + h)], &clean_lse[std::size_t(Hq + h)], sizeof(float)) == 0);
      }
      if (threads == 1) {
        o1 = o;
        l1 = lse;
      } else {
        CHECK(bitwise_equal(o, o1));
        CHECK(bitwise_equal(lse, l1));
      }
    }
  }
}

namespace {

/// Sends V (L keys × Dv columns of storage type S, one batch, one head)
/// through a softmax call with all scores 0 (q = k = 0, head_dim 1) on every
/// instruction set this CPU has but the bfloat16 units: a query that sees one key returns its
/// value (weight 1), one that sees two returns their mean, both exact in
/// float. Every output must be the bits of Eigen's scalar conversion of that
/// float (round to nearest even), except that −0 comes back +0 (the
/// accumulator starts at +0: 0 + 1·(−0) = +0). The bfloat16 units are left
/// out: their instructions flush denormal bfloat16 inputs to zero
/// (docs/MATH.md §10), which the units' case above bounds instead.
template <class S>
void check_exact_through_softmax(const std::vector<S>& v, index_t L, index_t Dv) {
  const char* type = std::is_same<S, bfloat16>::value ? "bfloat16" : "float16";
  std::vector<S> q(std::size_t(L), S(0.0f)), o(std::size_t(L * Dv));
  std::vector<float> lse(static_cast<std::size_t>(L));
  using CV = continuum::TensorView<const S>;
  const std::string what = std::string(type) + " conversions";
  for_each_vector_isa<S>(what.c_str(), "this build's kernels use a bfloat16 unit, which flushes denormal inputs",
                         [&] {
    for (const index_t right : {index_t(0), index_t(1)}) {
      continuum::ForwardArgs<S> a;
      a.query = CV::bhsd(q.data(), 1, 1, L, 1);
      a.key = CV::bhsd(q.data(), 1, 1, L, 1);
      a.value = CV::bhsd(v.data(), 1, 1, L, Dv);
      a.out = continuum::TensorView<S>::bhsd(o.data(), 1, 1, L, Dv);
      a.lse = lse.data();
      a.kernel = continuum::Kernel::softmax;
      a.visibility.window_left = 0;
      a.visibility.window_right = right;
      continuum::attention_forward(continuum::cpu, a);
      std::size_t wrong = 0;
      for (index_t i = 0; i < L; ++i)
        for (index_t d = 0; d < Dv; ++d) {
          const float x = float(v[std::size_t(i * Dv + d)]);
          // x/2 + y/2, not (x + y)/2, which overflows near bfloat16's largest
          // values; both halves and their sum are exact in float.
          const float mean = right == 0 || i + 1 == L ? x : x / 2 + float(v[std::size_t((i + 1) * Dv + d)]) / 2;
          const S want = S(mean);  // Eigen, scalar, round to nearest even
          const S got = o[std::size_t(i * Dv + d)];
          const bool same = mean == 0.0f ? float(got) == 0.0f
                                         : Eigen::numext::bit_cast<std::uint16_t>(got) ==
                                               Eigen::numext::bit_cast<std::uint16_t>(want);
          if (!same && wrong++ < 5)
            UNSCOPED_INFO("row " << i << " column " << d << ": " << float(got) << " for " << mean);
        }
      INFO((right == 0 ? "one key: every value" : "two keys: ties between neighbours"));
      CHECK(wrong == 0);
    }
  });
}

}  // namespace

TEST_CASE("float16 storage: every finite float16 value goes through a call exactly, and ties round to even, "
          "on every instruction set",
          "[operator][float16]") {
  // V holds each of the 63 488 finite float16 values once, column d < 62 the
  // 1 024 consecutive bit patterns from d·1024 (negative values from column
  // 31): the one-key call widens and narrows every value, the two-key call
  // narrows a tie between neighbours at every key. The reference is Eigen's
  // scalar conversion as compiled here (without F16C); the kernels' F16C path
  // (avx2, avx512) must give the same bits. Dv = 64: columns 62 and 63 are
  // zeros, so that every value's column goes through F16C's eight-at-a-time
  // loop, none through the scalar tail only.
  constexpr index_t L = 1024, Dv = 64;
  const auto bits_at = [](index_t m) -> std::uint16_t {
    return std::uint16_t(m < 31 * 1024 ? m : m - 31 * 1024 + 0x8000);
  };
  std::vector<float16> v(std::size_t(L * Dv), float16(0.0f));
  for (index_t j = 0; j < L; ++j)
    for (index_t d = 0; d < 62; ++d)
      v[std::size_t(j * Dv + d)] = Eigen::numext::bit_cast<float16>(bits_at(d * 1024 + j));
  check_exact_through_softmax(v, L, Dv);
}

TEST_CASE("bfloat16 storage: every finite bfloat16 value goes through a call exactly, and ties round to even, "
          "on every instruction set but the bfloat16 units",
          "[operator][bfloat16]") {
  // Slot (key j, column d) of V holds the bit pattern d·1024 + j, or 0 where
  // that pattern is an infinity or NaN: all 65 280 finite bfloat16 values
  // once, each column through the vector widening (convert_n: sixteen at a
  // time on AVX-512, eight on AVX2 and SSE2; Dv = 64), none through the
  // scalar tail only.
  constexpr index_t L = 1024, Dv = 64;
  const auto finite = [](std::uint16_t b) { return (b & 0x7f80) != 0x7f80; };
  std::vector<bfloat16> v(std::size_t(L * Dv));
  for (index_t j = 0; j < L; ++j)
    for (index_t d = 0; d < Dv; ++d) {
      const auto b = std::uint16_t(d * 1024 + j);
      v[std::size_t(j * Dv + d)] = Eigen::numext::bit_cast<bfloat16>(finite(b) ? b : std::uint16_t(0));
    }
  check_exact_through_softmax(v, L, Dv);
}

TEST_CASE("bfloat16 storage: outputs a quarter, a half and three quarters of an ulp above every finite value round "
          "to nearest even, on every instruction set but the bfloat16 units",
          "[operator][bfloat16]") {
  // Each head has four keys and one query that sees them all with equal
  // weights (query and keys 0: every score 0), so that its output is the mean
  // of its four values, exact in float: (3a + b)/4 for every finite bfloat16
  // a, with b the value k = 1, 2, 3 bit patterns after a's (k ulps farther
  // from 0; b = a where that pattern is not finite or has the other sign) — a
  // quarter, a half or three quarters of an ulp beyond a, into the next
  // binade where a's mantissa is all ones. Its rounding to bfloat16
  // (convert_n, Dv = 64 columns: the compiler's vector loop in each
  // instruction set's kernels) must be Eigen's scalar one.
  // The rows 1 to 3 of each head see fewer keys and are not checked.
  constexpr index_t L = 4, Dv = 64;
  const auto finite = [](std::uint32_t b) { return b < 0x10000 && (b & 0x7f80) != 0x7f80; };
  std::vector<std::uint16_t> a_bits;
  for (std::uint32_t b = 0; b < 0x10000; ++b)
    if (finite(b)) a_bits.push_back(std::uint16_t(b));
  const index_t cases = index_t(3 * a_bits.size()), H = (cases + Dv - 1) / Dv;
  std::vector<bfloat16> q(std::size_t(H * L), bfloat16(0.0f)), v(std::size_t(H * L * Dv), bfloat16(0.0f)),
      o(std::size_t(H * L * Dv));
  std::vector<float> want(static_cast<std::size_t>(cases));
  for (index_t c = 0; c < cases; ++c) {
    const std::uint16_t a = a_bits[std::size_t(c / 3)];
    // (within a sign, consecutive patterns are consecutive values)
    const std::uint32_t b = a + std::uint32_t(c % 3 + 1);
    const bool b_ok = finite(b) && (b & 0x8000u) == (a & 0x8000u);
    const bfloat16 va = Eigen::numext::bit_cast<bfloat16>(a);
    const bfloat16 vb = b_ok ? Eigen::numext::bit_cast<bfloat16>(std::uint16_t(b)) : va;
    const index_t h = c / Dv, d = c % Dv;
    for (index_t j = 0; j < L; ++j) v[std::size_t((h * L + j) * Dv + d)] = j == 3 ? vb : va;
    // exact in float: each quarter (2^-133 / 4 = 2^-135 is still a float),
    // and their sum (four values within 3 ulps of each other)
    want[std::size_t(c)] = float(va) / 4 + float(va) / 4 + float(va) / 4 + float(vb) / 4;
  }
  std::vector<float> lse(static_cast<std::size_t>(H * L));
  using CV = continuum::TensorView<const bfloat16>;
  for_each_vector_isa<bfloat16>("bfloat16 rounding of outputs",
                                "this build's kernels use a bfloat16 unit, which flushes denormal inputs", [&] {
    continuum::ForwardArgs<bfloat16> fa;
    fa.query = CV::bhsd(q.data(), 1, H, L, 1);
    fa.key = CV::bhsd(q.data(), 1, H, L, 1);
    fa.value = CV::bhsd(v.data(), 1, H, L, Dv);
    fa.out = continuum::TensorView<bfloat16>::bhsd(o.data(), 1, H, L, Dv);
    fa.lse = lse.data();
    fa.kernel = continuum::Kernel::softmax;
    fa.visibility.window_left = 0;
    fa.visibility.window_right = 3;
    continuum::attention_forward(continuum::cpu, fa);
    std::size_t wrong = 0;
    for (index_t c = 0; c < cases; ++c) {
      const float x = want[std::size_t(c)];
      const bfloat16 got = o[std::size_t((c / Dv) * L * Dv + c % Dv)];
      const bool same = x == 0.0f ? float(got) == 0.0f
                                  : Eigen::numext::bit_cast<std::uint16_t>(got) ==
                                        Eigen::numext::bit_cast<std::uint16_t>(bfloat16(x));
      if (!same && wrong++ < 5) UNSCOPED_INFO("mean " << x << " (case " << c << "): " << float(got));
    }
    CHECK(wrong == 0);
  });
}

TEMPLATE_TEST_CASE("16-bit storage: every key value the float kernels take is widened exactly, on every instruction "
                   "set (the key tile's in-register widening)",
                   "[operator][bfloat16][float16]", bfloat16, float16) {
  // The forward widens a 16-bit key tile in registers as it transposes it
  // (tiled.hpp, load_float), and the magnitude pass reads 16-bit rows the
  // same way. Through a softmax call in which query i sees key i only
  // (window (0, 0)) and is the one-hot e_c (scale 1, τ 1), lse_i is the score
  // k_i[c] itself: m = s, l = e^0 = 1, and the score's multiply-adds add only
  // zeros to k_i[c]. So every key value must come back as lse, bit for bit
  // (−0 as +0). Keys hold every 16-bit pattern of magnitude below 64,
  // denormals included (rows of larger values would be declined to double,
  // whose path widens its own copies, see the conversion tests above), in
  // rows of head_dim 64 (whole vectors on every instruction set); 64 calls
  // move the one-hot column over all of them.
  using S = TestType;
  constexpr index_t L = 1024, D = 64;
  const std::uint16_t below64 = std::is_same<S, bfloat16>::value ? 0x4280 : 0x5400;  // the bits of 64
  std::vector<S> k(std::size_t(L * D), S(0.0f));
  std::size_t n = 0;
  for (std::uint32_t sign : {0u, 0x8000u})
    for (std::uint32_t b = 0; b < below64; ++b) k[n++] = Eigen::numext::bit_cast<S>(std::uint16_t(sign | b));
  REQUIRE(n <= k.size());
  std::vector<S> q(static_cast<std::size_t>(L * D)), v(static_cast<std::size_t>(L), S(1.0f)),
      o(static_cast<std::size_t>(L));
  std::vector<float> lse(static_cast<std::size_t>(L));
  using CV = continuum::TensorView<const S>;
  for_each_vector_isa<S>(storage_name<S>(), "this build's bfloat16 kernels use a bfloat16 unit, which flushes "
                         "denormal inputs", [&] {
    std::size_t wrong = 0;
    for (index_t shift = 0; shift < D; ++shift) {
      for (index_t i = 0; i < L; ++i)
        for (index_t d = 0; d < D; ++d) q[std::size_t(i * D + d)] = S((i + shift) % D == d ? 1.0f : 0.0f);
      continuum::ForwardArgs<S> a;
      a.query = CV::bhsd(q.data(), 1, 1, L, D);
      a.key = CV::bhsd(k.data(), 1, 1, L, D);
      a.value = CV::bhsd(v.data(), 1, 1, L, 1);
      a.out = continuum::TensorView<S>::bhsd(o.data(), 1, 1, L, 1);
      a.lse = lse.data();
      a.kernel = continuum::Kernel::softmax;
      a.scale = 1.0;
      a.visibility.window_left = 0;
      a.visibility.window_right = 0;
      continuum::attention_forward(continuum::cpu, a);
      for (index_t i = 0; i < L; ++i) {
        const float want = float(k[std::size_t(i * D + (i + shift) % D)]);
        const bool same = want == 0.0f ? lse[std::size_t(i)] == 0.0f
                                       : std::memcmp(&want, &lse[std::size_t(i)], sizeof want) == 0;
        if (!same && wrong++ < 5)
          UNSCOPED_INFO("key " << i << " column " << (i + shift) % D << ": lse " << lse[std::size_t(i)]
                               << " for the key value " << want);
      }
    }
    CHECK(wrong == 0);
  });
}

// The forward's row statistics handed to the backward (params.hpp RowStats)
// change no bit of the gradients: without them the backward computes the same
// ones with the same forward kernel (on the bfloat16 unit where the CPU has
// one: MATH.md §6).
TEST_CASE("16-bit storage: the forward's row statistics change no bit of the backward", "[operator][storage16]") {
  const int shape = GENERATE(0, 1, 3);
  const int kernel = GENERATE(0, 1);
  const int vis = GENERATE(0, 1);
  Case<float> c;
  setup<bfloat16>(c, shape, vis, kernel, std::uint64_t(5200 + 10 * shape + 2 * vis + kernel));
  Bf16Call x(c);
  const index_t rows = c.B * c.Hq * c.Lq;
  std::vector<float> values(std::size_t(rows * continuum::row_stats_width(c.dv_dim())), 0.0f), lse;
  std::vector<index_t> ref(std::size_t(rows), index_t(-7));
  forward16(c, x, lse, {values.data(), ref.data()});
  index_t with_ref = 0;
  for (index_t r : ref) with_ref += r >= 0;
  CHECK(with_ref > 0);
  std::vector<float> dtau;
  backward16(c, x, dtau);
  const auto dq = x.dq.contiguous(), dk = x.dk.contiguous(), dv = x.dv.contiguous();
  std::vector<float> dtau2;
  backward16(c, x, dtau2, continuum::RowStats<const float>{values.data(), ref.data()});
  INFO("shape " << shape << ", vis " << vis << ", kernel " << kernel << unit_label());
  CHECK(std::memcmp(dq.data(), x.dq.contiguous().data(), dq.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(dk.data(), x.dk.contiguous().data(), dk.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(dv.data(), x.dv.contiguous().data(), dv.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(dtau.data(), dtau2.data(), sizeof(float)) == 0);
}
