// attention/backward.hpp — the public backward entry point (MATH.md §6, §8).
#pragma once

#include <algorithm>

#include "../backends/backend.hpp"
#include "../detail/dispatch.hpp"
#include "params.hpp"
#include "validate.hpp"

namespace continuum {

/// Backward pass of attention_forward (MATH.md §6): given dO, the gradients
///   dV_j = Σ_i P_ij dO_i,  dQ_i = c_i Σ_j dS_ij k_j,  dK_j = Σ_i c_i dS_ij q_i,
///   dτ_i = -(1/τ_i) Σ_j dS_ij s_ij,
/// with dS the tridiagonal continuum stencil applied to dα_ij = (dP_ij − Dl_i)/Z_i,
/// dP_ij = dO_i·v_j, Dl_i = Σ_j P_ij dP_ij = dO_i·o_i (softmax/focal:
/// dS_ij = P_ij (dP_ij − Dl_i)).
/// The CPU backend forms dP_ij − Dl_i relative to the row's reference key (its
/// first key at the maximum score) and gets dS there from Σ_j dS_ij = 0 in a
/// cancellation-free form, so gradients keep their relative accuracy where P
/// is concentrated (tiny τ: dQ, dK = O(τ) are not swamped by c·ε).
/// \tparam T  float or double (storage; the CPU backend also takes bfloat16 and
///            float16, computed in float); the CPU backend computes in the
///            arithmetic args.compute selects (params.hpp, Compute), as the forward.
/// \param args.query, key, value, temperature, scale, visibility, kernel  exactly
///            as given to attention_forward.
/// \param args.out       [B, Hq, Lq, Dv], the forward's output; shape-checked but
///            not read by the CPU backend (it computes Dl from P and dP in
///            double instead of from o rounded to T).
/// \param args.grad_out  [B, Hq, Lq, Dv], dO.
/// \param args.lse       ignored by the CPU backend (may be null): each row's
///            maximum and Z_i come from the row statistics, which also work
///            where lse overflowed T.
/// \param args.row_stats  optional (CPU): the forward's row statistics
///            (params.hpp RowStats, docs/MATH.md §6), [B, Hq, Lq, Dv + 5] and
///            [B, Hq, Lq]. Without them the CPU backward first runs the forward
///            on its rows to find them (the same bits, at the cost of that
///            forward). The CUDA backend ignores them.
/// \param[out] args.grad_query [B, Hq, Lq, D], grad_key [B, Hk, Lk, D],
///            grad_value [B, Hk, Lk, Dv]: views like Q, K, V; a view with null
///            data is not computed. For GQA dK/dV sum the query heads sharing a
///            KV head. grad_temperature: the temperature's shape (1, [Hq] or
///            [B, Hq, Lq] contiguous) or null; summed over what shares τ.
/// \throws std::invalid_argument as attention_forward, for every argument,
///         and when an output shares an element with an input or another
///         output (views, lse, temperature, ranges, dτ; outputs may interleave,
///         e.g. dQ, dK, dV as views of one packed gradient buffer); on the
///         CPU, when given row_stats name a reference key outside their row's
///         visible keys (statistics of another call).
/// \note Zero sizes: with B, Hq or Lq = 0 (also Hq = Hk = 0) nothing is
///       attended and dK, dV, dτ are zero, written without calling a kernel.
/// \note Deterministic: bitwise identical for any thread count (query blocks
///       own dQ, key tiles own dK/dV, fixed summation orders, no atomics).
///       Empty rows give zero gradients. Memory O(B·Hq·Lq + tiles); without
///       row_stats, O(B·Hq·Lq·Dv) more for the statistics it computes.
///       Range limit (double storage only): where the score gaps c·|Δ(q·k)|
///       around a row's maximum exceed ~1e150, neighbour weights (~1/δ²)
///       underflow and that row's dQ, dK, dτ flush to 0; beyond ~1e300 every
///       weight underflows (forward: mean value of the maximal keys; backward:
///       dV only). Float storage never reaches these (computed in double).
///       Raw scores q·k beyond DBL_MAX (double storage) are handled as in
///       attention_forward (W13): finite gradients, no NaN.
template <class Backend, class T>
void attention_backward(Backend, const BackwardArgs<T>& args) {
  double scale = 1.0;
  const AttentionShape shape = validate_backward(args, &scale);
  const BackwardArgs<T> a = detail::settled(args);
  if (shape.rows() == 0) {  // no query (B, Hq or Lq = 0): every gradient is zero
    detail::fill_zero(a.grad_query), detail::fill_zero(a.grad_key), detail::fill_zero(a.grad_value);
    if (a.grad_temperature != nullptr)
      std::fill_n(a.grad_temperature, detail::temperature_count(a.temperature, shape), accum_t<T>(0));
    return;
  }
  detail::with_stencil(a.kernel, [&](auto stencil) {
    attention_impl<Backend>::template backward<T, decltype(stencil)>(a, shape, scale);
  });
}

/// attention_backward on the CPU backend (include <continuum/continuum.hpp>).
template <class T>
void attention_backward(const BackwardArgs<T>& args) {
  attention_backward(cpu, args);
}

}  // namespace continuum
