"""What to validate and how: :class:`ValidateOptions` (one field per CLI flag) and loading the models it
names (the integer model, the fake-quant model it came from, the FP32 model)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import onnx
from google.protobuf.message import DecodeError

from ..errors import first_line
from ..inputs import InputError
from ..io import check_names
from ..models.bundled import resolve

DEFAULT_SAMPLES = 32  # random samples: enough for a stable cosine/SQNR, cheap for a ViT
DEFAULT_MIN_AGREEMENT = 0.99
DEFAULT_MIN_SQNR = 15.0  # dB; a cosine of 0.99 with the error orthogonal to the signal is ~17 dB


@dataclass
class ValidateOptions:
    """Settings of one validation; each field is the CLI flag of the same name."""

    model: str  #: the integer-only model
    backends: list[str] = field(default_factory=lambda: ["library"])  #: the first is compared with the others
    threads: int | None = None
    int8_gemm: bool = False  #: library: keep int8 x int8 GEMMs (no exact uint8 re-encoding)
    fake_quant: str | None = None  #: the fake-quant model it was converted from (``--reference`` too)
    fp32: str | None = None
    data: str | None = None
    preprocess: str = "imagenet"
    batch: int = 8
    samples: int = DEFAULT_SAMPLES
    limit: int | None = None
    seed: int = 0
    min_cosine: float = 0.99
    min_sqnr: float = DEFAULT_MIN_SQNR
    min_agreement: float | None = None
    per_layer: bool = False
    per_op: bool = False  #: each approximating kernel's own error, fed the fake-quant integers
    json: str | None = None
    progress: bool = False

    def check(self) -> None:
        if self.batch < 1 or self.samples < 1 or (self.limit is not None and self.limit < 1):
            raise InputError("--batch, --samples and --limit must be positive")

    def models(self) -> tuple[onnx.ModelProto, onnx.ModelProto | None, onnx.ModelProto | None]:
        """The integer model, the fake-quant model and the FP32 model (None where not given)."""
        fq = load_onnx(resolve(self.fake_quant)) if self.fake_quant else None
        fp32 = load_onnx(resolve(self.fp32, fp32=True)) if self.fp32 else None
        return load_onnx(self.model), fq, fp32


def load_onnx(path: str) -> onnx.ModelProto:
    """Parse an ONNX file or raise :class:`InputError` with one line (no checker: that is a check)."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: not a file")
    try:
        model = onnx.load(path)
    except (DecodeError, RuntimeError, ValueError, OSError, onnx.checker.ValidationError) as e:
        raise InputError(f"{path}: not an ONNX model or truncated ({first_line(e, 120)})") from None
    if not model.graph.node:
        raise InputError(f"{path}: not an ONNX model or truncated (no graph nodes)")
    check_names(model, path)
    return model
