"""normalize: validate QDQ scales, fold Constant nodes and constant QuantizeLinear, drop Identity/Dropout.

Guarantees every Q/DQ has a constant, finite, positive scale and a constant zero point of an 8- or
16-bit integer type, and that quantized weights are integer initializers (torch exports float weight →
Q → DQ; Brevitas' QCDQ adds a Clip of the integer weight, folded here). Toolkit forms without an
integer-only meaning here (4-bit/float8 types, blocked scales, MatMulNBits-style and QOperator nodes)
stop with one line naming the node and the form.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import const_array, constant, dequantized_const, node_label, replace_uses
from ivit_onnx.io import quantize
from ivit_onnx.pipeline import Context, Pass

from .qonnx_quant import is_qonnx, rewrite_quant

_QDQ = ("QuantizeLinear", "DequantizeLinear")
_INT_TYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))

#: ops that quantization toolkits emit which have no integer-only form here, with the reason
REFUSED = {
    "MatMulNBits": "block-quantized 2..8-bit weight matmul (MatMulNBits); export int8 QDQ weights instead",
    "MatMulBnb4": "4-bit bitsandbytes weight matmul (MatMulBnb4); export int8 QDQ weights instead",
    "GatherBlockQuantized": "block-quantized gather (GatherBlockQuantized); export int8 QDQ weights instead",
    "DynamicQuantizeLinear": "dynamic quantization (scale computed at run time); use static QDQ",
    "DynamicQuantizeMatMul": "dynamic quantization (scale computed at run time); use static QDQ",
    "MatMulIntegerToFloat": "dynamic quantization (scale computed at run time); use static QDQ",
    "QLinearMatMul": "QOperator format; export in QDQ format (QuantizeLinear/DequantizeLinear pairs)",
    "QLinearConv": "QOperator format; export in QDQ format (QuantizeLinear/DequantizeLinear pairs)",
    "QGemm": "QOperator format; export in QDQ format (QuantizeLinear/DequantizeLinear pairs)",
    "QAttention": "QOperator format; export in QDQ format (QuantizeLinear/DequantizeLinear pairs)",
    **{
        op: "random numbers drawn at run time and read as numbers have no integer value, and the fake-quant "
        "model differs run to run there (a shuffle by their order is fixed when the outputs ignore it): "
        "export with that tensor fixed (ViTMAE: noise=) or deploy the weights in a class without it (MAE "
        "weights load into ViTModel)"
        for op in ("RandomUniformLike", "RandomUniform", "RandomNormalLike", "RandomNormal", "Bernoulli",
                   "Multinomial")
    },
}


def _same_type_cast(node: gs.Node) -> bool:
    """A Cast to the type its input already has (Hugging Face's ``pixel_values.to(dtype)`` before the input
    quantize): the identity, removed like Identity so no float op is left in front of the input quantize."""
    if node.op != "Cast" or not node.inputs or node.inputs[0].dtype is None:
        return False
    to = onnx.helper.tensor_dtype_to_np_dtype(node.attrs.get("to", 0)) if node.attrs.get("to") else None
    return to is not None and np.dtype(node.inputs[0].dtype) == np.dtype(to)


def _scalar_params(node: gs.Node, scalars: dict[str, gs.Constant]) -> bool:
    """A one-element 1-D scale and zero point (NNCF writes ``[1]``) become scalars (``scalars``: those made,
    by name), the same per-tensor quantization: onnxruntime fuses an ``--allow-float`` island's DQ → op → Q
    into QLinear ops that need scalars ("Scale and Zero-point must be a scalar")."""
    changed = False
    for i in (1, 2):
        t = node.inputs[i] if len(node.inputs) > i else None
        v = const_array(t) if t is not None and t.name else None
        if v is not None and v.size == 1 and v.ndim > 0:
            if t.name not in scalars:  # one scalar per shared parameter
                scalars[t.name] = constant(f"{t.name}_scalar", v.reshape(()))
            node.inputs[i] = scalars[t.name]
            changed = True
    if changed:
        node.attrs.pop("axis", None)
    return changed


def _infinite_scale(node: gs.Node, where: str, name: str, scale: np.ndarray) -> str:
    """The refusal of a non-finite scale, with its cause and what to do: the quantizer calibrated a tensor
    holding inf or NaN (MPNet's relative-position buckets take log(0) = -inf), so the fake-quant model itself
    computes NaN there; the fix is to leave the op that makes that tensor unquantized."""
    src = node.inputs[0].inputs[0] if node.inputs and node.inputs[0].inputs else None
    op = src if src is not None and src.op != "QuantizeLinear" else None
    data = node.inputs[0].name if node.inputs else name
    culprit = f"{node_label(op)}, which makes tensor '{data}'" if op else f"tensor '{data}'"
    exclude = f"'{op.name}'" if op is not None and op.name else "that node"
    return (
        f"{where}: scale '{name}' is not finite ({scale.ravel()[:4]}): the quantizer calibrated it on values "
        f"that include inf or NaN (a -inf mask fill, log(0) in position buckets) from {culprit}, so the "
        f"fake-quant model computes NaN there; quantize again with {exclude} excluded (onnxruntime "
        "quantize_static: nodes_to_exclude; NNCF: ignored_scope)"
    )


def _type_form(dt: np.dtype | None, dequantize: bool = False) -> str | None:
    """Why a Q/DQ element type cannot be read (None when it can; DequantizeLinear also reads int32 biases)."""
    if dt is None or dt in _INT_TYPES or (dequantize and dt == np.dtype(np.int32)):
        return None
    if dt.name in ("int4", "uint4", "int2", "uint2"):
        return f"{dt.name[-1]}-bit quantizer ({dt.name}) is not supported: re-export with int8 (or int16)"
    if dt.kind in "fV" or dt.name.startswith("float"):
        return f"floating-point quantizer ({dt.name}) has no integer form: re-export with int8 (or int16)"
    return f"unsupported quantized type {dt.name}"


#: how an attention mask is computed from its integer graph input: layout ops (first input only), Q/DQ, and
#: logic/arithmetic whose other operands are constants, shapes or the mask
_MASK_LAYOUT = ("Cast", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten", "Slice", "Transpose",
                "Identity", "Gather", "GatherND", "QuantizeLinear", "DequantizeLinear")
_MASK_LOGIC = ("Not", "And", "Or", "Equal", "Where", "Sub", "Mul", "Add", "Div")
#: a mask's fill is at least this large (BERT's -10000, -1e9, finfo.min, -inf)
_FILL = 1e3
MASK_RECIPE = "docs/conversion.md#attention-masks-and-quantizers"


def _larger(a: float, b: float) -> float:
    return a if abs(a) >= abs(b) else b


#: (walk, id(tensor)) -> its result, for one ``normalize`` run: every QuantizeLinear walks up its input, and
#: without it the walks repeat over shared ancestors (quadratic in the layers)
_WALKS: dict[tuple[str, int], object] = {}


def _memo(walk):
    """Cache ``walk(t, depth)`` per tensor in :data:`_WALKS` (the first depth reached decides)."""

    def cached(t: gs.Tensor, depth: int = 0):
        key = (walk.__name__, id(t))
        if key not in _WALKS:
            _WALKS[key] = walk(t, depth)
        return _WALKS[key]

    return cached


@_memo
def _from_shapes(t: gs.Tensor, depth: int = 0) -> bool:
    """``t`` is computed from constants and ``Shape`` nodes only (index arithmetic of a symbolic shape)."""
    p = t.inputs[0] if t.inputs else None
    if p is None:
        return const_array(t) is not None
    return p.op == "Shape" or depth < 32 and all(_from_shapes(x, depth + 1) for x in p.inputs if x.name)


@_memo
def _mask_fill(t: gs.Tensor, depth: int = 0) -> float | None:
    """The fill value (the constant of largest magnitude) of an attention mask computed from an integer graph
    input (``Where(mask, 0, finfo.min)``, ``(1 - mask) * -10000``, through layout ops and Q/DQ), else None."""
    p = t.inputs[0] if t.inputs else None
    if p is None:
        integer = t.dtype is not None and np.dtype(t.dtype).kind in "iub"
        return 0.0 if integer and const_array(t) is None else None
    if depth > 32 or p.op not in _MASK_LAYOUT + _MASK_LOGIC:
        return None
    found, fill = False, 0.0
    for x in p.inputs[:1] if p.op in _MASK_LAYOUT else [x for x in p.inputs if x.name]:
        c = dequantized_const(x)  # onnxruntime quantizes the constants too
        if c is not None and c.dtype.kind == "f" and c.size:
            fill = _larger(fill, float(c.reshape(-1)[np.argmax(np.abs(c.reshape(-1)))]))
        elif c is None and not _from_shapes(x):
            sub = _mask_fill(x, depth + 1)
            if sub is None:
                return None
            found, fill = True, _larger(fill, sub)
    return fill if found else None


def _refuse_quantized_mask(node: gs.Node, scale: np.ndarray) -> None:
    """A QuantizeLinear of the attention scores plus the mask whose range covers the mask's fill value (the
    quantizer calibrated it on padded inputs: every unmasked score rounds to one level), or of the mask alone
    with a scale that is not finite (a fill of -inf or finfo.min)."""
    t = node.inputs[0]
    fill, what = _mask_fill(t), "the attention mask"
    if fill is not None:
        broken = not np.all(np.isfinite(scale))  # a mask quantized alone is harmless where its values fit
    elif t.inputs and t.inputs[0].op in ("Add", "Sub", "Where"):
        p = t.inputs[0]
        if p.op == "Where":  # DeBERTa-v2: Where(Not(mask), finfo.min, scores), the fill a Where operand
            consts = [c for c in map(dequantized_const, p.inputs[1:3]) if c is not None and c.size == 1]
            masked = _mask_fill(p.inputs[0]) is not None and consts
            fill = max((float(c.reshape(())) for c in consts), key=abs) if masked else None
            what = "the attention scores masked by a Where"
        else:
            fills = [f for f in (_mask_fill(x) for x in p.inputs) if f is not None]
            fill, what = (fills[0] if fills else None), "the attention scores plus the mask"
        # a fill dequantized from a constant can round past float32's range to -inf; the range still covers it
        reach = min(abs(fill), float(np.finfo(np.float32).max)) if fill is not None else None
        broken = fill is not None and float(np.max(scale)) * 255 >= reach / 2
    if fill is None or abs(fill) < _FILL or not broken:
        return
    raise ConversionError(
        f"{node_label(node)}: tensor '{t.name}' is {what} quantized with scale {float(np.max(scale)):.3g}, "
        f"a range that covers the mask's fill value {fill:.3g}: the quantizer calibrated the mask arithmetic "
        f"(every unmasked score rounds to one level); quantize with the mask's nodes excluded ({MASK_RECIPE})"
    )


class Normalize(Pass):
    name = "normalize"
    guarantees = ("constant_qdq_params", "no_constant_nodes")

    def run(self, ctx: Context) -> bool:
        _WALKS.clear()
        try:
            return self._run(ctx)
        finally:
            _WALKS.clear()  # ids of freed tensors are reused

    def _run(self, ctx: Context) -> bool:
        g = ctx.graph
        if ctx.opset < 13:
            raise ConversionError(f"opset {ctx.opset} is too old: ivit-onnx needs opset 13 or newer")
        refused = next((n for n in g.nodes if n.op in REFUSED), None)
        if refused is not None:  # a toolkit form with no integer meaning: said first, whatever else is there
            raise ConversionError(f"{node_label(refused)}: {REFUSED[refused.op]}")
        if not any(n.op in _QDQ or is_qonnx(n) for n in g.nodes):
            raise ConversionError("no QuantizeLinear/DequantizeLinear nodes: not a fake-quant (QDQ) model")
        changed = self._fold_constant_nodes(ctx)
        for node in [n for n in g.nodes if is_qonnx(n)]:
            rewrite_quant(g, node, ctx.opset)
            ctx.count(self.name, "QONNX Quant → QuantizeLinear/DequantizeLinear")
            changed = True
        if changed:
            g.cleanup().toposort()
        for node in list(g.nodes):
            if (node.op in ("Identity", "Dropout") or _same_type_cast(node)) and node.outputs:
                self._bypass(ctx, node)
                changed = True
        scalars: dict[str, gs.Constant] = {}
        for node in g.nodes:
            if node.op in _QDQ:
                changed |= self._explicit_zero_point(ctx, node)
                self._check_params(node)
                changed |= _scalar_params(node, scalars)
        for node in list(g.nodes):
            if node.op == "QuantizeLinear" and const_array(node.inputs[0]) is not None:
                self._fold_quantize(ctx, node)
                changed = True
        for node in list(g.nodes):  # after the folded QuantizeLinear: QONNX/QCDQ weights are Q → Clip
            if node.op == "Clip" and self._fold_clip(ctx, node):
                changed = True
        g.cleanup().toposort()
        return changed

    def _fold_constant_nodes(self, ctx: Context) -> bool:
        changed = False
        for node in ctx.graph.nodes:
            if node.op == "Constant" and "value" in node.attrs:
                out = node.outputs[0]
                if out not in ctx.graph.outputs:
                    self._replace(
                        ctx, node, constant(out.name + "_c", node.attrs["value"].values)
                    )
                    changed = True
        return changed

    @staticmethod
    def _explicit_zero_point(ctx: Context, node: gs.Node) -> bool:
        """Opset 21's ``output_dtype`` (QuantizeLinear, no zero point) becomes a zero point of its type."""
        out_dt = node.attrs.get("output_dtype", 0) if node.op == "QuantizeLinear" else 0
        if not out_dt or (len(node.inputs) > 2 and node.inputs[2].name):
            return False
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(out_dt))
        if _type_form(dt):
            raise ConversionError(f"{node_label(node)}: {_type_form(dt)}")
        zp = gs.Constant(f"{node.outputs[0].name}_zero_point", np.zeros((), dt))
        if len(node.inputs) > 2:
            node.inputs[2] = zp
        else:
            node.inputs.append(zp)
        del node.attrs["output_dtype"]
        ctx.count("normalize", "QuantizeLinear output_dtype made a zero point")
        return True

    def _fold_clip(self, ctx: Context, node: gs.Node) -> bool:
        """Clip of a constant (Brevitas' QCDQ narrows integer weights to [-127, 127] with one)."""
        x = const_array(node.inputs[0])
        bounds = [const_array(t) if t.name else None for t in node.inputs[1:3]]
        if x is None or any(t.name and b is None for t, b in zip(node.inputs[1:3], bounds, strict=False)):
            return False
        lo, hi = (bounds + [None, None])[:2]
        lo = node.attrs.get("min") if lo is None and "min" in node.attrs else lo
        hi = node.attrs.get("max") if hi is None and "max" in node.attrs else hi
        folded = x if lo is None and hi is None else np.clip(x, lo, hi).astype(x.dtype)
        self._replace(ctx, node, constant(node.outputs[0].name + "_c", folded), "Clip of constant folded")
        return True

    @staticmethod
    def _check_params(node: gs.Node) -> None:
        where = node_label(node)
        if len(node.inputs) < 2:
            raise ConversionError(f"{where}: missing scale input")
        block = node.attrs.get("block_size", 0)
        if block:
            raise ConversionError(
                f"{where}: blocked quantization (block_size={block}) is not supported: use per-channel scales"
            )
        for t in (node.inputs[0] if node.op == "DequantizeLinear" else None, *node.inputs[2:3]):
            dt = (
                t.values.dtype
                if isinstance(t, gs.Constant)
                else t.dtype
                if t is not None and t.name
                else None
            )
            form = _type_form(np.dtype(dt) if dt is not None else None, node.op == "DequantizeLinear")
            if form:
                raise ConversionError(f"{where}: {form}")
        scale = const_array(node.inputs[1])
        if scale is None:
            raise ConversionError(f"{where}: scale '{node.inputs[1].name}' is not a constant")
        name = node.inputs[1].name
        if node.op == "QuantizeLinear":
            _refuse_quantized_mask(node, scale)
        if not np.all(np.isfinite(scale)):
            raise ConversionError(_infinite_scale(node, where, name, scale))
        if np.any(scale <= 0):
            raise ConversionError(f"{where}: scale '{name}' must be positive, got {scale.ravel().min():g}")
        if len(node.inputs) > 2 and node.inputs[2].name and const_array(node.inputs[2]) is None:
            raise ConversionError(f"{where}: zero point '{node.inputs[2].name}' is not a constant")

    def _fold_quantize(self, ctx: Context, node: gs.Node) -> None:
        x = const_array(node.inputs[0])
        scale = const_array(node.inputs[1])
        zp = (
            const_array(node.inputs[2])
            if len(node.inputs) > 2 and node.inputs[2].name
            else np.zeros((), np.uint8)
        )
        q = quantize(x, scale, zp, node.attrs.get("axis", 1))
        self._replace(
            ctx, node, constant(node.outputs[0].name + "_q", q), "QuantizeLinear of constant folded"
        )

    def _bypass(self, ctx: Context, node: gs.Node) -> None:
        if node.outputs[0] not in ctx.graph.outputs:
            what = "Cast to the same type removed" if node.op == "Cast" else f"{node.op} removed"
            self._replace(ctx, node, node.inputs[0], what)

    def _replace(self, ctx: Context, node: gs.Node, new: gs.Tensor, what: str = "Constant folded") -> None:
        """Every reader of ``node``'s output reads ``new``; the node is left for cleanup; counted."""
        replace_uses(node.outputs[0], new)
        node.outputs.clear()
        ctx.count(self.name, what)
