"""Elementwise functions with no shift-based kernel (Tanh, Sigmoid, Erf, HardSigmoid, HardSwish, SiLU's
parts, Softplus, Elu, Sin/Cos, Exp/Log/Sqrt, Pow by a constant, ...) as a table lookup.

An 8- or 16-bit input takes at most 65536 values, so ``Q(f(DQ(q)))`` is a table of the output type indexed by
``q``: ``Gather(table, int32(q) - qmin)``, integer-only and equal to the fake-quant model: the table is the
fake-quant subgraph itself (DequantizeLinear → the node → QuantizeLinear) run by onnxruntime in float32 on
every input value, so onnxruntime's own kernels round it (its Sigmoid, Tanh and Erf are not libm's). A wider
input (an int32 accumulator NNCF leaves unquantized before the pooler's Tanh) is first requantized to int16
over ``[-R, R]``, beyond which ``f`` is flat to within ``2**-22`` (``SATURATES``), and looked up in a
65536-entry table: the input step ``R / 32767`` moves ``f`` by at most ``max|f'| R / 65534``, below half an
8-bit output step (``max|f'| R <= 8`` for every entry). A function that does not saturate (HardSwish grows
linearly) has no finite table for such an input: it declines. With no QuantizeLinear after it the output is
int16 over ``f``'s range on the inputs (``max|f| / 32767``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper

from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.graph import dequantized_const
from ivit_onnx.io import quantize

from ..pattern import Op, Rule
from .lowerer import Lowerer, Outcome

#: op types tabulated (each as onnxruntime computes it in float32, with the node's attributes)
FUNCTIONS = (
    "Tanh", "Sigmoid", "Erf", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Elu", "Selu", "Celu",
    "ThresholdedRelu", "Mish",
    # the rest of ONNX's elementwise math of one tensor (Pow: a constant exponent), NaN on the input's range
    # declined: the position and frequency functions of audio and rotary encoders, Exp/Log/Sqrt left unfused
    "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Atanh",
    "Exp", "Log", "Sqrt", "Reciprocal", "Pow", "Round", "Floor", "Ceil", "Sign",
)  # fmt: skip


def _hard_sigmoid_flat(attrs: dict) -> float:
    """``max(0, min(1, alpha x + beta))`` is exactly 0 or 1 beyond ``max(|beta|, |1 - beta|) / |alpha|``."""
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return max(abs(beta), abs(1 - beta)) / abs(alpha) if alpha else 1.0


#: |x| beyond which each function is within 2**-22 of its limit, from the node's attributes
#: (tanh(8) = 1 - 2.3e-7, sigmoid(16) = 1 - 1e-7, erf(4) = 1 - 1.5e-8); the others do not saturate both ways
SATURATES = {
    "Tanh": lambda attrs: 8.0,
    "Sigmoid": lambda attrs: 16.0,
    "Erf": lambda attrs: 4.0,
    "HardSigmoid": _hard_sigmoid_flat,
}
#: the opset the table's one-node model uses: QuantizeLinear/DequantizeLinear of 16-bit types
_TABLE_OPSET = 21


def tabulable(lw: Lowerer, t: gs.Tensor) -> bool:
    """``t`` is lowered per tensor with an 8- or 16-bit type: one table covers every value it takes."""
    a = lw.get(t)[1]
    return a.per_tensor and a.dtype.itemsize <= 2


def fake_quant(
    lw: Lowerer, node: gs.Node, a: Affine, t: Affine | None, out_dtype=np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """``(q, y)`` over every value ``q`` of ``a``'s type: ``y = Q_t(f(DQ_a(q)))`` as onnxruntime computes the
    fake-quant subgraph (``f`` is ``node``, its other inputs constants), or ``f(DQ_a(q))`` in ``out_dtype``
    (float32; bool for a comparison) when ``t`` is None."""
    import onnxruntime as ort

    from ivit_onnx.runners import simulate_qdq

    lo, hi = dtype_range(a.dtype)
    q = np.arange(lo, hi + 1, dtype=np.int64)
    ttype = helper.np_dtype_to_tensor_dtype
    inits = [
        numpy_helper.from_array(np.asarray(a.scale, np.float32).reshape(()), "s_in"),
        numpy_helper.from_array(np.array(a.zero_point, a.dtype), "zp_in"),
    ]
    ins = ["x"]
    for i, c in enumerate(node.inputs[1:]):
        v = dequantized_const(c) if c.name else None
        if c.name and v is None:
            raise ValueError(f"input '{c.name}' is not a constant")
        ins.append(f"c{i}" if c.name else "")
        inits += [numpy_helper.from_array(np.asarray(v), f"c{i}")] if c.name else []
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s_in", "zp_in"], ["x"]),
        helper.make_node(node.op, ins, ["y"], **dict(node.attrs)),
    ]
    out, odt = "y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype))
    if t is not None:
        if not t.per_tensor:
            raise ValueError("a per-channel QuantizeLinear after a table lookup")
        inits += [
            numpy_helper.from_array(np.asarray(t.scale, np.float32).reshape(()), "s_out"),
            numpy_helper.from_array(np.array(t.zero_point, t.dtype), "zp_out"),
        ]
        nodes.append(helper.make_node("QuantizeLinear", ["y", "s_out", "zp_out"], ["yq"]))
        out, odt = "yq", ttype(t.dtype)
    outputs = [helper.make_tensor_value_info(out, odt, [q.size])]
    if out != "y":  # the float values too: a NaN has no quantized value to agree on
        outputs.append(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [q.size]))
    graph = helper.make_graph(nodes, "table", [helper.make_tensor_value_info("q", ttype(a.dtype), [q.size])],
                              outputs, inits)
    opset = max(_TABLE_OPSET, lw.ctx.opset)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    opts = ort.SessionOptions()
    simulate_qdq(opts)
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    res = sess.run(None, {"q": q.astype(a.dtype)})
    if res[-1].dtype.kind == "f" and np.any(np.isnan(res[-1])):
        bad = float(((q[np.isnan(res[-1])][0]) - a.zero_point) * a.scale)
        raise ValueError(f"{node.op} is NaN on the input's range (at {bad:g}): it has no integer value there")
    if t is None and res[0].dtype.kind == "f" and not np.all(np.isfinite(res[0])):
        raise ValueError(f"{node.op} is not finite on the input's range")
    return q, res[0]


def own_type(y: np.ndarray) -> Affine:
    """int16 over the range of the float values ``y`` (a table's output with no QuantizeLinear after it)."""
    m = float(np.max(np.abs(y), initial=0.0))
    return Affine(np.float64(m / 32767 if m > 0 else 1.0), 0, np.int16)


def table_of(
    lw: Lowerer, node: gs.Node, a: Affine, t: Affine | None
) -> tuple[np.ndarray, np.ndarray, Affine]:
    """``(q, table, type)``: ``node``'s fake-quant values on every input ``q``, in type ``t`` (the
    QuantizeLinear after it) or, without one, quantized in :func:`own_type`."""
    q, y = fake_quant(lw, node, a, t)
    if t is None:
        t = own_type(y)
        y = quantize(y, np.asarray(t.scale, np.float32), np.asarray(t.zero_point, t.dtype), 0)
    return q, y, t


def gather(lw: Lowerer, node: gs.Node, it: gs.Tensor, a: Affine, table: np.ndarray, t: Affine, label: str):
    """``table[q - qmin]`` as ``Gather``: ``node``'s output in type ``t``."""
    lo = dtype_range(a.dtype)[0]
    idx = lw.node("Cast", [it], np.int32, "index", attrs={"to": np.int32}, shape=it.shape)
    if lo:
        offset = lw.const(np.array(lo, np.int32), "qmin")
        idx = lw.node("Sub", [idx, offset], np.int32, "offset", shape=it.shape)
    shape = node.outputs[0].shape
    out = lw.node("Gather", [lw.const(table, "table"), idx], t.dtype, "lookup", {"axis": 0}, shape=shape)
    bound = int(np.max(np.abs(table.astype(np.int64) - t.zero_point)))
    lw.set(node.outputs[0], out, Affine(t.scale, t.zero_point, t.dtype, bound=bound))
    lw.ctx.count("lower_integer", f"{node.op} → {label}")


class TableLookup(Rule):
    """``f(x)`` → a lookup table (``Gather``); 8- and 16-bit inputs exactly, wider ones through an int16
    requantize over ``f``'s non-flat range where ``f`` saturates."""

    pattern = Op(FUNCTIONS)
    label = "table lookup (Gather)"

    def check(self, lw: Lowerer, m) -> str | None:
        x = m.root.inputs[0]
        why = lw.missing(x)
        other = next((c for c in m.root.inputs[1:] if c.name and dequantized_const(c) is None), None)
        if why is None and other is not None:
            return f"input '{other.name}' is not a constant (a table is a function of one tensor)"
        if why is None and not tabulable(lw, x) and m.root.op not in SATURATES:
            a = lw.get(x)[1]
            return (
                f"input '{x.name}' is {a.describe()}{'' if a.per_tensor else ' (per channel)'} and "
                f"{m.root.op} does not saturate: no finite table covers it "
                "(quantize its input to 8 or 16 bits)"
            )
        return why

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        it, a = lw.get(node.inputs[0])
        if not tabulable(lw, node.inputs[0]):  # a 65536-entry table over [-R, R], saturating beyond
            it, a = lw.per_tensor(it, a)
            r = SATURATES[node.op](node.attrs)
            t16 = Affine(np.float64(r / 32767), 0, np.int16)
            it, a = lw.requantize(it, a, t16, "table_in"), t16
        _, table, t = table_of(lw, node, a, lw.target(node.outputs[0]))
        gather(lw, node, it, a, table, t, self.label)
        return Outcome.HANDLED
