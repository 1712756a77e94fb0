"""The CUDA operator (built when nvcc is present: CONTINUUM_ATTENTION_CUDA=ON) against the
float64 CPU operator. Skipped without the CUDA kernels or without a GPU.

Tolerances: the CUDA backend accumulates in float32 (docs/CUDA.md), so fp32
results are compared at 1e-5 of max|ref| and 16-bit ones at 2e-2 (bf16 has
8 bits of mantissa: the inputs' own rounding is ~4e-3 relative)."""
import pytest
import torch

import continuum_attention as ca
from conftest import uniform

pytestmark = pytest.mark.skipif(not (ca.WITH_CUDA and torch.cuda.is_available()),
                                reason="no CUDA kernels in this build or no GPU")

TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kw", [dict(), dict(causal=True, temperature=0.3), dict(kernel="softmax", causal=True),
                                dict(causal=True, window=(5, 0))], ids=str)
def test_cuda_matches_cpu(dtype, kw):
    B, Hq, Hk, L, D = 2, 4, 2, 33, 64
    q64, k64, v64 = uniform(B, Hq, L, D), uniform(B, Hk, L, D), uniform(B, Hk, L, D)
    do64 = uniform(B, Hq, L, D)
    # the CUDA inputs rounded to dtype; the reference sees the same rounded values
    q, k, v, do = (t.to(dtype) for t in (q64, k64, v64, do64))
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    ref = ca.attention(*ref_in, **kw)
    ref_g = torch.autograd.grad(ref, ref_in, do.double())
    dev_in = [t.cuda().requires_grad_() for t in (q, k, v)]
    out, lse = ca.attention(*dev_in, return_lse=True, **kw)
    assert out.dtype == dtype and lse.dtype == (torch.float32 if dtype != torch.float32 else dtype)
    g = torch.autograd.grad(out, dev_in, do.cuda())
    for name, a, b in [("o", out, ref)] + list(zip(["dq", "dk", "dv"], g, ref_g)):
        err = (a.double().cpu() - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        assert err <= TOL[dtype], (name, err)


def test_cuda_opcheck():
    q = uniform(1, 2, 8, 16, dtype=torch.float32).cuda().requires_grad_()
    k = uniform(1, 2, 8, 16, dtype=torch.float32).cuda().requires_grad_()
    v = uniform(1, 2, 8, 16, dtype=torch.float32).cuda().requires_grad_()
    torch.library.opcheck(torch.ops.continuum.forward.default,
                          (q, k, v, "continuum", True, -1, -1, None, None, None, 0.5, None))


def test_cuda_float64_raises():
    q = uniform(1, 1, 4, 8).cuda()
    with pytest.raises(ValueError, match="CUDA backend supports float32, float16 and bfloat16"):
        ca.attention(q, q, q)


def test_cuda_compute():
    """compute: None, "default" and "float32" are the same float-accumulating kernels;
    "float64" is refused (ValueError), by the wrapper and by the C++ operator."""
    q, k, v = (uniform(1, 2, 8, 16, dtype=torch.float32).cuda() for _ in range(3))
    base = ca.attention(q, k, v, causal=True)
    for c in ("default", "float32"):
        assert torch.equal(ca.attention(q, k, v, causal=True, compute=c), base)
    with pytest.raises(ValueError, match=r"compute='float64' is not available on CUDA"):
        ca.attention(q, k, v, compute="float64")
    with pytest.raises(ValueError, match=r"compute=\"float64\" is not available on CUDA"):
        torch.ops.continuum.forward(q, k, v, "continuum", True, -1, -1, None, None, None, 1.0, None,
                                    "float64")
    torch.library.opcheck(torch.ops.continuum.forward.default,
                          (q.requires_grad_(), k, v, "continuum", True, -1, -1, None, None, None,
                           0.5, None, "float32"))
