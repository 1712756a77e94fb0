"""torch.library.opcheck on both operators: schema, fake (meta) kernels,
autograd registration and AOT dispatch, for every CPU dtype and every valid
`compute` (the trailing schema argument, default "default"), with and without
gradients, and called without `compute` (the schema default)."""
import pytest
import torch

from conftest import uniform
import continuum_attention  # noqa: F401  (registers the operators)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# the valid compute strings per CPU storage dtype ("float32" needs float32 or 16-bit storage)
COMPUTES = {torch.float32: ["default", "float32", "float64"], torch.float64: ["default", "float64"],
            torch.bfloat16: ["default", "float32", "float64"], torch.float16: ["default", "float32", "float64"]}
DTYPE_COMPUTE = [(d, c) for d in DTYPES for c in COMPUTES[d]]
IDS = [f"{str(d).split('.')[-1]}-{c}" for d, c in DTYPE_COMPUTE]


def forward_args(dtype, requires_grad, temperature, ranges, causal=False, window=(-1, -1),
                 compute="default"):
    B, Hq, Hk, L, D = 2, 4, 2, 6, 8
    q = uniform(B, Hq, L, D, dtype=dtype, requires_grad=requires_grad)
    k = uniform(B, Hk, L, D, dtype=dtype, requires_grad=requires_grad)
    v = uniform(B, Hk, L, 5, dtype=dtype, requires_grad=requires_grad)
    t = None
    tdtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype  # the accumulator type
    if temperature == "head":
        t = (torch.rand(Hq, dtype=tdtype) + 0.5).requires_grad_(requires_grad)
    elif temperature == "query":
        t = (torch.rand(B, Hq, L, dtype=tdtype) + 0.5).requires_grad_(requires_grad)
    lo = hi = None
    if ranges:
        lo = torch.zeros(B, L, dtype=torch.int64)
        hi = torch.full((B, L), L, dtype=torch.int64)
        hi[1, 2] = 3
    return (q, k, v, "continuum", causal, window[0], window[1], lo, hi, t, 0.7, None, compute)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("temperature", [None, "head", "query"])
@pytest.mark.parametrize("ranges", [False, True], ids=["noranges", "ranges"])
def test_opcheck_forward(dtype, requires_grad, temperature, ranges):
    args = forward_args(dtype, requires_grad, temperature, ranges, causal=True)
    torch.library.opcheck(torch.ops.continuum.forward.default, args)
    # with the row statistics for the backward (what attention() asks for under autograd)
    torch.library.opcheck(torch.ops.continuum.forward.default, args + (True,))


EXPLICIT = [(d, c) for d, c in DTYPE_COMPUTE if c != "default"]


@pytest.mark.parametrize("dtype,compute", EXPLICIT,
                         ids=[f"{str(d).split('.')[-1]}-{c}" for d, c in EXPLICIT])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_forward_compute(dtype, compute, requires_grad):
    args = forward_args(dtype, requires_grad, "query", True, causal=True, compute=compute)
    torch.library.opcheck(torch.ops.continuum.forward.default, args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_forward_without_compute(dtype):
    """Callers that stop after `scale` (the schema before `compute`) keep working."""
    args = forward_args(dtype, True, "head", False, causal=True)[:-1]
    torch.library.opcheck(torch.ops.continuum.forward.default, args)
    full_args = forward_args(dtype, False, None, False)
    full = torch.ops.continuum.forward(*full_args)
    short = torch.ops.continuum.forward(*full_args[:-1])
    assert all(torch.equal(a, b) for a, b in zip(full, short))


@pytest.mark.parametrize("dtype,compute", DTYPE_COMPUTE, ids=IDS)
def test_opcheck_forward_softmax_window(dtype, compute):
    args = list(forward_args(dtype, True, None, False, causal=True, window=(2, 0), compute=compute))
    args[3] = "softmax"
    torch.library.opcheck(torch.ops.continuum.forward.default, tuple(args))


@pytest.mark.parametrize("dtype,compute", DTYPE_COMPUTE, ids=IDS)
def test_opcheck_backward(dtype, compute):
    q, k, v, kernel, causal, wl, wr, lo, hi, t, tv, scale, compute = forward_args(
        dtype, False, "head", False, compute=compute)
    for with_stats in (False, True):
        out, lse, stats, ref = torch.ops.continuum.forward(q, k, v, kernel, causal, wl, wr, lo, hi, t,
                                                           tv, scale, compute, with_stats)
        assert (stats.numel() > 0) == with_stats and (ref.numel() > 0) == with_stats
        do = uniform(*out.shape, dtype=dtype)
        torch.library.opcheck(torch.ops.continuum.backward.default,
                              (do, q, k, v, out, lse, stats, ref, kernel, causal, wl, wr, lo, hi, t, tv,
                               scale, compute))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_backward_without_compute(dtype):
    q, k, v, kernel, causal, wl, wr, lo, hi, t, tv, scale, _ = forward_args(dtype, False, "head", False)
    out, lse, stats, ref = torch.ops.continuum.forward(q, k, v, kernel, causal, wl, wr, lo, hi, t, tv,
                                                       scale)
    do = uniform(*out.shape, dtype=dtype)
    torch.library.opcheck(torch.ops.continuum.backward.default,
                          (do, q, k, v, out, lse, stats, ref, kernel, causal, wl, wr, lo, hi, t, tv,
                           scale))
