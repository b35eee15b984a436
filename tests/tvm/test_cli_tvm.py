"""`ivit-onnx compile` and `ivit-onnx run` end to end on a small integer chain, and their errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from _tvm_cases import chain_model

from ivit_onnx.cli import main
from ivit_onnx.opset.reference import evaluator

pytest.importorskip("tvm")
pytestmark = pytest.mark.tvm


def test_compile_then_run_is_bitexact(tmp_path, capsys):
    rng = np.random.default_rng(1)
    model = chain_model(rng)
    x = rng.integers(0, 256, (2, 8, 16)).astype(np.uint8)
    onnx.save(model, tmp_path / "chain.onnx")
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["compile", str(tmp_path / "chain.onnx"), "-o", str(tmp_path / "chain.so")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "chain.json").exists()
    code = main(["run", str(tmp_path / "chain.so"), "--data", str(tmp_path / "in.npz"),
                 "--out", str(tmp_path / "out.npz")])
    assert code == 0
    printed = capsys.readouterr().out
    expected = evaluator(model).run(None, {"x": x})
    with np.load(tmp_path / "out.npz") as got:
        for o, ref in zip(model.graph.output, expected, strict=True):
            assert o.name in printed
            np.testing.assert_array_equal(got[o.name], ref)
    np.savez(tmp_path / "wrong.npz", y=x)
    assert main(["run", str(tmp_path / "chain.so"), "--data", str(tmp_path / "wrong.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ivit-onnx: error:") and "missing inputs" in err and "\n" not in err
    np.savez(tmp_path / "dtype.npz", x=x.astype(np.int8))
    assert main(["run", str(tmp_path / "chain.so"), "--data", str(tmp_path / "dtype.npz")]) == 2
    assert "expected uint8" in capsys.readouterr().err


def test_bad_files_exit_2_with_one_line(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a library")
    for args in (["compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "m.so")],
                 ["run", str(junk)]):
        p = subprocess.run([sys.executable, "-m", "ivit_onnx.cli", *args], capture_output=True, text=True)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ivit-onnx: error:"), p.stderr
    assert not (tmp_path / "m.so").exists()
