// backends/cpu/dispatch.hpp — run-time choice of the instruction set of the CPU
// kernels (MATH.md §10, "Instruction sets"), for binaries built with the CMake target
// continuum::cpu_dispatch, which defines CONTINUUM_CPU_DISPATCH and links one
// object of kernels per instruction set (src/cpu_kernels.cpp compiled for
// x86-64, x86-64 + AVX2/FMA and x86-64 + AVX-512).
//
// A header-only user who compiles with -march=native gets the same kernels
// inline and needs none of this: attention_impl<cpu_t> (cpu.hpp) calls the
// functions below only when CONTINUUM_CPU_DISPATCH is defined.
#pragma once

#include <string>

#include "../../attention/params.hpp"
#include "../../attention/validate.hpp"
#include "../../math/density.hpp"
#include "storage16.hpp"

namespace continuum {
namespace cpu_dispatch {

/// The instruction sets that kernels are built for, lowest first. Each one's
/// CPUID requirements: sse2 — x86-64; avx2 — AVX2, FMA, BMI1, BMI2 (F16C, built with, comes with AVX2); avx512 —
/// those and AVX-512 F, BW, DQ, VL, CD; avx512bf16 — the avx512 kernels with
/// bfloat16 storage's tile products on AVX512-BF16 vectors
/// (backends/cpu/bf16_products.hpp): avx512 and AVX512-BF16; amx — the same
/// on AMX-BF16 tiles: avx512, AMX-TILE, AMX-BF16, and Linux's permission for
/// the tile data. (A CPU with AMX has AVX512-BF16 too; amx is preferred.
/// avx512bf16 is chosen automatically only where its vectors outrun float
/// FMA: automatic().)
enum class Isa { sse2 = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3, amx = 4 };
inline constexpr int kIsaCount = 5;

/// "sse2", "avx2", "avx512", "avx512bf16", "amx".
const char* name(Isa isa);

/// Whether the running CPU and operating system can run isa's kernels.
bool supported(Isa isa);

/// The instruction set a call runs by default: the best one the CPU
/// supports, except avx512bf16 where AVX512-BF16's products are slower than
/// float FMA on the widened values (any CPU but AMD's: there avx512, whose
/// float kernels run bfloat16 calls; bf16::avx512bf16_preferred() in
/// bf16_products.hpp, MATH.md §10, "Instruction sets").
Isa automatic();

/// The instruction set of every later call: automatic(), or
/// the one the environment variable CONTINUUM_CPU_ISA names (sse2, avx2,
/// avx512, avx512bf16, amx; read once, at the first call), or the last select().
/// \throws std::invalid_argument when CONTINUUM_CPU_ISA names an unknown
///         instruction set or one this CPU cannot run.
Isa selected();

/// Use isa's kernels from now on (every thread; for tests and benchmarks that
/// compare instruction sets). Not to be called while another thread is inside
/// an attention call.
/// \throws std::invalid_argument when the CPU cannot run isa's kernels.
void select(Isa isa);

/// The instruction set named `text` ("sse2", "avx2", "avx512", "avx512bf16",
/// "amx").
/// \throws std::invalid_argument naming the accepted names.
Isa parse(const std::string& text);

/// attention_impl<cpu_t>'s forward and backward on the selected kernels: a
/// validated call (attention_forward / attention_backward, MATH.md §4–§6).
/// T: float, double, bfloat16 or float16; Stencil: ContinuumStencil or
/// SoftmaxStencil (defined, for those eight pairs, in src/cpu_dispatch.cpp).
template <class T, class Stencil>
void forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale, Stencil);
template <class T, class Stencil>
void backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale, Stencil);

/// One instruction set's kernels (src/cpu_kernels.cpp); index [0] is the
/// continuum stencil, [1] softmax (and focal).
struct KernelTable {
  template <class T>
  using Forward = void (*)(const ForwardArgs<T>&, const AttentionShape&, double);
  template <class T>
  using Backward = void (*)(const BackwardArgs<T>&, const AttentionShape&, double);
  const char* (*isa)();  // cpu_detail::compiled_isa of the object's own namespace
  Forward<float> forward_float[2];
  Forward<double> forward_double[2];
  Backward<float> backward_float[2];
  Backward<double> backward_double[2];
  Forward<bfloat16> forward_bf16[2];
  Backward<bfloat16> backward_bf16[2];
  Forward<float16> forward_f16[2];
  Backward<float16> backward_f16[2];
  bool (*usable)();  // a check beyond AVX-512 (avx512bf16: CPUID; amx: CPUID and the tile permission), or null
  bool (*preferred)();  // whether automatic() takes this set where it is usable (null: always)
};

}  // namespace cpu_dispatch
}  // namespace continuum
