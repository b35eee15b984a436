"""ivit-onnx: convert fake-quant ONNX vision transformers to integer-only ONNX; validate, compile, run them.

Exit codes: 0 success, 1 a validate check failed, 2 bad input (one line on stderr starting with
``ivit-onnx: error:``, no traceback, no output file).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from .errors import ConversionError, guarded, one_line, print_error
from .models.bundled import ALIAS, resolve

#: subcommand -> (one-line help, description)
COMMANDS = {
    "rewrite": (
        "convert a fake-quant (QDQ) ONNX model to integer-only ONNX",
        (
            "Convert a fake-quant (QuantizeLinear/DequantizeLinear) ONNX vision transformer into an "
            "integer-only ONNX graph: scales fold into dyadic multipliers, MatMul/Gemm/Conv become "
            "int8 x int8 -> int32, Softmax/GELU/LayerNorm become Shiftmax/ShiftGELU/ILayerNorm of the "
            "private opset ai.ivit (with ONNX function bodies, so stock onnxruntime runs the result)."
        ),
    ),
    "compile": (
        "compile an integer model for an engine: onnxruntime (.onnx), TVM (.so) or C (.c)",
        (
            "Compile an integer-only model for one engine. onnxruntime (-o X.onnx, or --engine "
            "onnxruntime): the custom-op library's exact rewrites applied once (uint8 GEMM operands, bias "
            "fold, patch GEMM, chain fold); any onnxruntime session that registers the library runs the "
            "result fast, with the bits of the model as converted. TVM (-o X.so, or --engine tvm; needs the "
            "tvm extra): inline the private ops' function bodies, import with TVM's Relax ONNX frontend, "
            "build with tvm.compile and write a loadable library with a .json sidecar describing its "
            "inputs, outputs and target. C (-o X.c, or --engine c): self-contained integer-only C99 (X.c and "
            "X.h) for microcontrollers: fixed-width integer types, no float, no malloc, one static arena; "
            "one sample a call."
        ),
    ),
    "run": (
        "run a compiled model (.onnx, .so or .c) on an .npz of inputs (or random inputs)",
        (
            "Run a model written by 'ivit-onnx compile' (onnxruntime with the custom-op library for an "
            ".onnx; TVM llvm on this CPU or cuda on GPU 0 for a .so) on the inputs of an .npz file, keyed "
            "by input name, or on seeded random inputs; print each output's type, shape and mean, and "
            "optionally save the outputs as .npz."
        ),
    ),
    "bench": (
        "time an integer model's engines against FP32 and int8 peers",
        (
            "Time the integer model on its engines (onnxruntime with the custom-op library; TVM llvm) "
            "side by side with onnxruntime FP32 and OpenVINO FP32 on the float model (--fp32) and OpenVINO "
            "on the fake-quant QDQ model (--fake-quant, its int8 path), interleaved round by round after "
            "warm-up, on the same random batch; print median and p90 ms, samples/s and the time ratio to "
            "onnxruntime FP32, under a line naming the CPU, and check each engine's outputs bit for bit "
            "against the function bodies run by stock onnxruntime (exit 1 if they differ)."
        ),
    ),
}


def _subcommand(sub, name: str):
    """The subparser ``name`` with its help and description from :data:`COMMANDS`."""
    helptext, description = COMMANDS[name]
    return sub.add_parser(name, help=helptext, description=description)


class Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line under the common prefix (exit 2)."""

    def error(self, message: str):
        print_error(f"{self.prog}: {message} (see {self.prog} --help)")
        sys.exit(2)


def _add_rewrite(sub) -> None:
    from .pipeline import KERNELS, Options

    p = _subcommand(sub, "rewrite")
    p.add_argument("model", help=f"input QDQ .onnx file, or '{ALIAS}' for the bundled demo model")
    p.add_argument("-o", "--output", required=True, help="output .onnx path (written only on success)")
    p.add_argument(
        "--allow-float",
        action="store_true",
        help="keep regions without an integer rule as DequantizeLinear -> float -> QuantizeLinear "
        "and report them (default: stop with the list of such nodes)",
    )
    p.add_argument("--report", metavar="FILE.json", help="also write the conversion report as JSON")
    p.add_argument("--scales", action="store_true", help="include the per-tensor scale table in the report")
    p.add_argument(
        "--stop-after",
        metavar="PASS",
        help="stop after the named pass (see 'ivit-onnx passes'); the output is then an intermediate "
        "graph for inspection and may not pass the ONNX checker",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="convert for this input shape (repeatable); a name such as N keeps a dimension symbolic. "
        "Shape-derived subgraphs (Hugging Face Swin's window mask, BERT's attention mask) then fold into "
        "constants; default: the model's own shapes",
    )
    p.add_argument(
        "--external-data",
        action="store_true",
        help="write the weights to OUTPUT.data next to the model (automatic above protobuf's 2 GiB limit)",
    )
    defaults = Options()  # the flags' defaults are the API's
    for name, what in (
        ("gelu_bits", "fraction bits of ShiftGELU's sigmoid (IBertGELU's Phi)"),
        (
            "min_x0",
            "finest exp grid for Shiftmax/ShiftGELU (IBertGELU: erf's clip point; the ln 2 grid of --softmax "
            "ibert|lis, kept below twice it): inputs whose 1/scale is below this are upscaled exactly first",
        ),
        ("ln_fraction_bits", "ILayerNorm's (L1LayerNorm's) output fraction bits p"),
        ("max_row", "row length assumed for Shiftmax's overflow proof when the shape is dynamic"),
    ):
        default = getattr(defaults, name)
        p.add_argument(
            "--" + name.replace("_", "-"), type=int, default=default, help=f"{what} (default {default})"
        )
    for op, choices in KERNELS.items():
        p.add_argument(
            "--" + op,
            choices=choices,
            default=getattr(defaults, op),
            help=f"{op}'s integer kernel (default {getattr(defaults, op)}; docs/ablation.md)",
        )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")


def _run_rewrite(args) -> int:
    from .io import check_output_path
    from .pipeline import Pipeline
    from .rewrite import rewrite

    names = Pipeline.default().names
    if args.stop_after is not None and args.stop_after not in names:
        raise ConversionError(f"--stop-after {args.stop_after!r}: no such pass; passes: {', '.join(names)}")
    for path in (args.output, args.report):
        if path:
            check_output_path(path)
    _, report = rewrite(
        resolve(args.model),
        args.output,
        allow_float=args.allow_float,
        scale_table=args.scales,
        stop_after=args.stop_after,
        gelu_bits=args.gelu_bits,
        min_x0=args.min_x0,
        ln_fraction_bits=args.ln_fraction_bits,
        max_row=args.max_row,
        input_shapes=parse_shapes(args.shape, symbolic=True) or None,
        softmax=args.softmax,
        gelu=args.gelu,
        layernorm=args.layernorm,
        external_data=True if args.external_data else None,
    )
    if args.report:
        report.to_json(args.report)
    if not args.quiet:
        print(report.summary())
        print(f"wrote {args.output}")
    return 0


def _add_compile(sub) -> None:
    from .engines import ENGINES

    p = _subcommand(sub, "compile")
    p.add_argument("model", help="integer-only .onnx (from 'ivit-onnx rewrite')")
    suffixes = ", ".join(f"{e.suffix} {e.name}" for e in ENGINES.values())
    p.add_argument("-o", "--output", required=True,
                   help="the artifact: .onnx for onnxruntime, .so for TVM (its sidecar is .json), .c for C "
                   "(with its .h)")
    p.add_argument("--engine", choices=list(ENGINES), help=f"default: from the output's suffix ({suffixes})")
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="fixed input shape (repeatable); default: the model's, with a symbolic batch (first) "
        "dimension as 1; any other symbolic dimension must be given here",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    for engine in ENGINES.values():
        engine.add_arguments(p)
    r = _subcommand(sub, "run")
    r.add_argument("library", help="an artifact of 'ivit-onnx compile': .onnx (onnxruntime), .so (TVM, its "
                   ".json sidecar next to it) or .c (C, compiled on the fly); an integer .onnx as converted "
                   "runs compiled in memory")
    r.add_argument("--threads", type=int, default=None, metavar="N", help="onnxruntime intra-op threads")
    r.add_argument("--data", metavar="NPZ", help="inputs by name (default: random, seed 0)")
    r.add_argument("--out", metavar="NPZ", help="write the outputs here")


def parse_shapes(items: list[str], symbolic: bool = False) -> dict[str, list[int | str]]:
    """``--shape NAME=D0,D1,...`` values (repeatable); with ``symbolic``, a dimension that is a name (``N``,
    ``batch``, ``?``) stays symbolic."""
    shapes = {}
    for item in items:
        name, _, text = item.partition("=")
        dims = [d.strip() for d in text.split(",")]
        what = "integer or symbolic (a name)" if symbolic else "integer"
        ok = bool(name) and all(d.isdigit() and int(d) > 0 or symbolic and _symbol(d) for d in dims)
        if not ok:
            raise ConversionError(f"--shape {item!r}: expected NAME=D0,D1,... with positive {what} dims")
        shapes[name] = [int(d) if d.isdigit() else d for d in dims]
    return shapes


def _symbol(d: str) -> bool:
    return d == "?" or d.isidentifier()


def compile_shapes(model, items: list[str], where: str) -> dict[str, list[int]]:
    """Every input's static shape: ``--shape`` values, else the model's with a symbolic batch (first)
    dimension as 1; a symbolic non-batch dimension without ``--shape`` is an error naming it."""
    given = parse_shapes(items)
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    unknown = sorted(set(given) - {i.name for i in inputs})
    if unknown:
        names = ", ".join(i.name for i in inputs)
        raise ConversionError(f"--shape {unknown[0]}: the model has no input of that name (inputs: {names})")
    shapes = {}
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        model_dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
        if vi.name in given:
            want = given[vi.name]
            bad = [a != b for a, b in zip(want, model_dims, strict=False) if b is not None]
            if len(want) != len(model_dims) or any(bad):
                raise ConversionError(
                    f"--shape {vi.name}: {want} does not fit the model's input shape "
                    f"{[d if d else '?' for d in model_dims]}"
                )
            shapes[vi.name] = want
            continue
        out = []
        for k, (d, proto) in enumerate(zip(model_dims, dims, strict=True)):
            if d is None and k > 0:
                sym = f" ('{proto.dim_param}')" if proto.dim_param else ""
                example = ",".join(str(x or 1) for x in model_dims)
                raise ConversionError(
                    f"{where}: input '{vi.name}' dimension {k}{sym} is not fixed: give it "
                    f"with --shape {vi.name}={example} (your value for the ?s)"
                )
            out.append(d or 1)
        shapes[vi.name] = out
    return shapes


class Heartbeat:
    """Progress lines on stderr for a long job: each stage as it starts, and every ``period`` seconds
    the time spent so far (TVM prints nothing for minutes on a 2-core machine)."""

    def __init__(self, label: str, enabled: bool = True, period: float = 30.0):
        self.label, self.enabled, self.period = label, enabled, period
        self.stage, self.t0 = "starting", time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self):
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __call__(self, stage: str) -> None:
        self.stage = stage
        self._say(stage)

    def _say(self, text: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.t0
            print(f"{self.label}: {text} [{elapsed:.0f} s]", file=sys.stderr, flush=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.period):
            self._say(f"still {self.stage}")


def _engine(args):
    """The engine asked for, or the one the output's suffix names; a mismatch is an error."""
    from .engines import ENGINES, by_suffix

    suffix = os.path.splitext(args.output)[1]
    found = by_suffix(args.output)
    engine = ENGINES[args.engine] if args.engine else found
    if engine is None:
        choices = " or ".join(f"--engine {e.name} ({e.suffix})" for e in ENGINES.values())
        raise ConversionError(f"{args.output}: give {choices}")
    if suffix != engine.suffix:
        raise ConversionError(f"{args.output}: the {engine.name} engine writes a {engine.suffix} file")
    return engine


def _run_compile(args) -> int:
    return _engine(args).compile(args.model, args.output, args)


def _load_feeds(path: str) -> dict:
    import zipfile

    import numpy as np

    if os.path.isdir(path) or not os.path.exists(path):
        raise ConversionError(f"{path}: no such .npz file")
    try:
        with np.load(path, allow_pickle=False) as d:
            return {k: d[k] for k in d.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, AttributeError) as e:
        raise ConversionError(f"{path}: not a readable .npz ({one_line(e)})") from None


def _run_run(args) -> int:
    import numpy as np

    from .io import atomic_output, check_output_path

    if args.out:
        check_output_path(args.out)
    if not os.path.isfile(args.library):
        raise ConversionError(f"{args.library}: no such file")
    from .engines import for_artifact
    from .engines.base import spec as arg_spec

    try:
        session = for_artifact(args.library).load(args.library, args.threads)
        inputs = [arg_spec(a) for a in session.get_inputs()]
        outputs = [arg_spec(a) for a in session.get_outputs()]
    except ConversionError:
        raise
    except Exception as e:  # noqa: BLE001 - OSError, JSON, KeyError, onnxruntime/TVM errors: one line
        raise ConversionError(f"{args.library}: cannot load a compiled model ({one_line(e)})") from None
    if args.data:
        feeds = _load_feeds(args.data)
    else:
        rng = np.random.default_rng(0)
        feeds = {}
        for i in inputs:
            dt = np.dtype(i["dtype"])
            if dt.kind in "iu":
                feeds[i["name"]] = rng.integers(
                    np.iinfo(dt).min, np.iinfo(dt).max, i["shape"], endpoint=True, dtype=dt
                )
            else:
                feeds[i["name"]] = rng.standard_normal(i["shape"]).astype(dt)
    src = args.data or "random inputs"
    try:
        outs = session.run(None, feeds)
    except KeyError as e:
        raise ConversionError(f"{src}: {e.args[0]} (the inputs of {args.library})") from None
    except ValueError as e:
        raise ConversionError(f"{src}: {one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - TVM runtime errors
        raise ConversionError(f"{args.library}: the run failed ({one_line(e)})") from None
    outs = outs if isinstance(outs, list | tuple) else [outs]
    for spec, o in zip(outputs, outs, strict=False):
        print(f"{spec['name']}: {o.dtype}{list(o.shape)} mean {float(np.mean(o)):.6g}")
    if args.out:
        with atomic_output(args.out) as tmp, open(tmp, "wb") as f:
            np.savez(f, **{spec["name"]: o for spec, o in zip(outputs, outs, strict=False)})
    return 0


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _add_bench(sub) -> None:
    p = _subcommand(sub, "bench")
    p.add_argument("model", help=f"integer-only .onnx (from 'ivit-onnx rewrite'), or '{ALIAS}' for the "
                   "bundled digits model (converted on the fly)")
    p.add_argument("--fp32", metavar="F.onnx", help=f"its FP32 model, for the onnxruntime FP32 baseline and "
                   f"the OpenVINO FP32 peer ('{ALIAS}': the bundled one)")
    p.add_argument("--fake-quant", metavar="F.onnx", help="its fake-quant QDQ model, for the OpenVINO int8 "
                   f"peer ('{ALIAS}': the bundled one)")
    p.add_argument("--artifact", metavar="F.onnx", help="also time this saved onnxruntime artifact of MODEL "
                   "('ivit-onnx compile MODEL -o F.onnx') beside the engines, its bits checked the same way")
    p.add_argument("--engines", default="onnxruntime", metavar="LIST",
                   help="comma list of onnxruntime (custom-op library), tvm (llvm build; needs the tvm "
                   "extra; compile time reported apart), c (the C engine built by the host compiler, one "
                   "sample a call) (default onnxruntime)")
    p.add_argument("--batch", type=_int_at_least(1), default=8, metavar="N",
                   help="batch size (the models' first input dimension) (default 8)")
    p.add_argument("--threads", type=_int_at_least(1), default=None, metavar="N",
                   help="threads of every engine and peer (default: the physical cores)")
    p.add_argument("--iters", type=_int_at_least(1), default=20, metavar="N",
                   help="timed rounds (default 20)")
    p.add_argument("--warmup", type=_int_at_least(0), default=2, metavar="N",
                   help="untimed rounds first (default 2)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def _run_bench(args) -> int:
    from .bench import main as bench_main

    return bench_main(args)


def _run_passes(_args) -> int:
    from .pipeline import Pipeline

    for p in Pipeline.default().passes:
        doc = (sys.modules[type(p).__module__].__doc__ or "").strip().splitlines()
        print(doc[0] if doc else p.name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(prog="ivit-onnx", description=__doc__.splitlines()[0].partition(": ")[2])
    parser.add_argument("--version", action="version", version=f"ivit-onnx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_rewrite(sub)
    _add_compile(sub)
    _add_bench(sub)
    sub.add_parser("passes", help="list the default pipeline's passes in order")
    sub.add_parser(
        "validate", help="check an integer model (same as python -m ivit_onnx.validate)", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``ivit-onnx`` entry point: every failure is one line on stderr and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "validate":
        from .validate import main as validate_main

        return validate_main(argv[1:])

    def command() -> int:
        args = build_parser().parse_args(argv)
        commands = {"rewrite": _run_rewrite, "passes": _run_passes, "compile": _run_compile, "run": _run_run,
                    "bench": _run_bench}
        return commands[args.command](args)

    return guarded(command)


if __name__ == "__main__":
    sys.exit(main())
