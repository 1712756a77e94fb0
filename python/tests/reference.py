"""An independent float64 evaluation of MATH.md §3-§4 in PyTorch, for the tests.

Not the library's closed form: every segment of the piecewise-linear memory
curve is integrated by Gauss-Legendre quadrature (32 nodes; the integrand
exp of a linear function with |slope| ≤ ~10 here is resolved to ~1e-16
relative; `panels` = n splits each segment into n pieces of 32 nodes each, for
slopes up to ~10 n), with the flat half-cells at the ends of each row's visible range
(MATH.md §2), and the visibility of MATH.md §3 written out from its definition.
Plain autograd through it gives reference gradients. This mirrors the NumPy
quadrature of examples/attn/check_numpy.py, vectorised and with the
(left, right) window.
"""
import numpy as np
import torch

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(32)


def visibility_mask(B, Lq, Lk, causal=False, window=(-1, -1), ranges=None):
    """bool [B, Lq, Lk]: key j visible to query i (MATH.md §3)."""
    i = torch.arange(Lq).view(Lq, 1)
    j = torch.arange(Lk).view(1, Lk)
    diag = i + (Lk - Lq)
    vis = torch.ones(Lq, Lk, dtype=torch.bool)
    if causal:
        vis &= j <= diag
    left, right = window
    if left >= 0:
        vis &= j >= diag - left
    if right >= 0:
        vis &= j <= diag + right
    vis = vis.expand(B, Lq, Lk).clone()
    if ranges is not None:
        lo, hi = (r.to(torch.int64).view(B, Lq, 1) for r in ranges)
        vis &= (j.view(1, 1, Lk) >= lo) & (j.view(1, 1, Lk) < hi)
    return vis


def attention(q, k, v, kernel="continuum", causal=False, window=(-1, -1), ranges=None,
              temperature=1.0, scale=None, probe=None, panels=1):
    """(out, lse) as continuum_attention.attention, in the dtype of q (use float64).
    panels: Gauss-Legendre pieces per segment (module docstring), for sharp rows.
    probe (a dict, optional) receives the scores s [B, Hq, Lq, Lk] (whose .grad
    after a backward is dS), the weights P and c = scale / τ [B, Hq, Lq, 1]."""
    B, Hq, Lq, D = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    g = Hq // Hk
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scale = 1.0 / D ** 0.5 if scale is None else scale
    tau = torch.as_tensor(temperature, dtype=q.dtype)
    if tau.dim() == 1:
        tau = tau.view(1, Hq, 1)
    c = (scale / tau).expand(B, Hq, Lq).unsqueeze(-1)
    s = c * (q @ k.transpose(-1, -2))                       # [B, Hq, Lq, Lk]
    if probe is not None and s.requires_grad:
        s.retain_grad()
    vis = visibility_mask(B, Lq, Lk, causal, window, ranges).unsqueeze(1).expand_as(s)
    neg = torch.tensor(-torch.inf, dtype=s.dtype)
    m = torch.where(vis, s, neg).amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    zero = torch.zeros((), dtype=s.dtype)
    sm = torch.where(vis, s - m, zero)
    if kernel in ("softmax", "focal"):
        alpha = torch.where(vis, torch.exp(sm), zero)
    else:
        nodes = ((_NODES[None, :] + 1) / 2 + np.arange(panels)[:, None]) / panels
        u = torch.tensor(nodes.ravel(), dtype=s.dtype)
        w = torch.tensor(np.tile(_WEIGHTS / 2 / panels, panels), dtype=s.dtype)
        seg = vis[..., :-1] & vis[..., 1:]                   # segment j -> j+1 on the curve
        x, y = sm[..., :-1, None], sm[..., 1:, None]
        e = torch.exp((1 - u) * x + u * y)                   # [..., Lk-1, nodes]
        to_left = torch.where(seg, (w * (1 - u) * e).sum(-1), zero)
        to_right = torch.where(seg, (w * u * e).sum(-1), zero)
        alpha = torch.zeros_like(s)
        alpha = alpha + torch.nn.functional.pad(to_left, (0, 1)) + \
            torch.nn.functional.pad(to_right, (1, 0))
        pad_false = torch.zeros_like(vis[..., :1])
        first = vis & ~torch.cat([pad_false, vis[..., :-1]], -1)   # lo_i: flat half-cell
        last = vis & ~torch.cat([vis[..., 1:], pad_false], -1)     # hi_i - 1
        half = torch.where(vis, torch.exp(sm) / 2, zero)
        alpha = alpha + half * first + half * last
    Z = alpha.sum(-1, keepdim=True)
    empty = Z == 0
    P = alpha / torch.where(empty, torch.ones_like(Z), Z)
    if probe is not None:
        probe.update(s=s, P=P, c=c)
    out = P @ v
    lse = torch.where(empty, neg, m + torch.log(torch.where(empty, torch.ones_like(Z), Z)))
    return out, lse.squeeze(-1)
