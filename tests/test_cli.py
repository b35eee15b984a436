"""``ivit-onnx rewrite``: report, exit codes, one-line errors, nothing written on failure."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

from tests.passes.test_lower_integer import _attention_like, _island


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ivit_onnx.cli", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def fq_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "fq.onnx"
    onnx.save(_attention_like(), path)
    return path


def test_rewrite_writes_model_and_report(fq_path, tmp_path):
    out, rep = tmp_path / "int.onnx", tmp_path / "r.json"
    r = _cli("rewrite", str(fq_path), "-o", str(out), "--report", str(rep), "--scales")
    assert r.returncode == 0, r.stderr
    assert "integer MACs: 100.00%" in r.stdout and "float islands: 0" in r.stdout
    data = json.loads(rep.read_text())
    assert data["counts"]["lower_integer"]["MatMulInteger"] == 1 and data["scales"]
    onnx.checker.check_model(onnx.load(out), full_check=True)


@pytest.mark.parametrize(
    "content, msg",
    [(None, "no such file"), (b"\x08\x07garbage", "not an ONNX model"), ("truncate", "truncated")],
)
def test_bad_files_exit_2_with_one_line(fq_path, tmp_path, content, msg):
    src = tmp_path / "bad.onnx"
    if content == "truncate":
        src.write_bytes(fq_path.read_bytes()[:200])
    elif content is not None:
        src.write_bytes(content)
    out = tmp_path / "int.onnx"
    r = _cli("rewrite", str(src), "-o", str(out))
    assert r.returncode == 2
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_float_island_exit_2_and_allow_float(tmp_path):
    src, out = tmp_path / "fq.onnx", tmp_path / "int.onnx"
    onnx.save(_island(), src)
    r = _cli("rewrite", str(src), "-o", str(out))
    assert r.returncode == 2 and "Hardmax" in r.stderr and not out.exists()
    r = _cli("rewrite", str(src), "-o", str(out), "--allow-float")
    assert r.returncode == 0 and "float islands: 1" in r.stdout and out.exists()


def test_rewrite_shape_fixes_the_input_and_keeps_a_named_dimension(tmp_path):
    """``--shape x=N,6,16``: numbers fix dimensions, a name keeps one symbolic (as the model names it)."""
    from tests.passes.test_fold_constants import _swin_like

    src, out = tmp_path / "fq.onnx", tmp_path / "int.onnx"
    onnx.save(_swin_like(True), src)
    r = _cli("rewrite", str(src), "-o", str(out))
    assert r.returncode == 2 and "the channel count is unknown" in r.stderr and "--shape" in r.stderr
    r = _cli("rewrite", str(src), "-o", str(out), "--shape", "x=N,6,16")
    assert r.returncode == 0, r.stderr
    assert "fold_constants: input shape fixed 1" in r.stdout
    dims = onnx.load(out).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["N", 6, 16]


@pytest.mark.parametrize(
    "value, msg",
    [
        ("x=2,6,0", "expected NAME=D0,D1,... with positive integer or symbolic (a name) dims"),
        ("x", "expected NAME=D0,D1,..."),
        ("y=2,6,16", "the model has no input of that name (inputs: x)"),
    ],
)
def test_rewrite_bad_shape_is_one_line(tmp_path, value, msg):
    from tests.passes.test_fold_constants import _swin_like

    src, out = tmp_path / "fq.onnx", tmp_path / "int.onnx"
    onnx.save(_swin_like(True), src)
    r = _cli("rewrite", str(src), "-o", str(out), "--shape", value)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_help_documents_every_option():
    r = _cli("rewrite", "--help")
    for opt in (
        "--output",
        "--allow-float",
        "--report",
        "--scales",
        "--stop-after",
        "--gelu-bits",
        "--min-x0",
        "--shape",
        "--softmax",
        "--gelu",
        "--layernorm",
    ):
        assert opt in r.stdout


def test_every_conversion_option_has_a_rewrite_flag():
    """Options' docstring promises a flag per field (scale_table: --scales); a new field needs one."""
    import dataclasses

    from ivit_onnx.cli import build_parser
    from ivit_onnx.pipeline import Options

    parser = build_parser()
    rewrite = next(a for a in parser._actions if a.choices and "rewrite" in a.choices).choices["rewrite"]
    flags = {s for a in rewrite._actions for s in a.option_strings}
    named = {"scale_table": "--scales", "input_shapes": "--shape"}
    for f in dataclasses.fields(Options):
        assert named.get(f.name, "--" + f.name.replace("_", "-")) in flags, f.name
    args = parser.parse_args(
        ["rewrite", "m.onnx", "-o", "x.onnx", "--max-row", "128", "--ln-fraction-bits", "28"]
    )
    assert (args.max_row, args.ln_fraction_bits) == (128, 28)
