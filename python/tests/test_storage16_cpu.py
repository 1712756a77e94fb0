"""16-bit storage on the CPU, bfloat16 and float16: the library converts the
call to float32 once, runs its float32 kernels and rounds each output once to
the storage dtype; lse and dτ stay float32 (docs/MATH.md §10). 16-bit → float32
is exact and both roundings are to nearest even, so a float16 call equals, bit
for bit, the float32 call on the same values with its outputs rounded to
float16 — and so does a bfloat16 call of softmax or focal without a bfloat16
unit.

Where the CPU kernels are "amx" or "avx512bf16" (ca.cpu_isa()), the products
run on that bfloat16 unit, AMX-BF16 tiles or AVX512-BF16 vectors
(docs/MATH.md §10, "bfloat16 products"): the scores are c·(q·k) and the
forward's P·V takes the weights rounded to bfloat16, so the forward is held to
the derived bound instead — the float32 call's output within one bfloat16
rounding of itself plus 2^-8·max|v| — and lse to float rounding; the
backward's S and dP (exact products, another order of summation) are the
float32 ones within float rounding, and its accumulations take P, c·dS and dS
rounded to bfloat16: each gradient element moves by at most 2^-8 times the
sum of the sizes of its terms (dQ: c_i Σ_j |dS_ij| |k_j|, dK: Σ_i |c_i dS_ij|
|q_i|, dV: Σ_i P_ij |dO_i|; from the float64 reference's P and dS), then is
rounded to bfloat16. The row statistics of the unit's forward give each row's
δ an error of at most 2^-8 H_i, H_i = Σ_j P_ij |dP_ij − dP_i,ref| (ref: the
row's first maximal key; docs/MATH.md §6), which moves each dS_ij by P_ij
times it: dQ's terms gain c_i H_i Σ_j P_ij |k_j|, dK's Σ_i c_i P_ij H_i |q_i|.
The "sharp" case (τ = 0.01, neighbouring scores up to ~230 apart) is where
that term counts.

The continuum kernel's stencil is evaluated to bfloat16's accuracy in a
bfloat16 call (docs/MATH.md §10, "The bfloat16 stencil": each segment term
within eps = 2^-14, relative), and so are softmax's and focal's weights e^s on
a bfloat16 unit: the output is the float32 call's within 2·eps·max|v| before
the rounding, lse within eps, each gradient within 12·eps of its largest
element. float16 keeps float32's stencil and products."""
import pytest
import torch

import continuum_attention as ca
import reference
from conftest import uniform


DTYPES = [torch.bfloat16, torch.float16]


def inputs(kernel_temperature, dtype=torch.bfloat16):
    torch.manual_seed(5)
    q = uniform(2, 4, 37, 16, dtype=torch.float32).to(dtype)
    k = uniform(2, 2, 37, 16, dtype=torch.float32).to(dtype)
    v = uniform(2, 2, 37, 8, dtype=torch.float32).to(dtype)
    tau = {"head": torch.rand(4) + 0.3, "sharp": 0.01}.get(kernel_temperature, 0.3)
    return q, k, v, tau


def unit_gradient_terms(q, k, v, do, kernel, causal, tau):
    """(dQ, dK, dV) term sizes in float64 (docstring above): from the
    reference's P and dS on the same (16-bit) values, δ's error included; GQA
    sums over the group."""
    probe = {}
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    t = tau.double() if isinstance(tau, torch.Tensor) else tau
    out, _ = reference.attention(qq, kk, vv, kernel=kernel, causal=causal, temperature=t, probe=probe,
                                 panels=16)  # neighbouring scores up to ~230 apart at τ = 0.01
    out.backward(do.double())
    s, ds, P, c = probe["s"].detach(), probe["s"].grad.abs(), probe["P"].detach(), probe["c"]
    g = q.shape[1] // k.shape[1]
    kr = kk.detach().abs().repeat_interleave(g, dim=1)
    dP = do.double() @ vv.detach().repeat_interleave(g, dim=1).transpose(-1, -2)
    vis = reference.visibility_mask(q.shape[0], q.shape[2], k.shape[2], causal).unsqueeze(1).expand_as(s)
    ref = torch.where(vis, s, torch.tensor(-torch.inf, dtype=s.dtype)).argmax(-1, keepdim=True)  # first maximum
    H = (P * (dP - dP.gather(-1, ref)).abs()).sum(-1, keepdim=True)

    def per_kv_head(x):  # [B, Hq, ...] -> [B, Hk, ...], summed over the group
        return x.unflatten(1, (k.shape[1], g)).sum(2)

    tq = c * (ds @ kr) + c * H * (P @ kr)
    tk = per_kv_head((c * (ds + P * H)).transpose(-1, -2) @ qq.detach().abs())
    tv = per_kv_head(P.transpose(-1, -2) @ do.double().abs())
    return tq, tk, tv


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", ["continuum", "softmax", "focal"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("temperature", ["scalar", "head", "sharp"])
def test_16bit_is_the_float32_call_rounded_once(dtype, kernel, causal, temperature):
    q, k, v, tau = inputs(temperature, dtype)
    do = uniform(2, 4, 37, 8, dtype=torch.float32).to(dtype)

    def run(dtype):
        qq, kk, vv = (t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v))
        t = tau.clone().requires_grad_() if isinstance(tau, torch.Tensor) else tau
        out, lse = ca.attention(qq, kk, vv, kernel=kernel, causal=causal, temperature=t, return_lse=True)
        out.backward(do.to(dtype))
        dt = t.grad if isinstance(t, torch.Tensor) else None
        return out, lse, qq.grad, kk.grad, vv.grad, dt

    o16, lse16, dq16, dk16, dv16, dt16 = run(dtype)
    o32, lse32, dq32, dk32, dv32, dt32 = run(torch.float32)
    assert o16.dtype == dtype and lse16.dtype == torch.float32
    bf16 = dtype == torch.bfloat16
    unit = bf16 and ca.cpu_isa() in ("amx", "avx512bf16")
    u = 2.0 ** -8
    eps = 2.0 ** -14 if bf16 and (kernel == "continuum" or unit) else 0.0  # the bfloat16 stencil's
    vmax = float(v.float().abs().max())
    if unit or eps > 0:
        bound = u * o32.abs() + (u if unit else 0.0) * vmax + 2 * eps * vmax * (1 + u) + 1e-6
        assert ((o16.float() - o32).abs() <= bound).all()
        assert ((lse16 - lse32).abs() <= eps + 1e-5 * (1 + lse32.abs())).all()
    else:
        assert torch.equal(o16, o32.to(dtype))
        assert torch.equal(lse16, lse32)
    terms = unit_gradient_terms(q, k, v, do.to(dtype), kernel, causal, tau) if unit else (0.0, 0.0, 0.0)
    for g16, g32, term in ((dq16, dq32, terms[0]), (dk16, dk32, terms[1]), (dv16, dv32, terms[2])):
        assert g16.dtype == dtype
        if unit or eps > 0:
            bound = u * g32.abs() + (1e-5 + 12 * eps) * g32.abs().max() * (1 + u) + 1e-30 + u * term * (1 + u)
            assert ((g16.float() - g32).abs() <= bound).all()
        else:
            assert torch.equal(g16, g32.to(dtype))
    if dt16 is not None:
        assert dt16.dtype == torch.float32
        if unit or eps > 0:
            assert torch.allclose(dt16, dt32, rtol=1e-4, atol=(1e-5 + 12 * eps) * float(dt32.abs().max()))
        else:
            assert torch.equal(dt16, dt32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_16bit_compute_float64(dtype):
    """compute='float64': the float64 result, rounded to float32 and then to 16 bits."""
    q, k, v, tau = inputs("scalar", dtype)
    o16 = ca.attention(q, k, v, causal=True, temperature=tau, compute="float64")
    o32 = ca.attention(q.float(), k.float(), v.float(), causal=True, temperature=tau, compute="float64")
    assert torch.equal(o16, o32.to(dtype))


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "BFloat16"), (torch.float16, "Half")])
def test_16bit_temperature_tensor_is_float32(dtype, name):
    q, k, v, _ = inputs("scalar", dtype)
    with pytest.raises(ValueError, match=rf"temperature has dtype {name}; with a {name} query a tensor temperature must be Float"):
        ca.attention(q, k, v, temperature=torch.full((4,), 0.5, dtype=dtype))


def test_float16_overflow_is_inf_like_any_float16_rounding():
    """float16's largest finite value is 65504: an output gradient beyond it
    rounds to inf (as torch's own float32 → float16 conversion does), and the
    float32 lse and the forward stay finite. The float32 call on the same
    values is the reference."""
    torch.manual_seed(7)
    q = uniform(1, 1, 64, 8, dtype=torch.float32).half().requires_grad_()
    k = uniform(1, 1, 64, 8, dtype=torch.float32).half().requires_grad_()
    v = uniform(1, 1, 64, 8, dtype=torch.float32).half().requires_grad_()
    # dV_j = Σ_i P_ij dO_i, causal: key 0's column sum is about Σ_i 1/(i+1) ≈ 4.7, the last keys'
    # well below 1, so dV spans float16's range and crosses 65504
    do = torch.full((1, 1, 64, 8), 60000.0).half()
    out, lse = ca.attention(q, k, v, causal=True, return_lse=True)
    out.backward(do)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out32 = ca.attention(q32, k32, v32, causal=True)
    out32.backward(do.float())
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert torch.equal(v.grad, v32.grad.half())  # inf exactly where float32's dV exceeds float16's range
    assert (v32.grad.abs() > 65504).any() and torch.isinf(v.grad).any() and torch.isfinite(v.grad).any()
