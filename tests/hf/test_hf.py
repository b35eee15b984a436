"""Hugging Face models as users export and quantize them convert in strict mode (the matrix of
``models/hf_matrix.py``: ViT, DeiT with teacher, Swin, BERT x TorchScript, dynamo, Optimum x onnxruntime,
NNCF, Optimum quantizers).

Each case converts with ``rewrite`` in strict mode and the integer model is compared with its fake-quant
model on the held-out split: no float tensor, logits cosine >= 0.99 and top-1 agreement >= 99 % on the inputs
whose fake-quant top-1 has a margin, and accuracy within 1 point of the fake-quant model's (the models are
trained: digits for the vision families, the synthetic topic task for BERT). A BERT whose attention mask the
quantizer put inside a scale (onnxruntime without the recipe, NNCF's defaults) must be refused in one line
naming the tensor, the mask's fill value and the recipe's docs. Each test prints one JSON line (``-s``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from ivit_onnx import ConversionError
from ivit_onnx.models import hf_matrix as hm

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


def _fake_quant(workshop, case):
    if "nncf" in case.quantizer:
        pytest.importorskip("nncf", reason="nncf is not installed (pip install -e '.[hf]')")
    if "optimum" in (case.exporter, case.quantizer):
        from ivit_onnx.models.toolkit_env import ToolkitEnvError

        try:
            return workshop.fake_quant(case)
        except (ToolkitEnvError, OSError) as e:
            pytest.skip(f"isolated Optimum venv could not be built: {e}")
    return workshop.fake_quant(case)


#: every case's result in this session, for the README's table (the last test)
RESULTS: dict = {}


def _tensor_names(path) -> set[str]:
    g = onnx.load(str(path)).graph
    return {t for n in g.node for t in (*n.input, *n.output) if t} | {n.name for n in g.node}


@pytest.mark.parametrize("case", [c for c in hm.CASES if c.refusal], ids=lambda c: c.name)
def test_quantized_mask_is_refused_with_the_tensor_and_the_cause(workshop, case):
    path = _fake_quant(workshop, case)
    with pytest.raises(ConversionError) as e:
        hm.convert(case, path)
    message = str(e.value)
    RESULTS[case] = {"case": case.name, "result": "refused", "error": message}
    print("HF " + json.dumps({"case": case.name, "error": message}))
    assert "\n" not in message
    for pattern in case.refusal:
        assert re.search(pattern, message, re.I), f"{pattern!r} not in: {message}"
    named = set(re.findall(r"'([^']+)'", message))
    assert named & _tensor_names(path), f"no tensor of {path.name} named in: {message}"


@pytest.mark.parametrize("case", [c for c in hm.CASES if not c.refusal], ids=lambda c: c.name)
def test_converts_strictly_and_agrees(workshop, case):
    path = _fake_quant(workshop, case)
    result = hm.evaluate(case, path, workshop.data(case.family))
    RESULTS[case] = result
    print("HF " + json.dumps(result))
    assert result["result"] == "strict", result.get("error")
    assert result["float_offenders"] == 0, result
    assert result["inputs"] >= 0.5 * len(workshop.data(case.family).y_test), result  # margins are common
    assert result["cosine"] >= hm.MIN_COSINE and result["agreement"] >= hm.MIN_AGREEMENT, result
    assert abs(result["int_accuracy"] - result["fq_accuracy"]) <= hm.MAX_ACCURACY_DROP, result


def test_readme_table_is_this_run():
    """README.md's Hugging Face table is what this run found (``python benchmarks/hf_table.py --readme``
    rewrites it). Runs last; needs every case of the matrix in this session."""
    if set(RESULTS) != set(hm.CASES):
        pytest.skip("only a part of the matrix ran in this session")
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    start, end = hm.README_MARKERS
    assert start in readme and end in readme, "README.md has no Hugging Face table markers"
    quoted = readme.split(start, 1)[1].split(end, 1)[0].strip()
    drift = "README's Hugging Face table drifted: run benchmarks/hf_table.py --readme"
    assert quoted == hm.readme_table(RESULTS), drift
