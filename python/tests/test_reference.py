"""kernel="continuum" against an independent float64 quadrature of the memory
curve (reference.py, MATH.md §4), forward and gradients, to 1e-12.

Why 1e-12: the library is within ~1e-15 relative of a 256-bit reference
(README "Accuracy"), the quadrature within ~1e-16 per segment; values and
gradients here are O(1), so 1e-12 leaves a margin of ~1000 over both and
still catches any wrong term (a misplaced half-cell changes P by ~1e-2)."""
import pytest
import torch

import continuum_attention as ca
import reference
from conftest import uniform

TOL = 1e-12


def ranges_for(B, Lq, Lk):
    lo = torch.randint(0, Lk // 2, (B, Lq))
    hi = torch.minimum(lo + torch.randint(0, Lk, (B, Lq)), torch.tensor(Lk))
    hi[:, 0] = lo[:, 0]  # one empty row
    return lo, hi


CASES = {
    "full": dict(),
    "causal": dict(causal=True),
    "causal_lq_lt_lk": dict(causal=True, lq=5),
    "causal_lq_gt_lk": dict(causal=True, lq=15),   # first rows empty
    "window_causal": dict(causal=True, window=(3, 0)),
    "window_symmetric": dict(window=(2, 2)),
    "window_right_only": dict(window=(-1, 1)),
    "ranges": dict(ranges=True),
    "ranges_causal_window": dict(ranges=True, causal=True, window=(4, 0)),
    "temp_scalar": dict(temperature="scalar"),
    "temp_head": dict(temperature="head"),
    "temp_query": dict(temperature="query"),
    "scale": dict(scale=0.7, temperature=0.3),
}


def make(case, dtype=torch.float64):
    B, Hq, Hk, Lk, D, Dv = 2, 4, 2, 11, 8, 6
    Lq = case.get("lq", Lk)
    q = uniform(B, Hq, Lq, D, dtype=dtype, requires_grad=True)
    k = uniform(B, Hk, Lk, D, dtype=dtype, requires_grad=True)
    v = uniform(B, Hk, Lk, Dv, dtype=dtype, requires_grad=True)
    kw = {n: case[n] for n in ("causal", "window", "scale") if n in case}
    if case.get("ranges"):
        kw["ranges"] = ranges_for(B, Lq, Lk)
    t = case.get("temperature")
    if t == "scalar":
        kw["temperature"] = torch.tensor(0.4, dtype=dtype, requires_grad=True)
    elif t == "head":
        kw["temperature"] = (torch.rand(Hq, dtype=dtype) + 0.25).requires_grad_()
    elif t == "query":
        kw["temperature"] = (torch.rand(B, Hq, Lq, dtype=dtype) + 0.25).requires_grad_()
    elif t is not None:
        kw["temperature"] = t
    return q, k, v, kw


def max_err(a, b):
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    return torch.where(both_inf, torch.zeros_like(a), (a - b).abs()).max().item()


@pytest.mark.parametrize("name", CASES)
def test_continuum_matches_quadrature(name):
    q, k, v, kw = make(CASES[name])
    out, lse = ca.attention(q, k, v, return_lse=True, **kw)
    ref_out, ref_lse = reference.attention(q, k, v, **kw)
    assert max_err(out, ref_out) <= TOL
    assert max_err(lse, ref_lse) <= TOL
    inputs = [q, k, v] + [t for t in [kw.get("temperature")] if isinstance(t, torch.Tensor)]
    do = uniform(*out.shape)
    got = torch.autograd.grad(out, inputs, do)
    ref = torch.autograd.grad(ref_out, inputs, do)
    for name_, g, r in zip("qkvt", got, ref):
        assert g.shape == r.shape
        assert max_err(g, r) <= TOL, name_


def test_quadrature_reference_can_fail():
    """The comparison is sharp: softmax is not continuum (differences ~1e-2)."""
    q, k, v, kw = make({})
    out = ca.attention(q, k, v, kernel="softmax")
    ref_out, _ = reference.attention(q, k, v)
    assert max_err(out, ref_out) > 1e-4


def test_int32_ranges_equal_int64():
    q, k, v, _ = make({})
    lo, hi = ranges_for(2, 11, 11)
    a = ca.attention(q, k, v, ranges=(lo, hi))
    b = ca.attention(q, k, v, ranges=(lo.int(), hi.int()))
    assert torch.equal(a, b)
