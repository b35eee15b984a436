"""The state of one ``lower_integer`` run and the emitting helpers every rule uses.

``itype`` maps an original float tensor to ``(integer tensor, Affine)``: the float value is
``(q - zero_point) * scale``. Rules read operands through :meth:`Lowerer.operand`, write results with
:meth:`Lowerer.set`, and emit integer nodes (standard ops or the private opset) with :meth:`node`.
"""

from __future__ import annotations

import enum

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.dyadic import DyadicError, dyadic_array, relative_error
from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import const_array, constant, dequantized_const, node_label
from ivit_onnx.opset import DOMAIN, OPS
from ivit_onnx.pipeline import Context


class Outcome(enum.Enum):
    """What a lowering rule's ``rewrite`` did (a rule that cannot lower a node declines in ``check``)."""

    HANDLED = "handled"  #: replaced by integer nodes; the original node is removed
    KEPT = "kept"  #: stays as is (integer already, or rewired to integer inputs)


#: ops whose multiply-accumulates the report counts (integer or left float)
MAC_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


def macs(node: gs.Node) -> int:
    """Multiply-accumulates of a MatMul/Gemm/Conv/ConvTranspose, integer or left float (K from the weight's
    shape; a ConvTranspose spreads each input element over ``C_out/group x kernel`` outputs)."""
    w, a = node.inputs[1].shape or [], node.inputs[0].shape or []
    if node.op == "ConvTranspose":
        dims = [d for d in [*a, *w[1:]] if isinstance(d, int) and d > 0]
        return int(np.prod(dims)) if len(dims) == len(a) + len(w) - 1 else 0
    if node.op == "Conv":
        k = int(np.prod(w[1:]))
    elif node.op == "Gemm":
        k = w[1 if node.attrs.get("transB", 0) else 0] if len(w) == 2 else 1
    else:
        k = next((d for d in (w[-2] if len(w) >= 2 else None, a[-1] if a else None) if isinstance(d, int)), 1)
    dims = [d if isinstance(d, int) and d > 0 else 1 for d in (node.outputs[0].shape or [])]
    return int(np.prod(dims)) * (k if isinstance(k, int) else 1)


def optional_input(node: gs.Node, i: int) -> gs.Tensor | None:
    """Input ``i`` of ``node``, None when it is absent or empty."""
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i].name else None


def broadcast_scale(scale: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-axis scale vector reshaped so it broadcasts against a rank-``rank`` tensor."""
    if scale.size == 1:
        return scale.reshape(())
    axis = axis % rank
    return scale.reshape([scale.size] + [1] * (rank - 1 - axis))


class Lowerer:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.g = ctx.graph
        self.opt = ctx.options
        self.itype: dict[str, tuple[gs.Tensor, Affine]] = {}
        self.alias: dict[str, tuple[gs.Tensor, Affine]] = {}
        self.floats: dict[str, gs.Tensor] = {}
        self.max_dyadic_error = 0.0
        self.node_hint = "n"
        self._names: dict[str, int] = {}

    # ---- naming -------------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        base = f"{self.node_hint}/{hint}"
        k = self._names.get(base, 0)
        self._names[base] = k + 1
        return base if k == 0 else f"{base}_{k}"

    # ---- typed values -------------------------------------------------------------------------------
    def get(self, t: gs.Tensor) -> tuple[gs.Tensor, Affine] | None:
        return self.itype.get(t.name)

    def set(self, t: gs.Tensor, it: gs.Tensor, a: Affine) -> None:
        self.itype[t.name] = (it, a)

    def missing(self, *ts: gs.Tensor, const_ok: bool = False) -> str | None:
        """The decline reason when one of ``ts`` has no integer type (nor is a float constant, with
        ``const_ok``), else None."""
        for t in ts:
            v = dequantized_const(t) if const_ok and self.get(t) is None else None
            if self.get(t) is None and (v is None or v.dtype.kind != "f"):
                return f"input '{t.name}' is not quantized" + (" nor a constant" if const_ok else "")
        return None

    def const_float(self, t: gs.Tensor) -> np.ndarray | None:
        """The real value of a constant: a float initializer, or a lowered DequantizeLinear of one."""
        got = self.get(t)
        if got is not None and isinstance(got[0], gs.Constant):
            it, a = got
            return ((np.asarray(it.values, np.float64) - a.zero_point) * a.scale).astype(np.float32)
        return dequantized_const(t)

    def operand(self, t: gs.Tensor, const_dtype=np.int16) -> tuple[gs.Tensor, Affine] | None:
        """An integer view of ``t``: its lowered value, or a float constant quantized symmetrically."""
        got = self.get(t)
        if got is not None:
            return got
        v = dequantized_const(t)
        if v is None or not np.issubdtype(v.dtype, np.floating):
            return None
        return self.quantize_const(v, const_dtype, t.name)

    def quantize_const(self, v: np.ndarray, dtype, hint: str) -> tuple[gs.Tensor, Affine]:
        """Symmetric per-tensor quantization of a float constant (int16 by default: near lossless)."""
        qmax = dtype_range(dtype)[1]
        m = float(np.max(np.abs(v))) if v.size else 0.0
        scale = m / qmax if m > 0 else 1.0
        q = np.clip(np.rint(v / scale), -qmax, qmax).astype(dtype)
        bound = int(np.max(np.abs(q), initial=0))
        return self.const(q, hint + "_q"), Affine(np.float64(scale), 0, dtype, bound=bound)

    def target(self, t: gs.Tensor) -> Affine | None:
        """The common type of ``t``'s QuantizeLinear consumers, when every consumer is one."""
        types = []
        for c in t.outputs:
            if c.op != "QuantizeLinear":
                return None
            types.append(self.q_type(c, t))
        if not types or any(not types[0].same_as(x) for x in types[1:]):
            return None
        return types[0]

    def q_type(self, q: gs.Node, data: gs.Tensor) -> Affine:
        """The type a QuantizeLinear writes or a DequantizeLinear reads (a scale per axis, one zero point)."""
        scale = const_array(q.inputs[1]).astype(np.float64)
        zp, dq = const_array(optional_input(q, 2)), q.op == "DequantizeLinear"
        dtype = zp.dtype if zp is not None else q.inputs[0].dtype if dq and q.inputs[0].dtype else np.uint8
        if zp is not None and zp.size > 1 and (not dq or np.any(zp != 0)):
            what = "non-zero zero points" if dq else "zero points on activations"
            raise ConversionError(f"{node_label(q)}: per-channel {what} are not supported")
        rank = len(data.shape) if data.shape is not None else 1
        scale = broadcast_scale(scale, q.attrs.get("axis", 1), rank)
        return Affine(scale, int(zp.reshape(-1)[0]) if zp is not None else 0, dtype)

    def tensor_map(self) -> dict:
        """Every integer tensor's type and the fake-quant tensor it replaces (``--scales``, metadata)."""
        keys = ("dtype", "zero_point", "scale", "bound", "replaces")
        return {
            it.name: dict(
                zip(keys, (a.dtype.name, a.zero_point, a.scale.tolist(), a.bound, name), strict=True)
            )
            for name, (it, a) in sorted(self.itype.items())
            if not isinstance(it, gs.Constant)
        }

    def count_macs(self, node: gs.Node) -> None:
        self.ctx.notes["integer_macs"] = self.ctx.notes.get("integer_macs", 0) + macs(node)

    # ---- emitting -----------------------------------------------------------------------------------
    def const(self, value, hint: str) -> gs.Constant:
        return gs.Constant(self.fresh(hint), np.ascontiguousarray(value))

    def node(self, op: str, inputs: list, dtype, hint: str, attrs=None, domain=None, n_out=1, shape=None):
        """Append a node; returns its output variable (or list of them when ``n_out > 1``)."""
        names = [f"{hint}_out" if n_out == 1 else f"{hint}_out{i}" for i in range(n_out)]
        outs = [gs.Variable(self.fresh(n), dtype=dtype, shape=shape) for n in names]
        node = gs.Node(op, name=self.fresh(hint), attrs=dict(attrs or {}), inputs=list(inputs), outputs=outs)
        if domain:
            node.domain = domain
        self.g.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def where(self, cond, a, b, dtype, hint: str, shape=None) -> gs.Variable:
        """``Where(cond, a, b)`` of integers of ``dtype``: onnxruntime's CPU provider has no 16-bit Where, so
        those run in int32 between two Casts (exact: every 16-bit value is an int32)."""
        dtype = np.dtype(dtype)
        if dtype.itemsize != 2:
            return self.node("Where", [cond, a, b], dtype, hint, shape=shape)
        wide = [self.node("Cast", [x], np.int32, f"{hint}_wide", attrs={"to": np.int32}, shape=x.shape)
                if isinstance(x, gs.Variable) else self.const(np.asarray(x.values, np.int32), f"{hint}_wide")
                for x in (a, b)]
        out = self.node("Where", [cond, *wide], np.int32, hint, shape=shape)
        return self.node("Cast", [out], dtype, f"{hint}_narrow", attrs={"to": dtype.type}, shape=shape)

    def private(self, op: str, inputs: list, out_dtype, hint: str, shape=None, **attrs) -> gs.Variable:
        """A node of the private opset, checked against its spec."""
        spec = OPS[op]
        in_types = [t.values.dtype if isinstance(t, gs.Constant) else t.dtype for t in inputs]
        spec.check([np.dtype(d) for d in in_types], attrs, where=self.node_hint)
        self.ctx.count("lower_integer", op)
        attrs = {k: int(v) for k, v in attrs.items()}
        return self.node(op, inputs, out_dtype, hint, attrs=attrs, domain=DOMAIN, shape=shape)

    def zp(self, value: int, dtype, hint: str) -> gs.Constant:
        return self.const(np.array(value, dtype=dtype), hint)

    def dyadic(self, m: np.ndarray, bits: int, what: str, allow_negative=False):
        """Dyadic pair(s) for ``m`` with the error tracked for the report; errors name the node."""
        m = np.asarray(m)
        try:
            b, c = dyadic_array(m, bits, what=f"{self.node_hint}: {what}", allow_negative=allow_negative)
        except DyadicError as e:
            raise ConversionError(str(e)) from None
        nz = m != 0
        if np.any(nz):
            self.max_dyadic_error = max(self.max_dyadic_error, relative_error(m[nz], b[nz], c[nz]))
        return b, c

    def rescale(self, it: gs.Tensor, a: Affine, b, c, t: Affine, hint: str) -> gs.Variable:
        """The one Requantize emitter: ``it`` of type ``a`` times ``b / 2**c`` into type ``t``'s range."""
        x_zp, y_zp = self.zp(a.zero_point, a.dtype, "x_zp"), self.zp(t.zero_point, t.dtype, "y_zp")
        inputs = [it, x_zp, self.const(b, "mult"), self.const(c, "shift"), y_zp]
        lo, hi, shape = *t.qrange, it.shape if isinstance(it, gs.Variable) else None
        return self.private("Requantize", inputs, t.dtype, hint, shape=shape, qmin=lo, qmax=hi)

    def requantize(self, it: gs.Tensor, a: Affine, t: Affine, hint: str = "requant") -> gs.Tensor:
        """Rescale ``it`` from type ``a`` to ``t`` (a no-op when the types agree)."""
        if a.same_as(t):
            return it
        return self.rescale(it, a, *qparams.requantize(a, t, self.dyadic), t, hint)

    def per_tensor(self, it: gs.Tensor, a: Affine) -> tuple[gs.Tensor, Affine]:
        """Per-channel (accumulator) types become per-tensor int32 at the finest channel scale."""
        if a.per_tensor:
            return it, a
        t = qparams.per_tensor(a)
        return self.requantize(it, a, t, "per_tensor"), t

    def symmetric(self, it: gs.Tensor, a: Affine) -> tuple[gs.Tensor, Affine]:
        """Remove a non-zero zero point (exactly: int16 holds ``q - zp`` of 8-bit types)."""
        if a.zero_point == 0:
            return it, a
        t = Affine(a.scale, 0, np.int16 if a.dtype.itemsize == 1 else np.int32, bound=a.bound)
        ones = np.ones(a.scale.shape, np.int64)
        return self.rescale(it, a, ones, ones * 0, t, "center"), t

    def materialize(self, t: gs.Tensor, out: gs.Tensor | None = None) -> gs.Tensor:
        """A float tensor for a lowered value (DequantizeLinear), for float islands and graph outputs, of the
        float type ``t`` had (a float16 island, as ModelOpt leaves its head, stays float16)."""
        if out is None and t.name in self.floats:
            return self.floats[t.name]
        it, a = self.get(t)
        fdt = np.dtype(t.dtype if t.dtype is not None and np.dtype(t.dtype).kind == "f" else np.float32)
        if a.dtype.itemsize == 2 and self.ctx.opset < 21:  # DequantizeLinear reads 16-bit types from 21 on
            it = self.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
            if a.zero_point:
                it = self.node("Sub", [it, self.zp(a.zero_point, np.int32, "zp")], np.int32, "center")
            a = Affine(a.scale, 0, np.int32, a.bound)
        out = out if out is not None else gs.Variable(self.fresh("dequant_out"), dtype=fdt)
        scale, axis = a.scale, None
        if not a.per_tensor:
            nz = [i for i, d in enumerate(scale.shape) if d != 1]
            axis = nz[0] - len(scale.shape)
            scale = scale.reshape(-1)
        attrs = {"axis": axis} if axis is not None else {}
        zp = np.full(scale.shape if axis is not None else (), a.zero_point, dtype=a.dtype)
        # DequantizeLinear writes its scale's type; other than float32 only from opset 19 (else a Cast after)
        sdt = fdt if self.ctx.opset >= 19 else np.dtype(np.float32)
        deq = out if sdt == fdt else gs.Variable(self.fresh("dequant_f32"), dtype=sdt)
        # scalars stay 0-d (``graph.constant``; ``const`` would make them 1-d): onnxruntime fuses an island's
        # DQ → op → Q into QLinear ops that take scalar scales and zero points only
        scale = scale.astype(sdt).reshape(zp.shape)
        inputs = [it, constant(self.fresh("scale"), scale), constant(self.fresh("zp"), zp)]
        self.g.nodes.append(
            gs.Node("DequantizeLinear", name=self.fresh("dequant"), attrs=attrs, inputs=inputs, outputs=[deq])
        )
        if deq is not out:
            to = onnx.helper.np_dtype_to_tensor_dtype(fdt)
            self.g.nodes.append(gs.Node("Cast", self.fresh("to_float"), {"to": to}, [deq], [out]))
        self.floats[t.name] = out
        return out
