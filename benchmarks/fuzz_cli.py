"""A long fuzz run of the CLI: many seeded mutations of the bundled, test and BERT models (see tests/fuzz).

    python benchmarks/fuzz_cli.py [--count 5000] [--seed 1] [--compile]

Prints the outcome counts and every problem (an escaping exception, an internal error, more than one error
line, a partial or temporary file left behind); exit 1 if there is any. CI runs 520 (tests/fuzz).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ivit_onnx import rewrite  # noqa: E402
from ivit_onnx.models.bundled import default_model_path  # noqa: E402
from tests.fuzz.mutate import fuzz  # noqa: E402
from tests.passes.test_lower_integer import _attention_like, _island  # noqa: E402


def seeds(work: Path, compile_too: bool = False) -> tuple[dict, dict]:
    attention, digits = _attention_like(), onnx.load(default_model_path())
    models = {
        "attention": attention,
        "island": _island(),
        "digits": digits,
        "int": rewrite(attention)[0],
        "digits_int": rewrite(digits)[0],
    }
    try:  # the BERT-style encoder, quantized by onnxruntime (needs torch)
        from ivit_onnx.models.bert import bert_tiny, export_bert, quantize_bert

        export_bert(bert_tiny(), work / "bert_fp32.onnx")
        models["bert"] = quantize_bert(work / "bert_fp32.onnx", work / "bert_fq.onnx")
    except ImportError:
        pass
    int_commands = ["validate", "compile"] if compile_too else ["validate"]
    commands = {k: int_commands if k.endswith("int") else ["rewrite"] for k in models}
    return models, commands


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--compile", action="store_true", help="also ivit-onnx compile the mutated integer models"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        models, commands = seeds(Path(tmp), args.compile)
        t = time.perf_counter()
        tally = fuzz(models, commands, args.count, args.seed, Path(tmp) / "runs")
        dt = time.perf_counter() - t
    print(f"{args.count} mutations of {', '.join(sorted(models))} in {dt:.0f} s (seed {args.seed})")
    for kind, n in sorted(tally.kinds.items()):
        print(f"  {kind:20s} {n}")
    print(f"problems: {len(tally.problems)}")
    for p in tally.problems:
        print(f"  {p}")
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.exit(main())
