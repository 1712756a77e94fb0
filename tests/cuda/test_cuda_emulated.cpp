// tests/cuda/test_cuda_emulated.cpp — the CUDA backend's kernel bodies run on
// the host (tests/cuda/emulate.hpp) against the CPU backend in double
// (runner.hpp; tolerances in cases.hpp), with deliberately small and odd tile
// sizes so that every halo, partial tile, grid-stride and GQA path is
// crossed, and with the GPU's own tiles. Compiled by the host
// compiler: it runs on machines without a GPU, and it is what checks the
// kernels' index arithmetic here (the GPU test, test_cuda_attention.cu, repeats
// the same cases on a device).
#include <catch2/catch.hpp>
#include <mpreal.h>

#include "emulate.hpp"
#include <continuum/attention/reference.hpp>
#include <continuum/backends/cuda/arguments.cuh>

#include "runner.hpp"

namespace {

using namespace continuum;
using namespace cuda_detail;
using cuda_test::Case;

/// Host "device": memory is plain host memory; launches are emulated.
template <class E>
struct Emulator {
  int bm = 4, bn = 3, threads = 8;
  index_t grid_cap = 5;  // fewer blocks than work items: exercises the grid-stride loops
  std::vector<std::vector<unsigned char>> blocks;

  template <class T> T* upload(const std::vector<T>& h) {
    blocks.emplace_back(std::max<std::size_t>(1, h.size() * sizeof(T)));  // exact: ASan sees overruns
    if (!h.empty()) std::memcpy(blocks.back().data(), h.data(), h.size() * sizeof(T));
    return reinterpret_cast<T*>(blocks.back().data());
  }
  template <class T> std::vector<T> download(const T* p, std::size_t n) {
    return std::vector<T>(p, p + n);
  }
  index_t grid(index_t work) const { return std::max<index_t>(1, std::min(work, grid_cap)); }

  /// launch.cuh's check_device_arrays, with the check kernel emulated.
  template <class Args>
  void check_arrays(const char* fn, const Args& a, const AttentionShape& shape, double scale) {
    using A = accum_t<E>;
    const DeviceArrays<A> d = device_arrays<A>(a, shape, scale);
    if (d.count() == 0) return;
    const index_t blocks = std::min(device_check_blocks(d.count(), threads), grid_cap);
    std::vector<int> flags(static_cast<std::size_t>(2 * blocks), 0);
    emulate_launch(blocks, threads, 2 * threads * sizeof(int),
                   [&] { device_array_check_body<A>(d, flags.data()); });
    report_device_arrays(fn, flags, a.temperature, a.visibility, shape, d, scale,
                         [](void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); });
  }

  void forward(const ForwardArgs<E>& a) {
    using A = accum_t<E>;
    double scale = 1;
    const AttentionShape shape = validate_forward_device(a, &scale);
    check_arrays("attention_forward(cuda)", a, shape, scale);
    KernelParams<E, A> p = make_params<E, A>(a, shape, scale);
    p.out = a.out;
    p.lse_out = a.lse;
    p.bm = bm;
    p.bn = bn;
    if (p.B * p.Hq * p.Lq == 0) return;
    const std::size_t bytes = ForwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv);
    const index_t work = ((p.Lq + bm - 1) / bm) * p.B * p.Hq;
    if (a.kernel == Kernel::continuum)
      emulate_launch(grid(work), threads, bytes, [&] { forward_body<E, A, ContinuumStencil>(p); });
    else
      emulate_launch(grid(work), threads, bytes, [&] { forward_body<E, A, SoftmaxStencil>(p); });
  }

  template <class Stencil>
  void backward_with(KernelParams<E, accum_t<E>> p, accum_t<E>* grad_tau) {
    using A = accum_t<E>;
    using Role = typename BackwardShared<A>::Role;
    const index_t rows = p.B * p.Hq * p.Lq;
    std::vector<index_t> ref(static_cast<std::size_t>(rows));
    std::vector<A> ws(static_cast<std::size_t>(6 * rows));  // exact: ASan sees overruns
    p.row_ref = ref.data();
    p.row_shift = ws.data();
    p.row_norm = ws.data() + rows;
    p.row_dpref = ws.data() + 2 * rows;
    p.row_dl = ws.data() + 3 * rows;
    p.row_dsref = ws.data() + 4 * rows;
    p.row_dtau = grad_tau == nullptr ? nullptr
                 : p.tshape == TemperatureShape::per_query ? grad_tau : ws.data() + 5 * rows;
    const index_t q_work = ((p.Lq + bm - 1) / bm) * p.B * p.Hq;
    const std::size_t b0 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, Role::row_stats);
    emulate_launch(grid(q_work), threads, b0, [&] { row_stats_body<E, A, Stencil>(p); });
    const std::size_t b1 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, Role::query);
    emulate_launch(grid(q_work), threads, b1, [&] { dq_body<E, A, Stencil>(p); });
    const std::size_t b2 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, Role::key);
    emulate_launch(grid(((p.Lk + bn - 1) / bn) * p.B * p.Hk), threads, b2,
                   [&] { dkdv_body<E, A, Stencil>(p); });
    if (grad_tau != nullptr && p.tshape != TemperatureShape::per_query) {
      const index_t n_out = p.tshape == TemperatureShape::per_head ? p.Hq : 1;
      emulate_launch(grid(n_out), threads, threads * sizeof(A),
                     [&] { dtau_body<E, A>(p, grad_tau); });
    }
  }

  void backward(const BackwardArgs<E>& a) {
    using A = accum_t<E>;
    double scale = 1;
    const AttentionShape shape = validate_backward_device(a, &scale);
    check_arrays("attention_backward(cuda)", a, shape, scale);
    KernelParams<E, A> p = make_params<E, A>(a, shape, scale);
    p.dout = a.grad_out;
    p.dq = a.grad_query;
    p.dk = a.grad_key;
    p.dv = a.grad_value;
    p.bm = bm;
    p.bn = bn;
    if (p.B * p.Hq * p.Lq == 0 || p.Lk == 0) {  // as launch.cuh: zero gradients
      auto zero = [](auto& view) {
        for (index_t b = 0; b < view.batch; ++b)
          for (index_t h = 0; h < view.heads; ++h)
            for (index_t s = 0; s < view.seq; ++s)
              for (index_t d = 0; d < view.dim; ++d) view.row(b, h, s)[d] = 0;
      };
      zero(p.dq);
      zero(p.dk);
      zero(p.dv);
      if (a.grad_temperature) {
        const index_t n = p.tshape == TemperatureShape::scalar ? 1
                          : p.tshape == TemperatureShape::per_head ? p.Hq : p.B * p.Hq * p.Lq;
        for (index_t x = 0; x < n; ++x) a.grad_temperature[x] = 0;
      }
      return;
    }
    if (a.kernel == Kernel::continuum)
      backward_with<ContinuumStencil>(p, a.grad_temperature);
    else
      backward_with<SoftmaxStencil>(p, a.grad_temperature);
  }
};

struct ConvFloat {
  static float to(double x) { return float(x); }
  static double from(float x) { return x; }
  static constexpr double u = 0;
};
struct ConvDouble {
  static double to(double x) { return x; }
  static double from(double x) { return x; }
  static constexpr double u = 0;
};

template <class E, class Conv>
void check_case(const Case& c, double tol, int bm, int bn, int threads) {
  Emulator<E> ex;
  ex.bm = bm;
  ex.bn = bn;
  ex.threads = threads;
  const auto r = cuda_test::run_case<E, Conv>(c, ex, tol);
  INFO(c.name << " (bm " << bm << ", bn " << bn << ", threads " << threads << ")");
  CHECK(r.o <= 1);
  CHECK(r.lse <= 1);
  CHECK(r.dq <= 1);
  CHECK(r.dk <= 1);
  CHECK(r.dv <= 1);
  CHECK(r.dtau <= 1);
  CHECK(r.empty_rows_exact);
  CHECK(r.padding_untouched);
}

}  // namespace

TEST_CASE("emulated CUDA kernels equal the CPU backend (double storage, 1e-12)", "[cuda][emulated]") {
  for (const Case& c : cuda_test::standard_cases()) {
    check_case<double, ConvDouble>(c, 1e-12, 4, 3, 8);
    check_case<double, ConvDouble>(c, 1e-12, 5, 7, 16);
  }
}

TEST_CASE("emulated CUDA kernels: fp32 within the fp32 bound of the CPU backend in double", "[cuda][emulated]") {
  for (const Case& c : cuda_test::standard_cases()) check_case<float, ConvFloat>(c, 1e-5, 8, 8, 32);
}

TEST_CASE("emulated CUDA kernels are bitwise reproducible (W07 shape, reduced)", "[cuda][emulated]") {
  Case c;
  c.name = "W07 batch 2, heads 3, causal, 37 rows";
  c.B = 2; c.Hq = 3; c.Hk = 3; c.Lq = c.Lk = 37; c.D = 16; c.Dv = 16; c.causal = true;
  c.tshape = TemperatureShape::scalar;
  Emulator<float> ex;
  const auto first = cuda_test::run_case<float, ConvFloat>(c, ex, 1e-5);
  for (int run = 0; run < 3; ++run) {
    Emulator<float> ex2;
    const auto again = cuda_test::run_case<float, ConvFloat>(c, ex2, 1e-5);
    CHECK(again.bytes == first.bytes);
  }
}

TEST_CASE("the double reference's backward matches central finite differences", "[cuda][emulated]") {
  // Loss L = Σ dO ∘ o; dL/dq, dL/dk, dL/dv, dL/dτ by central differences (h = 1e-6).
  for (Kernel kern : {Kernel::continuum, Kernel::softmax}) {
    Case c;
    c.kernel = kern;
    c.B = 1; c.Hq = 2; c.Hk = 1; c.Lq = 4; c.Lk = 5; c.D = 3; c.Dv = 2;
    c.causal = true; c.tshape = TemperatureShape::per_head;
    auto in = cuda_test::make_inputs(c);
    const auto ref = cuda_test::reference(c, in);
    auto loss = [&](const cuda_test::Inputs& x) {
      const auto r = cuda_test::reference(c, x);
      double l = 0;
      for (index_t h = 0; h < c.Hq; ++h)
        for (index_t i = 0; i < c.Lq; ++i)
          for (index_t d = 0; d < c.Dv; ++d) l += x.dout.at(0, h, i, d) * r.o.at(0, h, i, d);
      return l;
    };
    const double step = 1e-6;
    auto fd = [&](double& slot) {
      const double keep = slot;
      slot = keep + step;
      const double lp = loss(in);
      slot = keep - step;
      const double lm = loss(in);
      slot = keep;
      return (lp - lm) / (2 * step);
    };
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i)
        for (index_t d = 0; d < c.D; ++d)
          CHECK(fd(in.q.at(0, h, i, d)) == Approx(ref.dq.at(0, h, i, d)).margin(1e-7));
    for (index_t j = 0; j < c.Lk; ++j) {
      for (index_t d = 0; d < c.D; ++d)
        CHECK(fd(in.k.at(0, 0, j, d)) == Approx(ref.dk.at(0, 0, j, d)).margin(1e-7));
      for (index_t d = 0; d < c.Dv; ++d)
        CHECK(fd(in.v.at(0, 0, j, d)) == Approx(ref.dv.at(0, 0, j, d)).margin(1e-7));
    }
    for (index_t h = 0; h < c.Hq; ++h) CHECK(fd(in.tau[h]) == Approx(ref.dtau[h]).margin(1e-7));
  }
}

TEST_CASE("emulated CUDA kernels with the GPU's own tile sizes (64x64 and 32x32, 128 threads)",
          "[cuda][emulated]") {
  // launch.cuh picks the largest of 64×64, 64×32, 32×32, … that fits the
  // device's shared memory, with block_size = 128 threads: run those exact
  // configurations on a case that spans several tiles in both directions.
  Case c;
  c.name = "GPU tiles: GQA 4/2, causal window 100, 150 x 170, D 40, per-head tau";
  c.B = 1; c.Hq = 4; c.Hk = 2; c.Lq = 150; c.Lk = 170; c.D = 40; c.Dv = 24;
  c.causal = true; c.window_left = 99; c.tshape = TemperatureShape::per_head;
  check_case<float, ConvFloat>(c, 1e-5, 64, 64, block_size);
  check_case<double, ConvDouble>(c, 1e-12, 32, 32, block_size);
}

namespace {

/// Bug case W12 (MATH.md appendix A) as tests/operator/test_bug_cases.cpp
/// poses it: Lq = 1, Lk = 5, D = Dv = 2, scale 1, scores at τ = 1 of
/// s¹ = (3, -2, 10, 6, -8) (maximum inside the row, gaps ≥ 1), v_j = (j+1, -j),
/// dO = (1, 0.5). As τ → 0, o → v_2 with neighbour weights O(τ), dτ → 1/12 and
/// dQ, dK = O(τ). Runs the emulated kernels in fp32 and returns, per
/// gradient, max|x − ref| / max|ref| against the 640-bit reference backward
/// (attention/reference.hpp).
struct W12Errors {
  double o = 0, dq = 0, dk = 0, dv = 0, dtau = 0;
};

W12Errors w12_emulated(double tau, int bm, int bn, int threads) {
  using mp = mpfr::mpreal;
  mp::set_default_prec(640);
  const index_t Lk = 5;
  std::vector<float> q = {1.0f, 0.0f}, k(2 * Lk), v(2 * Lk), dout = {1.0f, 0.5f};
  const double s1[5] = {3, -2, 10, 6, -8};
  for (index_t j = 0; j < Lk; ++j) {
    k[2 * j] = float(s1[j]);
    k[2 * j + 1] = 0.0f;
    v[2 * j] = float(j + 1);
    v[2 * j + 1] = float(-j);
  }
  std::vector<float> o(2, NAN), lse(1, NAN), dq(2, NAN), dk(2 * Lk, NAN), dv(2 * Lk, NAN), dtau(1, NAN);
  auto cv = [](const std::vector<float>& x, index_t S) {
    return TensorView<const float>{x.data(), 1, 1, S, 2, 2 * S, 2 * S, 2};
  };
  auto mv = [](std::vector<float>& x, index_t S) {
    return TensorView<float>{x.data(), 1, 1, S, 2, 2 * S, 2 * S, 2};
  };
  ForwardArgs<float> fa;
  fa.query = cv(q, 1);
  fa.key = cv(k, Lk);
  fa.value = cv(v, Lk);
  fa.out = mv(o, 1);
  fa.lse = lse.data();
  fa.scale = 1.0;
  fa.temperature.value = float(tau);
  Emulator<float> ex;
  ex.bm = bm;
  ex.bn = bn;
  ex.threads = threads;
  ex.forward(fa);
  BackwardArgs<float> ba;
  ba.query = fa.query;
  ba.key = fa.key;
  ba.value = fa.value;
  ba.out = cv(o, 1);
  ba.grad_out = cv(dout, 1);
  ba.lse = lse.data();
  ba.grad_query = mv(dq, 1);
  ba.grad_key = mv(dk, Lk);
  ba.grad_value = mv(dv, Lk);
  ba.grad_temperature = dtau.data();
  ba.scale = fa.scale;
  ba.temperature = fa.temperature;
  ex.backward(ba);

  // The reference is fed the very same float inputs (τ rounded to float too).
  const auto p = continuum::reference::from_args<mp>(fa);
  const auto r = continuum::reference::forward_row(p, 0, 0, 0);
  std::vector<mp> go = {mp(dout[0]), mp(dout[1])};
  const auto g = continuum::reference::backward(p, go);
  auto rel = [](const std::vector<float>& got, const std::vector<mp>& ref) {
    double err = 0, mag = 0;
    for (std::size_t x = 0; x < ref.size(); ++x) {
      const double e = ref[x].toDouble();
      if (!std::isfinite(got[x])) return double(INFINITY);
      err = std::max(err, std::abs(double(got[x]) - e));
      mag = std::max(mag, std::abs(e));
    }
    return err / mag;
  };
  W12Errors e;
  e.o = rel(o, r.out);
  e.dq = rel(dq, g.grad_query);
  e.dk = rel(dk, g.grad_key);
  e.dv = rel(dv, g.grad_value);
  e.dtau = rel(dtau, g.grad_temperature);
  return e;
}

}  // namespace

TEST_CASE("emulated CUDA backward, fp32, W12 tiny temperature: gradients match the 640-bit reference",
          "[cuda][emulated][W12]") {
  // Tolerance: the one tests/operator/test_bug_cases.cpp derives for W12 in
  // float. As τ → 0 every weight is a rational function of the gaps
  // Δs¹/τ, so a relative score error ε_s moves P by ≤ ε_s·max|s¹|/min Δs¹ =
  // 10 ε_s relative. The kernel's fp32 scores s = (c·q)·k, c = scale/τ, carry
  // ε_s ≤ 4ε (c, c·q, the two products, one sum; D = 2) ≤ 16·√D·ε, so the
  // forward bound is 16·√2·ε·(1 + 10) ≈ 3e-5 relative, and the backward gets
  // 64 × that (a few more roundings of the same sensitivity): 1.9e-3 of each
  // gradient's max-abs. Forming Dl_i = dO_i·o_i from the rounded o (MATH.md §6
  // literally) cannot meet it: dP_ij − Dl_i cancels to O(τ) at the maximal
  // key, so dS carries an absolute error ~ε·|dO||v| against dS ~ τ².
  const double eps = std::numeric_limits<float>::epsilon();
  const double fwd_tol = 16 * std::sqrt(2.0) * eps * 11, tol = 64 * fwd_tol;
  const double tau = GENERATE(1e-3, 1e-6, 1e-12, 1e-30);
  // Tiles: the whole row in one tile; and bn = 2 / 3, so that the maximal key
  // (2) and its neighbours (1, 3) and their neighbours (0, 4) straddle tiles.
  const int shape[][3] = {{8, 8, 32}, {4, 3, 8}, {1, 2, 4}};
  for (const auto& t : shape) {
    const W12Errors e = w12_emulated(tau, t[0], t[1], t[2]);
    INFO("tau " << tau << ", bm " << t[0] << ", bn " << t[1] << ": relative errors o " << e.o << ", dQ "
                << e.dq << ", dK " << e.dk << ", dV " << e.dv << ", dtau " << e.dtau << " (tol " << tol
                << ")");
    CHECK(e.o <= 5 * fwd_tol);
    CHECK(e.dv <= tol);
    // fp32 range limit (documented in docs/CUDA.md): the neighbour weights are
    // ~1/δ² with δ = gap/τ = 4/τ here; below τ ≈ 1e-19 they fall under
    // FLT_MIN and the row's dQ, dK, dτ flush to 0. Past it only finiteness
    // (MATH.md appendix A W12) and the errors' bound 1 (nothing larger than the truth).
    if (tau < 1e-19) {
      CHECK(e.dq <= 1);
      CHECK(e.dk <= 1);
      CHECK(e.dtau <= 1);
      continue;
    }
    CHECK(e.dq <= tol);
    CHECK(e.dk <= tol);
    CHECK(e.dtau <= tol);
  }
}

namespace {

/// Forward and backward of a small float problem (B = 2, Hq = 2, Lq = Lk = 7,
/// D = 3) on the emulator with the given temperature / ranges (host memory
/// plays the device arrays): each call's std::invalid_argument message, or ""
/// if it returned.
struct CheckOutcome {
  std::string forward, backward;
};

CheckOutcome run_with_arrays(const Temperature<float>& t, const index_t* lo, const index_t* hi) {
  const index_t B = 2, H = 2, L = 7, D = 3;
  std::vector<float> x(static_cast<std::size_t>(B * H * L * D), 0.5f), o(x.size()), go(x.size(), 1.0f);
  std::vector<float> dq(x.size()), dk(x.size()), dv(x.size()), lse(static_cast<std::size_t>(B * H * L));
  auto cv = [&](const std::vector<float>& v) {
    return TensorView<const float>{v.data(), B, H, L, D, H * L * D, L * D, D};
  };
  auto mv = [&](std::vector<float>& v) { return TensorView<float>{v.data(), B, H, L, D, H * L * D, L * D, D}; };
  ForwardArgs<float> fa;
  fa.query = fa.key = fa.value = cv(x);
  fa.out = mv(o);
  fa.lse = lse.data();
  fa.temperature = t;
  fa.visibility.range_lo = lo;
  fa.visibility.range_hi = hi;
  BackwardArgs<float> ba;
  ba.query = ba.key = ba.value = cv(x);
  ba.out = cv(o);
  ba.grad_out = cv(go);
  ba.lse = lse.data();
  ba.grad_query = mv(dq);
  ba.grad_key = mv(dk);
  ba.grad_value = mv(dv);
  ba.temperature = t;
  ba.visibility = fa.visibility;
  CheckOutcome r;
  Emulator<float> ex;
  ex.grid_cap = 2;  // 2 blocks of 8 threads for 28 τ values: the grid-stride loop runs twice
  try {
    ex.forward(fa);
  } catch (const std::invalid_argument& e) {
    r.forward = e.what();
  }
  try {
    ex.backward(ba);
  } catch (const std::invalid_argument& e) {
    r.backward = e.what();
  }
  return r;
}

}  // namespace

TEST_CASE("emulated CUDA: device-resident temperature and ranges are checked on the device",
          "[cuda][emulated][validation]") {
  using Catch::Contains;
  const index_t B = 2, H = 2, L = 7;
  SECTION("valid per-head / per-query temperature and ranges pass") {
    std::vector<float> th = {0.5f, 2.0f}, tq(static_cast<std::size_t>(B * H * L), 1.0f);
    std::vector<index_t> lo(static_cast<std::size_t>(B * L), 0), hi(lo.size(), L);
    hi[3] = 0;  // an empty row is allowed (lo == hi)
    const auto r1 = run_with_arrays({TemperatureShape::per_head, 1.0f, th.data()}, nullptr, nullptr);
    const auto r2 = run_with_arrays({TemperatureShape::per_query, 1.0f, tq.data()}, lo.data(), hi.data());
    CHECK(r1.forward.empty());
    CHECK(r1.backward.empty());
    CHECK(r2.forward.empty());
    CHECK(r2.backward.empty());
  }
  SECTION("per-head temperature <= 0, NaN or inf is rejected, naming the head") {
    for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
      std::vector<float> th = {0.5f, bad};
      const auto r = run_with_arrays({TemperatureShape::per_head, 1.0f, th.data()}, nullptr, nullptr);
      INFO("tau[1] = " << bad << ": " << r.forward);
      CHECK_THAT(r.forward, Contains("attention_forward(cuda)") && Contains("temperature[1] (per_head") &&
                                Contains("must be finite and > 0"));
      CHECK_THAT(r.backward, Contains("attention_backward(cuda)") && Contains("temperature[1] (per_head"));
    }
  }
  SECTION("per-query temperature: the last element (past the first blocks) is checked too") {
    std::vector<float> tq(static_cast<std::size_t>(B * H * L), 1.0f);
    tq.back() = -2.0f;
    const auto r = run_with_arrays({TemperatureShape::per_query, 1.0f, tq.data()}, nullptr, nullptr);
    CHECK_THAT(r.forward, Contains("temperature[1, 1, 6] (per_query"));
    CHECK_THAT(r.backward, Contains("temperature[1, 1, 6] (per_query"));
  }
  SECTION("a temperature whose scale / tau overflows the fp32 accumulator is rejected") {
    std::vector<float> th = {0.5f, 1e-40f};  // subnormal: scale/τ ≈ 5.8e39 > FLT_MAX, finite in double
    const auto r = run_with_arrays({TemperatureShape::per_head, 1.0f, th.data()}, nullptr, nullptr);
    CHECK_THAT(r.forward, Contains("temperature[1]") && Contains("overflows"));
    Temperature<float> ts;
    ts.value = 1e-40f;
    CHECK_THAT(run_with_arrays(ts, nullptr, nullptr).forward, Contains("temperature") && Contains("overflows"));
  }
  SECTION("ranges outside [0, Lk] or with lo > hi are rejected, naming the row") {
    struct Bad { index_t lo, hi; };
    for (Bad bad : {Bad{-1, 3}, Bad{0, L + 1}, Bad{4, 3}}) {
      std::vector<index_t> lo(static_cast<std::size_t>(B * L), 0), hi(lo.size(), L);
      lo[L + 5] = bad.lo;  // batch 1, query 5: the last block's part of the array
      hi[L + 5] = bad.hi;
      const auto r = run_with_arrays({}, lo.data(), hi.data());
      INFO("[" << bad.lo << ", " << bad.hi << "): " << r.forward);
      CHECK_THAT(r.forward, Contains("visibility.range_lo/range_hi[1, 5]") && Contains("need 0 <= lo <= hi <= Lk"));
      CHECK_THAT(r.backward, Contains("visibility.range_lo/range_hi[1, 5]"));
    }
  }
}

TEST_CASE("emulated CUDA kernels, fp32, long rows and columns: every sum over keys or queries is blocked",
          "[cuda][emulated][long]") {
  // W09's fault kind: the GPU test's row 46340 (46341 keys, D = 1) had dQ off
  // by 1.5e-5 of Σ_j |c dS_ij k_j|, because the backward's row statistics
  // (Z̃, Dl) were summed one key at a time into one fp32 running sum, whose
  // rounding grows like √n·u (u = 2^-24). A blocked sum (each tile of bn terms
  // summed on its own, then added once) grows like √(bn + n/bn)·u ≈ 1.7e-6 for
  // n = 46341, bn = 64. Each result is held to 1e-5 of its conditioning scale
  // Σ|terms| (cases.hpp's dq_abs, dk_abs, dv_abs, dtau_abs; Σ_j P_j |v_j| for
  // o; 1 + |lse| for lse): 6× the blocked sum's size, below the serial one's.
  // Part 1: one query over n keys (the sums over keys: o, Z̃, Dl, dQ, dτ);
  // part 2: n queries over two keys (the sums over queries: dK, dV).
  const index_t n = 46341;
  for (int part = 1; part <= 2; ++part) {
    Case c;
    c.Lq = part == 1 ? 1 : n;
    c.Lk = part == 1 ? n : 2;
    c.D = c.Dv = 1;
    c.seed = 9;
    cuda_test::Inputs in = cuda_test::make_inputs(c);
    for (cuda_test::Tensor* t : {&in.q, &in.k, &in.v, &in.dout})
      t->round_with([](double x) { return double(float(x)); });
    auto store = [](const cuda_test::Tensor& t) { return cuda_test::to_storage<float, ConvFloat>(t); };
    std::vector<float> q = store(in.q), k = store(in.k), v = store(in.v), go = store(in.dout);
    std::vector<float> o(std::size_t(c.Lq)), lse(std::size_t(c.Lq)), dq(std::size_t(c.Lq));
    std::vector<float> dk(std::size_t(c.Lk)), dv(std::size_t(c.Lk)), dtau(1);
    auto cv = [](const std::vector<float>& x, index_t S) { return TensorView<const float>::bhsd(x.data(), 1, 1, S, 1); };
    auto mv = [](std::vector<float>& x, index_t S) { return TensorView<float>::bhsd(x.data(), 1, 1, S, 1); };
    Emulator<float> ex;  // the GPU's tiles for D = 1 (launch.cuh's first candidate)
    ex.bm = 64;
    ex.bn = 64;
    ex.threads = 4;
    ex.grid_cap = 1 << 20;
    ForwardArgs<float> fa;
    fa.query = cv(q, c.Lq);
    fa.key = cv(k, c.Lk);
    fa.value = cv(v, c.Lk);
    fa.out = mv(o, c.Lq);
    fa.lse = lse.data();
    ex.forward(fa);
    BackwardArgs<float> ba;
    ba.query = fa.query;
    ba.key = fa.key;
    ba.value = fa.value;
    ba.out = cv(o, c.Lq);
    ba.grad_out = cv(go, c.Lq);
    ba.lse = lse.data();
    ba.grad_query = mv(dq, c.Lq);
    ba.grad_key = mv(dk, c.Lk);
    ba.grad_value = mv(dv, c.Lk);
    ba.grad_temperature = dtau.data();
    ex.backward(ba);

    const cuda_test::Outputs ref = cuda_test::reference<double>(c, in);
    const double tol = 1e-5;
    INFO("part " << part << " (Lq " << c.Lq << ", Lk " << c.Lk << ")");
    if (part == 1) {
      double o_abs = 0, z = 0;
      const double lse0 = ref.lse[0];
      for (index_t j = 0; j < n; ++j) {  // Σ_j P_j |v_j| from P_j = α_j / Z: |o| ≤ this
        const double s0 = j > 0 ? in.q.data[0] * in.k.data[j - 1] : -INFINITY;
        const double s2 = j + 1 < n ? in.q.data[0] * in.k.data[j + 1] : -INFINITY;
        const double a = continuum::ContinuumStencil::weight(s0 - lse0, in.q.data[0] * in.k.data[j] - lse0,
                                                             s2 - lse0, j > 0, j + 1 < n);
        z += a;
        o_abs += a * std::abs(in.v.data[j]);
      }
      INFO("o " << o[0] << " ref " << ref.o.data[0] << " | lse " << lse[0] << " ref " << lse0 << " | dq "
                << dq[0] << " ref " << ref.dq.data[0] << " scale " << ref.dq_abs.data[0] << " | dtau " << dtau[0]
                << " ref " << ref.dtau[0] << " scale " << ref.dtau_abs[0]);
      CHECK(std::abs(z - 1) < 1e-9);  // the weights above are P_j
      CHECK(std::abs(o[0] - ref.o.data[0]) <= tol * o_abs);
      CHECK(std::abs(lse[0] - lse0) <= tol * (1 + std::abs(lse0)));
      CHECK(std::abs(dq[0] - ref.dq.data[0]) <= tol * ref.dq_abs.data[0]);
      CHECK(std::abs(dtau[0] - ref.dtau[0]) <= tol * ref.dtau_abs[0]);
    } else {
      for (index_t j = 0; j < c.Lk; ++j) {
        INFO("key " << j << ": dk " << dk[j] << " ref " << ref.dk.data[j] << " scale " << ref.dk_abs.data[j]
                    << " | dv " << dv[j] << " ref " << ref.dv.data[j] << " scale " << ref.dv_abs.data[j]);
        CHECK(std::abs(dk[j] - ref.dk.data[j]) <= tol * ref.dk_abs.data[j]);
        CHECK(std::abs(dv[j] - ref.dv.data[j]) <= tol * ref.dv_abs.data[j]);
      }
    }
  }
}
