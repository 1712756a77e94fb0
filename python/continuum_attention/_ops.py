"""The operator: schema, kernels and autograd in C++ (src/ops.cpp,
TORCH_LIBRARY namespace ``continuum``), fake kernels registered here."""
from __future__ import annotations

import numbers
import platform
from typing import Optional, Tuple, Union

import torch

from . import _C  # noqa: F401  (loads the library: registers torch.ops.continuum.*)

_KERNELS = ("continuum", "softmax", "focal")
_COMPUTES = (None, "default", "float32", "float64")


_CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: True when this build has the CUDA kernels (built when nvcc was present).
WITH_CUDA = bool(_C.with_cuda)


def cpu_isa() -> str:
    """The instruction set of the CPU kernels this operator runs: ``"amx"``
    (``"avx512"`` with bfloat16 products on AMX-BF16 tiles), ``"avx512bf16"``
    (``"avx512"`` with bfloat16 products on AVX512-BF16 vectors; chosen
    automatically on AMD's CPUs only, whose vectors outrun float FMA there),
    ``"avx512"``, ``"avx2"`` or ``"sse2"``, chosen from the running CPU at the
    first call (the environment variable ``CONTINUUM_CPU_ISA`` may name another
    one the CPU runs), without
    any ``-march`` flag at build time (docs/MATH.md §10, "Instruction sets").
    Raises ValueError when CONTINUUM_CPU_ISA names an unknown instruction set
    or one this CPU cannot run."""
    return _C.cpu_isa()


def cpu_model() -> str:
    """The CPU this process runs on, for benchmark reports: the "model name" of
    /proc/cpuinfo's first processor with its family, model and stepping
    numbers, e.g. ``"AMD EPYC (family 25, model 17, stepping 1)"`` (a virtual
    machine's name alone does not tell Zen 4 from Zen 5);
    ``platform.processor()`` where /proc/cpuinfo gives no model name, else
    ``"unknown"``. Never raises."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block ends
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name")
    if not name:
        return platform.processor() or "unknown"
    if "cpu family" in fields:
        name += (f" (family {fields['cpu family']}, model {fields.get('model', '?')}, "
                 f"stepping {fields.get('stepping', '?')})")
    return name


def supported_dtypes(device: Union[str, torch.device] = "cpu") -> Tuple[torch.dtype, ...]:
    """The storage dtypes the operator accepts on ``device``: CPU float32,
    float64, bfloat16 and float16 (both computed in float32, docs/MATH.md
    §10); CUDA (only
    when built with CONTINUUM_ATTENTION_CUDA=ON) float32, float16 and
    bfloat16; nothing elsewhere."""
    kind = torch.device(device).type
    if kind == "cpu":
        return _CPU_DTYPES
    if kind == "cuda" and WITH_CUDA:
        return _CUDA_DTYPES
    return ()


def _accum_dtype(dtype):
    """The library's accum_t: float32 for 16-bit storage, the storage type otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _type_name(x) -> str:
    """x's type for a message: its module too where that is not builtins
    (numpy.bool, not bool)."""
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# --------------------------------------------------------------------------
# Fake (meta) kernels: shapes only, for torch.compile / FakeTensor / meta.
# --------------------------------------------------------------------------
def _check_one_device(query, **tensors):
    """ValueError unless every tensor given is on query's device. The C++ kernels
    check the same, but a call whose tensors are on two devices is dispatched by
    the highest of them: a meta one sends a CPU call here, whose outputs would be
    uninitialised memory."""
    for name, t in tensors.items():
        if t is not None and t.device != query.device:
            raise ValueError(f"continuum_attention: {name} is on {t.device} but query is on "
                             f"{query.device} (all tensors must be on one device)")


@torch.library.register_fake("continuum::forward")
def _forward_fake(query, key, value, kernel, causal, window_left, window_right, range_lo,
                  range_hi, temperature, temperature_value, scale, compute="default",
                  row_stats=False):
    torch._check(query.dim() == 4 and key.dim() == 4 and value.dim() == 4,
                 lambda: "continuum_attention: query, key, value must be 4-D")
    _check_one_device(query, key=key, value=value, range_lo=range_lo, range_hi=range_hi,
                      temperature=temperature)
    B, Hq, Lq, _ = query.shape
    out = query.new_empty((B, Hq, Lq, value.shape[3]))
    lse = query.new_empty((B, Hq, Lq), dtype=_accum_dtype(query.dtype))
    if row_stats and query.device.type == "cpu":
        stats = lse.new_empty((B, Hq, Lq, value.shape[3] + 5))
        ref = lse.new_empty((B, Hq, Lq), dtype=torch.int64)
    else:
        stats = lse.new_empty((0,))
        ref = lse.new_empty((0,), dtype=torch.int64)
    return out, lse, stats, ref


@torch.library.register_fake("continuum::backward")
def _backward_fake(grad_out, query, key, value, out, lse, row_stats, row_ref, kernel, causal,
                   window_left,
                   window_right, range_lo, range_hi, temperature, temperature_value, scale,
                   compute="default"):
    _check_one_device(query, grad_out=grad_out, key=key, value=value, out=out, lse=lse,
                      row_stats=row_stats, row_ref=row_ref, range_lo=range_lo, range_hi=range_hi,
                      temperature=temperature)
    dt = (temperature.new_empty(temperature.shape) if temperature is not None
          else query.new_empty((0,), dtype=_accum_dtype(query.dtype)))
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
            dt)


# Autograd is registered in C++ (src/ops.cpp, at the Autograd key): the
# library's analytic backward (MATH.md §6) as forward's gradient, with the
# forward's row statistics; lse has none; a double backward raises.


# --------------------------------------------------------------------------
# Public entry point.
# --------------------------------------------------------------------------
def _check_inputs(query, key, value):
    """TypeError / ValueError / NotImplementedError for query, key and value
    that the operators would refuse (the same checks as src/ops.cpp's, with
    torch's dtype names, and before a torch.compile trace reaches the fake
    kernel). Each test is one cheap comparison on the usual path; the messages
    are formed only when one fails (the wrapper's checks were about 18 µs of a
    40 µs call: docs/PERFORMANCE.md)."""
    if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)
            and isinstance(value, torch.Tensor)
            and query.dim() == 4 and key.dim() == 4 and value.dim() == 4):
        for name, t in (("query", query), ("key", key), ("value", value)):  # in order
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"continuum_attention: {name} must be a torch.Tensor, "
                                f"got {_type_name(t)}")
            if t.dim() != 4:
                raise ValueError(f"continuum_attention: {name} must be 4-D [batch, heads, seq, "
                                 f"dim], got shape {tuple(t.shape)}")
    device, dtype = query.device, query.dtype
    for name, t in (("key", key), ("value", value)):
        if t.device != device:
            raise ValueError(f"continuum_attention: {name} is on {t.device} but query is on "
                             f"{device} (all tensors must be on one device)")
        if t.dtype != dtype:
            raise ValueError(f"continuum_attention: {name} has dtype {t.dtype} but query has "
                             f"{dtype} (query, key and value share one dtype)")
    if device.type == "cpu":
        if dtype not in _CPU_DTYPES:
            raise ValueError(f"continuum_attention: the CPU backend supports float32, float64, "
                             f"bfloat16 and float16, got {dtype}")
    elif device.type == "cuda":
        if not WITH_CUDA:
            raise NotImplementedError(
                "continuum_attention: this build has no CUDA kernels; rebuild with "
                "pip install --no-build-isolation ./python -C cmake.define.CONTINUUM_ATTENTION_CUDA=ON")
        if dtype not in _CUDA_DTYPES:
            raise ValueError(f"continuum_attention: the CUDA backend supports float32, float16 and "
                             f"bfloat16, got {dtype}")


def _as_float(name, x):
    """float(x) for a real number x; ValueError naming the option where x (a
    Python int, a Fraction, ...) is beyond float64's range, or nonzero and
    rounds to 0."""
    try:
        f = float(x)
        if f != 0 or x == 0:
            return f
    except OverflowError:
        pass
    if isinstance(x, numbers.Integral):  # bit_length: str() of a huge int is refused too
        got = f"{'a negative' if x < 0 else 'an'} integer of about {int(abs(int(x)).bit_length() * 0.30103) + 1} digits"
    else:
        got = repr(x)[:60]
    raise ValueError(f"continuum_attention: {name} must be within float64's range "
                     f"(finite and > 0), got {got}")


def _check_compute(compute, query):
    """The `compute` string for the operators ("default" for None), or an error."""
    if compute is None:
        return "default"
    if not isinstance(compute, str):
        raise TypeError(f"continuum_attention: compute must be None or a string, "
                        f"got {_type_name(compute)}")
    if compute not in _COMPUTES:
        raise ValueError(f"continuum_attention: compute must be None, 'default', 'float32' or "
                         f"'float64', got {compute!r}")
    if query.device.type == "cuda" and compute == "float64":
        raise ValueError("continuum_attention: compute='float64' is not available on CUDA (the "
                         "CUDA backend accumulates in float32); use compute=None or 'float32'")
    if query.device.type == "cpu" and compute == "float32" and query.dtype == torch.float64:
        raise ValueError(f"continuum_attention: compute='float32' needs float32, bfloat16 or "
                         f"float16 storage, query is {query.dtype} (float64 storage computes in "
                         f"float64: use "
                         f"compute=None or 'float64')")
    return compute


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    kernel: str = "continuum",
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    ranges: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    temperature: Union[float, torch.Tensor] = 1.0,
    scale: Optional[float] = None,
    return_lse: bool = False,
    compute: Optional[str] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Continuum Attention, or softmax / focal attention, over [B, H, L, D] tensors.

    out_i = Σ_j P_ij v_j with P_ij = α_ij / Σ_j α_ij and scores
    s_ij = scale / τ · q_i·k_j; α is the continuum stencil of MATH.md §4
    (``kernel="continuum"``) or exp(s_ij) (``"softmax"``; ``"focal"`` is softmax
    with the given temperature, MATH.md §8). Differentiable in query, key, value
    and a tensor temperature; the gradient is the library's analytic backward
    (MATH.md §6), computed in C++.

    Args:
        query: [B, Hq, Lq, D].
        key: [B, Hk, Lk, D]; Hq must be a multiple of Hk (GQA/MQA: query head h
            uses key/value head h // (Hq // Hk)).
        value: [B, Hk, Lk, Dv] (Dv may differ from D, Lk from Lq).
            Any strides with a contiguous last axis (stride 1) are used in place,
            without copies (BHSD, BSHD via ``.transpose(1, 2)``, slices of packed
            QKV). One device, one dtype: float32, float64, bfloat16 or float16 on the
            CPU.
        kernel: "continuum" (default), "softmax" or "focal".
        causal: bottom-right aligned causal mask (MATH.md §3): query i sees keys
            j ≤ i + Lk - Lq (PyTorch's ``causal_lower_right``; equal to
            ``is_causal=True`` of ``scaled_dot_product_attention`` when Lq == Lk).
        window: (left, right) sliding window around the diagonal key
            d_i = i + Lk - Lq: keys d_i - left ≤ j ≤ d_i + right; a negative
            bound is unlimited on that side (FlashAttention's ``window_size``).
            Intersected with ``causal``. Default (-1, -1): no window.
        ranges: optional (lo, hi), integer tensors [B, Lq] on the query's
            device: query i of batch b sees keys [lo[b, i], hi[b, i]), with
            0 ≤ lo ≤ hi ≤ Lk; intersected with causal and window (padding,
            packed documents). ``lo == hi`` is an empty row.
        temperature: τ > 0, a number or a tensor of the query's dtype
            (float32 for 16-bit queries, see below) and device: 0-d, per head [Hq], or per query [B, Hq, Lq]. A tensor that
            requires grad receives dτ in its own shape. With 16-bit inputs
            (bfloat16 or float16, on the CPU and on CUDA) a tensor
            temperature is float32 (the library's accumulator).
        scale: softmax scale (> 0); default 1/sqrt(D).
        return_lse: also return lse.
        compute: the arithmetic, forward and backward (the backward always
            runs with its forward's compute). None or "default": the storage
            dtype's own precision — float32 storage computes in float32,
            float64 storage in float64, bfloat16 and float16 storage in
            float32 with each output rounded once to the storage dtype (lse
            and dτ stay float32). "float32": float32 arithmetic (float32,
            bfloat16 or float16 storage). "float64": float64 arithmetic, each
            output rounded once to the storage dtype (16-bit: through
            float32). The library's one tiled kernel family runs in every
            case (``continuum::Compute``). On CUDA, None, "default" and
            "float32" are the CUDA backend (float32 accumulation);
            "float64" is not available there. See Notes for speed and
            accuracy.

    Returns:
        out [B, Hq, Lq, Dv] (contiguous, query's dtype), or (out, lse) with
        lse [B, Hq, Lq] (query's dtype; float32 for 16-bit inputs) = log Z_i in natural-log score units (-inf for a row that
        sees no key; that row's out is 0 and its gradients are 0). lse is not
        differentiable.

    Raises:
        ValueError: wrong ranks, mismatched shapes/heads, non-contiguous last
            axis, τ ≤ 0 or non-finite, a temperature outside float32's range
            with 16-bit or float32 storage, scale / τ beyond float64's range,
            a number beyond float64's range (or nonzero and rounding to 0) for
            ``temperature`` or ``scale``, a temperature tensor of another
            dtype or shape than documented, scale ≤ 0 or non-finite, ranges
            that are not integer tensors of shape [B, Lq], out of [0, Lk] or
            with lo > hi, window bounds beyond 64 bits, unknown kernel, mixed
            devices or dtypes, unsupported dtype (e.g. float64 on CUDA,
            integers), an unknown ``compute``, ``compute="float32"`` with
            float64 storage, ``compute="float64"`` on CUDA. Each message
            names the argument; the wrapper's start with
            "continuum_attention:", the C++ library's with
            "continuum::attention_forward:" or "continuum::attention_backward:"
            ("(cuda)" after the function's name on CUDA), and an unusable
            CONTINUUM_CPU_ISA's with "CONTINUUM_CPU_ISA".
        TypeError: a non-tensor query/key/value, or a bad option type: a
            non-bool ``causal``, a ``window`` that is not two ints, ``ranges``
            that are not two tensors, a non-number ``scale`` or
            ``temperature``, a non-string ``compute``.
        NotImplementedError: a device without a kernel (CUDA unless built with
            CONTINUUM_ATTENTION_CUDA=ON); forward-mode automatic
            differentiation (``torch.func.jvp``, ``jacfwd``, dual tensors of
            ``torch.autograd.forward_ad``): no tangent rule is derived.

    Notes:
        Deterministic: results are bitwise independent of
        ``torch.get_num_threads()``. Inputs are never written. An ordinary
        differentiable operator: tested under torch.compile (fullgraph) and
        DDP; FSDP should need nothing more but was not tested here. Differentiable once, in
        reverse mode (the backward itself has no gradient: no create_graph /
        double backward; no forward mode). ``torch.func.grad`` / ``vjp`` /
        ``jacrev`` are refused by PyTorch itself (a C++ autograd function);
        ``torch.autograd.grad`` and ``torch.autograd.functional.jacobian``
        work. On the ``meta`` device (and in a torch.compile trace, on fake
        tensors) only the options' types, the ranks, one device and one
        shared dtype are checked: shapes, supported dtypes and values (heads,
        head_dim, τ, ranges) are checked by the kernels when the call runs.
        Cost O(B·Hq·Lq·Lk·(D + Dv)); memory O(B·Hq·Lq) besides the output.
        When a gradient will be taken (grad mode on and an input requiring
        grad), the CPU forward also keeps its row statistics for the
        backward, B·Hq·Lq·(Dv + 5) values in float32 (float64 for float64
        inputs) saved with the output, so that the backward need not run the
        forward again (docs/MATH.md §6, "row statistics from the forward").
        On the CPU a query row that sees a NaN or an Inf (in its query, its
        grad_out, or a visible key or value) gets NaN in its output, lse and
        gradients, and NaN in the key/value gradients of the keys it sees;
        nothing else changes (docs/MATH.md §10).

        Speed and accuracy of ``compute`` for float32 storage, measured
        2026-12-01 21:20 UTC on the project's 2-core AMD EPYC (Zen 3), idle,
        this package's build (then -O2, no -march; since 2 Dec 2026 the
        kernels are compiled with -O3; the AVX2 kernels chosen at run time,
        cpu_isa()), B=16, H=4, L=192, D=32, causal, τ = 0.25, medians of
        9, 2 threads (bench/compute_modes.py); errors are max|err| / max|ref|
        against a float64 run on the same float32 inputs::

            float32 storage     forward  fwd+bwd   out     dQ      dK      dV
            default             5.7 ms  34.7 ms  1.1e-6  1.3e-6  1.0e-6  8.1e-7
            "float64"          15.4 ms  66.2 ms  3.1e-8  4.0e-8  3.5e-8  3.1e-8

        The default is 2.7× (forward) and 1.9× (forward + backward) faster
        than compute="float64" here. The default's errors grow slowly with the
        sequence length (≤ 3.8e-7 at L ≤ 24 in the tests, whose bound is
        2e-6: python/tests/test_compute.py). With compute="float64" out and
        lse are the float64 result rounded once, element by element; the
        gradients are within about one float32 rounding of their largest
        element (not of each element). Use compute="float64" to check
        numbers against a float64 computation at float32 storage cost, the
        default for training and inference. float64 storage computes in
        float64 (~1e-15 relative, the gradcheck path).

    Source: the mathematics is docs/MATH.md §3-§8; the kernels are
    the header-only library's continuum::attention_forward / attention_backward
    (include/continuum/attention/); usage in README.md, section "PyTorch".
    """
    _check_inputs(query, key, value)
    if kernel not in _KERNELS:
        raise ValueError(f"continuum_attention: kernel must be one of {_KERNELS}, got {kernel!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"continuum_attention: causal must be a bool, got {_type_name(causal)}")
    if type(window) is tuple and len(window) == 2 and type(window[0]) is int and type(window[1]) is int:
        window_left, window_right = window  # (the usual case, without the ABC checks below)
    else:
        if not (isinstance(window, (tuple, list)) and len(window) == 2
                and all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window)):
            raise TypeError(f"continuum_attention: window must be a pair of ints (left, right), "
                            f"got {window!r}")
        window_left, window_right = (int(w) for w in window)
    if not (-2**63 <= window_left < 2**63 and -2**63 <= window_right < 2**63):
        raise ValueError(f"continuum_attention: window bounds must fit in 64 bits (a negative "
                         f"bound is unlimited), got {window!r}")
    range_lo = range_hi = None
    if ranges is not None:
        if not (isinstance(ranges, (tuple, list)) and len(ranges) == 2
                and all(isinstance(r, torch.Tensor) for r in ranges)):
            raise TypeError("continuum_attention: ranges must be a pair (lo, hi) of integer "
                            "tensors [B, Lq]")
        range_lo, range_hi = ranges
    if type(temperature) is float:
        temp_tensor, temp_value = None, temperature
    elif isinstance(temperature, torch.Tensor):
        temp_tensor, temp_value = temperature, 1.0
    elif isinstance(temperature, numbers.Real) and not isinstance(temperature, bool):
        temp_tensor, temp_value = None, _as_float("temperature", temperature)
    else:
        raise TypeError(f"continuum_attention: temperature must be a number or a tensor, "
                        f"got {_type_name(temperature)}")
    if scale is not None and type(scale) is not float:
        if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
            raise TypeError(f"continuum_attention: scale must be None or a number, "
                            f"got {_type_name(scale)}")
        scale = _as_float("scale", scale)
    compute = _check_compute(compute, query)
    # The row statistics for the backward: only where a gradient will be asked for.
    wants_grad = torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
        or (temp_tensor is not None and temp_tensor.requires_grad))
    out, lse, _, _ = torch.ops.continuum.forward(
        query, key, value, kernel, causal, window_left, window_right, range_lo, range_hi,
        temp_tensor, temp_value, scale, compute, wants_grad)
    return (out, lse) if return_lse else out
