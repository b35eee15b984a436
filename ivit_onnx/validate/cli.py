"""``python -m ivit_onnx.validate``: the command line over :func:`ivit_onnx.validate.validate`."""

from __future__ import annotations

import argparse
import json

from ..errors import guarded
from ..io import atomic_output, check_output_path
from ..models.bundled import ALIAS as BUNDLED_ALIAS
from ..runners import BACKEND_ALIASES, INT_BACKENDS
from .options import DEFAULT_MIN_AGREEMENT, DEFAULT_MIN_SQNR, DEFAULT_SAMPLES, ValidateOptions
from .render import render

EPILOG = """\
exit status: 0 every check passed (WARNING and SKIPPED do not fail), 1 a check failed,
2 unusable input (missing, truncated or non-ONNX model, bad --data); bad input prints one line on stderr.

checks: onnx.checker full check; private opset (every non-standard op is a known ai.ivit op with valid
types and attributes, and carries its function body); integer-only certificate (function bodies
inlined, shape inference, every tensor between the input QuantizeLinear and the output
DequantizeLinear integer); one run per backend; bit-exact agreement of every backend with the first
on every output (and on every intermediate tensor with --per-layer, or to locate a mismatch); with
--fake-quant (alias --reference), mean per-sample logits cosine and the logits SQNR of the integer
model vs the fake-quant model against --min-cosine / --min-sqnr, and top-1 agreement against
--min-agreement on real --data (on random inputs it is reported only: their logits have low margins,
so a correct model's top-1 flips; FP32 and label accuracy are reported, not checked).

data: default N(0,1) random inputs (--samples, --seed); an .npz with one array per input (or a
single array) and optional integer 'labels'; 'digits' (the bundled digits test split, with labels);
or a folder of images (.png/.pgm/.ppm/.npy, others with Pillow), sub-folders = classes, prepared
by --preprocess: imagenet (resize 256, centre crop 224 for a 224 input, ImageNet mean/std),
inception (same, mean=std=0.5), raw (resize to the input size, [0, 1]).
"""


PER_LAYER = (
    "compare every intermediate tensor: bit-exact across backends, and dequantized vs the fake-quant "
    "tensor it replaces (first batch), marking where divergence starts"
)


def _backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in INT_BACKENDS and b not in BACKEND_ALIASES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {bad}; choose from {', '.join(INT_BACKENDS)}")
    return list(dict.fromkeys(names))


def parser() -> argparse.ArgumentParser:
    from ..cli import Parser
    from ..images import PRESETS

    p = Parser(
        prog="python -m ivit_onnx.validate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Validate an integer-only ONNX model made by ivit-onnx: certify it, run it on the "
        "custom-op library (and other backends, bit-exactly), compare it with its references.",
        epilog=EPILOG,
    )
    p.add_argument("model", help="the integer-only model (int.onnx)")
    g = p.add_argument_group("runs")
    g.add_argument(
        "--backends",
        type=_backends,
        default=["library"],
        metavar="LIST",
        help="comma list of library (the native onnxruntime custom-op library; where it was not "
        "built, onnxruntime-extensions with the numpy kernels), functions (the ONNX function bodies in "
        "stock onnxruntime), interpreter (onnx.reference running the numpy kernels; 'reference' "
        "still works); the first is compared with the fake-quant/FP32 models, the others must agree "
        "with it bit for bit (default: library)",
    )
    g.add_argument(
        "--threads", type=int, default=None, metavar="N", help="onnxruntime intra-op threads (default: all)"
    )
    g.add_argument(
        "--int8-gemm",
        action="store_true",
        help="library: keep int8 x int8 GEMMs as converted (default: operands re-encoded as uint8 "
        "with zero point 128, exact, for onnxruntime's fast u8 GEMM)",
    )
    g = p.add_argument_group("references")
    g.add_argument(
        "--fake-quant",
        "--reference",
        dest="fake_quant",
        metavar="FQ.onnx",
        help=f"the fake-quant model it was converted from ('{BUNDLED_ALIAS}': the bundled digits ViT)",
    )
    g.add_argument(
        "--fp32",
        metavar="FP32.onnx",
        help=f"the FP32 model, reported, not checked ('{BUNDLED_ALIAS}': the bundled one)",
    )
    g = p.add_argument_group("inputs")
    g.add_argument("--data", metavar="NPZ|DIR|digits", help="inputs (default: random)")
    g.add_argument(
        "--preprocess",
        choices=sorted(PRESETS),
        default="imagenet",
        help="preset for an image folder (default imagenet)",
    )
    g.add_argument("--batch", type=int, default=8, metavar="N", help="batch size (default 8)")
    g.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        metavar="N",
        help=f"number of random samples when no --data is given (default {DEFAULT_SAMPLES})",
    )
    g.add_argument(
        "--limit", type=int, default=None, metavar="N", help="use at most this many samples of --data"
    )
    g.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the random inputs (default 0)")
    g = p.add_argument_group("checks and output")
    g.add_argument(
        "--min-cosine",
        type=float,
        default=0.99,
        metavar="X",
        help="mean logits cosine vs --fake-quant (0.99)",
    )
    g.add_argument(
        "--min-sqnr",
        type=float,
        default=DEFAULT_MIN_SQNR,
        metavar="DB",
        help=f"logits signal-to-error ratio vs --fake-quant, in dB ({DEFAULT_MIN_SQNR:g})",
    )
    g.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        metavar="X",
        help=f"top-1 agreement vs --fake-quant ({DEFAULT_MIN_AGREEMENT}; on random inputs only "
        "checked when given)",
    )
    g.add_argument("--per-layer", action="store_true", help=PER_LAYER)
    g.add_argument(
        "--per-op",
        action="store_true",
        help="each Softmax/GELU/LayerNorm/L2-norm kernel fed the fake-quant model's own integer input: its "
        "output's difference from the float op followed by its quantize, in LSB (needs --fake-quant)",
    )
    g.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    g.add_argument("--progress", action="store_true", help="progress bar on stderr even when not a TTY")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 (passed), 1 (a check failed) or 2 (bad input: one line on stderr, never a traceback)."""
    return guarded(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    from . import validate

    opts = ValidateOptions(**vars(parser().parse_args(argv)))
    opts.check()
    if opts.json:
        check_output_path(opts.json)
    result = validate(opts)
    print(render(result, opts.min_cosine))
    if opts.json:
        with atomic_output(opts.json) as tmp, open(tmp, "w") as f:
            json.dump(result.as_dict(), f, indent=1)
    return result.exit_code
