"""The operator's CPU kernels are chosen at run time (continuum::cpu_dispatch,
docs/MATH.md §10, "Instruction sets"): cpu_isa() names the set, the
environment variable CONTINUUM_CPU_ISA can force the x86-64 baseline, and a
set the CPU cannot run is a clear error, not a crash."""
import os
import platform
import re
import subprocess
import sys

import pytest

import continuum_attention as ca

PROBE = """
import torch, continuum_attention as ca
q = torch.randn(1, 2, 9, 8, dtype=torch.float64)
out = ca.attention(q, q, q, causal=True)
print(ca.cpu_isa(), bool(torch.isfinite(out).all()))
"""


def run_probe(isa):
    env = dict(os.environ, CONTINUUM_CPU_ISA=isa)
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_cpu_isa_names_a_known_set():
    assert ca.cpu_isa() in {"sse2", "avx2", "avx512", "avx512bf16", "amx", "avx+fma", "avx", "generic", "scalar"}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="dispatch exists on x86-64 only")
def test_forced_baseline_runs_and_is_reported():
    r = run_probe("sse2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["sse2", "True"]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="dispatch exists on x86-64 only")
def test_unknown_set_is_a_clear_error():
    r = run_probe("avx3")
    assert r.returncode != 0
    assert "unknown instruction set 'avx3'" in r.stderr


def test_cpu_model_names_the_cpu_with_its_family():
    name = ca.cpu_model()
    assert isinstance(name, str) and name
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo here")
    first = {k: re.search(rf"^{k}\s*:\s*(.*?)\s*$", text, re.M) for k in ("model name", "cpu family", "model", "stepping")}
    if first["model name"] is None:
        pytest.skip("/proc/cpuinfo gives no model name here")
    assert name.startswith(first["model name"].group(1))
    if first["cpu family"] is not None:  # x86: the numbers that tell e.g. Zen 4 from Zen 5
        family, model, stepping = (first[k].group(1) for k in ("cpu family", "model", "stepping"))
        assert name.endswith(f"(family {family}, model {model}, stepping {stepping})")
