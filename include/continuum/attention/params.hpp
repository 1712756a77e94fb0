// attention/params.hpp — the operator's arguments: strided tensor views,
// visibility, temperature, and the forward/backward argument structs shared
// by every backend (after flash-attention's flash.h Params).
#pragma once

#include <cstdint>
#include <optional>

#include "../config.hpp"
#include "../math/density.hpp"

namespace continuum {

using index_t = std::int64_t;

/// A strided 4-D view [batch, heads, seq, dim] over memory the caller owns.
/// Strides are in elements and must be ≥ 0; `dim` must be contiguous:
/// `stride_dim` exists only so that a caller copying strides from another
/// framework states it, and the operator rejects anything but 1. BHSD, BSHD
/// and packed QKV layouts are all expressible without copies. A 2-D
/// [seq, dim] tensor is batch = heads = 1. Output views must not overlap
/// themselves (each element written once) and no buffer the operator writes
/// may share an element with any other argument it reads or writes (checked
/// element by element: interleaved layouts such as dQ, dK, dV in one packed
/// buffer are fine). Sizes, element counts and offsets are limited to 2^62.
template <class T>
struct TensorView {
  T* data = nullptr;
  index_t batch = 0, heads = 0, seq = 0, dim = 0;
  index_t stride_batch = 0, stride_head = 0, stride_seq = 0;
  index_t stride_dim = 1;  ///< must be 1 (checked)

  CONTINUUM_HOST_DEVICE T* row(index_t b, index_t h, index_t s) const {
    return data + b * stride_batch + h * stride_head + s * stride_seq;
  }
  /// Contiguous BHSD view.
  static TensorView bhsd(T* p, index_t b, index_t h, index_t s, index_t d) {
    return {p, b, h, s, d, h * s * d, s * d, d, 1};
  }
  /// Contiguous BSHD view (PyTorch/FlashAttention's [batch, seq, heads, dim]).
  static TensorView bshd(T* p, index_t b, index_t s, index_t h, index_t d) {
    return {p, b, h, s, d, s * h * d, d, h * d, 1};
  }
  operator TensorView<const T>() const {
    return {data, batch, heads, seq, dim, stride_batch, stride_head, stride_seq, stride_dim};
  }
};

/// Which keys each query sees (MATH.md §3). The visible range of query i is
/// [lo_i, hi_i); the curve is built from those keys only. attention_forward /
/// attention_backward throw std::invalid_argument for explicit ranges outside
/// 0 ≤ lo ≤ hi ≤ Lk, or only one of range_lo and range_hi given.
struct Visibility {
  /// Causal, bottom-right aligned: hi_i = min(Lk, i + Lk - Lq + 1).
  bool causal = false;
  /// Sliding window around query i's diagonal key d_i = i + Lk - Lq (the
  /// bottom-right alignment of causal), FlashAttention's
  /// `window_size = (left, right)`: query i sees only keys
  /// d_i - window_left ≤ j ≤ d_i + window_right. A negative bound is
  /// unlimited on that side (the default, both sides). Causal is
  /// window_right = 0; with causal, (W - 1, 0) is the sliding window of W keys
  /// counting the diagonal, and without causal (w, w) is the symmetric local
  /// window of 2w + 1 keys.
  index_t window_left = -1;
  index_t window_right = -1;
  /// Explicit per-query ranges, each [batch, Lq] contiguous, or null. When
  /// given they are intersected with causal/window. Covers padding and packing.
  const index_t* range_lo = nullptr;
  const index_t* range_hi = nullptr;
};

/// How the temperature τ > 0 is shared (MATH.md §8).
enum class TemperatureShape { scalar, per_head, per_query };

/// Temperature (dimensionless, MATH.md §8): one value, one per query head
/// [heads], or one per query [batch, heads, Lq] contiguous. Scores are
/// s = scale / τ · q·k. attention_forward / attention_backward throw
/// std::invalid_argument when an element is ≤ 0 or not finite, when scale / τ
/// overflows, or when `data` is null for a non-scalar shape.
template <class T>
struct Temperature {
  TemperatureShape shape = TemperatureShape::scalar;
  T value = T(1);              ///< used when shape == scalar
  const T* data = nullptr;     ///< used otherwise
};

/// Index of query i of (batch b, query head h) in a per-head [heads] or
/// per-query [batch, heads, seq] temperature (0 for a scalar one): the one
/// lookup rule of every backend (MATH.md §8).
CONTINUUM_HOST_DEVICE inline index_t temperature_index(TemperatureShape shape, index_t b, index_t h, index_t i,
                                                       index_t heads, index_t seq) {
  return shape == TemperatureShape::per_head    ? h
         : shape == TemperatureShape::per_query ? (b * heads + h) * seq + i
                                                : 0;
}

/// τ of query i of (batch b, query head h): `value` for a scalar
/// temperature, else data[temperature_index(…)].
template <class T>
CONTINUUM_HOST_DEVICE inline T temperature_at(TemperatureShape shape, T value, const T* data, index_t b, index_t h,
                                              index_t i, index_t heads, index_t seq) {
  return shape == TemperatureShape::scalar ? value : data[temperature_index(shape, b, h, i, heads, seq)];
}
template <class T>
CONTINUUM_HOST_DEVICE inline T temperature_at(const Temperature<T>& t, index_t b, index_t h, index_t i,
                                              index_t heads, index_t seq) {
  return temperature_at(t.shape, t.value, t.data, b, h, i, heads, seq);
}

/// The arithmetic the CPU kernels compute in (docs/MATH.md §10,
/// docs/PERFORMANCE.md). One tiled kernel family serves every choice; only
/// the type it computes in changes.
enum class Compute {
  /// The storage type's own: float storage computes in float (the fast
  /// default; errors ~1e-6 of the output's conditioning), double in double.
  automatic,
  /// float: as `automatic` for float storage; rejected for double storage.
  float32,
  /// double: float storage is converted to double once per call (a copy of
  /// the inputs, 2x their size), computed in double, and each output rounded
  /// once to float (within one float rounding of the exact result). CPU only.
  float64,
};

/// The options that a call's forward and backward share (both argument
/// structs contain them): which kernel, its temperature and scale, which keys
/// each query sees, the arithmetic and the threads. Pass the same options to
/// the backward as to its forward.
template <class T>
struct AttentionOptions {
  Kernel kernel = Kernel::continuum;
  /// τ in accum_t<T> (MATH.md §8).
  Temperature<accum_t<T>> temperature{};
  /// Score scale; default 1/sqrt(D). Must be finite and > 0
  /// (std::invalid_argument; also for D = 0 with the default).
  std::optional<double> scale{};
  Visibility visibility{};
  /// The arithmetic (see Compute). Rows whose *visible* data float cannot
  /// hold (scores beyond 4096, values near overflow) are computed in double
  /// by the same kernels, and rows double cannot hold (raw scores beyond
  /// DBL_MAX, tiny τ) in long double (docs/MATH.md §10); a row that sees a NaN
  /// or an Inf gets NaN outputs. Data a row cannot see never changes its
  /// result or how it is computed. On the CPU a row whose scale / τ exceeds
  /// FLT_MAX is such a row (computed in double); the CUDA backend's kernels
  /// form scale / τ in their float accumulator and reject it
  /// (std::invalid_argument).
  Compute compute = Compute::automatic;
  /// OpenMP threads, ≥ 0 (std::invalid_argument otherwise); 0 = the
  /// runtime's default. Results do not depend on it,
  /// in any rounding mode: the workers run in the caller's floating-point
  /// modes (docs/MATH.md §10, Determinism).
  int num_threads = 0;
};

/// The row statistics a CPU forward leaves for its backward, so that the
/// backward does not compute them again (MATH.md §6, "row statistics from
/// the forward"): per row of [B, Hq, Lq], `values` holds row_stats_width(Dv)
/// numbers in the accumulator type (the row maximum, the weights of the
/// reference key and its neighbours, the far keys' sums) and `ref` the row's
/// reference key, or −1 where the forward left none (an empty row, a row it
/// computed in a wider arithmetic, Compute::float64). Both contiguous, both
/// given or neither. Opaque: pass a forward's unchanged to the backward of
/// the same inputs and options (statistics of other inputs give wrong
/// gradients; a reference key outside its row's keys is rejected).
template <class A>
struct RowStats {
  A* values = nullptr;     ///< [B, Hq, Lq, row_stats_width(Dv)]
  index_t* ref = nullptr;  ///< [B, Hq, Lq]
  operator RowStats<const A>() const { return {values, ref}; }
};
template <class A>
struct RowStats<const A> {
  const A* values = nullptr;
  const index_t* ref = nullptr;
};

/// Numbers per row of RowStats::values for value head_dim Dv.
CONTINUUM_HOST_DEVICE constexpr index_t row_stats_width(index_t Dv) { return Dv + 5; }

/// Forward arguments: the shared options plus the tensors. Shapes: query
/// [B, Hq, Lq, D], key [B, Hk, Lk, D], value [B, Hk, Lk, Dv], out
/// [B, Hq, Lq, Dv]; Hq a multiple of Hk (GQA/MQA).
template <class T>
struct ForwardArgs : AttentionOptions<T> {
  TensorView<const T> query, key, value;
  TensorView<T> out;
  /// [B, Hq, Lq] contiguous, log Z_i in natural-log units; may be null.
  /// Empty rows get -inf. Computed in the compute type and rounded once to
  /// the accumulator type (T for float/double; float for the CUDA backend's
  /// 16-bit storage types), so it is ±inf when log Z_i is outside that range
  /// (tiny τ, huge scores). Neither backward needs it (the CPU's takes the
  /// row statistics, row_stats, or computes them; the CUDA backward
  /// recomputes each row's maximum and Z).
  accum_t<T>* lse = nullptr;
  /// Optional inspection outputs, [B, Hq, Lq, Lk] contiguous (small inputs
  /// only): P (the weights that multiply the values) and π (cell masses),
  /// from the same kernels as out (asking for them changes no bit of out or
  /// lse).
  T* probs = nullptr;
  T* cell_mass = nullptr;
  /// Optional: the row statistics for the backward (RowStats; CPU only).
  RowStats<accum_t<T>> row_stats{};
};

/// Backward arguments: the forward's options, inputs and outputs plus dO;
/// writes dQ, dK, dV (same shapes and view rules as Q, K, V) and dτ (same
/// shape as the temperature: a scalar, [Hq], or [B, Hq, Lq]); any output may
/// be null. lse, the temperature and dτ are in accum_t<T> (= T for float and
/// double).
template <class T>
struct BackwardArgs : AttentionOptions<T> {
  TensorView<const T> query, key, value, out, grad_out;
  /// The forward's lse; optional, and read by neither backend (the CPU's
  /// row statistics hold each row's maximum, reference key and Z, the CUDA
  /// backward recomputes them, so both work where lse overflowed, and a stale
  /// or wrong lse changes nothing).
  /// `out` is likewise not read.
  const accum_t<T>* lse = nullptr;
  /// Optional (CPU): the forward's row statistics (RowStats). Without them
  /// the CPU backward computes them, with a forward of its own.
  RowStats<const accum_t<T>> row_stats{};
  TensorView<T> grad_query, grad_key, grad_value;
  accum_t<T>* grad_temperature = nullptr;
};

}  // namespace continuum
