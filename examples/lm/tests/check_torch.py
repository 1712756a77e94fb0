"""continuum-lm against an independent PyTorch implementation of the checkpoint
contract (examples/lm/README.md, "Checkpoint format" and "The metric").

Writes checkpoints with random weights the way the PyTorch trainer does
(safetensors.torch.save_file, metadata {"format", "config" with the trainer's
extra keys}), runs `continuum-lm logits` and `continuum-lm eval`, and compares
them with a plain-PyTorch float64 forward of the same weights: the layout
(row-vector weights [in, out], c_attn columns [q | k | v], head h = columns
[h*Dh, (h+1)*Dh)), LayerNorm eps 1e-5, exact GELU, tied logits, scale
1/sqrt(head_dim) and the temperatures, and the metric's windows. Softmax and
focal only (they are softmax with a temperature, written here with plain tensor
operations); continuum attention's own tests are the library's.

    python check_torch.py CONTINUUM_LM_EXE TMP_DIR

Exit status 0 when every case agrees, 1 otherwise.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

EXE, TMP = sys.argv[1], sys.argv[2]
os.makedirs(TMP, exist_ok=True)


def config(attention, learn_temperature=False):
    return {"preset": "smoke", "n_layer": 2, "d_model": 16, "n_head": 2, "context": 24, "mlp_mult": 2,
            "attention": attention, "temperature": 0.3, "learn_temperature": learn_temperature,
            "focal_fixed": False, "focal_tau_min": 0.05, "focal_tau_max": 2.0,
            "batch_size": 8, "steps": 200, "lr": 0.003, "seed": 0, "threads": 2, "autocast": "none"}


def random_weights(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    C, Fw, ctx = cfg["d_model"], cfg["mlp_mult"] * cfg["d_model"], cfg["context"]
    r = lambda *shape: 0.3 * torch.randn(*shape, generator=g)
    sd = {"wte": r(256, C), "wpe": r(ctx, C), "ln_f.weight": 1 + 0.1 * r(C), "ln_f.bias": r(C)}
    focal = cfg["attention"] == "focal" and not cfg["focal_fixed"]
    for l in range(cfg["n_layer"]):
        p = f"h.{l}."
        sd.update({p + "ln_1.weight": 1 + 0.1 * r(C), p + "ln_1.bias": r(C),
                   p + "attn.c_attn.weight": r(C, 3 * C), p + "attn.c_attn.bias": r(3 * C),
                   p + "attn.c_proj.weight": r(C, C), p + "attn.c_proj.bias": r(C),
                   p + "ln_2.weight": 1 + 0.1 * r(C), p + "ln_2.bias": r(C),
                   p + "mlp.c_fc.weight": r(C, Fw), p + "mlp.c_fc.bias": r(Fw),
                   p + "mlp.c_proj.weight": r(Fw, C), p + "mlp.c_proj.bias": r(C)})
        if focal:
            sd[p + "attn.focal.weight"] = 0.07 * r(C)
            sd[p + "attn.focal.bias"] = torch.tensor([cfg["temperature"]])
        elif cfg["learn_temperature"]:
            sd[p + "attn.log_temperature"] = torch.tensor([math.log(cfg["temperature"])]) + r(1) / 3
    return {k: v.float().contiguous() for k, v in sd.items()}


def forward(sd, cfg, idx):
    """Logits [L, 256] in float64 of bytes idx at positions 0 .. L-1."""
    sd = {k: v.double() for k, v in sd.items()}
    C, H = cfg["d_model"], cfg["n_head"]
    Dh, L = C // H, len(idx)
    ln = lambda x, p: F.layer_norm(x, (C,), sd[p + ".weight"], sd[p + ".bias"], 1e-5)
    x = sd["wte"][idx] + sd["wpe"][:L]
    future = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    for l in range(cfg["n_layer"]):
        p = f"h.{l}."
        h1 = ln(x, p + "ln_1")
        q, k, v = (h1 @ sd[p + "attn.c_attn.weight"] + sd[p + "attn.c_attn.bias"]).split(C, dim=1)
        q, k, v = (t.view(L, H, Dh).transpose(0, 1) for t in (q, k, v))  # [H, L, Dh]
        if p + "attn.focal.weight" in sd:
            tau = (h1 @ sd[p + "attn.focal.weight"] + sd[p + "attn.focal.bias"]).clamp(
                cfg["focal_tau_min"], cfg["focal_tau_max"]).view(1, L, 1)
        elif p + "attn.log_temperature" in sd:
            tau = sd[p + "attn.log_temperature"].exp()
        else:
            tau = cfg["temperature"]
        s = (q @ k.transpose(1, 2)) / (math.sqrt(Dh) * tau)
        att = s.masked_fill(future, -math.inf).softmax(-1) @ v
        x = x + att.transpose(0, 1).reshape(L, C) @ sd[p + "attn.c_proj.weight"] + sd[p + "attn.c_proj.bias"]
        f = F.gelu(ln(x, p + "ln_2") @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"])
        x = x + f @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ sd["wte"].T


def nats_per_byte(sd, cfg, data):
    """The metric: non-overlapping windows of `context` inputs, every byte after the first."""
    total, n, ctx = 0.0, len(data), cfg["context"]
    for s in range(0, n - 1, ctx):
        L = min(ctx, n - 1 - s)
        z = forward(sd, cfg, data[s:s + L])
        total += F.cross_entropy(z, data[s + 1:s + L + 1], reduction="sum").item()
    return total / (n - 1)


def run(*args):
    r = subprocess.run([EXE, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"continuum-lm {' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


failures = 0
text = bytes(np.random.default_rng(1).integers(32, 122, size=101, dtype=np.uint8))
with open(os.path.join(TMP, "text.txt"), "wb") as f:
    f.write(text)
data = torch.tensor(list(text), dtype=torch.long)
for i, (attention, learn) in enumerate([("softmax", False), ("softmax", True), ("focal", False)]):
    cfg = config(attention, learn)
    sd = random_weights(cfg, 10 + i)
    ckpt = os.path.join(TMP, f"{attention}{'-learned' if learn else ''}.safetensors")
    save_file(sd, ckpt, metadata={"format": "continuum-lm", "config": json.dumps(cfg), "run": "{}"})
    name = f"{attention}{' (learned log tau)' if learn else ''}"

    out = os.path.join(TMP, "logits.npy")
    run("logits", "--checkpoint", ckpt, "--text-file", os.path.join(TMP, "text.txt"), "--out", out)
    got = np.load(out)
    want = forward(sd, cfg, data[:cfg["context"]]).numpy()
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    ok = got.dtype == np.float32 and got.shape == (24, 256) and err < 2e-6
    # Random weights of this size give far-from-uniform predictions.
    spread = want.std(axis=1).mean()
    ok = ok and spread > 0.5
    print(f"{name:28s} logits: shape {got.shape}, max rel err {err:.2e}, logit spread {spread:.2f}"
          f" {'ok' if ok else 'FAIL'}")
    failures += not ok

    spec = os.path.join(TMP, "text.txt") + ":0.1:1"
    cut = math.floor(0.1 * len(text))
    res = json.loads(run("eval", "--checkpoint", ckpt, "--valid", spec, "--threads", "1"))["valid"][0]
    want_npb = nats_per_byte(sd, cfg, data[cut:])
    err = abs(res["nats_per_byte"] - want_npb)
    ok = res["bytes_scored"] == len(text) - cut - 1 and err < 1e-5 and abs(want_npb - math.log(256)) > 0.1
    print(f"{name:28s} eval:   {res['nats_per_byte']:.7f} vs torch {want_npb:.7f} nats/byte over "
          f"{res['bytes_scored']} bytes {'ok' if ok else 'FAIL'}")
    failures += not ok
sys.exit(1 if failures else 0)
