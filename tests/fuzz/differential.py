#!/usr/bin/env python3
"""Differential check of the fuzz targets' readers against the references on a
corpus: np.load for fuzz_npy, the safetensors package for fuzz_safetensors.

    python3 tests/fuzz/differential.py npy build-fuzz/fuzz_npy DIR...
    python3 tests/fuzz/differential.py safetensors build-fuzz/fuzz_safetensors DIR...

Needs NumPy (and `safetensors` for the second). Reports every file where our
reader accepts what the reference rejects (a leniency), or where both accept
but disagree on dtype, shape or values; files the reference accepts and we
refuse are counted (we refuse big-endian, structured and other dtypes, and
exotic header syntax no writer emits) and listed with -v.
"""
import io, os, re, subprocess, sys

def ours(exe, files):
    env = dict(os.environ, FUZZ_VERDICT="1")
    out = {}
    for start in range(0, len(files), 500):
        chunk = files[start:start + 500]
        r = subprocess.run([exe, "-runs=1"] + chunk, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        current = None
        for line in r.stderr.decode("utf-8", "replace").splitlines():
            m = re.match(r"Running: (.*)", line)
            if m: current = m.group(1)
            elif line.startswith("VERDICT ") and current is not None: out[current] = line[8:]
    return out

def ref_npy(path):
    import numpy as np
    try:
        a = np.load(path, allow_pickle=False)
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    return a, None

def main():
    kind, exe, dirs = sys.argv[1], sys.argv[2], [d for d in sys.argv[3:] if d != "-v"]
    verbose = "-v" in sys.argv
    files = sorted(os.path.join(d, f) for d in dirs for f in os.listdir(d))
    got = ours(exe, files)
    bad = stricter = agree = 0
    for f in files:
        v = got.get(f)
        if v is None: print("no verdict:", f); bad += 1; continue
        accepted = v.startswith("accept")
        if kind == "npy":
            a, err = ref_npy(f)
            if a is None:
                if accepted: print("LENIENT (np.load rejects:", err, "):", f); bad += 1
                else: agree += 1
                continue
            if not accepted:
                stricter += 1
                if verbose: print("stricter:", f, v)
                continue
            import numpy as np
            m = re.match(r"accept (\S+) (\(.*?\))(.*)", v)
            parts = [None, m.group(1)]
            shape = tuple(int(x) for x in re.findall(r"\d+", m.group(2)))
            vals = [float(x) for x in m.group(3).split()]
            want = [float(x) for x in np.asarray(a, dtype=np.float64).ravel(order="C")]
            same = a.dtype.name == parts[1] and a.shape == shape and len(vals) == len(want) and all(
                x == y or (x != x and y != y) for x, y in zip(vals, want))
            if same: agree += 1
            else: print("DIFFERENT:", f, "ours", parts[1], shape, "numpy", a.dtype, a.shape); bad += 1
        else:
            from safetensors.numpy import load
            try:
                t = load(open(f, "rb").read()); err = None
            except Exception as e:
                t, err = None, str(e)
            if t is None:
                if accepted: print("LENIENT (safetensors rejects:", err, "):", f); bad += 1
                else: agree += 1
                continue
            if not accepted:
                stricter += 1
                if verbose: print("stricter:", f, v)
                continue
            mine = dict(x.split(":") for x in v.split()[1:])
            same = set(mine) == set(t) and all(int(mine[n]) == t[n].size for n in t)
            if same: agree += 1
            else: print("DIFFERENT:", f); bad += 1
    print(f"{len(files)} files: {agree} agree, {stricter} refused here but loaded by the reference, {bad} problems")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
