"""Affine types: what every integer edge means as a real number, ``real = (q - zero_point) * scale``.

As in TVM's FakeQuantizationToInteger, DequantizeLinear introduces a type, layout ops pass it through,
MatMul/Conv produce int32 with ``s_x * s_w`` and a QuantizeLinear becomes a Requantize only where the
types differ. ``scale`` is kept in a shape that broadcasts against the tensor (per channel along an
axis), ``bound`` is a proven bound on ``|q - zero_point|`` used to size dyadic multipliers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_RANGES = {
    np.dtype(t): (int(np.iinfo(t).min), int(np.iinfo(t).max))
    for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32)
}


def dtype_range(dtype) -> tuple[int, int]:
    """``(qmin, qmax)`` of an integer dtype the converter emits."""
    dt = np.dtype(dtype)
    if dt not in _RANGES:
        raise ValueError(f"unsupported integer type {dt.name}")
    return _RANGES[dt]


@dataclass(frozen=True, eq=False)
class Affine:
    scale: np.ndarray
    zero_point: int
    dtype: np.dtype
    bound: int = field(default=0)

    def __post_init__(self):
        object.__setattr__(self, "scale", np.asarray(self.scale, dtype=np.float64))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if not self.bound:
            lo, hi = dtype_range(self.dtype)
            object.__setattr__(self, "bound", max(hi - self.zero_point, self.zero_point - lo))

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1

    @property
    def qrange(self) -> tuple[int, int]:
        return dtype_range(self.dtype)

    def same_as(self, other: Affine, rtol: float = 1e-7) -> bool:
        """Same dtype, zero point and (broadcast-equal) scale: a QuantizeLinear between them is a no-op."""
        return (
            self.dtype == other.dtype
            and self.zero_point == other.zero_point
            and self.scale.shape == other.scale.shape
            and bool(np.allclose(self.scale, other.scale, rtol=rtol, atol=0))
        )

    def scaled(self, k: float) -> Affine:
        """The same integers read as ``k`` times the real value (Mul/Div by a positive constant)."""
        return Affine(self.scale * k, self.zero_point, self.dtype, self.bound)

    def describe(self) -> str:
        s = (
            f"{self.scale.item():.6g}"
            if self.per_tensor
            else f"[{self.scale.min():.3g}..{self.scale.max():.3g}]"
        )
        return f"{self.dtype.name} s={s} zp={self.zero_point}"
