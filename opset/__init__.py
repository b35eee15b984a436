"""The private integer opset (domain ``ai.ivit``, version 1): one module per op, listed explicitly here.

Each op module holds the op's spec (ports, attributes), its numpy reference kernel (the normative
definition) and its ONNX function body; :mod:`.functions` attaches the bodies to models,
:mod:`.reference` runs models on the reference kernels, :mod:`.ort_library` is the ORT custom-op library.
"""

from __future__ import annotations

from . import (
    iadd,
    ibert_softmax,
    ibertgelu,
    il2norm,
    ilayernorm,
    l1layernorm,
    log_int_softmax,
    requantize,
    shiftgelu,
    shiftmax,
)
from ._spec import DOMAIN, VERSION, OpSpec, Port

#: every op of the opset, by op_type (one explicit list; nothing registers itself on import)
OPS: dict[str, OpSpec] = {
    m.SPEC.name: m.SPEC
    for m in (
        requantize,
        iadd,
        shiftmax,
        shiftgelu,
        ilayernorm,
        ibert_softmax,  # the paper's ablation alternatives (Table 2)
        log_int_softmax,
        ibertgelu,
        l1layernorm,
        il2norm,  # #27: cosine attention's F.normalize
    )
}

__all__ = ["DOMAIN", "OPS", "VERSION", "OpSpec", "Port"]
