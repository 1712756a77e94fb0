// Run-time choice of the CPU kernels' instruction set (backends/cpu/dispatch.hpp,
// MATH.md §10, "Instruction sets"): every instruction set this CPU can run gives the reference's
// answer (forward and backward, both stencils, float and double, every
// visibility, GQA, tiles of several sizes) at the operator's tolerances, and
// the others are named as skipped. The rest of the test suite runs the set
// that cpu_dispatch chooses by default (the best this CPU has), and part of
// it again on the x86-64 baseline kernels (tests/CMakeLists.txt, ":isa=sse2").
#include <catch2/catch.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;

#if defined(CONTINUUM_CPU_DISPATCH)

namespace cd = continuum::cpu_dispatch;

namespace {

/// The instruction sets this CPU can run; the others are reported as skipped.
std::vector<cd::Isa> runnable() {
  std::vector<cd::Isa> out;
  for (int i = 0; i < cd::kIsaCount; ++i) {
    if (cd::supported(cd::Isa(i))) out.push_back(cd::Isa(i));
    else WARN("skipped: this CPU cannot run the " << cd::name(cd::Isa(i)) << " kernels");
  }
  return out;
}

/// Restores the default choice when a test section ends.
struct Restore {
  cd::Isa saved = cd::selected();
  ~Restore() { cd::select(saved); }
};

template <class T>
Case<T> random_case(continuum::Kernel kernel, int vis, index_t Lq, index_t Lk, index_t D, std::uint64_t salt) {
  Case<T> c;
  c.B = 1;
  c.Hq = 2;
  c.Hk = 1;  // GQA
  c.Lq = Lq;
  c.Lk = Lk;
  c.D = D;
  c.kernel = kernel;
  c.vis = visibility_code(vis);
  c.tshape = continuum::TemperatureShape::per_head;
  c.alloc();
  auto rng = rng_for(salt);
  c.fill_uniform(rng);
  random_temperatures(c, rng, 0.05, 2.0);
  return c;
}

}  // namespace

TEST_CASE("cpu_dispatch: the default is the best instruction set the CPU runs, AVX512-BF16 vectors on AMD only",
          "[operator][dispatch]") {
  int best = 0;
  for (int i = 0; i < cd::kIsaCount; ++i)
    if (cd::supported(cd::Isa(i))) best = i;
  const int supported = best;
  // AVX512-BF16's products outrun float FMA on AMD's cores only (Intel's run
  // vdpbf16ps at half float FMA's FLOP rate): elsewhere the default is avx512,
  // whose float kernels compute bfloat16. (The vendor from the compiler's
  // CPUID reading, not the library's.)
  __builtin_cpu_init();
  const bool amd = __builtin_cpu_is("amd");
  if (best == int(cd::Isa::avx512bf16) && !amd) best = int(cd::Isa::avx512);
  INFO("vendor AMD: " << amd << "; best supported " << cd::name(cd::Isa(supported)) << ", default expected "
                       << cd::name(cd::Isa(best)));
  CHECK(int(cd::automatic()) == best);
  const char* env = std::getenv("CONTINUUM_CPU_ISA");
  if (env != nullptr && *env != '\0') {
    CHECK(std::string(cd::name(cd::selected())) == env);
  } else {
    CHECK(int(cd::selected()) == best);
  }
  CHECK(cd::supported(cd::Isa::sse2));
  INFO("this CPU's kernels: " << cd::name(cd::selected()));
  CHECK(cd::parse("avx2") == cd::Isa::avx2);
  CHECK_THROWS_WITH(cd::parse("avx3"), Catch::Contains("unknown instruction set 'avx3'"));
  for (int i = 0; i < cd::kIsaCount; ++i)
    if (!cd::supported(cd::Isa(i))) CHECK_THROWS_WITH(cd::select(cd::Isa(i)), Catch::Contains("cannot run"));
}

TEMPLATE_TEST_CASE("cpu_dispatch: every runnable instruction set matches the reference", "[operator][dispatch]",
                   float, double) {
  use_mp_precision();
  Restore restore;
  const int vis = GENERATE(0, 1, 5);  // full, causal, a non-causal window
  const auto kernel = GENERATE(continuum::Kernel::continuum, continuum::Kernel::softmax);
  // A decode row and a block of rows, both over more than one key tile: the
  // forward's (512 keys), the backward's (128). (The MPFR reference dominates
  // the time: keep the blocks small.)
  const auto shape = GENERATE(std::make_pair(1, 150), std::make_pair(7, 150));
  const index_t forward_keys = continuum::cpu_detail::tiled::kBc + 22;
  for (cd::Isa isa : runnable()) {
    cd::select(isa);
    INFO("instruction set " << cd::name(isa));
    const std::uint64_t salt = std::uint64_t(vis * 100 + shape.first + 7 * shape.second) + (kernel == continuum::Kernel::softmax ? 5000 : 0);
    Case<TestType> f = random_case<TestType>(kernel, vis, shape.first, forward_keys, 16, salt);
    check_forward<mp>(f, std::string("dispatch ") + cd::name(isa));
    Case<TestType> b = random_case<TestType>(kernel, vis, shape.first, shape.second, 8, salt + 1);
    check_backward<mp>(b, std::string("dispatch ") + cd::name(isa));
  }
}

#else

TEST_CASE("cpu_dispatch: not built (header-only kernels of this TU's target)", "[operator][dispatch]") {
  WARN("skipped: this build has no run-time dispatch (CONTINUUM_CPU_DISPATCH off, or not x86-64 GCC/Clang); "
       "the kernels are compiled for " << continuum::cpu_detail::kCompiledIsa);
  CHECK(std::string(continuum::cpu_detail::kCompiledIsa).size() > 0);
}

#endif
