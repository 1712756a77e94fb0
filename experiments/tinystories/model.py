"""The byte-level decoder of the experiment (docs/MATH.md §9), in PyTorch, with
every attention kernel -- continuum, softmax, focal -- through the one operator
``continuum_attention.attention`` so that the arms differ only in the kernel.

    x0     = wte[byte] + wpe[position]
    block: x = x + c_proj(Attention(c_attn(ln_1(x))));  x = x + mlp(ln_2(x))
    logits = ln_f(x) @ wte^T                     (tied output projection)

Pre-LN (eps 1e-5), exact-erf GELU MLP of width mlp_mult*d_model, causal
attention with scale 1/sqrt(head_dim) and temperature tau: fixed, a learned
per-layer log tau (``learn_temperature``), or focal's learned per-token
tau_i = clip(ln_1(x)_i . w + b, tau_min, tau_max) shared by the heads (docs/MATH.md §8;
b starts at tau, w at 0, so every arm starts at the same tau).

Weights are stored [in, out] (y = x @ W + b) under GPT-2's names: the state dict
is exactly the checkpoint layout that continuum-lm (examples/lm) reads.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import continuum_attention

from config import Config


class Linear(nn.Module):
    """y = x @ weight + bias with weight [in, out] (the checkpoint's layout)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        C = cfg.d_model
        self.cfg = cfg
        self.c_attn = Linear(C, 3 * C)
        self.c_proj = Linear(C, C)
        if cfg.focal_learned:
            self.focal = nn.Module()
            self.focal.weight = nn.Parameter(torch.zeros(C))
            self.focal.bias = nn.Parameter(torch.full((1,), cfg.temperature))
        elif cfg.scalar_learned:
            self.log_temperature = nn.Parameter(torch.full((1,), math.log(cfg.temperature)))

    def temperature(self, h):
        """tau for the operator: a number, a 0-d tensor, or [B, H, L] (focal)."""
        cfg = self.cfg
        if cfg.focal_learned:
            raw = h.float() @ self.focal.weight + self.focal.bias       # [B, L]
            tau = raw.clamp(cfg.focal_tau_min, cfg.focal_tau_max)
            return tau[:, None, :].expand(h.shape[0], cfg.n_head, h.shape[1])
        if cfg.scalar_learned:
            return self.log_temperature.exp().reshape(())
        return cfg.temperature

    def forward(self, h, return_weights=False):
        cfg = self.cfg
        B, L, C = h.shape
        H, Dh = cfg.n_head, cfg.head_dim
        qkv = self.c_attn(h).view(B, L, 3, H, Dh)
        # [B, H, L, Dh] views of the packed projection (no copies); the CPU
        # operator runs in float32 even under bf16 autocast.
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        if q.device.type == "cpu" and q.dtype != torch.float32:
            q, k, v = q.float(), k.float(), v.float()
        kernel = "softmax" if cfg.attention == "focal" and not cfg.focal_learned else cfg.attention
        tau = self.temperature(h)
        if return_weights:  # P, read off the operator itself: values = identity
            eye = torch.eye(L, dtype=q.dtype).expand(B, H, L, L)
            return continuum_attention.attention(q, k, eye, kernel=kernel, causal=True,
                                                 temperature=tau)
        a = continuum_attention.attention(q, k, v, kernel=kernel, causal=True, temperature=tau)
        return self.c_proj(a.transpose(1, 2).reshape(B, L, C).to(h.dtype))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.c_fc = Linear(cfg.d_model, cfg.mlp_mult * cfg.d_model)
        self.c_proj = Linear(cfg.mlp_mult * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(256, cfg.d_model))
        self.wpe = nn.Parameter(torch.empty(cfg.context, cfg.d_model))
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=1e-5)

    @torch.no_grad()
    def init_weights(self, seed: int):
        """N(0, init_std) for matrices and embeddings (c_proj weights scaled by
        1/sqrt(2 n_layer)), zero biases, unit LayerNorm gains; drawn in a fixed
        order from a generator seeded by `seed` alone, so the parameters every
        kernel shares start equal for a seed (kernel-specific ones are constants)."""
        g = torch.Generator().manual_seed(1_000_003 * seed + 1)
        sd, sd_res = self.cfg.init_std, self.cfg.init_std / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if ".focal." in name or name.endswith("log_temperature"):
                continue  # set in the constructor
            if p.dim() == 1:
                p.fill_(1.0 if "ln_" in name and name.endswith(".weight") else 0.0)
            else:
                s = sd_res if name.endswith("c_proj.weight") else sd
                p.copy_(torch.randn(p.shape, generator=g) * s)

    def forward(self, idx):
        """idx: [B, L] int64 bytes, L <= context. Returns logits [B, L, 256] (float32)."""
        B, L = idx.shape
        if L > self.cfg.context:
            raise ValueError(f"sequence length {L} exceeds the context {self.cfg.context}")
        x = self.wte[idx] + self.wpe[:L]
        for blk in self.h:
            x = blk(x)
        return (self.ln_f(x) @ self.wte.t()).float()

    def decay_parameters(self):
        """(with weight decay, without): matrices and embeddings decay."""
        dec, no = [], []
        for p in self.parameters():
            (dec if p.dim() >= 2 else no).append(p)
        return dec, no

    def temperatures(self):
        """Per layer: the fixed tau, the learned tau, or focal's (w, b)."""
        out = []
        for blk in self.h:
            a = blk.attn
            if self.cfg.focal_learned:
                out.append({"focal_bias": a.focal.bias.item(),
                            "focal_weight_norm": a.focal.weight.norm().item()})
            elif self.cfg.scalar_learned:
                out.append({"tau": a.log_temperature.exp().item()})
            else:
                out.append({"tau": self.cfg.temperature})
        return out
