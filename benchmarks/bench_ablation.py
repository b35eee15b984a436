"""The paper's ablation (I-ViT Table 2) in its shape: each row a kernel choice, every column measured here.

    python benchmarks/bench_ablation.py [--out DIR] [--threads 2] [--batch 8] [--iters 10] [--warmup 2]
                                        [--qat-epochs 4] [--latency-model deit_tiny|digits] [--no-tvm]
                                        [--skip-qat] [--skip-swin] [--no-latency] [--json FILE]

Rows: I-ViT's kernels (Shiftmax, ShiftGELU, I-LayerNorm) and each swap of Table 2, as ``ivit-onnx rewrite``
makes it: Shiftmax → I-BERT's polynomial (``--softmax ibert``), ShiftGELU → I-BERT's polynomial (``--gelu
ibert``), Shiftmax → FQ-ViT's LIS (``--softmax lis``), I-LayerNorm → L1 LayerNorm (``--layernorm l1``).
Columns:

- each of the row's three kernels against the float op it replaces over its operating range, max and mean,
  in LSBs of the output the models use (:func:`ivit_onnx.opset.approx.operating_range`);
- digits ViT top-1 after PTQ (the bundled fake-quant model converted with the row's kernels, run with the
  custom-op library on the 450 test images) and after QAT (:class:`ivit_onnx.models.qat.IntegerViT` with the
  same kernels, ``--qat-epochs``; the export converted with them, checked bit for bit against the QAT model);
- digits Swin top-1 after PTQ (trained here, ~25 s, cached in ``--out``; min/max-quantized, converted) and
  after kernel-in-the-loop QAT (:mod:`ivit_onnx.models.qat_swin`: not bit-exact, agreement reported);
- latency of the onnxruntime engine (the custom-op library) and TVM llvm on DeiT-Tiny (224², random weights,
  the files of ``bench_validate.build``), batch 8, 2 threads: every row's two engines and onnxruntime FP32
  timed in one run, interleaved round by round (:mod:`ivit_onnx.bench`); each engine's outputs are checked
  bit for bit against the function bodies (exit status 1 if any differ, or if a ViT QAT graph differs from
  its QAT model).

The device line (CPU and ISA), the command and the load average come first; progress lines go to stderr;
``--json FILE`` writes the whole table. :func:`build_table` is the benchmark, :func:`render` its text.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx

from ivit_onnx import bench, rewrite
from ivit_onnx.errors import ConversionError
from ivit_onnx.opset.approx import KERNEL_OPS, operating_range
from ivit_onnx.pipeline import KERNELS, Options
from ivit_onnx.runners import OrtRunner

#: the paper's rows: (name, the ``Options`` kernel choices that differ from I-ViT's)
ROWS = [
    ("I-ViT (Shiftmax, ShiftGELU, I-LayerNorm)", {}),
    ("Shiftmax → I-BERT poly", {"softmax": "ibert"}),
    ("ShiftGELU → I-BERT poly", {"gelu": "ibert"}),
    ("Shiftmax → LIS (FQ-ViT)", {"softmax": "lis"}),
    ("I-LayerNorm → L1 LayerNorm", {"layernorm": "l1"}),
]
#: the accuracy columns (digits test split, top-1 %)
ACCURACY = ("vit_ptq", "vit_qat", "swin_ptq", "swin_qat")
LATENCY = ("library_ms", "tvm_ms")
FP32 = "fp32: onnxruntime"


def _say(text: str) -> None:
    print(f"[ablation] {text}", file=sys.stderr, flush=True)


def _slug(choices: dict) -> str:
    return "_".join(f"{k}-{v}" for k, v in choices.items()) or "ivit"


def _kernels(choices: dict) -> dict[str, str]:
    """The row's choice for each op, defaults included."""
    return {op: choices.get(op, names[0]) for op, names in KERNELS.items()}


# ------------------------------------------------------------------------------------------ the stages


def kernel_errors(rows: list[dict]) -> None:
    """Each row's three kernels over their operating ranges (each kernel measured once)."""
    seen: dict[tuple[str, str], dict] = {}
    for row in rows:
        row["errors"] = {}
        for op, choice in row["kernels"].items():
            if (op, choice) not in seen:
                _say(f"kernel error: {KERNEL_OPS[op][choice]}")
                seen[op, choice] = operating_range(op, choice)
            row["errors"][op] = seen[op, choice]


def _digits_accuracy(model: onnx.ModelProto, x: np.ndarray, y: np.ndarray, threads: int) -> float:
    """Top-1 (%) of an integer digits model run with the custom-op library, batch 8 as ``validate``."""
    runner = OrtRunner(model, "library", threads)
    name = runner.output_names[0]
    hits = sum(int((runner.run({"input": x[i : i + 8]})[name].argmax(-1) == y[i : i + 8]).sum())
               for i in range(0, len(y), 8))
    return 100.0 * hits / len(y)


def vit_ptq(rows: list[dict], data: tuple, work: Path, threads: int) -> None:
    """The bundled fake-quant digits ViT converted with each row's kernels: its top-1 (and the graph, kept for
    the digits latency model)."""
    from ivit_onnx.models.bundled import default_model_path

    for row in rows:
        _say(f"digits ViT PTQ: {row['name']}")
        path = work / f"digits_int_{_slug(row['choices'])}.onnx"
        rewrite(default_model_path(), path, **row["choices"])
        row["digits_int"] = str(path)
        row["vit_ptq"] = _digits_accuracy(onnx.load(path), data[2], data[3], threads)


def vit_qat(rows: list[dict], data: tuple, work: Path, epochs: int) -> None:
    """QAT of the digits ViT (bundled FP32 weights, int8) with each row's kernels: the integer graph's top-1
    and whether it equals the QAT model bit for bit (``qat_digits.ptq_and_qat``)."""
    from ivit_onnx.models import bundled
    from ivit_onnx.models.make_default import deterministic
    from ivit_onnx.models.qat_digits import QAT_CONFIG, load_fp32_onnx, ptq_and_qat

    fp32 = load_fp32_onnx(bundled.default_fp32_path())
    cfg = {**QAT_CONFIG, "epochs": epochs}
    for row in rows:
        _say(f"digits ViT QAT ({epochs} epochs): {row['name']}")
        with deterministic(cfg["threads"]):
            got = ptq_and_qat(fp32, data, 8, cfg, work, Options(**row["choices"]), log=False)
        row["vit_qat"] = got["qat"]
        row["vit_qat_detail"] = {k: got[k] for k in ("ptq", "qat_seconds", "bit_identical")}


def _digits_swin(out: Path, data: tuple):
    """The digits Swin, trained once (deterministic) and cached in ``out``."""
    import torch

    from ivit_onnx.models.digits_swin import SWIN_CONFIG, train_digits_swin
    from ivit_onnx.models.swin import swin

    path = out / "digits_swin_fp32.pt"
    if path.exists():
        model = swin(**SWIN_CONFIG)
        model.load_state_dict(torch.load(path))
        return model.eval()
    _say("training the digits Swin (~25 s)")
    model = train_digits_swin(data[0], data[1])
    torch.save(model.state_dict(), path)
    return model


def swin(rows: list[dict], data: tuple, out: Path, work: Path, qat_epochs: int | None) -> None:
    """The digits Swin with each row's kernels: PTQ, then kernel-in-the-loop QAT unless ``qat_epochs`` is
    None."""
    from ivit_onnx.models import qat_swin
    from ivit_onnx.models.make_default import deterministic

    fp32 = _digits_swin(out, data)
    cfg = {**qat_swin.SWIN_QAT, "epochs": qat_epochs}
    for row in rows:
        options = Options(**row["choices"])
        with deterministic(cfg["threads"]):  # torch on one thread: two ran 10x slower on a shared 2-core host
            if qat_epochs is None:
                _say(f"digits Swin PTQ: {row['name']}")
                row["swin_ptq"] = qat_swin.ptq(fp32, data, work, options)[1]
                continue
            _say(f"digits Swin PTQ and QAT ({qat_epochs} epochs, kernels in the loop): {row['name']}")
            got = qat_swin.ptq_and_qat(fp32, data, cfg, work, options, log=False)
        row["swin_ptq"], row["swin_qat"] = got["ptq"], got["qat"]
        row["swin_qat_detail"] = {k: got[k] for k in ("loop", "agreement", "max_logit_diff", "qat_seconds")}


def _latency_models(rows: list[dict], name: str, out: Path) -> tuple[str, dict]:
    """The FP32 model's path and each row's integer model for the latency stage (DeiT-Tiny's FP32 and
    fake-quant files cached in ``out``, its integer models converted now)."""
    if name == "digits":
        from ivit_onnx.models.bundled import default_fp32_path

        return str(default_fp32_path()), {r["name"]: onnx.load(r["digits_int"]) for r in rows}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_validate import build

    _say(f"building {name} (FP32, fake-quant; cached in {out})")
    paths = build(out, name)
    models = {}
    for row in rows:
        _say(f"converting {name}: {row['name']}")
        models[row["name"]] = rewrite(paths["fq"], **row["choices"])[0]
    return str(paths["fp32"]), models


def latency(rows: list[dict], args, out: Path) -> dict:
    """Every row's engines (and onnxruntime FP32) timed side by side, interleaved; exactness per engine."""
    fp32_path, models = _latency_models(rows, args.latency_model, out)
    engines = ["onnxruntime"] + ([] if args.no_tvm else ["tvm"])
    feeds = bench.make_feeds(next(iter(models.values())), args.batch, args.latency_model)
    fp32 = onnx.load(fp32_path)
    # FP32 first, then each engine's rows together: a row never runs right after another engine's (TVM's
    # workers spin for a while after a run), only FP32 follows the last TVM row of the round before
    candidates = {FP32: bench.ort_peer(fp32, args.threads, bench.make_feeds(fp32, args.batch, fp32_path))}
    runners = {}
    for engine in engines:
        for row in rows:
            label = f"{row['name']}: {'library' if engine == 'onnxruntime' else 'tvm llvm'}"
            runner = bench._engine_runner(engine, models[row["name"]], args.threads)
            _say(f"preparing {label}" + (" (compiling)" if runner.compile else ""))
            runner.prepare(feeds)
            runners[label] = (row, engine, runner)
            candidates[label] = bench.Candidate(lambda r=runner: r.run(feeds))
    report = bench.bench(candidates, batch=args.batch, iters=args.iters, warmup=args.warmup, baseline=FP32,
                         threads=args.threads, progress=sys.stderr)
    bodies = {}
    for label, (row, engine, runner) in runners.items():
        model = models[row["name"]]
        names = [o.name for o in model.graph.output]
        if row["name"] not in bodies:
            _say(f"exactness: the function bodies of {row['name']} (one untimed run)")
            bodies[row["name"]] = bench.as_list(OrtRunner(model, "functions", args.threads).run(feeds), names)
        exact = bench.same_bits(bench.as_list(runner.run(feeds), names), bodies[row["name"]])
        key = "library" if engine == "onnxruntime" else "tvm"
        row[f"{key}_ms"] = report.row(label).median_ms
        row.setdefault("exact", {})[key] = exact
        if runner.compile_s is not None:
            row.setdefault("compile_s", {})[key] = runner.compile_s
    return {"model": args.latency_model, "batch": args.batch, "threads": args.threads, "iters": args.iters,
            "warmup": args.warmup, "fp32_ms": report.row(FP32).median_ms, "report": report.to_dict()}


# ------------------------------------------------------------------------------------------ the table


def build_table(args, argv: list[str]) -> dict:
    """Run every stage the arguments ask for; the table as a dict (rows in :data:`ROWS` order)."""
    from ivit_onnx.models import digits

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"name": name, "choices": choices, "kernels": _kernels(choices)} for name, choices in ROWS]
    table = {
        "command": "python benchmarks/bench_ablation.py" + "".join(f" {shlex.quote(a)}" for a in argv),
        "device": bench.device(args.threads, ("onnxruntime", "tvm", "torch")),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": os.getloadavg()[0],
        "rows": rows,
    }
    start = time.perf_counter()
    kernel_errors(rows)
    data = digits.load_digits_split()
    with tempfile.TemporaryDirectory(prefix="ivit_ablation_") as tmp:
        work = Path(tmp)
        vit_ptq(rows, data, work, args.threads)
        if not args.skip_qat:
            vit_qat(rows, data, work, args.qat_epochs)
        if not args.skip_swin:
            swin(rows, data, out, work, None if args.skip_qat else args.qat_epochs)
        if not args.no_latency:
            table["latency"] = latency(rows, args, out)
    for row in rows:
        del row["digits_int"]  # a file of the temporary folder
    table["load_end"] = os.getloadavg()[0]
    table["seconds"] = time.perf_counter() - start
    return table


def _cell(row: dict, base: dict, key: str, digits: int) -> str:
    """``row[key]``, with its difference to the first row's in parentheses; ``–`` where not measured."""
    if key not in row:
        return "–"
    if row is base:
        return f"{row[key]:.{digits}f}"
    return f"{row[key]:.{digits}f} ({row[key] - base[key]:+.{digits}f})"


def _err(e: dict) -> str:
    return f"{e['op']} {e['max_lsb']:.2f} / {e['mean_lsb']:.3f}"


HEADER = ["kernels", "Softmax err max / mean", "GELU err", "LayerNorm err", "ViT PTQ %", "ViT QAT %",
          "Swin PTQ %", "Swin QAT %", "library ms", "TVM llvm ms"]


def render(table: dict) -> str:
    """The table for people: command, device, load, then a Markdown table and what each column is."""
    rows, base = table["rows"], table["rows"][0]
    lines = [f"command: {table['command']}", bench.device_line(table["device"]),
             f"date: {table['date']}; 1-min load {table['load_start']:.2f} at the start, "
             f"{table['load_end']:.2f} at the end; {table['seconds']:.0f} s", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        cells = [row["name"], *(_err(row["errors"][op]) for op in KERNELS),
                 *(_cell(row, base, k, 2) for k in ACCURACY), *(_cell(row, base, k, 1) for k in LATENCY)]
        lines.append("| " + " | ".join(cells) + " |")
    out = {op: e["output"] for op, e in base["errors"].items()}
    lines += ["", "errors: against the float softmax / erf GELU / LayerNorm over each kernel's operating "
              "range (opset/approx.py), max over the cases and mean of the cases' means, in LSBs of the "
              f"output (softmax {out['softmax']}, GELU {out['gelu']}, LayerNorm {out['layernorm']})",
              "accuracy: digits test split (450 images), top-1 of the integer graph run with the custom-op "
              "library; (diff) against the first row"]
    if "vit_qat_detail" in base:
        same = all(r["vit_qat_detail"]["bit_identical"] for r in rows)
        lines.append("ViT QAT: IntegerViT, int8 weights; integer graphs == QAT model bit for bit: "
                     f"{'yes' if same else 'NO'}; its own PTQ start: "
                     + ", ".join(f"{r['vit_qat_detail']['ptq']:.2f}" for r in rows))
    if "swin_qat_detail" in base:
        lines.append("Swin QAT: kernels in the loop (not bit-exact); loop model top-1 / agreement with its "
                     "graph: " + ", ".join(f"{r['swin_qat_detail']['loop']:.2f} / "
                                           f"{r['swin_qat_detail']['agreement']:.2f}%" for r in rows))
    if "latency" in table:
        lat = table["latency"]
        lines.append(f"latency: {lat['model']}, batch {lat['batch']}, {lat['threads']} threads, median of "
                     f"{lat['iters']} interleaved rounds after {lat['warmup']}; onnxruntime FP32 "
                     f"{lat['fp32_ms']:.1f} ms in the same run")
        for key in ("library", "tvm"):
            if key in base.get("exact", {}):
                ok = all(r["exact"][key] for r in rows)
                lines.append(f"exact: {key} == function bodies, every row: {'yes' if ok else 'NO'}")
    return "\n".join(lines)


def all_exact(table: dict) -> bool:
    """Whether every engine of every row matched its function bodies (and every ViT QAT graph its model)."""
    rows = table["rows"]
    return all(all(r.get("exact", {}).values()) for r in rows) and all(
        r["vit_qat_detail"]["bit_identical"] for r in rows if "vit_qat_detail" in r)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "ivit_bench_ablation"),
                    help="cache of DeiT-Tiny's FP32 and fake-quant files and the trained digits Swin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10, help="timed rounds (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    ap.add_argument("--qat-epochs", type=int, default=4, help="QAT epochs of both digits models (default 4)")
    ap.add_argument("--latency-model", choices=("deit_tiny", "digits"), default="deit_tiny")
    ap.add_argument("--no-tvm", action="store_true", help="time the onnxruntime engine only (no TVM builds)")
    ap.add_argument("--skip-qat", action="store_true", help="no QAT columns")
    ap.add_argument("--skip-swin", action="store_true", help="no Swin columns")
    ap.add_argument("--no-latency", action="store_true", help="no latency columns")
    ap.add_argument("--json", metavar="FILE", help="also write the table here")
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    try:
        table = build_table(args, argv)
    except ConversionError as e:
        print(f"bench_ablation: error: {e}", file=sys.stderr)
        return 2
    print(render(table))
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2) + "\n")
    return 0 if all_exact(table) else 1


if __name__ == "__main__":
    sys.exit(main())
