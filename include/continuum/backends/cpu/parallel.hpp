// backends/cpu/parallel.hpp — OpenMP work distribution for the CPU backend
// (after Eigen's Parallelizer.h): guarded by _OPENMP, serial when the work is
// small, never nested (inside the caller's parallel region it runs serially
// in the calling thread), capped by the caller's thread count.
//
// Results never depend on the thread count or the schedule: every work item
// writes its own outputs and is computed by the same code whichever thread
// runs it.
#pragma once

#include <cstdint>

#include "isa.hpp"

#if defined(_OPENMP)
#  include <omp.h>
#endif

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// Below this many score evaluations (rows × keys) a call runs serially.
inline constexpr double parallel_min_work = 32768.0;

/// The number of threads parallel_for would use for this much work (1 when
/// it would run serially).
inline int effective_threads(int num_threads, double work) {
#if defined(_OPENMP)
  const int nt = num_threads > 0 ? num_threads : omp_get_max_threads();
  if (nt > 1 && work >= parallel_min_work && !omp_in_parallel()) return nt;
#else
  (void)num_threads;
  (void)work;
#endif
  return 1;
}

/// Runs body(item, workspace) for item in [0, n). Each thread owns one
/// default-constructed Workspace for the whole call.
template <class Workspace, class Body>
void parallel_for(std::int64_t n, int num_threads, double work, Body&& body) {
#if defined(_OPENMP)
  const int nt = num_threads > 0 ? num_threads : omp_get_max_threads();
  if (n > 1 && nt > 1 && work >= parallel_min_work && !omp_in_parallel()) {
#  pragma omp parallel num_threads(nt)
    {
      Workspace ws;
#  pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < n; ++t) body(t, ws);
    }
    return;
  }
#else
  (void)num_threads;
  (void)work;
#endif
  Workspace ws;
  for (std::int64_t t = 0; t < n; ++t) body(t, ws);
}

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
