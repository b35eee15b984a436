"""``validate --per-op``: each approximating kernel fed the fake-quant model's own integers, its output
against the float op followed by its quantize, in LSB (ivit_onnx/validate/per_op.py). The stated bounds are
the ones opset/README.md quotes for the bundled digits ViT (committed weights, so the same on every CPU up to
the fake-quant model's float rounding: one LSB of margin)."""

from __future__ import annotations

import json

import pytest

from ivit_onnx import rewrite
from ivit_onnx.models.bundled import resolve
from ivit_onnx.validate import main

from .test_validate_cli import run_main, status

#: worst output error in LSB per kernel on the bundled digits ViT, each kernel choice
BOUNDS = {
    "ILayerNorm": 1, "ShiftGELU": 2, "Shiftmax": 5,
    "IBertSoftmax": 1, "IBertGELU": 2, "L1LayerNorm": 9, "LogIntSoftmax": 84,
}  # fmt: skip


@pytest.mark.parametrize("kernels", [{}, {"softmax": "ibert", "gelu": "ibert", "layernorm": "l1"},
                                     {"softmax": "lis"}])
def test_each_kernel_error_is_within_its_stated_bound(kernels, tmp_path, capsys):
    int_path, report = tmp_path / "int.onnx", tmp_path / "r.json"
    rewrite(resolve("digits"), int_path, **kernels)
    code, out, _ = run_main(capsys, int_path, "--fake-quant", "digits", "--per-op", "--json", report)
    assert code in (0, 1) and status(out, "per-op vs fake-quant") == "PASSED", out  # (LIS fails the cosine)
    rows = json.loads(report.read_text())["per_op"]
    ops = {r["op"] for r in rows}
    assert len(ops) == 3 and len(rows) == 17  # 4 softmax, 4 GELU, 9 LayerNorm kernels
    for r in rows:
        assert r["max_lsb"] <= BOUNDS[r["op"]] + 1, r
        assert 0 <= r["mean_lsb"] <= r["max_lsb"] and 0 < r["exact"] <= 1


def test_a_kernel_made_worse_shows_in_its_row(tmp_path, capsys):
    """Fewer fraction bits in one ILayerNorm (a coarser 1/sqrt) raise that node's error, and only its."""
    import onnx

    int_path = tmp_path / "int.onnx"
    model, _ = rewrite(resolve("digits"), int_path)
    target = next(n for n in model.graph.node if n.op_type == "ILayerNorm")
    mult = next(i for i in model.graph.initializer if i.name == target.input[1])
    arr = onnx.numpy_helper.to_array(mult)
    mult.CopyFrom(onnx.numpy_helper.from_array(arr + arr // 16 + 1, mult.name))  # gamma 6 % too large
    bad = tmp_path / "bad.onnx"
    onnx.save(model, bad)
    report = tmp_path / "r.json"
    main([str(bad), "--fake-quant", "digits", "--per-op", "--json", str(report)])
    rows = {r["node"]: r for r in json.loads(report.read_text())["per_op"]}
    assert rows[target.name]["max_lsb"] > BOUNDS["ILayerNorm"] + 1
    others = [r for k, r in rows.items() if r["op"] == "ILayerNorm" and k != target.name]
    assert all(r["max_lsb"] <= BOUNDS["ILayerNorm"] + 1 for r in others)


def test_per_op_without_reference_is_skipped(tmp_path, capsys):
    int_path = tmp_path / "int.onnx"
    rewrite(resolve("digits"), int_path)
    code, out, _ = run_main(capsys, int_path, "--per-op")
    assert code == 0 and status(out, "per-op vs fake-quant") == "SKIPPED"
