"""The bundled digits ViT: files, light imports, data split, accuracy in onnxruntime vs its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

from ivit_onnx.models import default_fp32_path, default_info_path, default_model_path, load_default_info


def test_bundled_files_exist_and_are_small():
    for path in (default_model_path(), default_fp32_path(), default_info_path()):
        assert path.is_file(), path
    assert default_model_path().stat().st_size < 2_000_000


def test_bundled_fake_quant_model_is_qdq():
    model = onnx.load(default_model_path())
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 10
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "MatMul", "Softmax", "LayerNormalization"} <= ops
    assert [i.name for i in model.graph.input] == ["input"]


def test_package_import_does_not_load_torch():
    code = (
        "import sys, ivit_onnx; pre = 'torch' in sys.modules; import ivit_onnx.models as m;"
        "m.default_model_path(); print(pre, 'torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    pre, post = run.stdout.split()
    if pre == "True":
        pytest.skip("ivit_onnx itself imports torch")
    assert post == "False"


def test_split():
    pytest.importorskip("sklearn")
    from ivit_onnx.models.digits import load_digits_split

    info = load_default_info()
    x_train, y_train, x_test, y_test = load_digits_split()
    assert x_train.shape == (info["split"]["n_train"], 1, 8, 8)
    assert x_test.shape == (info["split"]["n_test"], 1, 8, 8)
    assert x_train.dtype == "float32" and y_train.dtype == "int64"
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    assert sorted(set(y_test.tolist())) == list(range(10))


@pytest.mark.parametrize(
    "kind, path", [("fp32_onnx", default_fp32_path), ("fake_quant_onnx", default_model_path)]
)
def test_accuracy_matches_json(kind, path):
    pytest.importorskip("sklearn")
    from ivit_onnx.models.digits import load_digits_split, onnx_accuracy

    _, _, x_test, y_test = load_digits_split()
    accuracy = onnx_accuracy(path(), x_test, y_test)
    assert accuracy == pytest.approx(load_default_info()["test_accuracy"][kind], abs=0.5)
    assert accuracy > 90


@pytest.mark.slow
def test_make_default_reproduces_the_bundle(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from ivit_onnx.models.make_default import make_default

    info = make_default(tmp_path, log=False)
    bundled = load_default_info()
    for kind, accuracy in info["test_accuracy"].items():
        assert accuracy == pytest.approx(bundled["test_accuracy"][kind], abs=0.5), kind
    assert json.loads((tmp_path / default_info_path().name).read_text())["model"] == bundled["model"]
