"""Text slices, the training batch order and the evaluation windows.

A slice is ``PATH`` or ``PATH:FROM:TO`` with 0 <= FROM < TO <= 1: the bytes
[floor(FROM*n), floor(TO*n)) of the file (TO = 1 means the end); several
``+``-joined specs are concatenated (``train.txt+train-extra.txt``). A run's
training text, selection slice and test slices share no byte of a file
(check_disjoint; test slices may overlap one another).
Evaluation (the metric of docs/MATH.md §9, identical in continuum-lm): a slice of
n bytes has n - 1 predictions (byte t+1 from bytes <= t); they are covered by
consecutive non-overlapping windows of `context` inputs (the last one shorter),
each window scoring every position; the result is the mean NLL in nats per byte.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import List, Tuple

import torch


@dataclass
class Slice:
    spec: str
    data: torch.Tensor  # uint8 [n]
    # The bytes [lo, hi) of each part, the file named by its (device, inode): the
    # same file under another path or link is the same file (check_disjoint).
    parts: Tuple[Tuple[Tuple[int, int], int, int], ...] = ()

    @property
    def label(self) -> str:
        return "+".join(_label(s) for s in self.spec.split("+"))


def _label(spec: str) -> str:
    path, a, b = _parse(spec)
    base = os.path.basename(path)
    return base if (a, b) == (0.0, 1.0) else f"{base}[{a:g},{b:g})"


def _parse(spec: str) -> Tuple[str, float, float]:
    parts = spec.rsplit(":", 2)
    if len(parts) == 3:
        try:
            a, b = float(parts[1]), float(parts[2])
        except ValueError:
            return spec, 0.0, 1.0
        if not (math.isfinite(a) and math.isfinite(b) and 0 <= a < b <= 1):
            raise ValueError(f"data: bad range in {spec!r}: need 0 <= FROM < TO <= 1")
        return parts[0], a, b
    return spec, 0.0, 1.0


def load_slice(spec: str) -> Slice:
    chunks, parts = [], []
    for one in spec.split("+"):
        path, a, b = _parse(one)
        if os.path.isdir(path):
            raise ValueError(f"data: {path!r} is a directory, not a text file")
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ValueError(f"data: cannot read {path!r}: {e.strerror}") from None
        n = len(raw)
        if n == 0:
            raise ValueError(f"data: {path!r} is empty")
        lo, hi = math.floor(a * n), (n if b == 1 else math.floor(b * n))
        if hi <= lo:
            raise ValueError(f"data: slice {one!r} of a {n}-byte file is empty")
        chunks.append(raw[lo:hi])
        st = os.stat(path)
        parts.append(((st.st_dev, st.st_ino), lo, hi))
    return Slice(spec, torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8), tuple(parts))


def check_disjoint(train: Slice, select: Slice, tests: List[Slice]) -> None:
    """Raise ValueError when the training text shares a byte of a file with the
    selection or a test slice, or the selection slice with a test slice (docs/MATH.md
    §9: held-out text is held out). Test slices may overlap one another."""
    roles = [("the training text", train), ("the selection slice", select)]
    roles += [("the test slice", t) for t in tests]
    for i, (name_a, a) in enumerate(roles):
        for name_b, b in roles[i + 1:]:
            if name_a == name_b == "the test slice":
                continue
            for file_a, lo_a, hi_a in a.parts:
                for file_b, lo_b, hi_b in b.parts:
                    lo, hi = max(lo_a, lo_b), min(hi_a, hi_b)
                    if file_a == file_b and lo < hi:
                        raise ValueError(f"data: {name_b} {b.spec!r} overlaps {name_a} {a.spec!r} "
                                         f"(bytes [{lo}, {hi}) of the same file); held-out text must "
                                         f"not be trained on, nor tested on after selecting on it")


class BatchSampler:
    """Random training windows: offsets uniform in [0, n - context), drawn from
    a generator seeded by the run's seed alone, so every kernel of a seed sees
    the same batches in the same order (docs/MATH.md §9)."""

    def __init__(self, data: torch.Tensor, context: int, batch: int, seed: int):
        if data.numel() < context + 1:
            raise ValueError(f"data: the training text has {data.numel()} bytes, fewer than "
                             f"context + 1 = {context + 1}")
        self.data, self.context, self.batch = data, context, batch
        self.gen = torch.Generator().manual_seed(1_000_003 * seed + 2)
        self._ar = torch.arange(context + 1)

    def next(self) -> Tuple[torch.Tensor, torch.Tensor]:
        span = self.data.numel() - self.context
        off = torch.randint(0, span, (self.batch,), generator=self.gen)
        w = self.data[off[:, None] + self._ar].long()
        return w[:, :-1], w[:, 1:]


def eval_windows(n: int, context: int) -> List[Tuple[int, int]]:
    """(begin, length) of the windows covering the n - 1 predictions of n bytes."""
    last = n - 1
    return [(b, min(b + context, last) - b) for b in range(0, max(last, 0), context)]
