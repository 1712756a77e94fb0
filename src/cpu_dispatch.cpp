// src/cpu_dispatch.cpp — run-time choice of the CPU kernels' instruction set
// (include/continuum/backends/cpu/dispatch.hpp, MATH.md §10, "Instruction sets"). Compiled for
// the baseline (x86-64); it reads CPUID through the compiler's
// __builtin_cpu_supports, which also checks that the operating system saves
// the AVX / AVX-512 registers.
#include <continuum/backends/cpu/dispatch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

// The tables of src/cpu_kernels.cpp, one per instruction set (namespaces
// continuum::cpu_<isa>::cpu_detail, backends/cpu/isa.hpp).
namespace continuum {
namespace cpu_sse2 { namespace cpu_detail { extern const cpu_dispatch::KernelTable kernel_table; } }
namespace cpu_avx2 { namespace cpu_detail { extern const cpu_dispatch::KernelTable kernel_table; } }
namespace cpu_avx512 { namespace cpu_detail {
extern const cpu_dispatch::KernelTable kernel_table;
extern const cpu_dispatch::KernelTable kernel_table_avx512bf16;
extern const cpu_dispatch::KernelTable kernel_table_amx;
} }
}  // namespace continuum

namespace continuum {
namespace cpu_dispatch {
namespace {

const KernelTable* const kTables[kIsaCount] = {&cpu_sse2::cpu_detail::kernel_table,
                                               &cpu_avx2::cpu_detail::kernel_table,
                                               &cpu_avx512::cpu_detail::kernel_table,
                                               &cpu_avx512::cpu_detail::kernel_table_avx512bf16,
                                               &cpu_avx512::cpu_detail::kernel_table_amx};

Isa best_supported() {
  for (int i = kIsaCount - 1; i > 0; --i)
    if (supported(Isa(i))) return Isa(i);
  return Isa::sse2;
}

Isa initial() {
  const char* env = std::getenv("CONTINUUM_CPU_ISA");
  if (env == nullptr || *env == '\0') return automatic();
  Isa isa;
  try {
    isa = parse(env);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("CONTINUUM_CPU_ISA: ") + e.what());
  }
  if (!supported(isa))
    throw std::invalid_argument(std::string("CONTINUUM_CPU_ISA=") + env + ": this CPU cannot run " + env +
                                " kernels (the best it can run is " + name(best_supported()) + ")");
  return isa;
}

// -1 until the first call reads the environment; then the selected Isa.
std::atomic<int> g_selected{-1};

const KernelTable& table() { return *kTables[int(selected())]; }

/// Each table must be its own set's: kernels of two sets merged at link time
/// (one namespace for both, backends/cpu/isa.hpp) would report one name.
void check_tables() {
  for (int i = 0; i < kIsaCount; ++i)
    if (std::strcmp(kTables[i]->isa(), name(Isa(i))) != 0)
      throw std::logic_error(std::string("cpu_dispatch: the ") + name(Isa(i)) + " kernel table runs " +
                             kTables[i]->isa() + " kernels (objects merged at link time)");
}

}  // namespace

const char* name(Isa isa) {
  switch (isa) {
    case Isa::sse2: return "sse2";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::amx: return "amx";
  }
  return "?";
}

Isa parse(const std::string& text) {
  for (int i = 0; i < kIsaCount; ++i)
    if (text == name(Isa(i))) return Isa(i);
  throw std::invalid_argument("unknown instruction set '" + text + "' (expected sse2, avx2, avx512, avx512bf16 or amx)");
}

bool supported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::sse2: return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
             __builtin_cpu_supports("bmi2");  // and F16C, which every AVX2 CPU has (clang 14 has no "f16c" here)
    case Isa::avx512:
      return supported(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512cd");
    case Isa::avx512bf16:  // CPUID, read by the avx512 object's own check
      return supported(Isa::avx512) && kTables[int(Isa::avx512bf16)]->usable();
    case Isa::amx:  // the tile permission is asked by the avx512 object's own check (AVX-512 code)
      return supported(Isa::avx512) && kTables[int(Isa::amx)]->usable();
  }
  return false;
}

Isa automatic() {
  for (int i = kIsaCount - 1; i > 0; --i)
    if (supported(Isa(i)) && (kTables[i]->preferred == nullptr || kTables[i]->preferred())) return Isa(i);
  return Isa::sse2;
}

Isa selected() {
  int s = g_selected.load(std::memory_order_acquire);
  if (s < 0) {
    static const Isa first = (check_tables(), initial());  // thread-safe; a throw is retried at the next call
    int expected = -1;
    g_selected.compare_exchange_strong(expected, int(first), std::memory_order_acq_rel);
    s = g_selected.load(std::memory_order_acquire);
  }
  return Isa(s);
}

void select(Isa isa) {
  check_tables();
  if (!supported(isa))
    throw std::invalid_argument(std::string("cpu_dispatch::select: this CPU cannot run ") + name(isa) +
                                " kernels");
  g_selected.store(int(isa), std::memory_order_release);
}

/// A table's entry for Stencil: [0] continuum, [1] softmax (and focal).
template <class Stencil, class Fn>
Fn pick(Fn const (&entries)[2]) {
  return entries[std::is_same<Stencil, ContinuumStencil>::value ? 0 : 1];
}

template <class T, class Stencil>
void forward(const ForwardArgs<T>& a, const AttentionShape& s, double c, Stencil) {
  if constexpr (std::is_same<T, float>::value) pick<Stencil>(table().forward_float)(a, s, c);
  else if constexpr (std::is_same<T, double>::value) pick<Stencil>(table().forward_double)(a, s, c);
  else if constexpr (std::is_same<T, bfloat16>::value) pick<Stencil>(table().forward_bf16)(a, s, c);
  else pick<Stencil>(table().forward_f16)(a, s, c);
}
template <class T, class Stencil>
void backward(const BackwardArgs<T>& a, const AttentionShape& s, double c, Stencil) {
  if constexpr (std::is_same<T, float>::value) pick<Stencil>(table().backward_float)(a, s, c);
  else if constexpr (std::is_same<T, double>::value) pick<Stencil>(table().backward_double)(a, s, c);
  else if constexpr (std::is_same<T, bfloat16>::value) pick<Stencil>(table().backward_bf16)(a, s, c);
  else pick<Stencil>(table().backward_f16)(a, s, c);
}

template void forward(const ForwardArgs<float>&, const AttentionShape&, double, ContinuumStencil);
template void forward(const ForwardArgs<float>&, const AttentionShape&, double, SoftmaxStencil);
template void forward(const ForwardArgs<double>&, const AttentionShape&, double, ContinuumStencil);
template void forward(const ForwardArgs<double>&, const AttentionShape&, double, SoftmaxStencil);
template void backward(const BackwardArgs<float>&, const AttentionShape&, double, ContinuumStencil);
template void backward(const BackwardArgs<float>&, const AttentionShape&, double, SoftmaxStencil);
template void backward(const BackwardArgs<double>&, const AttentionShape&, double, ContinuumStencil);
template void backward(const BackwardArgs<double>&, const AttentionShape&, double, SoftmaxStencil);
template void forward(const ForwardArgs<bfloat16>&, const AttentionShape&, double, ContinuumStencil);
template void forward(const ForwardArgs<bfloat16>&, const AttentionShape&, double, SoftmaxStencil);
template void backward(const BackwardArgs<bfloat16>&, const AttentionShape&, double, ContinuumStencil);
template void backward(const BackwardArgs<bfloat16>&, const AttentionShape&, double, SoftmaxStencil);
template void forward(const ForwardArgs<float16>&, const AttentionShape&, double, ContinuumStencil);
template void forward(const ForwardArgs<float16>&, const AttentionShape&, double, SoftmaxStencil);
template void backward(const BackwardArgs<float16>&, const AttentionShape&, double, ContinuumStencil);
template void backward(const BackwardArgs<float16>&, const AttentionShape&, double, SoftmaxStencil);

}  // namespace cpu_dispatch
}  // namespace continuum
