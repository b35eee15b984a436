"""Every standard ONNX operator and what ``rewrite`` does with it: the operator table of docs/conversion.md
(``python -m ivit_onnx.passes.operators --docs`` writes it; ``tests/passes/test_operator_table.py`` checks it
against the rule table, the fusions and the docs).

Statuses: ``rule`` (a lowering rule of ``passes/rules`` gives it an integer meaning), ``expanded`` (a pass
rewrites it into operators with rules, e.g. GroupNormalization into ILayerNorm rows), ``fused`` (part of a
decomposed GELU / LayerNorm / softmax form that a fusion pass turns into one private op), ``refused`` (a
toolkit form ``normalize`` refuses with what to do), ``none`` (no integer meaning, with the reason). Every
operator also folds into a constant where all its inputs are constants or static shapes (``fold_constants``),
so shape and position arithmetic needs no rule; on activations, an operator with no rule is a float island.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: operators with no integer rule, by the reason (the rest of those without a rule: "no integer rule yet")
NO_RULE: dict[str, tuple[str, ...]] = {
    "control flow: the certificate does not certify subgraphs (export the model without it)": (
        "If", "Loop", "Scan", "SequenceMap",
    ),
    "recurrent layer: not part of a transformer encoder": ("GRU", "LSTM", "RNN"),
    "strings, sequences, optionals: no numeric tensor to quantize": (
        "ConcatFromSequence", "ImageDecoder", "Optional", "OptionalGetElement", "OptionalHasElement",
        "RegexFullMatch", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
        "SequenceInsert", "SequenceLength", "SplitToSequence", "StringConcat", "StringNormalizer",
        "StringSplit", "TfIdfVectorizer",
    ),
    "training loss: not in an inference graph": ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"),
    "detection post-processing, coordinate sampling: outside an encoder (run it on the dequantized output)": (
        "AffineGrid", "Col2Im", "DeformConv", "GridSample", "MaxRoiPool", "MaxUnpool", "NonMaxSuppression",
        "RoiAlign",
    ),
    "signal front end: runs on the float input, before the input quantize (audio feature extraction)": (
        "BlackmanWindow", "DFT", "HammingWindow", "HannWindow", "MelWeightMatrix", "STFT",
    ),
    "data-dependent output shape: no static integer kernel (folds when its input is constant)": (
        "Compress", "NonZero", "Unique",
    ),
    "already integer: the converter's own output ops, kept as they are": (
        "ConvInteger", "MatMulInteger", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor",
    ),
    "bit reinterpretation: no affine meaning": ("BitCast",),
    "float tests: an integer tensor is never NaN or infinite (the SDPA NaN guard is a rule)": ("IsInf",),
    "makes constants or shape values, never an activation: folds (``fold_constants``), or runs as is on "
    "integers": ("Constant", "ConstantOfShape", "EyeLike", "OneHot", "Range", "Size", "CastLike"),
    "opset 23-24 fused forms: exporters at opsets 17-21 write their decomposition, which has rules": (
        "Attention", "RMSNormalization", "RotaryEmbedding", "Swish", "SwiGLU",
    ),
    "stateful or recurrent kernels of recent opsets: not emitted for encoders": (
        "CausalConvWithState", "LinearAttention", "TensorScatter",
    ),
}


def onnx_operators() -> list[str]:
    """The standard operators (default domain) that onnx defines, any version, deprecated ones left out."""
    import onnx.defs

    schemas = onnx.defs.get_all_schemas_with_history()
    return sorted({s.name for s in schemas if s.domain == "" and not s.deprecated})


def _pattern_ops(pattern) -> set[str]:
    """Every op type a fusion pattern names (through nested inputs and alternatives)."""
    ops, todo, seen = set(), [pattern], set()
    while todo:
        p = todo.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        ops |= set(getattr(p, "ops", ()))
        todo += [*getattr(p, "inputs", ()), *getattr(p, "alternatives", ())]
    return ops


def fused_ops() -> dict[str, str]:
    """op -> the fusion passes whose patterns name it."""
    from ivit_onnx.pipeline import Pipeline

    from .pattern import FusePass

    out: dict[str, set[str]] = {}
    for p in Pipeline.default().passes:
        if isinstance(p, FusePass):
            for rule in p.rules:
                for op in _pattern_ops(rule.pattern):
                    out.setdefault(op, set()).add(p.name)
    return {op: ", ".join(sorted(names)) for op, names in out.items()}


def expanded_ops() -> dict[str, str]:
    """op -> how a pass rewrites it into operators with rules (a pass's ``ops``, and its ``ops_how`` or the
    default sentence)."""
    from ivit_onnx.pipeline import Pipeline

    return {
        op: getattr(p, "ops_how", f"`passes/{p.name}.py` rewrites it into operators with rules")
        for p in Pipeline.default().passes for op in getattr(p, "ops", ())
    }


def _rule_names(rule, op: str) -> str:
    """The rules that may lower ``op`` (``module.Class`` of ``passes/rules``), in the order they are tried (a
    ``chain.FirstOf`` tries several)."""
    rules = [r for r in getattr(rule, "rules", (rule,)) if op in getattr(r.pattern, "ops", (op,))]
    return ", then ".join(f"`{type(r).__module__.rsplit('.', 1)[-1]}.{type(r).__name__}`" for r in rules)


def table() -> list[tuple[str, str, str]]:
    """``(operator, status, note)`` for every standard operator."""
    from .normalize import REFUSED
    from .rules import RULES

    fused, reasons = fused_ops(), {op: why for why, ops in NO_RULE.items() for op in ops}
    expanded = expanded_ops()
    rows = []
    for op in onnx_operators():
        if op in expanded:
            rows.append((op, "expanded", expanded[op]))
        elif op in RULES:
            rows.append((op, "rule", _rule_names(RULES[op], op)))
        elif op in REFUSED:
            rows.append((op, "refused", REFUSED[op]))
        elif op in fused:
            rows.append((op, "fused", f"inside a decomposed form ({fused[op]}); alone, no integer rule yet"))
        elif op in reasons:
            rows.append((op, "none", reasons[op]))
        else:
            rows.append((op, "none", "no integer rule yet: folds on constants, an island on activations"))
    return rows


#: docs/conversion.md's table lies between these lines
MARKERS = (
    "<!-- OPERATOR TABLE (python -m ivit_onnx.passes.operators --docs writes it; tests check it) -->",
    "<!-- /OPERATOR TABLE -->",
)


def markdown() -> str:
    rows = ["| operator | status | how |", "|---|---|---|"]
    rows += [f"| {op} | {status} | {note} |" for op, status, note in table()]
    return "\n".join(rows)


def docs_path() -> Path:
    return Path(__file__).resolve().parents[1] / "docs" / "conversion.md"


def main(argv: list[str] | None = None) -> int:
    """Print the table, or with ``--docs`` rewrite it in docs/conversion.md (from a checkout)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--docs" not in argv:
        print(markdown())
        return 0
    path = docs_path()
    text = path.read_text()
    start, end = MARKERS
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{start}\n{markdown()}\n{end}{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
