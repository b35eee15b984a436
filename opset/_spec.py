"""What every private op declares: ports, attributes, reference kernel, function body, output type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ._body import Body

#: the private opset
DOMAIN = "ai.ivit"
VERSION = 1

INT_IN = (np.int8, np.uint8, np.int16, np.int32)
QUANT_OUT = (np.int8, np.uint8, np.int16, np.int32)
I64 = (np.int64,)


@dataclass(frozen=True)
class Port:
    name: str
    types: tuple
    doc: str


#: the last input of every op: the output's zero point, whose type is the output type
Y_ZERO_POINT = Port("y_zero_point", QUANT_OUT, "output zero point; its type is the output type")
#: the saturation bounds of the ops that requantize their output
SATURATION = {"qmin": "lowest output value", "qmax": "highest output value"}


@dataclass(frozen=True)
class OpSpec:
    """One op of the private opset; the numpy ``reference`` is the normative definition. ``doc`` may be
    the op module's docstring: its first line is kept."""

    name: str
    doc: str
    inputs: tuple[Port, ...]
    output: Port
    attributes: dict[str, str]
    reference: Callable[..., np.ndarray]
    body: Callable[[Body], None]

    def __post_init__(self):
        object.__setattr__(self, "doc", self.doc.strip().splitlines()[0])

    def output_dtype(self, input_dtypes: list) -> np.dtype:
        """Every op writes the dtype of its last input, ``y_zero_point`` (as QuantizeLinear does)."""
        return np.dtype(input_dtypes[-1])

    def check(self, input_dtypes: list, attrs: dict, where: str = "") -> np.dtype:
        """Validate dtypes and attributes; returns the output dtype or raises ``ValueError``."""
        tag = where or self.name
        if len(input_dtypes) != len(self.inputs):
            raise ValueError(f"{tag}: {self.name} takes {len(self.inputs)} inputs, got {len(input_dtypes)}")
        for port, dt in zip(self.inputs, input_dtypes, strict=True):
            if np.dtype(dt) not in [np.dtype(t) for t in port.types]:
                raise ValueError(f"{tag}: input {port.name} of {self.name} must be one of "
                                 f"{[np.dtype(t).name for t in port.types]}, got {np.dtype(dt).name}")
        missing = set(self.attributes) - set(attrs)
        if missing:
            raise ValueError(f"{tag}: {self.name} needs attributes {sorted(missing)}")
        extra = set(attrs) - set(self.attributes)
        if extra:
            raise ValueError(f"{tag}: {self.name} has no attributes {sorted(extra)}")
        return self.output_dtype(input_dtypes)

    def run(self, *inputs, **attrs) -> np.ndarray:
        """Run the reference kernel after checking dtypes and attributes."""
        self.check([np.asarray(x).dtype for x in inputs], attrs)
        return self.reference(*inputs, **{k: int(v) for k, v in attrs.items()})

    def function(self, opset: int) -> onnx.FunctionProto:
        """The model-local FunctionProto for a model whose default-domain opset is ``opset``."""
        g = Body(opset)
        self.body(g)
        return g.function(DOMAIN, self.name, [p.name for p in self.inputs], [self.output.name],
                          list(self.attributes))

    def make_node(self, inputs: list[str], outputs: list[str], name: str | None = None, **attrs):
        """A node of this op in the private domain."""
        return helper.make_node(self.name, inputs, outputs, name=name, domain=DOMAIN,
                                **{k: int(v) for k, v in attrs.items()})


def requantizing(
    name: str, doc: str, reference, body, output_doc: str, *inputs: Port, **attributes: str
) -> OpSpec:
    """An op whose last step is a dyadic requantize: ``inputs`` then ``y_zero_point``; the output saturates
    to ``[qmin, qmax]`` (attributes after the op's own)."""
    return OpSpec(name, doc, (*inputs, Y_ZERO_POINT), Port("y", QUANT_OUT, output_doc),
                  {**attributes, **SATURATION}, reference, body)


def dyadic(b: str, c: str = "c in 0..62") -> tuple[Port, Port]:
    """The ``multiplier`` b and ``shift`` c ports of a dyadic rescale ``b / 2**c`` (their docs per op)."""
    return Port("multiplier", I64, b), Port("shift", I64, c)
