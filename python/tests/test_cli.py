"""kernel="continuum" (and the baselines) equal the C++ library called
directly, bit for bit: the `continuum-attn` CLI built by CMake runs on the
same .npy inputs, like with like: the same storage dtype and the same compute
(the CLI's default is the operator's, the storage type's own precision:
float32 -> float arithmetic, float64 -> double; float32 storage is also run
with --compute float64 / compute="float64", double arithmetic). Both link
continuum::cpu_dispatch built with the same flags (-O2, no -march), so both run
the kernels of the same instruction set (the best this CPU has), which the
tiled kernels' bits depend on. scripts/test sets CONTINUUM_ATTN_CLI to its
path; without it these tests skip."""
import os
import subprocess

import numpy as np
import pytest
import torch

import continuum_attention as ca
from conftest import uniform

CLI = os.environ.get("CONTINUUM_ATTN_CLI")
pytestmark = pytest.mark.skipif(not CLI, reason="CONTINUUM_ATTN_CLI (path to continuum-attn) not set")


def test_cli_exists():
    assert os.access(CLI, os.X_OK), f"CONTINUUM_ATTN_CLI={CLI} is not an executable"

CASES = [
    dict(kernel="continuum"),
    dict(kernel="continuum", causal=True, temperature=0.3),
    dict(kernel="continuum", causal=True, lq=7, temperature="head"),
    dict(kernel="continuum", ranges=True, temperature="query"),
    dict(kernel="continuum", causal=True, window=(3, 0)),
    dict(kernel="continuum", window=(2, 3), ranges=True),
    dict(kernel="softmax", window=(-1, 1), temperature=0.7),
    dict(kernel="softmax", causal=True, scale=0.5),
    dict(kernel="focal", temperature=0.4),
]


MODES = [(torch.float32, None), (torch.float32, "float64"), (torch.float64, None)]


@pytest.mark.parametrize("dtype,compute", MODES, ids=["f32", "f32-compute_float64", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_bitwise_equal_to_cli(tmp_path, case, dtype, compute):
    B, Hq, Hk, Lk, D, Dv = 2, 4, 2, 13, 8, 5
    Lq = case.get("lq", Lk)
    q = uniform(B, Hq, Lq, D, dtype=dtype, requires_grad=True)
    k = uniform(B, Hk, Lk, D, dtype=dtype, requires_grad=True)
    v = uniform(B, Hk, Lk, Dv, dtype=dtype, requires_grad=True)
    do = uniform(B, Hq, Lq, Dv, dtype=dtype)
    args = [CLI, "--kernel", case["kernel"], "--out", str(tmp_path / "out"), "--threads", "1"]
    kw = dict(kernel=case["kernel"], compute=compute)
    if compute is not None:
        args += ["--compute", compute]
    for n, t in (("q", q), ("k", k), ("v", v), ("do", do)):
        np.save(tmp_path / f"{n}.npy", t.detach().numpy())
        args += [f"--{n}", str(tmp_path / f"{n}.npy")]
    if case.get("causal"):
        kw["causal"] = True
        args.append("--causal")
    if "window" in case:
        left, right = case["window"]
        kw["window"] = case["window"]
        args += ["--window-left", str(left), "--window-right", str(right)]
    if "scale" in case:
        kw["scale"] = case["scale"]
        args += ["--scale", repr(case["scale"])]
    t = case.get("temperature")
    if t == "head":
        t = (torch.rand(Hq, dtype=dtype) + 0.25).requires_grad_()
    elif t == "query":
        t = (torch.rand(B, Hq, Lq, dtype=dtype) + 0.25).requires_grad_()
    if isinstance(t, torch.Tensor):
        np.save(tmp_path / "t.npy", t.detach().numpy())
        args += ["--temperature", str(tmp_path / "t.npy")]
        kw["temperature"] = t
    elif t is not None:
        kw["temperature"] = t
        args += ["--temperature", repr(t)]
    if case.get("ranges"):
        lo = torch.randint(0, Lk // 2, (B, Lq))
        hi = torch.minimum(lo + torch.randint(0, Lk, (B, Lq)), torch.tensor(Lk))
        np.save(tmp_path / "lo.npy", lo.numpy())
        np.save(tmp_path / "hi.npy", hi.numpy())
        args += ["--ranges", str(tmp_path / "lo.npy"), str(tmp_path / "hi.npy")]
        kw["ranges"] = (lo, hi)
    res = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr

    out, lse = ca.attention(q, k, v, return_lse=True, **kw)
    inputs = [q, k, v] + ([t] if isinstance(t, torch.Tensor) else [])
    grads = torch.autograd.grad(out, inputs, do)
    load = lambda n: torch.from_numpy(np.load(tmp_path / "out" / f"{n}.npy"))
    expected = [("o", out), ("lse", lse), ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2])]
    if isinstance(t, torch.Tensor):
        expected.append(("dtemp", grads[3]))
    for name, ours in expected:
        theirs = load(name)
        assert theirs.dtype == ours.dtype and theirs.shape == ours.shape, name
        assert torch.equal(ours.detach(), theirs), name  # bitwise (no NaN here)


def test_cli_bfloat16_equals_the_operator(tmp_path):
    """--dtype bfloat16 (float32 files in and out) is the PyTorch operator's
    bfloat16 call, bit for bit: the same values, the same float32 kernels, each
    output rounded once to bfloat16 (written exactly as float32)."""
    B, Hq, Hk, L, D = 1, 4, 2, 11, 8
    q, k, v, do = (uniform(B, h, L, D, dtype=torch.float32).bfloat16() for h in (Hq, Hk, Hk, Hq))
    args = [CLI, "--kernel", "continuum", "--causal", "--temperature", "0.3", "--dtype", "bfloat16",
            "--out", str(tmp_path / "out"), "--threads", "1"]
    for n, t in (("q", q), ("k", k), ("v", v), ("do", do)):
        np.save(tmp_path / f"{n}.npy", t.float().numpy())
        args += [f"--{n}", str(tmp_path / f"{n}.npy")]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "storage bfloat16, compute float32" in r.stdout
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = ca.attention(qq, kk, vv, causal=True, temperature=0.3, return_lse=True)
    out.backward(do)
    for name, ours in (("o", out), ("lse", lse), ("dq", qq.grad), ("dk", kk.grad), ("dv", vv.grad)):
        got = np.load(tmp_path / "out" / f"{name}.npy")
        assert got.dtype == np.float32
        assert np.array_equal(got, ours.detach().float().numpy()), name


def test_cli_float16_equals_the_operator(tmp_path):
    """float16 files ('<f2') are float16 storage: the
    PyTorch operator's float16 call, bit for bit (the same float32 kernels,
    each output rounded once to float16); lse and dtemp stay float32 files.
    A float32 temperature file and float16 inputs mix (the temperature is
    float32 in the library)."""
    B, Hq, Hk, L, D = 1, 4, 2, 11, 8
    q, k, v, do = (uniform(B, h, L, D, dtype=torch.float32).half() for h in (Hq, Hk, Hk, Hq))
    tau = torch.rand(Hq) + 0.3
    np.save(tmp_path / "tau.npy", tau.numpy())
    args = [CLI, "--kernel", "continuum", "--window-left", "3", "--window-right", "1",
            "--temperature", str(tmp_path / "tau.npy"), "--threads", "1"]
    for n, t in (("q", q), ("k", k), ("v", v), ("do", do)):
        np.save(tmp_path / f"{n}.npy", t.numpy())
        args += [f"--{n}", str(tmp_path / f"{n}.npy")]
    r = subprocess.run(args + ["--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "storage float16, compute float32" in r.stdout
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    t = tau.clone().requires_grad_()
    out, lse = ca.attention(qq, kk, vv, window=(3, 1), temperature=t, return_lse=True)
    out.backward(do)
    for name, ours in (("o", out), ("lse", lse), ("dq", qq.grad), ("dk", kk.grad), ("dv", vv.grad),
                       ("dtemp", t.grad)):
        got = np.load(tmp_path / "out" / f"{name}.npy")
        assert got.dtype == (np.float32 if name in ("lse", "dtemp") else np.float16), name
        assert np.array_equal(got, ours.detach().numpy()), name
    # --out-dtype float32: the same float16 values, written as float32
    r = subprocess.run(args + ["--out", str(tmp_path / "o32"), "--out-dtype", "float32"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "o32" / "o.npy")
    assert got.dtype == np.float32 and np.array_equal(got, out.detach().float().numpy())


def test_cli_dtype_float16_converts_and_examples(tmp_path):
    """--dtype float16 converts float32 files (to nearest even, as NumPy's
    astype): the same outputs, bit for bit, as the float16 files themselves;
    --make-example --example-dtype float16 writes '<f2' inputs NumPy reads."""
    r = subprocess.run([CLI, "--make-example", str(tmp_path / "ex"), "--example-dtype", "float16",
                        "--example-shape", "1", "2", "9", "9", "8"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for n in ("q", "k", "v", "do"):
        x = np.load(tmp_path / "ex" / f"{n}.npy")
        assert x.dtype == np.float16 and x.shape == (1, 2, 9, 8) and np.abs(x).max() <= 1
        np.save(tmp_path / f"{n}32.npy", x.astype(np.float32) + np.float32(1e-5))  # not float16 values
    def run(suffix, out, *extra):
        args = [CLI, "--causal", "--out", str(tmp_path / out), *extra]
        for n in ("q", "k", "v", "do"):
            args += [f"--{n}", str(tmp_path / f"{n}{suffix}.npy")]
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    for n in ("q", "k", "v", "do"):
        np.save(tmp_path / f"{n}16.npy", np.load(tmp_path / f"{n}32.npy").astype(np.float16))
    run("32", "conv", "--dtype", "float16")
    run("16", "own")
    for name in ("o", "lse", "dq", "dk", "dv", "dtemp"):
        a, b = np.load(tmp_path / "conv" / f"{name}.npy"), np.load(tmp_path / "own" / f"{name}.npy")
        assert a.dtype == b.dtype and np.array_equal(a, b), name
