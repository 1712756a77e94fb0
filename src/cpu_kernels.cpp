// src/cpu_kernels.cpp — one instruction set's CPU kernels for run-time dispatch
// (include/continuum/backends/cpu/dispatch.hpp, MATH.md §10, "Instruction sets"). CMake compiles
// this file once per instruction set, with that set's flags and
// CONTINUUM_KERNELS_ISA_<name> defined; isa.hpp then puts every kernel in the
// set's own namespace (continuum::cpu_<name>), and the table below, defined in
// that namespace, is what src/cpu_dispatch.cpp picks from.
#include <string_view>

#include <continuum/backends/cpu.hpp>
#include <continuum/backends/cpu/dispatch.hpp>

#if defined(CONTINUUM_CPU_DISPATCH)
#  error "src/cpu_kernels.cpp is the dispatch target's kernel object: it must not dispatch itself"
#endif

#if defined(CONTINUUM_KERNELS_ISA_sse2)
#  define CONTINUUM_KERNELS_ISA "sse2"
#elif defined(CONTINUUM_KERNELS_ISA_avx2)
#  define CONTINUUM_KERNELS_ISA "avx2"
#elif defined(CONTINUUM_KERNELS_ISA_avx512)
#  define CONTINUUM_KERNELS_ISA "avx512"
#else
#  error "define CONTINUUM_KERNELS_ISA_<sse2|avx2|avx512> (CMakeLists.txt, continuum_cpu_dispatch)"
#endif
static_assert(std::string_view(continuum::cpu_detail::kCompiledIsa) == CONTINUUM_KERNELS_ISA,
              "the compiler flags of this object do not give the instruction set it is built for");

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

extern const cpu_dispatch::KernelTable kernel_table;
const cpu_dispatch::KernelTable kernel_table = {
    &compiled_isa,
    {&run_forward<float, ContinuumStencil>, &run_forward<float, SoftmaxStencil>},
    {&run_forward<double, ContinuumStencil>, &run_forward<double, SoftmaxStencil>},
    {&run_backward<float, ContinuumStencil>, &run_backward<float, SoftmaxStencil>},
    {&run_backward<double, ContinuumStencil>, &run_backward<double, SoftmaxStencil>},
    {&run_forward<bfloat16, ContinuumStencil>, &run_forward<bfloat16, SoftmaxStencil>},
    {&run_backward<bfloat16, ContinuumStencil>, &run_backward<bfloat16, SoftmaxStencil>},
    {&run_forward<float16, ContinuumStencil>, &run_forward<float16, SoftmaxStencil>},
    {&run_backward<float16, ContinuumStencil>, &run_backward<float16, SoftmaxStencil>},
    nullptr,
    nullptr,
};

#if defined(CONTINUUM_KERNELS_ISA_avx512)
// The bfloat16 units (backends/cpu/bf16_products.hpp) as "instruction sets":
// these kernels, with the bfloat16 forward's tile products and the
// backward's score products on AVX512-BF16 vectors ("avx512bf16") or
// AMX-BF16 tiles ("amx"), once the unit's check says so.
template <bf16::Unit U>
constexpr cpu_dispatch::KernelTable unit_table(const char* (*isa)(), bool (*usable)(), bool (*preferred)()) {
  return {
      isa,
      {&run_forward<float, ContinuumStencil>, &run_forward<float, SoftmaxStencil>},
      {&run_forward<double, ContinuumStencil>, &run_forward<double, SoftmaxStencil>},
      {&run_backward<float, ContinuumStencil>, &run_backward<float, SoftmaxStencil>},
      {&run_backward<double, ContinuumStencil>, &run_backward<double, SoftmaxStencil>},
      {&run_forward<bfloat16, ContinuumStencil, U>, &run_forward<bfloat16, SoftmaxStencil, U>},
      {&run_backward<bfloat16, ContinuumStencil, U>, &run_backward<bfloat16, SoftmaxStencil, U>},
      {&run_forward<float16, ContinuumStencil>, &run_forward<float16, SoftmaxStencil>},  // bfloat16 units only
      {&run_backward<float16, ContinuumStencil>, &run_backward<float16, SoftmaxStencil>},
      usable,
      preferred,
  };
}
inline const char* compiled_isa_avx512bf16() { return "avx512bf16"; }
inline const char* compiled_isa_amx() { return "amx"; }
extern const cpu_dispatch::KernelTable kernel_table_avx512bf16, kernel_table_amx;
const cpu_dispatch::KernelTable kernel_table_avx512bf16 =
    unit_table<bf16::Unit::avx512bf16>(&compiled_isa_avx512bf16, &bf16::avx512bf16_usable,
                                       &bf16::avx512bf16_preferred);
const cpu_dispatch::KernelTable kernel_table_amx = unit_table<bf16::Unit::amx>(&compiled_isa_amx, &bf16::amx_usable, nullptr);
#endif

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
