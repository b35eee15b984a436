"""The BERT-style encoder in strict mode: trained on the synthetic topic task (models/text_task.py),
fake-quant exported (models/bert.py), converted with no float island and no float tensor; integer vs
fake-quant agreement and accuracy on 1000 held-out sentences; bit-exact across the numpy reference, the
function bodies and the native library; masked keys get exactly zero probability; padding contents do
not matter."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from ivit_onnx import rewrite  # noqa: E402
from ivit_onnx.certify import float_offenders  # noqa: E402
from ivit_onnx.models.bert import bert_tiny, export_bert, fake_quant_bert  # noqa: E402
from ivit_onnx.models.runtime import ort_session  # noqa: E402
from ivit_onnx.models.text_task import make_split, train_text_bert  # noqa: E402
from ivit_onnx.runners import make_runner  # noqa: E402
from tests.graphs import op_counts  # noqa: E402

SEQ = 16
LAYERS = 2
AGREEMENT_BAR = 0.99  # top-1 agreement, integer vs fake-quant
ACCURACY_GAP_BAR = 1.0  # points of accuracy, integer vs fake-quant


@pytest.fixture(scope="module")
def bert():
    """The tiny BERT trained for 3 epochs (~5-10 s)."""
    return train_text_bert(epochs=3, n_train=1024)


def _calibration():
    return [make_split(64, 100 + i).feeds for i in range(4)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, bert):
    """(fake-quant path, fp32 path, integer model, report) of the trained BERT."""
    d = tmp_path_factory.mktemp("bert_task")
    export_bert(bert, d / "fp32.onnx", seq=SEQ)
    export_bert(fake_quant_bert(bert, _calibration()), d / "fq.onnx", seq=SEQ)
    int_model, report = rewrite(d / "fq.onnx")
    return d / "fq.onnx", d / "fp32.onnx", int_model, report


@pytest.fixture(scope="module")
def test_split():
    return make_split(1000, 7)


def _logits(model, feeds, backend="library"):
    """Logits of an integer model on ``backend``, or of a fake-quant/fp32 file in stock onnxruntime."""
    if not isinstance(model, onnx.ModelProto):
        return ort_session(model).run(None, feeds)[0]
    runner = make_runner(backend, model)
    return runner.run(feeds)[runner.output_names[0]]


def test_strict_no_float_tensor_and_op_counts(trained):
    _, _, model, report = trained
    assert float_offenders(model) == []
    assert report.notes["float_islands"] == [] and report.notes["integer_mac_percent"] == 100.0
    counts = op_counts(model)
    assert counts["ai.ivit:Shiftmax"] == LAYERS and counts["ai.ivit:ShiftGELU"] == LAYERS
    assert counts["ai.ivit:ILayerNorm"] == 2 * LAYERS + 1
    assert counts["ai.ivit:IAdd"] == 2 + 2 * LAYERS  # word+position, +token type, two residuals per layer
    assert counts["MatMulInteger"] == 8 * LAYERS + 1
    for float_op in ("MatMul", "Gemm", "Softmax", "LayerNormalization", "Erf"):
        assert float_op not in counts
    lowered = report.counts["lower_integer"]
    assert lowered["attention mask (Where)"] == LAYERS
    assert lowered["masked mean (integer division)"] == 1
    inits = {i.name: i for i in model.graph.initializer}
    lookups = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits]
    assert len(lookups) == 3  # word, position and token-type rows
    assert all(inits[n.input[0]].data_type == onnx.TensorProto.INT8 for n in lookups)


def _check_accuracy(name, fq_path, fp32_path, model, split):
    fq, got = _logits(fq_path, split.feeds), _logits(model, split.feeds)
    fp32 = _logits(fp32_path, split.feeds)
    y = split.labels
    acc = {k: 100 * float(np.mean(v.argmax(1) == y)) for k, v in (("fp32", fp32), ("fq", fq), ("int", got))}
    agree = float(np.mean(fq.argmax(1) == got.argmax(1)))
    print(
        f"BERT text task ({name}): {len(y)} sentences, accuracy fp32 {acc['fp32']:.2f}% fake-quant "
        f"{acc['fq']:.2f}% int {acc['int']:.2f}%, agreement int vs fake-quant {100 * agree:.2f}%"
    )
    assert acc["fq"] >= 90.0, acc  # it learned the task
    assert agree >= AGREEMENT_BAR and abs(acc["int"] - acc["fq"]) <= ACCURACY_GAP_BAR, (acc, agree)


def test_accuracy_and_agreement_vs_fake_quant(trained, test_split):
    _check_accuracy("int8, arith mask", trained[0], trained[1], trained[2], test_split)


#: the trained weights with the Where(mask, 0, finfo.min) mask, uint8 activations, an int16 residual, and
#: exported by dynamo: (config, quantization options, export options)
VARIANTS = {
    "where_mask": ({"mask_form": "where"}, {}, {}),
    "uint8_activations": ({}, {"act_dtype": "uint8"}, {}),
    "int16_residual": ({}, {"residual_bits": 16}, {}),
    "dynamo": ({}, {}, {"exporter": "dynamo"}),
}


@pytest.mark.parametrize(
    "variant", [pytest.param(v, marks=pytest.mark.slow) if v == "dynamo" else v for v in sorted(VARIANTS)]
)  # dynamo: its export alone takes ~15 s
def test_variants_strict_and_accurate(variant, bert, trained, test_split, tmp_path):
    config, options, export = VARIANTS[variant]
    model = bert
    if config:
        model = bert_tiny(**{**dataclasses.asdict(bert.config), **config})
        model.load_state_dict(bert.state_dict())
    export_bert(fake_quant_bert(model, _calibration(), **options), tmp_path / "fq.onnx", seq=SEQ, **export)
    int_model, report = rewrite(tmp_path / "fq.onnx")
    assert float_offenders(int_model) == [] and report.notes["float_islands"] == []
    assert report.counts["lower_integer"]["attention mask (Where)"] == LAYERS
    _check_accuracy(variant, tmp_path / "fq.onnx", trained[1], int_model, test_split)


def test_bitexact_reference_bodies_library(trained, test_split):
    _, _, model, _ = trained
    feeds = {k: v[:64] for k, v in test_split.feeds.items()}
    outs = {b: _logits(model, feeds, b) for b in ("reference", "functions", "library")}
    for b in ("functions", "library"):
        np.testing.assert_array_equal(outs[b], outs["reference"], err_msg=b)


def _shiftmax_outputs(model):
    return [n.output[0] for n in model.graph.node if n.op_type == "Shiftmax"]


def test_masked_keys_get_exactly_zero_probability(trained, test_split):
    _, _, model, _ = trained
    feeds = {k: v[:64] for k, v in test_split.feeds.items()}
    names = _shiftmax_outputs(model)
    got = make_runner("library", model).run_with(feeds, names)
    zps = {n.output[0]: n.input[1] for n in model.graph.node if n.op_type == "Shiftmax"}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    masked = feeds["attention_mask"] == 0  # [B, S]: keys
    assert masked.any() and (~masked).any()
    for name in names:
        y = got[name].astype(np.int64) - int(inits[zps[name]].reshape(-1)[0])
        assert y.shape == (64, 2, SEQ, SEQ)
        assert np.all(y.transpose(0, 3, 1, 2)[masked] == 0), name  # every query row, every head
        kept = y.transpose(0, 3, 1, 2)[~masked]
        assert kept.max() > 0


def test_padding_contents_do_not_change_the_result(trained, test_split):
    """Other pad token ids and token types under the mask give bit-identical logits; less padding (a shorter
    sequence) changes each unmasked probability by at most the masked keys' share of the Shiftmax sum
    (2**-n each, see passes/rules/mask.py), so the top-1 class stays."""
    _, _, model, _ = trained
    feeds = {k: v[:64].copy() for k, v in test_split.feeds.items()}
    base = _logits(model, feeds)
    pad = feeds["attention_mask"] == 0
    other = {k: v.copy() for k, v in feeds.items()}
    rng = np.random.default_rng(3)
    other["input_ids"][pad] = rng.integers(1, 64, int(pad.sum()))
    other["token_type_ids"][pad] = 1 - other["token_type_ids"][pad]
    np.testing.assert_array_equal(_logits(model, other), base)
    short = feeds["attention_mask"].sum(1) <= SEQ // 2  # sentences that fit half the sequence
    cut = {k: v[short, : SEQ // 2] for k, v in feeds.items()}
    assert short.sum() >= 8
    shorter = _logits(model, cut)
    assert np.array_equal(shorter.argmax(1), base[short].argmax(1))
    print(
        f"BERT padding: {int(short.sum())} sentences, {SEQ // 2} fewer pads: "
        f"{int(np.sum(shorter != base[short]))} of {shorter.size} logits differ, "
        f"max {np.abs(shorter - base[short]).max():.4f}"
    )


@pytest.mark.tvm
def test_tvm_llvm_bitexact(trained, test_split):
    """TVM (llvm, the private ops as fused kernels) equals the function bodies in onnxruntime bit for bit."""
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model

    model = trained[2]
    feeds = {k: v[:8] for k, v in test_split.feeds.items()}
    expected = _logits(model, feeds, "functions")
    (out,) = compile_model(model, shape={k: [8, SEQ] for k in feeds}).run(feeds)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_tvm_cuda_codegen(trained):
    """CUDA source and PTX without a GPU: every kernel traced, every GEMM (Q, K, V, Q·Kᵀ, P·V, output, two
    MLP per layer; the head) on 8-bit tensor cores, none storing int32: the masked scores
    ``Where(mask, fill, int32(scores))`` are recomputed in the Shiftmax kernel from the int8 scores and the
    mask; the head split and transposes run inside the GEMMs (prologue fusion)."""
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model
    from ivit_onnx.engines.tvm.cuda import cuda_sources, to_ptx
    from ivit_onnx.engines.tvm.proxies import measure

    model = trained[2]
    inits = {i.name for i in model.graph.initializer}
    shape = {i.name: [8, SEQ] for i in model.graph.input if i.name not in inits}
    art = compile_model(model, target="cuda", arch="sm_90", shape=shape)
    (source,) = cuda_sources(art.module)
    p = measure(art.module.as_text(), source, to_ptx(source, "sm_90"))
    assert p.untraced == [] and p.gemms == 8 * LAYERS + 1 and p.int8_tc_gemms == p.gemms, p.gemm_calls
    assert p.int32_gemm_outputs == 0, p.gemm_calls
    assert sum(c.startswith("ivit_masked_requantize_ivit_shiftmax") for c in p.calls) == LAYERS, p.calls
    assert not any(re.search(r"(?:^|_)(?:split|transpose\d*)$", c) for c in p.calls), p.calls


@pytest.mark.slow
def test_larger_encoder_trained_longer(test_split, tmp_path):
    """4 layers, hidden 64, 4 heads, 2048 sentences for 4 epochs (~1 minute): the same bars."""
    larger = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128}
    model = train_text_bert(epochs=4, n_train=2048, **larger)
    export_bert(model, tmp_path / "fp32.onnx", seq=SEQ)
    export_bert(fake_quant_bert(model, _calibration()), tmp_path / "fq.onnx", seq=SEQ)
    int_model, report = rewrite(tmp_path / "fq.onnx")
    assert float_offenders(int_model) == [] and report.counts["lower_integer"]["Shiftmax"] == 4
    _check_accuracy(
        "4 layers, hidden 64", tmp_path / "fq.onnx", tmp_path / "fp32.onnx", int_model, test_split
    )
