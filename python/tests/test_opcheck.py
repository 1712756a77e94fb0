"""torch.library.opcheck on both operators: schema, fake (meta) kernels,
autograd registration and AOT dispatch, for every CPU dtype, with and
without gradients."""
import pytest
import torch

from conftest import uniform
import continuum_attention  # noqa: F401  (registers the operators)

DTYPES = [torch.float32, torch.float64]


def forward_args(dtype, requires_grad, temperature, ranges, causal=False, window=(-1, -1)):
    B, Hq, Hk, L, D = 2, 4, 2, 6, 8
    q = uniform(B, Hq, L, D, dtype=dtype, requires_grad=requires_grad)
    k = uniform(B, Hk, L, D, dtype=dtype, requires_grad=requires_grad)
    v = uniform(B, Hk, L, 5, dtype=dtype, requires_grad=requires_grad)
    t = None
    if temperature == "head":
        t = (torch.rand(Hq, dtype=dtype) + 0.5).requires_grad_(requires_grad)
    elif temperature == "query":
        t = (torch.rand(B, Hq, L, dtype=dtype) + 0.5).requires_grad_(requires_grad)
    lo = hi = None
    if ranges:
        lo = torch.zeros(B, L, dtype=torch.int64)
        hi = torch.full((B, L), L, dtype=torch.int64)
        hi[1, 2] = 3
    return (q, k, v, "continuum", causal, window[0], window[1], lo, hi, t, 0.7, None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("temperature", [None, "head", "query"])
@pytest.mark.parametrize("ranges", [False, True], ids=["noranges", "ranges"])
def test_opcheck_forward(dtype, requires_grad, temperature, ranges):
    args = forward_args(dtype, requires_grad, temperature, ranges, causal=True)
    torch.library.opcheck(torch.ops.continuum.forward.default, args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_forward_softmax_window(dtype):
    args = list(forward_args(dtype, True, None, False, causal=True, window=(2, 0)))
    args[3] = "softmax"
    torch.library.opcheck(torch.ops.continuum.forward.default, tuple(args))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_backward(dtype):
    q, k, v, kernel, causal, wl, wr, lo, hi, t, tv, scale = forward_args(dtype, False, "head", False)
    out, lse = torch.ops.continuum.forward(q, k, v, kernel, causal, wl, wr, lo, hi, t, tv, scale)
    do = uniform(*out.shape, dtype=dtype)
    torch.library.opcheck(torch.ops.continuum.backward.default,
                          (do, q, k, v, out, lse, kernel, causal, wl, wr, lo, hi, t, tv, scale))
