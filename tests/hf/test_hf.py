"""Hugging Face models as users export and quantize them convert in strict mode (the matrix of
``models/hf_matrix.py``: ViT, DeiT with teacher, Swin, BERT x TorchScript, dynamo, Optimum x onnxruntime,
NNCF, Optimum quantizers; issue #27's DINOv2 ... RoFormer x TorchScript, dynamo x onnxruntime int8 (vision),
the mask recipe and NNCF's transformer preset (text), one case per family in CI, the rest ``slow``).

Each case converts with ``rewrite`` in strict mode and the integer model is compared with its fake-quant
model on the held-out split: no float tensor, logits cosine >= 0.99 and top-1 agreement >= 99 % on the inputs
whose fake-quant top-1 has a margin, and an accuracy loss against the fake-quant model within chance
(McNemar's paired test, ``hf_matrix.accuracy_loss_within_chance``): bounds that hold on every CPU, whose
float kernels train the models (digits for the vision families, the synthetic topic task for the text ones)
to different weights (docs/testing.md). A BERT whose attention
mask the quantizer put inside a scale (onnxruntime without the recipe, NNCF's defaults) must be refused in one
line naming the tensor, the mask's fill value and the recipe's docs; an MPNet, whose log(0) position buckets
give a quantized tensor an infinite scale, in one line naming that scale. The integer model must also load
and run, bit for bit, in a plain onnxruntime session with the library (``hf_matrix.plain_session``). Each
test prints one JSON line (``-s``).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import onnx
import pytest

from ivit_onnx import ConversionError
from ivit_onnx.models import hf
from ivit_onnx.models import hf_matrix as hm

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


def _fake_quant(workshop, case):
    if "nncf" in case.quantizer:
        pytest.importorskip("nncf", reason="nncf is not installed (pip install -e '.[hf]')")
        workshop.fp32(case.family, case.exporter)  # an export that fails is a failure, not NNCF's
        try:
            return workshop.fake_quant(case)
        except Exception as e:  # NNCF's own failures on some exports (none of ours): the case has no model
            RESULTS[case] = {"case": case.name, "result": "failed", "error": f"{type(e).__name__}: {e}"}
            print("HF " + json.dumps(RESULTS[case]))
            pytest.skip(f"NNCF failed to quantize {case.fp32_name}: {type(e).__name__}: {e}")
    if "optimum" in (case.exporter, case.quantizer):
        from ivit_onnx.models.toolkit_env import ToolkitEnvError

        try:
            return workshop.fake_quant(case)
        except (ToolkitEnvError, OSError) as e:
            pytest.skip(f"isolated Optimum venv could not be built: {e}")
    return workshop.fake_quant(case)


def _params(cases) -> list:
    """The cases as pytest parameters, ``slow`` where the case is (``Case.slow``)."""
    return [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else []) for c in cases]


#: every case's result in this session, for the README's table (the last test)
RESULTS: dict = {}


def _tensor_names(path) -> set[str]:
    g = onnx.load(str(path)).graph
    return {t for n in g.node for t in (*n.input, *n.output) if t} | {n.name for n in g.node}


@pytest.mark.parametrize("case", _params(c for c in hm.CASES if c.refusal))
def test_broken_fake_quant_is_refused_with_the_tensor_and_the_cause(workshop, case):
    """A quantized mask (BERT without the recipe) or an infinite scale (MPNet): one line, the cause, a tensor
    of the model."""
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


@pytest.mark.parametrize("case", _params(c for c in hm.CASES if not c.refusal))
def test_converts_strictly_and_agrees(workshop, case):
    path = _fake_quant(workshop, case)
    result = hm.evaluate(case, path, workshop.data(case.family))
    RESULTS[case] = result
    print("HF " + json.dumps(result))
    assert result["result"] == "strict", result.get("error")
    assert result["float_offenders"] == 0, result
    if result["library"] != "no library":
        assert result["library"] == "exact", result
    # CPU-independent bounds (docs/testing.md): enough inputs with a margin for the agreement bound to mean
    # something (MobileViT, the weakest model, has 198 of 450), agreement and cosine there, and an accuracy
    # loss within chance (swin_optimum_optimum lost 5 images net of 450, 1.1 points, on an AVX2 EPYC)
    assert hm.failed_bounds(result) == [], result


@pytest.mark.parametrize("family", hf.TEXT)
def test_text_inputs_are_the_tokenizers_in_forward_order(family):
    """Each text family's inputs (what its export and feeds name) are parameters of its model's ``forward``,
    in that order."""
    import transformers

    params = list(inspect.signature(getattr(transformers, hf.SPECS[family].model_class).forward).parameters)
    names = hf.input_names(family)
    assert set(names) <= set(params) and sorted(names, key=params.index) == list(names), (names, params)


@pytest.mark.parametrize("case", _params(c for c in hm.CASES if c.quantizer == "ort_bert_recipe"))
def test_mask_recipe_finds_the_mask_nodes(workshop, case):
    """``ort_qdq.mask_nodes`` finds each text model's mask nodes: some, and none of them quantized, so the
    conversion never refuses the recipe's model for a quantized mask (it may refuse it for another op)."""
    from ivit_onnx.models.ort_qdq import mask_nodes

    excluded = mask_nodes(onnx.load(str(workshop.fp32(case.family, case.exporter))))
    assert excluded, f"no mask node found in the {case.family} {case.exporter} export"
    try:
        hm.convert(case, _fake_quant(workshop, case))
    except ConversionError as e:
        assert not all(re.search(p, str(e), re.I) for p in hm.MASK_REFUSAL), f"mask quantized: {e}"


def test_vitmae_logits_are_deterministic(workshop):
    """ViTMAE shuffles its patches with fresh noise on every call, even in eval mode; with mask_ratio 0 the
    shuffle is a permutation its encoder and mean pooling are invariant to (up to float summation order)."""
    import numpy as np
    import torch

    model = workshop.model("vitmae")
    x = torch.from_numpy(workshop.data("vitmae").test[hf.PIXELS])
    with torch.no_grad():
        a, b = (model(pixel_values=x).logits.numpy() for _ in range(2))
    assert np.array_equal(a.argmax(1), b.argmax(1)) and np.abs(a - b).max() <= 1e-4 * np.abs(a).max()


def test_sentence_embedding_converts_end_to_end(workshop, tmp_path):
    """A sentence-transformers model (the trained BERT's encoder, masked mean pooling with the 1e-9 clamp,
    L2 normalize; the embedding is the output) through TorchScript and the mask recipe converts strictly, the
    pooling and the normalization in integers, and follows the fake-quant embeddings: cosine >= 0.99 on every
    test sentence, and the fake-quant model's nearest neighbours."""
    import numpy as np
    import onnx

    from ivit_onnx.models.hf_export import export
    from ivit_onnx.models.hf_quant import QUANTIZERS
    from ivit_onnx.runners import make_runner

    split = workshop.data("bert")
    model = hf.SentenceEmbedding(workshop.model("bert").bert)
    fp32, fq = tmp_path / "embed_fp32.onnx", tmp_path / "embed_fq.onnx"
    export(model, "bert", fp32, "torchscript", {k: v[:2] for k, v in split.test.items()})
    QUANTIZERS["ort_bert_recipe"](fp32, fq, split.calibration())
    out, report = hm.convert(hm.Case("bert", "torchscript", "ort_bert_recipe"), fq)
    counts = report.counts["lower_integer"]
    assert counts["masked mean (integer division)"] == 1 and counts["IL2Norm"] == 1
    feeds = {k: v[: hm.BATCH] for k, v in split.test.items()}
    got = [next(iter(make_runner(b, m).run(feeds).values())).astype(np.float64)
           for b, m in (("library", out), ("onnxruntime", onnx.load(fq)), ("onnxruntime", onnx.load(fp32)))]
    emb_int, emb_fq, emb_fp32 = got
    cosine = lambda a, b: np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))  # noqa: E731
    neighbour = lambda e: np.argsort(-(e @ e.T), 1)[:, 1]  # noqa: E731
    assert cosine(emb_int, emb_fq).min() >= hm.MIN_COSINE
    # nearest neighbours: the fake-quant model's is the integer model's too, or within 0.01 of its similarity
    # (this task's sentences embed close together, so exact ties of rank flip with any rounding)
    sim, nn_fq = emb_int @ emb_int.T, neighbour(emb_fq)
    np.fill_diagonal(sim, -np.inf)
    assert np.all(sim[np.arange(len(sim)), nn_fq] >= sim.max(1) - 0.01)
    print(f"embedding cosine int/fq min {cosine(emb_int, emb_fq).min():.5f}, int/fp32 mean "
          f"{cosine(emb_int, emb_fp32).mean():.5f}, fq/fp32 mean {cosine(emb_fq, emb_fp32).mean():.5f}; "
          f"nearest neighbour int=fq {np.mean(neighbour(emb_int) == neighbour(emb_fq)):.2f}, "
          f"int=fp32 {np.mean(neighbour(emb_int) == neighbour(emb_fp32)):.2f}")


def test_readme_table_is_this_run():
    """README.md's Hugging Face table is what this run found (``python benchmarks/hf_table.py --readme``
    rewrites it, from a run of every case, slow ones too). Runs last; compares only when every case of the
    matrix ran in this session (``-m ""``)."""
    if set(RESULTS) != set(hm.CASES):
        pytest.skip("only a part of the matrix ran in this session")
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    start, end = hm.README_MARKERS
    assert start in readme and end in readme, "README.md has no Hugging Face table markers"
    quoted = readme.split(start, 1)[1].split(end, 1)[0].strip()
    drift = "README's Hugging Face table drifted: run benchmarks/hf_table.py --readme"
    assert quoted == hm.readme_table(RESULTS), drift
