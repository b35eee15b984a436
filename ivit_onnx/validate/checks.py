"""The static checks: onnx.checker, the private opset (known ops, types, broadcasting, function bodies,
canonical bodies) and the integer-only certificate."""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import inliner

from ..certify import float_offenders, opset_problems
from ..errors import one_line
from .result import FAILED, PASSED, WARNING, Check


def check_onnx(model: onnx.ModelProto) -> Check:
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001 - the checker raises several types
        return Check("onnx.checker (full check)", FAILED, one_line(e))
    imports = ", ".join(f"{i.domain or 'ai.onnx'} {i.version}" for i in model.opset_import)
    return Check("onnx.checker (full check)", PASSED, f"IR {model.ir_version}; opsets {imports}")


def check_opset(model: onnx.ModelProto) -> list[Check]:
    """The private-opset check and, separately, whether the bodies are this package's canonical ones."""
    from ivit_onnx.io import default_opset
    from ivit_onnx.opset import DOMAIN, OPS, VERSION

    name = f"private opset {DOMAIN} v{VERSION}"
    try:
        problems = opset_problems(model)
        problems += broadcast_problems(model, DOMAIN)
    except Exception as e:  # noqa: BLE001 - shape inference errors
        return [Check(name, FAILED, one_line(e))]
    used = Counter(n.op_type for n in model.graph.node if n.domain == DOMAIN)
    funcs = {f.name: f for f in model.functions if f.domain == DOMAIN}
    missing = sorted(op for op in used if op not in funcs)
    problems += [f"{op}: no function body (stock onnxruntime cannot run it)" for op in missing]
    counts = " ".join(f"{op}×{k}" for op, k in sorted(used.items()))
    summary = f"{len(problems)} problem(s)" if problems else f"{sum(used.values())} nodes: {counts or 'none'}"
    checks = [Check(name, FAILED if problems else PASSED, summary, problems)]
    stale = []
    try:
        opset = default_opset(model)
        if not opset:
            raise ValueError("model imports no default-domain opset")
        for op, f in sorted(funcs.items()):
            if op in OPS and OPS[op].function(opset).SerializeToString() != _canonical(f):
                stale.append(f"{op}: body differs from ivit_onnx.opset's (re-attach with attach_functions)")
    except ValueError as e:
        stale.append(str(e))
    if funcs:
        summary = f"{len(stale)} of {len(funcs)} differ" if stale else f"{len(funcs)} bodies"
        checks.append(Check("function bodies canonical", WARNING if stale else PASSED, summary, stale))
    return checks


def broadcast_problems(model: onnx.ModelProto, domain: str) -> list[str]:
    """Private-op nodes whose inputs do not broadcast together (inferred static dims; symbolic ones match
    anything): the kernels would fail inside onnxruntime, which aborts the process for a custom op."""
    shapes = {}
    for vi in [*model.graph.input, *onnx.shape_inference.infer_shapes(model).graph.value_info]:
        if vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    for t in model.graph.initializer:
        shapes[t.name] = list(t.dims)
    problems = []
    for n in model.graph.node:
        if n.domain != domain:
            continue
        known = [shapes[i] for i in n.input if i in shapes]
        rank = max((len(s) for s in known), default=0)
        for k in range(1, rank + 1):
            dims = {s[-k] for s in known if len(s) >= k and s[-k] is not None and s[-k] != 1}
            if len(dims) > 1:
                problems.append(
                    f"{n.op_type} '{n.name or n.output[0]}': inputs do not broadcast together "
                    f"({', '.join(f'{i}: {shapes.get(i)}' for i in n.input)})"
                )
                break
    return problems


def _canonical(f: onnx.FunctionProto) -> bytes:
    g = onnx.FunctionProto()
    g.CopyFrom(f)
    g.ClearField("doc_string")
    return g.SerializeToString()


def check_certificate(model: onnx.ModelProto) -> Check:
    name = "integer-only certificate"
    try:
        bad = float_offenders(model)
    except Exception as e:  # noqa: BLE001 - inliner / strict shape inference errors
        return Check(name, FAILED, f"shape inference failed: {one_line(e)}")
    if bad:
        return Check(name, FAILED, f"{len(bad)} float tensor(s)", [str(b) for b in bad])
    flat = inliner.inline_local_functions(model)
    return Check(
        name,
        PASSED,
        f"{len(flat.graph.node)} nodes with bodies inlined: every tensor integer "
        f"between the input QuantizeLinear and the output DequantizeLinear",
    )
