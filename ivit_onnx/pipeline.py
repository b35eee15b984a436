"""The pass pipeline: an ordered, user-editable list of passes over one onnx-graphsurgeon graph.

A pass says what it requires and guarantees, returns whether it changed the graph, and counts what it
rewrote in ``ctx.counts``; the report is built from those counts. Users reorder, extend or stop early::

    p = Pipeline.default()
    p.insert_after("fuse_gelu", MyPass())
    model, report = p.run("fq.onnx", stop_after="lower_integer")
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from . import qparams
from .errors import ConversionError, one_line
from .io import atomic_output, default_opset, ensure_opset, fold_quantized_weights, load_model, skeleton

#: the integer kernel choices of each nonlinear op, the default first (names of ``qparams.KERNELS``, the one
#: table of kernel choices: I-ViT's Shiftmax / ShiftGELU / I-LayerNorm, then the paper's ablation kernels)
KERNELS: dict[str, tuple[str, ...]] = {op: tuple(choices) for op, choices in qparams.KERNELS.items()}


@dataclass
class Options:
    """Conversion settings; each has an ``ivit-onnx rewrite`` flag (``scale_table``: ``--scales``,
    ``input_shapes``: ``--shape``)."""

    allow_float: bool = False  #: keep unconvertible regions as DQ → float → Q instead of failing
    gelu_bits: int = 15  #: fraction bits of ShiftGELU's sigmoid (IBertGELU's Phi)
    ln_fraction_bits: int = 30  #: ILayerNorm's (L1LayerNorm's) p
    #: finest exp grid (IBertGELU: erf's clip point): inputs coarser than 1/min_x0 are upscaled exactly first
    min_x0: int = 1024
    max_row: int = 4096  #: row length assumed for Shiftmax overflow proofs when the shape is dynamic
    scale_table: bool = False  #: put the per-tensor scale table in the report
    #: input name -> shape to convert for (ints; a str keeps that dimension symbolic, e.g. the batch);
    #: shape-derived subgraphs fold into constants (``--shape``)
    input_shapes: dict[str, list[int | str]] | None = None
    softmax: str = KERNELS["softmax"][0]  #: Softmax's integer kernel (:data:`KERNELS`)
    gelu: str = KERNELS["gelu"][0]  #: GELU's integer kernel
    layernorm: str = KERNELS["layernorm"][0]  #: LayerNorm's integer kernel

    def __post_init__(self):
        for op, choices in KERNELS.items():
            if getattr(self, op) not in choices:
                raise ConversionError(f"--{op} {getattr(self, op)!r}: choose one of {', '.join(choices)}")


@dataclass
class Context:
    """What passes share: the graph, the options, and the counters/notes the report is built from."""

    graph: gs.Graph
    opset: int
    options: Options
    counts: dict[str, Counter] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    opset_imports: dict[str, int] = field(default_factory=dict)
    functions: list = field(default_factory=list)
    ir_version: int = 10
    metadata: dict[str, str] = field(default_factory=dict)
    where: str = ""  #: the node a pass is working on, for error messages (set by passes that walk nodes)

    def count(self, pass_name: str, key: str, n: int = 1) -> None:
        self.counts.setdefault(pass_name, Counter())[key] += n


class Pass:
    """Base class: subclasses set ``name``/``requires``/``guarantees`` and implement ``run``."""

    name = "pass"
    requires: tuple[str, ...] = ()
    guarantees: tuple[str, ...] = ()

    def run(self, ctx: Context) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class Report:
    """What a conversion did: counts per pass, integer MAC share, float islands, dyadic error, scales."""

    counts: dict[str, dict[str, int]]
    notes: dict[str, Any]
    passes_run: list[str]
    #: wall seconds per pass (kept out of ``to_dict``: the report's JSON stays the same run to run)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"passes": self.passes_run, "counts": self.counts, **self.notes}

    def to_json(self, path) -> None:
        with atomic_output(path) as tmp, open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True, default=float)
            f.write("\n")

    def summary(self) -> str:
        """Human-readable lines for the CLI."""
        lines = []
        conv = self.counts.get("lower_integer", {})
        if conv:
            lines.append("converted: " + ", ".join(f"{k} {v}" for k, v in sorted(conv.items())))
        for name in self.passes_run:  # every other pass that counted something, the user's too
            if name != "lower_integer" and self.counts.get(name):
                lines.append(
                    f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts[name].items()))
                )
        n = self.notes
        if "integer_mac_percent" in n:
            lines.append(f"integer MACs: {n['integer_mac_percent']:.2f}% of {n['total_macs']:,}")
        if "max_dyadic_rel_error" in n:
            lines.append(f"largest dyadic error: {n['max_dyadic_rel_error']:.3g} (relative)")
        islands, why = n.get("float_islands", []), n.get("float_island_reasons", {})
        named = [f"{i}: {why[i]}" if i in why else i for i in islands]
        lines.append(f"float islands: {len(islands)}" + ("" if not islands else " — " + "; ".join(named)))
        declined = {k: v for k, v in n.get("declined", {}).items() if k not in why}
        if declined:  # fusions that did not fire, and why (the island they leave names its own reason)
            lines.append("declined: " + "; ".join(f"{k}: {v}" for k, v in sorted(declined.items())))
        return "\n".join(lines)


class Pipeline:
    """An ordered list of passes; run it on a model path or ModelProto."""

    def __init__(self, passes: list[Pass]):
        self.passes = list(passes)

    @classmethod
    def default(cls) -> Pipeline:
        from .passes import default_passes

        return cls(default_passes())

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def _index(self, name: str) -> int:
        if name not in self.names:
            raise KeyError(f"no pass named {name!r}; passes: {', '.join(self.names)}")
        return self.names.index(name)

    def insert_after(self, name: str, p: Pass) -> None:
        self.passes.insert(self._index(name) + 1, p)

    def insert_before(self, name: str, p: Pass) -> None:
        self.passes.insert(self._index(name), p)

    def replace(self, name: str, p: Pass) -> None:
        self.passes[self._index(name)] = p

    def remove(self, name: str) -> None:
        del self.passes[self._index(name)]

    def run(self, model, options: Options | None = None, stop_after: str | None = None, base_dir=None):
        """Run the passes in order; returns ``(ModelProto, Report)``.

        ``base_dir``: where a ModelProto's external data files are (default: the current folder).
        Every failure is a :class:`ConversionError` naming the pass and node (the input's own faults with
        their specific message; anything else as an internal error of that pass, still one line).
        """
        if stop_after is not None and stop_after not in self.names:
            passes = ", ".join(self.names)
            raise ConversionError(f"--stop-after {stop_after!r}: no such pass; passes: {passes}")
        proto = load_model(model, base_dir)
        try:
            proto = fold_quantized_weights(ensure_opset(proto))
        except (ConversionError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - malformed weights or quantization parameters
            raise ConversionError(f"cannot fold the quantized weights: {one_line(e)}") from None
        try:  # shapes and dtypes on every edge (rules need row lengths and element types), weights left out
            inferred = onnx.shape_inference.infer_shapes(skeleton(proto), strict_mode=False)
        except Exception as e:  # noqa: BLE001 - InferenceError, ValidationError, RuntimeError
            raise ConversionError(f"shape inference failed: {one_line(e)}") from None
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(inferred.graph.value_info)
        opset = default_opset(proto)
        try:
            graph = gs.import_onnx(proto)
            _own_values(graph)
        except Exception as e:  # noqa: BLE001 - graphsurgeon raises many types on malformed graphs
            raise ConversionError(f"cannot read the graph: {one_line(e)}") from None
        graph.import_domains = [_copy(d) for d in proto.opset_import]  # gs kept the file's own list
        ctx = Context(
            graph,
            opset,
            options or Options(),
            opset_imports={i.domain: i.version for i in proto.opset_import},
            functions=[_copy(f) for f in proto.functions],
            ir_version=proto.ir_version,
        )
        del proto, inferred
        ran, seconds = [], {}
        for p in self.passes:
            missing = [r for r in p.requires if r not in _guaranteed(self.passes[: len(ran)])]
            if missing:
                raise ConversionError(f"pass {p.name} requires {missing}, which no earlier pass guarantees")
            start = time.perf_counter()
            _run_pass(p, ctx)
            seconds[p.name] = seconds.get(p.name, 0.0) + time.perf_counter() - start
            ran.append(p.name)
            if p.name == stop_after:
                break
        try:
            out = gs.export_onnx(ctx.graph, do_type_check=False)
        except Exception as e:  # noqa: BLE001
            last = ran[-1] if ran else "-"
            raise ConversionError(f"cannot write the graph after pass {last}: {one_line(e)}") from None
        out.ir_version = ctx.ir_version
        del out.opset_import[:]
        out.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in sorted(ctx.opset_imports.items()))
        del out.functions[:]
        out.functions.extend(ctx.functions)
        out.producer_name, out.producer_version = "ivit-onnx", _version()
        for k, v in sorted(ctx.metadata.items()):
            out.metadata_props.add(key=k, value=v)
        return out, Report({k: dict(v) for k, v in ctx.counts.items()}, dict(ctx.notes), ran, seconds)


def _run_pass(p: Pass, ctx: Context) -> None:
    """Run one pass; an unexpected exception becomes a one-line :class:`ConversionError` naming the pass
    and the node it was on (malformed input that no specific check caught)."""
    ctx.where = ""
    try:
        p.run(ctx)
    except (ConversionError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - the one place that turns any failure into one line
        at = f" at node '{ctx.where}'" if ctx.where else ""
        raise ConversionError(f"pass {p.name}{at}: cannot handle this graph ({one_line(e)})") from e


def _own_values(graph: gs.Graph) -> None:
    """Load every lazily-referenced constant into its own array, so the parsed file can be freed (protobuf
    arenas free a message's weights only when nothing points into it)."""
    consts = [t for t in graph.tensors().values() if isinstance(t, gs.Constant)]
    consts += [v for n in graph.nodes for v in n.attrs.values() if isinstance(v, gs.Constant)]
    for t in consts:
        if not isinstance(t.values, np.ndarray):
            t.values = np.asarray(t.values.load())


def _copy(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _guaranteed(passes: list[Pass]) -> set[str]:
    return {g for p in passes for g in p.guarantees}


def _version() -> str:
    from . import __version__

    return __version__
