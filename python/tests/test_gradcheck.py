"""torch.autograd.gradcheck (float64 central differences against the analytic
C++ backward, MATH.md §6) for q, k, v and every temperature shape, with causal,
window, ranges and GQA. gradcheck's defaults (eps 1e-6, atol 1e-5, rtol 1e-3)
are loose compared with the library (~1e-9 agreement with finite differences),
so test_reference.py checks the same gradients to 1e-12 as well."""
import pytest
import torch

import continuum_attention as ca
from conftest import uniform

B, HQ, HK, L, D, DV = 1, 4, 2, 7, 4, 3


def temperature_of(shape):
    if shape == "float":
        return 0.6
    if shape == "scalar":
        return torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    if shape == "head":
        return (torch.rand(HQ, dtype=torch.float64) + 0.4).requires_grad_()
    return (torch.rand(B, HQ, L, dtype=torch.float64) + 0.4).requires_grad_()


VIS = {
    "full": dict(),
    "causal": dict(causal=True),
    "window_causal": dict(causal=True, window=(2, 0)),
    "window_local": dict(window=(1, 2)),
    "ranges": dict(ranges=(torch.tensor([[0, 1, 2, 0, 3, 3, 1]]), torch.tensor([[7, 4, 6, 1, 3, 7, 7]]))),
}


@pytest.mark.parametrize("kernel", ["continuum", "softmax"])
@pytest.mark.parametrize("temperature", ["float", "scalar", "head", "query"])
@pytest.mark.parametrize("vis", VIS)
def test_gradcheck(kernel, temperature, vis):
    q = uniform(B, HQ, L, D, requires_grad=True)
    k = uniform(B, HK, L, D, requires_grad=True)   # GQA: 2 query heads per KV head
    v = uniform(B, HK, L, DV, requires_grad=True)
    t = temperature_of(temperature)
    inputs = (q, k, v) + ((t,) if isinstance(t, torch.Tensor) else ())

    def f(q, k, v, *rest):
        return ca.attention(q, k, v, kernel=kernel, temperature=rest[0] if rest else t, **VIS[vis])

    assert torch.autograd.gradcheck(f, inputs)


def test_gradcheck_non_contiguous_views():
    """BSHD tensors seen through .transpose(1, 2) (no copy), Lq != Lk, Dv != D."""
    q = uniform(B, 5, HQ, D).transpose(1, 2).requires_grad_()
    k = uniform(B, 8, HK, D).transpose(1, 2).requires_grad_()
    v = uniform(B, 8, HK, DV).transpose(1, 2).requires_grad_()
    assert not q.is_contiguous()
    assert torch.autograd.gradcheck(lambda q, k, v: ca.attention(q, k, v, causal=True), (q, k, v))


def test_no_grad_for_lse():
    q, k, v = (uniform(B, HQ, L, D, requires_grad=True) for _ in range(3))
    k, v = k[:, :HK].detach().requires_grad_(), v[:, :HK].detach().requires_grad_()
    out, lse = ca.attention(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def test_double_backward_raises():
    q = uniform(1, 1, 4, 4, requires_grad=True)
    g, = torch.autograd.grad(ca.attention(q, q, q).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward.*not implemented"):
        g.sum().backward()


@pytest.mark.parametrize("mode", ["jvp", "jacfwd", "dual_query", "dual_value", "dual_temperature",
                                  "backward_dual_out", "backward_dual_lse"])
def test_forward_mode_ad_raises(mode):
    """No forward-mode rule is derived (MATH.md §6 gives the backward only), so
    a tangent must raise, not be dropped: before the check, jacfwd returned an
    all-zero Jacobian and a dual input's output had no tangent."""
    import torch.autograd.forward_ad as fwAD
    q, k, v = (uniform(1, 1, 4, 3) for _ in range(3))
    t = torch.tensor(0.6, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="forward-mode automatic differentiation.*not implemented"):
        if mode == "jvp":
            torch.func.jvp(lambda q: ca.attention(q, k, v), (q,), (torch.ones_like(q),))
        elif mode == "jacfwd":
            torch.func.jacfwd(lambda v: ca.attention(q, k, v, causal=True))(v)
        elif mode.startswith("backward_"):  # the backward operator, called directly
            out, lse, stats, ref = torch.ops.continuum.forward(q, k, v, "continuum", False, -1, -1, None, None,
                                                               None, 1.0, None)
            grad_out = torch.ones_like(out)
            with torch.no_grad(), fwAD.dual_level():
                if mode == "backward_dual_out":
                    out = fwAD.make_dual(out, torch.ones_like(out))
                else:
                    lse = fwAD.make_dual(lse, torch.ones_like(lse))
                torch.ops.continuum.backward(grad_out, q, k, v, out, lse, stats, ref, "continuum", False, -1, -1,
                                             None, None, None, 1.0, None)
        else:
            with fwAD.dual_level():
                if mode == "dual_query":
                    q = fwAD.make_dual(q, torch.randn_like(q))
                elif mode == "dual_value":
                    v = fwAD.make_dual(v, torch.randn_like(v))
                else:
                    t = fwAD.make_dual(t, torch.ones_like(t))
                ca.attention(q, k, v, temperature=t)
