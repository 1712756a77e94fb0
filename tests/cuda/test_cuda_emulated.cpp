// tests/cuda/test_cuda_emulated.cpp — the CUDA backend's kernel bodies run on
// the host (tests/cuda/emulate.hpp) against the CPU backend in double
// (runner.hpp; tolerances in cases.hpp), with deliberately small and odd tile
// sizes so that every halo, partial tile, grid-stride and GQA path is
// crossed, and with the GPU's own tiles. Compiled by the host
// compiler: it runs on machines without a GPU, and it is what checks the
// kernels' index arithmetic here (the GPU test, test_cuda_attention.cu, repeats
// the same cases on a device).
#include <catch2/catch.hpp>

#include "emulate.hpp"
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

  void forward(const ForwardArgs<E>& a) {
    using A = accum_t<E>;
    double scale = 1;
    const AttentionShape shape = validate_forward_device(a, &scale);
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
    const index_t rows = p.B * p.Hq * p.Lq;
    std::vector<A> ws(static_cast<std::size_t>(4 * rows + 1));
    p.row_delta = ws.data();
    p.row_shift = ws.data() + rows;
    p.row_norm = ws.data() + 2 * rows;
    p.row_dtau = grad_tau == nullptr ? nullptr
                 : p.tshape == TemperatureShape::per_query ? grad_tau : ws.data() + 3 * rows;
    emulate_launch(grid((rows + threads - 1) / threads), threads, 0, [&] { delta_body<E, A>(p); });
    const std::size_t b0 = ForwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv);
    emulate_launch(grid(((p.Lq + bm - 1) / bm) * p.B * p.Hq), threads, b0,
                   [&] { forward_body<E, A, Stencil, true>(p); });
    const std::size_t b1 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, false);
    emulate_launch(grid(((p.Lq + bm - 1) / bm) * p.B * p.Hq), threads, b1,
                   [&] { dq_body<E, A, Stencil>(p); });
    const std::size_t b2 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, true);
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
    KernelParams<E, A> p = make_params<E, A>(a, shape, scale);
    p.o = a.out;
    p.dout = a.grad_out;
    p.lse_in = a.lse;
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
  c.causal = true; c.window = 100; c.tshape = TemperatureShape::per_head;
  check_case<float, ConvFloat>(c, 1e-5, 64, 64, block_size);
  check_case<double, ConvDouble>(c, 1e-12, 32, 32, block_size);
}
