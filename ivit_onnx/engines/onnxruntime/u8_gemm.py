"""Re-encode int8 GEMM operands as uint8 with zero point +128, exactly, for onnxruntime's fast u8 GEMM.

onnxruntime's MatMulInteger is several times faster with uint8 activations than with int8 x int8
(onnxruntime 1.31: ~10x for DeiT's shapes on AVX-512). The integer graph keeps int8 (what TVM's int8
tensor cores want), so the onnxruntime engine applies this at session time: a producer of an int8 tensor
(one of the private ops, or QuantizeLinear) writes ``u = i + 128`` as uint8 instead -- its zero point and
clip bounds move by 128, which is exact -- and every consumer gets the zero point moved by 128 too, so the
int32 accumulators, and everything after them, are bit-identical. A producer is re-encoded only when each
path from it (through layout ops) ends in an input with a zero point (MatMulInteger, Requantize, IAdd) or a
Shape, and at least one in a MatMulInteger.

The GEMMs this leaves are the forms the library's self-check proves exact on the CPU at hand
(``opset/gemm_probe.py``): uint8 x constant int8 weights in [-127, 127], uint8 x constant uint8 weights (those
holding -128, moved by 128: on ARM cores without a dot product the uint8 x int8 kernel meets -128 x -128
again), and uint8 x uint8 where both operands are activations; a model's own uint8 x int8 GEMMs (a uint8
quantizer's) with weights holding -128 get uint8 weights too, unless the library's QGemm takes them
(:func:`own_uint8_weights`). Attention's K and V become uint8 too:
onnxruntime's uint8 x int8 kernel saturates on x86 CPUs without VNNI, and only constant weights can be moved
to its exact uint8 x uint8 kernel there (by ``session.x64quantprecision``).

Every ConvInteger (3x3, strided, depthwise, AveragePool's window sums, ConvTranspose's lowering; the patch
embedding reaches this as a MatMulInteger, :mod:`.patch_gemm` runs first) runs as uint8 x constant uint8:
its activation re-encoded as above or, where its producer cannot be (a Pad, a graph input), through a uint8
copy; its weights always moved by 128. Measured on onnxruntime 1.31 (ConvInteger takes all four type pairs
and pads with the zero point): uint8 x uint8 is exact on AVX-512 VNNI, Haswell, Cortex-A72 and Cortex-A76 and
~4x faster than the int8 forms, while int8 x int8 wraps on a Cortex-A72 and int8 x uint8 is wrong there and
on Haswell; ``session.x64quantprecision`` does not touch ConvInteger. A MatMulInteger operand left int8
(its producer cannot be re-encoded) gets the same uint8 copy, so an artifact runs no int8 x int8 GEMM.
:func:`decode` maps a re-encoded tensor back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.graph import input_uses
from ivit_onnx.opset import DOMAIN
from ivit_onnx.opset.ort_library import _value_dtypes

#: ops that move data without looking at values (followed through their data input 0)
LAYOUT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Split", "Gather", "Slice", "Flatten", "Identity",
          "Expand"}
#: (op_type, input index) -> index of that input's zero point
ZERO_POINT_OF = {("MatMulInteger", 0): 2, ("MatMulInteger", 1): 3, ("ConvInteger", 0): 2,
                 ("ConvInteger", 1): 3, ("Requantize", 0): 1, ("IAdd", 0): 2, ("IAdd", 1): 3,
                 ("IL2Norm", 0): 1}
GEMMS = {"MatMulInteger", "ConvInteger"}
#: producers whose output type is the type of their zero point (input index), and their clip attributes
PRODUCERS = {"Requantize": 4, "IAdd": 7, "ShiftGELU": 3, "ILayerNorm": 4, "Shiftmax": 1, "QuantizeLinear": 2,
             "IBertGELU": 3, "L1LayerNorm": 4, "IBertSoftmax": 1, "LogIntSoftmax": 1, "IL2Norm": 4}


@dataclass
class Recoded:
    """The rewritten model and the names of the tensors now holding ``int8 + 128`` as uint8."""

    model: onnx.ModelProto
    tensors: set[str] = field(default_factory=set)
    producers: list[str] = field(default_factory=list)
    #: ConvIntegers now uint8 x uint8
    convs: int = 0
    #: MatMulInteger operands fed through a uint8 copy (int8 producers that could not be re-encoded)
    copies: int = 0


def decode(name: str, value: np.ndarray, recoded: set[str]) -> np.ndarray:
    """A tensor as the original graph computes it (int8), whether or not it was re-encoded."""
    if name in recoded and value.dtype == np.uint8:
        return (value ^ np.uint8(0x80)).view(np.int8)
    return value


def _op(node: onnx.NodeProto) -> str | None:
    if node.domain in ("", "ai.onnx") and node.op_type in ("QuantizeLinear", *LAYOUT, *GEMMS, "Shape"):
        return node.op_type
    if node.domain == DOMAIN and node.op_type in PRODUCERS:
        return node.op_type
    return None


def _family(start: str, consumers: dict, outputs: set[str]):
    """Tensors reachable from ``start`` through layout ops, and the terminal edges; None if blocked."""
    tensors, edges, todo = {start}, [], [start]
    while todo:
        t = todo.pop()
        if t in outputs:
            return None
        for node, idx in consumers.get(t, []):
            op = _op(node)
            if op in LAYOUT and idx == 0:
                new = [o for o in node.output if o and o not in tensors]
                tensors.update(new)
                todo += new
            elif op == "Shape":
                continue
            elif (op, idx) in ZERO_POINT_OF:
                edges.append((node, idx))
            else:
                return None
    return tensors, edges


def _zero_point(node: onnx.NodeProto, idx: int) -> str:
    """The name of the zero point of ``node``'s input ``idx`` (``""`` where it has none: zero)."""
    at = ZERO_POINT_OF[(node.op_type, idx)]
    return node.input[at] if len(node.input) > at else ""


def _shift_zero_point(node: onnx.NodeProto, idx: int, const, int8_scalar) -> None:
    """Move the zero point of ``node``'s input ``idx`` by +128 (its operand is re-encoded as uint8)."""
    at, name = ZERO_POINT_OF[(node.op_type, idx)], _zero_point(node, idx)
    old = int8_scalar(name) if name else 0
    while len(node.input) <= at:
        node.input.append("")
    node.input[at] = const(old + 128)


def _uint8_copy(g: onnx.GraphProto, gemm: onnx.NodeProto, side: int, const, int8_scalar) -> None:
    """Feed ``gemm`` operand ``side`` as ``x + 128`` in uint8 (a Requantize by 1 into zero point 128)
    instead of int8 ``x``."""
    zp = _zero_point(gemm, side)
    if zp and int8_scalar(zp) is None:
        raise ValueError(f"{gemm.op_type} '{gemm.name or gemm.output[0]}': an int8 operand with a zero point "
                         "that is not a scalar int8 constant; run it with int8 GEMMs (u8_gemm off)")
    tag = f"{gemm.output[0]}_{'ab'[side]}_uint8"  # unique: one per GEMM operand
    params = [numpy_helper.from_array(np.array(0, np.int8), f"{tag}_zero")]
    params += [numpy_helper.from_array(np.array(v, np.int64), f"{tag}_{k}") for k, v in (("b", 1), ("c", 0))]
    g.initializer.extend(params)
    copy = helper.make_node("Requantize", [gemm.input[side], *(p.name for p in params), const(128)], [tag],
                            name=tag, domain=DOMAIN, qmin=0, qmax=255)
    _shift_zero_point(gemm, side, const, int8_scalar)
    gemm.input[side] = copy.output[0]
    g.node.insert(list(g.node).index(gemm), copy)


def _uint8_weights(g: onnx.GraphProto, gemm: onnx.NodeProto, inits: dict, always: bool = False) -> None:
    """Constant int8 weights holding -128 (any, if ``always``) become ``w + 128`` in uint8, their zero point
    moved by 128 too: onnxruntime's uint8 x int8 kernel on ARM cores without a dot product moves A back to
    int8 and adds product pairs in int16, where -128 x -128 wraps (``opset/gemm_probe.py``'s ``u8s8_0``);
    uint8 x uint8 is exact."""
    w = inits.get(gemm.input[1])
    if w is None or w.data_type != onnx.TensorProto.INT8 or not (always or _has_min(w)):
        return
    name = f"{gemm.output[0]}_b_uint8"
    shifted = (numpy_helper.to_array(w).astype(np.int16) + 128).astype(np.uint8)
    g.initializer.append(numpy_helper.from_array(shifted, name))
    gemm.input[1] = name
    zp = inits.get(gemm.input[3]) if len(gemm.input) > 3 and gemm.input[3] else None
    old = numpy_helper.to_array(zp).astype(np.int16) if zp is not None else np.array(0, np.int16)
    while len(gemm.input) <= 3:
        gemm.input.append("")
    g.initializer.append(numpy_helper.from_array((old + 128).astype(np.uint8), f"{name}_zero"))
    gemm.input[3] = f"{name}_zero"


def _pair_activation_operands(model: onnx.ModelProto, found: dict, inits: dict) -> list[tuple]:
    """Make every GEMM of two activations uint8 x uint8 or int8 x int8: uint8 x int8 activations is the form
    that saturates without VNNI (no session option moves it), and int8 x uint8 has no onnxruntime kernel.

    A GEMM whose int8 side cannot be re-encoded drops its other side's producer from ``found`` when that was
    ours, else (natively uint8, like Shiftmax's probabilities) gets a uint8 copy of the int8 side: the
    ``(gemm, side)`` pairs returned."""
    g = model.graph
    native_u8 = _uint8_tensors(model)
    while True:
        ours: dict[int, dict[int, int]] = {}  # id(gemm) -> operand index -> producer position
        for at, (_, _, _, _, edges) in found.items():
            for n, i in edges:
                if n.op_type in GEMMS:
                    ours.setdefault(id(n), {})[i] = at
        copies, dropped = [], False
        for n in g.node:
            if n.op_type not in GEMMS or n.input[1] in inits:
                continue
            mine = ours.get(id(n), {})
            u8 = [i in mine or n.input[i] in native_u8 for i in (0, 1)]
            if u8[0] == u8[1]:
                continue
            side = u8.index(True)
            if side in mine:
                del found[mine[side]]
                dropped = True
                break
            copies.append((n, 1 - side))
        if not dropped:
            return copies


def _uint8_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors the model itself types uint8 (ONNX shape inference, through its private ops' functions)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # no types known: nothing counts as natively uint8, so nothing gets a copy
        return set()
    values = [*inferred.value_info, *inferred.input, *inferred.output]
    return {v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.UINT8}


def _has_min(w: onnx.TensorProto | None) -> bool:
    """Whether ``w`` is an int8 constant holding -128."""
    if w is None or w.data_type != onnx.TensorProto.INT8:
        return False
    return bool((numpy_helper.to_array(w) == -128).any())


def own_uint8_weights(model: onnx.ModelProto, source: onnx.ModelProto) -> int:
    """GEMMs of ``model`` (compiled from ``source``) whose uint8 activations are the source's own (a uint8
    quantizer's) and whose constant int8 weights hold -128 get those weights as uint8
    (:func:`_uint8_weights`); returns how many. Run after the library's QGemm fold, which is exact on any
    weights and takes such a GEMM where it can."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    gemms = [n for n in g.node if n.op_type == "MatMulInteger" and n.domain in ("", "ai.onnx")
             and _has_min(inits.get(n.input[1]))]
    types = _value_dtypes(source) if gemms else {}
    own = [n for n in gemms if types.get(n.input[0]) == np.uint8]
    for n in own:
        _uint8_weights(g, n, inits)
    return len(own)


def _uint8_convs(source: onnx.ModelProto, g: onnx.GraphProto, recoded: set[str], const, int8_scalar,
                 inits: dict) -> int:
    """Every ConvInteger of ``g`` as uint8 x constant uint8 (the module docstring): a uint8 copy of an int8
    activation that was not re-encoded, weights moved by 128; returns how many ConvIntegers there are.
    ``source``, the model before the re-encoding, types the activations."""
    convs = [n for n in g.node if n.op_type == "ConvInteger" and n.domain in ("", "ai.onnx")]
    if not convs:
        return 0
    types = _value_dtypes(source)
    for n in convs:
        x = n.input[0]
        if x not in recoded and types.get(x) != np.uint8:
            if types.get(x) != np.int8:
                raise ValueError(f"ConvInteger '{n.name or n.output[0]}': no type known for its input '{x}'; "
                                 "run it with int8 GEMMs (u8_gemm off)")
            _uint8_copy(g, n, 0, const, int8_scalar)
        if n.input[1] not in inits:
            raise ValueError(f"ConvInteger '{n.name or n.output[0]}': weights '{n.input[1]}' are not an "
                             "initializer; run it with int8 GEMMs (u8_gemm off)")
        _uint8_weights(g, n, inits, always=True)
    return len(convs)


def _uint8_matmul_copies(source: onnx.ModelProto, g: onnx.GraphProto, uint8: set[str], inits: dict, const,
                         int8_scalar) -> int:
    """A uint8 copy of every int8 activation operand of a MatMulInteger that is still int8 (its producer could
    not be re-encoded: a graph input, a zero point that cannot move): int8 x int8 wraps on ARM cores without a
    dot product, and the uint8 forms are the ones the self-check judges for this artifact. Returns how many.
    ``source``, the model before the re-encoding, types the activations."""
    gemms = [n for n in g.node if n.op_type == "MatMulInteger" and n.domain in ("", "ai.onnx")]
    types = _value_dtypes(source) if gemms else {}
    todo = [(n, side) for n in gemms for side in (0, 1) if n.input[side] not in inits
            and n.input[side] not in uint8 and types.get(n.input[side]) == np.int8]
    for n, side in todo:
        _uint8_copy(g, n, side, const, int8_scalar)
    return len(todo)


def recode(model: onnx.ModelProto) -> Recoded:
    """Re-encode every eligible int8 producer of a GEMM operand (see the module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    consumers = input_uses(g)
    outputs = {o.name for o in g.output}
    result = Recoded(out)
    fresh = iter(range(1 << 30))

    def const(value: int) -> str:
        name = f"u8gemm_zp_{next(fresh)}"
        g.initializer.append(numpy_helper.from_array(np.array(value, np.uint8), name))
        return name

    def int8_scalar(name: str) -> int | None:
        t = inits.get(name)
        if t is None or t.data_type != onnx.TensorProto.INT8:
            return None
        v = numpy_helper.to_array(t)
        return int(v.reshape(-1)[0]) if v.size == 1 else None

    found: dict[int, tuple[onnx.NodeProto, int, int, set[str], list]] = {}  # eligible producers, by position
    for at, node in enumerate(g.node):
        op = _op(node)
        zp_at = PRODUCERS.get(op or "")
        if zp_at is None or len(node.input) <= zp_at or len(node.output) != 1:
            continue
        if any(a.name == "output_dtype" for a in node.attribute):
            continue  # QuantizeLinear-21 typed by attribute: leave it
        zy = int8_scalar(node.input[zp_at])
        family = _family(node.output[0], consumers, outputs) if zy is not None else None
        if not family or not any(n.op_type in GEMMS for n, _ in family[1]):
            continue
        tensors, edges = family
        if any(_zero_point(n, i) and int8_scalar(_zero_point(n, i)) is None for n, i in edges):
            continue  # a consumer zero point we cannot move (not a scalar int8 constant)
        found[at] = (node, zp_at, zy, tensors, edges)
    copies = _pair_activation_operands(out, found, inits)
    for node, zp_at, zy, tensors, edges in found.values():
        node.input[zp_at] = const(zy + 128)
        for a in node.attribute:
            if a.name in ("qmin", "qmax"):
                a.i += 128
        for n, i in edges:
            _shift_zero_point(n, i, const, int8_scalar)
        result.tensors |= tensors
        result.producers.append(node.name or node.output[0])
    for gemm, side in copies:
        _uint8_copy(g, gemm, side, const, int8_scalar)
    result.convs = _uint8_convs(model, g, result.tensors, const, int8_scalar, inits)
    uint8 = result.tensors | {n.output[0] for n in g.node if n.name.endswith("_uint8")}
    result.copies = _uint8_matmul_copies(model, g, uint8, inits, const, int8_scalar)
    uint8 |= {n.output[0] for n in g.node if n.name.endswith("_uint8")}
    for n in g.node:
        if n.op_type == "MatMulInteger" and n.input[0] in uint8:
            _uint8_weights(g, n, inits)
    keep = [v for v in g.value_info if v.name not in result.tensors]
    del g.value_info[:]
    g.value_info.extend(keep)
    return result


__all__ = ["Recoded", "decode", "own_uint8_weights", "recode"]
