"""Write ``model.c`` and ``model.h`` from a :class:`.plan.Plan`: one static function per node (plain nested
loops with constant bounds, constants folded in), the weights as ``const`` arrays, one static arena, and the
entry ``int <prefix>_run(const <in> *input, <out> *output)``.

Kernels: the private ops of ``ai.ivit`` (:data:`ROW_OPS`, :data:`ELEMENTWISE`), the integer GEMMs
(MatMulInteger, ConvInteger), integer elementwise arithmetic, and data movement: views (Reshape, Squeeze,
...: no code), Concat, and every other layout op of one dynamic input through its index map, computed here
by running the op on ``arange`` (a strided loop where the map is affine, else a ``const`` index table).
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.errors import ConversionError

from .plan import ALIASES, Plan
from .runtime import RUNTIME

CTYPES = {
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "uint16": "uint16_t",
    "int32": "int32_t",
    "uint32": "uint32_t",
    "int64": "int64_t",
    "uint64": "uint64_t",
    "bool": "uint8_t",
}
#: layout ops with one dynamic data input, emitted through their index map
MOVES = {
    "Transpose",
    "Slice",
    "Gather",
    "Expand",
    "Tile",
    "Split",
    "DepthToSpace",
    "SpaceToDepth",
    "ReverseSequence",
    "GatherElements",
    "Pad",
}
#: standard integer elementwise ops: C expression of operands a, b in int64 (the result wraps to the type)
ARITH = {
    "Add": "ivit_add({a}, {b})",
    "Sub": "ivit_sub({a}, {b})",
    "Mul": "ivit_mul({a}, {b})",
    "Max": "ivit_max({a}, {b})",
    "Min": "ivit_min({a}, {b})",
}
UNARY = {
    "Neg": "ivit_sub(0, {a})",
    "Abs": "ivit_abs({a})",
    "Relu": "ivit_max({a}, 0)",
    "Cast": "{a}",
    "Identity": "{a}",
}


#: standard ops of three operands or of booleans (a bool is 0/1 in a uint8_t)
OTHER = {
    "Where": "({0} != 0 ? {1} : {2})",
    "Equal": "ivit_eq({0}, {1})",
    "Less": "ivit_lt({0}, {1})",
    "Greater": "ivit_lt({1}, {0})",
    "LessOrEqual": "!ivit_lt({1}, {0})",
    "GreaterOrEqual": "!ivit_lt({0}, {1})",
    "Not": "({0} == 0)",
    "And": "({0} != 0 && {1} != 0)",
    "Or": "({0} != 0 || {1} != 0)",
    "Xor": "(({0} != 0) != ({1} != 0))",
}

#: reductions: (initial value, step of the accumulator {0} and the element {1})
REDUCE = {
    "ReduceSum": ("0", "ivit_add({0}, {1})"),
    "ReduceMax": ("(-INT64_C(9223372036854775807) - 1)", "ivit_max({0}, {1})"),
    "ReduceMin": ("INT64_C(9223372036854775807)", "ivit_min({0}, {1})"),
}


def ctype(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in CTYPES:
        raise ConversionError(f"the C engine has no type for {name}")
    return CTYPES[name]


def lit(v) -> str:
    """An int64 literal."""
    v = int(v)
    if v == -(1 << 63):
        return "(-INT64_C(9223372036854775807) - 1)"
    return f"INT64_C({v})"


def _ident(text: str) -> str:
    return re.sub(r"\W", "_", text)


class Emitter:
    """The C text of one plan."""

    def __init__(self, plan: Plan, prefix: str):
        self.plan, self.prefix = plan, prefix
        self.globals: list[str] = []  # const arrays
        self.const_names: dict[str, str] = {}
        self.weight_bytes = 0
        self.calls: list[str] = []

    # ------------------------------------------------------------ operands

    def const_array(self, tensor: str, values: np.ndarray | None = None, dtype=None) -> str:
        """The ``const`` array of a constant tensor (emitted once)."""
        key = tensor if values is None else f"{tensor}#{len(self.globals)}"
        if key in self.const_names:
            return self.const_names[key]
        arr = np.asarray(self.plan.values[tensor] if values is None else values)
        if dtype is not None:
            arr = arr.astype(dtype)
        name = f"k{len(self.globals)}_{_ident(tensor)[-24:]}"
        flat = arr.reshape(-1)
        if flat.dtype == np.bool_:
            flat = flat.astype(np.uint8)
        items = [lit(v) if flat.dtype == np.int64 else str(int(v)) for v in flat.tolist()]
        lines = [", ".join(items[i : i + 16]) for i in range(0, len(items), 16)] or ["0"]
        body = ",\n  ".join(lines)
        self.globals.append(
            f"static const {ctype(flat.dtype)} {name}[{max(flat.size, 1)}] = {{\n  {body}\n}};"
        )
        self.weight_bytes += flat.nbytes
        self.const_names[key] = name
        return name

    def is_const(self, name: str) -> bool:
        return name in self.plan.constant

    def shape(self, name: str) -> tuple:
        return self.plan.shape(name)

    # ------------------------------------------------------------ loops

    @staticmethod
    def bstrides(shape: tuple, out: tuple) -> list[int]:
        """``shape``'s element strides along ``out``'s axes, numpy-broadcast (0 where it broadcasts)."""
        shape = (1,) * (len(out) - len(shape)) + tuple(shape)
        strides, acc = [0] * len(out), 1
        for k in range(len(out) - 1, -1, -1):
            strides[k] = acc if shape[k] != 1 else 0
            acc *= shape[k]
        return strides

    @staticmethod
    def index(strides: list[int], var: str = "i") -> str:
        terms = [f"{var}{k} * {s}" if s != 1 else f"{var}{k}" for k, s in enumerate(strides) if s]
        return " + ".join(terms) or "0"

    @staticmethod
    def nest(shape: tuple, body: list[str], var: str = "i") -> list[str]:
        """Nested loops over ``shape`` (counters ``i0, i1, ...``; a dimension of 1 has none: its strides are
        0 in every index)."""
        used = [f"{var}{k}" for k, d in enumerate(shape) if d != 1]
        lines = [f"int32_t {', '.join(used)};"] if used else []
        depth = ""
        opens = []
        for k, d in enumerate(shape):
            if d == 1:
                continue
            lines.append(f"{depth}for ({var}{k} = 0; {var}{k} < {d}; {var}{k}++) {{")
            opens.append(depth)
            depth += "  "
        lines += [depth + b for b in body]
        lines += [f"{d}}}" for d in reversed(opens)]
        return lines

    def operand(self, name: str, out: tuple, params: dict, var: str = "i") -> str:
        """The C expression (int64) of tensor ``name``'s element at the loop position over ``out``: a literal
        for a one-element constant, an array element otherwise (dynamic ones become parameters)."""
        arr = self.plan.values[name]
        if self.is_const(name) and arr.size == 1:
            return lit(arr.reshape(-1)[0])
        base = self.const_array(name) if self.is_const(name) else params.setdefault(name, f"in{len(params)}")
        return f"(ivit_i64){base}[{self.index(self.bstrides(arr.shape, out), var)}]"

    # ------------------------------------------------------------ functions

    def function(
        self, node: onnx.NodeProto, params: dict[str, str], body: list[str], outputs: list[str] | None = None
    ) -> None:
        """One node's code: a block of the entry with its operands' addresses first. Blocks, not functions:
        GCC 12.2 at -O2 was seen to miscompile this code once identical-code folding merged two identical node
        functions (correct at -O1 and with -fno-ipa-icf); one function also suits C-to-hardware flows."""
        outs = outputs if outputs is not None else [node.output[0]]
        local = [f"const {ctype(self.plan.dtype(t))} *{p} = {self.ptr(t)[0]};" for t, p in params.items()]
        local += [f"{ctype(self.plan.dtype(o))} *out{j} = {self.ptr(o)[0]};" for j, o in enumerate(outs)]
        where = node.name or node.output[0]
        shapes = ", ".join(f"{o}{list(self.shape(o))}" for o in outs)
        self.calls += [
            _comment(f"  /* {node.op_type} '{where}' -> {shapes}"),
            "  {",
            *("    " + b for b in local + body),
            "  }",
        ]

    def ptr(self, tensor: str) -> tuple[str, bool]:
        """The storage of a dynamic tensor as a pointer of its type, and whether it is an entry input."""
        root = self.plan.root[tensor]
        ct = ctype(self.plan.dtype(tensor))
        for j, b in enumerate(self.plan.inputs):
            if b.tensor == root:
                return (
                    f"(const {ct} *)input{j}" if len(self.plan.inputs) > 1 else f"(const {ct} *)input"
                ), True
        return f"({ct} *)(ivit_arena.bytes + {self.plan.offset[root]})", False

    # ------------------------------------------------------------ ops

    def emit(self, node: onnx.NodeProto) -> None:
        op = node.op_type
        if node.domain == "ai.ivit":
            if op in ELEMENTWISE:
                return self.elementwise(node, ELEMENTWISE[op](node, _attrs(node)))
            if op in ROW_OPS:
                return self.row(node, *ROW_OPS[op](node, _attrs(node)))
        elif node.domain in ("", "ai.onnx"):
            if op in ALIASES and not self.is_const(node.input[0]):
                return None
            if op in ARITH:
                return self.elementwise(node, ARITH[op].format(a="{0}", b="{1}"))
            if op in UNARY:
                return self.elementwise(node, UNARY[op].format(a="{0}"))
            if op in OTHER:
                return self.elementwise(node, OTHER[op])
            if op in REDUCE:
                return self.reduce(node)
            if op == "Div":
                return self.elementwise(node, "ivit_tdiv({0}, {1})")
            if op == "Mod":
                q = "ivit_tdiv({0}, {1})" if _attrs(node).get("fmod", 0) else "ivit_fdiv({0}, {1})"
                return self.elementwise(node, f"ivit_sub({{0}}, ivit_mul({q}, {{1}}))")
            if op == "CumSum":
                return self.cumsum(node)
            if op == "Clip":
                has = [len(node.input) > k and bool(node.input[k]) for k in (1, 2)]
                expr = "{0}"
                expr = f"ivit_max({expr}, {{1}})" if has[0] else expr
                expr = f"ivit_min({expr}, {{2}})" if has[1] else expr
                return self.elementwise(node, expr)
            if op == "MatMulInteger":
                return self.matmul(node)
            if op == "ConvInteger":
                return self.conv(node)
            if op == "Concat":
                return self.concat(node)
            if op == "Gather" and not self.is_const(node.input[1]):
                return self.gather(node)
            if op in MOVES or op in ALIASES:
                return self.move(node)
        where = node.name or node.output[0]
        raise ConversionError(
            f"node '{where}' ({node.domain + '.' if node.domain else ''}{op}): the C "
            "engine has no kernel for it"
        )

    def elementwise(self, node: onnx.NodeProto, expr: str) -> None:
        """``y = expr`` over the output, the operands ``{0}, {1}, ...`` (node inputs) broadcast."""
        y = node.output[0]
        out = self.shape(y)
        params: dict[str, str] = {}
        ops = [self.operand(name, out, params) if name else "0" for name in node.input]
        value = expr.format(*ops)
        body = self.nest(
            out, [f"out0[{self.index(self.bstrides(out, out))}] = ({ctype(self.plan.dtype(y))})({value});"]
        )
        self.function(node, params, body)

    def reduce(self, node: onnx.NodeProto) -> None:
        """ReduceSum / ReduceMax / ReduceMin over constant axes (int64 accumulation, wrapped to the type)."""
        x, y = node.input[0], node.output[0]
        shape = self.shape(x)
        at = _attrs(node)
        if len(node.input) > 1 and node.input[1]:
            axes = [int(a) for a in np.asarray(self.plan.values[node.input[1]]).reshape(-1)]
        else:
            axes = list(at.get("axes", []))
        if not axes and not at.get("noop_with_empty_axes", 0):
            axes = list(range(len(shape)))
        red = {a % len(shape) for a in axes}
        st = self.bstrides(shape, shape)
        outer = tuple(1 if d in red else n for d, n in enumerate(shape))
        inner = tuple(n if d in red else 1 for d, n in enumerate(shape))
        src = " + ".join(
            filter(
                None,
                [
                    self.index([0 if d in red else s for d, s in enumerate(st)], "i"),
                    self.index([s if d in red else 0 for d, s in enumerate(st)], "r"),
                ],
            )
        )
        init, step = REDUCE[node.op_type]
        body = [
            f"ivit_i64 acc = {init};",
            *self.nest(inner, [f"acc = {step.format('acc', f'(ivit_i64)in0[{src}]')};"], "r"),
            f"out0[o++] = ({ctype(self.plan.dtype(y))})acc;",
        ]
        body = ["int32_t o = 0;", *self.nest(outer, ["{", *("  " + b for b in body), "}"])]
        self.function(node, {x: "in0"}, body)

    def row(self, node: onnx.NodeProto, passes: list[str], result: str, per: tuple[str, ...] = ()) -> None:
        """A kernel over the last axis: ``passes`` (C statements with ``X(j)`` the row's element j as int64,
        ``P(k)`` node input k at channel j, ``C`` the row length) then, for each j, the statements ``per`` and
        ``out[j] = result``."""
        x, y = node.input[0], node.output[0]
        shape = self.shape(x)
        rows, c = int(np.prod(shape[:-1])), shape[-1]
        params: dict[str, str] = {node.input[0]: "in0"}

        def param(name: str) -> str:
            arr = self.plan.values[name]
            strides = self.bstrides(arr.shape, shape)
            if any(strides[:-1]):
                raise ConversionError(
                    f"node '{node.name or y}' ({node.op_type}): parameter '{name}' varies "
                    "across rows; the C engine takes scalars and per-channel vectors"
                )
            if self.is_const(name) and arr.size == 1:
                return lit(arr.reshape(-1)[0])
            base = (
                self.const_array(name) if self.is_const(name) else params.setdefault(name, f"in{len(params)}")
            )
            return f"(ivit_i64){base}[{'j' if strides[-1] else '0'}]"

        def fill(text: str) -> str:
            text = re.sub(r"\bC\b", str(c), text.replace("X(j)", "(ivit_i64)x[j]"))
            return re.sub(r"P\((\w+)\)", lambda m: param(node.input[int(m.group(1))]), text)

        body = [
            "int32_t r, j;",
            f"for (r = 0; r < {rows}; r++) {{",
            f"  const {ctype(self.plan.dtype(x))} *x = in0 + r * {c};",
            f"  {ctype(self.plan.dtype(y))} *y = out0 + r * {c};",
        ]
        body += ["  " + fill(s) for s in passes]
        store = f"y[j] = ({ctype(self.plan.dtype(y))})({fill(result)});"
        if per:
            body += [f"  for (j = 0; j < {c}; j++) {{", *("    " + fill(t) for t in per), f"    {store}"]
            body += ["  }"]
            body += ["}"]
        else:
            body += [f"  for (j = 0; j < {c}; j++) {store}", "}"]
        self.function(node, params, body)

    def matmul(self, node: onnx.NodeProto) -> None:
        """MatMulInteger: int32 ``sum_k (a - za)(b - zb)`` over numpy-broadcast batches (wraps as int32)."""
        a, b, y = node.input[0], node.input[1], node.output[0]
        sa, sb, out = self.shape(a), self.shape(b), self.shape(y)
        if len(sa) < 2 or len(sb) < 2:
            raise ConversionError(
                f"node '{node.name or y}' (MatMulInteger): 1-D operands are not supported by the C engine"
            )
        m, k, n = sa[-2], sa[-1], sb[-1]
        batch = out[:-2]
        params: dict[str, str] = {}
        ab = self.operand_base(a, params)
        bb = self.operand_base(b, params)
        sta = [s * m * k for s in self.bstrides(sa[:-2], batch)] if batch else []
        stb = [s * k * n for s in self.bstrides(sb[:-2], batch)] if batch else []
        za = self.zero_point(node, 2, "m", m, params)
        zb = self.zero_point(node, 3, "n", n, params)
        aoff = " + ".join(filter(None, [self.index(sta, "b") if any(sta) else "", f"m * {k}"]))
        boff = self.index(stb, "b") if any(stb) else "0"
        inner = [
            "uint32_t acc = 0;",
            f"for (k = 0; k < {k}; k++) acc += (uint32_t)(((int32_t){ab}[{aoff} + k] - {za}) * "
            f"((int32_t){bb}[{boff} + k * {n} + n] - {zb}));",
            "out0[o++] = (int32_t)acc;",
        ]
        body = ["int32_t m, n, k, o = 0;"]
        mn = [
            f"for (m = 0; m < {m}; m++) {{",
            f"  for (n = 0; n < {n}; n++) {{",
            *("    " + s for s in inner),
            "  }",
            "}",
        ]
        body += self.nest(batch, mn, "b") if batch else mn
        self.function(node, params, body)

    def operand_base(self, name: str, params: dict) -> str:
        return self.const_array(name) if self.is_const(name) else params.setdefault(name, f"in{len(params)}")

    def zero_point(self, node, idx: int, var: str, size: int, params: dict) -> str:
        """A GEMM zero point: 0, a literal, or a per-row/per-column vector indexed by ``var``."""
        if len(node.input) <= idx or not node.input[idx]:
            return "0"
        name = node.input[idx]
        arr = self.plan.values[name]
        if self.is_const(name) and arr.size == 1:
            return str(int(arr.reshape(-1)[0]))
        if arr.size != size:
            raise ConversionError(
                f"node '{node.name or node.output[0]}' ({node.op_type}): zero point '{name}' "
                "of an unsupported shape"
            )
        return f"(int32_t){self.operand_base(name, params)}[{var}]"

    def conv(self, node: onnx.NodeProto) -> None:
        """ConvInteger, 2-D, NCHW, batch 1: int32 sums of ``(x - zx)(w - zw)``; padding contributes 0."""
        x, w, y = node.input[0], node.input[1], node.output[0]
        sx, sw, sy = self.shape(x), self.shape(w), self.shape(y)
        at = _attrs(node)
        if len(sx) != 4 or at.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise ConversionError(
                f"node '{node.name or y}' (ConvInteger): the C engine takes 2-D convolutions "
                "with explicit pads"
            )
        g = int(at.get("group", 1))
        st = list(at.get("strides", [1, 1]))
        dl = list(at.get("dilations", [1, 1]))
        pads = list(at.get("pads", [0, 0, 0, 0]))
        _, cin, h, wd = sx
        cout, cg, kh, kw = sw
        _, _, oh, ow = sy
        params: dict[str, str] = {}
        xb, wb = self.operand_base(x, params), self.operand_base(w, params)
        zx = self.zero_point(node, 2, "0", 1, params)
        zw = self.zero_point(node, 3, "co", cout, params)
        per = cout // g
        body = [
            "int32_t co, oy, ox, ci, ky, kx, o = 0;",
            f"for (co = 0; co < {cout}; co++) {{",
            f"  for (oy = 0; oy < {oh}; oy++) {{",
            f"    for (ox = 0; ox < {ow}; ox++) {{",
            "      uint32_t acc = 0;",
            f"      for (ci = 0; ci < {cg}; ci++) {{",
            f"        for (ky = 0; ky < {kh}; ky++) {{",
            f"          int32_t iy = oy * {st[0]} - {pads[0]} + ky * {dl[0]};",
            f"          if (iy < 0 || iy >= {h}) continue;",
            f"          for (kx = 0; kx < {kw}; kx++) {{",
            f"            int32_t ix = ox * {st[1]} - {pads[1]} + kx * {dl[1]};",
            f"            if (ix < 0 || ix >= {wd}) continue;",
            f"            acc += (uint32_t)(((int32_t){xb}[((co / {per}) * {cg} + ci) * {h * wd} + iy * {wd}"
            " + ix]"
            f" - {zx}) * ((int32_t){wb}[((co * {cg} + ci) * {kh} + ky) * {kw} + kx] - {zw}));",
            "          }",
            "        }",
            "      }",
            "      out0[o++] = (int32_t)acc;",
            "    }",
            "  }",
            "}",
        ]
        del cin
        self.function(node, params, body)

    def concat(self, node: onnx.NodeProto) -> None:
        """Concat: each input copied into its slab of the output."""
        y = node.output[0]
        out = self.shape(y)
        axis = int(_attrs(node).get("axis", 0)) % len(out)
        ostr = self.bstrides(out, out)
        params: dict[str, str] = {}
        body, start = [], 0
        for j, name in enumerate(node.input):
            s = self.shape(name)
            if not np.prod(s):
                continue
            base = self.operand_base(name, params)
            dst = self.index([st if d != 1 else 0 for st, d in zip(ostr, s, strict=True)], f"c{j}_")
            body += [
                "{",
                *(
                    "  " + ln
                    for ln in self.nest(
                        s,
                        [
                            f"out0[{start * ostr[axis]} + {dst}] = "
                            f"{base}[{self.index(self.bstrides(s, s), f'c{j}_')}];"
                        ],
                        f"c{j}_",
                    )
                ),
                "}",
            ]
            start += s[axis]
        self.function(node, params, body)

    def cumsum(self, node: onnx.NodeProto) -> None:
        """CumSum along a constant axis (``exclusive``, ``reverse``), accumulated in int64 and wrapped."""
        x = node.input[0]
        shape = self.shape(x)
        at = _attrs(node)
        axis = int(np.asarray(self.plan.values[node.input[1]]).reshape(-1)[0]) % len(shape)
        outer, n, inner = int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1 :]))
        t = ctype(self.plan.dtype(node.output[0]))
        pos = f"{n - 1} - j" if at.get("reverse", 0) else "j"
        at_j = f"(a * {n} + ({pos})) * {inner} + k"
        step = (
            [f"out0[{at_j}] = ({t})acc;", f"acc = ivit_add(acc, (ivit_i64)in0[{at_j}]);"]
            if at.get("exclusive", 0)
            else [f"acc = ivit_add(acc, (ivit_i64)in0[{at_j}]);", f"out0[{at_j}] = ({t})acc;"]
        )
        body = [
            "int32_t a, j, k;",
            f"for (a = 0; a < {outer}; a++) {{",
            f"  for (k = 0; k < {inner}; k++) {{",
            "    ivit_i64 acc = 0;",
            f"    for (j = 0; j < {n}; j++) {{",
            *("      " + st for st in step),
            "    }",
            "  }",
            "}",
        ]
        self.function(node, {x: "in0"}, body)

    def gather(self, node: onnx.NodeProto) -> None:
        """Gather with data-dependent indices (a token embedding): one block copy per index; a negative index
        counts from the end, and an index out of range is clamped (onnxruntime refuses it; here it may not
        read outside the table)."""
        data, ind = node.input[0], node.input[1]
        shape = self.shape(data)
        axis = int(_attrs(node).get("axis", 0)) % len(shape)
        outer, n, inner = int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1 :]))
        count = int(np.prod(self.shape(ind)))
        params: dict[str, str] = {}
        base = self.operand_base(data, params)
        idx = self.operand_base(ind, params)
        body = [
            "int32_t a, p, k;",
            f"for (a = 0; a < {outer}; a++) {{",
            f"  for (p = 0; p < {count}; p++) {{",
            f"    ivit_i64 ix = (ivit_i64){idx}[p];",
            f"    if (ix < 0) ix += {n};",
            f"    ix = ivit_clip(ix, 0, {n - 1});",
            f"    for (k = 0; k < {inner}; k++)",
            f"      out0[(a * {count} + p) * {inner} + k] = {base}[(a * {n} + (int32_t)ix) * {inner} + k];",
            "  }",
            "}",
        ]
        self.function(node, params, body)

    def move(self, node: onnx.NodeProto) -> None:
        """A layout op of one dynamic data input: its index map from a run on ``arange``; a strided loop
        where the map is affine, else a ``const`` index table."""
        data = node.input[0]
        dyn = [i for i in node.input if i and not self.is_const(i)]
        if dyn != [data]:
            raise ConversionError(
                f"node '{node.name or node.output[0]}' ({node.op_type}): the C engine moves "
                "one dynamic data input (its other inputs must be constant)"
            )
        maps = _index_maps(node, self.plan)
        for j, (o, idx) in enumerate(maps.items()):
            params = {data: "in0"}
            shape = idx.shape
            strides = _affine(idx)
            if strides is not None:
                base, st = strides
                src = " + ".join(filter(None, [str(base) if base else "", self.index(st)])) or "0"
                body = ["int32_t o = 0;", *self.nest(shape, [f"out0[o++] = in0[{src}];"])]
            else:
                table = self.const_array(o, idx.astype(np.int32 if idx.max() >= 65536 else np.uint16))
                body = ["int32_t o;", f"for (o = 0; o < {idx.size}; o++) out0[o] = in0[{table}[o]];"]
            sub = onnx.NodeProto()
            sub.CopyFrom(node)
            self.function(sub, params, body, outputs=[o])
            del j


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _index_maps(node: onnx.NodeProto, plan: Plan) -> dict[str, np.ndarray]:
    """Each output's source element index into the data input, from the op run on ``arange``."""
    from onnx.reference import ReferenceEvaluator

    data = node.input[0]
    size = int(np.prod(plan.shape(data)))
    feeds = {data: np.arange(size, dtype=np.int64).reshape(plan.shape(data))}
    inits = [numpy_helper.from_array(np.asarray(plan.values[i]), i) for i in node.input[1:] if i]
    outs = [o for o in node.output if o]
    opset = [o for o in plan.model.opset_import if o.domain in ("", "ai.onnx")]
    graph = helper.make_graph(
        [node],
        "move",
        [helper.make_tensor_value_info(data, onnx.TensorProto.INT64, None)],
        [helper.make_tensor_value_info(o, onnx.TensorProto.INT64, None) for o in outs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=opset, ir_version=plan.model.ir_version)
    got = ReferenceEvaluator(model).run(None, feeds)
    return {o: np.asarray(v) for o, v in zip(outs, got, strict=True)}


def _affine(idx: np.ndarray) -> tuple[int, list[int]] | None:
    """``(base, strides)`` when ``idx[i] == base + sum(i_k * strides_k)``, else None."""
    if idx.size == 0:
        return 0, [0] * idx.ndim
    base = int(idx.reshape(-1)[0])
    strides = []
    for k, d in enumerate(idx.shape):
        at = [0] * idx.ndim
        if d > 1:
            at[k] = 1
            strides.append(int(idx[tuple(at)]) - base)
        else:
            strides.append(0)
    grid = np.indices(idx.shape).reshape(idx.ndim, -1) if idx.ndim else np.zeros((0, 1), np.int64)
    want = base + np.tensordot(np.asarray(strides, np.int64), grid, axes=1) if idx.ndim else np.array([base])
    return (base, strides) if np.array_equal(want, idx.reshape(-1)) else None


# ---------------------------------------------------------------- the private ops

REQUANT = "ivit_clip(ivit_add(ivit_round_shift({t}, {c}), {zy}), {qmin}, {qmax})"


def _requantize(node, at) -> str:
    t = "ivit_mul(ivit_sub({0}, {1}), {2})"
    return REQUANT.format(t=t, c="{3}", zy="{4}", qmin=lit(at["qmin"]), qmax=lit(at["qmax"]))


def _iadd(node, at) -> str:
    t = "ivit_add(ivit_mul(ivit_sub({0}, {2}), {4}), ivit_mul(ivit_sub({1}, {3}), {5}))"
    return REQUANT.format(t=t, c="{6}", zy="{7}", qmin=lit(at["qmin"]), qmax=lit(at["qmax"]))


def _shiftgelu(node, at) -> str:
    x0, n, bits = lit(at["x0"]), lit(at["n"]), lit(at["bits"])
    m = "ivit_max({0}, 0)"
    e1 = f"ivit_shift_exp(ivit_sub({{0}}, {m}), {x0}, {n})"
    e2 = f"ivit_shift_exp(ivit_sub(0, {m}), {x0}, {n})"
    sg = f"ivit_int_div({e1}, ivit_add({e1}, {e2}), {bits})"
    t = f"ivit_mul(ivit_mul({{0}}, {sg}), {{1}})"
    return REQUANT.format(t=t, c="{2}", zy="{3}", qmin=lit(at["qmin"]), qmax=lit(at["qmax"]))


def _ibertgelu(node, at) -> str:
    clip, coeff, k = lit(at["clip"]), lit(at["coeff"]), lit(at["k"])
    t = f"ivit_max(ivit_sub({clip}, ivit_abs({{0}})), 0)"
    e = f"ivit_round_shift(ivit_sub({coeff}, ivit_mul({t}, {t})), {k})"
    d = f"ivit_round_shift({coeff}, {k})"
    g = f"(ivit_neg({{0}}) ? ivit_sub({d}, {e}) : ivit_add({d}, {e}))"
    return REQUANT.format(
        t=f"ivit_mul(ivit_mul({{0}}, {g}), {{1}})",
        c="{2}",
        zy="{3}",
        qmin=lit(at["qmin"]),
        qmax=lit(at["qmax"]),
    )


ELEMENTWISE = {"Requantize": _requantize, "IAdd": _iadd, "ShiftGELU": _shiftgelu, "IBertGELU": _ibertgelu}


def _shiftmax(node, at):
    x0, n, bits = lit(at["x0"]), lit(at["n"]), lit(at["bits"])
    e = f"ivit_shift_exp(ivit_sub(X(j), mx), {x0}, {n})"
    passes = [
        "ivit_i64 mx = (ivit_i64)x[0], s = 0;",
        "for (j = 1; j < C; j++) mx = ivit_max(mx, X(j));",
        f"for (j = 0; j < C; j++) s = ivit_add(s, {e});",
    ]
    return passes, f"ivit_add(ivit_int_div({e}, s, {bits}), P(1))"


def _poly_exp(at, k: int) -> str:
    from ivit_onnx.opset.poly_exp import norm_shift

    x0, qb, qc, n = (int(at[a]) for a in ("x0", "qb", "qc", "n"))
    shift = norm_shift(qb, qc, n) if k else 0
    a = f"ivit_min(ivit_sub(0, ivit_sub(X(j), mx)), {lit(n * x0)})"
    q = f"ivit_fdiv({a}, {lit(x0)})"
    t = f"ivit_sub({lit(qb)}, ivit_sub({a}, ivit_mul({q}, {lit(x0)})))"
    e = f"ivit_mul(ivit_add(ivit_mul({t}, {t}), {lit(qc)}), ivit_pow2(ivit_sub({lit(n)}, {q})))"
    return f"ivit_asr({e}, {shift})"


def _ibert_softmax(node, at):
    e = _poly_exp(at, 1)
    passes = [
        "ivit_i64 mx = (ivit_i64)x[0], s = 0;",
        "for (j = 1; j < C; j++) mx = ivit_max(mx, X(j));",
        f"for (j = 0; j < C; j++) s = ivit_add(s, {e});",
    ]
    return passes, f"ivit_add(ivit_int_div({e}, s, {lit(at['bits'])}), P(1))"


def _log_int_softmax(node, at):
    from ivit_onnx.opset.log_int_softmax import divisors, level_values, levels

    k = levels(int(at["bits"]), int(at["log_bits"]))
    e = _poly_exp(at, 0)
    div = ", ".join(lit(d) for d in divisors(k))
    lv = ", ".join(lit(v) for v in level_values(int(at["bits"]), k).tolist())
    passes = [
        "ivit_i64 mx = (ivit_i64)x[0], s = 0;",
        f"const ivit_i64 div[{k}] = {{{div}}};",
        f"const ivit_i64 lv[{k + 1}] = {{{lv}}};",
        f"ivit_i64 th[{k}];",
        "int32_t t;",
        "for (j = 1; j < C; j++) mx = ivit_max(mx, X(j));",
        f"for (j = 0; j < C; j++) s = ivit_add(s, {e});",
        f"for (t = 0; t < {k}; t++) th[t] = ivit_fdiv(ivit_add(s, s), div[t]);",
    ]
    per = [f"ivit_i64 e = {e}, q = 0;", f"for (t = 0; t < {k}; t++) q += e <= th[t];"]
    return passes, "ivit_add(lv[q], P(1))", per


def _centred_passes(shift_in: int, c: int) -> list[str]:
    """``d(j) = x*2**shift_in - floor(sum(x)*2**shift_in / C)`` (ILayerNorm, L1LayerNorm)."""
    return [
        "ivit_i64 sx = 0, v = 0, mean, f;",
        "for (j = 0; j < C; j++) sx = ivit_add(sx, X(j));",
        f"mean = ivit_fdiv(ivit_mul(sx, {lit(1 << shift_in)}), {c});",
    ]


def _ilayernorm(node, at, l1: bool = False):
    d = f"ivit_sub(ivit_mul(X(j), {lit(1 << int(at['shift_in']))}), mean)"
    passes = _centred_passes(int(at["shift_in"]), "C")
    if l1:
        passes += [
            f"for (j = 0; j < C; j++) v = ivit_add(v, ivit_abs({d}));",
            f"f = ivit_fdiv({lit(1 << 61)}, ivit_max(v, 1));",
        ]
    else:
        passes += [
            f"for (j = 0; j < C; j++) v = ivit_add(v, ivit_mul({d}, {d}));",
            f"f = ivit_fdiv({lit(1 << 61)}, ivit_isqrt(ivit_max(v, 1)));",
        ]
    u = f"ivit_asr(ivit_mul({d}, f), {61 - int(at['p'])})"
    t = f"ivit_add(ivit_mul({u}, P(1)), P(3))"
    return passes, REQUANT.format(t=t, c="P(2)", zy="P(4)", qmin=lit(at["qmin"]), qmax=lit(at["qmax"]))


def _il2norm(node, at):
    d = f"ivit_mul(ivit_sub(X(j), P(1)), {lit(1 << int(at['shift_in']))})"
    passes = [
        "ivit_i64 v = 0, f;",
        f"for (j = 0; j < C; j++) v = ivit_add(v, ivit_mul({d}, {d}));",
        f"f = ivit_fdiv({lit(1 << 61)}, ivit_max(ivit_isqrt(ivit_max(v, 1)), {lit(at['eps'])}));",
    ]
    u = f"ivit_asr(ivit_mul({d}, f), {61 - int(at['p'])})"
    t = f"ivit_mul({u}, P(2))"
    return passes, REQUANT.format(t=t, c="P(3)", zy="P(4)", qmin=lit(at["qmin"]), qmax=lit(at["qmax"]))


ROW_OPS = {
    "Shiftmax": _shiftmax,
    "IBertSoftmax": _ibert_softmax,
    "LogIntSoftmax": _log_int_softmax,
    "ILayerNorm": _ilayernorm,
    "L1LayerNorm": lambda node, at: _ilayernorm(node, at, l1=True),
    "IL2Norm": _il2norm,
}


# ---------------------------------------------------------------- the files


def write(plan: Plan, prefix: str) -> tuple[str, str, dict]:
    """``(model.c, model.h, info)``: the C text and ``{"arena_bytes", "weight_bytes", ...}``."""
    em = Emitter(plan, prefix)
    for node in plan.nodes:
        em.emit(node)
    guard = f"{prefix.upper()}_H"
    meta = {
        "prefix": prefix,
        "inputs": [_boundary(b) for b in plan.inputs],
        "outputs": [_boundary(b) for b in plan.outputs],
        "arena_bytes": plan.arena_bytes,
        "weight_bytes": em.weight_bytes,
    }
    ins = [
        f"const {ctype(b.dtype)} *input{j if len(plan.inputs) > 1 else ''}" for j, b in enumerate(plan.inputs)
    ]
    outs = [
        f"{ctype(b.dtype)} *output{j if len(plan.outputs) > 1 else ''}" for j, b in enumerate(plan.outputs)
    ]
    signature = f"int {prefix}_run({', '.join(ins + outs)})"
    h = [
        f"/* {prefix}: integer-only C99 inference written by ivit-onnx (the C engine); one sample a call */",
        "/* ivit-onnx: " + json.dumps(meta).replace("*/", "*\\/") + " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "#include <stdint.h>",
        "",
    ]
    for kind, bs in (("INPUT", plan.inputs), ("OUTPUT", plan.outputs)):
        for j, b in enumerate(bs):
            tag = f"{prefix.upper()}_{kind}{j if len(bs) > 1 else ''}"
            what = f"{kind.lower()} '{b.graph_name}' (tensor '{b.tensor}'): {ctype(b.dtype)}{list(b.shape)}"
            if b.scale is not None:
                what += f", scale {_floats(b.scale)}, zero point {_ints(b.zero_point)}"
            h += [
                _comment(f"/* {what}"),
                f"#define {tag}_SIZE {int(np.prod(b.shape))}",
            ]
            if b.scale is not None and np.asarray(b.scale).size == 1:
                h += [
                    f"#define {tag}_ZERO_POINT {int(np.asarray(b.zero_point).reshape(-1)[0])}",
                    f"#ifdef {prefix.upper()}_FLOAT_BOUNDARY",
                    f"#define {tag}_SCALE {float(np.asarray(b.scale).reshape(-1)[0])!r}f",
                    *_float_helper(prefix, kind, j if len(bs) > 1 else "", tag, ctype(b.dtype), b.dtype),
                    "#endif",
                ]
    h += [
        f"#define {prefix.upper()}_ARENA_BYTES {plan.arena_bytes}",
        f"#define {prefix.upper()}_WEIGHT_BYTES {em.weight_bytes}",
        "",
        "/* runs one sample; returns 0 */",
        f"{signature};",
        "",
        f"#endif /* {guard} */",
        "",
    ]
    arena = max(plan.arena_bytes, 8)
    c = [
        f"/* {prefix}.c: integer-only C99 inference written by ivit-onnx (the C engine): fixed-width integer",
        " * types only, no float, no libm, no malloc; weights as const arrays, activations in one static",
        f" * arena of {plan.arena_bytes} bytes planned from the tensors' lifetimes. */",
        f'#include "{prefix}.h"',
        "",
        RUNTIME.strip(),
        "",
        f"static union {{ int64_t align; uint8_t bytes[{arena}]; }} ivit_arena;",
        "",
        *em.globals,
        "",
        f"{signature} {{",
    ]
    c += em.calls
    for j, b in enumerate(plan.outputs):
        name = f"output{j if len(plan.outputs) > 1 else ''}"
        c += [
            "  {",
            f"    const {ctype(b.dtype)} *src = {em.ptr(b.tensor)[0]};",
            "    int32_t k;",
            f"    for (k = 0; k < {int(np.prod(b.shape))}; k++) {name}[k] = src[k];",
            "  }",
        ]
    c += ["  return 0;", "}", ""]
    return "\n".join(c), "\n".join(h), meta


def _float_helper(prefix: str, kind: str, j, tag: str, ct: str, dtype) -> list[str]:
    """The optional float boundary (behind ``<PREFIX>_FLOAT_BOUNDARY``): ONNX QuantizeLinear of one input
    value (float32 division, round half to even, saturate) or DequantizeLinear of one output value."""
    info = np.iinfo(dtype)
    if kind == "INPUT":
        return [
            f"static inline {ct} {prefix}_quantize_input{j}(float x) {{",
            f"  float r = x / {tag}_SCALE, f, d;",
            "  int32_t q;",
            "  r = r > 1073741824.0f ? 1073741824.0f : (r < -1073741824.0f ? -1073741824.0f : r);",
            "  f = (float)(int32_t)r;",
            "  if (f > r) f -= 1.0f;",
            "  d = r - f;",
            "  q = (int32_t)f + (d > 0.5f || (d == 0.5f && ((int32_t)f & 1)));",
            f"  q += {tag}_ZERO_POINT;",
            f"  return ({ct})(q < {info.min} ? {info.min} : (q > {info.max} ? {info.max} : q));",
            "}",
        ]
    return [
        f"static inline float {prefix}_dequantize_output{j}({ct} y) {{",
        f"  return (float)((int32_t)y - {tag}_ZERO_POINT) * {tag}_SCALE;",
        "}",
    ]


def _comment(text: str) -> str:
    """``text`` (which starts a comment) closed, with any ``*/`` inside a tensor or node name broken up."""
    head, _, rest = text.partition("/*")
    return f"{head}/*{rest.replace('*/', '* /')} */"


def _floats(v) -> str:
    v = np.asarray(v).reshape(-1)
    return repr(float(v[0])) if v.size == 1 else f"{v.size} per-channel values"


def _ints(v) -> str:
    v = np.asarray(v).reshape(-1)
    return str(int(v[0])) if v.size == 1 else f"{v.size} values"


def _boundary(b) -> dict:
    return {
        "name": b.graph_name,
        "tensor": b.tensor,
        "shape": list(b.shape),
        "dtype": np.dtype(b.dtype).name,
        "scale": None if b.scale is None else np.asarray(b.scale, np.float32).reshape(-1).tolist(),
        "zero_point": None if b.zero_point is None else np.asarray(b.zero_point).reshape(-1).tolist(),
        "zero_point_dtype": None if b.zero_point is None else np.asarray(b.zero_point).dtype.name,
    }
