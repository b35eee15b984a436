"""QAT trains what is deployed: the torch integer model == its export converted by ``ivit-onnx rewrite``.

The digits ViT (bundled FP32 weights), min/max-calibrated, 4-bit weights, a few QAT steps (EMA scales and
weights move), then: the integer ONNX graph's logits on the whole digits test split equal the QAT model's,
bit for bit; every integer tensor the QAT model computes is one of the graph's; and the straight-through
gradients reach every parameter. The same bit-exactness holds with the ablation's kernels
(``Options(gelu="ibert", layernorm="l1")``: IBertGELU, L1LayerNorm).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ivit_onnx.models import bundled, digits  # noqa: E402

#: the ablation's kernels (paper Table 2) in one model: I-BERT's GELU, Fully-8bit's L1 LayerNorm
ABLATION = {"gelu": "ibert", "layernorm": "l1"}


def train(**options):
    """The digits QAT model (4-bit weights, one short epoch) with ``Options(**options)``: the model, its
    scales before training, the test split and the model's logits on it."""
    from ivit_onnx.models.make_default import QUANT_CONFIG
    from ivit_onnx.models.qat import qat
    from ivit_onnx.models.qat_digits import QAT_CONFIG, finetune, load_fp32_onnx
    from ivit_onnx.pipeline import Options

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x_tr, y_tr, x_te, y_te = digits.load_digits_split()
        qm = qat(
            load_fp32_onnx(bundled.default_fp32_path()),
            [torch.from_numpy(x_tr[:256])],
            weight_bits=4,
            options=Options(**options),
            **QUANT_CONFIG,
        )
        before = {n: m.scale.item() for n, m in qm.fq.named_modules() if hasattr(m, "calibrating")}
        finetune(qm, x_tr[:96], y_tr[:96], {**QAT_CONFIG, "epochs": 1}, log=False)
        with torch.no_grad():
            logits = qm(torch.from_numpy(x_te)).numpy()
    finally:
        torch.set_num_threads(threads)
    return qm, before, x_te, y_te, logits


def convert(qm, x, tmp, **options):
    """The QAT model's export (``IntegerViT.fq``) after ``ivit-onnx rewrite`` with ``options``; the report."""
    from ivit_onnx import rewrite
    from ivit_onnx.models.export import export_onnx

    export_onnx(qm.fq, torch.from_numpy(x[:2]), tmp / "fq.onnx", exporter="dynamo", opset=17)
    return rewrite(tmp / "fq.onnx", tmp / "int.onnx", **options)


@pytest.fixture(scope="module")
def trained():
    return train()


@pytest.fixture(scope="module")
def converted(trained, tmp_path_factory):
    qm, _, x, *_ = trained
    return convert(qm, x, tmp_path_factory.mktemp("qat"))


def assert_graph_equals_qat_model(trained, converted) -> None:
    from ivit_onnx.opset.ort_library import session

    _, _, x, y, logits = trained
    model, report = converted
    assert report.notes["float_islands"] == []
    got = session(model, "functions").run(None, {"input": x})[0]
    assert got.dtype == logits.dtype == np.float32 and got.shape == (len(y), 10)
    diff = np.argwhere(got != logits)
    assert not len(diff), f"{len(diff)} of {logits.size} logits differ, first at {tuple(diff[0])}"
    assert (logits.argmax(-1) == y).mean() > 0.8  # a working classifier, not a degenerate constant


def test_integer_graph_equals_qat_model_bit_for_bit(trained, converted):
    assert_graph_equals_qat_model(trained, converted)


def test_ablation_kernels_integer_graph_equals_qat_model(tmp_path):
    """``Options(gelu="ibert", layernorm="l1")`` in QAT and in the rewrite: IBertGELU and L1LayerNorm in the
    graph, and its logits equal the QAT model's bit for bit."""
    trained = train(**ABLATION)
    model, report = convert(trained[0], trained[2], tmp_path, **ABLATION)
    ops = {n.op_type for n in model.graph.node}
    assert {"IBertGELU", "L1LayerNorm"} <= ops and not ops & {"ShiftGELU", "ILayerNorm"}
    assert_graph_equals_qat_model(trained, (model, report))


def test_integer_accuracy_exports_the_weight_scales_the_model_uses(trained, tmp_path):
    """After an optimizer step the weight scales are stale until the next forward refreshes them:
    ``qat_digits.integer_accuracy`` runs the model first, so its export carries the same scales."""
    import copy

    from ivit_onnx.models.qat_digits import integer_accuracy

    qm, _, x, y, _ = trained
    qm = copy.deepcopy(qm)
    with torch.no_grad():  # as a training step would: the largest weights of fc1 move
        qm.fq.blocks[0].mlp.fc1.weight.mul_(1.05)
    _, exact = integer_accuracy(qm, x[:64], y[:64], tmp_path, "stale")
    assert exact


def test_every_integer_tensor_is_in_the_integer_graph(trained, converted):
    """Tensor for tensor: each op output the QAT model computes (Requantize, IAdd, Shiftmax, ShiftGELU,
    ILayerNorm, integer MatMul/Conv + bias, Concat) is, bit for bit, a tensor of the converted graph."""
    from ivit_onnx.models.qat import record_integers
    from ivit_onnx.opset.reference import evaluator

    qm, _, x, *_ = trained
    x = x[:8]
    graph = evaluator(converted[0]).run(None, {"input": x}, intermediate=True)
    pool: dict[tuple, list[np.ndarray]] = {}
    for v in graph.values():
        v = np.asarray(v)
        if v.dtype.kind in "iu":
            pool.setdefault(v.shape, []).append(v.astype(np.int64))
    with torch.no_grad(), record_integers() as mine:
        qm.eval()(torch.from_numpy(x))
    assert len(mine) > 60
    missing = [
        i
        for i, t in enumerate(mine)
        if not any(np.array_equal(t.numpy(), g) for g in pool.get(tuple(t.shape), []))
    ]
    assert not missing, (
        f"{len(missing)} of {len(mine)} integer tensors have no twin in the graph, first #{missing[0]}"
    )


def test_qat_steps_move_scales_and_weights(trained):
    qm, before, *_ = trained
    after = {n: m.scale.item() for n, m in qm.fq.named_modules() if hasattr(m, "calibrating")}
    assert any(after[n] != before[n] for n in before), "EMA never updated an activation scale"
    assert after["blocks.0.attn.q_prob"] == before["blocks.0.attn.q_prob"] == 2**-8  # fixed softmax scale
    w = qm.fq.blocks[0].mlp.fc1
    q = torch.round(w.weight / w.w_scale[:, None])
    assert q.abs().max() <= 7  # 4-bit weights in the int8 container


def test_straight_through_gradients_reach_every_parameter(trained):
    qm, _, x, y, *_ = trained
    qm.eval()  # no EMA step: the scales the other tests see stay put
    loss = torch.nn.functional.cross_entropy(qm(torch.from_numpy(x[:16])), torch.from_numpy(y[:16]))
    grads = torch.autograd.grad(loss, list(qm.parameters()), allow_unused=True)
    names = [n for n, _ in qm.named_parameters()]
    dead = [n for n, g in zip(names, grads, strict=True) if g is None or not torch.any(g != 0)]
    assert not dead, f"no gradient for {dead}"


def test_unsupported_models_are_refused():
    from ivit_onnx.models.qat import qat
    from ivit_onnx.models.vit import vit

    model = vit(8, 2, 1, 10, 16, 1, 2, distilled=True)
    with pytest.raises(ValueError, match="distillation"):
        qat(model, [torch.zeros(2, 1, 8, 8)])
    with pytest.raises(ValueError, match="int8"):
        qat(vit(8, 2, 1, 10, 16, 1, 2), [torch.zeros(2, 1, 8, 8)], act_dtype="uint8")


@pytest.mark.parametrize("softmax", ["ibert", "lis"])
def test_softmax_ablation_kernels_bit_for_bit(trained, tmp_path, softmax):
    """``Options(softmax=...)`` (I-BERT's polynomial exp, FQ-ViT's Log-Int-Softmax): the QAT model run with
    that kernel equals its export converted with ``--softmax`` of the same name, logit for logit."""
    from ivit_onnx import rewrite
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.opset.ort_library import session
    from ivit_onnx.pipeline import Options

    qm, _, x, y, _ = trained
    x, y = x[:128], y[:128]
    saved = qm.opt
    try:
        qm.opt = Options(softmax=softmax)
        with torch.no_grad():
            logits = qm.eval()(torch.from_numpy(x)).numpy()
    finally:
        qm.opt = saved
    export_onnx(qm.fq, torch.from_numpy(x[:2]), tmp_path / "fq.onnx", exporter="dynamo", opset=17)
    model, report = rewrite(tmp_path / "fq.onnx", softmax=softmax)
    ops = {n.op_type for n in model.graph.node}
    assert {"IBertSoftmax" if softmax == "ibert" else "LogIntSoftmax"} <= ops and "Shiftmax" not in ops
    got = session(model, "library").run(None, {"input": x})[0]
    diff = np.argwhere(got != logits)
    assert not len(diff), f"{len(diff)} of {logits.size} logits differ, first at {tuple(diff[0])}"
    assert (logits.argmax(-1) == y).mean() > 0.8
