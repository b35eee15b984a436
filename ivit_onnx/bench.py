"""The one timing engine: ``ivit-onnx bench`` and the benchmarks time every engine and peer through it.

:func:`bench` takes named candidates (zero-argument callables running one batch, runners run on ``feeds``,
or :class:`Candidate` objects with an untimed ``prepare``), prepares each, runs ``warmup`` untimed rounds and
then ``iters`` timed rounds, every candidate once per round, interleaved so that all see the same machine
state (in the spirit of trtexec and OpenVINO's benchmark_app; a ``[bench] round 3/10`` progress line on
stderr). Each row reports the median and p90 time per batch (p90: linear interpolation between order
statistics, numpy's default), the throughput ``batch / median`` in samples/s, and the ratio of its median
to the baseline row's (the FP32 onnxruntime row: ``time/fp32`` below 1 is faster than FP32).

A :class:`Report` adds the device header (:func:`ivit_onnx.cpu.describe`, cores, threads, library
versions), notes (skipped peers, compile times) and the exactness verdicts: each integer engine's outputs
compared bit for bit with the function bodies' (stock onnxruntime, run once, not timed).

Peers (:func:`ort_peer`, :func:`openvino_peer`): onnxruntime FP32 on the float model; OpenVINO FP32 on the
float model and OpenVINO on the fake-quant QDQ model (its int8 path), each with the same thread count.
The ``ivit-onnx bench`` command itself is :func:`main`; its engines come from :func:`_engine_runner`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from . import cpu
from .errors import ConversionError, one_line

#: the baseline row's name (onnxruntime FP32 on the float model)
FP32_ORT = "fp32: onnxruntime"


# ---------------------------------------------------------------- the device


def physical_cores() -> int:
    """Physical cores (distinct ``physical id``/``core id`` pairs in ``/proc/cpuinfo``), else logical CPUs."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return os.cpu_count() or 1
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = value.strip()
        elif key == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or os.cpu_count() or 1


def _version(module: str) -> str | None:
    """A package's version if it is importable, else None."""
    try:
        mod = __import__(module)
    except Exception:  # noqa: BLE001 - ImportError, or a broken install: reported as missing
        return None
    return str(getattr(mod, "__version__", "?")).split("-")[0]


def device(threads: int | None, packages: tuple[str, ...] = ("onnxruntime", "openvino")) -> dict:
    """What the numbers were measured on: CPU (model and ISA), cores, threads, library versions."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return {"cpu": cpu.describe(), "cores": physical_cores(), "logical_cpus": os.cpu_count() or 1,
            "usable_cpus": usable, "threads": threads,
            "versions": {p: v for p in packages if (v := _version(p)) is not None}}


def device_line(dev: dict) -> str:
    """``device: <cpu.describe()>; 2 cores, 2 logical CPUs, 1 thread; onnxruntime 1.31.1, ...``."""
    threads = dev["threads"]
    tline = "default threads" if threads is None else f"{threads} thread{'s' if threads != 1 else ''}"
    cpus = f"{dev['cores']} cores, {dev['logical_cpus']} logical CPUs"
    if dev["usable_cpus"] != dev["logical_cpus"]:
        cpus += f" ({dev['usable_cpus']} usable)"
    versions = ", ".join(f"{k} {v}" for k, v in dev["versions"].items())
    return f"device: {dev['cpu']}; {cpus}, {tline}; {versions}"


# ---------------------------------------------------------------- statistics


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Row:
    """One candidate's timings (seconds per batch) and what is derived from them."""

    name: str
    times: list[float]
    batch: int
    ratio: float | None = None  # median / the baseline's median
    detail: str = ""

    @property
    def median_ms(self) -> float:
        return 1e3 * percentile(self.times, 50)

    @property
    def p90_ms(self) -> float:
        return 1e3 * percentile(self.times, 90)

    @property
    def throughput(self) -> float:
        """Samples per second at the median time per batch."""
        med = percentile(self.times, 50)
        return self.batch / med if med > 0 else math.inf

    def to_dict(self) -> dict:
        return {"name": self.name, "median_ms": self.median_ms, "p90_ms": self.p90_ms,
                "throughput": self.throughput, "time_ratio": self.ratio, "detail": self.detail,
                "times_ms": [1e3 * t for t in self.times]}


def summarize(times: Mapping[str, list[float]], batch: int, baseline: str | None = None,
              details: Mapping[str, str] | None = None) -> list[Row]:
    """Rows in ``times``' order, each with its ratio to ``baseline``'s median (None without a baseline)."""
    rows = [Row(name, list(ts), batch, detail=(details or {}).get(name, "")) for name, ts in times.items()]
    base = next((r for r in rows if r.name == baseline), None)
    for r in rows:
        if base is not None and base.median_ms > 0:
            r.ratio = r.median_ms / base.median_ms
    return rows


# ---------------------------------------------------------------- timing


@dataclass
class Candidate:
    """What is timed: ``run`` runs one batch; ``prepare`` (untimed) builds sessions or compiles first."""

    run: Callable[[], Any]
    prepare: Callable[[], Any] | None = None
    detail: str = ""


def candidate(obj, feeds: Mapping[str, np.ndarray] | None = None) -> Candidate:
    """A :class:`Candidate` from a Candidate, a runner (anything with ``run(feeds)``; its ``prepare()`` is
    called untimed) or a zero-argument callable."""
    if isinstance(obj, Candidate):
        return obj
    if hasattr(obj, "run") and not callable(obj):
        if feeds is None:
            raise ValueError("a runner candidate needs feeds")
        return Candidate(lambda: obj.run(feeds), getattr(obj, "prepare", None))
    if callable(obj):
        return Candidate(obj)
    raise TypeError(f"not a benchmark candidate: {obj!r}")


def _progress_rounds(total: int, lines: int = 10) -> set[int]:
    """The (1-based) rounds that print a progress line: about ``lines`` of them, the last always."""
    step = max(1, math.ceil(total / lines))
    return {r for r in range(1, total + 1) if r % step == 0} | {total}


def measure(candidates: Mapping[str, Callable[[], Any]], iters: int, warmup: int = 0,
            clock: Callable[[], float] = time.perf_counter,
            progress: TextIO | None = None) -> dict[str, list[float]]:
    """Seconds per call of each candidate: ``warmup`` untimed rounds, then ``iters`` timed ones, each round
    calling every candidate once in order (interleaved). ``clock`` is read before and after each call."""
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0 (got {iters}, {warmup})")
    times: dict[str, list[float]] = {k: [] for k in candidates}
    say = _printer(progress)
    shown_warm, shown = _progress_rounds(warmup, 3) if warmup else set(), _progress_rounds(iters)
    for r in range(warmup + iters):
        timed = r >= warmup
        for name, fn in candidates.items():
            t0 = clock()
            fn()
            t1 = clock()
            if timed:
                times[name].append(t1 - t0)
        if not timed and r + 1 in shown_warm:
            say(f"warm-up {r + 1}/{warmup}")
        elif timed and r + 1 - warmup in shown:
            say(f"round {r + 1 - warmup}/{iters}")
    return times


def _printer(stream: TextIO | None) -> Callable[[str], None]:
    def say(text: str) -> None:
        if stream is not None:
            print(f"[bench] {text}", file=stream, flush=True)

    return say


# ---------------------------------------------------------------- the report


@dataclass
class Report:
    """The table, its header and the lines under it; ``text()`` for people, ``to_dict()`` for JSON."""

    device: dict
    batch: int
    iters: int
    warmup: int
    rows: list[Row]
    baseline: str | None = None
    title: str = ""
    notes: list[str] = field(default_factory=list)  # "skipped ..." and other one-line remarks
    exact: dict[str, bool] = field(default_factory=dict)  # engine -> bit-identical to the function bodies
    compile_s: dict[str, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # anything else for the JSON (model paths, ...)

    @property
    def all_exact(self) -> bool:
        return all(self.exact.values())

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def text(self, device: bool = True) -> str:
        """The report for people; ``device=False`` leaves out the device line (printed once above)."""
        width = max([len("name"), *(len(r.name) for r in self.rows)]) + 2
        rounds = f"{self.iters} round{'s' if self.iters != 1 else ''}"
        warm = f"{self.warmup} warm-up round{'s' if self.warmup != 1 else ''}"
        lines = [self.title] if self.title else []
        lines += [device_line(self.device)] if device else []
        lines += [f"batch {self.batch}; {rounds} after {warm}, candidates interleaved; "
                  f"time/fp32 = median / median of {self.baseline or '(no baseline)'}",
                  f"{'name':<{width}}{'median ms':>11}{'p90 ms':>11}{'samples/s':>12}{'time/fp32':>11}"]
        for r in self.rows:
            ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
            lines.append(f"{r.name:<{width}}{r.median_ms:>11.3f}{r.p90_ms:>11.3f}{r.throughput:>12.1f}"
                         f"{ratio:>11}")
        lines += [f"{r.name}: {r.detail}" for r in self.rows if r.detail]
        lines += [f"compile: {k} {v:.1f} s (untimed, batch {self.batch})" for k, v in self.compile_s.items()]
        lines += self.notes
        lines += [f"exact: {k} == function bodies: {'yes' if ok else 'no'}" for k, ok in self.exact.items()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"device": self.device, "batch": self.batch, "iters": self.iters, "warmup": self.warmup,
                "baseline": self.baseline, "rows": [r.to_dict() for r in self.rows], "notes": self.notes,
                "exact": self.exact, "compile_s": self.compile_s, **self.info}

    def write_json(self, path) -> None:
        from .io import atomic_output

        with atomic_output(path) as tmp, open(tmp, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2) + "\n")


def bench(candidates: Mapping[str, Any], *, batch: int, iters: int, warmup: int = 2,
          feeds: Mapping[str, np.ndarray] | None = None, baseline: str | None = None,
          threads: int | None = None, clock: Callable[[], float] = time.perf_counter,
          progress: TextIO | None | str = "stderr", title: str = "", dev: dict | None = None) -> Report:
    """Prepare every candidate (untimed), time them interleaved (:func:`measure`) and summarize.

    ``candidates``: name -> :class:`Candidate`, runner (run on ``feeds``) or zero-argument callable, in
    row order. ``baseline``: the row the ratios divide by. ``dev``: the device header (default
    :func:`device` with ``threads``). ``progress``: a stream, None for none, or "stderr": ``sys.stderr`` as it
    is when called (a default bound at import would keep a stream that was replaced since)."""
    progress = sys.stderr if progress == "stderr" else progress
    cands = {name: candidate(c, feeds) for name, c in candidates.items()}
    say = _printer(progress)
    notes = []
    for name, c in list(cands.items()):
        if c.prepare is not None:
            say(f"preparing {name}")
            try:
                c.prepare()
            except PeerUnavailable as e:  # a peer that cannot run here: a note, not a failure
                notes.append(f"skipped: {name}: {e}")
                del cands[name]
    times = measure({k: c.run for k, c in cands.items()}, iters, warmup, clock, progress)
    rows = summarize(times, batch, baseline, {k: c.detail for k, c in cands.items()})
    return Report(dev if dev is not None else device(threads), batch, iters, warmup, rows,
                  baseline if baseline in times else None, title, notes)


# ---------------------------------------------------------------- exactness


def as_list(outputs, names: list[str]) -> list[np.ndarray]:
    """Outputs in graph-output order, from a dict by name or a sequence."""
    if isinstance(outputs, Mapping):
        return [np.asarray(outputs[n]) for n in names]
    if isinstance(outputs, np.ndarray) or hasattr(outputs, "numpy"):
        outputs = [outputs]
    return [np.asarray(o.numpy() if hasattr(o, "numpy") else o) for o in outputs]


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Whether two output lists are identical: count, dtypes, shapes and every bit."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.tobytes() != y.tobytes():
            return False
    return True


# ---------------------------------------------------------------- peers


class PeerUnavailable(Exception):
    """A peer that cannot run here (its package is missing, or it refused the model); one line."""


def ort_peer(model, threads: int | None, feeds: Mapping[str, np.ndarray]) -> Candidate:
    """Stock onnxruntime on a float (FP32 or fake-quant) model, as :class:`ivit_onnx.runners.OrtRunner`."""
    from .runners import OrtRunner

    runner = OrtRunner(model, "onnxruntime", threads)
    return Candidate(lambda: runner.run(feeds), runner.prepare)


def openvino_peer(path, threads: int | None, feeds: Mapping[str, np.ndarray],
                  int8: bool = False) -> Candidate:
    """OpenVINO on the CPU for the ONNX file ``path`` (dynamic dimensions reshaped to ``feeds``'), FP32
    inference precision, latency hint, ``INFERENCE_NUM_THREADS`` = ``threads``. ``int8``: the model is a QDQ
    one; the detail counts the ops OpenVINO runs in 8 bits (0 means it ran the model in float).
    Its ``prepare`` raises :class:`PeerUnavailable` when openvino is not installed or cannot compile the
    model (:func:`bench` then skips it with a note)."""
    state: dict = {}

    def prepare() -> None:
        try:
            import openvino as ov
        except ImportError:
            import platform

            why = ("the bench extra skips it on Linux aarch64, where its wheel needs glibc 2.35"
                   if platform.machine() == "aarch64" else "pip install 'openvino==2026.4.*'")
            raise PeerUnavailable(f"openvino is not installed ({why})") from None
        try:
            core = ov.Core()
            model = core.read_model(str(path))
            shapes = {}
            for inp in model.inputs:
                name = inp.get_any_name()
                if inp.get_partial_shape().is_dynamic and name in feeds:
                    shapes[name] = ov.PartialShape(list(feeds[name].shape))
            if shapes:
                model.reshape(shapes)
            config: dict = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
            if threads:
                config["INFERENCE_NUM_THREADS"] = threads
            compiled = core.compile_model(model, "CPU", config)
        except Exception as e:  # noqa: BLE001 - OpenVINO raises RuntimeError and its own types
            raise PeerUnavailable(f"openvino cannot run {path} ({one_line(e)})") from None
        state["request"] = compiled.create_infer_request()
        if int8:
            n = 0
            for op in compiled.get_runtime_model().get_ops():
                info = op.get_rt_info()
                prec = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else ""
                n += prec in ("i8", "u8")
            c.detail = (f"{n} ops run in int8 (openvino {ov.__version__.split('-')[0]})" if n else
                        "no int8 ops: OpenVINO ran the QDQ model in float")

    inputs = dict(feeds)

    def run():
        return state["request"].infer(inputs)

    c = Candidate(run, prepare)
    return c


# ---------------------------------------------------------------- the ivit-onnx bench command


class _EngineRunner:
    """An engine of the registry (:data:`ivit_onnx.engines.ENGINES`) on the integer model: its session built
    (and, for the engines that compile, compiled and timed) in ``prepare``."""

    def __init__(self, engine, model, threads: int | None):
        engine.require(f"--engines {engine.name}")
        self.engine, self.model, self.threads, self.session = engine, model, threads, None
        self.label, self.exact_label, self.compile = engine.bench_label, engine.exact_label, engine.compiles
        self.compile_s: float | None = None
        self.detail = ""

    def prepare(self, feeds) -> None:
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        self.session = self.engine.session(self.model, self.threads, shapes)
        if self.compile:
            self.compile_s = getattr(self.session, "compile_s", None)
        describe = getattr(self.session, "describe", None)
        self.detail = describe() if describe is not None else ""

    def run(self, feeds):
        return self.session.run(None, feeds)


class _ArtifactEngine:
    """A saved onnxruntime artifact (``ivit-onnx compile -o X.onnx``) in the engine's session, as a user loads
    it: its row sits beside the engine compiled in memory, its bits are checked like every engine's."""

    exact_label, compile = "artifact", False

    def __init__(self, path: str, threads: int | None):
        from .engines.onnxruntime import is_artifact
        from .io import load_model

        model = load_model(path)
        if not is_artifact(model):
            raise ConversionError(f"--artifact {path}: not an onnxruntime artifact (write one with "
                                  "'ivit-onnx compile int.onnx -o int.ort.onnx')")
        self.label = f"int: onnxruntime ({os.path.basename(path)})"
        self.model, self.threads, self.session = model, threads, None
        self.compile_s: float | None = None
        self.detail = ""

    def prepare(self, feeds) -> None:
        from .engines import ENGINES

        self.session = ENGINES["onnxruntime"].load(self.model, self.threads)
        self.detail = self.session.describe()

    def run(self, feeds):
        return self.session.run(None, feeds)


def _engine_runner(name: str, model, threads: int | None):
    """The engine behind ``--engines NAME`` for the integer ``model``: an object with ``label`` (its row),
    ``exact_label`` (its exactness line), ``compile`` (whether preparing it compiles), ``prepare(feeds)``
    (untimed: sessions, compilation; may set ``compile_s`` and ``detail``) and ``run(feeds)`` (outputs by
    name or in graph-output order)."""
    from .engines import ENGINES

    if name not in ENGINES:
        raise ConversionError(f"--engines {name}: unknown engine; choose from {', '.join(ENGINES)}")
    return _EngineRunner(ENGINES[name], model, threads)


def parse_engines(text: str) -> list[str]:
    """``onnxruntime,tvm`` -> the engine names, checked, in the given order without repeats."""
    from .engines import ENGINES

    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in ENGINES]
    choose = f"choose from {', '.join(ENGINES)}"
    if not names:
        raise ConversionError(f"--engines {text!r}: no engine named; {choose}")
    if bad:
        raise ConversionError(f"--engines {text!r}: unknown engine {bad[0]!r}; {choose}")
    return names


def make_feeds(model, batch: int, where: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs (N(0,1) floats, uniform integers) of the model's input shapes, the batch (first)
    dimension set to ``batch``; a fixed batch dimension must equal it."""
    from .inputs import InputSpec, input_specs, random_dataset

    specs = []
    for s in input_specs(model):
        if not s.shape:
            raise ConversionError(f"{where}: input {s.describe()} is a scalar; it has no batch dimension")
        if s.shape[0] is not None and s.shape[0] != batch:
            raise ConversionError(f"{where}: input {s.describe()} has a fixed batch of {s.shape[0]}; "
                                  f"use --batch {s.shape[0]}")
        specs.append(InputSpec(s.name, s.dtype, (batch, *s.shape[1:])))
    try:
        return random_dataset(specs, batch, seed).get(0, batch)
    except ConversionError as e:
        raise ConversionError(f"{where}: {e}") from None


def _shared_feeds(model, batch: int, where: str, base: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A peer model's feeds: the integer model's arrays where name, shape and dtype agree, else its own."""
    own = make_feeds(model, batch, where)
    return {k: base[k] if k in base and base[k].shape == v.shape and base[k].dtype == v.dtype else v
            for k, v in own.items()}


def _load(arg: str, fp32: bool = False):
    from .io import load_model
    from .models.bundled import resolve

    path = resolve(arg, fp32=fp32)
    return path, load_model(path)


def _int_model(arg: str):
    """The integer model: a file, or ``digits`` (the bundled fake-quant digits ViT converted now)."""
    from .models.bundled import ALIAS, resolve

    if arg == ALIAS and not os.path.exists(arg):
        from .rewrite import rewrite

        model, _ = rewrite(resolve(arg))
        return f"{ALIAS} (the bundled digits ViT, converted now)", model
    from .opset import DOMAIN

    path, model = _load(arg)
    integer = {"MatMulInteger", "ConvInteger"}
    if not any(n.domain == DOMAIN or n.op_type in integer for n in model.graph.node):
        raise ConversionError(f"{path}: not an integer model (no {DOMAIN} ops, no integer GEMMs); convert "
                              "it with 'ivit-onnx rewrite' first, or give it as --fp32 / --fake-quant")
    return path, model


def main(args) -> int:
    """``ivit-onnx bench``: exit 0, or 1 when an integer engine's outputs differ from the function bodies'
    (bad input raises :class:`ConversionError`: one line, exit 2)."""
    from .io import check_output_path
    from .runners import OrtRunner

    engines = parse_engines(args.engines)
    if args.json:
        check_output_path(args.json)
    threads = args.threads or physical_cores()
    int_where, model = _int_model(args.model)
    fp32 = _load(args.fp32, fp32=True) if args.fp32 else None
    fq = _load(args.fake_quant) if args.fake_quant else None
    feeds = make_feeds(model, args.batch, args.model)
    out_names = [o.name for o in model.graph.output]
    say = _printer(sys.stderr)

    runners = [_engine_runner(name, model, threads) for name in engines]
    if getattr(args, "artifact", None):
        runners.append(_ArtifactEngine(args.artifact, threads))
    candidates: dict[str, Candidate] = {}
    compile_s: dict[str, float] = {}
    for eng in runners:
        say(f"preparing {eng.label}" + (" (compiling: minutes on a large model)" if eng.compile else ""))
        eng.prepare(feeds)
        if eng.compile_s is not None:
            compile_s[eng.exact_label] = eng.compile_s
        candidates[eng.label] = Candidate(lambda e=eng: e.run(feeds), detail=eng.detail)

    notes: list[str] = []
    if fp32 is not None:
        fp32_feeds = _shared_feeds(fp32[1], args.batch, args.fp32, feeds)
        candidates[FP32_ORT] = ort_peer(fp32[1], threads, fp32_feeds)
        candidates["fp32: openvino"] = openvino_peer(fp32[0], threads, fp32_feeds)
    else:
        notes.append("skipped: fp32: onnxruntime, fp32: openvino: no --fp32 model given")
    if fq is not None:
        fq_feeds = _shared_feeds(fq[1], args.batch, args.fake_quant, feeds)
        candidates["qdq: openvino"] = openvino_peer(fq[0], threads, fq_feeds, int8=True)
    else:
        notes.append("skipped: qdq: openvino: no --fake-quant model given")

    title = (f"ivit-onnx bench: {int_where}" + (f"; fp32 {fp32[0]}" if fp32 else "")
             + (f"; fake-quant {fq[0]}" if fq else ""))
    dev = device(threads, ("onnxruntime", "openvino", *(["tvm"] if "tvm" in engines else [])))
    report = bench(candidates, batch=args.batch, iters=args.iters, warmup=args.warmup, baseline=FP32_ORT,
                   title=title, dev=dev)
    report.notes += notes
    report.compile_s.update(compile_s)

    say("exactness: one untimed run of the function bodies")
    bodies = as_list(OrtRunner(model, "functions", threads).run(feeds), out_names)
    for eng in runners:
        report.exact[eng.exact_label] = same_bits(as_list(eng.run(feeds), out_names), bodies)
    report.info["models"] = {"int": int_where, "fp32": fp32[0] if fp32 else None,
                             "fake_quant": fq[0] if fq else None}
    print(report.text())
    if args.json:
        report.write_json(args.json)
    return 0 if report.all_exact else 1


__all__ = ["Candidate", "PeerUnavailable", "Report", "Row", "as_list", "bench", "candidate", "device",
           "device_line", "main", "make_feeds", "measure", "openvino_peer", "ort_peer", "percentile",
           "same_bits", "summarize"]
