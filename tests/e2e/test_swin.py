"""Swin end to end: every input form converts in strict mode (no float tensor) with the expected ops and
agrees with its fake-quant model; the integer graph is bit-exact across the numpy reference, the function
bodies and the native library (and TVM llvm); masked probabilities are exactly 0; the digits-trained Swin
keeps its fake-quant accuracy."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest

from ivit_onnx import rewrite
from ivit_onnx.certify import float_offenders
from ivit_onnx.runners import make_runner
from tests.graphs import op_counts

torch = pytest.importorskip("torch")

from ivit_onnx.models import swin as S  # noqa: E402
from ivit_onnx.models.export import export_onnx  # noqa: E402
from ivit_onnx.models.quant import quantize  # noqa: E402
from tests.models.conftest import fan_in_init  # noqa: E402

#: name -> (swin() arguments, how it is quantized); tiny: 32x32, patch 2, windows of 4 on maps of 16 and 8
CONFIGS = {
    "tiny": (dict(img_size=32, depths=(2, 2)), "torchscript"),
    "dynamo": (dict(img_size=32, depths=(2, 2)), "dynamo"),
    "ort_int8_sym": (dict(img_size=32, depths=(2, 2)), "int8_sym"),
    "ort_uint8_asym": (dict(img_size=32, depths=(2, 2)), "uint8_asym"),
    "ort_int8_sym_no_pre_process": (dict(img_size=32, depths=(2, 2)), "int8_sym/no_pre_process"),
    "padded": (dict(img_size=28, depths=(2, 2)), "torchscript"),  # maps 14 and 7: windows of 4 pad to 16, 8
    "no_shift": (dict(img_size=32, depths=(1, 1)), "torchscript"),  # one unshifted block per stage
    "strided_merge": (dict(img_size=32, depths=(1, 1), strided=True), "torchscript"),  # timm < 0.9 merging
}


def _images(n: int, seed: int, size: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(n, 3, size, size).astype(np.float32)


def _model(img_size: int, depths, strided: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = fan_in_init(S.swin(img_size, 2, 3, 10, 16, depths, (1, 2), 4, 2.0))
    for m in model.modules():
        if isinstance(m, S.PatchMerging):
            m.strided = strided
    return model


def _fake_quant(tmp_path, name: str) -> tuple[str, torch.nn.Module]:
    cfg, form = CONFIGS[name]
    model, size = _model(**cfg), cfg["img_size"]
    calib = [_images(8, i, size) for i in range(2)]
    path = tmp_path / f"{name}_fq.onnx"
    if form.startswith(("int8", "uint8")):  # onnxruntime's quantize_static, "/no_pre_process": without
        from ivit_onnx.models.ort_qdq import ort_quantize  # the quant_pre_process its docs recommend

        variant, _, pre = form.partition("/")
        export_onnx(model, torch.from_numpy(calib[0][:2]), tmp_path / "fp32.onnx")
        ort_quantize(tmp_path / "fp32.onnx", path, calib, variant=variant, preprocess=not pre)
    else:
        fq = quantize(model, [torch.from_numpy(c) for c in calib])
        export_onnx(fq, torch.from_numpy(calib[0][:2]), path, exporter=form)
    return str(path), model


def _blocks(model) -> list:
    return [b for stage in model.layers for b in stage.blocks]


def _run(backend: str, model: onnx.ModelProto, x: np.ndarray, extra=()) -> dict:
    return make_runner(backend, model, threads=1).run_with({"input": x}, list(extra))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_swin_converts_strict_and_bit_exact(name, tmp_path):
    fq_path, torch_model = _fake_quant(tmp_path, name)
    model, report = rewrite(fq_path)  # strict: raises on any float island
    assert float_offenders(model) == []
    assert report.notes["float_islands"] == [] and report.notes["integer_mac_percent"] == 100.0
    blocks = _blocks(torch_model)
    counts = op_counts(model)
    assert counts["ai.ivit:Shiftmax"] == len(blocks)
    assert counts["ai.ivit:ShiftGELU"] == len(blocks)
    assert counts["ai.ivit:ILayerNorm"] == 2 * len(blocks) + 1 + (len(torch_model.layers) - 1) + 1
    assert counts["ReduceSum"] == 1 and counts["ConvInteger"] == 1
    shifted = sum(b.shift > 0 for b in blocks)
    # our export quantizes the scores before the mask (Where on int32 scores); onnxruntime's quantizer
    # quantizes the masked sum (Where on the sum's own integers): a Where per shifted block either way
    assert counts.get("Where", 0) == shifted
    assert counts.get("Pad", 0) == sum(b.padded != b.resolution for b in blocks)
    for float_op in ("MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "Erf", "ReduceMean"):
        assert float_op not in counts
    x = _images(4, 7, CONFIGS[name][0]["img_size"])
    _check_masked_zero(model, blocks, x)
    outs = {b: _run(b, model, x)["logits"] for b in ("library", "functions", "reference")}
    np.testing.assert_array_equal(outs["functions"], outs["library"])
    np.testing.assert_array_equal(outs["reference"], outs["library"])
    fq = make_runner("onnxruntime", onnx.load(fq_path), threads=1).run({"input": x})["logits"]
    cos = np.sum(fq * outs["library"], 1) / (
        np.linalg.norm(fq, axis=1) * np.linalg.norm(outs["library"], axis=1)
    )
    assert cos.min() >= 0.99, cos


def _check_masked_zero(model: onnx.ModelProto, blocks: list, x: np.ndarray) -> None:
    """Each shifted block's Shiftmax (in graph order) writes 0 wherever its torch block's mask is -100."""
    shiftmax = [n.output[0] for n in model.graph.node if n.op_type == "Shiftmax"]
    got = _run("library", model, x, shiftmax)
    for block, out in zip(blocks, shiftmax, strict=True):
        if block.attn_mask is not None:
            masked = block.attn_mask.numpy() < 0
            p = got[out].reshape(-1, masked.shape[0], *got[out].shape[1:])
            assert np.all(p[np.broadcast_to(masked[None, :, None], p.shape)] == 0)


@pytest.mark.parametrize(
    "softmax, op", [("shiftmax", "Shiftmax"), ("ibert", "IBertSoftmax"), ("lis", "LogIntSoftmax")]
)
def test_masked_probabilities_are_exactly_zero(tmp_path, softmax, op):
    """Every softmax (``--softmax``'s kernel) fed by a masking Where writes 0 at every masked position (and
    not only there)."""
    model, _ = rewrite(_fake_quant(tmp_path, "tiny")[0], softmax=softmax)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    pairs = []
    for w in (n for n in model.graph.node if n.op_type == "Where"):
        t = w.output[0]
        while (node := next(n for n in model.graph.node if t in n.input)).op_type != op:
            t = node.output[0]
        pairs.append((w, node.output[0]))
    assert len(pairs) == 2
    got = _run("library", model, _images(8, 3, 32), [name for w, s in pairs for name in (w.output[0], s)])
    for w, s in pairs:
        scores = got[w.output[0]]
        probs, masked = got[s].reshape(scores.shape), np.broadcast_to(inits[w.input[0]], scores.shape)
        assert masked.any() and np.all(probs[masked] == 0) and np.all(probs[~masked].max() > 0)


@pytest.mark.tvm
def test_swin_tvm_llvm_bit_exact(tmp_path):
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model

    model, _ = rewrite(_fake_quant(tmp_path, "padded")[0])
    x = _images(2, 5, 28)
    expected = _run("library", model, x)["logits"]
    art = compile_model(model, shape={"input": list(x.shape)})
    np.testing.assert_array_equal(art.run({"input": x})[0], expected)


def _cuda_build(tmp_path, arch: str):
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model

    model, _ = rewrite(_fake_quant(tmp_path, "padded")[0])
    return model, compile_model(model, target="cuda", arch=arch, shape={"input": [16, 3, 28, 28]})


@pytest.mark.slow
@pytest.mark.tvm
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_swin_cuda_codegen(tmp_path):
    """CUDA source and PTX without a GPU: every kernel traced, every GEMM on int8 tensor cores (the
    10-class head's N < 16 too: padded to the tile)."""
    from ivit_onnx.engines.tvm.cuda import cuda_sources, int8_instructions, to_ptx
    from ivit_onnx.engines.tvm.proxies import measure

    _, art = _cuda_build(tmp_path, "sm_90")
    (source,) = cuda_sources(art.module)
    ptx = to_ptx(source, "sm_90")
    p = measure(art.module.as_text(), source, ptx)
    assert p.untraced == [] and p.gemms == 27 and p.int8_tc_gemms == p.gemms, p
    assert int8_instructions(ptx).get("wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32", 0) > 0


@pytest.mark.gpu
@pytest.mark.tvm
def test_swin_bit_exact_on_gpu(tmp_path):
    tvm = pytest.importorskip("tvm")
    if not tvm.cuda(0).exist:
        pytest.skip("no CUDA device")
    major, minor = tvm.cuda(0).compute_version.split(".")
    model, art = _cuda_build(tmp_path, f"sm_{major}{minor}")
    x = _images(16, 9, 28)
    np.testing.assert_array_equal(art.run({"input": x})[0], _run("library", model, x)["logits"])
