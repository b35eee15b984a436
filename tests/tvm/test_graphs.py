"""Integer graphs through TVM (llvm): MatMulInteger variants, ConvInteger rewrites and a chained block are
bit-exact; the exported .so + sidecar reloads and runs."""

from __future__ import annotations

import itertools
import json

import numpy as np
import onnx
import pytest
from _tvm_cases import chain_model
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from test_prepare import GENERAL_CONVS, PATCH_CONVS, conv_model

from ivit_onnx.opset.reference import evaluator

tvm = pytest.importorskip("tvm")
from ivit_onnx.engines.tvm import compile_model, load, prepare_for_tvm, run  # noqa: E402
from ivit_onnx.engines.tvm.compile import import_relax, io_specs  # noqa: E402

pytestmark = pytest.mark.tvm

#: (a zero point, b zero point) per case; "vec" is a per-column vector
ZERO_POINTS = [(None, None), (128, None), (3, "vec"), (None, 5)]


def _matmul_batch(rng, k=24, n=8):
    """Every (int8|uint8) x (int8|uint8) pairing with several zero-point forms, one MatMulInteger each."""
    nodes, inputs, inits, outs, feeds = [], [], [], [], []
    for i, ((adt, bdt), (za, zb)) in enumerate(itertools.product(
            itertools.product([np.int8, np.uint8], repeat=2), ZERO_POINTS)):
        a = rng.integers(np.iinfo(adt).min, np.iinfo(adt).max, (2, 5, k), endpoint=True).astype(adt)
        b = rng.integers(np.iinfo(bdt).min, np.iinfo(bdt).max, (k, n), endpoint=True).astype(bdt)
        names = [f"a{i}", f"b{i}", "", ""]
        inits.append(numpy_helper.from_array(b, names[1]))
        if za is not None:
            names[2] = f"za{i}"
            za_value = za if adt == np.uint8 else za - 256 * (za > 127)
            inits.append(numpy_helper.from_array(np.asarray(za_value, adt), names[2]))
        if zb is not None:
            names[3] = f"zb{i}"
            zb_value = np.arange(n) % 7 if zb == "vec" else np.asarray(zb)
            inits.append(numpy_helper.from_array(zb_value.astype(bdt), names[3]))
        while not names[-1]:
            names.pop()
        nodes.append(helper.make_node("MatMulInteger", names, [f"y{i}"]))
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(adt))
        inputs.append(helper.make_tensor_value_info(names[0], elem, a.shape))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.INT32, (2, 5, n)))
        feeds.append(a)
    g = helper.make_graph(nodes, "mm", inputs, outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), feeds


def test_matmulinteger_int8_operands_bitexact():
    model, feeds = _matmul_batch(np.random.default_rng(0))
    prepared = prepare_for_tvm(model)
    mod, count = import_relax(prepared, io_specs(prepared)[0])
    assert count == len(model.graph.node)  # every MatMulInteger kept its operands 8-bit
    names = [i.name for i in model.graph.input]
    expected = ReferenceEvaluator(model).run(None, dict(zip(names, feeds, strict=True)))
    for int8 in (True, False):
        outs = compile_model(model, int8=int8).run(feeds)
        for out, ref in zip(outs, expected, strict=True):
            np.testing.assert_array_equal(out, ref)


@pytest.mark.filterwarnings("ignore:Field 'shape' of 'type'")  # the test models leave y's shape open
@pytest.mark.parametrize("case", PATCH_CONVS[:1] + PATCH_CONVS[2:] + GENERAL_CONVS)
def test_conv_integer_bitexact(case):
    model = conv_model(*case[:7], **case[7])
    rng = np.random.default_rng(4)
    x = rng.integers(np.iinfo(case[0]).min, np.iinfo(case[0]).max, case[2], endpoint=True).astype(case[0])
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(compile_model(model).run({"x": x})[0], expected)


@pytest.fixture(scope="module")
def chain():
    rng = np.random.default_rng(0)
    model = chain_model(rng)
    x = rng.integers(0, 256, (2, 8, 16)).astype(np.uint8)
    return model, x, evaluator(model).run(None, {"x": x})


@pytest.fixture(scope="module")
def chain_lib(chain, tmp_path_factory):
    """The chain compiled from a file and exported: (artifact, library directory)."""
    model, _, _ = chain
    tmp = tmp_path_factory.mktemp("chain")
    onnx.save(model, tmp / "model.onnx")
    return compile_model(tmp / "model.onnx", out=tmp / "lib" / "chain.so"), tmp / "lib"


def test_chain_bitexact_and_reload(chain, chain_lib):
    _, x, expected = chain
    art, lib = chain_lib
    assert art.info["int8_matmuls"] == 2
    for out, ref in zip(art.run({"x": x}), expected, strict=True):
        assert out.dtype == ref.dtype
        np.testing.assert_array_equal(out, ref)
    meta = json.loads((lib / "chain.json").read_text())
    assert meta["inputs"] == [{"name": "x", "shape": [2, 8, 16], "dtype": "uint8"}]
    assert [o["name"] for o in meta["outputs"]] == ["res", "probs"] and meta["target"]["kind"] == "llvm"
    for where in ("chain.so", "chain.json"):
        loaded = load(lib / where)
        for out, ref in zip(run(loaded, [x]), expected, strict=True):
            np.testing.assert_array_equal(out, ref)


def test_run_checks_feeds(chain, chain_lib):
    _, x, _ = chain
    art, _ = chain_lib
    with pytest.raises(KeyError):
        art.run({"y": x})
    with pytest.raises(ValueError, match="expected uint8"):
        art.run({"x": x.astype(np.int8)})


def test_dynamic_batch_needs_shape(chain):
    model, x, expected = chain
    dyn = onnx.ModelProto()
    dyn.CopyFrom(model)
    dyn.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    with pytest.raises(ValueError, match="dynamic shape"):
        compile_model(dyn)
    out = compile_model(dyn, shape={"x": [2, 8, 16]}).run([x])
    np.testing.assert_array_equal(out[0], expected[0])
