// attention/forward.hpp — the public forward entry point (MATH.md §3–§5, §8):
// validates the arguments and dispatches to a backend's implementation,
// templated on the stencil policy of the chosen kernel.
#pragma once

#include "../backends/backend.hpp"
#include "../detail/dispatch.hpp"
#include "params.hpp"
#include "validate.hpp"

namespace continuum {

/// Forward pass of attention: out_i = Σ_j P_ij v_j (MATH.md §4), with
/// P_ij = α_ij / Z_i, where α is the continuum stencil of MATH.md §4 (kernel =
/// continuum) or e^{s_ij} (softmax; focal = softmax with the temperature given,
/// MATH.md §8), s_ij = c_i · q_i·k_j, c_i = scale / τ_i.
/// \tparam Backend  continuum::cpu_t (continuum::cuda_t with the CUDA backend).
/// \tparam T        float or double (storage; the CPU backend also takes
///                  continuum::bfloat16 and float16, computed in float). The CPU backend computes in the
///                  arithmetic args.compute selects (params.hpp, Compute:
///                  the storage type's by default; float64 rounds each output
///                  once).
/// \param args.query  [B, Hq, Lq, D], args.key [B, Hk, Lk, D], args.value
///                    [B, Hk, Lk, Dv]: strided views, dim axis contiguous;
///                    Hq a multiple of Hk (GQA/MQA; query head h uses KV head
///                    h / (Hq/Hk)); Lq ≠ Lk and Dv ≠ D allowed.
/// \param[out] args.out  [B, Hq, Lq, Dv]; must not alias any input.
/// \param[out] args.lse  [B, Hq, Lq] contiguous or null: log Z_i (natural log,
///                    score units) = c_i·max_j(q_i·k_j) + log Σ_j α̃_ij, rounded
///                    to accum_t<T> (T; float for 16-bit T); -inf for empty
///                    rows; ±inf if log Z_i is outside that type's range (tiny τ). attention_backward does not need it.
/// \param[out] args.probs, args.cell_mass  [B, Hq, Lq, Lk] contiguous or null:
///                    P and the half-token cell masses π (MATH.md §5), for
///                    inspection on small inputs; invisible keys get 0.
/// \param[out] args.row_stats  optional (CPU): the row statistics that spare
///                    attention_backward a forward of its own (params.hpp
///                    RowStats, docs/MATH.md §6): [B, Hq, Lq, Dv + 5] in
///                    accum_t<T> and [B, Hq, Lq] index_t. Asking for them
///                    changes no bit of out or lse, except in a call that
///                    would be split over the key axis (see the last note),
///                    which is then not split.
///                    The CUDA backend rejects them.
/// \param args.temperature  τ > 0: scalar, per query head [Hq], or per query
///                    [B, Hq, Lq]; args.scale default 1/sqrt(D).
/// \param args.visibility   full, causal (bottom-right), sliding window (left, right),
///                    explicit [B, Lq] ranges, intersected (MATH.md §3).
/// \param args.num_threads  OpenMP threads (0 = runtime default); results are
///                    bitwise independent of it. Runs serially when called
///                    inside an OpenMP parallel region or on small inputs.
/// \throws std::invalid_argument naming the argument and the expected shape:
///         shape/stride mismatch, dim stride ≠ 1, negative strides, Hq not a
///         multiple of Hk, τ ≤ 0 or non-finite (every element), scale/τ
///         overflowing, scale ≤ 0 or non-finite, ranges outside
///         [0, Lk] or lo > hi, null data with a non-empty shape, outputs
///         sharing an element with an input or each other (views, lse,
///         temperature, ranges, P, π), self-overlapping output views,
///         sizes, element counts or element offsets beyond 2^62, views
///         running past the end of the address space, D = 0 with the default
///         scale 1/sqrt(D); on the CUDA backend with a float accumulator,
///         scale or scale / τ beyond FLT_MAX (its kernels form it in float;
///         the CPU computes such rows in double, MATH.md §10); compute
///         float32 with double storage; a kernel or compute value outside its
///         enum; range_lo without range_hi or the reverse; row_stats with
///         one of its two arrays null; on the CPU, a CONTINUUM_CPU_ISA that
///         names an unknown instruction set or one this CPU cannot run
///         (backends/cpu/dispatch.hpp), and, where long double is no wider
///         than double, rows that need it (MATH.md §10, "Compute type": raw
///         scores beyond DBL_MAX, scores beyond 4096 or values near DBL_MAX
///         in double arithmetic).
/// \note Zero sizes: B, Hq or Lq = 0 (also Hq = Hk = 0) is a problem with
///       nothing to write, and returns at once; Lk = 0 gives empty rows; D = 0
///       (explicit scale) gives scores 0; Dv = 0 leaves lse, P and π.
/// \note Rows with no visible key give out = 0 and lse = -inf, never NaN.
///       Non-finite values in Q/K/V reach only the rows that see them (on the
///       CPU those rows' outputs are NaN, MATH.md §10). Double storage, CPU:
///       raw scores q·k beyond DBL_MAX from finite q, k (MATH.md appendix A
///       W13, e.g. q = 1e10, k = 1e300) are computed in long double on those
///       rows and give the right limit (≈ the arg-max key's value, lse = +inf
///       when log Z_i > DBL_MAX), never NaN. Memory
///       O(B·Hq·Lq + tiles); time O(B·Hq·Lq·Lk·(D + Dv)). A KV-cache decode step
///       (Lq = 1, causal) gives the full causal forward's row bit for bit up
///       to 4,095 keys; a longer cache is split over the key axis in 2,048-key
///       chunks and agrees with it within rounding (MATH.md §10). On the CPU
///       the split applies to every call with at most 256 query rows (Lq ≤ 256:
///       each head's, or GQA group's, rows in one task) over 4,096 keys or
///       more, unless it asks for row_stats.
template <class Backend, class T>
void attention_forward(Backend, const ForwardArgs<T>& args) {
  double scale = 1.0;
  const AttentionShape shape = validate_forward(args, &scale);
  if (shape.rows() == 0) return;  // no query (B, Hq or Lq = 0): nothing to write
  const ForwardArgs<T> a = detail::settled(args);
  detail::with_stencil(a.kernel, [&](auto stencil) {
    attention_impl<Backend>::template forward<T, decltype(stencil)>(a, shape, scale);
  });
}

/// attention_forward on the CPU backend (include <continuum/continuum.hpp>).
template <class T>
void attention_forward(const ForwardArgs<T>& args) {
  attention_forward(cpu, args);
}

}  // namespace continuum
