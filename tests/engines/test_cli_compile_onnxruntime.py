"""``ivit-onnx compile --engine onnxruntime`` writes the artifact; ``ivit-onnx run`` runs it with the bits of
the model as converted; wrong engines and suffixes are one-line errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ivit_onnx.cli import main
from ivit_onnx.engines.onnxruntime import is_artifact
from ivit_onnx.opset import native_kernels
from ivit_onnx.runners import OrtRunner
from tests.validate.conftest import x_batch

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")


def test_compile_then_run_gives_the_converted_models_bits(tiny, tmp_path, capsys):
    art, data, out = tmp_path / "int.ort.onnx", tmp_path / "x.npz", tmp_path / "y.npz"
    assert main(["compile", str(tiny.int), "-o", str(art)]) == 0
    assert "onnxruntime engine" in capsys.readouterr().out and is_artifact(onnx.load(art))
    x = x_batch(3, seed=5)
    np.savez(data, input=x)
    assert main(["run", str(art), "--data", str(data), "--out", str(out)]) == 0
    want = OrtRunner(tiny.model(), "functions", 1).run({"input": x})
    got = np.load(out)
    assert all(np.array_equal(got[k], v) for k, v in want.items())


@pytest.mark.parametrize("argv, message", [
    (["-o", "{tmp}/a.bin"], "give --engine onnxruntime"),
    (["-o", "{tmp}/a.so", "--engine", "onnxruntime"], "writes a .onnx file"),
])
def test_engine_and_suffix_mismatch_is_one_line(tiny, tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["compile", str(tiny.int), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not list(tmp_path.iterdir())


def test_a_float_model_is_refused(tiny, tmp_path, capsys):
    assert main(["compile", str(tiny.fq), "-o", str(tmp_path / "a.onnx")]) == 2
    assert "not an integer model" in capsys.readouterr().err


def test_bench_times_the_saved_artifact_beside_the_engine(tiny, tmp_path, capsys):
    art = tmp_path / "int.ort.onnx"
    assert main(["compile", str(tiny.int), "-o", str(art), "-q"]) == 0
    argv = ["--artifact", str(art), "--iters", "1", "--warmup", "0", "--batch", "2", "--threads", "1"]
    assert main(["bench", str(tiny.int), *argv]) == 0
    out = capsys.readouterr().out
    assert "int: onnxruntime (int.ort.onnx)" in out and "exact: artifact == function bodies: yes" in out
