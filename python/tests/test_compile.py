"""torch.compile(fullgraph=True) of a small module using the operator: no
graph break (the operator is opaque to Dynamo through its fake kernel), and
forward and gradients equal eager bit for bit (the same C++ kernels run;
the surrounding projections are compiled, so allow float64 rounding)."""
import torch

import continuum_attention as ca
from conftest import uniform


class Block(torch.nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=torch.float64)
        self.proj = torch.nn.Linear(dim, dim, dtype=torch.float64)
        self.log_tau = torch.nn.Parameter(torch.zeros(heads, dtype=torch.float64))

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, C // self.heads).unbind(2)
        # BSHD -> BHSD views, no copies
        o = ca.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                         temperature=self.log_tau.exp())
        return self.proj(o.transpose(1, 2).reshape(B, L, C))


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    m = Block()
    x = uniform(2, 12, 16)
    eager = m(x)
    g_eager = torch.autograd.grad(eager.square().sum(), list(m.parameters()))
    compiled = torch.compile(m, fullgraph=True)
    out = compiled(x)
    g_comp = torch.autograd.grad(out.square().sum(), list(m.parameters()))
    assert torch.allclose(out, eager, rtol=0, atol=1e-13)
    for a, b in zip(g_comp, g_eager):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_compiled_autograd_of_an_eager_forward():
    """Compiled autograd (the backward graph compiled at .backward()) of a
    forward that ran eagerly, with a tensor temperature: the gradients are
    eager's, bit for bit. (The operator's C++ autograd function must mark no
    output non-differentiable: compiled autograd asserts that of C++ functions.)"""
    gen = torch.Generator().manual_seed(7)
    q, k, v, do = (uniform(1, 2, 6, 4, gen=gen) for _ in range(4))
    t = torch.tensor([0.7, 1.3], dtype=torch.float64)

    def grads(compiled):
        torch._dynamo.reset()
        qq, tt = q.clone().requires_grad_(), t.clone().requires_grad_()
        out = ca.attention(qq, k, v, causal=True, temperature=tt)
        if compiled:
            with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
                out.backward(do)
        else:
            out.backward(do)
        return qq.grad, tt.grad

    for a, b in zip(grads(True), grads(False)):
        assert torch.equal(a, b)
