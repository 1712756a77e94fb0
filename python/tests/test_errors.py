"""Bad input raises a clear exception naming the problem, and writes nothing
to the inputs."""
import pytest
import torch

import continuum_attention as ca
from conftest import uniform

B, H, L, D = 2, 4, 6, 8


def qkv(dtype=torch.float64):
    return uniform(B, H, L, D, dtype=dtype), uniform(B, 2, L, D, dtype=dtype), uniform(B, 2, L, D, dtype=dtype)


def raises(exc, match, fn):
    q, k, v = qkv()
    before = [t.clone() for t in (q, k, v)]
    with pytest.raises(exc, match=match):
        fn(q, k, v)
    for t, b in zip((q, k, v), before):
        assert torch.equal(t, b)


def test_wrong_rank():
    raises(ValueError, r"query must be 4-D", lambda q, k, v: ca.attention(q[0], k, v))
    raises(ValueError, r"value must be 4-D", lambda q, k, v: ca.attention(q, k, v[..., None]))
    # the first bad argument is named, whatever is wrong with a later one
    raises(ValueError, r"query must be 4-D", lambda q, k, v: ca.attention(q[0], None, v))
    raises(TypeError, r"key must be a torch.Tensor", lambda q, k, v: ca.attention(q, [k], v[0]))


def test_mismatched_heads():
    raises(ValueError, r"heads must divide query heads.*Hq = 4.*Hk = 3",
           lambda q, k, v: ca.attention(q, k.expand(B, 2, L, D)[:, :1].repeat(1, 3, 1, 1), v))


def test_mismatched_shapes():
    raises(ValueError, r"key: expected shape \[B, Hk, Lk, D\]",
           lambda q, k, v: ca.attention(q, k[..., :4], v))
    raises(ValueError, r"key and value: seq_len \(Lk\) must match, got key 6, value 3",
           lambda q, k, v: ca.attention(q, k, v[:, :, :3]))
    raises(ValueError, r"key and value: seq_len \(Lk\) must match, got key 3, value 6",
           lambda q, k, v: ca.attention(q, k[:, :, :3], v))
    raises(ValueError, r"value: expected shape \[B, Hk, Lk, Dv\]",
           lambda q, k, v: ca.attention(q, k, v[:1]))


def test_non_contiguous_last_dim():
    raises(ValueError, r"query: the dim \(last\) axis must be contiguous",
           lambda q, k, v: ca.attention(q[..., ::2], k[..., ::2], v))
    # [B, H, D, L] seen as [B, H, L, D] through a transpose: last stride L
    raises(ValueError, r"key: the dim \(last\) axis must be contiguous",
           lambda q, k, v: ca.attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v))


def test_negative_temperature():
    raises(ValueError, r"temperature: must be finite and > 0, got -0.5",
           lambda q, k, v: ca.attention(q, k, v, temperature=-0.5))
    t = torch.tensor([0.5, 1.0, -1.0, 2.0], dtype=torch.float64)
    raises(ValueError, r"temperature\[2\] \(per_head, shape \[Hq\]\): must be finite and > 0",
           lambda q, k, v: ca.attention(q, k, v, temperature=t))
    raises(ValueError, r"temperature: must be finite and > 0, got nan",
           lambda q, k, v: ca.attention(q, k, v, temperature=float("nan")))


def test_temperature_shape_and_dtype():
    raises(ValueError, r"temperature must be a number, a 0-d tensor, \[Hq\]",
           lambda q, k, v: ca.attention(q, k, v, temperature=torch.ones(3, dtype=torch.float64)))
    raises(ValueError, r"temperature has dtype Float; with a Double query a tensor temperature must be Double",
           lambda q, k, v: ca.attention(q, k, v, temperature=torch.ones(H)))


def test_ranges_out_of_bounds():
    lo = torch.zeros(B, L, dtype=torch.int64)
    hi = torch.full((B, L), L, dtype=torch.int64)
    bad_hi = hi.clone()
    bad_hi[1, 3] = L + 1
    raises(ValueError, r"range_lo/range_hi\[1, 3\]: need 0 <= lo <= hi <= Lk = 6, got \[0, 7\)",
           lambda q, k, v: ca.attention(q, k, v, ranges=(lo, bad_hi)))
    bad_lo = lo.clone()
    bad_lo[0, 2] = -1
    raises(ValueError, r"need 0 <= lo <= hi", lambda q, k, v: ca.attention(q, k, v, ranges=(bad_lo, hi)))
    raises(ValueError, r"need 0 <= lo <= hi", lambda q, k, v: ca.attention(q, k, v, ranges=(hi, lo)))
    raises(ValueError, r"ranges\[0\] \(lo\) must have shape \[B, Lq\] = \[2, 6\]",
           lambda q, k, v: ca.attention(q, k, v, ranges=(lo[:, :3], hi)))
    raises(ValueError, r"must be an integer tensor",
           lambda q, k, v: ca.attention(q, k, v, ranges=(lo.double(), hi)))


def test_mixed_devices():
    raises(ValueError, r"key is on meta but query is on cpu",
           lambda q, k, v: ca.attention(q, k.to("meta"), v))


def test_optional_tensors_on_another_device():
    """ranges and a temperature tensor on the meta device beside CPU q, k, v: a
    call on two devices is dispatched by the highest, and meta's kernel (shapes
    only) used to return uninitialised memory with no error."""
    lo, hi = torch.zeros(B, L, dtype=torch.long), torch.full((B, L), L, dtype=torch.long)
    raises(ValueError, r"temperature is on meta but query is on cpu",
           lambda q, k, v: ca.attention(q, k, v, temperature=torch.tensor(0.5, dtype=q.dtype, device="meta")))
    raises(ValueError, r"range_lo is on meta but query is on cpu",
           lambda q, k, v: ca.attention(q, k, v, ranges=(lo.to("meta"), hi)))
    raises(ValueError, r"range_hi is on meta but query is on cpu",
           lambda q, k, v: ca.attention(q, k, v, ranges=(lo, hi.to("meta"))))
    # the operators themselves, forward and backward
    args = ("continuum", False, -1, -1, None, None, None, 1.0, None)
    q, k, v = qkv()
    out, lse, stats, ref = torch.ops.continuum.forward(q, k, v, *args)
    with pytest.raises(ValueError, match=r"temperature is on meta but query is on cpu"):
        torch.ops.continuum.forward(q, k, v, "continuum", False, -1, -1, None, None,
                                    torch.tensor(0.5, dtype=q.dtype, device="meta"), 1.0, None)
    with pytest.raises(ValueError, match=r"lse is on meta but query is on cpu"):
        torch.ops.continuum.backward(out, q, k, v, out, lse.to("meta"), stats, ref, *args)
    # a meta temperature requiring grad: the gradient is not taken either
    t = torch.tensor(0.5, dtype=torch.float64, device="meta", requires_grad=True)
    q.requires_grad_()
    with pytest.raises(ValueError, match=r"temperature is on meta but query is on cpu"):
        ca.attention(q, k, v, temperature=t)
    # all on meta: shapes only, as before
    o = ca.attention(q.detach().to("meta"), k.to("meta"), v.to("meta"), temperature=t.detach())
    assert o.device.type == "meta" and o.shape == q.shape


def test_mixed_dtypes():
    raises(ValueError, r"value has dtype torch.float32 but query has torch.float64",
           lambda q, k, v: ca.attention(q, k, v.float()))


def test_mixed_dtypes_direct_op():
    """The C++ operator checks too (for callers of torch.ops.continuum.forward)."""
    raises(ValueError, r"key has dtype Float but query has Double",
           lambda q, k, v: torch.ops.continuum.forward(q, k.float(), v, "continuum", False, -1, -1,
                                                       None, None, None, 1.0, None))


def test_unsupported_dtype_on_cpu():
    q, k, v = (t.to(torch.int32) for t in qkv())
    with pytest.raises(ValueError, match=r"CPU backend supports float32, float64, bfloat16 and float16, got torch.int32"):
        ca.attention(q, k, v)
    with pytest.raises(ValueError, match=r"CPU backend supports float32, float64, bfloat16 and float16, got Int"):
        torch.ops.continuum.forward(q, k, v, "continuum", False, -1, -1, None, None, None, 1.0, None)


def test_bad_options():
    raises(ValueError, r"kernel must be one of", lambda q, k, v: ca.attention(q, k, v, kernel="linear"))
    raises(ValueError, r"scale: must be finite and > 0, got -1",
           lambda q, k, v: ca.attention(q, k, v, scale=-1.0))
    raises(TypeError, r"window must be a pair", lambda q, k, v: ca.attention(q, k, v, window=3))
    raises(TypeError, r"temperature must be a number or a tensor",
           lambda q, k, v: ca.attention(q, k, v, temperature="hot"))
    raises(TypeError, r"query must be a torch.Tensor",
           lambda q, k, v: ca.attention(q.numpy(), k, v))


def test_no_write_on_success():
    q, k, v = qkv()
    q.requires_grad_()
    before = [t.detach().clone() for t in (q, k, v)]
    ca.attention(q, k, v, causal=True).sum().backward()
    for t, b in zip((q, k, v), before):
        assert torch.equal(t.detach(), b)


def test_bad_compute():
    raises(ValueError, r"compute must be None, 'default', 'float32' or 'float64', got 'double'",
           lambda q, k, v: ca.attention(q, k, v, compute="double"))
    raises(TypeError, r"compute must be None or a string, got torch\.dtype",
           lambda q, k, v: ca.attention(q, k, v, compute=torch.float64))
    # float64 storage has no float32 arithmetic on the CPU
    raises(ValueError, r"compute='float32' needs float32, bfloat16 or float16 storage, query is torch.float64",
           lambda q, k, v: ca.attention(q, k, v, compute="float32"))


def test_bad_compute_direct_op():
    """The C++ operators check `compute` too (forward and backward)."""
    args = lambda q, k, v: (q, k, v, "continuum", False, -1, -1, None, None, None, 1.0, None)
    raises(ValueError, r"compute must be None, \"default\", \"float32\" or \"float64\", got \"fp16\"",
           lambda q, k, v: torch.ops.continuum.forward(*args(q, k, v), "fp16"))
    raises(ValueError, r"compute=\"float32\" needs float32, bfloat16 or float16 storage, query is Double",
           lambda q, k, v: torch.ops.continuum.forward(*args(q, k, v), "float32"))
    q, k, v = qkv()
    out, lse, stats, ref = torch.ops.continuum.forward(*args(q, k, v))
    for bad, match in (("float16", r"compute must be None"), ("float32", r"needs float32, bfloat16 or float16 storage")):
        with pytest.raises(ValueError, match=match):
            torch.ops.continuum.backward(out, q, k, v, out, lse, stats, ref, "continuum", False, -1, -1,
                                         None, None, None, 1.0, None, bad)


def test_option_types_are_not_coerced():
    """A bad option type raises TypeError (was: window=(1.5, 0) ran as (1, 0),
    window="12" as (1, 2), causal="no" as causal, scale="0.5" as 0.5)."""
    for window in ((1.5, 0), "12", (1,), (1, 2, 3), (True, 0), (None, 0), (float("inf"), 0)):
        raises(TypeError, r"window must be a pair of ints \(left, right\)",
               lambda q, k, v: ca.attention(q, k, v, window=window))
    raises(ValueError, r"window bounds must fit in 64 bits",
           lambda q, k, v: ca.attention(q, k, v, window=(2**70, 0)))
    for causal in ("no", 1, None):
        raises(TypeError, r"causal must be a bool", lambda q, k, v: ca.attention(q, k, v, causal=causal))
    for scale in ("0.5", True, torch.tensor(0.5)):
        raises(TypeError, r"scale must be None or a number", lambda q, k, v: ca.attention(q, k, v, scale=scale))
    import numpy as np
    # a type outside builtins is named with its module (was "must be a bool, got bool")
    raises(TypeError, r"causal must be a bool, got numpy\.bool",
           lambda q, k, v: ca.attention(q, k, v, causal=np.bool_(True)))
    raises(TypeError, r"causal must be a bool, got str$", lambda q, k, v: ca.attention(q, k, v, causal="no"))
    # the accepted forms still run: a list pair, ints of other types
    q, k, v = qkv()
    ref = ca.attention(q, k, v, window=(2, 1), scale=0.5)
    assert torch.equal(ca.attention(q, k, v, window=[2, 1], scale=0.5), ref)
    assert torch.equal(ca.attention(q, k, v, window=(np.int64(2), np.int32(1)), scale=np.float64(0.5)), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_temperature_beyond_float32(dtype):
    """A number temperature that the call's float32 temperature cannot hold is
    named as given (was: "got 0" for 1e-300, "got inf" for 1e300); float64
    calls take it (their temperature is float64)."""
    for tau, shown in ((1e-300, "1e-300"), (1e300, "1e\\+300")):
        raises(ValueError, rf"temperature {shown} is outside float32's range",
               lambda q, k, v: ca.attention(q.to(dtype), k.to(dtype), v.to(dtype), temperature=tau))
    q, k, v = qkv()
    out = ca.attention(q, k, v, temperature=1e-300)
    assert torch.isfinite(out).all()
    # the smallest float32 subnormal is a valid float32 temperature
    out = ca.attention(q.to(dtype), k.to(dtype), v.to(dtype), temperature=1e-45)
    assert torch.isfinite(out).all()


def test_numbers_beyond_float64():
    """A Python int or Fraction beyond float64's range (or nonzero and rounding
    to 0), as temperature or scale, is a ValueError naming the option (was:
    OverflowError, "int too large to convert to float", naming neither; an int
    of over 4300 digits: Python's own limit on converting it to a string)."""
    from fractions import Fraction
    for name, x, got in (("temperature", 10 ** 400, "an integer of about 401 digits"),
                         ("scale", 10 ** 400, "an integer of about 401 digits"),
                         ("scale", -10 ** 400, "a negative integer of about 401 digits"),
                         ("temperature", 10 ** 5000, "an integer of about 5001 digits"),
                         ("temperature", Fraction(10 ** 400, 3), "Fraction"),
                         ("scale", Fraction(1, 10 ** 400), "Fraction")):
        raises(ValueError, rf"{name} must be within float64's range \(finite and > 0\), got {got}",
               lambda q, k, v: ca.attention(q, k, v, **{name: x}))
    q, k, v = qkv()  # ints and Fractions float64 holds are taken as numbers
    assert torch.equal(ca.attention(q, k, v, temperature=3, scale=Fraction(1, 2)),
                       ca.attention(q, k, v, temperature=3.0, scale=0.5))


@pytest.mark.parametrize("shape", [(1, 2, 0, 4), (0, 2, 3, 4), (1, 0, 3, 4)])
def test_empty_query_backward(shape):
    """No query rows: .sum().backward() hands in an expanded (stride-0) empty
    gradient, which is no stride error (was: "grad_out: the dim (last) axis
    must be contiguous ... got 0"); dK, dV and dτ are zero (README, W04)."""
    B_, Hq, Lq, D_ = shape
    Hk = min(Hq, 1)
    q = torch.randn(B_, Hq, Lq, D_, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B_, Hk, 5, D_, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B_, Hk, 5, 3, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    ca.attention(q, k, v, temperature=tau).sum().backward()
    assert q.grad.shape == q.shape
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))
    assert tau.grad.item() == 0.0
    # an expanded empty query is no stride error either
    qe = torch.randn(1, 1, 1, D_, dtype=torch.float64).expand(B_, Hq, Lq, D_)
    assert ca.attention(qe, k.detach(), v.detach()).shape == (B_, Hq, Lq, 3)


def test_backward_checks_lse_shape():
    """The C++ backward reads lse [B, Hq, Lq]: a wrong-sized one is an error,
    never an out-of-bounds read (direct callers of torch.ops.continuum.backward)."""
    q, k, v = qkv()
    args = ("continuum", False, -1, -1, None, None, None, 1.0, None)
    out, lse, stats, ref = torch.ops.continuum.forward(q, k, v, *args)
    for bad in (lse[:, :, :2], lse[:1], lse.reshape(B, H * L, 1)):
        with pytest.raises(ValueError, match=r"lse must be the forward's \[B, Hq, Lq\] = \[2, 4, 6\]"):
            torch.ops.continuum.backward(out, q, k, v, out, bad, stats, ref, *args)


def test_backward_checks_row_stats_shape():
    """The forward's row statistics (row_stats=True): a wrong-sized or wrongly typed
    pair is an error, never an out-of-bounds read."""
    q, k, v = qkv()
    args = ("continuum", False, -1, -1, None, None, None, 1.0, None)
    out, lse, stats, ref = torch.ops.continuum.forward(q, k, v, *args, "default", True)
    assert stats.shape == (B, H, L, v.shape[3] + 5) and ref.shape == (B, H, L)
    for bad_stats, bad_ref in ((stats[:, :, :2], ref), (stats, ref[:1]), (stats.float(), ref),
                               (stats, ref.int())):
        with pytest.raises(ValueError, match=r"row_stats and row_ref must be the forward's"):
            torch.ops.continuum.backward(out, q, k, v, out, lse, bad_stats, bad_ref, *args)
