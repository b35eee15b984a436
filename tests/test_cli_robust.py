"""The CLI's promises on awkward input: one ``ivit-onnx: error:`` line and exit 2, files that follow the
umask and are never partial, external data in and out, symbolic input shapes for compile, clean help."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

from ivit_onnx import ConversionError, rewrite
from ivit_onnx.cli import build_parser, compile_shapes, main
from ivit_onnx.pipeline import Context, Pass, Pipeline
from tests.passes.test_lower_integer import _attention_like

PREFIX = "ivit-onnx: error:"


@pytest.fixture(scope="module")
def fq_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("robust") / "fq.onnx"
    onnx.save(_attention_like(), path)
    return path


def _one_error(capsys, argv) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(PREFIX), err
    return err


def test_usage_errors_are_one_line(capsys, fq_path, tmp_path):
    err = _one_error(capsys, ["rewrite", fq_path, "-o", tmp_path / "x.onnx", "--stop-after", "nope"])
    assert "'nope'" in err and "lower_integer" in err
    assert "required" in _one_error(capsys, ["rewrite"])
    assert "--frobnicate" in _one_error(
        capsys, ["rewrite", fq_path, "-o", tmp_path / "x.onnx", "--frobnicate"]
    )
    assert not (tmp_path / "x.onnx").exists()


def test_paths_are_named_as_given(capsys, fq_path, tmp_path):
    err = _one_error(capsys, ["rewrite", fq_path, "-o", tmp_path / "nodir" / "int.onnx"])
    assert "nodir/int.onnx" in err and "does not exist" in err and ".tmp" not in err
    assert "is a folder" in _one_error(capsys, ["rewrite", tmp_path, "-o", tmp_path / "int.onnx"])
    assert "is a folder" in _one_error(capsys, ["rewrite", fq_path, "-o", tmp_path])
    err = _one_error(
        capsys, ["rewrite", fq_path, "-o", tmp_path / "int.onnx", "--report", tmp_path / "no" / "r.json"]
    )
    assert "no/r.json" in err and not (tmp_path / "int.onnx").exists()  # checked before any work
    assert os.listdir(tmp_path) == []


def test_validate_errors_share_the_prefix(capsys, tmp_path):
    assert "no such file" in _one_error(capsys, ["validate", tmp_path / "missing.onnx"])
    assert "--batch" in _one_error(capsys, ["validate", tmp_path / "missing.onnx", "--batch", "0"])
    r = subprocess.run([sys.executable, "-m", "ivit_onnx.validate", "--frob"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith(PREFIX) and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_outputs_follow_the_umask(fq_path, tmp_path, umask):
    old = os.umask(umask)
    try:
        out, rep = tmp_path / "int.onnx", tmp_path / "r.json"
        assert main(["rewrite", str(fq_path), "-o", str(out), "--report", str(rep), "-q"]) == 0
    finally:
        os.umask(old)
    for p in (out, rep):
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask, oct(p.stat().st_mode)


def test_digits_without_scikit_learn_names_the_extra(monkeypatch, tmp_path):
    from ivit_onnx.inputs import InputError, InputSpec, digits_dataset

    for name in [m for m in sys.modules if m == "sklearn" or m.startswith("sklearn.")] + ["sklearn"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing sklearn or a submodule raises ImportError
    monkeypatch.delitem(sys.modules, "ivit_onnx.models.digits", raising=False)
    with pytest.raises(InputError, match=re.escape("pip install 'ivit-onnx[models]'")):
        digits_dataset([InputSpec("input", np.dtype(np.float32), (None, 1, 8, 8))])


def test_help_texts_are_clean():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "rewrite" in a.choices).choices
    texts = [parser.format_help()] + [p.format_help() for p in sub.values()]
    from ivit_onnx.validate import parser as validate_parser

    texts.append(validate_parser().format_help())
    for text in texts:
        assert "``" not in text and "Polygraphy" not in text and "debugging snapshot" not in text
    assert sub["run"].description and "compile" in sub["run"].description


def test_summary_shows_a_user_pass(fq_path):
    class CountMatMuls(Pass):
        name = "count_matmuls"

        def run(self, ctx: Context) -> bool:
            ctx.count(self.name, "MatMul", sum(n.op == "MatMul" for n in ctx.graph.nodes))
            return False

    p = Pipeline.default()
    p.insert_before("lower_integer", CountMatMuls())
    _, report = rewrite(fq_path, pipeline=p)
    assert "count_matmuls: MatMul 1" in report.summary()


def test_external_data_in_and_out(fq_path, tmp_path, capsys):
    model = onnx.load(fq_path)
    src = tmp_path / "ext.onnx"
    onnx.save(model, src, save_as_external_data=True, location="ext.data", size_threshold=16)
    assert (tmp_path / "ext.data").exists()
    reference, _ = rewrite(fq_path)
    # a path, through the CLI, written back with external data
    out = tmp_path / "int.onnx"
    assert main(["rewrite", str(src), "-o", str(out), "--external-data", "-q"]) == 0
    assert (tmp_path / "int.onnx.data").exists()
    back = onnx.load(out)  # loads the .data file next to it
    assert _weights(back) == _weights(reference)
    # a ModelProto with unloaded external tensors: base_dir names their folder
    lazy = onnx.load(src, load_external_data=False)
    got, _ = rewrite(lazy, base_dir=tmp_path)
    assert _weights(got) == _weights(reference)
    with pytest.raises(ConversionError, match="ext.data"):
        rewrite(lazy, base_dir=tmp_path / "elsewhere")
    # a missing data file is one line naming the tensor and the file
    os.rename(tmp_path / "ext.data", tmp_path / "moved.data")
    assert "ext.data" in _one_error(capsys, ["rewrite", src, "-o", tmp_path / "int2.onnx"])


def test_large_outputs_switch_to_external_data(fq_path, tmp_path, monkeypatch):
    import ivit_onnx.io as io

    monkeypatch.setattr(io, "MAX_PROTO_BYTES", 1000)  # stands in for protobuf's 2 GiB
    model, _ = rewrite(fq_path, tmp_path / "int.onnx")
    assert (tmp_path / "int.onnx.data").exists()
    assert _weights(onnx.load(tmp_path / "int.onnx")) == _weights(model)  # model kept its data in memory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int.onnx", "int.onnx.data"]


def _weights(m: onnx.ModelProto) -> dict:
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in m.graph.initializer}


def _symbolic(dims) -> onnx.ModelProto:
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, dims)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, dims)],
    )
    return onnx.helper.make_model(g)


def test_compile_shapes_symbolic_dims():
    assert compile_shapes(_symbolic(["batch", 4, 8]), [], "m.onnx") == {"x": [1, 4, 8]}
    assert compile_shapes(_symbolic(["batch", 4, 8]), ["x=8,4,8"], "m.onnx") == {"x": [8, 4, 8]}
    assert compile_shapes(_symbolic(["batch", "seq"]), ["x=2,16"], "m.onnx") == {"x": [2, 16]}
    with pytest.raises(ConversionError, match=r"dimension 1 \('seq'\).*--shape x=1,1"):
        compile_shapes(_symbolic(["batch", "seq"]), [], "m.onnx")
    for bad, msg in (
        ("x=8,5,8", "does not fit"),
        ("y=1,4,8", "no input"),
        ("x=a,b", "integer"),
        ("x=0,4,8", "positive"),
    ):
        with pytest.raises(ConversionError, match=msg):
            compile_shapes(_symbolic(["batch", 4, 8]), [bad], "m.onnx")
