"""The compile step's patch layout (:mod:`ivit_onnx.engines.onnxruntime.patch_layout`) on tiny patch
embeddings: ``ConvInteger`` (kernel == stride) -> bias Add -> per-channel Requantize on NCHW -> flatten ->
Transpose(1, 2) -> Requantize, as the converter writes a ViT's, compiled and run by the library equal to the
reference evaluator on the graph as converted, with the two transposes gone and the GEMM fused; the flatten's
target constant or torch's ``Shape -> Slice -> Concat``; a Shape read of the NCHW tensor kept; and the forms
it must leave alone (a parameter that is not per channel, a flatten that is not H*W)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime import compile_model
from ivit_onnx.engines.onnxruntime.patch_gemm import patch_gemm
from ivit_onnx.engines.onnxruntime.patch_layout import patch_layout
from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset.reference import evaluator
from tests.engines.test_qgemm_fold import library_run

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
N, CIN, S, P, C = 2, 3, 12, 4, 6  # batch, input channels, image size, patch, embedding channels


def patch_model(rng, *, flatten="shape", mult_shape=(C, 1, 1), read_shape=False,
                hw=None) -> tuple[onnx.ModelProto, dict]:
    """The converter's patch embedding; ``flatten``: "shape" (torch's Concat(Slice(Shape), [-1])) or "const"
    ([0, C, H*W]); ``mult_shape``: the first Requantize's multiplier shape; ``read_shape``: a Shape of the
    NCHW sum ("nchw") or of the flattened tensor ("flat"; the flatten's Shape then with start=0) as a graph
    output too; ``hw``: the flatten's last dimension (default H*W)."""
    g = S // P
    inits = {
        "w": rng.integers(-128, 128, (C, CIN, P, P)).astype(np.int8),
        "zx": np.uint8(rng.integers(0, 256)),
        "bias": rng.integers(-(1 << 12), 1 << 12, (C, 1, 1)).astype(np.int32),
        "z0": np.int32(rng.integers(-50, 50)),
        "m0": rng.integers(1 << 12, 1 << 16, mult_shape).astype(np.int64),
        "c0": np.full(mult_shape, 8, np.int64),
        "zy0": np.int32(3),
        "z1": np.int32(0), "m1": np.int64(rng.integers(1 << 20, 1 << 22)), "c1": np.int64(30),
        "zy1": np.int8(rng.integers(-20, 20)),
    }
    nodes = [
        helper.make_node("ConvInteger", ["x", "w", "zx"], ["conv"], kernel_shape=[P, P], strides=[P, P]),
        helper.make_node("Add", ["conv", "bias"], ["sum"]),
        OPS["Requantize"].make_node(["sum", "z0", "m0", "c0", "zy0"], ["r0"], name="per_channel",
                                    qmin=-(1 << 31), qmax=(1 << 31) - 1),
    ]
    if flatten == "const":
        inits["target"] = np.array([0, C, hw or g * g], np.int64)
    else:
        inits |= {"s0": np.array([0], np.int64), "s2": np.array([2], np.int64),
                  "tail": np.array([-1], np.int64)}
        start = {"start": 0} if read_shape == "flat" else {}
        nodes += [helper.make_node("Shape", ["sum"], ["shape"], **start),
                  helper.make_node("Slice", ["shape", "s0", "s2"], ["nc"]),
                  helper.make_node("Concat", ["nc", "tail"], ["target"], axis=0)]
    nodes += [
        helper.make_node("Reshape", ["r0", "target"], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["tokens"], perm=[0, 2, 1]),
        OPS["Requantize"].make_node(["tokens", "z1", "m1", "c1", "zy1"], ["y"], name="to_int8", qmin=-128,
                                    qmax=127),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT8, None)]
    if read_shape:
        nodes.append(helper.make_node("Shape", ["sum" if read_shape == "nchw" else "flat"], ["shape_read"]))
        outputs.append(helper.make_tensor_value_info("shape_read", TensorProto.INT64, None))
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [N, CIN, S, S])
    graph = helper.make_graph(nodes, "patch", [x], outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    from ivit_onnx.opset.functions import attach_functions

    return attach_functions(model), {"x": rng.integers(0, 256, (N, CIN, S, S)).astype(np.uint8)}


def transposes(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "Transpose" and [*n.attribute[0].ints] == [0, 2, 1] for n in model.graph.node)


@pytest.mark.parametrize("flatten,read_shape", [("shape", False), ("const", False), ("shape", "nchw"),
                                                ("shape", "flat")])
def test_patch_embedding_runs_on_tokens(flatten, read_shape):
    """The per-channel ops move onto the GEMM's tokens: no [0, 2, 1] transpose left, the GEMM and its bias in
    one QGemm, the outputs (and the NCHW shape read) equal the reference bit for bit."""
    rng = np.random.default_rng(3)
    model, feeds = patch_model(rng, flatten=flatten, read_shape=read_shape)
    moved, count = patch_layout(patch_gemm(model)[0])
    assert count == 1 and transposes(moved) == 0
    compiled = compile_model(model)
    assert compiled.counts["patch_layout"] == 1 and transposes(compiled.model) == 0
    assert "QGemm" in {n.op_type for n in compiled.model.graph.node}
    want = evaluator(model).run(None, feeds)
    got = library_run(compiled.model, feeds)
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    if read_shape:
        g = S // P
        assert got[1].tolist() == ([N, C, g, g] if read_shape == "nchw" else [N, C, g * g])


@pytest.mark.parametrize("case", ["not per channel", "not H*W", "kept"])
def test_left_alone(case):
    """A multiplier that broadcasts along W, a flatten to another length, or an NCHW tensor a caller keeps
    (validate's per-layer comparison) keeps the transposes; the compiled model stays exact."""
    rng = np.random.default_rng(4)
    keep = {"sum"} if case == "kept" else set()
    if case == "kept":
        model, feeds = patch_model(rng)
    elif case == "not per channel":
        model, feeds = patch_model(rng, mult_shape=(1, 1, 1, S // P))
    else:
        model, feeds = patch_model(rng, flatten="const", hw=-1)
        model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "target"))
        model.graph.initializer.append(numpy_helper.from_array(np.array([N, C // 2, -1], np.int64), "target"))
    assert patch_layout(patch_gemm(model)[0], keep=keep)[1] == 0
    compiled = compile_model(model, keep=keep)
    assert not compiled.counts.get("patch_layout")
    want = evaluator(model).run(None, feeds)
    got = library_run(compiled.model, feeds)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
