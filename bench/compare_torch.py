#!/usr/bin/env python3
"""Compare continuum's CPU operator with PyTorch on the CPU, at the same shapes.

Two PyTorch builds are measured, each in its own interpreter:
  * PyTorch 2.x from PyPI, installed by this script into a virtual env
    (default <repo>/.venv-bench: `python3 -m venv .venv-bench` and
    `.venv-bench/bin/pip install torch`; the default PyPI wheel is large but
    runs on the CPU): torch.nn.functional.scaled_dot_product_attention,
    causal and not, forward and forward + backward;
  * Debian's python3-torch 1.13 (`apt-get install python3-torch`, run by
    /usr/bin/python3): standard attention (matmul, masked_fill, softmax,
    matmul), which is what 1.13 offers.
Every case runs in a fresh subprocess, so its peak-RSS growth (getrusage) is
its own; times are medians of --reps repetitions after two warm-up calls, with
torch.set_num_threads(--threads).

Our figures are read from Google Benchmark JSON (bench_attention
--benchmark_format=json or --benchmark_out=...), and every PyTorch time is
printed beside ours as a ratio (> 1: continuum is faster).

Usage:
  bench/compare_torch.py --ours build-bench/bench.json [--out torch.json]
  bench/compare_torch.py --worker ...   (internal)
Exit status: 0 on success, 2 on bad arguments, 1 when a required PyTorch
could not be run (each missing one is named on stderr).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBIAN_PYTHON = "/usr/bin/python3"


# ---------------------------------------------------------------------------
# Worker: one case in this interpreter.
# ---------------------------------------------------------------------------
def decode_worker(args):
    """SDPA's KV-cache decode step: one query row per head, 8 query heads on 2
    KV heads (enable_gqa=True), args.decode cached keys; medians of 50."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.decode)
    q = torch.randn(1, 8, 1, args.d, generator=g)
    k = torch.randn(1, 2, args.decode, args.d, generator=g)
    v = torch.randn(1, 2, args.decode, args.d, generator=g)
    times = []
    with torch.no_grad():
        for i in range(55):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            if i >= 5:
                times.append(time.perf_counter() - t0)
    print(json.dumps({"impl": "sdpa-decode", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "kv": args.decode, "d": args.d, "median_ms": statistics.median(times) * 1e3,
                      "min_ms": min(times) * 1e3, "reps": len(times)}))


def worker(args):
    if args.decode:
        return decode_worker(args)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, H, n, d = 1, args.heads, args.n, args.d
    dtype = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    gen = torch.Generator().manual_seed(42)

    def uniform(*shape):  # drawn in float32, then stored in dtype (bf16, f16: rounded once)
        return (torch.rand(*shape, generator=gen, dtype=torch.float32) * 2 - 1).to(dtype)

    q, k, v, dout = (uniform(B, H, n, d) for _ in range(4))
    scale = 1.0 / (d ** 0.5)
    causal = bool(args.causal)
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1) if (causal and args.impl == "naive") else None

    def attention(q, k, v):
        if args.impl == "sdpa":
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        s = torch.matmul(q, k.transpose(-2, -1)) * scale
        if causal:
            s = s.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)

    if args.bwd:
        for t in (q, k, v):
            t.requires_grad_(True)

    def call():
        if args.bwd:
            for t in (q, k, v):
                t.grad = None
            attention(q, k, v).backward(dout)
        else:
            with torch.no_grad():
                attention(q, k, v)

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    call()
    call()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "impl": args.impl, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "causal": causal, "bwd": bool(args.bwd), "dtype": args.dtype, "n": n, "d": d, "heads": H,
        "median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
        "reps": args.reps, "peak_rss_growth_mib": (rss1 - rss0) / 1024.0,
    }))


# ---------------------------------------------------------------------------
# Driver.
# ---------------------------------------------------------------------------
def ensure_venv(venv):
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
        return py
    print(f"compare_torch: installing PyTorch 2.x from PyPI into {venv} (large download)", file=sys.stderr)
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "torch"], check=True)
    return py


def ensure_debian_torch(install):
    if not os.path.exists(DEBIAN_PYTHON):
        return None
    ok = subprocess.run([DEBIAN_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0
    if not ok and install and hasattr(os, "geteuid") and os.geteuid() == 0:
        print("compare_torch: apt-get install -y python3-torch", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-q", "python3-torch"], check=False,
                       stdout=subprocess.DEVNULL)
        ok = subprocess.run([DEBIAN_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0
    return DEBIAN_PYTHON if ok else None


def run_case(python, impl, causal, bwd, a, decode=0):
    cmd = [python, os.path.abspath(__file__), "--worker", "--impl", impl, "--causal", str(int(causal)),
           "--bwd", str(int(bwd)), "--n", str(a.n), "--d", str(a.d), "--heads", str(a.heads),
           "--reps", str(a.reps), "--threads", str(a.threads), "--dtype", a.dtype, "--decode", str(decode)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(f"compare_torch: {impl} case failed:\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def read_ours(path, n, d, threads, dtype):
    """Median real time (ms) of our attention cases from Google Benchmark JSON;
    dtype is the benchmark's type tag (f32: float storage, float arithmetic)."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if f"/{dtype}/" not in name or f"n:{n}/" not in name or f"d:{d}/" not in name \
                or f"threads:{threads}/" not in name or not name.startswith("attention/"):
            continue
        parts = name.split("/")  # attention/<kernel>/<vis>/<fwd|fwdbwd>/<type>/...
        key = (parts[1], parts[2], parts[3])
        t = b["real_time"]
        unit = b.get("time_unit", "ns")
        ms = t * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
        # A median aggregate wins over single runs; otherwise keep the smallest.
        if b.get("run_type") == "aggregate" or key not in out:
            out[key] = ms
        else:
            out[key] = min(out[key], ms)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=["sdpa", "naive"], default="sdpa", help=argparse.SUPPRESS)
    p.add_argument("--causal", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--bwd", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--decode", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--ours", help="Google Benchmark JSON of bench_attention")
    p.add_argument("--out", help="write all figures as JSON here (atomically)")
    p.add_argument("--venv", default=os.path.join(REPO, ".venv-bench"), help="virtual env for PyTorch 2.x")
    p.add_argument("--no-install", action="store_true", help="do not install anything; skip what is missing")
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=["f32", "f64", "bf16", "f16"], default="f32")
    p.add_argument("--ours-type", default=None,
                   help="type tag of our benchmark rows to compare with (default: the --dtype, i.e. f32 = "
                        "float arithmetic, the same precision class as SDPA; f32c64 = Compute::float64)")
    a = p.parse_args()
    if a.n <= 0 or a.d <= 0 or a.heads <= 0 or a.reps < 1 or a.threads < 1:
        p.error("--n, --d, --heads, --threads must be > 0 and --reps ≥ 1")
    if a.worker:
        worker(a)
        return 0

    status = 0
    pythons = {}
    try:
        if a.no_install:
            py = os.path.join(a.venv, "bin", "python")
            pythons["sdpa"] = py if os.path.exists(py) else None
        else:
            pythons["sdpa"] = ensure_venv(a.venv)
    except subprocess.CalledProcessError as e:
        print(f"compare_torch: could not install PyTorch 2.x: {e}", file=sys.stderr)
        pythons["sdpa"] = None
    pythons["naive"] = ensure_debian_torch(not a.no_install)
    for impl, what in (("sdpa", "PyTorch 2.x (venv)"), ("naive", "Debian python3-torch 1.13")):
        if pythons[impl] is None:
            print(f"compare_torch: {what} not available: skipped", file=sys.stderr)
            status = 1

    results = []
    for impl in ("sdpa", "naive"):
        if pythons[impl] is None or (impl == "naive" and a.dtype in ("bf16", "f16")):
            continue  # (16-bit: SDPA only)
        for causal in (False, True):
            for bwd in (False, True):
                r = run_case(pythons[impl], impl, causal, bwd, a)
                if r is None:
                    status = 1
                else:
                    results.append(r)

    decode_results = []
    if pythons["sdpa"] is not None and a.dtype == "f32":
        for kv in (4096, 32768):
            r = run_case(pythons["sdpa"], "sdpa", False, False, a, decode=kv)
            if r is None:
                status = 1
            else:
                decode_results.append(r)
                print(f"decode step, {kv} cached keys, 8 query heads on 2 KV heads: SDPA {r['median_ms'] * 1e3:.1f} us "
                      f"(medians of {r['reps']}, threads {r['threads']})")

    ours_type = a.ours_type or a.dtype
    ours = read_ours(a.ours, a.n, a.d, a.threads, ours_type) if a.ours else {}
    print(f"shape: batch 1, heads {a.heads}, seq {a.n}, head_dim {a.d}, {a.dtype}, {a.threads} threads; "
          f"medians of {a.reps} (PyTorch); ours: the '{ours_type}' rows — ratio = PyTorch time / ours "
          f"(> 1: ours faster)")
    hdr = f"{'case':<16}{'impl':<22}{'torch ms':>10}{'peak MiB':>10}{'continuum ms':>14}{'ratio':>8}" \
          f"{'softmax ms':>12}{'ratio':>8}"
    print(hdr)
    for r in results:
        vis = "causal" if r["causal"] else "full"
        mode = "fwdbwd" if r["bwd"] else "fwd"
        c = ours.get(("continuum", vis, mode))
        s = ours.get(("softmax", vis, mode))
        impl = ("sdpa " if r["impl"] == "sdpa" else "standard ") + r["torch"].split("+")[0]
        fmt = lambda x: f"{x:.1f}" if x is not None else "-"
        rat = lambda x: f"{r['median_ms'] / x:.2f}" if x else "-"
        print(f"{vis + ' ' + mode:<16}{impl:<22}{r['median_ms']:>10.1f}{r['peak_rss_growth_mib']:>10.1f}"
              f"{fmt(c):>14}{rat(c):>8}{fmt(s):>12}{rat(s):>8}  (threads {r['threads']})")
        r["continuum_ms"] = c
        r["softmax_ms"] = s
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"shape": {"batch": 1, "heads": a.heads, "n": a.n, "d": a.d, "dtype": a.dtype},
                       "threads": a.threads, "results": results, "decode": decode_results}, f, indent=1)
        os.replace(tmp, a.out)
    return status


if __name__ == "__main__":
    sys.exit(main())
