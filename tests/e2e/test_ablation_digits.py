"""The paper's ablation kernels end to end on the bundled digits ViT: ``ivit-onnx rewrite digits --gelu
ibert`` and ``--layernorm l1`` write IBertGELU / L1LayerNorm in place of ShiftGELU / ILayerNorm, and
``ivit-onnx validate --backends library,functions,interpreter`` finds the three bit-exact on the digits test
split, with the converted model's accuracy within a point and a half of the fake-quant model's (PTQ; the
default conversion matches it: ``python -m ivit_onnx.validate`` prints both)."""

from __future__ import annotations

import json
from collections import Counter

import onnx
import pytest

from ivit_onnx.cli import main as cli
from ivit_onnx.validate import main as validate


@pytest.mark.parametrize(
    "flags,op,replaced",
    [(["--gelu", "ibert"], "IBertGELU", "ShiftGELU"), (["--layernorm", "l1"], "L1LayerNorm", "ILayerNorm")],
)
def test_digits_ablation_rewrite_validates_bit_exact(flags, op, replaced, tmp_path, capsys):
    model, report = tmp_path / "int.onnx", tmp_path / "validate.json"
    assert cli(["rewrite", "digits", *flags, "-o", str(model), "-q"]) == 0
    ops = Counter(n.op_type for n in onnx.load(model).graph.node)
    assert ops[op] > 0 and ops[replaced] == 0, ops
    backends = "library,functions,interpreter"
    argv = [str(model), "--backends", backends, "--fake-quant", "digits", "--data", "digits"]
    code = validate([*argv, "--min-agreement", "0.95", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(report.read_text())
    checks = {c["name"]: c["status"] for c in result["checks"]}
    for check in ("bit-exact: functions == library", "bit-exact: interpreter == library",
                  "integer-only certificate", "function bodies canonical"):
        assert checks[check] == "PASSED", (check, out)
    accuracy = result["accuracy"]
    assert accuracy["int"]["samples"] == accuracy["fake-quant"]["samples"] == 450
    assert accuracy["int"]["top1"] >= accuracy["fake-quant"]["top1"] - 0.015, accuracy
