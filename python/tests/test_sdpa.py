"""kernel="softmax" (and "focal") equals torch.nn.functional.scaled_dot_product_attention,
forward and gradients (absolute errors; values and gradients are O(1)):

* float64: to 1e-13 (a few ulp of the O(1) values; both are exact up to rounding);
* float32, compute="float64" (double arithmetic): to 1e-6 (SDPA computes in float; measured ≤ 6.3e-7, nearly all of
  it SDPA's);
* float32, the default compute (our tiled kernels in float): to 3e-6, the
  2e-6 of our float arithmetic (test_compute.py: issue 13's float/float
  target at O(1) scores) plus the 1e-6 already allowed for SDPA's own float
  arithmetic. Measured ≤ 4.8e-7.

Our causal is bottom-right aligned; SDPA's is_causal is top-left, so Lq != Lk
and windows use an explicit boolean mask built from MATH.md §3."""
import pytest
import torch
import torch.nn.functional as F

import continuum_attention as ca
import reference
from conftest import uniform

TOL = {(torch.float64, None): 1e-13, (torch.float32, "float64"): 1e-6, (torch.float32, None): 3e-6}


def compare(mode, Lq, Lk, *, kernel="softmax", causal=False, window=(-1, -1), temperature=1.0,
            scale=None, Hq=4, Hk=2, use_is_causal=False):
    dtype, compute = mode
    B, D, Dv = 2, 16, 8
    q = uniform(B, Hq, Lq, D, dtype=dtype, requires_grad=True)
    k = uniform(B, Hk, Lk, D, dtype=dtype, requires_grad=True)
    v = uniform(B, Hk, Lk, Dv, dtype=dtype, requires_grad=True)
    ours = ca.attention(q, k, v, kernel=kernel, causal=causal, window=window,
                        temperature=temperature, scale=scale, compute=compute)
    sdpa_scale = (1 / D ** 0.5 if scale is None else scale) / temperature
    if use_is_causal:
        assert Lq == Lk and causal and window == (-1, -1)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=sdpa_scale,
                                             enable_gqa=True)
    else:
        mask = reference.visibility_mask(1, Lq, Lk, causal, window)[0]
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sdpa_scale,
                                             enable_gqa=True)
    tol = TOL[(dtype, compute)]
    worst = (ours - ref).abs().max().item()
    assert worst <= tol
    do = uniform(*ours.shape, dtype=dtype)
    g_ours = torch.autograd.grad(ours, (q, k, v), do)
    g_ref = torch.autograd.grad(ref, (q, k, v), do)
    for name, a, b in zip("qkv", g_ours, g_ref):
        worst = max(worst, (a - b).abs().max().item())
        assert (a - b).abs().max().item() <= tol, name
    print(f"[sdpa] {dtype} compute={compute}: max |ours - SDPA| = {worst:.2e} (tol {tol:.0e})")


MODES = list(TOL)  # (storage dtype, compute)
IDS = ["f64", "f32-compute_float64", "f32-default"]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_full(mode):
    compare(mode, 24, 24)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_causal_is_causal(mode):
    compare(mode, 24, 24, causal=True, use_is_causal=True)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("Lq,Lk", [(9, 24), (24, 9)])
def test_causal_bottom_right(mode, Lq, Lk):
    compare(mode, Lq, Lk, causal=True)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("causal,window", [(True, (4, 0)), (False, (3, 2)), (False, (-1, 3))])
def test_window(mode, causal, window):
    compare(mode, 20, 20, causal=causal, window=window)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_scale_temperature_focal(mode):
    compare(mode, 16, 16, scale=0.3, temperature=0.5, causal=True, use_is_causal=True)
    compare(mode, 16, 16, kernel="focal", temperature=0.4, Hq=2, Hk=2)


def test_continuum_is_not_softmax():
    """The comparison can fail: the continuum kernel differs from SDPA."""
    q, k, v = (uniform(1, 2, 16, 8) for _ in range(3))
    d = (ca.attention(q, k, v) - F.scaled_dot_product_attention(q, k, v)).abs().max().item()
    assert d > 1e-3
