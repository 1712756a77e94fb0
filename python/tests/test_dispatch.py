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


def cpu_flags_and_vendor():
    """The first processor's flags and vendor_id in /proc/cpuinfo (None where it has none)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return None, None
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M)
    return (set(flags.group(1).split()) if flags else None), (vendor.group(1) if vendor else None)


def bf16_vectors_without_amx():
    """Whether this CPU has AVX512-BF16 and no AMX-BF16 (per /proc/cpuinfo), and its vendor."""
    flags, vendor = cpu_flags_and_vendor()
    has = flags is not None and {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_bf16"} <= flags
    return has and "amx_bf16" not in flags, vendor


@pytest.mark.skipif(bool(os.environ.get("CONTINUUM_CPU_ISA")), reason="CONTINUUM_CPU_ISA names the set")
def test_default_takes_bf16_vectors_on_amd_only():
    """AVX512-BF16 vectors are the default where they outrun float FMA: AMD's
    CPUs; an Intel CPU's run at half float FMA's FLOP rate, and there
    bfloat16 is computed by the avx512 float kernels (docs/MATH.md §10,
    "Instruction sets")."""
    has, vendor = bf16_vectors_without_amx()
    if not has:
        pytest.skip("this CPU has no AVX512-BF16, or has AMX-BF16 (per /proc/cpuinfo)")
    assert ca.cpu_isa() == ("avx512bf16" if vendor == "AuthenticAMD" else "avx512")


def test_forced_bf16_vectors_keep_the_unit_bounds():
    """Where AVX512-BF16 vectors are not the default (an Intel CPU without
    AMX), CONTINUUM_CPU_ISA=avx512bf16 still runs them: the 16-bit storage
    tests, run on them, hold them to the bfloat16 unit's bounds."""
    has, _ = bf16_vectors_without_amx()
    if not has or ca.cpu_isa() == "avx512bf16":
        pytest.skip("no AVX512-BF16 without AMX here, or they are the default (covered by test_storage16_cpu)")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, CONTINUUM_CPU_ISA="avx512bf16")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(here, "test_storage16_cpu.py")],
                       env=env, capture_output=True, text=True, timeout=600, cwd=here)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"\b\d+ passed", r.stdout), r.stdout[-2000:]


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
