"""The C engine (:mod:`ivit_onnx.engines.c`): generated C99 built by the host compiler with ``-std=c99 -Wall
-Wextra -Werror`` and run through ctypes.

* bit for bit equal to the library (onnxruntime + the custom-op library) on the bundled digits model's whole
  test split, at the integer boundary (what the input QuantizeLinear writes -> what the output
  DequantizeLinear reads) and through the float boundary;
* every private op's C kernel equals its numpy reference on hypothesis cases (the strategies of
  ``tests/opset/test_bitexact.py``);
* no float in the object code: the model compiles with ``-mgeneral-regs-only`` (gcc refuses any float or
  vector-register value there) and calls nothing but memmove/memcpy/memset;
* ``ivit-onnx compile -o X.c`` / ``run X.c`` / ``bench --engines c``; an unsupported op is one line naming
  the node.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper

from ivit_onnx.cli import main
from ivit_onnx.engines.c.emit import write
from ivit_onnx.engines.c.engine import generate
from ivit_onnx.engines.c.plan import plan
from ivit_onnx.engines.c.session import FLAGS, CSession
from ivit_onnx.opset import OPS, native_kernels
from tests.opset.oneop import one_node_model

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                                reason="no C compiler")

DIGITS_SHAPE = {"input": [1, 1, 8, 8]}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The bundled digits ViT converted to int.onnx, and its C build."""
    from ivit_onnx.models.bundled import default_model_path
    from ivit_onnx.rewrite import rewrite

    path = tmp_path_factory.mktemp("c") / "int.onnx"
    model, _ = rewrite(str(default_model_path()), str(path))
    gen = generate(model, DIGITS_SHAPE, "digits")
    return path, model, gen, CSession.from_text(gen.c, gen.h, gen.info)


@pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
def test_digits_test_split_bit_exact_with_the_library(digits):
    from ivit_onnx.models.digits import load_digits_split
    from ivit_onnx.runners import OrtRunner

    _, model, gen, session = digits
    _, _, x, _ = load_digits_split()
    q_out, dq_in = gen.info["inputs"][0]["tensor"], gen.info["outputs"][0]["tensor"]
    want = OrtRunner(model, "library", 1).run_with({"input": x}, [q_out, dq_in])
    got = np.concatenate([session.run_int([want[q_out][i:i + 1]])[0] for i in range(len(x))])
    assert got.dtype == want[dq_in].dtype and got.shape == want[dq_in].shape
    same = np.all(got.reshape(len(x), -1) == want[dq_in].reshape(len(x), -1), axis=1)
    assert int(same.sum()) == len(x) == 450
    # through the float boundary (numpy Q/DQ in the session): the library's float logits, bit for bit
    assert np.array_equal(session.run(None, {"input": x})[0], want["logits"])


def test_digits_footprint_and_no_float_code(digits, tmp_path):
    _, _, gen, _ = digits
    assert gen.info["arena_bytes"] > 0 and gen.info["weight_bytes"] > 0
    code = re.sub(r"/\*.*?\*/", "", gen.c, flags=re.S)  # the C without its comments
    assert not re.search(r"\b(float|double)\b|math\.h|\d\.\d|\d[eE]-?\d", code)
    (tmp_path / "digits.c").write_text(gen.c)
    (tmp_path / "digits.h").write_text(gen.h)
    cc = os.environ.get("CC") or shutil.which("gcc") or "cc"
    obj = tmp_path / "digits.o"
    flags = [*FLAGS, "-ffreestanding"]
    if platform.machine() in ("x86_64", "AMD64", "aarch64", "i686"):
        flags.append("-mgeneral-regs-only")  # any float value is then a compile error
    done = subprocess.run([cc, *flags, "-c", str(tmp_path / "digits.c"), "-o", str(obj)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    nm = shutil.which("nm")
    if nm:
        undefined = subprocess.run([nm, "-u", str(obj)], capture_output=True, text=True).stdout.split()
        called = {s for s in undefined if s not in ("U", "w")}
        assert called <= {"memmove", "memcpy", "memset"}, called


def test_general_regs_only_refuses_float(tmp_path):
    """The check above can fail: the same flags reject one double."""
    if platform.machine() not in ("x86_64", "AMD64", "aarch64"):
        pytest.skip("-mgeneral-regs-only is an x86/aarch64 flag")
    src = tmp_path / "f.c"
    src.write_text("#include <stdint.h>\nint32_t f(int32_t a) { double d = a; return (int32_t)(d * 1.5); }\n")
    cc = os.environ.get("CC") or shutil.which("gcc") or "cc"
    done = subprocess.run([cc, *FLAGS, "-mgeneral-regs-only", "-c", str(src), "-o", str(tmp_path / "f.o")],
                          capture_output=True, text=True)
    assert done.returncode != 0


# ---------------------------------------------------------------- every private op against its reference


def _kernel(spec, inputs, attrs):
    """The op's C kernel on ``inputs`` (the first fed, the rest constant) and the reference's output."""
    model, feeds = one_node_model(spec, inputs, attrs)
    x = next(iter(feeds.values()))
    p = plan(model, {next(iter(feeds)): list(x.shape)})
    c, h, info = write(p, "op")
    got = CSession.from_text(c, h, info).run_int([x])[0]
    return got, spec.run(*inputs, **attrs)


def _cases():
    from tests.opset.test_bitexact import CASES

    return CASES


OP_EXAMPLES = settings(max_examples=int(os.environ.get("IVIT_C_EXAMPLES", "6")), deadline=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_every_private_op_has_a_c_kernel():
    from ivit_onnx.engines.c.emit import ELEMENTWISE, ROW_OPS

    assert set(ELEMENTWISE) | set(ROW_OPS) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_kernel_bit_exact(op):
    @OP_EXAMPLES
    @given(case=_cases()[op])
    def prop(case):
        inputs, attrs = case
        got, want = _kernel(OPS[op], inputs, attrs)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)

    prop()


# ---------------------------------------------------------------- the standard integer ops


def _graph(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _c_run(model, feeds):
    name, x = next(iter(feeds.items()))
    c, h, info = write(plan(model, {name: list(x.shape)}), "m")
    return CSession.from_text(c, h, info).run_int([x])[0]


def _ref(model, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)[0]


def test_layout_ops_and_gemms_match_onnx():
    """Transpose / Slice / Gather / Expand / Concat / Reshape, MatMulInteger (batched, both operands
    dynamic, per-column zero point), ConvInteger and integer Add/Mul against onnx.reference."""
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 3, 6, 8), dtype=np.int8)
    w = onnx.numpy_helper.from_array(rng.integers(-128, 128, (5, 3, 2, 2), dtype=np.int8), "w")
    b = onnx.numpy_helper.from_array(rng.integers(-128, 128, (6, 7), dtype=np.int8), "b")
    bz = onnx.numpy_helper.from_array(rng.integers(-5, 5, (7,), dtype=np.int8), "bz")
    az = onnx.numpy_helper.from_array(np.int8(3), "az")
    consts = [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              [("perm_shape", [1, 3, 8, 6]), ("st", [1]), ("en", [5]), ("ax", [2]), ("idx", [2, 0, 1]),
               ("eshape", [2, 1, 1, 1, 1]), ("flat", [1, -1])]]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Slice", ["t", "st", "en", "ax"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["g"], axis=1),
        helper.make_node("MatMulInteger", ["g", "b", "az", "bz"], ["mm"]),
        helper.make_node("MatMulInteger", ["x", "t"], ["mm2"]),  # both dynamic, batched
        helper.make_node("ConvInteger", ["x", "w"], ["cv"], pads=[1, 0, 0, 1], strides=[2, 1]),
        helper.make_node("Add", ["mm", "mm"], ["sum"]),
        helper.make_node("Mul", ["mm2", "mm2"], ["sq"]),
        helper.make_node("Reshape", ["sum", "flat"], ["r1"]),
        helper.make_node("Reshape", ["sq", "flat"], ["r2"]),
        helper.make_node("Reshape", ["cv", "flat"], ["r3"]),
        helper.make_node("Expand", ["r1", "eshape"], ["ex"]),
        helper.make_node("Reshape", ["ex", "flat"], ["r4"]),
        helper.make_node("Concat", ["r4", "r2", "r3"], ["y"], axis=1),
    ]
    model = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 3, 6, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [w, b, bz, az, *consts])
    feeds = {"x": x}
    assert np.array_equal(_c_run(model, feeds), _ref(model, feeds))


def test_unsupported_op_is_one_line_naming_the_node(tmp_path, capsys):
    nodes = [helper.make_node("BitShift", ["x", "k"], ["y"], name="the_shift", direction="LEFT")]
    k = onnx.numpy_helper.from_array(np.array([1], np.uint8), "k")
    model = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 4])], [k])
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.c")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the_shift" in err and "BitShift" in err and "\n" not in err
    assert not (tmp_path / "m.c").exists()


# ---------------------------------------------------------------- the CLI and bench


@pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
def test_cli_compile_run_and_bench(digits, tmp_path, capsys):
    from ivit_onnx.runners import OrtRunner

    path, model, gen, _ = digits
    out = tmp_path / "model.c"
    assert main(["compile", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"arena {gen.info['arena_bytes']} bytes, weights {gen.info['weight_bytes']} bytes" in text
    assert "int model_run(const int8_t *input, int8_t *output);" in (tmp_path / "model.h").read_text()
    x = np.random.default_rng(1).random((3, 1, 8, 8), dtype=np.float32)
    np.savez(tmp_path / "x.npz", input=x)
    assert main(["run", str(out), "--data", str(tmp_path / "x.npz"), "--out", str(tmp_path / "y.npz")]) == 0
    want = OrtRunner(model, "library", 1).run({"input": x})["logits"]
    assert np.array_equal(np.load(tmp_path / "y.npz")["logits"], want)
    capsys.readouterr()
    argv = ["bench", str(path), "--engines", "onnxruntime,c", "--iters", "1", "--warmup", "0", "--batch", "2",
            "--threads", "1"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "int: c (" in text and "exact: c == function bodies: yes" in text


def test_float_boundary_helpers_match_quantize_linear(digits, tmp_path):
    """The header's optional float boundary: QuantizeLinear's rounding (half to even, saturation) and
    DequantizeLinear, against the session's numpy boundary (itself checked against the library above)."""
    import ctypes

    from ivit_onnx.engines.c.session import build, dequantize, quantize

    _, _, gen, _ = digits
    b_in, b_out = gen.info["inputs"][0], gen.info["outputs"][0]
    (tmp_path / "digits.h").write_text(gen.h)
    (tmp_path / "t.c").write_text(
        '#define DIGITS_FLOAT_BOUNDARY\n#include "digits.h"\n'
        "void q(const float *x, int8_t *y, float *z, int n) {\n  int k;\n"
        "  for (k = 0; k < n; k++) { y[k] = digits_quantize_input(x[k]);"
        " z[k] = digits_dequantize_output(y[k]); }\n}\n")
    build(str(tmp_path / "t.c"), str(tmp_path / "t.so"))
    s = np.float32(b_in["scale"][0])
    x = np.concatenate([(np.arange(-300, 300) + np.float32(0.5)) * s, np.arange(-300, 300) * s,
                        np.random.default_rng(0).normal(0, 1, 1000), [1e30, -1e30, 0.0]]).astype(np.float32)
    y, z = np.zeros(len(x), np.int8), np.zeros(len(x), np.float32)
    ptr = ctypes.c_void_p
    ctypes.CDLL(str(tmp_path / "t.so")).q(x.ctypes.data_as(ptr), y.ctypes.data_as(ptr), z.ctypes.data_as(ptr),
                                         ctypes.c_int(len(x)))
    assert np.array_equal(y, quantize(x, b_in["scale"], b_in["zero_point"], np.int8))
    assert np.array_equal(z, dequantize(y, b_out["scale"], b_out["zero_point"]))


def test_index_arithmetic_ops_match_onnx():
    """The ops of a BERT's mask and position ids: Gather with data-dependent indices, CumSum, Equal/Where,
    Clip, integer Div (truncating) and Mod (floor), ReduceSum, Cast, against onnx.reference."""
    rng = np.random.default_rng(1)
    ids = np.array([[3, -1, 0, 7, 2, 5]], np.int64)
    table = onnx.numpy_helper.from_array(rng.integers(-128, 128, (8, 4), dtype=np.int8), "table")
    consts = [onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in
              [("ax1", 1, np.int64), ("two", 2, np.int64), ("m3", -3, np.int64), ("lo", -2, np.int64),
               ("hi", 4, np.int64), ("axes", [1], np.int64), ("fill", -100, np.int32)]]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("CumSum", ["ids", "ax1"], ["cs"], exclusive=1, reverse=1),
        helper.make_node("Mod", ["cs", "m3"], ["md"]),
        helper.make_node("Div", ["cs", "m3"], ["dv"]),
        helper.make_node("Clip", ["dv", "lo", "hi"], ["cl"]),
        helper.make_node("Equal", ["md", "two"], ["eq"]),
        helper.make_node("Cast", ["cl"], ["c32"], to=TensorProto.INT32),
        helper.make_node("Where", ["eq", "fill", "c32"], ["wh"]),
        helper.make_node("ReduceSum", ["emb", "axes"], ["rs"], keepdims=0),
        helper.make_node("Cast", ["rs"], ["rs32"], to=TensorProto.INT32),
        helper.make_node("Concat", ["wh", "rs32"], ["y"], axis=1),
    ]
    model = _graph(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [table, *consts])
    feeds = {"ids": ids}
    assert np.array_equal(_c_run(model, feeds), _ref(model, feeds))


def _bit_exact_on(model, feeds) -> int:
    """Samples where the C build equals the library at the integer boundary."""
    from ivit_onnx.runners import OrtRunner

    shapes = {k: [1, *v.shape[1:]] for k, v in feeds.items()}
    gen = generate(model, shapes, "m")
    session = CSession.from_text(gen.c, gen.h, gen.info)
    ins, out = [b["tensor"] for b in gen.info["inputs"]], gen.info["outputs"][0]["tensor"]
    want = OrtRunner(model, "library", 1).run_with(feeds, [*ins, out])
    n = len(next(iter(feeds.values())))
    return sum(np.array_equal(session.run_int([want[t][i:i + 1] for t in ins])[0], want[out][i:i + 1])
               for i in range(n))


@pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
def test_bert_style_model_bit_exact(tmp_path):
    """The BERT-style encoder of the test suite (three int64 inputs, padded masks, token embedding)."""
    pytest.importorskip("torch")
    from ivit_onnx import rewrite
    from ivit_onnx.models.bert import bert_tiny, export_bert, fake_quant_bert
    from ivit_onnx.models.text_task import make_split

    calib = [make_split(64, 100 + i).feeds for i in range(2)]
    export_bert(fake_quant_bert(bert_tiny(), calib), tmp_path / "fq.onnx", seq=16)
    model, _ = rewrite(str(tmp_path / "fq.onnx"))
    feeds = make_split(6, 7).feeds
    assert _bit_exact_on(model, feeds) == 6


@pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
def test_swin_model_bit_exact(tmp_path):
    """The test suite's tiny Swin (shifted windows: masks, rolls as index maps, mean pooling; ~8 s)."""
    pytest.importorskip("torch")
    from ivit_onnx import rewrite
    from ivit_onnx.models import swin as swin_module
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.quant import quantize
    from tests.models.conftest import fan_in_init, images

    fq = quantize(fan_in_init(swin_module.swin_tiny_test()), [images(8, 1)])
    export_onnx(fq, images(2, 3), tmp_path / "fq.onnx")
    model, _ = rewrite(str(tmp_path / "fq.onnx"))
    assert _bit_exact_on(model, {"input": images(4, 5).numpy()}) == 4


@pytest.mark.slow
@pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m0plus"])
def test_digits_on_cortex_m_under_qemu(digits, tmp_path, cpu):
    """The digits ViT cross-built for Cortex-M4 / Cortex-M0+ (no hardware divide) with arm-none-eabi-gcc:
    no float routine and no VFP instruction in the ELF; under qemu-system-arm's mps2-an386 (a Cortex-M4,
    which runs the M0+'s Thumb code too) its outputs on test images equal the library's (~20 s each)."""
    from ivit_onnx.engines.c import mcu
    from ivit_onnx.models.digits import load_digits_split
    from ivit_onnx.runners import OrtRunner

    if not all(mcu.tools().values()):
        pytest.skip("needs gcc-arm-none-eabi and qemu-system-arm")
    _, model, gen, _ = digits
    x = load_digits_split()[2][:3]
    q_out, dq_in = gen.info["inputs"][0]["tensor"], gen.info["outputs"][0]["tensor"]
    want = OrtRunner(model, "library", 1).run_with({"input": x}, [q_out, dq_in])
    main_text = mcu.main_c("digits", "digits.h", want[q_out], "int8_t", "int8_t", 10)
    elf = mcu.build(str(tmp_path), gen.c, gen.h, "digits", main_text, cpu)
    assert mcu.float_symbols(elf) == [] and mcu.vfp_instructions(elf) == []
    size = mcu.sizes(elf)
    assert size["bss"] >= gen.info["arena_bytes"] and size["text"] >= gen.info["weight_bytes"]
    got, counts = mcu.parse(mcu.run_qemu(elf), np.int8)
    assert np.array_equal(got, want[dq_in].reshape(len(x), -1)) and len(counts) == len(x)


def test_names_that_would_close_a_c_comment():
    """Tensor and node names land in comments and in the header's metadata: ``*/`` in them stays inside."""
    nodes = [helper.make_node("Add", ["x*/", "x*/"], ["y*/z"], name="a*/b")]
    model = _graph(nodes, [helper.make_tensor_value_info("x*/", TensorProto.INT32, [1, 3])],
                   [helper.make_tensor_value_info("y*/z", TensorProto.INT32, [1, 3])])
    feeds = {"x*/": np.array([[1, -2, 3]], np.int32)}
    assert np.array_equal(_c_run(model, feeds), _ref(model, feeds))
