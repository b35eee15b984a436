"""The library's fused ops and the session-time rewrites that write them, bit-exact against the references.

* :mod:`ivit_onnx.engines.onnxruntime.chain_fold`: a Requantize and the elementwise ops after it
  (Requantize, ShiftGELU, IBertGELU), and optionally the Shiftmax they feed, as ``ai.ivit.fused``
  RequantizeTable / RequantizeShiftmax: chains from hypothesis (per-tensor and per-channel heads, 8- and
  16-bit intermediates, increasing and decreasing tables, constant rows), the library's output equal to the
  reference evaluator's on the unfolded graph;
  what it must leave alone; the refusal of a table of the wrong size.
* :mod:`ivit_onnx.engines.onnxruntime.u8_gemm` with an activation B operand (attention): both operands uint8
  (uint8 x int8
  activations saturate without VNNI), or neither when one of them cannot be re-encoded.
* The C++ integer square root ILayerNorm uses equals ``math.isqrt`` on edge values.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime.chain_fold import FUSED_DOMAIN, fold_chains
from ivit_onnx.opset import OPS
from ivit_onnx.opset.functions import attach_functions
from ivit_onnx.opset.ort_library import native_library, session
from ivit_onnx.opset.reference import evaluator
from tests.opset.oneop import ibertgelu_params, shiftgelu_params, shiftmax_params

pytestmark = pytest.mark.skipif(native_library() is None, reason="native library not built")
PROPERTY = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
MID = {
    "int8": (np.int8, -128, 127),
    "uint8": (np.uint8, 0, 255),
    "int16": (np.int16, -300, 400),
    "int16 wide": (np.int16, -20000, 20000),  # too many values for the per-row-maximum exp table
}


def chain_model(rng, mid: str, tail: str, per_channel: bool, shape=(2, 3, 37)):
    """``x:int32 -> Requantize(mid) -> [tail] `` with converter-like parameters, and its feed."""
    dt, qmin, qmax = MID[mid]
    length = shape[-1]
    x = rng.integers(-(1 << 20), 1 << 20, shape).astype(np.int32)
    x[0, 0] = rng.integers(-100, 100)  # a constant row
    inits = {"zx": np.int32(rng.integers(-50, 50)), "zy": dt(rng.integers(qmin, qmax // 2))}
    b1 = rng.integers(1 << 10, 1 << 14, length if per_channel else 1).astype(np.int64)
    inits |= {"b1": b1, "c1": np.full(b1.shape, 24, np.int64)}
    nodes = [
        OPS["Requantize"].make_node(["x", "zx", "b1", "c1", "zy"], ["q"], name="head", qmin=qmin, qmax=qmax)
    ]
    last, out_type = "q", dt
    up = int(rng.integers(3, 12)) * (-1 if tail == "decreasing" else 1)
    if tail in ("gelu", "ibert_gelu", "softmax", "decreasing", "requantize", "softmax_after"):  # the upscale
        inits |= {"zq": dt(0), "bu": np.int64(up), "cu": np.int64(0), "z32": np.int32(0)}
        nodes.append(
            OPS["Requantize"].make_node(
                ["q", "zq", "bu", "cu", "z32"], ["v"], name="up", qmin=-(1 << 31), qmax=(1 << 31) - 1
            )
        )
        last, out_type = "v", np.int32
    if tail == "gelu":
        attrs, b, c = shiftgelu_params(1.0 / 300, 0.02, abs(up) * max(-qmin, qmax), 15, -128, 127)
        inits |= {"gb": np.int64(b), "gc": np.int64(c), "gz": np.int8(-3)}
        nodes.append(OPS["ShiftGELU"].make_node([last, "gb", "gc", "gz"], ["y"], name="gelu", **attrs))
        last, out_type = "y", np.int8
    elif tail == "ibert_gelu":
        attrs, b, c = ibertgelu_params(1.0 / 300, 0.02, abs(up) * max(-qmin, qmax), 15, -128, 127)
        inits |= {"gb": np.int64(b), "gc": np.int64(c), "gz": np.int8(-3)}
        nodes.append(OPS["IBertGELU"].make_node([last, "gb", "gc", "gz"], ["y"], name="gelu", **attrs))
        last, out_type = "y", np.int8
    elif tail in ("softmax", "decreasing", "softmax_direct"):
        inits["sz"] = np.uint8(0)
        nodes.append(
            OPS["Shiftmax"].make_node(
                [last, "sz"], ["y"], name="softmax", **shiftmax_params(1.0 / 500, length, 8)
            )
        )
        last, out_type = "y", np.uint8
    elif tail == "softmax_after":  # quantize_static's: 12 bits to int32, then a Requantize to int8
        inits |= {"sz": np.int32(-7), "pz": np.int32(0), "pb": np.int64(255 << 18), "pc": np.int64(28),
                  "py": np.int8(-128)}
        nodes.append(
            OPS["Shiftmax"].make_node(
                [last, "sz"], ["s"], name="softmax", **shiftmax_params(1.0 / 500, length, 12)
            )
        )
        nodes.append(
            OPS["Requantize"].make_node(
                ["s", "pz", "pb", "pc", "py"], ["y"], name="after", qmin=-128, qmax=127
            )
        )
        last, out_type = "y", np.int8
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.INT32, list(shape))],
        [helper.make_tensor_value_info(last, helper.np_dtype_to_tensor_dtype(np.dtype(out_type)), None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)], ir_version=10
    )
    return attach_functions(model), {"x": x}


def fused_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.domain == FUSED_DOMAIN]


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    mid=st.sampled_from(sorted(MID)),
    tail=st.sampled_from(
        ["gelu", "ibert_gelu", "softmax", "decreasing", "softmax_direct", "requantize", "softmax_after"]
    ),
    per_channel=st.booleans(),
)
def test_folded_chain_equals_the_reference(seed, mid, tail, per_channel):
    model, feeds = chain_model(np.random.default_rng(seed), mid, tail, per_channel)
    folded, n = fold_chains(model)
    softmax = tail in ("softmax", "decreasing", "softmax_direct", "softmax_after")
    if softmax and per_channel:  # the fused Shiftmax takes a per-tensor head only: the rest still folds
        want = [] if tail == "softmax_direct" else ["RequantizeTable"]
    elif tail == "softmax_after":  # the Requantize after the Shiftmax as a table over its outputs
        want = ["RequantizeShiftmaxTable"]
    else:
        want = ["RequantizeShiftmax"] if softmax else ["RequantizeTable"]
    assert fused_ops(folded) == want and n == len(want)
    used = {i for node in folded.graph.node for i in node.input}
    assert all(t.name in used for t in folded.graph.initializer)  # no parameter of a folded op is left over
    ref = evaluator(model).run(None, feeds)[0]
    got = session(folded, "library", threads=2).run(None, feeds)[0]
    assert got.dtype == ref.dtype and np.array_equal(got, ref)


def test_a_long_row_on_the_pool():
    """4096-long rows of the converter's softmax chain, onnxruntime's pool with 2 threads."""
    model, feeds = chain_model(np.random.default_rng(1), "int8", "softmax", False, shape=(4, 2, 4096))
    folded, _ = fold_chains(model)
    want = evaluator(model).run(None, feeds)[0]
    assert np.array_equal(session(folded, "library", threads=2).run(None, feeds)[0], want)


def test_what_is_left_alone():
    rng = np.random.default_rng(2)
    model, _ = chain_model(rng, "int8", "gelu", False)
    assert fold_chains(model, keep={"v"})[1] == 1  # the chain stops before a tensor someone reads
    # q kept: the upscale and the GELU after it, over q's int8 values
    assert fused_ops(fold_chains(model, keep={"q"})[0]) == ["RequantizeTable"]
    model.graph.output.append(helper.make_tensor_value_info("q", TensorProto.INT8, None))
    folded = fold_chains(model)[0]  # a graph output inside the chain: only what follows it folds
    assert [n.input[0] for n in folded.graph.node if n.domain == FUSED_DOMAIN] == ["q"]
    plain, _ = chain_model(rng, "int8", "none", False)
    assert fold_chains(plain)[1] == 0  # nothing after the Requantize
    wide, _ = chain_model(rng, "int8", "gelu", False)
    head = next(n for n in wide.graph.node if n.name == "head")
    next(a for a in head.attribute if a.name == "qmax").i = 1 << 20  # a table too big, over an int32 input:
    assert fused_ops(fold_chains(wide)[0]) == ["RequantizeTable"]  # only the upscale's chain, over int8
    assert next(n for n in fold_chains(wide)[0].graph.node if n.domain == FUSED_DOMAIN).input[0] == "q"
    fed, _ = chain_model(rng, "int8", "gelu", False)
    fed.graph.input.append(helper.make_tensor_value_info("gb", TensorProto.INT64, []))
    fed.graph.initializer.remove(next(t for t in fed.graph.initializer if t.name == "gb"))
    assert fused_ops(fold_chains(fed)[0]) == ["RequantizeTable"]  # stops before a non-constant parameter


@pytest.mark.parametrize("mid", ["int8", "int16 wide"])
def test_a_requantize_after_the_shiftmax(mid):
    """RequantizeShiftmaxTable on each of its paths (an increasing table: the per-row-maximum exps, or too
    many values for them; a decreasing one: the rows' own exps), 2 threads, against the reference
    evaluator."""
    for sign in (1, -1):
        model, feeds = chain_model(np.random.default_rng(5), mid, "softmax_after", False)
        bu = next(t for t in model.graph.initializer if t.name == "bu")
        bu.CopyFrom(numpy_helper.from_array(sign * numpy_helper.to_array(bu), "bu"))
        folded, _ = fold_chains(model)
        assert fused_ops(folded) == ["RequantizeShiftmaxTable"]
        ref = evaluator(model).run(None, feeds)[0]
        got = session(folded, "library", threads=2).run(None, feeds)[0]
        assert got.dtype == ref.dtype and np.array_equal(got, ref) and len(np.unique(ref)) > 5, (mid, sign)


@pytest.mark.parametrize("mid", ["int8", "uint8", "int16"])
def test_a_chain_over_its_input(mid):
    """A head with more outputs than a table takes (the upscale to int32) but an 8- or 16-bit input: the
    chain is tabulated over the input's every value (an identity Requantize, then the table), with the bits
    of the reference evaluator; an input whose declared type differs from its zero point's is left alone."""
    model, feeds = chain_model(np.random.default_rng(4), mid, "gelu", False)
    folded, n = fold_chains(model, keep={"q"})
    assert n == 1 and fused_ops(folded) == ["RequantizeTable"]
    node = next(n for n in folded.graph.node if n.domain == FUSED_DOMAIN)
    table = next(t for t in folded.graph.initializer if t.name == node.input[5])
    assert node.input[0] == "q" and numpy_helper.to_array(table).size == 1 << np.iinfo(MID[mid][0]).bits
    ref = evaluator(model).run(None, feeds)[0]
    got = session(folded, "library", threads=2).run(None, feeds)[0]
    assert got.dtype == ref.dtype and np.array_equal(got, ref)
    model.graph.value_info.append(helper.make_tensor_value_info("q", TensorProto.INT32, None))
    assert fold_chains(model, keep={"q"})[1] == 0


@pytest.mark.parametrize(
    ("tail", "suffix", "message"),
    [("gelu", "_chain_table", "qmax - qmin \\+ 1 entries"),
     ("softmax_after", "_post", "after the Shiftmax must be 1-D with 2\\*\\*bits \\+ 1")],
)
def test_a_table_of_the_wrong_size_is_refused_with_the_node_name(tail, suffix, message):
    """A table (RequantizeTable's, or RequantizeShiftmaxTable's after the Shiftmax) cut short: refused, naming
    the node."""
    model, feeds = chain_model(np.random.default_rng(3), "int8", tail, False)
    folded, _ = fold_chains(model)
    table = next(t for t in folded.graph.initializer if t.name.endswith(suffix))
    table.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(table)[:100], table.name))
    with pytest.raises(Exception, match="head_fused.*" + message):
        session(folded, "library").run(None, feeds)


# --------------------------------------------------------------------- u8 re-encoding, attention operands


def attention_model():
    """``t = Requantize(x)``; ``MatMulInteger(t, Transpose(t))``: one producer as both A and B operand."""
    inits = [
        numpy_helper.from_array(np.array(v, dt), k)
        for k, v, dt in (("z", 0, np.int8), ("b", 3, np.int64), ("c", 1, np.int64), ("z8", -2, np.int8))
    ]
    nodes = [
        OPS["Requantize"].make_node(["x", "z", "b", "c", "z8"], ["t"], name="rq", qmin=-128, qmax=127),
        helper.make_node("Transpose", ["t"], ["tt"], perm=[0, 2, 1]),
        helper.make_node("MatMulInteger", ["t", "tt", "z8", "z8"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)], ir_version=10
    )
    return attach_functions(model)


def test_activation_operands_become_uint8_x_uint8():
    from ivit_onnx.engines.onnxruntime.u8_gemm import recode

    model = attention_model()
    done = recode(model)
    g = done.model.graph
    mm = next(n for n in g.node if n.op_type == "MatMulInteger")
    assert done.tensors == {"t", "tt"} and list(mm.input[:2]) == ["t", "tt"]
    types = {t.name: t.data_type for t in g.initializer}
    assert types[mm.input[2]] == types[mm.input[3]] == TensorProto.UINT8
    feeds = {"x": np.random.default_rng(4).integers(-128, 128, (2, 5, 4)).astype(np.int8)}
    want = evaluator(model).run(None, feeds)[0]
    assert np.array_equal(session(done.model, "library").run(None, feeds)[0], want)


def test_activation_operands_stay_int8_when_one_cannot_move():
    """B's producer also feeds a graph output (it must stay int8), so A stays int8 too."""
    from ivit_onnx.engines.onnxruntime.u8_gemm import recode

    model = attention_model()
    g = model.graph
    g.node.insert(1, OPS["Requantize"].make_node(["x", "z", "b", "c", "z8"], ["t2"], name="rq2", qmin=-128,
                                                 qmax=127))
    next(n for n in g.node if n.op_type == "Transpose").input[0] = "t2"
    g.output.append(helper.make_tensor_value_info("t2", TensorProto.INT8, None))
    done = recode(model)
    assert not done.tensors
    feeds = {"x": np.random.default_rng(5).integers(-128, 128, (2, 5, 4)).astype(np.int8)}
    want = evaluator(model).run(None, feeds)
    got = session(done.model, "library").run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


# ----------------------------------------------------------------------------------------- isqrt


def test_native_isqrt_is_math_isqrt_on_edge_values():
    lib = ctypes.CDLL(native_library())
    ks = [1, 2, 3, 1000, (1 << 31) - 1, 3037000499, (1 << 31)]
    v = [1 << e for e in range(62)] + [k * k + d for k in ks for d in (-1, 0, 1)]
    v += np.random.default_rng(5).integers(1, 1 << 62, 2000).tolist()
    v = np.array([x for x in v if 1 <= x < 1 << 62], np.int64)
    r = np.empty_like(v)
    lib.ivit_isqrt(
        v.ctypes.data_as(ctypes.c_void_p), r.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(v.size)
    )
    assert r.tolist() == [math.isqrt(int(x)) for x in v]


def test_fused_domain_is_registered_with_the_library():
    model, feeds = chain_model(np.random.default_rng(6), "uint8", "gelu", True)
    folded, _ = fold_chains(model)
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(native_library())
    sess = ort.InferenceSession(folded.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    assert np.array_equal(sess.run(None, feeds)[0], evaluator(model).run(None, feeds)[0])
