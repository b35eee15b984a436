"""The runs of a validation: every backend and reference over the data in batches, the bit-exact
cross-checks between backends (locating the first differing tensor), the metrics and per-layer rows."""

from __future__ import annotations

import sys
import time

import numpy as np
import onnx

from .. import compare
from ..errors import one_line
from ..inputs import input_specs, load_dataset
from ..runners import OrtRunner, Runner, make_runner, node_outputs, producers
from .checks import check_certificate, check_onnx, check_opset
from .metrics import comparison_table, fake_quant_checks
from .options import ValidateOptions
from .result import FAILED, PASSED, SKIPPED, WARNING, Check, Result


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


class Session:
    """One validation: the static checks, the runs of every backend and reference over the data, the
    bit-exact cross-checks, the metrics and the per-layer comparison, collected in a :class:`Result`."""

    def __init__(self, opts: ValidateOptions):
        self.opts = opts
        self.result = Result(opts.model)
        self.checks, self.info = self.result.checks, self.result.info
        self.runners: dict[str, Runner] = {}
        self.refs: dict[str, Runner] = {}

    def run(self, model: onnx.ModelProto, fq: onnx.ModelProto | None, fp32: onnx.ModelProto | None) -> Result:
        """Every check, in order: static checks, the runs over the data, cross-checks, metrics, per-layer."""
        a = self.opts
        specs = input_specs(model)
        fixed = specs[0].shape[0] if specs and specs[0].shape else None
        data = load_dataset(a.data, specs, a.samples, a.seed, a.preprocess, a.limit)
        self.checks.append(check_onnx(model))
        opset_checks = check_opset(model)
        self.checks += opset_checks
        self.checks.append(check_certificate(model))
        self.info.update(
            inputs=data.description,
            samples=data.count,
            batch=fixed or a.batch,
            input_specs=[s.describe() for s in specs],
            backends=a.backends,
        )
        if any(c.status == FAILED for c in opset_checks):  # malformed private ops can abort the process
            self.checks.append(Check("runs", SKIPPED, "not run: the private opset check failed"))
            return self.result
        try:
            self.tmap = compare.tensor_map(model)
        except (ValueError, TypeError) as e:  # damaged metadata: the per-tensor comparisons are lost
            self.tmap = {}
            self.checks.append(Check("tensor map (metadata)", WARNING, f"unreadable: {one_line(e)}"))
        # u8_gemm None: the runner's default (re-encode for the library only); --int8-gemm: never
        factory = lambda b, m, t: make_runner(b, m, t, u8_gemm=False if a.int8_gemm else None)  # noqa: E731
        self.runners = self._start([(b, factory, model) for b in a.backends])
        notes = {b: r.describe() for b, r in self.runners.items()}
        self.info["backend_notes"] = {b: note for b, note in notes.items() if note}
        self.refs = self._start(
            [
                (label, lambda _b, m, t: OrtRunner(m, "onnxruntime", t), m)
                for label, m in (("fake-quant", fq), ("fp32", fp32))
                if m is not None
            ]
        )
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
        if a.per_op and first_feeds is not None:
            self._per_op(model, first_feeds)
        self.result.comparisons = comparison_table(self.stats)
        self.checks += fake_quant_checks(self.stats.get("fake-quant"), a)
        self.result.accuracy = {k: v.as_dict() for k, v in self.acc.items() if v.samples}
        return self.result

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
                self.info.setdefault("run_errors", {})[name] = one_line(e)
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
                r = factory(label, m, self.opts.threads)
                r.prepare()
                out[label] = r
            except Exception as e:  # noqa: BLE001 - session creation failures are failed checks
                what = f"run: {label}" if label in self.opts.backends else f"load reference: {label}"
                self.checks.append(Check(what, FAILED, one_line(e)))
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
            return f"(could not expose intermediates: {one_line(e)})"
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
        self.result.per_layer = compare.per_layer(model, values, fq_values, tmap, self.opts.min_cosine)
        self.info["per_layer_unmatched"] = len(tmap) - len(self.result.per_layer)

    def _per_op(self, model: onnx.ModelProto, feeds: dict) -> None:
        """Each approximating kernel's own error on the fake-quant model's integers (``per_op``)."""
        from .per_op import kernels, needed, per_op, summary

        label, fq_runner = "per-op vs fake-quant", self.refs.get("fake-quant")
        if not self.tmap:
            self.checks.append(Check(label, SKIPPED, "no ivit_onnx.tensor_map"))
            return
        if fq_runner is None or "fake-quant" in self.failed:
            self.checks.append(Check(label, SKIPPED, "needs --reference FQ.onnx"))
            return
        fq_feeds = _feeds_for(fq_runner, feeds)
        try:
            plans = kernels(model, self.tmap)
            fq_values = fq_runner.run_with(fq_feeds, needed(plans, self.tmap))
            rows, skipped = per_op(model, plans, feeds, fq_values, self.tmap)
        except Exception as e:  # noqa: BLE001 - a kernel that cannot run alone is a failed check, one line
            self.checks.append(Check(label, FAILED, one_line(e)))
            return
        self.result.per_op = rows
        worst = ", ".join(f"{op} {s['max_lsb']} LSB" for op, s in summary(rows).items())
        self.checks.append(Check(label, PASSED if rows else SKIPPED,
                                 f"{len(rows)} kernel(s); worst: {worst or '-'}", skipped))
