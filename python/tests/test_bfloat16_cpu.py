"""bfloat16 storage on the CPU: the library converts the call to float32 once,
runs its float32 kernels and rounds each output once to bfloat16; lse and dτ
stay float32 (docs/MATH.md §10). bfloat16 → float32 is exact and both
roundings are to nearest even, so a bfloat16 call equals, bit for bit, the
float32 call on the same values with its outputs rounded to bfloat16.

Where the CPU kernels are "amx" (ca.cpu_isa()), the tile products run on
AMX-BF16 (docs/MATH.md §10, "bfloat16 on AMX"): the scores are c·(q·k) and the
forward's P·V takes the weights rounded to bfloat16, so the forward is held to
the derived bound instead — the float32 call's output within one bfloat16
rounding of itself plus 2^-8·max|v| — and lse to float rounding; the
backward's S and dP (exact products, another order of summation) make each
gradient the float32 one within float rounding, then rounded to bfloat16.

The continuum kernel's stencil is evaluated to bfloat16's accuracy in a
bfloat16 call (docs/MATH.md §10, "The bfloat16 stencil": each segment term
within eps = 2^-14, relative): its output is the float32 call's within
2·eps·max|v| before the rounding, lse within eps, each gradient within
12·eps of its largest element. Softmax and focal stay bit for bit off AMX."""
import pytest
import torch

import continuum_attention as ca
from conftest import uniform


def inputs(kernel_temperature):
    torch.manual_seed(5)
    q = uniform(2, 4, 37, 16, dtype=torch.float32).bfloat16()
    k = uniform(2, 2, 37, 16, dtype=torch.float32).bfloat16()
    v = uniform(2, 2, 37, 8, dtype=torch.float32).bfloat16()
    tau = (torch.rand(4) + 0.3) if kernel_temperature == "head" else 0.3
    return q, k, v, tau


@pytest.mark.parametrize("kernel", ["continuum", "softmax", "focal"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("temperature", ["scalar", "head"])
def test_bfloat16_is_the_float32_call_rounded_once(kernel, causal, temperature):
    q, k, v, tau = inputs(temperature)
    do = uniform(2, 4, 37, 8, dtype=torch.float32).bfloat16()

    def run(dtype):
        qq, kk, vv = (t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v))
        t = tau.clone().requires_grad_() if isinstance(tau, torch.Tensor) else tau
        out, lse = ca.attention(qq, kk, vv, kernel=kernel, causal=causal, temperature=t, return_lse=True)
        out.backward(do.to(dtype))
        dt = t.grad if isinstance(t, torch.Tensor) else None
        return out, lse, qq.grad, kk.grad, vv.grad, dt

    o16, lse16, dq16, dk16, dv16, dt16 = run(torch.bfloat16)
    o32, lse32, dq32, dk32, dv32, dt32 = run(torch.float32)
    assert o16.dtype == torch.bfloat16 and lse16.dtype == torch.float32
    amx = ca.cpu_isa() == "amx"
    u = 2.0 ** -8
    eps = 2.0 ** -14 if kernel == "continuum" else 0.0  # the bfloat16 stencil's
    vmax = float(v.float().abs().max())
    if amx or eps > 0:
        bound = u * o32.abs() + (u if amx else 0.0) * vmax + 2 * eps * vmax * (1 + u) + 1e-6
        assert ((o16.float() - o32).abs() <= bound).all()
        assert ((lse16 - lse32).abs() <= eps + 1e-5 * (1 + lse32.abs())).all()
    else:
        assert torch.equal(o16, o32.bfloat16())
        assert torch.equal(lse16, lse32)
    for g16, g32 in ((dq16, dq32), (dk16, dk32), (dv16, dv32)):
        assert g16.dtype == torch.bfloat16
        if amx or eps > 0:
            bound = u * g32.abs() + (1e-5 + 12 * eps) * g32.abs().max() * (1 + u) + 1e-30
            assert ((g16.float() - g32).abs() <= bound).all()
        else:
            assert torch.equal(g16, g32.bfloat16())
    if dt16 is not None:
        assert dt16.dtype == torch.float32
        if amx or eps > 0:
            assert torch.allclose(dt16, dt32, rtol=1e-4, atol=(1e-5 + 12 * eps) * float(dt32.abs().max()))
        else:
            assert torch.equal(dt16, dt32)


def test_bfloat16_compute_float64():
    """compute='float64': the float64 result, rounded to float32 and then to bfloat16."""
    q, k, v, tau = inputs("scalar")
    o16 = ca.attention(q, k, v, causal=True, temperature=tau, compute="float64")
    o32 = ca.attention(q.float(), k.float(), v.float(), causal=True, temperature=tau, compute="float64")
    assert torch.equal(o16, o32.bfloat16())


def test_bfloat16_temperature_tensor_is_float32():
    q, k, v, _ = inputs("scalar")
    with pytest.raises(ValueError, match=r"temperature has dtype BFloat16"):
        ca.attention(q, k, v, temperature=torch.full((4,), 0.5, dtype=torch.bfloat16))
