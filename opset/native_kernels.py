"""The compiled kernels of the private ops (``native/kernels.cpp``), bit-exact twins of the references.

The C++ source is built into ``_kernels*.so`` when the project is installed (``setup.py``; an optional
extension, so a machine without a C++ compiler still installs and falls back to the numpy references)
and loaded here with ctypes. Each wrapper takes the reference kernel's arguments and returns the
output, or ``None`` when the call is outside what the native loop handles (a broadcast pattern other
than per tensor / per channel, a shift outside ``0..62``, non-scalar zero points); the caller then
uses the reference. :data:`STATS` counts both, so a user can see which path ran.
``IVIT_NATIVE_LIB`` names another build of the library to load (empty: load none).
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from pathlib import Path

import numpy as np

_CODES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3}
_ARGS = {  # kernel -> argument kinds: p pointer, i int64, c dtype code / thread count (int)
    "ivit_requantize": "pciiiippiiipcc",
    "ivit_iadd": "pcpciiiiiiiiiipcc",
    "ivit_shiftmax": "pciiiiiipcc",
    "ivit_shiftgelu": "pciiippiiiiiipcc",
    "ivit_ilayernorm": "pciipppiiiiiipcc",
    "ivit_ibertgelu": "pciiippiiiiiipcc",
    "ivit_l1layernorm": "pciipppiiiiiipcc",
    "ivit_ibert_softmax": "pciiiiiiiipcc",
    "ivit_log_int_softmax": "pciiiiiiiiipcc",
    "ivit_il2norm": "pciippiiiiiiiipcc",
}
#: how many calls each op made natively and through the numpy reference (``"Op/native"``, ``"Op/numpy"``)
STATS: Counter = Counter()
_threads = os.cpu_count() or 1


def _find() -> Path | None:
    override = os.environ.get("IVIT_NATIVE_LIB")
    if override is not None:
        return Path(override) if override else None  # empty: run without the native kernels
    here = Path(__file__).resolve().parent
    found = sorted(here.glob("_kernels*.so")) + sorted(here.glob("_kernels*.pyd"))
    return found[0] if found else None


def _load():
    path = _find()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    kinds = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "c": ctypes.c_int}
    for name, sig in _ARGS.items():
        fn = getattr(lib, name)
        fn.argtypes = [kinds[k] for k in sig]
        fn.restype = ctypes.c_int
    return lib


_LIB = _load()


def available() -> bool:
    """Whether the compiled kernels were built and loaded."""
    return _LIB is not None


def library_path() -> Path | None:
    return _find() if _LIB is not None else None


def set_threads(n: int | None) -> None:
    """Threads each kernel call may use (default: every core); the runners pass their thread count."""
    global _threads
    _threads = max(1, int(n)) if n else (os.cpu_count() or 1)


def _scalar(v) -> int | None:
    a = np.asarray(v)
    return int(a.reshape(-1)[0]) if a.size == 1 else None


def _channels(shape: tuple, *params) -> tuple[int, int, int, list[np.ndarray]] | None:
    """``(outer, nc, inner)`` of ``shape`` and the flattened params when they vary along at most one axis."""
    arrays = [np.asarray(p, dtype=np.int64) for p in params]
    try:
        common = np.broadcast_shapes(*(a.shape for a in arrays))
        if np.broadcast_shapes(shape, common) != tuple(shape):
            return None
    except ValueError:
        return None
    padded = (1,) * (len(shape) - len(common)) + tuple(common)
    axes = [k for k, s in enumerate(padded) if s != 1]
    if len(axes) > 1:
        return None
    flat = [np.ascontiguousarray(np.broadcast_to(a, common).reshape(-1)) for a in arrays]
    if not axes:
        return int(np.prod(shape)), 1, 1, flat
    k = axes[0]
    outer, inner = int(np.prod(shape[:k])), int(np.prod(shape[k + 1:]))
    return outer, int(shape[k]), inner, flat


def _shifts_ok(*shifts: np.ndarray) -> bool:
    return all(s.size == 0 or (s.min() >= 0 and s.max() <= 62) for s in shifts)


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _call(op: str, name: str, *args) -> None:
    if getattr(_LIB, name)(*args) != 0:
        raise RuntimeError(f"{op}: native kernel rejected its dtypes")  # _CODES admitted them: a bug
    STATS[f"{op}/native"] += 1


def _prep(x, y_zero_point, *others):
    """``x`` contiguous and the output zero point, if the output has x's shape and both have kernel dtypes."""
    x = np.ascontiguousarray(x)
    zy = np.asarray(y_zero_point)
    if _LIB is None or x.dtype not in _CODES or zy.dtype not in _CODES or x.size == 0:
        return None
    try:
        if np.broadcast_shapes(x.shape, zy.shape, *(np.shape(o) for o in others)) != x.shape:
            return None
    except ValueError:
        return None
    return x, zy


def requantize(x, x_zero_point, multiplier, shift, y_zero_point, *, qmin: int, qmax: int):
    got = _prep(x, y_zero_point, x_zero_point)
    zx, zy = _scalar(x_zero_point), _scalar(y_zero_point)
    ch = got and _channels(got[0].shape, multiplier, shift)
    if not ch or zx is None or zy is None or not _shifts_ok(ch[3][1]):
        return None
    x, zyt = got
    (outer, nc, inner, (b, c)), y = ch, np.empty(x.shape, zyt.dtype)
    _call("Requantize", "ivit_requantize", _ptr(x), _CODES[x.dtype], outer, nc, inner, zx, _ptr(b), _ptr(c),
          zy, qmin, qmax, _ptr(y), _CODES[y.dtype], _threads)
    return y


def _periodic(v: np.ndarray, shape: tuple) -> np.ndarray | None:
    """``v`` flat, repeating along ``shape`` (its shape a suffix of ``shape``, leading 1s dropped)."""
    dims = list(v.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    if tuple(dims) != tuple(shape[len(shape) - len(dims):]):
        return None
    return np.ascontiguousarray(v).reshape(-1)


def iadd(a, b, a_zero_point, b_zero_point, a_multiplier, b_multiplier, shift, y_zero_point, *,
         qmin: int, qmax: int):
    a, b = np.asarray(a), np.asarray(b)
    zy_arr = np.asarray(y_zero_point)
    params = (a_zero_point, b_zero_point, a_multiplier, b_multiplier, shift, y_zero_point)
    scalars = [_scalar(v) for v in params]
    if (_LIB is None or a.dtype not in _CODES or b.dtype not in _CODES or zy_arr.dtype not in _CODES
            or any(s is None for s in scalars) or not 0 <= scalars[4] <= 62):
        return None
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        return None
    if a.shape != shape:  # the kernel repeats b; let a be the full one
        a, b = b, a
        scalars = [scalars[1], scalars[0], scalars[3], scalars[2], *scalars[4:]]
    if a.shape != shape or a.size == 0:
        return None
    bf = _periodic(b, shape)
    if bf is None or bf.size == 0:
        return None
    za, zb, ma, mb, c, zy = scalars
    a = np.ascontiguousarray(a)
    y = np.empty(shape, zy_arr.dtype)
    _call("IAdd", "ivit_iadd", _ptr(a), _CODES[a.dtype], _ptr(bf), _CODES[bf.dtype], a.size, bf.size, za, zb,
          ma, mb, c, zy, qmin, qmax, _ptr(y), _CODES[y.dtype], _threads)
    return y


def _exp_ok(x0: int, n: int) -> bool:
    return x0 >= 1 and 0 <= n <= 62


def shiftmax(x, y_zero_point, *, x0: int, n: int, bits: int):
    got, zy = _prep(x, y_zero_point), _scalar(y_zero_point)
    if not got or zy is None or not _exp_ok(x0, n) or not 0 <= bits <= 62 or got[0].ndim == 0:
        return None
    x, zyt = got
    y = np.empty(x.shape, zyt.dtype)
    rows = x.size // x.shape[-1]
    _call("Shiftmax", "ivit_shiftmax", _ptr(x), _CODES[x.dtype], rows, x.shape[-1], zy, x0, n, bits, _ptr(y),
          _CODES[y.dtype], _threads)
    return y


def _gelu(op: str, name: str, ok: bool, x, multiplier, shift, y_zero_point, qmin: int, qmax: int, *attrs):
    """ShiftGELU / IBertGELU natively: ``attrs`` (their own, in the C entry's order) valid per ``ok``."""
    got, zy = _prep(x, y_zero_point), _scalar(y_zero_point)
    ch = got and _channels(got[0].shape, multiplier, shift)
    if not ch or zy is None or not ok or not _shifts_ok(ch[3][1]):
        return None
    x, zyt = got
    (outer, nc, inner, (b, c)), y = ch, np.empty(x.shape, zyt.dtype)
    _call(op, name, _ptr(x), _CODES[x.dtype], outer, nc, inner, _ptr(b), _ptr(c), zy, *attrs, qmin, qmax,
          _ptr(y), _CODES[y.dtype], _threads)
    return y


def shiftgelu(x, multiplier, shift, y_zero_point, *, x0: int, n: int, bits: int, qmin: int, qmax: int):
    ok = _exp_ok(x0, n) and 0 <= bits <= 62
    args = (x, multiplier, shift, y_zero_point, qmin, qmax)
    return _gelu("ShiftGELU", "ivit_shiftgelu", ok, *args, x0, n, bits)


def _layernorm(op: str, name: str, x, multiplier, shift, bias, y_zero_point, *, shift_in: int, p: int,
               qmin: int, qmax: int):
    got, zy = _prep(x, y_zero_point), _scalar(y_zero_point)
    if not got or zy is None or got[0].ndim == 0 or not 0 <= shift_in <= 62 or not 0 <= p <= 61:
        return None
    x, zyt = got
    length = x.shape[-1]
    ch = _channels(x.shape, multiplier, shift, bias)
    if not ch or not _shifts_ok(ch[3][1]) or (ch[1] != 1 and ch[2] != 1):  # per tensor or last axis
        return None
    _, nc, _, (b, c, bias_) = ch
    y = np.empty(x.shape, zyt.dtype)
    _call(op, name, _ptr(x), _CODES[x.dtype], x.size // length, length, _ptr(b), _ptr(c), _ptr(bias_), nc, zy,
          shift_in, p, qmin, qmax, _ptr(y), _CODES[y.dtype], _threads)
    return y


def ilayernorm(x, multiplier, shift, bias, y_zero_point, **attrs):
    return _layernorm("ILayerNorm", "ivit_ilayernorm", x, multiplier, shift, bias, y_zero_point, **attrs)


def l1layernorm(x, multiplier, shift, bias, y_zero_point, **attrs):
    return _layernorm("L1LayerNorm", "ivit_l1layernorm", x, multiplier, shift, bias, y_zero_point, **attrs)


def il2norm(x, x_zero_point, multiplier, shift, y_zero_point, *, shift_in: int, eps: int, p: int, qmin: int,
            qmax: int):
    got, zx, zy = _prep(x, y_zero_point, x_zero_point), _scalar(x_zero_point), _scalar(y_zero_point)
    if not got or zx is None or zy is None or got[0].ndim == 0 or not 0 <= shift_in <= 62 or not 0 <= p <= 61:
        return None
    if not 1 <= eps < 2**62:
        return None
    x, zyt = got
    length = x.shape[-1]
    ch = _channels(x.shape, multiplier, shift)
    if not ch or not _shifts_ok(ch[3][1]) or (ch[1] != 1 and ch[2] != 1):  # per tensor or last axis
        return None
    _, nc, _, (b, c) = ch
    y = np.empty(x.shape, zyt.dtype)
    _call("IL2Norm", "ivit_il2norm", _ptr(x), _CODES[x.dtype], x.size // length, length, _ptr(b), _ptr(c), nc,
          zx, zy, shift_in, eps, p, qmin, qmax, _ptr(y), _CODES[y.dtype], _threads)
    return y


def ibertgelu(x, multiplier, shift, y_zero_point, *, clip: int, coeff: int, k: int, qmin: int, qmax: int):
    args = (x, multiplier, shift, y_zero_point, qmin, qmax)
    return _gelu("IBertGELU", "ivit_ibertgelu", 0 <= k <= 62, *args, clip, coeff, k)


def _poly_ok(x0: int, qb: int, qc: int, n: int) -> bool:
    """The exp attributes the kernels compute (``native/poly_exp.h``, ``poly_exp_refusal``)."""
    return 1 <= x0 <= qb <= 2**30 and 0 <= qc <= 2**60 and 0 <= n <= 60 and (qb * qb + qc) << n < 2**61


def _poly_softmax(op: str, name: str, x, y_zero_point, attrs: list[int]):
    got, zy = _prep(x, y_zero_point), _scalar(y_zero_point)
    if not got or zy is None or got[0].ndim == 0:
        return None
    x, zyt = got
    y = np.empty(x.shape, zyt.dtype)
    _call(op, name, _ptr(x), _CODES[x.dtype], x.size // x.shape[-1], x.shape[-1], zy, *attrs, _ptr(y),
          _CODES[y.dtype], _threads)
    return y


def ibert_softmax(x, y_zero_point, *, x0: int, qb: int, qc: int, n: int, bits: int):
    if not _poly_ok(x0, qb, qc, n) or not 1 <= bits <= 30:
        return None
    return _poly_softmax("IBertSoftmax", "ivit_ibert_softmax", x, y_zero_point, [x0, qb, qc, n, bits])


def log_int_softmax(x, y_zero_point, *, x0: int, qb: int, qc: int, n: int, bits: int, log_bits: int):
    if not _poly_ok(x0, qb, qc, n) or not 1 <= bits <= 30 or not 1 <= log_bits <= 5:
        return None
    attrs = [x0, qb, qc, n, bits, log_bits]
    return _poly_softmax("LogIntSoftmax", "ivit_log_int_softmax", x, y_zero_point, attrs)


#: op_type -> native wrapper (same arguments as the reference; ``None`` means "use the reference")
KERNELS = {"Requantize": requantize, "IAdd": iadd, "Shiftmax": shiftmax, "ShiftGELU": shiftgelu,
           "ILayerNorm": ilayernorm, "IBertGELU": ibertgelu, "L1LayerNorm": l1layernorm,
           "IBertSoftmax": ibert_softmax, "LogIntSoftmax": log_int_softmax, "IL2Norm": il2norm}


def run(op: str, reference, *inputs, **attrs) -> np.ndarray:
    """``op`` natively where the wrapper takes the call, else by its numpy ``reference``."""
    out = KERNELS[op](*inputs, **attrs) if op in KERNELS else None
    if out is None:
        STATS[f"{op}/numpy"] += 1
        return reference(*inputs, **attrs)
    return out


__all__ = ["KERNELS", "STATS", "available", "library_path", "run", "set_threads"]
