"""Every llvm GEMM form (engines/tvm/cpu_gemm.py) bit for bit on each path: VNNI (on a VNNI host), AVX2
``vpmaddwd`` (forced by ``IVIT_TVM_VNNI=0``, so it runs on VNNI hosts too) and the plain int32 tiling (an
x86-64 target without AVX2). Reference: onnxruntime running the function bodies, its MatMulInteger swapped for
an int32 MatMul (its uint8 x int8 kernel adds pairs of products in int16 with saturation on CPUs without
VNNI)."""

from __future__ import annotations

import platform

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.opset import OPS
from ivit_onnx.opset.functions import attach_functions

tvm = pytest.importorskip("tvm")
import onnxruntime as ort  # noqa: E402
from tvm import relax  # noqa: E402

from ivit_onnx.engines.tvm import compile_model  # noqa: E402
from ivit_onnx.engines.tvm.compile import fuse, make_target, relax_pipeline  # noqa: E402
from ivit_onnx.engines.tvm.cpu_gemm import (  # noqa: E402
    AVX2,
    VNNI,
    VNNI_ENV,
    has_vnni,
    int8_dot,
    llvm_asm,
    pack_gemms,
    schedule_gemms,
)

pytestmark = pytest.mark.tvm
X86 = platform.machine().lower() in ("x86_64", "amd64")
#: x86-64 without AVX2: no dot product, every integer GEMM on the int32 tiling (runs on any x86-64 host)
PLAIN_TARGET = {"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}
VNNI_TARGET = {"kind": "llvm", "mcpu": "cascadelake", "mtriple": "x86_64-linux-gnu", "num-cores": 2}
ONNX_TYPE = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
PAIRS = [("int8", "int8"), ("uint8", "int8"), ("int8", "uint8"), ("uint8", "uint8")]
#: (batch, M, K, N) of weight GEMMs: packed everywhere (M = 17 prime: rows from the batch); K % 4 != 0 (AVX2
#: packs it, VNNI leaves it to the int32 tiling); N % 8 != 0 (the int32 tiling everywhere)
WEIGHT_SHAPES = [(4, 17, 64, 48), (2, 16, 30, 32), (3, 5, 30, 20)]
#: (batch, heads, M, K, N) of activation GEMMs: whole tiles (no padding); M, N, K all padded; K odd
ACTIVATION_SHAPES = [(2, 3, 16, 64, 48), (2, 3, 17, 30, 17), (1, 2, 9, 31, 40)]


def _path(name: str, monkeypatch):
    """The target of dot-product path ``name``, after skipping where the host cannot run it."""
    monkeypatch.delenv(VNNI_ENV, raising=False)
    if name == "vnni":
        if not has_vnni(make_target("llvm")):
            pytest.skip("the host CPU has no AVX-512 VNNI")
        return "llvm"
    if name == "avx2":
        monkeypatch.setenv(VNNI_ENV, "0")
        if int8_dot(make_target("llvm")) is not AVX2:
            pytest.skip("the host CPU has no AVX2")
        return "llvm"
    if not X86:
        pytest.skip("an x86-64 target runs on x86-64 hosts only")
    return PLAIN_TARGET


def _has_pmaddwd(asm: str) -> bool:
    """AVX2's ``vpmaddwd``, or ``vpdpwssd``: LLVM fuses it with the accumulating add where the target has
    AVX-512 VNNI (the same exact sums)."""
    return "vpmaddwd" in asm or "vpdpwssd" in asm


def _extremes(rng, dtype: str, shape) -> np.ndarray:
    """Random ``dtype`` values, mostly the extremes (their products saturate an int16 pair sum)."""
    info = np.iinfo(dtype)
    pool = np.array([info.min, info.max, info.min + 1, info.max - 1, 0, 1], np.int64)
    uniform = rng.integers(info.min, info.max + 1, shape)
    x = np.where(rng.random(shape) < 0.7, rng.choice(pool, shape), uniform)
    return x.astype(dtype)


class _Graph:
    """Builds one model holding many independent GEMMs (one compile for all), and their random feeds."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inputs, self.outputs, self.inits, self.feeds = [], [], [], [], {}

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def input(self, name: str, dtype: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[dtype], list(shape)))
        self.feeds[name] = _extremes(self.rng, dtype, shape)
        return name

    def gemm(self, tag: str, a: str, b: str, zps: list[str], out_shape, epilogue: bool):
        """``MatMulInteger`` named ``tag``, with ``epilogue``: + int32 bias, Requantize to int8."""
        acc = f"{tag}_acc" if epilogue else tag
        self.nodes.append(helper.make_node("MatMulInteger", [a, b, *zps], [acc], name=f"{tag}_mm"))
        dtype = TensorProto.INT32
        if epilogue:
            n = out_shape[-1]
            bias = self.const(f"{tag}_bias", self.rng.integers(-(2**14), 2**14, n).astype(np.int32))
            self.nodes.append(helper.make_node("Add", [acc, bias], [f"{tag}_biased"]))
            args = [f"{tag}_biased", self.const(f"{tag}_zx", np.int32(0)),
                    self.const(f"{tag}_m", self.rng.integers(1 << 19, 1 << 21, n).astype(np.int64)),
                    self.const(f"{tag}_c", np.int64(31)), self.const(f"{tag}_zy", np.int8(-3))]
            self.nodes.append(OPS["Requantize"].make_node(args, [tag], qmin=-128, qmax=127))
            dtype = TensorProto.INT8
        self.outputs.append(helper.make_tensor_value_info(tag, dtype, list(out_shape)))

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "gemms", self.inputs, self.outputs, initializer=self.inits)
        return attach_functions(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                  ir_version=10))


def _zero_point(dtype: str, uint8_value: int) -> int:
    """MatMulInteger's zero points: nonzero for uint8 operands, 0 for int8 ones (symmetric)."""
    return uint8_value if dtype == "uint8" else 0


def _zero_points(g: _Graph, tag: str, a_type: str, b_type: str) -> list[str]:
    if a_type == b_type == "int8":
        return []
    return [g.const(f"{tag}_za", np.array(_zero_point(a_type, 131), a_type)),
            g.const(f"{tag}_zb", np.array(_zero_point(b_type, 3), b_type))]


def weight_gemms(seed: int = 0) -> _Graph:
    """Activation x constant weight, every signedness pair, shape and epilogue."""
    g = _Graph(seed)
    for a_type, w_type in PAIRS:
        for s, (batch, m, k, n) in enumerate(WEIGHT_SHAPES):
            for epilogue in (False, True):
                tag = f"w_{a_type}_{w_type}_{s}_{'rq' if epilogue else 'i32'}"
                x = g.input(f"{tag}_x", a_type, (batch, m, k))
                w = g.const(f"{tag}_w", _extremes(g.rng, w_type, (k, n)))
                g.gemm(tag, x, w, _zero_points(g, tag, a_type, w_type), (batch, m, n), epilogue)
    return g


def activation_gemms(seed: int = 1) -> _Graph:
    """Two activations (attention-like, batched), every signedness pair, shape and epilogue."""
    g = _Graph(seed)
    for a_type, b_type in PAIRS:
        for s, (batch, heads, m, k, n) in enumerate(ACTIVATION_SHAPES):
            for epilogue in (False, True):
                tag = f"a_{a_type}_{b_type}_{s}_{'rq' if epilogue else 'i32'}"
                a = g.input(f"{tag}_a", a_type, (batch, heads, m, k))
                b = g.input(f"{tag}_b", b_type, (batch, heads, k, n))
                g.gemm(tag, a, b, _zero_points(g, tag, a_type, b_type), (batch, heads, m, n), epilogue)
    return g


def exact_reference(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """onnxruntime on the function bodies, each ``MatMulInteger(a, b, za, zb)`` as ``(a - za) @ (b - zb)`` in
    int32 (exact here: |sum| < 2**31)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = []
    for node in model.graph.node:
        if node.op_type != "MatMulInteger":
            nodes.append(node)
            continue
        wide = []
        for i, name in enumerate(node.input[:2]):
            wide.append(f"{node.name}_in{i}")
            nodes.append(helper.make_node("Cast", [name], [wide[-1]], to=TensorProto.INT32))
            if len(node.input) > 2 + i and node.input[2 + i]:
                zp = f"{node.name}_zp{i}"
                nodes.append(helper.make_node("Cast", [node.input[2 + i]], [zp], to=TensorProto.INT32))
                nodes.append(helper.make_node("Sub", [wide[-1], zp], [f"{wide[-1]}_c"]))
                wide[-1] = f"{wide[-1]}_c"
        nodes.append(helper.make_node("MatMul", wide, list(node.output)))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _check(art, g: _Graph):
    got = dict(zip([o["name"] for o in art.outputs], art.run(g.feeds), strict=True))
    expected = exact_reference(g.model(), g.feeds)
    for name, ref in expected.items():
        assert got[name].dtype == ref.dtype, name
        np.testing.assert_array_equal(got[name], ref, err_msg=name)


@pytest.mark.parametrize("path", ["vnni", "avx2", "int32"])
@pytest.mark.parametrize("family", [weight_gemms, activation_gemms], ids=["weights", "activations"])
def test_gemm_forms_bit_exact(path, family, monkeypatch):
    """Each family's 24 GEMMs (signedness pairs, zero points, padded or not, with or without a Requantize
    epilogue) in one model, on the given path (the assembly shows it), equal to onnxruntime bit for bit."""
    target = _path(path, monkeypatch)
    g = family()
    art = compile_model(g.model(), target=target)
    asm = llvm_asm(art.module)
    assert ("vpdpbusd" in asm) == (path == "vnni")
    assert _has_pmaddwd(asm) == (path == "avx2")
    _check(art, g)


def test_the_reference_is_exact():
    """The reference's swapped GEMMs equal numpy's int64 matmul (so onnxruntime's saturation cannot hide)."""
    g = activation_gemms()
    expected = exact_reference(g.model(), g.feeds)
    for a_type, b_type in PAIRS:
        tag = f"a_{a_type}_{b_type}_0_i32"
        a = g.feeds[f"{tag}_a"].astype(np.int64) - _zero_point(a_type, 131)
        b = g.feeds[f"{tag}_b"].astype(np.int64) - _zero_point(b_type, 3)
        np.testing.assert_array_equal(expected[tag], a @ b)


def _relax_gemm(pairs) -> tuple[tvm.IRModule, list, dict]:
    """A Relax function of ``matmul(a, b, out_dtype=int32)`` per ``(a_type, b_type, a_shape, b_shape)``,
    ``b`` a constant where its shape is 2-D: the GEMM operands exactly as given (uint8 included, which the
    ONNX import only makes for the Shiftmax output), not shifted to int8 as MatMulInteger's are; returns the
    module, its parameters and the constants by GEMM."""
    bb = relax.BlockBuilder()
    params = []
    rng = np.random.default_rng(5)
    consts = {}
    with bb.function("main"):
        with bb.dataflow():
            outs = []
            for i, (a_type, b_type, a_shape, b_shape) in enumerate(pairs):
                a = relax.Var(f"a{i}", relax.TensorType(a_shape, a_type))
                params.append(a)
                if len(b_shape) == 2:
                    consts[i] = _extremes(rng, b_type, b_shape)
                    b = relax.const(consts[i])
                else:
                    b = relax.Var(f"b{i}", relax.TensorType(b_shape, b_type))
                    params.append(b)
                outs.append(bb.emit(relax.op.matmul(a, b, out_dtype="int32")))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out, params)
    return bb.get(), params, consts


#: weight GEMMs with int8/uint8 A, activation GEMMs of every signedness pair (padded and not)
RELAX_GEMMS = [
    ("int8", "int8", (4, 17, 64), (64, 48)),
    ("uint8", "int8", (2, 16, 32), (32, 32)),
    *[(a, b, (2, 3, 17, 30), (2, 3, 30, 17)) for a, b in PAIRS],
    *[(a, b, (2, 2, 16, 64), (2, 2, 64, 48)) for a, b in PAIRS],
]


@pytest.mark.parametrize("path", ["vnni", "avx2", "int32"])
def test_packed_operands_of_every_signedness(path, monkeypatch):
    """``pack_gemms`` on 8-bit GEMM operands as they reach it (uint8 too: VNNI's shifts and correction terms,
    AVX2's widening), built through the same passes as ``compile_model``, equal to numpy's matmul."""
    tgt = make_target(_path(path, monkeypatch))
    mod, params, consts = _relax_gemm(RELAX_GEMMS)
    mod, count = pack_gemms(mod, tgt)
    assert count == (len(RELAX_GEMMS) if path != "int32" else 0)
    mod = schedule_gemms(fuse(mod, tgt), tgt)
    with tvm.transform.PassContext(opt_level=3):
        exe = tvm.compile(mod, target=tgt, relax_pipeline=relax_pipeline(tgt))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    rng = np.random.default_rng(6)
    feeds = [_extremes(rng, str(p.ty.dtype), [int(d) for d in p.ty.shape]) for p in params]
    outs = vm["main"](*[tvm.runtime.tensor(f) for f in feeds])
    values = iter(feeds)
    for i, (_a_type, _b_type, _a_shape, b_shape) in enumerate(RELAX_GEMMS):
        a = next(values).astype(np.int64)
        b = consts[i].astype(np.int64) if len(b_shape) == 2 else next(values).astype(np.int64)
        np.testing.assert_array_equal(outs[i].numpy(), (a @ b).astype(np.int32), err_msg=str(RELAX_GEMMS[i]))


def test_vnni_switch(monkeypatch):
    """``IVIT_TVM_VNNI=0`` turns VNNI off on a VNNI target: its integer GEMMs take the AVX2 form (compiled for
    Cascade Lake on any host, assembly only)."""
    target = make_target(VNNI_TARGET)
    monkeypatch.delenv(VNNI_ENV, raising=False)
    assert has_vnni(target) and int8_dot(target) is VNNI
    monkeypatch.setenv(VNNI_ENV, "0")
    assert not has_vnni(target) and int8_dot(target) is AVX2
    g = _Graph(0)
    x = g.input("x", "int8", (2, 16, 64))
    g.gemm("y", x, g.const("w", _extremes(g.rng, "int8", (64, 48))), [], (2, 16, 48), epilogue=True)
    asm = llvm_asm(compile_model(g.model(), target=VNNI_TARGET).module)
    assert _has_pmaddwd(asm) and "vpdpbusd" not in asm
    assert int8_dot(make_target(PLAIN_TARGET)) is None
