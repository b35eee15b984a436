"""QGemm's residual stage (``opset/native/qgemm.cpp``, ops ``ai.ivit.engine`` QGemmAdd / QGemmTableAdd): the
GEMM's Requantize (and table) output v, then an IAdd with r, bit for bit against numpy (the QGemm reference,
then the IAdd reference), on every instruction-set path this CPU has (``tests/arm/run.sh`` runs this file
on the emulated ARM cores). Cases: int8 and uint8 A, per-tensor and per-column Requantize, v as the IAdd's a
or b, activation residuals of every IAdd input type and constant ones (per column, single), sums that
saturate, multipliers within int32 and past it (the converter's, near 2**53: two products a lane), past 2**62
(the scalar epilogue), through a table, with a table after the sum (QGemmAddTable; byte tables through
vpermt2b where the CPU has VBMI, wider ones gathered), two IAdd stages (QGemmAddAdd), and through onnxruntime
with ``IVIT_GEMM_ISA``.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ivit_onnx.opset import native_kernels
from ivit_onnx.opset.iadd import reference as iadd
from tests.opset.test_qgemm import CODES, DOMAIN, ISAS, ROOT, _lib, case, need, ort_run, reference

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="native library not built")
RESIDUALS = (np.int8, np.uint8, np.int16, np.int32)


class Add(ctypes.Structure):
    """qgemm.h's IvitQGemmAdd."""

    _fields_ = [("r_code", ctypes.c_int), ("r_const", ctypes.c_void_p)] + [
        (name, ctypes.c_int64) for name in ("r_size", "zv", "mv", "zr", "mr", "shift", "zy", "qmin", "qmax")
    ] + [("out_code", ctypes.c_int), ("post", ctypes.c_void_p), ("post_code", ctypes.c_int),
         ("then", ctypes.c_void_p)]


def _add_lib():
    lib = _lib()
    p, i, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ivit_qgemm_create_add.argtypes = [c, c, i, i, p, p, i, i, p, p, p, i, i, i, i, p, c,
                                          ctypes.POINTER(Add), ctypes.POINTER(ctypes.c_char_p)]
    lib.ivit_qgemm_create_add.restype = p
    lib.ivit_qgemm_run_add.argtypes, lib.ivit_qgemm_run_add.restype = [p, p, i, p, i, p, c], c
    return lib


def residual(rng, c: dict, rdt, form: str, v_first: bool, out=np.int8, wide=False) -> dict:
    """IAdd parameters for the GEMM's output v and r (``form``: "act" an [M, N] activation, "column" N
    constants, "single" one): multipliers near 2**c so that sums reach past the output's clip."""
    rows, n = c["a"].shape[0], c["b"].shape[1]
    info = np.iinfo(rdt)
    shape = {"act": (rows, n), "column": (n,), "single": ()}[form]
    r = rng.integers(max(info.min, -(1 << 20)), min(info.max, 1 << 20) + 1, shape).astype(rdt)
    shift = int(rng.integers(40, 56) if wide else rng.integers(12, 31))  # wide: the converter's multipliers
    mv = int(rng.integers(1 << shift, 1 << (shift + 1))) * int(rng.choice([-1, 1]))
    rbits = np.iinfo(rdt).bits
    mr = int(rng.integers(1, max(2, (1 << max(shift + 9 - rbits, 1))))) * int(rng.choice([-1, 1]))
    o = np.iinfo(out)
    zy = out(rng.integers(max(o.min, -50), min(o.max, 50) + 1))
    vz = np.asarray(c["zy"]).dtype.type(rng.integers(-5, 6) if np.asarray(c["zy"]).dtype.kind == "i" else 3)
    return dict(r=r, zr=rdt(rng.integers(max(info.min, -9), 10)), zv=vz, mv=mv, mr=mr, shift=shift, zy=zy,
                qmin=int(o.min) + (1 if out == np.int8 else 0), qmax=int(o.max), v_first=v_first)


def stage(v: np.ndarray, res: dict) -> np.ndarray:
    """The IAdd reference on v and res's r, v on its side."""
    v_side = (v, res["zv"], np.int64(res["mv"]))
    r_side = (res["r"], res["zr"], np.int64(res["mr"]))
    (a, za, ma), (b, zb, mb) = (v_side, r_side) if res["v_first"] else (r_side, v_side)
    return iadd(a, b, za, zb, ma, mb, np.int64(res["shift"]), res["zy"], qmin=res["qmin"], qmax=res["qmax"])


def want(c: dict, res: dict, table=None, post=None, then=None) -> np.ndarray:
    """The QGemm reference, then the IAdd reference with v on its side (then a second IAdd on that sum,
    then post[sum - qmin])."""
    s = stage(reference(**c, table=table), res)
    if then is not None:
        s, res = stage(s, then), then
    return s if post is None else post[s.astype(np.int64) - res["qmin"]]


def _stage(res: dict) -> tuple[Add, list]:
    """qgemm.h's IvitQGemmAdd of a residual dict, and the arrays it points into (kept alive by the caller)."""
    r = np.ascontiguousarray(res["r"])
    act = r.ndim == 2
    consts = np.ascontiguousarray(r.reshape(-1).astype(np.int64))
    add = Add(r_code=CODES[r.dtype] if act else -1, r_const=None if act else consts.ctypes.data,
              r_size=consts.size, zv=int(res["zv"]), mv=res["mv"], zr=int(res["zr"]), mr=res["mr"],
              shift=res["shift"], zy=int(res["zy"]), qmin=res["qmin"], qmax=res["qmax"],
              out_code=CODES[np.asarray(res["zy"]).dtype])
    return add, [r, consts]


def run_c(isa: str, c: dict, res: dict, table=None, threads: int = 1, post=None, then=None,
          forms: list | None = None) -> np.ndarray:
    """The fused GEMM through the C entry points, on ``isa`` (then: a second IAdd stage's residual dict;
    forms: gets the epilogue's, ivit_qgemm_epilogue)."""
    lib = _add_lib()
    k, n = c["b"].shape
    arr = {key: np.ascontiguousarray(np.asarray(c[key]).reshape(-1).astype(np.int64))
           for key in ("zb", "zx", "mult", "shift")}
    tab = None if table is None else np.ascontiguousarray(table.astype(np.int32))
    mid = np.asarray(c["zy"]).dtype if table is None else table.dtype
    add, keep = _stage(res)
    last, out, r = add, res, keep[0]
    if then is not None:  # the second stage reads the first's sum; the activation residual is either one's
        second, more = _stage(then)
        keep += [second, *more]
        add.then = ctypes.addressof(second)
        last, out = second, then
        r = more[0] if more[0].ndim == 2 else r
    act = r.ndim == 2
    post32 = None if post is None else np.ascontiguousarray(post.astype(np.int32))
    if post is not None:
        last.post, last.post_code = post32.ctypes.data, CODES[post.dtype]
    # the IAdd is symmetric apart from which parameters go with which side: v takes the ones of its side
    err = ctypes.c_char_p()
    b = np.ascontiguousarray(c["b"])
    g = lib.ivit_qgemm_create_add(
        ISAS[isa], CODES[c["a"].dtype], k, n, b.ctypes.data, arr["zb"].ctypes.data, arr["zb"].size,
        int(c["za"]), arr["zx"].ctypes.data, arr["mult"].ctypes.data, arr["shift"].ctypes.data,
        arr["zx"].size, int(c["zy"]), c["qmin"], c["qmax"], None if tab is None else tab.ctypes.data,
        CODES[np.dtype(mid)], ctypes.byref(add), ctypes.byref(err))
    assert g, err.value
    try:
        if forms is not None:
            forms.append(lib.ivit_qgemm_epilogue(g))
        a = np.ascontiguousarray(c["a"])
        y = np.zeros((a.shape[0], n), np.asarray(out["zy"]).dtype if post is None else post.dtype)
        rc = lib.ivit_qgemm_run_add(g, a.ctypes.data, a.shape[0], r.ctypes.data if act else None,
                                    r.shape[0] if act else 0, y.ctypes.data, threads)
        assert rc == 0
        return y
    finally:
        lib.ivit_qgemm_destroy(g)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("adt", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
def test_residual_paths_bit_exact(isa, adt, per_column):
    need(isa)
    rng = np.random.default_rng([ISAS[isa], int(per_column), np.dtype(adt).num, 30])
    saturated, took = 0, []
    for k, n, rows in ((7, 17, 5), (64, 53, 50), (257, 100, 13)):
        for rdt in RESIDUALS:
            for form in ("act", "column", "single"):
                for v_first in (True, False):
                    c = case(rng, adt, k, n, rows, per_column)
                    res = residual(rng, c, rdt, form, v_first, out=(np.int8, np.uint8)[int(v_first)],
                                   wide=bool(rng.random() < 0.5))
                    if rng.random() < 0.5:  # the converter's Requantize shifts (hi32 on x86)
                        c["shift"] = rng.integers(33, 45, c["shift"].shape).astype(np.int64)
                    got = run_c(isa, c, res, threads=1 + 2 * int(form == "act"), forms=took)
                    expect = want(c, res)
                    msg = f"{isa} {rdt.__name__} {form} {v_first}"
                    np.testing.assert_array_equal(got, expect, err_msg=msg, strict=True)
                    saturated += int((expect == res["qmin"]).any() or (expect == res["qmax"]).any())
    assert saturated > 36, saturated  # of 72 cases, a clip reached
    if isa in ("vnni", "amx"):  # the stages' int32-lane form (stage shifts of 32 and more) and the 64-bit
        # one, with and without the Requantize's
        assert {f & 2 for f in took} == {0, 2} and {f & 1 for f in took} == {0, 1}, took


@pytest.mark.parametrize("isa", ISAS)
def test_converter_stages_across_tiles(isa):
    """The converter's regime: the Requantize's shifts of 33 and more (hi32), stage shifts of 32 and more
    (hadd) with multipliers inside int32 and past it (the converter's, near 2**50), one stage or
    quantize_static's two (the bias as a power of two, then the residual), N across whole and partial
    48-column tiles and 16-column vectors, int8 and uint8 sums, every residual type and form, v on either
    side."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 555)
    took, spread = [], 0
    for i, n in enumerate((1, 16, 47, 48, 49, 100, 197)):
        for j, out in enumerate((np.int8, np.uint8)):
            c = case(rng, np.uint8 if i % 2 else np.int8, 64 + i, n, 9 + 7 * i, bool(j), extremes=False)
            acc = (c["a"].astype(np.int64) - c["za"]) @ (c["b"].astype(np.int64) - c["zb"])
            c["zx"] = np.full(c["zx"].shape, int(np.median(acc)), np.int32)
            c["shift"] = rng.integers(33, 37, c["shift"].shape).astype(np.int64)
            c["mult"] = (2.0 ** c["shift"] * 40 / (acc.std() + 1)).astype(np.int64)
            rdt = RESIDUALS[(i + j) % 3]
            form = ("act", "column", "single")[(i + 2 * j) % 3]
            res = residual(rng, c, rdt, form, bool((i + j) % 2), out=out)
            # multipliers inside int32, or the converter's past it (two products a lane)
            sh, top = (int(rng.integers(32, 35)), 31) if i % 2 else (int(rng.integers(50, 54)), 49)
            sign = int(rng.choice([-1, 1]))
            res["shift"], res["mv"] = sh, int(rng.integers(1 << (top - 2), 1 << top)) * sign
            res["mr"] = int(rng.integers(1 << (top - 4), 1 << (top - 2))) * int(rng.choice([-1, 1]))
            res["r"] = (np.asarray(res["r"]) % 64).astype(rdt)
            got = run_c(isa, c, res, threads=1 + 2 * (i % 2), forms=took)
            expect = want(c, res)
            np.testing.assert_array_equal(got, expect, strict=True, err_msg=f"{isa} N={n} {out.__name__}")
            assert len(np.unique(expect)) > 1, "a case that clips every sum to one value"
            spread += int(len(np.unique(expect)) > 8)
            # quantize_static's: the bias (constants, v's multiplier 2**c), then this residual stage
            bias = residual(rng, c, np.int32, "column", True, out=np.int8)
            bias["shift"], bias["mv"], bias["mr"] = 34, 1 << 34, 1 << 20
            then = {**res, "zv": bias["zy"]}
            got = run_c(isa, c, bias, then=then, threads=2, forms=took)
            np.testing.assert_array_equal(got, want(c, bias, then=then), strict=True,
                                          err_msg=f"{isa} N={n} 2")
    assert spread >= 7, spread  # half the cases' sums spread over their range, not clipped to a few values
    if isa in ("vnni", "amx"):
        assert all(f & 3 == 3 for f in took), took
        assert {f & 4 for f in took} == {0, 4}, took


@pytest.mark.parametrize("isa", ISAS)
def test_table_after_the_sum(isa):
    """QGemmAddTable's stage: the sum through a table over add_qmin..add_qmax, for byte tables of the full
    range and of a narrower clip (vpermt2b where the CPU has VBMI), int16 ones (gathered), before it a table
    too (QGemmTableAddTable), activation and constant residuals, columns that leave a partial vector."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 91)
    for pdt, out, narrow, pre in ((np.uint8, np.int8, False, False), (np.int8, np.uint8, True, False),
                                  (np.int16, np.int8, False, False), (np.uint8, np.int8, False, True)):
        for n, form in ((53, "act"), (48, "column"), (7, "act")):
            c = case(rng, np.uint8, 67, n, 37, True)
            table = None
            if pre:
                table = rng.integers(-128, 128, c["qmax"] - c["qmin"] + 1).astype(np.int8)
            res = residual(rng, c, np.int8, form, form == "act", out=out)
            if pre:
                res["zv"] = np.int8(res["zv"])
            if narrow:
                res["qmin"], res["qmax"] = 20, 200
            info = np.iinfo(pdt)
            post = rng.integers(info.min, info.max + 1, res["qmax"] - res["qmin"] + 1).astype(pdt)
            got = run_c(isa, c, res, table=table, post=post, threads=2)
            np.testing.assert_array_equal(got, want(c, res, table=table, post=post), strict=True,
                                          err_msg=f"{isa} {pdt.__name__} {n} {form} {pre}")


@pytest.mark.parametrize("isa", ISAS)
def test_two_stages(isa):
    """QGemmAddAdd's stages: quantize_static's bias IAdd (constants) then the residual IAdd (an activation,
    v on either side), or the activation first and constants after; before them a table too, after them a
    table; the first stage's sum past its type (the scalar epilogue's cast)."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 123)
    saturated = 0
    for k, n, rows in ((64, 53, 29), (192, 48, 50), (7, 5, 9)):
        for first, second, v_first in (("column", "act", True), ("single", "act", False),
                                       ("act", "column", True)):
            c = case(rng, np.uint8, k, n, rows, True)
            res = residual(rng, c, np.int8, first, True, wide=bool(rng.random() < 0.5))
            # the second stage's v: the first's sum (its type, int8)
            then = residual(rng, {**c, "zy": res["zy"]}, np.int8, second, v_first, out=np.int8)
            got = run_c(isa, c, res, then=then, threads=2)
            expect = want(c, res, then=then)
            np.testing.assert_array_equal(got, expect, strict=True, err_msg=f"{isa} {first} {second} {k}")
            saturated += int((expect == then["qmin"]).any() or (expect == then["qmax"]).any())
    assert saturated >= 3, saturated
    c = case(rng, np.uint8, 64, 37, 11, True)
    table = rng.integers(-128, 128, c["qmax"] - c["qmin"] + 1).astype(np.int8)
    res = residual(rng, c, np.int8, "column", True)
    res["zv"] = np.int8(res["zv"])
    then = residual(rng, {**c, "zy": res["zy"]}, np.int16, "act", False, out=np.int8)
    post = rng.integers(0, 256, then["qmax"] - then["qmin"] + 1).astype(np.uint8)
    np.testing.assert_array_equal(run_c(isa, c, res, table=table, then=then, post=post),
                                  want(c, res, table=table, then=then, post=post), strict=True)
    res["qmin"], res["qmax"] = -300, 300  # the first sum clipped past int8: cast to it before the second
    res["zy"] = np.int8(0)
    np.testing.assert_array_equal(run_c(isa, c, res, then=then), want(c, res, then=then), strict=True)


@pytest.mark.parametrize("isa", ISAS)
def test_power_of_two_stages(isa):
    """A constant addend with v's multiplier 2**s, s <= c (quantize_static's bias IAdd: s = c): on x86's
    vector paths the stage is v + a per-column constant, a shift by c - s and the clip in int32 lanes
    (Stage::pow2), alone, before a residual stage and after one, through the tables, with s = c, s < c, s = 0,
    zero points at their type's extremes; past its bounds (s > c, a negative multiplier, constants near 2**62)
    the general stage. Both equal the reference, and each is taken."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 321)
    took = []
    for k, n, rows in ((64, 53, 29), (192, 48, 21), (7, 5, 9)):
        for s_of_c, form in ((0, "column"), (3, "single"), ("c", "column"), ("zero", "single"),
                             ("past", "column"), ("neg", "column"), ("big", "single")):
            c = case(rng, np.uint8, k, n, rows, True)
            c["shift"] = rng.integers(33, 41, c["shift"].shape).astype(np.int64)
            res = residual(rng, c, np.int8, form, bool(rng.random() < 0.5), wide=True)
            cshift = res["shift"]
            s = {"c": cshift, "zero": 0, "past": cshift + 1, "neg": cshift, "big": cshift}.get(s_of_c, s_of_c)
            res["mv"] = (1 << s) * (-1 if s_of_c == "neg" else 1)
            if s_of_c == "big":
                res["mr"], res["r"] = (1 << 61) + 5, np.asarray(res["r"]) * 0 + 1
            res["zy"] = np.int8(rng.choice([-128, 127, 0]))
            got = run_c(isa, c, res, threads=2, forms=took)
            np.testing.assert_array_equal(got, want(c, res), strict=True,
                                          err_msg=f"{isa} {s_of_c} {form} {k}")
            then = residual(rng, {**c, "zy": res["zy"]}, np.int8, "act", True, out=np.int8, wide=True)
            got = run_c(isa, c, res, then=then, threads=2, forms=took)
            np.testing.assert_array_equal(got, want(c, res, then=then), strict=True,
                                          err_msg=f"{isa} {s_of_c} 2")
            first = residual(rng, c, np.int8, "act", True, out=np.int8, wide=True)
            table = rng.integers(-128, 128, c["qmax"] - c["qmin"] + 1).astype(np.int8)
            post = rng.integers(0, 256, res["qmax"] - res["qmin"] + 1).astype(np.uint8)
            got = run_c(isa, c, first, table=table, then=res, post=post, forms=took)
            np.testing.assert_array_equal(got, want(c, first, table=table, then=res, post=post), strict=True)
    pow2 = {f & 4 for f in took}
    assert pow2 == ({0, 4} if isa in ("avx2", "vnni", "amx") else {0}), took


@pytest.mark.parametrize("isa", ISAS)
def test_residual_table_wide_and_output_types(isa):
    """Through tables (int8: vpermt2b where the CPU has VBMI; int16), multipliers past int32 and v outside
    its type's range (the scalar epilogue), int16 and int32 sums."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 77)
    for tdt, adt in ((np.int8, np.uint8), (np.uint8, np.int8), (np.int16, np.uint8)):
        c = case(rng, adt, 64, 51, 29, tdt == np.uint8)
        info = np.iinfo(tdt)
        table = rng.integers(info.min, info.max + 1, c["qmax"] - c["qmin"] + 1).astype(tdt)
        for form in ("act", "column"):
            res = residual(rng, c, np.int8, form, form == "act", out=np.int16)
            res["zv"] = tdt(res["zv"] if tdt != np.uint8 else 3)
            np.testing.assert_array_equal(run_c(isa, c, res, table=table), want(c, res, table=table))
    for out in (np.int16, np.int32):
        c = case(rng, np.uint8, 37, 21, 9, True, out=np.int16)
        res = residual(rng, c, np.uint8, "act", False, out=out, wide=True)
        np.testing.assert_array_equal(run_c(isa, c, res), want(c, res))
        res["mv"], res["shift"] = (1 << 62) + 3, 62  # past the vector stage's 2**62: the scalar epilogue
        np.testing.assert_array_equal(run_c(isa, c, res), want(c, res))
    c = case(rng, np.int8, 37, 21, 9, True)  # int8 v with qmin, qmax past int8: the cast wraps, as QGemm's
    c["qmin"], c["qmax"] = -300, 300
    c["zy"] = np.int8(0)
    res = residual(rng, c, np.int8, "act", True)
    got = run_c(isa, c, res)
    v = reference(**{**c, "zy": np.int32(0)}).astype(np.int8)
    ref = iadd(v, res["r"], res["zv"], res["zr"], np.int64(res["mv"]), np.int64(res["mr"]),
               np.int64(res["shift"]), res["zy"], qmin=res["qmin"], qmax=res["qmax"])
    np.testing.assert_array_equal(got, ref)


def qgemm_add_model(c: dict, res: dict, r_shape, table=None, post=None) -> tuple[onnx.ModelProto, dict]:
    """A one-node QGemmAdd (QGemmTableAdd; with post, QGemmAddTable) model, A (and an activation r) inputs,
    batched A."""
    k, n = c["b"].shape
    inits = [numpy_helper.from_array(np.asarray(c[key]), key)
             for key in ("za", "b", "zb", "zx", "mult", "shift", "zy")]
    names = ["a", "za", "b", "zb", "zx", "mult", "shift", "zy"]
    if table is not None:
        inits.append(numpy_helper.from_array(table, "table"))
        names.append("table")
    act = r_shape is not None
    r = res["r"].reshape(r_shape) if act else res["r"]
    if not act:
        inits.append(numpy_helper.from_array(np.asarray(r), "r"))
    for key, val in (("zv", res["zv"]), ("zr", res["zr"]), ("mv", np.int64(res["mv"])),
                     ("mr", np.int64(res["mr"])), ("c2", np.int64(res["shift"])), ("zs", res["zy"])):
        inits.append(numpy_helper.from_array(np.asarray(val), key))
    names += ["r", "zv", "zr", "mv", "mr", "c2", "zs"]
    a = c["a"].reshape(2, -1, k)
    op = "QGemmTableAdd" if table is not None else "QGemmAdd"
    if post is not None:
        inits.append(numpy_helper.from_array(post, "post"))
        names.append("post")
        op += "Table"
    node = helper.make_node(op, names, ["y"], domain=DOMAIN, name="gemm", qmin=c["qmin"], qmax=c["qmax"],
                            add_qmin=res["qmin"], add_qmax=res["qmax"])
    elem = helper.np_dtype_to_tensor_dtype
    inputs = [helper.make_tensor_value_info("a", elem(a.dtype), a.shape)]
    feeds = {"a": a}
    if act:
        inputs.append(helper.make_tensor_value_info("r", elem(r.dtype), r.shape))
        feeds["r"] = r
    out = np.asarray(res["zy"]).dtype if post is None else post.dtype
    outputs = [helper.make_tensor_value_info("y", elem(out), None)]
    graph = helper.make_graph([node], "qgemm_add", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10), feeds


@pytest.mark.parametrize("isa", ISAS)
def test_onnxruntime_op(isa, monkeypatch):
    """QGemmAdd and QGemmTableAdd through onnxruntime, with IVIT_GEMM_ISA forcing the path: a full residual,
    one repeating along the batch ([1, rows, N] against [2, rows, N]) and a constant one; 1 and 2 threads."""
    need(isa)
    monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng(ISAS[isa] + 5)
    c = case(rng, np.uint8, 257, 37, 2 * 11, True)
    res = residual(rng, c, np.int8, "act", False)
    expect = want(c, res).reshape(2, 11, 37)
    model, feeds = qgemm_add_model(c, res, (2, 11, 37))
    for threads in (1, 2):
        np.testing.assert_array_equal(ort_run(model, feeds, threads), expect)
    half = {**res, "r": np.concatenate([res["r"][:11]] * 2)}
    model, feeds = qgemm_add_model(c, {**half, "r": half["r"][:11]}, (1, 11, 37))
    np.testing.assert_array_equal(ort_run(model, feeds), want(c, half).reshape(2, 11, 37))
    table = rng.integers(-128, 128, c["qmax"] - c["qmin"] + 1).astype(np.int8)
    res = residual(rng, c, np.int16, "column", True)
    model, feeds = qgemm_add_model(c, res, None, table=table)
    np.testing.assert_array_equal(ort_run(model, feeds), want(c, res, table=table).reshape(2, 11, 37))
    post = rng.integers(0, 256, res["qmax"] - res["qmin"] + 1).astype(np.uint8)
    for t in (None, table):  # QGemmAddTable, QGemmTableAddTable
        model, feeds = qgemm_add_model(c, res, None, table=t, post=post)
        expect = want(c, res, table=t, post=post).reshape(2, 11, 37)
        np.testing.assert_array_equal(ort_run(model, feeds), expect)


def test_refusals():
    """A residual whose shape does not end the output's, or non-scalar IAdd parameters, name the node."""
    rng = np.random.default_rng(9)
    c = case(rng, np.uint8, 7, 5, 6, False)
    res = residual(rng, c, np.int8, "act", True)
    model, feeds = qgemm_add_model(c, res, (2, 3, 5))
    model.graph.input[1].type.tensor_type.ClearField("shape")
    with pytest.raises(Exception, match="QGemmAdd node 'gemm': the residual's shape must end the output's"):
        ort_run(model, {**feeds, "r": res["r"].reshape(6, 1, 5)})
    mv = next(t for t in model.graph.initializer if t.name == "mv")
    mv.CopyFrom(numpy_helper.from_array(np.array([3, 4], np.int64), "mv"))
    with pytest.raises(Exception, match="QGemmAdd node 'gemm' refused: v_multiplier must be a single value"):
        ort_run(model, feeds)
    model, feeds = qgemm_add_model(c, res, (2, 3, 5), post=np.zeros(7, np.uint8))
    with pytest.raises(Exception, match="QGemmAddTable node 'gemm' refused: the table after the sum must be"):
        ort_run(model, feeds)


def test_on_an_emulated_haswell():
    """On an emulated Haswell (AVX2, no AVX-512): the self-check probes the stage on the AVX2 path and accepts
    it, and the AVX2 path is bit-exact (its code on a CPU that has no AVX-512 to fall back on)."""
    if platform.machine() != "x86_64":  # (tests/arm/run.sh's guest, which has no tests/qemu.py)
        pytest.skip("emulating Haswell needs an x86-64 host")
    from tests.qemu import QEMU_X86, haswell

    if QEMU_X86 is None:
        pytest.skip("needs qemu-x86_64 (apt-get install qemu-user), an x86-64 host")
    code = ("import numpy as np\n"
            "from tests.opset.test_qgemm import options\n"
            "from tests.opset import test_qgemm_add as t\n"
            "out = options().get_session_config_entry('ivit.qgemm_check')\n"
            "assert 'avx2 exact' in out and 'vnni' not in out, out\n"
            "t.test_residual_paths_bit_exact('avx2', np.uint8, True)\n"
            "t.test_residual_table_wide_and_output_types('avx2')\n"
            "t.test_table_after_the_sum('avx2')\n"
            "t.test_two_stages('avx2')\n"
            "print('PASS', out)\n")
    done = haswell(code, timeout=600, cwd=str(ROOT))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith("PASS avx2 exact"), done.stdout
