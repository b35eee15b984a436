"""QDQ models made by onnxruntime's own quantizer (`quantize_static`) from an FP32 export."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

IR_VERSION = 10  # onnxruntime 1.31 reads IR versions up to 13; match models/export.py

#: The QDQ flavours the converter must accept.
VARIANTS = {
    # quantize_static's own defaults: int8 activations (asymmetric) and weights (symmetric), per tensor
    "default": {},
    # symmetric int8 activations, symmetric per-channel int8 weights, every supported op quantized
    "int8_sym": dict(
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    ),
    # asymmetric uint8 activations, per-tensor int8 weights
    "uint8_asym": dict(
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=False,
        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
    ),
    # TensorRT style: only the inputs of MatMul/Gemm/Conv get Q/DQ (symmetric int8, per-channel weights);
    # without OpTypesToExcludeOutputQuantization onnxruntime would quantize their outputs as well
    "partial": dict(
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul", "Gemm", "Conv"],
        extra_options={
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm", "Conv"],
        },
    ),
}


def mask_nodes(model: onnx.ModelProto, mask_input: str = "attention_mask") -> list[str]:
    """The nodes ``quantize_static`` must leave float so that an attention mask never sets a quantization
    scale: every node computing from the integer ``mask_input`` without the activations (Unsqueeze, Cast,
    ``1 - mask``, ``* finfo.min``, Where, Expand, GatherND, ..., with shape arithmetic beside it), each node
    where that mask meets the activations (the scores' Add or Where; a masked mean pooling's Mul and Div) and
    the Softmax reading such a node's output. Empty if the model has no such input.

    Why: ``quantize_static`` quantizes the inputs and outputs of every Add/Mul/Where/Softmax it meets, so the
    mask (0 or its fill value: ``finfo.min``, -10000) and the masked scores get an int8 scale that spans
    the fill value, and the scores' information is gone. Left float, the mask stays a function of the int64
    input, which the converter evaluates at conversion (two values per mask entry), and the scores keep
    their own scale (docs/conversion.md, "Attention masks and quantizers").
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def closure(starts: list[str], through) -> set[str]:
        seen, frontier = set(starts), list(starts)
        while frontier:
            for node in consumers.get(frontier.pop(), []):
                if through(node):
                    new = [o for o in node.output if o not in seen]
                    seen.update(new)
                    frontier.extend(new)
        return seen

    # activations: what the other inputs flow into, except through shape reads (HF builds the mask's shape
    # from the embeddings' Shape)
    others = [i.name for i in model.graph.input if i.name != mask_input]
    activations = closure(others, lambda n: n.op_type not in ("Shape", "Size"))
    meets = lambda n: any(i in activations for i in n.input)  # noqa: E731
    if not any(i.name == mask_input for i in model.graph.input):
        return []
    mask = closure([mask_input], lambda n: not meets(n))
    excluded = {n.name: None for n in model.graph.node if any(i in mask for i in n.input)}
    for node in [n for n in model.graph.node if n.name in excluded and meets(n)]:
        excluded.update(
            {c.name: None for o in node.output for c in consumers.get(o, []) if c.op_type == "Softmax"}
        )
    return list(excluded)


class _Reader(CalibrationDataReader):
    """Feeds calibration batches to onnxruntime's calibrator: an array goes under the model's (first) input
    name as float32; a dict of arrays (a multi-input model such as ``models.bert``) is fed as it is."""

    def __init__(self, input_name: str, batches: Iterable[np.ndarray | dict[str, np.ndarray]]):
        self._feeds: Iterator[dict[str, np.ndarray]] = (
            b if isinstance(b, dict) else {input_name: np.ascontiguousarray(b, dtype=np.float32)}
            for b in batches
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def ort_quantize(
    fp32_path: str | Path,
    out_path: str | Path,
    calib_batches: Iterable[np.ndarray | dict[str, np.ndarray]],
    variant: str = "int8_sym",
    preprocess: bool = True,
    options: dict | None = None,
    exclude_mask: bool = False,
) -> onnx.ModelProto:
    """QDQ-quantize an FP32 ONNX model with onnxruntime's `quantize_static` (min/max calibration).

    variant: a key of VARIANTS ("default", "int8_sym", "uint8_asym", "partial"); options: quantize_static's
    keyword arguments instead of a variant's. exclude_mask: add the attention mask's nodes
    (:func:`mask_nodes`) to ``nodes_to_exclude``, so a BERT-style mask stays out of every scale. preprocess:
    first run onnxruntime's recommended `quant_pre_process` (shape inference and basic graph optimizations
    such as folding shape computations and Identity nodes; no contrib-op fusions). The result is saved to
    `out_path` with IR version 10 and returned.
    """
    if options is None and variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    with tempfile.TemporaryDirectory() as tmp:
        if preprocess:
            pre_path = Path(tmp) / "preprocessed.onnx"
            quant_pre_process(str(fp32_path), str(pre_path))
            fp32_path = pre_path
        model = onnx.load(str(fp32_path))
        reader = _Reader(model.graph.input[0].name, calib_batches)
        kwargs = dict(options or VARIANTS[variant])
        if exclude_mask:
            kwargs["nodes_to_exclude"] = [*kwargs.get("nodes_to_exclude", []), *mask_nodes(model)]
        quantize_static(model, str(out_path), reader, quant_format=QuantFormat.QDQ, **kwargs)
    quantized = onnx.load(str(out_path))
    quantized.ir_version = min(quantized.ir_version, IR_VERSION)
    onnx.save(quantized, str(out_path))
    return quantized
