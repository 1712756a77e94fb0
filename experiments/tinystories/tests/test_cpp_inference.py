"""The C++ CPU-inference example (continuum-lm, examples/lm) on checkpoints the
PyTorch trainer wrote: the same nats/byte and the same logits.

Needs CONTINUUM_LM_CLI = the continuum-lm executable (scripts/test sets it);
skipped otherwise. Tolerance: both sides compute in float32 from the same float32
weights, with different summation orders and different attention kernels (the
trainer's tiled float32 kernels, continuum-lm's default), so logits agree to a
few float32 roundings of the largest logit times the depth of the network; 1e-5
relative (the issue's bound) is about 80 roundings.
"""
import dataclasses
import json
import os
import subprocess

import numpy as np
import pytest
import torch

from config import preset
from data import load_slice
from train import evaluate, load_checkpoint, train

CLI = os.environ.get("CONTINUUM_LM_CLI")
pytestmark = pytest.mark.skipif(not CLI, reason="CONTINUUM_LM_CLI (the continuum-lm executable) not set")


@pytest.fixture(scope="module", params=[
    {"attention": "continuum"},
    {"attention": "softmax", "learn_temperature": True},
    {"attention": "focal"},
], ids=["continuum", "softmax-learned-tau", "focal"])
def checkpoint(request, tmp_path_factory, text_file):
    cfg = dataclasses.replace(preset("smoke"), steps=30, eval_every=0, **request.param).validate()
    out = tmp_path_factory.mktemp(cfg.attention)
    train(cfg, load_slice(f"{text_file}:0.2:1"), load_slice(f"{text_file}:0:0.02"),
          [load_slice(f"{text_file}:0.02:0.04")], str(out), progress=False)
    return str(out / "model.safetensors")


def test_eval_agrees(checkpoint, text_file, tmp_path):
    spec = f"{text_file}:0.1:0.15"
    js = tmp_path / "eval.json"
    r = subprocess.run([CLI, "eval", "--checkpoint", checkpoint, "--valid", spec, "--json", str(js),
                        "--threads", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cpp = json.loads(js.read_text())["valid"][0]
    py = evaluate(load_checkpoint(checkpoint), load_slice(spec).data)
    assert cpp["bytes_scored"] == py["bytes"]
    assert abs(cpp["nats_per_byte"] - py["nats_per_byte"]) <= 1e-5 * py["nats_per_byte"]


def test_logits_agree(checkpoint, text_file, tmp_path):
    spec = f"{text_file}:0.3:0.4"
    out = tmp_path / "logits.npy"
    r = subprocess.run([CLI, "logits", "--checkpoint", checkpoint, "--text-file", spec,
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cpp = np.load(out)
    m = load_checkpoint(checkpoint).eval()
    ids = load_slice(spec).data[:m.cfg.context].long()[None]
    with torch.no_grad():
        py = m(ids)[0].numpy()
    assert cpp.shape == py.shape == (m.cfg.context, 256) and cpp.dtype == np.float32
    err = np.abs(cpp.astype(np.float64) - py).max() / np.abs(py).max()
    assert err <= 1e-5, err
