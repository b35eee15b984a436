"""Kernel-in-the-loop QAT (``models/qat_swin.py``) on the digits Swin's configuration (random weights: the
shifted-window mask, patch merging and every LayerNorm/GELU/softmax site are there): every nonlinear op runs
its integer kernel, masked probabilities are exactly 0, the loop model is closer to the converted integer
graph than the plain fake-quant model is, it trains, and the recipe reports both graphs' accuracies."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from ivit_onnx.models import digits  # noqa: E402
from ivit_onnx.pipeline import Options  # noqa: E402

#: the paper's rows (``benchmarks/bench_ablation.py``)
CHOICES = [{}, {"softmax": "ibert"}, {"gelu": "ibert"}, {"softmax": "lis"}, {"layernorm": "l1"}]
IDS = ["ivit", "softmax-ibert", "gelu-ibert", "softmax-lis", "layernorm-l1"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """torch on one thread (two ran 10x slower on a shared 2-core machine), deterministic."""
    from ivit_onnx.models.make_default import deterministic

    with deterministic(1):
        yield


@pytest.fixture(scope="module")
def data():
    return digits.load_digits_split()


@pytest.fixture(scope="module")
def fp32():
    from ivit_onnx.models.digits_swin import SWIN_CONFIG
    from ivit_onnx.models.swin import swin

    torch.manual_seed(0)
    return swin(**SWIN_CONFIG).eval()


@pytest.fixture(scope="module")
def fq(fp32, data):
    from ivit_onnx.models.make_default import calibration
    from ivit_onnx.models.quant import quantize

    return quantize(fp32, calibration(data[0][:512]))


@pytest.fixture(scope="module")
def fq_path(fq, data, tmp_path_factory):
    from ivit_onnx.models.export import export_onnx

    path = tmp_path_factory.mktemp("swin") / "fq.onnx"
    export_onnx(fq, torch.from_numpy(data[2][:2]), path)
    return path


def loop_logits(fq, x, choices):
    from ivit_onnx.models.qat_swin import KernelLoop

    loop = KernelLoop(fq, Options(**choices)).eval()
    with torch.no_grad():
        return loop(torch.from_numpy(x)).numpy(), loop


def graph_logits(fq_path, x, choices):
    from ivit_onnx import rewrite
    from ivit_onnx.opset.ort_library import session

    model, _ = rewrite(fq_path, **choices)
    return session(model, "library", threads=1).run(None, {"input": x})[0]


@pytest.mark.parametrize("choices", CHOICES, ids=IDS)
def test_loop_runs_every_kernel_and_is_closer_to_the_graph(fq, fq_path, data, choices):
    """Each LayerNorm, GELU and softmax runs its kernel, and with the row's kernels in the loop the forward is
    nearer the converted graph than the fake-quant model's float ops are (not equal: the loop is not
    bit-exact)."""
    x = data[2][:96]
    mine, loop = loop_logits(fq, x, choices)
    sites = {"layernorm": torch.nn.LayerNorm, "gelu": torch.nn.GELU}
    want = {k: sum(isinstance(m, t) for m in fq.modules()) for k, t in sites.items()}
    want["softmax"] = sum(hasattr(m, "q_prob") for m in fq.modules())
    assert dict(loop.calls) == want and min(want.values()) > 0
    with torch.no_grad():
        plain = fq(torch.from_numpy(x)).numpy()
    graph = graph_logits(fq_path, x, choices)
    assert np.abs(graph - mine).mean() < 0.5 * np.abs(graph - plain).mean(), (graph - mine, graph - plain)


@pytest.mark.parametrize("softmax", ["shiftmax", "ibert", "lis"])
def test_masked_probabilities_are_exactly_zero(fq, data, softmax):
    """The shifted windows' mask, added to the scores after their quantizer, gives probability 0 exactly."""
    blocks = [b for b in fq.modules() if getattr(b, "attn_mask", None) is not None]
    assert blocks
    seen = []
    hooks = [b.attn.q_prob.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
             for b in blocks]
    try:
        loop_logits(fq, data[2][:16], {"softmax": softmax})
    finally:
        for h in hooks:
            h.remove()
    for block, p in zip(blocks, seen, strict=True):
        mask = block.attn_mask  # [windows, N, N] of 0 / -100
        p = p.view(-1, *mask.shape[:1], block.attn.num_heads, *mask.shape[1:])
        masked = (mask < 0)[None, :, None].expand_as(p)
        assert masked.any() and (p[masked] == 0).all()
        assert (p[~masked] > 0).any()


def test_straight_through_gradients_reach_every_parameter(fq, data):
    import copy

    from ivit_onnx.models.qat_swin import KernelLoop

    loop = KernelLoop(copy.deepcopy(fq), Options(gelu="ibert", layernorm="l1"))
    x, y = (torch.from_numpy(a[:32]) for a in data[:2])
    torch.nn.functional.cross_entropy(loop(x), y).backward()
    missing = [n for n, p in loop.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_it_trains_and_reports_both_graphs(fp32, fq, data, tmp_path):
    """One epoch in the loop on a slice of digits lowers the training loss; the recipe (PTQ, the loop, both
    graphs converted with the same kernels) reports every accuracy."""
    import copy

    from ivit_onnx.models import qat_swin
    from ivit_onnx.models.make_default import fit

    x_tr, y_tr, x_te, y_te = data
    small = (x_tr[:256], y_tr[:256], x_te[:96], y_te[:96])
    cfg = {**qat_swin.SWIN_QAT, "epochs": 1, "lr": 2e-3}
    loop = qat_swin.KernelLoop(copy.deepcopy(fq), Options(softmax="ibert"))
    xt, yt = torch.from_numpy(small[0]), torch.from_numpy(small[1])

    def loss():
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(loop.eval()(xt), yt))

    before = loss()
    fit(loop, *small[:2], cfg, log=False)
    assert loss() < before
    row = qat_swin.ptq_and_qat(fp32, small, cfg, tmp_path, Options(softmax="ibert"), log=False)
    assert set(row) == {"ptq", "qat", "loop", "agreement", "max_logit_diff", "qat_seconds"}
    assert all(0 <= row[k] <= 100 for k in ("ptq", "qat", "loop", "agreement")), row
    assert row["qat_seconds"] > 0 and np.isfinite(row["max_logit_diff"])


def test_refuses_models_it_cannot_loop(fp32, fq):
    import copy

    from ivit_onnx.models.qat_swin import KernelLoop
    from ivit_onnx.models.quant import act_quantizers

    with pytest.raises(ValueError, match="not a fake-quant model"):
        KernelLoop(fp32)
    raw = copy.deepcopy(fq)
    name, qz = next(iter(act_quantizers(raw).items()))
    qz.calibrating = True
    with pytest.raises(ValueError, match=f"{name}: quantizer not calibrated"):
        KernelLoop(raw)
