"""``ivit-onnx``: command-line front end (subcommands share argument groups, Polygraphy style).

Exit codes: 0 success, 1 a check failed, 2 bad input (one line on stderr, no traceback, no output file).
"""

from __future__ import annotations

import argparse
import sys

from .errors import ConversionError

BUNDLED = "digits"


def _resolve_model(path: str) -> str:
    """``digits`` names the bundled fake-quant demo model; anything else is a file path."""
    if path == BUNDLED:
        from .models.bundled import default_model_path

        return str(default_model_path())
    return path


def _add_rewrite(sub) -> None:
    p = sub.add_parser(
        "rewrite",
        help="convert a fake-quant (QDQ) ONNX model to integer-only ONNX",
        description="Convert a fake-quant (QuantizeLinear/DequantizeLinear) ONNX vision transformer into an "
        "integer-only ONNX graph: scales fold into dyadic multipliers, MatMul/Gemm/Conv become "
        "int8xint8->int32, Softmax/GELU/LayerNorm become Shiftmax/ShiftGELU/ILayerNorm of the "
        "private opset ai.ivit (with ONNX function bodies, so stock onnxruntime runs the result).",
    )
    p.add_argument("model", help=f"input QDQ .onnx file, or '{BUNDLED}' for the bundled demo model")
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
        help="stop after the named pass (see 'ivit-onnx passes'); the output is then a debugging "
        "snapshot and may not pass the ONNX checker",
    )
    p.add_argument(
        "--gelu-bits", type=int, default=15, help="fraction bits of ShiftGELU's sigmoid (default 15)"
    )
    p.add_argument(
        "--min-x0",
        type=int,
        default=1024,
        help="finest exp grid for Shiftmax/ShiftGELU: inputs whose 1/scale is below this are "
        "upscaled exactly first (default 1024)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")


def _run_rewrite(args) -> int:
    from .rewrite import rewrite

    _, report = rewrite(
        _resolve_model(args.model),
        args.output,
        allow_float=args.allow_float,
        scale_table=args.scales,
        stop_after=args.stop_after,
        gelu_bits=args.gelu_bits,
        min_x0=args.min_x0,
    )
    if args.report:
        report.to_json(args.report)
    if not args.quiet:
        print(report.summary())
        print(f"wrote {args.output}")
    return 0


def _add_tvm(sub) -> None:
    p = sub.add_parser(
        "compile",
        help="compile an integer model with TVM (needs pip install -e .[tvm])",
        description="Inline the private ops' bodies, import with TVM's relax ONNX frontend, build "
        "with tvm.compile and export a loadable library (.so) plus a .json sidecar.",
    )
    p.add_argument("model", help="integer-only .onnx (from 'ivit-onnx rewrite')")
    p.add_argument("-o", "--output", required=True, help="output library path (.so); the sidecar is .json")
    p.add_argument("--target", choices=["llvm", "cuda"], default="llvm", help="TVM target (default llvm)")
    p.add_argument("--arch", help="GPU architecture for cuda, e.g. sm_80, sm_90")
    p.add_argument("--tune", type=int, default=0, metavar="N", help="meta-schedule trials (default 0: none)")
    p.add_argument("--tune-db", metavar="DIR", help="persistent meta-schedule database directory")
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="fixed input shape (repeatable); default: the model's, dynamic dims as 1",
    )
    r = sub.add_parser("run", help="run a compiled library on an .npz of inputs (or random inputs)")
    r.add_argument("library", help="the .so written by 'ivit-onnx compile'")
    r.add_argument("--data", metavar="NPZ", help="inputs by name (default: random, seed 0)")
    r.add_argument("--out", metavar="NPZ", help="write the outputs here")


def _parse_shapes(items: list[str]) -> dict | None:
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        if not dims:
            raise ConversionError(f"--shape {item!r}: expected NAME=D0,D1,...")
        shapes[name] = [int(d) for d in dims.split(",")]
    return shapes or None


def _run_compile(args) -> int:
    try:
        from .tvm_backend import compile_model
    except ImportError as e:
        raise ConversionError(f"TVM is not installed ({e.name}): pip install -e '.[tvm]'") from None
    from .io import load_model

    art = compile_model(
        load_model(args.model),
        target=args.target,
        arch=args.arch,
        out=args.output,
        tune_trials=args.tune,
        tune_db=args.tune_db,
        shape=_parse_shapes(args.shape),
    )
    print(
        f"wrote {args.output} (target {art.target.get('kind')}, int8 matmuls {art.info.get('int8_matmuls')})"
    )
    return 0


def _run_run(args) -> int:
    import numpy as np

    try:
        from .tvm_backend import load, run
    except ImportError as e:
        raise ConversionError(f"TVM is not installed ({e.name}): pip install -e '.[tvm]'") from None
    try:
        art = load(args.library)
    except (OSError, ValueError, RuntimeError) as e:
        raise ConversionError(f"{args.library}: cannot load a compiled model ({_first_line(e)})") from None
    if args.data:
        with np.load(args.data) as d:
            feeds = {k: d[k] for k in d.files}
    else:
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in art.inputs}
    try:
        outs = run(art, feeds)
    except KeyError as e:
        raise ConversionError(f"{args.data}: {e.args[0]} (the inputs of {args.library})") from None
    except ValueError as e:
        raise ConversionError(f"{args.data}: {_first_line(e)}") from None
    outs = outs if isinstance(outs, list | tuple) else [outs]
    for spec, o in zip(art.outputs, outs, strict=False):
        print(f"{spec['name']}: {o.dtype}{list(o.shape)} mean {float(np.mean(o)):.6g}")
    if args.out:
        np.savez(args.out, **{spec["name"]: o for spec, o in zip(art.outputs, outs, strict=False)})
    return 0


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _run_passes(_args) -> int:
    from .pipeline import Pipeline

    for p in Pipeline.default().passes:
        doc = (sys.modules[type(p).__module__].__doc__ or "").strip().splitlines()
        print(doc[0] if doc else p.name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="ivit-onnx", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ivit-onnx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_rewrite(sub)
    _add_tvm(sub)
    sub.add_parser("passes", help="list the default pipeline's passes in order")
    sub.add_parser(
        "validate", help="check an integer model (same as python -m ivit_onnx.validate)", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "validate":
        from .validate import main as validate_main

        return validate_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        commands = {"rewrite": _run_rewrite, "passes": _run_passes, "compile": _run_compile, "run": _run_run}
        return commands[args.command](args)
    except ConversionError as e:
        print(f"ivit-onnx: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ivit-onnx: error: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
