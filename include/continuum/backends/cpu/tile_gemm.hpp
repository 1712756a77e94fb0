// backends/cpu/tile_gemm.hpp — a register-blocked GEMM micro-kernel for the
// small products inside one attention tile (tiled.hpp), where a library GEMM
// spends much of its time packing and dispatching.
//
//   C (M × N, row stride ldc)  =  or +=  A (M × K) · B (K × N, row stride ldb)
//
// A is read element by element through two strides (so Aᵀ costs nothing), B
// and C are row-major with unit stride along N; columns beyond the last full
// vector are done by a scalar loop (the same sum over k, in the same order).
// Blocking: kMR rows × kNV vectors of C live in registers (6 × 4 zmm with
// AVX-512: 24 accumulators, 4 B vectors, A broadcast from memory); the sum over
// K runs in order, so the result is the same for any thread count.
// Written with GCC/Clang vector extensions: the compiler emits AVX-512, AVX2 or
// SSE for the same code depending on -march; other compilers use Eigen.
#pragma once

#include <algorithm>
#include <cstring>

#include "../../attention/params.hpp"
#include "simd.hpp"
#include "isa.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

#if defined(CONTINUUM_CPU_SIMD)
#  define CONTINUUM_TILE_GEMM 1

inline constexpr int kMR = 6;
inline constexpr int kNV = kSimdBytes == 64 ? 4 : 2;

template <class T, int MR, int NV>
inline void micro_kernel(const T* A, index_t sa_r, index_t sa_k, const T* B, index_t ldb, index_t K, T* C,
                         index_t ldc, bool accumulate) {
  using V = typename Simd<T>::v;
  using VU = typename Simd<T>::vu;
  constexpr int W = Simd<T>::W;
  V acc[MR][NV];
  if (accumulate) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = *reinterpret_cast<const VU*>(C + r * ldc + j * W);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = V{};
  }
  for (index_t k = 0; k < K; ++k) {
    V b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) b[j] = *reinterpret_cast<const VU*>(B + k * ldb + j * W);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const T a = A[r * sa_r + k * sa_k];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = vmadd<T>(a, b[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) *reinterpret_cast<VU*>(C + r * ldc + j * W) = acc[r][j];
}

template <class T, int NV>
inline void row_block(int mr, const T* A, index_t sa_r, index_t sa_k, const T* B, index_t ldb, index_t K, T* C,
                      index_t ldc, bool accumulate) {
  switch (mr) {
    case 6: micro_kernel<T, 6, NV>(A, sa_r, sa_k, B, ldb, K, C, ldc, accumulate); break;
    case 5: micro_kernel<T, 5, NV>(A, sa_r, sa_k, B, ldb, K, C, ldc, accumulate); break;
    case 4: micro_kernel<T, 4, NV>(A, sa_r, sa_k, B, ldb, K, C, ldc, accumulate); break;
    case 3: micro_kernel<T, 3, NV>(A, sa_r, sa_k, B, ldb, K, C, ldc, accumulate); break;
    case 2: micro_kernel<T, 2, NV>(A, sa_r, sa_k, B, ldb, K, C, ldc, accumulate); break;
    default: micro_kernel<T, 1, NV>(A, sa_r, sa_k, B, ldb, K, C, ldc, accumulate); break;
  }
}

/// Columns n0 … N-1 (fewer than one vector) of C, scalar, same order of
/// operations per element as the vector kernel (a running sum over k).
template <class T>
inline void scalar_columns(index_t M, index_t n0, index_t N, index_t K, const T* A, index_t sa_r, index_t sa_k,
                           const T* B, index_t ldb, T* C, index_t ldc, bool accumulate) {
  for (index_t r = 0; r < M; ++r)
    for (index_t n = n0; n < N; ++n) {
      T acc = accumulate ? C[r * ldc + n] : T(0);
      for (index_t k = 0; k < K; ++k) acc = madd(A[r * sa_r + k * sa_k], B[k * ldb + n], acc);
      C[r * ldc + n] = acc;
    }
}

/// C (M × N) = or += A · B; A(r, k) = A[r·sa_r + k·sa_k]; B(k, n) = B[k·ldb + n];
/// C(r, n) = C[r·ldc + n]. Reads exactly the N columns of B and C. K ≥ 1: for
/// K = 0 A and B may be null (empty workspaces), and B + j·W would offset a
/// null pointer; tiled.hpp's gemm() handles the empty sum before calling this.
template <class T>
inline void tile_gemm(index_t M, index_t N, index_t K, const T* A, index_t sa_r, index_t sa_k, const T* B,
                      index_t ldb, T* C, index_t ldc, bool accumulate) {
  constexpr int W = Simd<T>::W;
  const index_t nvec = N / W;
  index_t j = 0;
  for (; j + kNV <= nvec; j += kNV)
    for (index_t r = 0; r < M; r += kMR)
      row_block<T, kNV>(int(std::min<index_t>(kMR, M - r)), A + r * sa_r, sa_r, sa_k, B + j * W, ldb, K,
                        C + r * ldc + j * W, ldc, accumulate);
  // Remaining 1 … kNV-1 vectors in one pass.
  const int rest = int(nvec - j);
  if (rest > 0)
    for (index_t r = 0; r < M; r += kMR) {
      const int mr = int(std::min<index_t>(kMR, M - r));
      const T* a = A + r * sa_r;
      T* c = C + r * ldc + j * W;
      if (rest >= 3)
        row_block<T, 3>(mr, a, sa_r, sa_k, B + j * W, ldb, K, c, ldc, accumulate);
      else if (rest == 2)
        row_block<T, 2>(mr, a, sa_r, sa_k, B + j * W, ldb, K, c, ldc, accumulate);
      else
        row_block<T, 1>(mr, a, sa_r, sa_k, B + j * W, ldb, K, c, ldc, accumulate);
    }
  if (nvec * W < N) scalar_columns(M, nvec * W, N, K, A, sa_r, sa_k, B, ldb, C, ldc, accumulate);
}
#endif  // CONTINUUM_CPU_SIMD

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
