"""`ivit-onnx compile`/`run` on a model with a symbolic batch: the default (batch 1), `--shape`, progress
lines on stderr, an unknown non-batch dimension named in one line, and no partial output on failure."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.cli import main

pytest.importorskip("tvm")
pytestmark = pytest.mark.tvm


def _qdq(dims) -> onnx.ModelProto:
    s, z = numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        [s, z],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_symbolic_batch_defaults_to_one_and_shape_overrides(tmp_path, capsys):
    onnx.save(_qdq(["batch", 4]), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.so")]) == 0
    err = capsys.readouterr().err
    assert "compile: building for llvm" in err and "Traceback" not in err
    assert json.loads((tmp_path / "m.json").read_text())["inputs"][0]["shape"] == [1, 4]
    assert main(["run", str(tmp_path / "m.so")]) == 0 and "y: float32[1, 4]" in capsys.readouterr().out
    assert (
        main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m3.so"), "--shape", "x=3,4", "-q"])
        == 0
    )
    assert capsys.readouterr().err == ""
    assert json.loads((tmp_path / "m3.json").read_text())["inputs"][0]["shape"] == [3, 4]
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.savez(tmp_path / "x.npz", x=x)
    assert (
        main(
            [
                "run",
                str(tmp_path / "m3.so"),
                "--data",
                str(tmp_path / "x.npz"),
                "--out",
                str(tmp_path / "y.npz"),
            ]
        )
        == 0
    )
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_array_equal(
            y["y"], np.clip(np.rint(x / np.float32(0.05)), -128, 127) * np.float32(0.05)
        )


def test_unknown_sequence_dimension_is_one_line(tmp_path, capsys):
    onnx.save(_qdq(["batch", "sequence"]), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.so")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("ivit-onnx: error:")
        and "'sequence'" in err
        and "--shape x=" in err
        and "\n" not in err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
