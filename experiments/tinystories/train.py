"""Training, evaluation and checkpoints (docs/MATH.md §9 protocol).

One run = one (kernel, seed, context, tau) with the config's budget: AdamW,
linear warm-up then cosine to min_lr_ratio*lr, global-norm clipping, the same
initial weights and batch order for every kernel of a seed. Validation curves
use the *selection* slice only; the reported numbers are the final model on the
*test* slices, which take part in no choice. Under ``torchrun`` the global batch
is split over the ranks (DDP), so the batches, and the result up to rounding,
do not depend on the number of processes.
"""
from __future__ import annotations

import json
import math
import os
import platform
import stat
import tempfile
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
# Imported before any process group exists: its functions' `group=group.WORLD`
# defaults are evaluated at import, and DDP imports it (through torch._dynamo);
# imported after init_process_group it pins the default group, so
# destroy_process_group() frees nothing and the group's threads can abort the
# process at interpreter exit ("terminate called without an active exception";
# python/tests/ddp_worker.py).
if dist.is_available():
    import torch.distributed.nn  # noqa: F401
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from safetensors import SafetensorError, safe_open
from continuum_attention import cpu_model
from tqdm import tqdm

from config import Config
from data import BatchSampler, Slice, check_disjoint, eval_windows
from model import Decoder


def _atomic(path: str, write) -> None:
    """Create `path` through a temporary file in the same folder, written by
    write(tmp_path), and a rename. A symlink is followed (the file it points to
    is replaced, the link stays); a target that exists and is not a regular file
    (a device, a FIFO, a folder) is an error, nothing is written. The new file
    gets the mode a plain open() would give it: the old file's, else 0666 & ~umask."""
    if os.path.islink(path):
        path = os.path.realpath(path)
    mode = None
    if os.path.lexists(path):
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"cannot write {path!r}: not a regular file")
        mode = stat.S_IMODE(st.st_mode)
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)  # after write: save_file replaces tmp by a new 0600 file
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a
    rename (_atomic: symlinks followed, only regular files replaced)."""
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    _atomic(path, write)


def write_json(path: str, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


def save_checkpoint(model: Decoder, path: str, extra: Optional[dict] = None) -> None:
    """safetensors, float32, the config in the metadata (format "continuum-lm")."""
    meta = {"format": "continuum-lm", "config": json.dumps(model.cfg.to_dict())}
    if extra:
        meta["run"] = json.dumps(extra)
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    _atomic(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def load_checkpoint(path: str) -> Decoder:
    """The model of a checkpoint save_checkpoint wrote; ValueError naming `path`
    for a file that is unreadable, truncated, not a continuum-lm checkpoint, or
    whose tensors do not match its config (missing, unexpected, wrong shape) or
    hold a NaN or an infinity (as continuum-lm refuses them)."""
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != "continuum-lm" or "config" not in meta:
            raise ValueError(f"{path}: not a continuum-lm checkpoint (no config in the metadata)")
        try:
            cfg = Config.from_dict(json.loads(meta["config"]))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: bad config in the checkpoint's metadata: {e}") from None
        tensors = load_file(path)
    except (OSError, SafetensorError) as e:
        raise ValueError(f"{path}: cannot read the checkpoint: {e}") from None
    model = Decoder(cfg)
    want = model.state_dict()
    missing, unexpected = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    shapes = [f"{k} {tuple(tensors[k].shape)} (config: {tuple(want[k].shape)})"
              for k in sorted(set(want) & set(tensors)) if tensors[k].shape != want[k].shape]
    for what, names in (("missing tensors", missing), ("unexpected tensors", unexpected),
                        ("wrong shapes", shapes)):
        if names:
            raise ValueError(f"{path}: the checkpoint does not match its config: {what} "
                             f"{', '.join(names)}")
    for k in sorted(tensors):
        if not torch.isfinite(tensors[k]).all():
            raise ValueError(f"{path}: tensor {k!r} has a non-finite value")
    model.load_state_dict(tensors)
    return model


def check_scorable(data: torch.Tensor, spec: str, max_bytes: int = 0) -> None:
    """n bytes have n - 1 predictions: fewer than 2 bytes (after the cut to the
    first max_bytes when > 0) is an error, not a mean over nothing."""
    n = min(data.numel(), max_bytes) if max_bytes > 0 else data.numel()
    if n < 2:
        cut = f" cut to its first {max_bytes} bytes (eval_bytes)" if 0 < max_bytes < data.numel() else ""
        raise ValueError(f"data: slice {spec!r}{cut} has fewer than 2 bytes (nothing to score)")


@torch.no_grad()
def evaluate(model: Decoder, data: torch.Tensor, max_bytes: int = 0, spec: str = "data") -> Dict[str, float]:
    """Mean NLL in nats/byte over the n - 1 predictions of `data` (its first
    max_bytes when > 0), non-overlapping windows of `context` (data.eval_windows).
    ValueError naming `spec` (the slice) for fewer than 2 bytes (check_scorable)."""
    cfg = model.cfg
    check_scorable(data, spec, max_bytes)
    if max_bytes > 0:
        data = data[:max_bytes]
    was = model.training
    model.eval()
    total, count = 0.0, 0
    wins = eval_windows(data.numel(), cfg.context)
    i = 0
    while i < len(wins):
        j = i
        while j < len(wins) and wins[j][1] == wins[i][1] and j - i < cfg.eval_batch:
            j += 1
        L = wins[i][1]
        idx = torch.stack([data[b:b + L + 1] for b, _ in wins[i:j]]).long().to(
            next(model.parameters()).device)
        with _autocast(cfg, data.device.type):
            logits = model(idx[:, :-1])
        nll = F.cross_entropy(logits.reshape(-1, 256), idx[:, 1:].reshape(-1), reduction="sum")
        total += float(nll.double())
        count += idx[:, 1:].numel()
        i = j
    model.train(was)
    return {"nats_per_byte": total / count, "bytes": count}


def _autocast(cfg: Config, device: str):
    return torch.autocast(device, dtype=torch.bfloat16, enabled=cfg.autocast == "bf16")


def lr_at(cfg: Config, step: int) -> float:
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    t = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + 0.5 * (cfg.lr - lo) * (1 + math.cos(math.pi * t))


def machine(device: str = "cpu") -> dict:
    m = {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
         "torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version()}
    if device == "cuda":
        m["gpu"] = torch.cuda.get_device_name()
    return m


def train(cfg: Config, train_data: Slice, select: Slice, tests: List[Slice], out_dir: str,
          device: str = "cpu", progress: bool = True) -> dict:
    """Train one run; writes out_dir/model.safetensors and out_dir/result.json
    (rank 0) and returns the result."""
    cfg.validate()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    own_group = world > 1 and not dist.is_initialized()
    if own_group:
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} is not a multiple of the {world} processes")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # Before any training: the test slices are scored only at the end.
    check_disjoint(train_data, select, tests)
    check_scorable(select.data, select.spec, cfg.eval_bytes)
    for s in tests:
        check_scorable(s.data, s.spec)
    torch.set_num_threads(cfg.threads)

    model = Decoder(cfg)
    model.init_weights(cfg.seed)
    model.to(device)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    dec, no = model.decay_parameters()
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": cfg.weight_decay},
                             {"params": no, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
    sampler = BatchSampler(train_data.data, cfg.context, cfg.batch_size, cfg.seed)
    per = cfg.batch_size // world
    curve = []

    def curve_point(step):
        if rank == 0:
            r = evaluate(model, select.data.to(device), cfg.eval_bytes, select.spec)
            curve.append({"step": step, "train_bytes": step * cfg.batch_size * cfg.context,
                          "select_nats_per_byte": r["nats_per_byte"]})
            return r["nats_per_byte"]

    nparams = sum(p.numel() for p in model.parameters())
    bar = tqdm(total=cfg.steps, disable=not progress or rank != 0, unit="step", dynamic_ncols=True,
               desc=f"{cfg.attention} seed {cfg.seed}")
    train_time, losses = 0.0, []
    for step in range(cfg.steps):
        if cfg.eval_every and step % cfg.eval_every == 0:
            v = curve_point(step)
            if v is not None:
                bar.set_postfix_str(f"select {v:.4f}", refresh=False)
        x, y = sampler.next()
        x, y = x[rank * per:(rank + 1) * per].to(device), y[rank * per:(rank + 1) * per].to(device)
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        with _autocast(cfg, device):
            logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        train_time += time.perf_counter() - t0
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"training diverged at step {step} (loss {loss.item()})")
        losses.append(loss.item())
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix_str(f"loss {loss.item():.3f} "
                                f"{(step + 1) * cfg.batch_size * cfg.context / train_time:,.0f} tok/s",
                                refresh=False)
    bar.close()
    result = None
    if rank == 0:
        curve_point(cfg.steps)
        evals = {s.label: evaluate(model, s.data.to(device), spec=s.spec) for s in [select] + tests}
        result = {
            "config": cfg.to_dict(),
            "kernel": cfg.attention, "seed": cfg.seed, "context": cfg.context,
            "parameters": nparams,
            # Labels (file names and fractions), not the caller's paths: results
            # are committed and compared across machines.
            "train": {"text": train_data.label, "bytes": int(train_data.data.numel()),
                      "train_bytes": cfg.tokens_budget,
                      "passes": cfg.tokens_budget / train_data.data.numel(),
                      "final_train_loss_last50": sum(losses[-50:]) / max(len(losses[-50:]), 1)},
            "select": select.label, "tests": [s.label for s in tests],
            "eval": evals, "curve": curve,
            "temperatures": model.temperatures(),
            "time": {"train_seconds": train_time,
                     "tokens_per_second": cfg.tokens_budget / train_time if train_time else None,
                     "processes": world, "device": device},
            "machine": machine(device),
        }
        save_checkpoint(model, os.path.join(out_dir, "model.safetensors"),
                        {"kernel": cfg.attention, "seed": cfg.seed})
        write_json(os.path.join(out_dir, "result.json"), result)
    if world > 1:
        dist.barrier()
    if own_group:  # DDP's reducer lets go of the group first, so that destroying it joins its threads
        del net
        dist.destroy_process_group()
    return result
