"""The ablation benchmark (``benchmarks/bench_ablation.py``, the paper's Table 2) in its reduced mode: PTQ on
the digits ViT, latency of the onnxruntime engine on the digits model (no TVM, no QAT, no Swin). Every row
and column is there, the numbers are sane, and the I-ViT row's accuracy is the one ``ivit-onnx validate``
gives."""

from __future__ import annotations

import copy
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_ablation  # noqa: E402

from ivit_onnx import cpu  # noqa: E402
from ivit_onnx.opset.approx import KERNEL_OPS  # noqa: E402
from ivit_onnx.pipeline import KERNELS  # noqa: E402

REDUCED = ["--skip-qat", "--skip-swin", "--no-tvm", "--latency-model", "digits", "--iters", "2",
           "--warmup", "1"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    pytest.importorskip("sklearn")  # the digits split
    argv = [*REDUCED, "--out", str(tmp_path_factory.mktemp("ablation"))]
    return bench_ablation.build_table(bench_ablation.parser().parse_args(argv), argv)


def test_every_row_and_column(table):
    rows = table["rows"]
    assert [r["name"] for r in rows] == [name for name, _ in bench_ablation.ROWS]
    for row, (_, choices) in zip(rows, bench_ablation.ROWS, strict=True):
        assert row["kernels"] == {op: choices.get(op, names[0]) for op, names in KERNELS.items()}
        for op, err in row["errors"].items():
            assert err["op"] == KERNEL_OPS[op][row["kernels"][op]]
            assert err["cases"] > 0 and 0 <= err["mean_lsb"] <= err["max_lsb"] < 1000, err
        assert 0 <= row["vit_ptq"] <= 100 and row["vit_ptq"] > 80  # a working classifier with every kernel
        assert row["library_ms"] > 0 and row["exact"] == {"library": True}
        for skipped in ("vit_qat", "swin_ptq", "swin_qat", "tvm_ms"):
            assert skipped not in row
    # the swapped kernel is the row's only change: the other two kernels' errors are the I-ViT row's
    for row, (_, choices) in zip(rows[1:], bench_ablation.ROWS[1:], strict=True):
        assert [op for op in KERNELS if row["errors"][op] != rows[0]["errors"][op]] == list(choices)
    # the polynomial exp is closer to exp than the shift-exp; LIS's log levels and L1's statistic are not
    errors = {r["errors"][op]["op"]: r["errors"][op]["max_lsb"] for r in rows for op in KERNELS}
    assert errors["IBertSoftmax"] < errors["Shiftmax"] < errors["LogIntSoftmax"]
    assert errors["ILayerNorm"] <= 0.6 < errors["L1LayerNorm"]
    assert table["latency"]["fp32_ms"] > 0 and table["latency"]["model"] == "digits"


def test_text_names_the_command_device_and_every_row(table):
    text = bench_ablation.render(table)
    lines = text.splitlines()
    argv = [*REDUCED, "--out", table["command"].split(" --out ")[1]]
    assert lines[0] == "command: python benchmarks/bench_ablation.py " + shlex.join(argv)
    assert lines[1].startswith("device: ") and cpu.describe() in lines[1]
    assert "| " + " | ".join(bench_ablation.HEADER) + " |" in lines
    for row in table["rows"]:
        line = next(ln for ln in lines if ln.startswith(f"| {row['name']} |"))
        assert f"{row['vit_ptq']:.2f}" in line and f"{row['library_ms']:.1f}" in line
        assert line.count(" – ") == 4  # the QAT, Swin and TVM columns of the reduced mode
    assert "exact: library == function bodies, every row: yes" in lines
    assert bench_ablation.all_exact(table)
    broken = copy.deepcopy(table)
    broken["rows"][3]["exact"]["library"] = False
    assert not bench_ablation.all_exact(broken)
    assert "exact: library == function bodies, every row: NO" in bench_ablation.render(broken)


def test_ivit_row_accuracy_is_validates(table, tmp_path):
    from ivit_onnx import rewrite
    from ivit_onnx.models.bundled import default_model_path
    from ivit_onnx.validate import ValidateOptions, validate

    rewrite(default_model_path(), tmp_path / "int.onnx")
    result = validate(ValidateOptions(model=str(tmp_path / "int.onnx"), data="digits"))
    assert result.accuracy["int"]["samples"] == 450
    assert table["rows"][0]["vit_ptq"] == pytest.approx(100 * result.accuracy["int"]["top1"], abs=1e-9)
