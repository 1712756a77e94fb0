"""The experiment's configuration and its named presets (docs/MATH.md §9).

One flat dataclass: model shape and attention (the fields `continuum-lm`, the C++
inference example, reads from a checkpoint), then the training budget and
optimiser (used by the trainer only). Every field is a command-line option of
`main.py train` / `sweep` (``--d-model 96``, ``--learn-temperature``...) and is
stored in each run's result.json and in its checkpoint's metadata.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

KERNELS = ("continuum", "softmax", "focal")


@dataclass
class Config:
    preset: str = "cpu"
    # -- model (read by continuum-lm) --
    n_layer: int = 4
    d_model: int = 64
    n_head: int = 2
    context: int = 192
    mlp_mult: int = 4
    attention: str = "continuum"
    temperature: float = 0.30
    learn_temperature: bool = False
    focal_fixed: bool = False
    focal_tau_min: float = 0.05
    focal_tau_max: float = 2.0
    # -- training (trainer only) --
    batch_size: int = 16
    steps: int = 2510
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    init_std: float = 0.02
    eval_every: int = 250
    eval_bytes: int = 16384
    eval_batch: int = 16
    seed: int = 0
    threads: int = 2
    autocast: str = "none"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def focal_learned(self) -> bool:
        return self.attention == "focal" and not self.focal_fixed

    @property
    def scalar_learned(self) -> bool:
        return self.learn_temperature and not self.focal_learned

    @property
    def tokens_budget(self) -> int:
        return self.steps * self.batch_size * self.context

    def validate(self) -> "Config":
        def need(ok, msg):
            if not ok:
                raise ValueError(f"config: {msg}")
        need(self.attention in KERNELS, f"attention must be one of {KERNELS}, got {self.attention!r}")
        for name in ("n_layer", "d_model", "n_head", "context", "mlp_mult", "batch_size", "eval_batch",
                     "threads"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(self.d_model % self.n_head == 0,
             f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")
        need(self.steps >= 0 and self.warmup_steps >= 0 and self.eval_every >= 0,
             "steps, warmup_steps and eval_every must be >= 0")
        for name in ("temperature", "lr", "focal_tau_min", "focal_tau_max", "init_std"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, f"{name} must be finite and > 0, got {v}")
        need(self.focal_tau_min < self.focal_tau_max, "focal_tau_min must be < focal_tau_max")
        need(0 <= self.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]")
        need(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1 and beta2 must be in [0, 1)")
        need(self.weight_decay >= 0 and self.grad_clip >= 0 and self.adam_eps > 0,
             "weight_decay and grad_clip must be >= 0, adam_eps > 0")
        need(self.autocast in ("none", "bf16"), f"autocast must be none or bf16, got {self.autocast!r}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown keys {sorted(unknown)}")
        return cls(**d).validate()


def preset(name: str) -> Config:
    """The named presets:

    cpu   4 layers, d_model 64, 2 heads (head_dim 32), context 192: 228,736
          parameters (focal +260), 2,510 steps x 16 x 192 = 7.71 M training bytes
          per run (10x the 768,000 of the C++ trainer's old `cpu` preset; 1.7
          passes over the 4.5 MB of training text; 34 bytes per parameter, past
          the ~20 tokens per parameter of a compute-optimal budget, so the runs end
          near convergence rather than being stopped early). Sized for 3 kernels x
          5 seeds in about 90 minutes on 2 CPU cores (sweep --jobs 2 --threads 1);
          docs/RESULTS.md gives the measured time.
    cpu-512  the cpu model at the paper's other context, 512 bytes: batches of 6
          windows, so each step sees the same 3,072 bytes as cpu's 16 x 192 and
          a run the same 7.71 M bytes (2,510 steps) and learning-rate schedule.
    cpu-old  the C++ trainer's old `cpu` preset (4 layers, d_model 128, 4 heads,
          250 steps x 16 x 192 = 768,000 bytes), to check that this trainer
          reproduces its numbers.
    paper 6 layers, d_model 256, 8 heads (4.8 M parameters), 20,000 steps x 32 x
          192 = 123 M bytes: the paper's scale, a GPU run.
    demo  the cpu model for 300 steps (a couple of minutes per kernel).
    smoke 2 layers, d_model 32, context 32: seconds (tests).
    """
    c = Config(preset=name)
    if name == "cpu":
        return c
    if name == "cpu-512":
        return dataclasses.replace(c, context=512, batch_size=6)
    if name == "cpu-old":
        return dataclasses.replace(c, d_model=128, n_head=4, steps=250, warmup_steps=25,
                                   eval_every=50, eval_bytes=8192)
    if name == "paper":
        return dataclasses.replace(c, n_layer=6, d_model=256, n_head=8, batch_size=32, steps=20000,
                                   lr=1e-3, warmup_steps=500, eval_every=1000, eval_bytes=262144)
    if name == "demo":
        return dataclasses.replace(c, steps=300, warmup_steps=30, eval_every=100, eval_bytes=8192)
    if name == "smoke":
        return dataclasses.replace(c, n_layer=2, d_model=32, n_head=2, context=32, batch_size=8,
                                   steps=200, warmup_steps=20, eval_every=100, eval_bytes=4096)
    raise ValueError(f"unknown preset {name!r} (expected cpu, cpu-512, cpu-old, paper, demo or smoke)")


PRESETS = ("cpu", "cpu-512", "cpu-old", "paper", "demo", "smoke")
