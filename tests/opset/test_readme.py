"""``opset/README.md`` (the spec table) says what the code says: ports, dtypes, attributes, formulas."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest

from ivit_onnx.opset import DOMAIN, OPS, VERSION

README = Path(__file__).resolve().parents[2] / "opset" / "README.md"
MODULES = {"Requantize": "requantize", "IAdd": "iadd", "Shiftmax": "shiftmax", "ShiftGELU": "shiftgelu",
           "ILayerNorm": "ilayernorm", "IBertGELU": "ibertgelu", "L1LayerNorm": "l1layernorm",
           "IBertSoftmax": "ibert_softmax", "LogIntSoftmax": "log_int_softmax", "IL2Norm": "il2norm"}


def flat(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def formulas(doc: str) -> list[str]:
    """The docstring's code-block lines and its inline literals that state an equation or a bound."""
    found = []
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith("::"):
            for code in lines[i + 1:]:
                if code.strip() and not code.startswith("    "):
                    break
                if code.strip():
                    found.append(code.strip())
    for lit in re.findall(r"``([^`]+)``", " ".join(doc.split())):
        if any(s in lit for s in (" = ", " < ", " <= ")):
            found.append(lit)
    return found


def test_domain_and_version():
    text = README.read_text()
    assert f"`{DOMAIN}`, version {VERSION}" in text.splitlines()[0]


@pytest.mark.parametrize("op", sorted(OPS))
def test_table_row(op):
    spec = OPS[op]
    row = next(line for line in README.read_text().splitlines() if line.startswith(f"| `{op}` |"))
    _, inputs, output, attrs = (cell.strip() for cell in row.strip("|").split("|"))
    for port in spec.inputs:
        assert f"`{port.name}`" in inputs, f"{op}: input {port.name} missing from the table"
        names = [np.dtype(t).name for t in port.types]
        group = inputs[inputs.index(f"`{port.name}`"):].split(" · ")[0]
        assert ": " + "/".join(names) in group, f"{op}: dtypes of {port.name} should read {'/'.join(names)}"
    order = [inputs.index(f"`{p.name}`") for p in spec.inputs]
    assert order == sorted(order), f"{op}: inputs out of node order"
    assert "type of `y_zero_point`" in output and spec.inputs[-1].name == "y_zero_point"
    assert sorted(re.findall(r"`(\w+)`", attrs)) == sorted(spec.attributes), f"{op}: attributes differ"


@pytest.mark.parametrize("op", sorted(OPS))
def test_formulas_copied_from_the_docstring(op):
    text = flat(README.read_text())
    doc = importlib.import_module(f"ivit_onnx.opset.{MODULES[op]}").__doc__
    for f in formulas(doc):
        assert flat(f) in text, f"{op}: README lacks {f!r}"


def test_shared_pieces_copied_from_the_docstring():
    from ivit_onnx.opset import shift_exp

    text = flat(README.read_text())
    for f in formulas(shift_exp.__doc__) + formulas(shift_exp.max_n.__doc__):
        assert flat(f) in text, f"README lacks {f!r}"
    from ivit_onnx.opset import _int

    assert flat(_int.round_shift.__doc__.split(":")[0]) in text


def test_poly_exp_copied_from_the_docstring():
    from ivit_onnx.opset import poly_exp

    text = flat(README.read_text())
    for f in formulas(poly_exp.__doc__):
        assert flat(f) in text, f"README lacks {f!r}"
