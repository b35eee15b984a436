"""fold_constants: fix the input shapes the user gave, then fold what constants and static shapes compute.

Exporters keep shapes symbolic and compute shape-derived values at run time: Hugging Face Swin's window mask
and ``view`` targets, the dynamo exporter's attention bias ``Where(Expand(True, Shape(x)...), 0, -max)``. The
integer rules need them as numbers (a LayerNorm's channel count, a mask's values), so this pass:

1. gives the graph inputs the shapes of ``Options.input_shapes`` (a dimension may stay symbolic: a batch);
2. runs ONNX shape inference with data propagation (so ``Reshape`` targets computed from ``Shape`` resolve);
3. simplifies what a symbolic batch keeps from folding: a constant ``Expand``-ed to a shape that its consumer
   broadcasts to anyway is read unexpanded; adding an all-zero constant is no change;
4. folds every subgraph of constants and static shapes with onnx-graphsurgeon's ``fold_constants``
   (onnxruntime evaluates it), Q/DQ nodes excluded so quantized values stay integers for ``normalize``;
5. folds what is constant *through* Q/DQ (Swinv2's position-bias MLP over a constant table, shape arithmetic
   a quantizer put Q/DQ on), evaluated as the fake-quant model does (Q/DQ simulated in float); a weight's
   integers → DequantizeLinear, through layout ops only, stay as they are, and a final Q→DQ pair of a folded
   value stays so that ``normalize`` makes it a quantized constant with its scale;

and repeats 2-5 until nothing changes.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from ivit_onnx.errors import ConversionError, one_line
from ivit_onnx.graph import const_array, is_qdq_pair, producer, replace_uses
from ivit_onnx.io import skeleton
from ivit_onnx.models.runtime import ort_session
from ivit_onnx.pipeline import Context, Pass

from .normalize import REFUSED
from .rules.layout import PASS_THROUGH

_QDQ = ("QuantizeLinear", "DequantizeLinear")
#: elementwise ops with numpy broadcasting whose constant operands can be read unexpanded
_BROADCASTING = ("Add", "Sub", "Mul", "Div", "Where", "Equal", "Less", "Greater", "And", "Or", "Not", "Cast",
                 *_QDQ)
#: folded constants larger than this stay computed at run time (bytes)
SIZE_LIMIT = 16 << 20
#: ops that only move or select a constant's elements: a quantized weight read through them stays integers
_LAYOUT = (*PASS_THROUGH, "Cast", "Concat", "QuantizeLinear", "DequantizeLinear", "Constant")
#: ops whose value is not a function of their inputs
_NONDETERMINISTIC = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
                     "Multinomial")
#: GEMM inputs that must stay a quantized weight (a folded float weight would leave the GEMM float)
_WEIGHT_SLOTS = {"MatMul": 1, "Gemm": 1, "Conv": 1, "ConvTranspose": 1}
ROUNDS = 6


def _known(shape) -> bool:
    """Every dimension is a number or a named symbol (a name stands for one value wherever it appears)."""
    return shape is not None and all(isinstance(d, int) and d >= 0 or isinstance(d, str) and d for d in shape)


def broadcast(*shapes) -> list | None:
    """numpy's broadcast of shapes whose dimensions are numbers or symbols (None if it cannot be decided)."""
    if not all(_known(s) for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[[1] * (rank - len(s)) + list(s) for s in shapes], strict=True):
        rest = {d for d in dims if d != 1}
        if len(rest) > 1:
            return None
        out.append(rest.pop() if rest else 1)
    return out


class FoldConstants(Pass):
    name = "fold_constants"
    guarantees = ("static_shapes_folded",)

    def run(self, ctx: Context) -> bool:
        changed = self._specialize(ctx)
        for _ in range(ROUNDS):
            why = _infer(ctx)
            if why:  # a graph ONNX cannot re-infer (e.g. int4 initializers): the passes after it say why
                ctx.notes.setdefault("declined", {})[self.name] = f"{self.name}: {why}"
                break
            step = self._simplify(ctx) + self._fold(ctx)
            changed |= bool(step)
            if not step:
                break
        return changed

    # ---- 1. input shapes ---------------------------------------------------------------------------------
    def _specialize(self, ctx: Context) -> bool:
        given = dict(ctx.options.input_shapes or {})
        if not given:
            return False
        inputs = {t.name: t for t in ctx.graph.inputs}
        unknown = sorted(set(given) - set(inputs))
        if unknown:
            raise ConversionError(
                f"--shape {unknown[0]}: the model has no input of that name (inputs: {', '.join(inputs)})"
            )
        for name, dims in given.items():
            t = inputs[name]
            old = list(t.shape) if t.shape is not None else None
            if old is not None and (len(old) != len(dims) or any(map(_differ, old, dims))):
                shown = ",".join(str(d) if isinstance(d, int) else "?" for d in old)
                raise ConversionError(f"--shape {name}: {dims} does not fit the input's shape [{shown}]")
            # a dimension left symbolic keeps what the model has for it (a name, or a number)
            old = old or [None] * len(dims)
            t.shape = [d if isinstance(d, int) or o is None else o for d, o in zip(dims, old, strict=True)]
            ctx.count(self.name, "input shape fixed")
        return True

    # ---- 3. simplifications --------------------------------------------------------------------------------
    def _simplify(self, ctx: Context) -> int:
        n = 0
        for node in list(ctx.graph.nodes):
            if not node.outputs:
                continue
            if node.op in _BROADCASTING and self._unexpand(ctx, node):
                n += 1
            elif node.op in ("Add", "Sub") and self._add_zero(ctx, node):
                n += 1
        if n:
            ctx.graph.cleanup().toposort()
        return n

    def _unexpand(self, ctx: Context, node: gs.Node) -> bool:
        """A constant ``Expand``-ed into ``node``: read it unexpanded where the broadcast of the operands
        stays the same; when every other operand is constant, compute ``node`` on the constant and expand
        after it. Shapes are compared symbolically (a batch dimension is the same name on both sides)."""
        for i, t in enumerate(node.inputs):
            ex = producer(t)
            if ex is None or ex.op != "Expand" or const_array(ex.inputs[0]) is None:
                continue
            c, target = ex.inputs[0], ex.inputs[1]
            others = [x.shape for j, x in enumerate(node.inputs) if j != i]
            wide = broadcast(c.shape, shape_value(target) or [None])  # the Expand's output shape
            if wide is None or broadcast(wide, *others) is None:
                continue
            if node.op not in _QDQ and broadcast(c.shape, *others) == broadcast(wide, *others):
                node.inputs[i] = c
                ctx.count(self.name, "Expand of a constant read unexpanded")
                return True
            consts = [x for j, x in enumerate(node.inputs) if j != i and const_array(x) is not None]
            # a unary op (Cast) and a per-tensor QuantizeLinear/DequantizeLinear move past the Expand too:
            # BEiT's dynamo export casts an expanded constant mask and quantizes it
            per_tensor = node.op in _QDQ and all(const_array(x).size == 1 for x in consts)
            if len(consts) == len(others) and (not others or per_tensor or broadcast(wide, *others) == wide):
                # f(Expand(C, s), k) == Expand(f(C, k), s) when every k broadcasts into s
                inner = gs.Variable(f"{node.outputs[0].name}/unexpanded", dtype=node.outputs[0].dtype)
                args = [c if j == i else x for j, x in enumerate(node.inputs)]
                inner_node = gs.Node(node.op, f"{node.name}/unexpanded", dict(node.attrs), args, [inner])
                ctx.graph.nodes.append(inner_node)
                out_t = node.outputs[0]
                node.outputs.clear()
                ctx.graph.nodes.append(gs.Node("Expand", f"{node.name}/expand", {}, [inner, target], [out_t]))
                ctx.count(self.name, "Expand moved after its constant operands")
                return True
        return False

    def _add_zero(self, ctx: Context, node: gs.Node) -> bool:
        """``x + 0`` / ``x - 0`` with an all-zero constant that does not widen ``x`` → ``x``."""
        for x, k in (node.inputs, node.inputs[::-1]) if node.op == "Add" else (node.inputs,):
            v = const_array(k)
            if v is not None and v.dtype.kind == "f" and not np.any(v) and (
                broadcast(x.shape, v.shape) == list(x.shape or [None])
            ):
                self._bypass(ctx, node, x, f"{node.op} of zeros removed")
                return True
        return False

    def _bypass(self, ctx: Context, node: gs.Node, keep: gs.Tensor, what: str) -> None:
        out = node.outputs[0]
        if out in ctx.graph.outputs:
            ctx.graph.nodes.append(gs.Node("Identity", f"{node.name}/kept", {}, [keep], [out]))
            node.outputs.clear()
        else:
            replace_uses(out, keep)
        ctx.count(self.name, what)

    # ---- 4. folding ----------------------------------------------------------------------------------------
    def _fold(self, ctx: Context) -> int:
        g = ctx.graph
        before = len(g.nodes)
        split = _shape_ranges_as_slices(g)
        guards = _guard_casts(g)
        level = gs.logger.G_LOGGER.severity
        gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR
        ort.set_default_logger_severity(3)  # the sessions it evaluates with warn about their own rewrites
        fold = dict(fold_shapes=True, size_threshold=SIZE_LIMIT, should_exclude_node=_kept)
        try:  # the graph is in topological order (as imported, or sorted after each change)
            try:  # every folded value in one onnxruntime session: linear in the graph's size
                g.fold_constants(partitioning=None, error_ok=False, **fold)
            except Exception:  # noqa: BLE001 - a subgraph onnxruntime cannot evaluate: fold the others apart
                # (onnx-graphsurgeon then copies the constant subgraph once per output node: quadratic, so
                # only where the one session failed)
                g.fold_constants(partitioning="basic", **fold)
            g.cleanup()  # folding removes nodes only: the order stays topological
        finally:
            gs.logger.G_LOGGER.severity = level
            ort.set_default_logger_severity(2)
        _rejoin(g, split)
        _unguard(g, guards)
        for t in g.tensors().values():  # folded values: own arrays (0-d ones as arrays, not scalars)
            if isinstance(t, gs.Constant) and not isinstance(t.values, np.ndarray):
                t.values = np.asarray(t.values.load())
        folded = before - len(g.nodes)
        if folded > 0:
            ctx.count(self.name, "nodes folded", folded)
        return max(folded, 0) + _fold_through_qdq(ctx)


def shape_value(t: gs.Tensor) -> list | None:
    """The value of a 1-d shape tensor as dimensions (numbers, or the symbols of the tensors it measures)
    when it is computed from constants and ``Shape`` through Slice/Gather/Concat/Unsqueeze/Squeeze/Cast;
    else None. (ONNX data propagation loses the symbols.)"""
    v = const_array(t)
    if v is not None:
        return [int(d) for d in v.reshape(-1)] if v.dtype.kind in "iu" and v.ndim <= 1 else None
    p = producer(t)
    if p is None:
        return None
    if p.op == "Shape":
        shape = p.inputs[0].shape
        return None if shape is None else list(shape)[p.attrs.get("start", 0) : p.attrs.get("end", None)]
    src = shape_value(p.inputs[0]) if p.inputs else None
    if src is None and p.op != "Concat":
        return None
    if p.op in ("Unsqueeze", "Squeeze", "Cast", "Identity"):
        return src
    if p.op == "Concat":
        parts = [shape_value(x) for x in p.inputs]
        return None if any(x is None for x in parts) else [d for x in parts for d in x]
    args = [const_array(x) for x in p.inputs[1:]]
    if any(a is None for a in args):
        return None
    if p.op == "Gather" and p.attrs.get("axis", 0) == 0:
        return [src[int(k)] for k in args[0].reshape(-1)]
    if p.op == "Slice" and (len(args) < 3 or int(args[2].reshape(-1)[0]) in (0, -1)):
        step = int(args[3].reshape(-1)[0]) if len(args) > 3 else 1
        return src[int(args[0].reshape(-1)[0]) : int(args[1].reshape(-1)[0]) : step]
    return None


def _shape_ranges_as_slices(g: gs.Graph) -> dict[str, dict]:
    """``Shape(x, start, end)`` (opset 15) → ``Slice(Shape(x), start, end)``: onnx-graphsurgeon 0.6 folds a
    Shape node to the whole shape whatever its ``start``/``end``, and folds a Slice of a Shape correctly.
    Returns the Slices made, by name, with the attributes to restore where they do not fold."""
    made = {}
    for node in [n for n in g.nodes if n.op == "Shape" and ("start" in n.attrs or "end" in n.attrs)]:
        attrs = dict(node.attrs)
        start, end = node.attrs.pop("start", 0), node.attrs.pop("end", None)
        whole = gs.Variable(f"{node.outputs[0].name}/whole", dtype=np.int64)
        ends = np.array([np.iinfo(np.int64).max if end is None else end], np.int64)
        bounds = {"start": np.array([start], np.int64), "end": ends, "axis": np.array([0], np.int64)}
        args = [whole, *(gs.Constant(f"{node.name}/{k}", v) for k, v in bounds.items())]
        out = node.outputs[0]
        node.outputs = [whole]
        g.nodes.append(gs.Node("Slice", f"{node.name}/range", {}, args, [out]))
        made[f"{node.name}/range"] = attrs
    if made:
        g.toposort()
    return made


#: the ops onnx-graphsurgeon 0.6's "cast elision" rewrites (``fold_constants(fold_shapes=True)``)
_ELIDED = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Greater", "Less", "Concat")


def _guard_casts(g: gs.Graph) -> set[str]:
    """An Identity after every int → float Cast read by an op of :data:`_ELIDED`. onnx-graphsurgeon 0.6's cast
    elision (for TensorRT's shape tensors) rewrites ``Cast(int→float) → Mul(0.75) → Cast(→int)`` as an integer
    Mul by ``int(0.75) = 0``, anywhere in the graph: a wrong value (a token count times 0.75 became 0). It
    only fires where the op's input comes straight from a Cast. Returns the Identities' names."""
    made = set()
    for node in [n for n in g.nodes if n.op == "Cast" and n.attrs.get("to") == onnx.TensorProto.FLOAT]:
        out = node.outputs[0]
        if not any(r.op in _ELIDED for r in out.outputs):
            continue
        kept = gs.Variable(f"{out.name}/cast_kept", dtype=out.dtype, shape=out.shape)
        for reader in [r for r in out.outputs if r.op in _ELIDED]:
            for i, x in enumerate(reader.inputs):
                if x is out:
                    reader.inputs[i] = kept
        name = f"{node.name or out.name}/keep_cast"
        g.nodes.append(gs.Node("Identity", name, {}, [out], [kept]))
        made.add(name)
    if made:
        g.toposort()
    return made


def _unguard(g: gs.Graph, made: set[str]) -> None:
    """Remove :func:`_guard_casts`' Identities that did not fold away."""
    for node in [n for n in g.nodes if n.name in made and n.op == "Identity"]:
        replace_uses(node.outputs[0], node.inputs[0])
        node.outputs.clear()
    if made:
        g.cleanup()


def _rejoin(g: gs.Graph, made: dict[str, dict]) -> None:
    """Undo :func:`_shape_ranges_as_slices` where the Shape did not fold (a symbolic dimension)."""
    joined = False
    for node in [n for n in g.nodes if n.name in made and n.op == "Slice"]:
        shape = producer(node.inputs[0])
        if shape is None or shape.op != "Shape" or len(node.inputs[0].outputs) != 1:
            continue
        shape.attrs = made[node.name]
        shape.outputs = [node.outputs[0]]
        node.outputs.clear()
        joined = True
    if joined:
        g.cleanup()  # each Shape already came before its Slice's readers


def _evaluable(node: gs.Node) -> bool:
    """A standard op whose output is a function of its inputs' values (no subgraph, no randomness)."""
    return (
        node.domain in (None, "", "ai.onnx")
        and node.op not in REFUSED
        and node.op not in _NONDETERMINISTIC
        and not any(isinstance(v, gs.Graph) for v in node.attrs.values())
    )


def _constant_tensors(g: gs.Graph) -> set[str]:
    """Names of the tensors computed from constants only (Q/DQ included), in the graph's topological order."""
    const = {name for name, t in g.tensors().items() if isinstance(t, gs.Constant)}
    for node in g.nodes:
        if _evaluable(node) and all(not x.name or x.name in const for x in node.inputs):
            const.update(t.name for t in node.outputs if t.name)
    return const


def _cone(t: gs.Tensor, const: set[str]) -> list[gs.Node]:
    """The nodes that compute constant tensor ``t``."""
    seen, stack, out = set(), [t], []
    while stack:
        p = producer(stack.pop())
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        out.append(p)
        stack.extend(x for x in p.inputs if x.name in const)
    return out


def _fold_target(t: gs.Tensor, const: set[str]) -> gs.Tensor | None:
    """What to fold for a constant tensor ``t`` read by a non-constant node: ``t`` itself, or the input of a
    final QuantizeLinear→DequantizeLinear pair (kept: the reader sees a quantized constant and its scale);
    None when nothing is computed there (a weight's integers through DequantizeLinear and layout ops), when
    no Q/DQ is inside (step 4 folds those, or left them for their size) or when the value is too large."""
    dq = producer(t)
    if dq is not None and dq.op == "DequantizeLinear":
        q = producer(dq.inputs[0])
        if q is not None and q.op == "QuantizeLinear":
            t = q.inputs[0]
    cone = _cone(t, const)
    if not cone or all(n.op in _LAYOUT for n in cone) or not any(n.op in _QDQ for n in cone):
        return None
    static = t.shape is not None and all(isinstance(d, int) for d in t.shape) and t.dtype is not None
    if static and int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize > SIZE_LIMIT:
        return None
    return t


def _fold_through_qdq(ctx: Context) -> int:
    """Fold the constant subgraphs with Q/DQ inside (step 5): each where it meets a non-constant reader.
    Returns the number of nodes removed."""
    g = ctx.graph
    const = _constant_tensors(g)
    outputs = {t.name for t in g.outputs}
    targets: dict[str, gs.Tensor] = {}
    for node in g.nodes:
        if all(x.name in const for x in node.outputs):
            continue  # itself constant: folded with its readers
        for i, x in enumerate(node.inputs):
            if x.name not in const or isinstance(x, gs.Constant) or x.dtype is None:
                continue
            if _WEIGHT_SLOTS.get(node.op) == i and not is_qdq_pair(x):
                continue  # a float weight would leave the GEMM float: its integers stay
            t = _fold_target(x, const)
            if t is not None and t.dtype is not None and t.name not in outputs:
                targets[t.name] = t
    if not targets:
        return 0
    values = _evaluate(ctx, list(targets))
    if values is None:
        return 0
    before = len(g.nodes)
    for name, value in zip(targets, values, strict=True):
        if value.nbytes > SIZE_LIMIT:
            continue
        t = targets[name]
        t.to_constant(np.asarray(value))
        t.inputs.clear()
    g.cleanup().toposort()
    folded = before - len(g.nodes)
    if folded > 0:
        ctx.count("fold_constants", "nodes folded through Q/DQ", folded)
    return max(folded, 0)


def _evaluate(ctx: Context, names: list[str]) -> list[np.ndarray] | None:
    """The values of constant tensors ``names``, as the fake-quant model computes them (Q/DQ in float); None
    (and a note for the report) when onnxruntime cannot evaluate them: the nodes then stay."""
    sub = ctx.graph.copy()
    tensors = sub.tensors()
    sub.inputs, sub.outputs = [], [tensors[n] for n in names]
    sub.cleanup()
    model = gs.export_onnx(sub, do_type_check=False)
    model.ir_version = ctx.ir_version
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in sorted(ctx.opset_imports.items()))
    for o in model.graph.output:  # the shapes recorded may be symbolic: the values say
        o.type.tensor_type.ClearField("shape")
    try:
        return [np.asarray(v) for v in ort_session(model).run(names, {})]
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors have no common type
        why = f"fold_constants: constant subgraph of '{names[0]}' not evaluated ({one_line(e)})"
        ctx.notes.setdefault("declined", {})["fold_constants/qdq"] = why
        return None


def _kept(node: gs.Node) -> bool:
    """Nodes never folded: Q/DQ (``normalize`` folds quantized constants into integers), ops of other domains
    and the toolkit forms ``normalize`` refuses (evaluating them would hide the refusal)."""
    return node.op in _QDQ or node.domain not in (None, "", "ai.onnx") or node.op in REFUSED


def _differ(a, b) -> bool:
    """Two dimensions that are both numbers and differ."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def _infer(ctx: Context) -> str | None:
    """ONNX shape inference with data propagation over the graph; shapes and dtypes written onto the tensors
    (a dimension inference cannot tell keeps what the graph had). Returns why it failed, if it did."""
    g = ctx.graph
    try:
        model = gs.export_onnx(g, do_type_check=False)
        model.ir_version = ctx.ir_version
        del model.opset_import[:]
        model.opset_import.extend(
            onnx.helper.make_opsetid(d, v) for d, v in sorted(ctx.opset_imports.items())
        )
        model.functions.extend(ctx.functions)
        bare = skeleton(model)
        inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - InferenceError, ValidationError, RuntimeError
        return f"shape inference failed ({one_line(e)})"
    _probe_unknown_dims(bare, inferred, model)
    tensors = g.tensors()
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = tensors.get(vi.name)
        tt = vi.type.tensor_type
        if t is None or isinstance(t, gs.Constant) or not vi.type.HasField("tensor_type"):
            continue
        if tt.elem_type:
            t.dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if tt.HasField("shape"):
            old = list(t.shape) if t.shape is not None and len(t.shape) == len(tt.shape.dim) else None
            t.shape = [
                d.dim_value if d.HasField("dim_value") else d.dim_param or (old[k] if old else None)
                for k, d in enumerate(tt.shape.dim)
            ]



#: the values the symbolic input dimensions take in the two probes of :func:`_probe_unknown_dims`: primes
#: small enough to run the model at, and no symbol's pair is another's plus a constant or times an integer
#: (with (2, 3) and (3, 4), ``batch + 1`` would read as the second symbol)
_PROBES = ((2, 3, 5, 7), (13, 19, 29, 41))


def _unknown(d) -> bool:
    return not d.HasField("dim_value") and (not d.dim_param or d.dim_param.startswith("unk__"))


def _probe_unknown_dims(bare: onnx.ModelProto, inferred: onnx.ModelProto, model: onnx.ModelProto) -> None:
    """Dimensions ONNX inference leaves unknown behind a symbolic batch (a ``Reshape(x, [batch, -1, C])``: the
    ``-1`` needs ``size / batch``, which ONNX cannot divide symbolically; a Slice whose end is computed from a
    shape), resolved by probing with the input symbols set to two sets of numbers: by inference where that
    tells, else by running the model (onnxruntime, Q/DQ in float) on zeros and reading the shapes. A dimension
    equal in both probes does not depend on the symbols (the token count of a ViT); one that follows a symbol
    is that symbol. Written into ``inferred`` in place."""
    symbols = sorted({d.dim_param for i in bare.graph.input for d in i.type.tensor_type.shape.dim
                      if d.dim_param and not d.HasField("dim_value")})
    values = list(inferred.graph.value_info) + list(inferred.graph.output)
    unknown = {v.name: v for v in values if any(_unknown(d) for d in v.type.tensor_type.shape.dim)}
    if not symbols or len(symbols) > len(_PROBES[0]) or not unknown:
        return
    shapes = [_inferred_probe(bare, dict(zip(symbols, numbers, strict=False))) for numbers in _PROBES]
    if any(s is None for s in shapes) or any(
        not _known(shapes[0].get(name)) or not _known(shapes[1].get(name)) for name in unknown
    ):
        shapes = [_run_probe(model, dict(zip(symbols, numbers, strict=False)), list(unknown))
                  for numbers in _PROBES]
    follows = {(a, b): k for k, a, b in zip(symbols, *_PROBES, strict=False)}
    for name, v in unknown.items():
        seen = [s.get(name) if s is not None else None for s in shapes]
        dims = v.type.tensor_type.shape.dim
        if any(x is None or len(x) != len(dims) for x in seen):
            continue
        for d, a, b in zip(dims, *seen, strict=True):
            if not _unknown(d) or not isinstance(a, int) or not isinstance(b, int):
                continue
            if a == b:
                d.dim_value = a
            elif (a, b) in follows:
                d.dim_param = follows[(a, b)]


def _with_symbols(model: onnx.ModelProto, at: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` whose input dimensions named in ``at`` are those numbers."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for i in probe.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if d.dim_param in at:
                d.dim_value = at[d.dim_param]
    return probe


def _inferred_probe(bare: onnx.ModelProto, at: dict[str, int]) -> dict[str, list] | None:
    """Every tensor's inferred shape with the symbols set (None where inference fails)."""
    try:
        out = onnx.shape_inference.infer_shapes(_with_symbols(bare, at), strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - the symbolic inference's result stands
        return None
    return {
        v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        for v in [*out.graph.value_info, *out.graph.output]
    }


def _run_probe(model: onnx.ModelProto, at: dict[str, int], names: list[str]) -> dict[str, list] | None:
    """The shapes of ``names`` when the model runs on zeros with the symbols set (None if it cannot run)."""
    probe = _with_symbols(model, at)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    feeds = {}
    for i in probe.graph.input:
        tt = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        feeds[i.name] = np.zeros(dims, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    try:
        outs = ort_session(probe).run(names, feeds)
    except Exception:  # noqa: BLE001 - a model that cannot run on zeros keeps its unknown dimensions
        return None
    return {n: list(np.shape(o)) for n, o in zip(names, outs, strict=True)}
