// backends/cpu/isa.hpp — the instruction set that this translation unit's CPU
// kernels are compiled for, and the namespace that keeps each set apart.
//
// The kernels' vector width and their use of FMA follow the compiler's target
// macros (-march, or the per-ISA objects of cpu_dispatch.hpp): AVX-512 → 64-byte
// vectors, AVX → 32, otherwise 16 (simd.hpp). Every CPU kernel lives in
// continuum::cpu_<isa>::cpu_detail, an inline namespace named after that set,
// so that translation units compiled for different sets (the project's per-ISA
// objects; a user's TUs built with different -march) keep their own kernels.
// Without it the linker, which keeps one copy of each inline function, could
// hand one TU's AVX-512 kernel to code meant to run on a CPU without AVX-512.
// Code outside the namespace (the standard library, Eigen, math/) can still be
// merged; cpu_dispatch links its objects lowest instruction set first, so the
// copy kept is one every caller's CPU can run (MATH.md §10, "Instruction sets").
// Such shared code must also *behave* the same in every object: Eigen's heap
// alignment follows the vector flags, so translation units built for
// different sets must agree on EIGEN_MAX_ALIGN_BYTES (cpu_dispatch sets 64).
#pragma once

// Portable vector code: GCC/Clang vector extensions. nvcc's front end (a
// translation unit that includes the CPU backend next to the CUDA one) does not
// take __builtin_shufflevector with pack expansions: there the CPU kernels use
// their plain loops, as with other compilers.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(CONTINUUM_NO_CPU_SIMD)
#  define CONTINUUM_CPU_SIMD 1
#endif

#if !defined(CONTINUUM_CPU_SIMD)
#  define CONTINUUM_CPU_ISA_NAMESPACE cpu_scalar
#  define CONTINUUM_CPU_ISA_NAME "scalar"
#elif defined(__AVX512F__)
#  define CONTINUUM_CPU_ISA_NAMESPACE cpu_avx512
#  define CONTINUUM_CPU_ISA_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#  define CONTINUUM_CPU_ISA_NAMESPACE cpu_avx2
#  define CONTINUUM_CPU_ISA_NAME "avx2"
#elif defined(__AVX__) && defined(__FMA__)
#  define CONTINUUM_CPU_ISA_NAMESPACE cpu_avx_fma
#  define CONTINUUM_CPU_ISA_NAME "avx+fma"
#elif defined(__AVX__)
#  define CONTINUUM_CPU_ISA_NAMESPACE cpu_avx
#  define CONTINUUM_CPU_ISA_NAME "avx"
#elif defined(__x86_64__) || defined(__i386__)
#  define CONTINUUM_CPU_ISA_NAMESPACE cpu_sse2
#  define CONTINUUM_CPU_ISA_NAME "sse2"
#else
#  define CONTINUUM_CPU_ISA_NAMESPACE cpu_generic
#  define CONTINUUM_CPU_ISA_NAME "generic"
#endif

// Every CPU header opens `inline namespace CONTINUUM_CPU_ISA_NAMESPACE` itself
// around its `namespace cpu_detail`: reopening cpu_detail straight from
// `continuum` finds the same namespace, but clang 14 then mangles its members
// without the inline namespace, which would merge the sets' kernels again.
namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {
namespace cpu_detail {

/// The instruction set these kernels were compiled for: "avx512", "avx2",
/// "avx+fma", "avx", "sse2", "generic" (vector code of the compiler's choice)
/// or "scalar" (no vector extensions).
inline constexpr const char* kCompiledIsa = CONTINUUM_CPU_ISA_NAME;

/// The same as a function of this namespace: if the linker ever merged two
/// sets' kernels, the kernel tables of cpu_dispatch would share one copy of it
/// and report the same name, which cpu_dispatch checks.
inline const char* compiled_isa() { return CONTINUUM_CPU_ISA_NAME; }

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
