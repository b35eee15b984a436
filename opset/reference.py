"""Run models on the numpy reference kernels: onnx.reference with the private ops bound to them."""

from __future__ import annotations

import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from . import OPS
from ._spec import DOMAIN


def _op_class(spec):
    def _run(self, *inputs, **attrs):
        return (spec.reference(*inputs, **{k: int(v) for k, v in attrs.items()}),)

    attrs = {k: None for k in spec.attributes}
    return type(spec.name, (OpRun,), {"op_domain": DOMAIN, "_run": _run, **attrs})


_CLASSES = [_op_class(s) for s in OPS.values()]


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    """A ReferenceEvaluator that executes ``ai.ivit`` nodes with the reference kernels (not the bodies)."""
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    keep = [f for f in stripped.functions if f.domain != DOMAIN]
    del stripped.functions[:]
    stripped.functions.extend(keep)
    return ReferenceEvaluator(stripped, new_ops=_CLASSES)
