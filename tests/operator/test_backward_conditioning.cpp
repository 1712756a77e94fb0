// The backward where cancellation bites: attention concentrated on one key
// (a score ahead of the others by 10, 100, 1000), adjacent scores nearly equal
// (gaps 1e-3 … 1e-12), τ from 1e-3 to 10, Lk = 1, 2, 3 and 5; one query row,
// against the 256-bit reference, for the tiled kernels (float_arithmetic =
// true, float and double) and the exact default. Every element of dQ, dK, dV
// and dτ is measured against its *own* size, not the tensor's maximum (dK of a
// key far behind the maximum is many orders below max|dK|):
//   rel = |op − ref| / max(|ref|, F_T),
// with the floor F_T = 1e-30 (float) / 1e-290 (double) for elements that are
// structurally (near) zero: the tiled kernels flush e^x to 0 below the normal
// range (x < −87.3 / −708.4), which drops terms of size ≤ e^{−87.3}·(products
// of the O(1e3) factors here) ≲ 1e-30 in float.
//
// Tolerance, derived rather than fitted. The scores the kernel forms carry an
// absolute error δs ≤ (D + 2) ε_T max|s| (the rounding of c = scale/τ, of c·q,
// and of a D-term dot product; D = 2 here). Every stencil weight and
// derivative is e^{s − m} times a moment of a score difference: the
// exponential turns δs into a relative error ≤ 2δs, and each moment (ν, μ1, μ2,
// κ, power laws of |a| for large gaps, smooth near 0) has a condition number
// ≤ 3 in its argument, turning δs into ≤ 3·2δs/|a|·|a| = 6δs relative. The
// reference-key form then combines these terms without cancellation (signs
// agree, or the cancelling part is computed directly), so each output carries
// ≤ 8 δs relative from the scores plus O(ε_T) per rounding of the ≤ 16
// remaining operations (sums over 5 keys, the products with q, k, dO):
//   tol = 8 (D + 2) ε_T (1 + max|s|) + 16 ε_T.
// A form that cancels (FlashAttention-2's Dl = dO·o) misses this by orders of
// magnitude: with a gap of 1000 its dK came out 8.7× the true value, and for
// gaps ≤ 1e-8 its float dτ had the wrong sign.
#include <catch2/catch.hpp>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;
using continuum::cpu_detail::tiled::kBc;

namespace {

template <class T>
double floor_of() {
  return sizeof(T) == sizeof(float) ? 1e-30 : 1e-290;
}

struct Worst {
  double rel = 0;
  std::size_t at = 0;
};

template <class T, class R>
Worst own_size_error(const std::vector<T>& op, const std::vector<R>& ref) {
  Worst w;
  for (std::size_t i = 0; i < op.size(); ++i) {
    const double r = static_cast<double>(to_ld(ref[i]));
    const double e = std::fabs(double(op[i]) - r) / std::max(std::fabs(r), floor_of<T>());
    if (!(e <= w.rel)) w = {e, i};  // NaN counts as the worst
  }
  return w;
}

/// One query over Lk keys, D = 2, scale 1: q = (1, 0) and k_j = (s_j τ, 0.1 + 0.2 j)
/// give the scores s_j exactly up to the rounding of s_j τ to T; the
/// reference is fed the very same rounded inputs.
template <class T>
void run_case(const std::vector<double>& scores, double tau, bool fa, const std::string& label) {
  use_mp_precision();
  Case<T> c;
  c.Lq = 1;
  c.Lk = index_t(scores.size());
  c.D = 2;
  c.Dv = 3;
  c.scale = 1.0;
  c.tau = T(tau);
  c.threads = 1;
  c.alloc();
  auto rng = rng_for(31337 + scores.size());
  c.fill_uniform(rng);
  c.q.at(0, 0, 0, 0) = T(1);
  c.q.at(0, 0, 0, 1) = T(0);
  for (index_t j = 0; j < c.Lk; ++j) {
    c.k.at(0, 0, j, 0) = T(scores[std::size_t(j)] * tau);
    c.k.at(0, 0, j, 1) = T(0.1 + 0.2 * double(j));  // distinct: dQ's second entry is not structurally 0
  }
  auto f = c.forward_args();
  f.compute = fa ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_forward(continuum::cpu, f);
  auto g = c.backward_args();
  g.compute = fa ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_backward(continuum::cpu, g);
  const auto p = c.template problem<mp>();
  const auto fr = continuum::reference::forward(p);
  const auto gr = continuum::reference::backward(p, c.template grad_out_ref<mp>());
  const double smax = max_abs(fr.scores);
  const double eps = harness::eps<T>();
  const double tol = 8.0 * double(c.D + 2) * eps * (1.0 + smax) + 16.0 * eps;
  const Worst dq = own_size_error(c.dq.contiguous(), gr.grad_query);
  const Worst dk = own_size_error(c.dk.contiguous(), gr.grad_key);
  const Worst dv = own_size_error(c.dv.contiguous(), gr.grad_value);
  const Worst dt = own_size_error(c.dtau, gr.grad_temperature);
  const std::string t = std::string(fa ? "tiled " : "exact ") + type_name<T>() + " " + label;
  record("own-size rel dQ " + t, dq.rel);
  record("own-size rel dK " + t, dk.rel);
  record("own-size rel dV " + t, dv.rel);
  record("own-size rel dtau " + t, dt.rel);
  INFO(t << " Lk " << c.Lk << " tau " << tau << " max|s| " << smax << " tol " << tol);
  INFO("dQ " << dq.rel << " at " << dq.at << ", dK " << dk.rel << " at " << dk.at << " (op "
             << c.dk.contiguous()[dk.at] << " ref " << to_ld(gr.grad_key[dk.at]) << "), dV " << dv.rel
             << ", dtau " << dt.rel << " (op " << c.dtau[0] << " ref " << to_ld(gr.grad_temperature[0]) << ")");
  CHECK(dq.rel <= tol);
  CHECK(dk.rel <= tol);
  CHECK(dv.rel <= tol);
  CHECK(dt.rel <= tol);
}

}  // namespace

TEMPLATE_TEST_CASE("backward: attention concentrated on one key", "[operator][tiled][conditioning]", float,
                   double) {
  const double gap = GENERATE(10.0, 100.0, 1000.0);
  const int lk = GENERATE(1, 2, 3, 5);
  const int at = GENERATE(0, 1);  // the leading key first or last
  const double tau = GENERATE(1e-3, 0.3, 10.0);
  const bool fa = GENERATE(true, false);
  std::vector<double> s(static_cast<std::size_t>(lk));
  std::mt19937_64 rng(std::uint64_t(lk * 7 + at));
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto& x : s) x = u(rng);
  s[at ? std::size_t(lk - 1) : 0] += gap;
  run_case<TestType>(s, tau, fa, "concentrated");
}

TEMPLATE_TEST_CASE("backward: nearly equal adjacent scores", "[operator][tiled][conditioning]", float, double) {
  const double gap = GENERATE(1e-3, 1e-6, 1e-8, 1e-10, 1e-12);
  const int lk = GENERATE(2, 3, 5);
  const double tau = GENERATE(1e-3, 0.3, 10.0);
  const bool fa = GENERATE(true, false);
  // Keys 0 and 1 at scores 0 and gap (exactly representable offsets from 0),
  // the others well below: the row maximum is the pair.
  std::vector<double> s(static_cast<std::size_t>(lk));
  for (int j = 2; j < lk; ++j) s[std::size_t(j)] = -0.5 * j;
  s[1] = gap;
  run_case<TestType>(s, tau, fa, "nearly equal");
}

// The backward's row statistics come from the forward, which finds the row
// maximum and its reference key tile by tile and keeps the reference key's
// near keys apart from its sums, handing them over whenever a later tile
// raises the maximum (MATH.md §6, "row statistics from the forward"). Here
// the maximum moves across the forward's key tiles of kBc = 512 keys: to the
// first key of the next tile, whose left neighbour — the previous tile's last
// key, held back — becomes a near key; from a reference
// that is itself that held-back last key; to an equal score later (the
// reference stays the first key at the maximum); by small gaps (the old keys
// keep most of the weight, so a wrong re-basing moves δ and dS_ref by O(1))
// and large ones, beyond float's and double's exp range (a weight taken at a
// running maximum that the next key exceeds would be e^{s − m} > 1, clamped
// wrong there). Checked against the 256-bit reference with the backward
// tolerance of every operator test; and, since that tolerance grows as
// (1 + max|s|)², dV on its own: for one query row dV_j = P_j dO, the forward's
// probability times dO, within the forward's tolerance (forward_tolerance,
// harness.hpp) of max|dV|.
TEMPLATE_TEST_CASE("backward: the row maximum moves across key tiles", "[operator][tiled][conditioning]", float,
                   double) {
  use_mp_precision();
  const auto kernel = GENERATE(continuum::Kernel::continuum, continuum::Kernel::softmax);
  const int pattern = GENERATE(0, 1, 2, 3);
  const double gap = GENERATE(0.25, 3.0, 30.0, 100.0, 1000.0);
  // (Softmax has no neighbour weights: beyond a gap of ~90 (float) or ~700
  // (double) every gradient underflows, and there is no halo to get wrong.)
  if (kernel == continuum::Kernel::softmax && gap > 30) return;
  const index_t tile = kBc;
  Case<TestType> c;
  c.kernel = kernel;
  c.Lq = 1;
  c.Lk = 2 * tile + 40;
  c.D = 2;
  c.Dv = 3;
  c.scale = 1.0;
  c.threads = 1;
  c.alloc();
  auto rng = rng_for(std::uint64_t(977 + pattern * 10 + int(gap)));
  c.fill_uniform(rng);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> s(static_cast<std::size_t>(c.Lk));
  for (auto& x : s) x = u(rng);
  const auto at = [&](index_t j) -> double& { return s[std::size_t(j)]; };
  switch (pattern) {
    case 0:  // the last key of tile 0, then the first of tile 1 (its neighbour), then tile 2
      at(tile - 1) = 2;
      at(tile) = 2 + gap;
      at(2 * tile + 5) = 2 + 2 * gap;
      break;
    case 1:  // early in tile 0, then the first key of tile 1
      at(10) = 2;
      at(tile) = 2 + gap;
      break;
    case 2:  // an equal score in a later tile: the reference stays the first
      at(5) = 2 + gap;
      at(tile + 3) = 2 + gap;
      break;
    default:  // rising through every tile, the last rise to the row's last key
      at(0) = 1;
      at(tile - 2) = 1 + gap / 4;
      at(tile + 1) = 1 + gap / 2;
      at(c.Lk - 1) = 1 + gap;
      break;
  }
  c.q.at(0, 0, 0, 0) = TestType(1);
  c.q.at(0, 0, 0, 1) = TestType(0);
  for (index_t j = 0; j < c.Lk; ++j) c.k.at(0, 0, j, 0) = TestType(at(j));
  const auto r = check_backward<mp>(c, "moving maximum");
  const double tol = forward_tolerance<TestType>(r.max_score, c.D);
  INFO("dV " << r.dv.max_abs << " of max|dV| " << r.dv.ref_scale << ", forward tolerance " << tol);
  CHECK(r.dv.max_abs <= tol * r.dv.ref_scale);
}
