"""Prologue fusion: an injective producer (quantize, layout transposes, the token gather) joins the GEMM
that reads it, so the GEMM kernel computes its operand while loading it and nothing writes it in between.

Relax's ``FuseOps`` fuses a GEMM with its elementwise consumers (the epilogue) but never with producers, so
each input quantize, head split, transpose and ``take`` before a GEMM is a kernel of its own (a launch and a
round trip through global memory). This pass runs between ``FuseOps`` and ``FuseTIR``: where a grouped GEMM
function's operand is the only use of an injective group (or single injective ``call_tir``), the two become
one grouped function, which ``FuseTIR`` turns into one PrimFunc; the int8 tensor-core schedule then inlines
the producer's blocks into its shared-memory loads (dlight's ``auto_inline_producers``). Values are
unchanged: the producer's integers are computed by the same TIR, only where they are read.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

#: relay's OpPatternKind: up to kInjective a PrimFunc is an index map of its inputs; kOutEWiseFusable: GEMM
INJECTIVE, OUT_EWISE_FUSABLE = 2, 4
_CALL_TIR = "relax.call_tir"


def _is_call_tir(expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == _CALL_TIR


def _pattern(mod: tvm.IRModule, gv) -> int:
    func = mod[gv]
    if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs is None or "op_pattern" not in func.attrs:
        return 99
    return int(func.attrs["op_pattern"])


def _group_calls(func: relax.Function) -> list[relax.Call]:
    return [b.value for block in func.body.blocks for b in block.bindings if _is_call_tir(b.value)]


def _injective(mod: tvm.IRModule, value) -> bool:
    """A grouped function call or a ``call_tir`` computing one tensor by injective PrimFuncs only."""
    if not isinstance(value, relax.Call) or not isinstance(value.ty, relax.TensorType):
        return False
    if _is_call_tir(value):
        return _pattern(mod, value.args[0]) <= INJECTIVE
    if not isinstance(value.op, relax.GlobalVar) or not isinstance(mod[value.op], relax.Function):
        return False
    calls = _group_calls(mod[value.op])
    return bool(calls) and all(_pattern(mod, c.args[0]) <= INJECTIVE for c in calls)


def _gemm_operands(mod: tvm.IRModule, value) -> set[int]:
    """Argument positions of a grouped function call that feed its GEMM's ``call_tir`` directly."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, relax.GlobalVar):
        return set()
    func = mod[value.op]
    if not isinstance(func, relax.Function) or not (func.attrs and "Primitive" in func.attrs):
        return set()
    gemms = [c for c in _group_calls(func) if _pattern(mod, c.args[0]) == OUT_EWISE_FUSABLE]
    if len(gemms) != 1:
        return set()
    fields = gemms[0].args[1].fields
    return {i for i, p in enumerate(func.params) if any(p.same_as(a) for a in fields)}


def _substitute(expr, env: dict):
    if isinstance(expr, relax.Var):
        return env.get(expr, expr)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [_substitute(a, env) for a in expr.args], expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_substitute(f, env) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_substitute(expr.tuple_value, env), expr.index)
    return expr


def _inline(bb: relax.BlockBuilder, mod: tvm.IRModule, value, args: list):
    """Emit ``value`` (a grouped function call or a ``call_tir``) in ``bb`` with its arguments ``args``."""
    if _is_call_tir(value):
        return bb.emit(
            relax.Call(
                value.op, [value.args[0], relax.Tuple(args), *value.args[2:]], value.attrs, value.ty_args
            )
        )
    func = mod[value.op]
    env = dict(zip(func.params, args, strict=True))
    for block in func.body.blocks:
        for binding in block.bindings:
            env[binding.var] = bb.emit(_substitute(binding.value, env))
    return _substitute(func.body.body, env)


def _producer_args(value) -> list:
    return list(value.args[1].fields) if _is_call_tir(value) else list(value.args)


def _name(mod: tvm.IRModule, value) -> str:
    gv = value.args[0] if _is_call_tir(value) else value.op
    return gv.name_hint.removeprefix("fused_")


def _merge(bb: relax.BlockBuilder, mod: tvm.IRModule, gemm, producers: dict):
    """A grouped function: ``producers`` (argument position -> producer call) inlined into ``gemm``'s."""
    func = mod[gemm.op]
    outer, params, args = [], [], []
    for i, (param, arg) in enumerate(zip(func.params, gemm.args, strict=True)):
        if i in producers:
            inner = [relax.Var(f"{param.name}_{j}", a.ty) for j, a in enumerate(_producer_args(producers[i]))]
            params += inner
            outer += _producer_args(producers[i])
            args.append((i, inner))
        else:
            fresh = relax.Var(param.name, param.ty)
            params.append(fresh)
            outer.append(arg)
            args.append((None, fresh))
    sub = relax.BlockBuilder()
    with sub.function("merged", params, attrs=dict(func.attrs), private=True):
        with sub.dataflow():
            operands = [inner if i is None else _inline(sub, mod, producers[i], inner) for i, inner in args]
            out = sub.emit_output(_inline(sub, mod, gemm, operands))
        sub.emit_func_output(out)
    merged = sub.get()["merged"]
    name = (
        "fused_"
        + "_".join(_name(mod, producers[i]) for i in sorted(producers))
        + "_"
        + gemm.op.name_hint.removeprefix("fused_")
    )
    gv = bb.add_func(merged, name)
    return relax.Call(gv, outer)


def _uses(func: relax.Function) -> dict:
    """How many times each var is read in ``func``'s bindings and result."""
    counts: dict = {}

    def visit(var):
        counts[var] = counts.get(var, 0) + 1

    for value in [b.value for block in func.body.blocks for b in block.bindings] + [func.body.body]:
        tvm_ffi.structural_walk(value, [(relax.Var, visit)])
    return counts


@tvm.transform.module_pass(opt_level=0, name="IvitFusePrologue")
def fuse_prologue(mod: tvm.IRModule, _ctx=None) -> tvm.IRModule:
    """Between ``FuseOps`` and ``FuseTIR``: merge single-use injective producers into the GEMM group
    reading them (see the module doc); the producers' own bindings are left dead and removed."""
    main = mod["main"]
    uses = _uses(main)
    bound = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    bb = relax.BlockBuilder(mod)
    blocks = []
    for block in main.body.blocks:
        bindings = []
        for b in block.bindings:
            value = b.value
            producers = {}
            for i in sorted(_gemm_operands(mod, value)):
                arg = value.args[i]
                src = bound.get(arg) if isinstance(arg, relax.Var) else None
                if src is not None and uses.get(arg, 0) == 1 and _injective(mod, src):
                    producers[i] = src
            if producers:
                value = bb.normalize(_merge(bb, mod, value, producers))
            bindings.append(relax.VarBinding(b.var, value))
        blocks.append(type(block)(bindings))
    new = bb.get()
    new["main"] = relax.Function(
        main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure, main.attrs
    )
    return relax.transform.DeadCodeElimination()(new)


__all__ = ["fuse_prologue"]
