"""The text report ``python -m ivit_onnx.validate`` prints (the JSON is :meth:`Result.as_dict`)."""

from __future__ import annotations

from .result import FAILED, Result

MAX_DETAILS = 10  # detail lines per check in the table (all of them go to --json)


def render(result: Result, min_cosine: float) -> str:
    """The text report: inputs and backends, the checks table, comparisons, accuracy, per-layer rows."""
    lines = [f"ivit_onnx.validate {result.model}"]
    i = result.info
    if "inputs" in i:
        lines.append(
            f"  inputs    {i['inputs']}: {i['samples']} samples, batch {i['batch']} "
            f"({'; '.join(i['input_specs'])})"
        )
        lines.append(f"  backends  {', '.join(i['backends'])}")
        lines += [f"            {b}: {note}" for b, note in i.get("backend_notes", {}).items()]
    w = max([30, *(len(c.name) for c in result.checks)])
    lines += ["", f"  {'STATUS':8} {'CHECK':{w}} DETAIL"]
    for c in result.checks:
        lines.append(f"  {c.status:8} {c.name:{w}} {c.summary}")
        lines += [f"  {'':8} {'':{w}}   {d}" for d in c.details[:MAX_DETAILS]]
        if len(c.details) > MAX_DETAILS:
            lines.append(f"  {'':8} {'':{w}}   ... and {len(c.details) - MAX_DETAILS} more (see --json)")
    if result.comparisons:
        lines += [
            "",
            f"  {'COMPARISON':22} {'OUTPUT':14} {'SAMPLES':>7} {'TOP-1 AGREE':>11} "
            f"{'COS MEAN':>9} {'COS MIN':>9} {'SQNR dB':>8} {'MAX |ERR|':>10}",
        ]
        for label, per_out in result.comparisons.items():
            title = label if " vs " in label else f"int vs {label}"
            for o, s in per_out.items():
                agree = "-" if s["top1_agreement"] is None else f"{100 * s['top1_agreement']:.2f}%"
                lines.append(
                    f"  {title:22} {_short(o, 14):14} {s['samples']:7d} {agree:>11} "
                    f"{s['cosine_mean']:9.5f} {s['cosine_min']:9.5f} {s['sqnr_db']:8.2f} "
                    f"{s['max_abs_error']:10.4g}"
                )
    if result.accuracy:
        lines += ["", f"  {'ACCURACY (labels)':22} {'SAMPLES':>7} {'TOP-1':>8} {'TOP-5':>8}"]
        for k, v in result.accuracy.items():
            top5 = "-" if v["top5"] is None else f"{100 * v['top5']:.2f}%"
            lines.append(f"  {k:22} {v['samples']:7d} {100 * v['top1']:7.2f}% {top5:>8}")
    if result.per_layer:
        lines += _render_layers(result.per_layer, min_cosine)
    if result.per_op:
        lines += _render_ops(result.per_op)
    failed = [c.name for c in result.checks if c.status == FAILED]
    lines.append("")
    if failed:
        lines.append(f"FAILED: {len(failed)} of {len(result.checks)} checks ({', '.join(failed)})")
    else:
        lines.append(f"PASSED: {len(result.checks)} checks")
    return "\n".join(lines)


def _render_layers(rows: list, min_cosine: float) -> list[str]:
    lines = [
        "",
        "  PER-LAYER (first batch): int tensor dequantized with the tensor map vs the fake-quant"
        " tensor it replaces, topological order",
        f"  {'#':>4} {'INT TENSOR':48} {'DTYPE':6} {'COSINE':>9} {'SQNR dB':>8} {'DROP dB':>8} "
        f"{'MAX |ERR|':>10} {'MAX LSB':>8}  MARK",
    ]
    for k, r in enumerate(rows):
        lines.append(
            f"  {k:4d} {_short(r.tensor, 48):48} {r.dtype:6} {r.cosine:9.5f} {r.sqnr:8.2f} "
            f"{r.drop:8.2f} {r.max_abs:10.4g} {r.max_lsb:8.2f}  {' '.join(r.marks)}"
        )
    worst = next((r for r in rows if "worst" in r.marks), None)
    first = next((r for r in rows if "first<cos" in r.marks), None)
    if worst:
        lines.append(
            f"  worst: '{worst.tensor}' (replaces '{worst.replaces}') adds the most error: "
            f"SQNR {worst.sqnr + worst.drop:.2f} dB upstream -> {worst.sqnr:.2f} dB"
        )
    if first:
        lines.append(f"  first below --min-cosine {min_cosine}: '{first.tensor}' (cosine {first.cosine:.5f})")
    return lines


def _render_ops(rows: list) -> list[str]:
    from .per_op import summary

    lines = [
        "",
        "  PER-OP (first batch): each kernel fed the fake-quant model's integers, vs the float op then its "
        "quantize, in output LSB",
        f"  {'OP':14} {'NODE':44} {'ELEMENTS':>9} {'EXACT':>7} {'MEAN LSB':>9} {'MAX LSB':>8}",
    ]
    for r in rows:
        lines.append(f"  {r.op:14} {_short(r.node, 44):44} {r.elements:9d} {100 * r.exact:6.2f}% "
                     f"{r.mean_lsb:9.4f} {r.max_lsb:8d}")
    for op, s in summary(rows).items():
        lines.append(f"  {op}: {s['nodes']} node(s), worst {s['max_lsb']} LSB, mean {s['mean_lsb']:.4f} LSB, "
                     f"{100 * s['exact']:.2f}% exact")
    return lines


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else "…" + s[-(n - 1) :]
