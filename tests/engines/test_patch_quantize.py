"""The compile step's fused patch input (:mod:`ivit_onnx.engines.onnxruntime.patch_quantize`, the library's
QuantizePatches in ``opset/native/patch_op.cpp``): ``QuantizeLinear -> Reshape -> Transpose(0, 2, 4, 1, 3,
5) -> Reshape`` on a float image, fused and run by the library, equal byte for byte to onnxruntime's own run
of the unfused graph: rounding ties, saturation on both sides, NaN and infinities, int8 and uint8 zero points
at their extremes, square and non-square patches, one and two threads; the forms the fusion must leave
alone; a mis-shaped image refused in one line naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime.patch_quantize import quantize_patches
from ivit_onnx.engines.onnxruntime.qgemm_fold import ENGINE_DOMAIN
from ivit_onnx.opset import native_kernels
from ivit_onnx.opset.ort_library import native_library

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")

SCALE = 0.25  # a power of two: x = (k + 0.5) * SCALE is an exact tie of x / SCALE


def patch_input(shape, patch, zp, *, scale=SCALE, perm=(0, 2, 4, 1, 3, 5), target2=None, output="tokens",
                extra_output=None, shape_read=False) -> onnx.ModelProto:
    """A float image [N, C, H, W] (static C, H, W) quantized and cut into patches as patch_gemm writes it;
    ``shape_read``: a Shape of the quantized image as a second output (a class token's batch size)."""
    n, c, h, w = shape
    ph, pw = patch
    ho, wo = h // ph, w // pw
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "scale"),
             numpy_helper.from_array(np.asarray(zp), "zp"),
             numpy_helper.from_array(np.array([0, c, ho, ph, wo, pw], np.int64), "t1"),
             numpy_helper.from_array(np.array(target2 or [0, ho * wo, c * ph * pw], np.int64), "t2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
             helper.make_node("Reshape", ["q", "t1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["p"], perm=list(perm)),
             helper.make_node("Reshape", ["p", "t2"], [output])]
    elem = TensorProto.UINT8 if np.asarray(zp).dtype == np.uint8 else TensorProto.INT8
    outputs = [helper.make_tensor_value_info(output, elem, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info(extra_output, elem, None))
    if shape_read:
        nodes.append(helper.make_node("Shape", ["q"], ["batch"], start=0, end=1))
        outputs.append(helper.make_tensor_value_info("batch", TensorProto.INT64, None))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", c, h, w])
    graph = helper.make_graph(nodes, "patches", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def run(model: onnx.ModelProto, x: np.ndarray, threads: int = 2, library: bool = True) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    if library:
        opts.register_custom_ops_library(native_library())
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def image(rng, shape, zp) -> np.ndarray:
    """Values across the range and past both ends, exact ties, and the special floats."""
    x = (rng.standard_normal(shape) * 60 * SCALE).astype(np.float32)
    flat = x.reshape(-1)
    k = rng.integers(-300, 300, flat.size // 4)
    flat[: k.size] = (k + 0.5) * SCALE  # ties, rounded to even
    edges = [(e - float(zp)) * SCALE for e in (127.5, -128.5, 255.5, -0.5)]  # ties at the clip bounds
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e-40, -1e-40, 3e38, -3e38, *edges],
                        np.float32)
    flat[-specials.size:] = specials
    rng.shuffle(flat)
    return flat.reshape(shape)


CASES = {  # image [N, C, H, W], patch, zero point
    "deit_like": ((2, 3, 32, 48), (16, 16), np.uint8(128)),
    "u8_edges": ((1, 3, 12, 12), (4, 4), np.uint8(255)),
    "u8_zero": ((3, 2, 8, 12), (4, 4), np.uint8(0)),
    "s8_low": ((2, 3, 12, 12), (4, 4), np.int8(-128)),
    "s8_high": ((1, 1, 6, 10), (3, 5), np.int8(127)),
    "s8_zero": ((2, 4, 4, 6), (2, 1), np.int8(0)),
    "one_patch": ((2, 3, 7, 7), (7, 7), np.uint8(3)),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_equals_onnxruntime(case, threads):
    shape, patch, zp = CASES[case]
    model = patch_input(shape, patch, zp)
    fused, count = quantize_patches(model)
    assert count == 1 and [n.op_type for n in fused.graph.node] == ["QuantizePatches"]
    assert fused.graph.node[0].domain == ENGINE_DOMAIN
    rng = np.random.default_rng([sum(shape), int(zp) + 128])
    for _ in range(3):
        x = image(rng, shape, zp)
        (expected,), (got,) = run(model, x, threads, library=False), run(fused, x, threads)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_shape_of_the_quantized_image():
    """A Shape of the quantized image (the class token's batch) then reads the float image: fused, same
    outputs."""
    shape, patch, zp = (3, 3, 8, 8), (4, 4), np.uint8(128)
    model = patch_input(shape, patch, zp, shape_read=True)
    fused, count = quantize_patches(model)
    assert count == 1 and [n.op_type for n in fused.graph.node] == ["QuantizePatches", "Shape"]
    assert fused.graph.node[1].input[0] == "x"
    x = image(np.random.default_rng(5), shape, zp)
    for a, b in zip(run(model, x, library=False), run(fused, x), strict=True):
        np.testing.assert_array_equal(a, b)


def test_left_alone():
    """A per-axis zero point, another permutation, a second Reshape's other target, an intermediate read
    elsewhere, and an image whose H is not whole patches: nothing fused."""
    shape, patch, zp = (1, 3, 8, 8), (4, 4), np.uint8(128)
    forms = [patch_input(shape, patch, np.full(3, 128, np.uint8)),
             patch_input(shape, patch, zp, perm=(0, 2, 4, 3, 1, 5)),
             patch_input(shape, patch, zp, target2=[0, 4, 48, 1]),
             patch_input(shape, patch, zp, extra_output="p"),
             patch_input((1, 3, 9, 8), patch, zp)]
    for model in forms[:-1]:
        assert quantize_patches(model)[1] == 0
    assert quantize_patches(forms[-1])[1] == 0
    assert quantize_patches(patch_input(shape, patch, zp), keep={"q"})[1] == 0


def test_mis_shaped_image_refused():
    node = helper.make_node("QuantizePatches", ["x", "scale", "zp"], ["y"], name="patches",
                            domain=ENGINE_DOMAIN, patch_h=2, patch_w=2)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(np.array(SCALE, np.float32), "scale"),
         numpy_helper.from_array(np.array(0, np.uint8), "zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ENGINE_DOMAIN, 1)], ir_version=10)
    with pytest.raises(Exception, match=r"QuantizePatches node 'patches'.*5 x 4 is not whole 2 x 2 patches"):
        run(model, np.zeros((1, 1, 5, 4), np.float32))
