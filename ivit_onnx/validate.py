"""``python -m ivit_onnx.validate int.onnx``: certify, run and compare an integer-only model (exit 0/1/2)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import inliner

from . import compare
from .certify import float_offenders, opset_problems
from .errors import guarded
from .inputs import InputError, input_specs, load_dataset
from .io import atomic_output, check_names, check_output_path
from .runners import INT_BACKENDS, OrtRunner, Runner, make_runner, node_outputs, producers

PASSED, FAILED, WARNING, SKIPPED = "PASSED", "FAILED", "WARNING", "SKIPPED"
MAX_DETAILS = 10  # detail lines per check in the table (all of them go to --json)
DEFAULT_SAMPLES = 32  # random samples: enough for a stable cosine/SQNR, cheap for a ViT
DEFAULT_MIN_AGREEMENT = 0.99
DEFAULT_MIN_SQNR = 15.0  # dB; a cosine of 0.99 with the error orthogonal to the signal is ~17 dB

EPILOG = """\
exit status: 0 every check passed (WARNING and SKIPPED do not fail), 1 a check failed,
2 unusable input (missing, truncated or non-ONNX model, bad --data); bad input prints one line on stderr.

checks: onnx.checker full check; private opset (every non-standard op is a known ai.ivit op with valid
types and attributes, and carries its function body); integer-only certificate (function bodies
inlined, shape inference, every tensor between the input QuantizeLinear and the output
DequantizeLinear integer); one run per backend; bit-exact agreement of every backend with the first
on every output (and on every intermediate tensor with --per-layer, or to locate a mismatch); with
--reference, mean per-sample logits cosine and the logits SQNR of the integer model vs the fake-quant
model against --min-cosine / --min-sqnr, and top-1 agreement against --min-agreement on real --data
(on random inputs it is reported only: their logits have low margins, so a correct model's top-1
flips; FP32 and label accuracy are reported, not checked).

data: default N(0,1) random inputs (--samples, --seed); an .npz with one array per input (or a
single array) and optional integer 'labels'; 'digits' (the bundled digits test split, with labels);
or a folder of images (.png/.pgm/.ppm/.npy, others with Pillow), sub-folders = classes, prepared
by --preprocess: imagenet (resize 256, centre crop 224 for a 224 input, ImageNet mean/std),
inception (same, mean=std=0.5), raw (resize to the input size, [0, 1]).
"""


@dataclass
class Check:
    name: str
    status: str
    summary: str = ""
    details: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary, "details": self.details}


# ------------------------------------------------------------------------------------------- loading


BUNDLED = "digits"  # --reference/--fp32 alias: the bundled digits models


def reference_path(arg: str, fp32: bool = False) -> str:
    """``digits`` (unless a file of that name exists) names the bundled fake-quant / FP32 digits ViT."""
    if arg == BUNDLED and not os.path.exists(arg):
        from ivit_onnx.models.bundled import default_fp32_path, default_model_path

        return str(default_fp32_path() if fp32 else default_model_path())
    return arg


def load_onnx(path: str) -> onnx.ModelProto:
    """Parse an ONNX file or raise :class:`InputError` with one line (no checker: that is a check)."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: not a file")
    try:
        model = onnx.load(path)
    except (DecodeError, RuntimeError, ValueError, OSError, onnx.checker.ValidationError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{path}: not an ONNX model or truncated ({why[:120]})") from None
    if not model.graph.node:
        raise InputError(f"{path}: not an ONNX model or truncated (no graph nodes)")
    check_names(model, path)
    return model


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


# -------------------------------------------------------------------------------------- static checks


def check_onnx(model: onnx.ModelProto) -> Check:
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001 - the checker raises several types
        return Check("onnx.checker (full check)", FAILED, _one_line(e))
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
        return [Check(name, FAILED, _one_line(e))]
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
                problems.append(f"{n.op_type} '{n.name or n.output[0]}': inputs do not broadcast together "
                                f"({', '.join(f'{i}: {shapes.get(i)}' for i in n.input)})")
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
        return Check(name, FAILED, f"shape inference failed: {_one_line(e)}")
    if bad:
        return Check(name, FAILED, f"{len(bad)} float tensor(s)", [str(b) for b in bad])
    flat = inliner.inline_local_functions(model)
    return Check(name, PASSED, f"{len(flat.graph.node)} nodes with bodies inlined: every tensor integer "
                               f"between the input QuantizeLinear and the output DequantizeLinear")


# --------------------------------------------------------------------------------------------- runs


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n
        if self.enabled:
            frac = self.done / max(self.total, 1)
            bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} samples  {rate:.1f}/s")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _feeds_for(runner: Runner, feeds: dict) -> dict:
    """The int model's feeds renamed (by position) and cast for another model."""
    out = {}
    ref_specs = {s.name: s for s in input_specs(runner.model)}
    for (_, arr), name in zip(feeds.items(), runner.input_names, strict=False):
        s = ref_specs.get(name)
        out[name] = arr.astype(s.dtype) if s is not None and arr.dtype != s.dtype else arr
    return out


def _pad(feeds: dict, size: int | None) -> dict:
    """Repeat the last sample to fill a model with a static batch dimension."""
    n = len(next(iter(feeds.values())))
    if size is None or n == size:
        return feeds
    return {k: np.concatenate([v, np.repeat(v[-1:], size - n, axis=0)]) for k, v in feeds.items()}


def _float_out(name: str, value: np.ndarray, tmap: dict) -> np.ndarray:
    """Output values as floats: an integer output with a tensor-map entry is dequantized."""
    if value.dtype.kind in "iu" and name in tmap:
        return compare.dequantize(value, tmap[name])
    return value


class Validation:
    """One validation run: the checks, metrics and tables, rendered as text and JSON."""

    def __init__(self, args):
        self.args = args
        self.checks: list[Check] = []
        self.comparisons: dict[str, dict] = {}
        self.accuracy: dict[str, dict] = {}
        self.per_layer: list[compare.LayerRow] = []
        self.info: dict = {}
        self.runners: dict[str, Runner] = {}
        self.refs: dict[str, Runner] = {}

    @property
    def passed(self) -> bool:
        return all(c.status != FAILED for c in self.checks)

    # ----------------------------------------------------------------------------------------- flow
    def run(self, model: onnx.ModelProto, fq: onnx.ModelProto | None, fp32: onnx.ModelProto | None) -> None:
        """Every check, in order: static checks, the runs over the data, cross-checks, metrics, per-layer."""
        a = self.args
        specs = input_specs(model)
        fixed = specs[0].shape[0] if specs and specs[0].shape else None
        data = load_dataset(a.data, specs, a.samples, a.seed, a.preprocess, a.limit)
        self.checks.append(check_onnx(model))
        opset_checks = check_opset(model)
        self.checks += opset_checks
        self.checks.append(check_certificate(model))
        self.info.update(inputs=data.description, samples=data.count, batch=fixed or a.batch,
                         input_specs=[s.describe() for s in specs], backends=a.backends)
        if any(c.status == FAILED for c in opset_checks):  # malformed private ops can abort the process
            self.checks.append(Check("runs", SKIPPED, "not run: the private opset check failed"))
            return
        try:
            self.tmap = compare.tensor_map(model)
        except (ValueError, TypeError) as e:  # damaged metadata: the per-tensor comparisons are lost
            self.tmap = {}
            self.checks.append(Check("tensor map (metadata)", WARNING, f"unreadable: {_one_line(e)}"))
        # u8_gemm None: the runner's default (re-encode for the library only); --int8-gemm: never
        factory = lambda b, m, t: make_runner(b, m, t, u8_gemm=False if a.int8_gemm else None)  # noqa: E731
        self.runners = self._start([(b, factory, model) for b in a.backends])
        notes = {b: r.describe() for b, r in self.runners.items()}
        self.info["backend_notes"] = {b: note for b, note in notes.items() if note}
        self.refs = self._start([(label, lambda _b, m, t: OrtRunner(m, "onnxruntime", t), m)
                                 for label, m in (("fake-quant", fq), ("fp32", fp32)) if m is not None])
        pairs = [(label, self._pair(model, r.model)) for label, r in self.refs.items()]
        if len(self.refs) == 2:
            pairs.append(("fake-quant vs fp32", self._pair(fq, fp32)))
        self.stats = {label: {o: compare.PairStats() for o, _ in names} for label, names in pairs}
        self.pairs = dict(pairs)
        self.acc = {k: compare.Accuracy() for k in ["int", *self.refs]} if data.labels is not None else {}
        self.base = next(iter(self.runners.values()), None)
        self.mismatch: dict[str, str | None] = {b: None for b in list(self.runners)[1:]}
        self.failed: set[str] = set()
        first_feeds, batch = None, fixed or a.batch
        progress = Progress(data.count, (a.progress or sys.stderr.isatty()) and data.count > batch)
        for index, (feeds, labels) in enumerate(data.batches(batch)):
            padded = _pad(feeds, fixed)
            first_feeds = first_feeds or padded
            self._batch(index, padded, len(next(iter(feeds.values()))), labels)
            progress.update(len(next(iter(feeds.values()))))
        progress.close()
        self._report_runs(data.count)
        self._report_cross()
        base_ok = self.base is not None and self.base.name not in self.failed
        if a.per_layer and base_ok and first_feeds is not None:
            self._per_layer(model, first_feeds)
        self._report_metrics()
        self.accuracy = {k: v.as_dict() for k, v in self.acc.items() if v.samples}

    def _batch(self, index: int, feeds: dict, n: int, labels) -> None:
        """Run one batch on every live backend and reference; cross-check and update the metrics."""
        outs: dict[str, dict] = {}
        for name, r in [*self.runners.items(), *self.refs.items()]:
            if name in self.failed:
                continue
            rf = feeds if name in self.runners else _feeds_for(r, feeds)
            try:
                outs[name] = {k: v[:n] for k, v in r.run(rf).items()}
            except Exception as e:  # noqa: BLE001 - a backend failing at run time is a failed check
                self.failed.add(name)
                self.info.setdefault("run_errors", {})[name] = _one_line(e)
        base = self.base
        if base is None or base.name not in outs:
            return
        for other in self.mismatch:
            if self.mismatch[other] is None and other in outs:
                self.mismatch[other] = self._cross_check(self.runners[other], outs, feeds, index)
        mine = {o: _float_out(o, v, self.tmap) for o, v in outs[base.name].items()}
        for label, names in self.pairs.items():
            src = outs.get("fake-quant") if label == "fake-quant vs fp32" else mine
            dst = outs.get("fp32" if label == "fake-quant vs fp32" else label)
            for o, theirs in names if src is not None and dst is not None else []:
                try:
                    self.stats[label][o].update(dst[theirs], src[o])
                except ValueError as e:
                    self.info.setdefault("comparison_errors", {})[label] = str(e)
        if labels is not None:
            self.acc["int"].update(mine[base.output_names[0]], labels)
            for k, r in self.refs.items():
                if k in outs:
                    self.acc[k].update(outs[k][r.output_names[0]], labels)

    def _start(self, items) -> dict[str, Runner]:
        out = {}
        for label, factory, m in items:
            try:
                r = factory(label, m, self.args.threads)
                r.prepare()
                out[label] = r
            except Exception as e:  # noqa: BLE001 - session creation failures are failed checks
                what = f"run: {label}" if label in INT_BACKENDS else f"load reference: {label}"
                self.checks.append(Check(what, FAILED, _one_line(e)))
        return out

    @staticmethod
    def _pair(model: onnx.ModelProto, ref: onnx.ModelProto) -> list[tuple[str, str]]:
        mine = [o.name for o in model.graph.output]
        theirs = [o.name for o in ref.graph.output]
        if set(mine) <= set(theirs):
            return [(o, o) for o in mine]
        return list(zip(mine, theirs, strict=False))

    def _cross_check(self, other: Runner, outs: dict, feeds: dict, index: int) -> str | None:
        """``None`` when every output is bit-equal, else a description (with the first differing tensor)."""
        base = self.base
        mine, theirs = outs[base.name], outs[other.name]
        bad = [o for o in base.output_names if not compare.bit_equal(mine[o], theirs[o])]
        if not bad:
            return None
        how = compare.describe_difference(mine[bad[0]], theirs[bad[0]])
        text = f"batch {index}: output '{bad[0]}' differs ({how})"
        first = self._first_tensor(base, other, feeds)
        return f"{text}; first differing tensor: {first}" if first else text

    @staticmethod
    def _first_tensor(base: Runner, other: Runner, feeds: dict):
        order = node_outputs(base.model)
        try:
            a = base.run_with(feeds, order)
            b = other.run_with(feeds, order)
        except Exception as e:  # noqa: BLE001
            return f"(could not expose intermediates: {_one_line(e)})"
        return compare.first_difference(order, a, b, producers(base.model))

    def _report_runs(self, count: int) -> None:
        for name, r in [*self.runners.items(), *self.refs.items()]:
            label = f"run: {name}" if name in self.runners else f"run reference: {name}"
            if name in self.failed:
                self.checks.append(Check(label, FAILED, self.info["run_errors"][name]))
            else:
                rate = r.samples / r.seconds if r.seconds else float("inf")
                self.info.setdefault("throughput", {})[name] = rate
                self.checks.append(Check(label, PASSED, f"{count} samples, {rate:.1f} samples/s"))

    def _report_cross(self) -> None:
        base = self.base
        for other, problem in self.mismatch.items():
            label = f"bit-exact: {other} == {base.name}"
            if other in self.failed or base.name in self.failed:
                self.checks.append(Check(label, SKIPPED, "a run failed"))
            elif problem:
                self.checks.append(Check(label, FAILED, "outputs differ", [problem]))
            else:
                n = len(base.output_names)
                self.checks.append(Check(label, PASSED, f"all {n} output(s), every sample"))

    def _per_layer(self, model: onnx.ModelProto, feeds: dict) -> None:
        """Bit-exact intermediates across backends, then the dequantized tensors vs the fake-quant ones."""
        base, tmap, fq_runner = self.base, self.tmap, self.refs.get("fake-quant")
        order = node_outputs(model)
        values = base.run_with(feeds, order)
        for name, r in self.runners.items():
            if r is base or name in self.failed:
                continue
            first = compare.first_difference(order, values, r.run_with(feeds, order), producers(model))
            label = f"bit-exact intermediates: {name} == {base.name}"
            if first is None:
                n = sum(1 for t in order if t in values)
                self.checks.append(Check(label, PASSED, f"{n} tensors, first batch"))
            else:
                what = "first differing tensor (topological order)"
                self.checks.append(Check(label, FAILED, what, [str(first)]))
        if not tmap:
            self.checks.append(Check("per-layer vs fake-quant", SKIPPED, "no ivit_onnx.tensor_map"))
            return
        if fq_runner is None or "fake-quant" in self.failed:
            self.checks.append(Check("per-layer vs fake-quant", SKIPPED, "needs --reference FQ.onnx"))
            return
        wanted = [e["replaces"] for e in tmap.values()]
        fq_values = fq_runner.run_with(_feeds_for(fq_runner, feeds), wanted)
        self.per_layer = compare.per_layer(model, values, fq_values, tmap, self.args.min_cosine)
        self.info["per_layer_unmatched"] = len(tmap) - len(self.per_layer)

    def _report_metrics(self) -> None:
        a = self.args
        for label, per_out in self.stats.items():
            self.comparisons[label] = {o: s.as_dict() for o, s in per_out.items() if s.samples}
        fq = self.stats.get("fake-quant")
        if fq is None:
            return
        live = {o: s for o, s in fq.items() if s.samples}
        if not live:
            self.checks.append(Check("top-1 agreement vs fake-quant", SKIPPED, "no comparable output"))
            return
        agreements = {o: s.agreement for o, s in live.items() if s.agreement is not None}
        if agreements and a.data is None and a.min_agreement is None:
            # random inputs give low-margin logits: a correct model's top-1 flips on them, so it is no signal
            self.checks.append(Check("top-1 agreement vs fake-quant", SKIPPED,
                                     f"{100 * min(agreements.values()):.2f}% (not checked on random inputs; "
                                     "give --data for real ones)"))
        elif agreements:
            worst, want = min(agreements.values()), DEFAULT_MIN_AGREEMENT if a.min_agreement is None \
                else a.min_agreement
            ok = worst >= want
            self.checks.append(Check("top-1 agreement vs fake-quant", PASSED if ok else FAILED,
                                     f"{100 * worst:.2f}% {'≥' if ok else '<'} {100 * want:.2f}%"))
        else:
            self.checks.append(Check("top-1 agreement vs fake-quant", SKIPPED, "no [N, classes] output"))
        cos = min(s.cosine for s in live.values())
        ok = cos >= a.min_cosine
        self.checks.append(Check("output cosine vs fake-quant", PASSED if ok else FAILED,
                                 f"mean {cos:.5f} {'≥' if ok else '<'} {a.min_cosine} "
                                 f"(min {min(s.cos_min for s in live.values()):.5f})"))
        sqnr = min(s.sqnr for s in live.values())
        ok = sqnr >= a.min_sqnr  # cosine ignores a wrong scale; the signal-to-error ratio does not
        self.checks.append(Check("output SQNR vs fake-quant", PASSED if ok else FAILED,
                                 f"{sqnr:.2f} dB {'≥' if ok else '<'} {a.min_sqnr:g} dB"))

    # -------------------------------------------------------------------------------------- output
    def render(self, model_path: str) -> str:
        lines = [f"ivit_onnx.validate {model_path}"]
        i = self.info
        if "inputs" in i:
            lines.append(f"  inputs    {i['inputs']}: {i['samples']} samples, batch {i['batch']} "
                         f"({'; '.join(i['input_specs'])})")
            lines.append(f"  backends  {', '.join(i['backends'])}")
            lines += [f"            {b}: {note}" for b, note in i.get("backend_notes", {}).items()]
        w = max([30, *(len(c.name) for c in self.checks)])
        lines += ["", f"  {'STATUS':8} {'CHECK':{w}} DETAIL"]
        for c in self.checks:
            lines.append(f"  {c.status:8} {c.name:{w}} {c.summary}")
            lines += [f"  {'':8} {'':{w}}   {d}" for d in c.details[:MAX_DETAILS]]
            if len(c.details) > MAX_DETAILS:
                lines.append(f"  {'':8} {'':{w}}   ... and {len(c.details) - MAX_DETAILS} more (see --json)")
        if self.comparisons:
            lines += ["", f"  {'COMPARISON':22} {'OUTPUT':14} {'SAMPLES':>7} {'TOP-1 AGREE':>11} "
                          f"{'COS MEAN':>9} {'COS MIN':>9} {'SQNR dB':>8} {'MAX |ERR|':>10}"]
            for label, per_out in self.comparisons.items():
                title = label if " vs " in label else f"int vs {label}"
                for o, s in per_out.items():
                    agree = "-" if s["top1_agreement"] is None else f"{100 * s['top1_agreement']:.2f}%"
                    lines.append(f"  {title:22} {_short(o, 14):14} {s['samples']:7d} {agree:>11} "
                                 f"{s['cosine_mean']:9.5f} {s['cosine_min']:9.5f} {s['sqnr_db']:8.2f} "
                                 f"{s['max_abs_error']:10.4g}")
        if self.accuracy:
            lines += ["", f"  {'ACCURACY (labels)':22} {'SAMPLES':>7} {'TOP-1':>8} {'TOP-5':>8}"]
            for k, v in self.accuracy.items():
                top5 = "-" if v["top5"] is None else f"{100 * v['top5']:.2f}%"
                lines.append(f"  {k:22} {v['samples']:7d} {100 * v['top1']:7.2f}% {top5:>8}")
        if self.per_layer:
            lines += self._render_layers()
        failed = [c.name for c in self.checks if c.status == FAILED]
        lines.append("")
        if failed:
            lines.append(f"FAILED: {len(failed)} of {len(self.checks)} checks ({', '.join(failed)})")
        else:
            lines.append(f"PASSED: {len(self.checks)} checks")
        return "\n".join(lines)

    def _render_layers(self) -> list[str]:
        rows = self.per_layer
        lines = ["", "  PER-LAYER (first batch): int tensor dequantized with the tensor map vs the fake-quant"
                     " tensor it replaces, topological order",
                 f"  {'#':>4} {'INT TENSOR':48} {'DTYPE':6} {'COSINE':>9} {'SQNR dB':>8} {'DROP dB':>8} "
                 f"{'MAX |ERR|':>10} {'MAX LSB':>8}  MARK"]
        for k, r in enumerate(rows):
            lines.append(f"  {k:4d} {_short(r.tensor, 48):48} {r.dtype:6} {r.cosine:9.5f} {r.sqnr:8.2f} "
                         f"{r.drop:8.2f} {r.max_abs:10.4g} {r.max_lsb:8.2f}  {' '.join(r.marks)}")
        worst = next((r for r in rows if "worst" in r.marks), None)
        first = next((r for r in rows if "first<cos" in r.marks), None)
        if worst:
            lines.append(f"  worst: '{worst.tensor}' (replaces '{worst.replaces}') adds the most error: "
                         f"SQNR {worst.sqnr + worst.drop:.2f} dB upstream -> {worst.sqnr:.2f} dB")
        if first:
            lines.append(f"  first below --min-cosine {self.args.min_cosine}: '{first.tensor}' "
                         f"(cosine {first.cosine:.5f})")
        return lines

    def as_json(self, model_path: str, code: int) -> dict:
        return _finite({"model": model_path, "passed": self.passed, "exit_code": code, **self.info,
                        "checks": [c.as_dict() for c in self.checks], "comparisons": self.comparisons,
                        "accuracy": self.accuracy, "per_layer": [r.as_dict() for r in self.per_layer]})


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else "…" + s[-(n - 1):]


def _finite(x):
    """JSON-safe: NaN/inf floats become None."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# ---------------------------------------------------------------------------------------------- CLI


def _backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in INT_BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {bad}; choose from {', '.join(INT_BACKENDS)}")
    return list(dict.fromkeys(names))


def parser() -> argparse.ArgumentParser:
    from .cli import Parser
    from .images import PRESETS

    p = Parser(
        prog="python -m ivit_onnx.validate", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Validate an integer-only ONNX model made by ivit-onnx: certify it, run it on the "
                    "custom-op library (and other backends, bit-exactly), compare it with its references.",
        epilog=EPILOG)
    p.add_argument("model", help="the integer-only model (int.onnx)")
    g = p.add_argument_group("runs")
    g.add_argument("--backends", type=_backends, default=["library"], metavar="LIST",
                   help="comma list of library (the native onnxruntime custom-op library; where it was not "
                        "built, onnxruntime-extensions with the numpy kernels), functions, reference; the "
                        "first is compared with the references, the others must agree with it bit for bit "
                        "(default: library)")
    g.add_argument("--threads", type=int, default=None, metavar="N",
                   help="onnxruntime intra-op threads (default: all)")
    g.add_argument("--int8-gemm", action="store_true",
                   help="library: keep int8 x int8 GEMMs as converted (default: operands re-encoded as uint8 "
                        "with zero point 128, exact, for onnxruntime's fast u8 GEMM)")
    g = p.add_argument_group("references")
    g.add_argument("--reference", metavar="FQ.onnx", help="the fake-quant model it was converted from "
                   f"('{BUNDLED}': the bundled digits ViT)")
    g.add_argument("--fp32", metavar="FP32.onnx", help=f"the FP32 model, reported, not checked ('{BUNDLED}': "
                   "the bundled one)")
    g = p.add_argument_group("inputs")
    g.add_argument("--data", metavar="NPZ|DIR|digits", help="inputs (default: random)")
    g.add_argument("--preprocess", choices=sorted(PRESETS), default="imagenet",
                   help="preset for an image folder (default imagenet)")
    g.add_argument("--batch", type=int, default=8, metavar="N", help="batch size (default 8)")
    g.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, metavar="N",
                   help=f"number of random samples when no --data is given (default {DEFAULT_SAMPLES})")
    g.add_argument("--limit", type=int, default=None, metavar="N",
                   help="use at most this many samples of --data")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the random inputs (default 0)")
    g = p.add_argument_group("checks and output")
    g.add_argument("--min-cosine", type=float, default=0.99, metavar="X",
                   help="mean logits cosine vs --reference (0.99)")
    g.add_argument("--min-sqnr", type=float, default=DEFAULT_MIN_SQNR, metavar="DB",
                   help=f"logits signal-to-error ratio vs --reference, in dB ({DEFAULT_MIN_SQNR:g})")
    g.add_argument("--min-agreement", type=float, default=None, metavar="X",
                   help=f"top-1 agreement vs --reference ({DEFAULT_MIN_AGREEMENT}; on random inputs only "
                        "checked when given)")
    g.add_argument("--per-layer", action="store_true",
                   help="compare every intermediate tensor: bit-exact across backends, and dequantized vs "
                        "the fake-quant tensor it replaces (first batch), marking where divergence starts")
    g.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    g.add_argument("--progress", action="store_true", help="progress bar on stderr even when not a TTY")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 (passed), 1 (a check failed) or 2 (bad input: one line on stderr, never a traceback)."""
    return guarded(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    if args.batch < 1 or args.samples < 1 or (args.limit is not None and args.limit < 1):
        raise InputError("--batch, --samples and --limit must be positive")
    if args.json:
        check_output_path(args.json)
    model = load_onnx(args.model)
    fq = load_onnx(reference_path(args.reference)) if args.reference else None
    fp32 = load_onnx(reference_path(args.fp32, fp32=True)) if args.fp32 else None
    v = Validation(args)
    v.run(model, fq, fp32)
    code = 0 if v.passed else 1
    print(v.render(args.model))
    if args.json:
        with atomic_output(args.json) as tmp, open(tmp, "w") as f:
            json.dump(v.as_json(args.model, code), f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
