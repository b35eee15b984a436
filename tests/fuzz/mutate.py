"""Seeded mutations of ONNX models and a harness that runs the CLI on each one in-process.

Every run must end in a valid output or one clean error line (``ivit-onnx: error: ...``, exit 2; exit 1 for
a validate check that failed): no exception escaping ``main``, no "internal error" fallback, no output or
temporary file left behind on failure. Used by ``tests/fuzz`` (500+ mutations in CI) and
``benchmarks/fuzz_cli.py`` (a longer run).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ivit_onnx.cli import main

PREFIX = "ivit-onnx: error:"
BAD_SCALES = [0.0, -0.5, float("nan"), float("inf"), 1e30, 1e-30, 1e-45]
DTYPES = [
    TensorProto.FLOAT,
    TensorProto.INT8,
    TensorProto.UINT8,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.FLOAT16,
    TensorProto.DOUBLE,
    TensorProto.BOOL,
    TensorProto.STRING,
    TensorProto.INT16,
]


def _copy(m: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return out


def _names(m: onnx.ModelProto) -> list[str]:
    return [o for n in m.graph.node for o in n.output] + [t.name for t in m.graph.initializer]


def _qdq_params(m: onnx.ModelProto) -> list[tuple[onnx.NodeProto, int]]:
    """(node, input index) of every Q/DQ scale (1) and zero point (2) that is an initializer."""
    inits = {t.name for t in m.graph.initializer}
    return [
        (n, k)
        for n in m.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear")
        for k in (1, 2)
        if len(n.input) > k and n.input[k] in inits
    ]


def _init(m: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for t in m.graph.initializer if t.name == name)


def _set(t: onnx.TensorProto, value: np.ndarray) -> None:
    t.CopyFrom(numpy_helper.from_array(value, t.name))


# Each mutation edits the model in place (rng: random.Random); returns a short description.
def drop_input(m, rng):
    n = rng.choice([n for n in m.graph.node if n.input])
    k = rng.randrange(len(n.input))
    if rng.random() < 0.5:
        n.input[k] = ""
    else:
        del n.input[k]
    return f"drop input {k} of {n.op_type}"


def rename_input(m, rng):
    n = rng.choice([n for n in m.graph.node if n.input])
    k = rng.randrange(len(n.input))
    n.input[k] = rng.choice(["nowhere", rng.choice(_names(m)), n.output[0]])
    return f"rename input {k} of {n.op_type} to {n.input[k]}"


def rename_output(m, rng):
    n = rng.choice(list(m.graph.node))
    n.output[0] = rng.choice(["fresh_out", rng.choice(_names(m))])
    return f"rename output of {n.op_type} to {n.output[0]}"


def change_init_dtype(m, rng):
    t = rng.choice(list(m.graph.initializer))
    t.data_type = rng.choice(DTYPES)
    return f"initializer {t.name} dtype -> {t.data_type}"


def cast_init(m, rng):
    """Same values, another (valid) dtype: float weights as int32, scales as float16, ..."""
    t = rng.choice(list(m.graph.initializer))
    a = numpy_helper.to_array(t)
    _set(t, a.astype(rng.choice([np.float16, np.float64, np.int32, np.int64, np.uint8, np.int8])))
    return f"initializer {t.name} cast"


def change_init_shape(m, rng):
    t = rng.choice(list(m.graph.initializer))
    a = numpy_helper.to_array(t)
    choice = rng.randrange(3)
    if choice == 0:
        _set(t, a.reshape(-1))
    elif choice == 1:
        _set(t, np.concatenate([a.reshape(-1), a.reshape(-1)[:1]]) if a.size else np.zeros(3, a.dtype))
    else:
        _set(t, a.reshape([1, *a.shape]))
    return f"initializer {t.name} reshaped"


def shrink_constant(m, rng):
    """A float initializer as a 0-d scalar, a one-element tensor or a broadcast row of its own values (the
    shapes exporters give scales and operands: every constant fold must keep them)."""
    t = rng.choice([t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT])
    a = numpy_helper.to_array(t)
    first = a.reshape(-1)[:1] if a.size else np.zeros(1, a.dtype)
    shapes = {0: lambda: first.reshape(()), 1: lambda: first.reshape(1)}
    shapes[2] = lambda: (a.reshape(-1, a.shape[-1])[:1].reshape([1] * (a.ndim - 1) + [a.shape[-1]])
                         if a.ndim else first.reshape(1, 1))
    _set(t, shapes[rng.randrange(3)]())
    return f"initializer {t.name} shrunk"


def quantized_constant_operand(m, rng):
    """An input of an elementwise or GEMM node replaced by QuantizeLinear → DequantizeLinear of a float
    constant of a small shape (0-d, [1], a row), with or without a zero point (onnxruntime quantizes such)."""
    ops = ("Add", "Mul", "Sub", "Div", "MatMul")
    node = rng.choice([n for n in m.graph.node if n.op_type in ops and n.input])
    k = rng.randrange(len(node.input))
    shape = rng.choice([(), (1,), (1, 1, rng.choice([1, 16]))])
    base = f"fuzz_c{len(m.graph.initializer)}"
    value = np.asarray(np.random.default_rng(rng.randrange(1 << 30)).uniform(-2, 2, shape), np.float32)
    m.graph.initializer.extend([
        numpy_helper.from_array(value, base),
        numpy_helper.from_array(np.asarray(rng.choice([0.01, 0.02, 1.0]), np.float32), base + "_s"),
        numpy_helper.from_array(np.asarray(0, np.int8), base + "_z"),
    ])
    zp = [base + "_z"] if rng.random() < 0.5 else []
    q = onnx.helper.make_node("QuantizeLinear", [base, base + "_s", *zp], [base + "_q"], name=base + "_Q")
    dq = onnx.helper.make_node("DequantizeLinear", [base + "_q", base + "_s", *zp], [base + "_dq"])
    m.graph.node.insert(0, dq)
    m.graph.node.insert(0, q)
    node.input[k] = base + "_dq"
    return f"input {k} of {node.op_type} a quantized {list(shape)} constant"


def change_input(m, rng):
    vi = rng.choice(list(m.graph.input))
    tt = vi.type.tensor_type
    if rng.random() < 0.5:
        tt.elem_type = rng.choice(DTYPES)
    else:
        dims = tt.shape.dim
        if dims and rng.random() < 0.5:
            del dims[rng.randrange(len(dims))]
        elif dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 3, 1000])
    return f"graph input {vi.name} type/shape changed"


def bad_scale(m, rng):
    params = [(n, k) for n, k in _qdq_params(m) if k == 1]
    n, k = rng.choice(params)
    t = _init(m, n.input[k])
    a = numpy_helper.to_array(t).astype(np.float32)
    v = rng.choice(BAD_SCALES)
    if rng.random() < 0.3:
        _set(t, np.full(rng.choice([(3,), (2, 2), (a.size + 1,)]), abs(v) or 0.1, np.float32))
        return f"scale {t.name} wrong shape"
    b = a.copy()
    b.reshape(-1)[rng.randrange(max(b.size, 1))] = v
    _set(t, b)
    return f"scale {t.name} -> {v}"


def bad_zero_point(m, rng):
    params = [(n, k) for n, k in _qdq_params(m) if k == 2]
    n, k = rng.choice(params)
    t = _init(m, n.input[k])
    a = numpy_helper.to_array(t)
    choice = rng.randrange(4)
    if choice == 0:
        _set(t, a.astype(rng.choice([np.int32, np.uint16, np.float32, np.int16])))
    elif choice == 1:
        info = np.iinfo(a.dtype) if a.dtype.kind in "iu" else np.iinfo(np.int8)
        _set(t, np.full(a.shape, rng.choice([info.min, info.max]), a.dtype))
    elif choice == 2:
        _set(t, np.zeros((5,), a.dtype))
    else:
        n.input[k] = n.input[1]  # the scale as zero point
    return f"zero point {t.name} mutated ({choice})"


def delete_node(m, rng):
    k = rng.randrange(len(m.graph.node))
    op = m.graph.node[k].op_type
    del m.graph.node[k]
    return f"delete {op}"


def duplicate_output(m, rng):
    if rng.random() < 0.5 and m.graph.output:
        m.graph.output.append(m.graph.output[0])
        return "graph output listed twice"
    a, b = rng.sample(list(m.graph.node), 2)
    b.output[0] = a.output[0]
    return f"{b.op_type} writes {a.op_type}'s output"


def unknown_op(m, rng):
    n = rng.choice(list(m.graph.node))
    if rng.random() < 0.5:
        n.op_type = rng.choice(["FooBar", "Requantize", "Shiftmax", "Loop", "If"])
    else:
        n.domain = rng.choice(["com.unknown", "ai.ivit", "com.microsoft"])
        m.opset_import.add(domain=n.domain, version=1)
    return f"{n.name}: op {n.domain}:{n.op_type}"


def bad_attribute(m, rng):
    n = rng.choice([n for n in m.graph.node if n.attribute] or list(m.graph.node))
    if n.attribute and rng.random() < 0.7:
        a = rng.choice(list(n.attribute))
        if a.type == onnx.AttributeProto.INT:
            a.i = rng.choice([-9, 7, 2**40, -1])
        elif a.type == onnx.AttributeProto.INTS:
            a.ints[:] = rng.choice([[], [9], [0, 0, 0]])
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = rng.choice([float("nan"), -1.0, 1e30])
        else:
            n.attribute.remove(a)
        return f"{n.op_type} attribute {a.name} changed"
    n.attribute.append(onnx.helper.make_attribute("axis", rng.choice([-5, 3, 9])))
    return f"{n.op_type} got axis"


def change_opset(m, rng):
    o = next(o for o in m.opset_import if o.domain in ("", "ai.onnx"))
    o.version = rng.choice([7, 11, 12, 13, 14, 19, 21, 99])
    return f"opset {o.version}"


def shuffle_nodes(m, rng):
    nodes = list(m.graph.node)
    rng.shuffle(nodes)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return "nodes out of order"


def drop_output(m, rng):
    del m.graph.output[:]
    return "no graph outputs"


MUTATIONS = [
    drop_input,
    rename_input,
    rename_output,
    change_init_dtype,
    cast_init,
    change_init_shape,
    shrink_constant,
    quantized_constant_operand,
    change_input,
    bad_scale,
    bad_zero_point,
    delete_node,
    duplicate_output,
    unknown_op,
    bad_attribute,
    change_opset,
    shuffle_nodes,
    drop_output,
]


def mutate(model: onnx.ModelProto, rng: random.Random) -> tuple[bytes, str]:
    """1-3 proto mutations, then (sometimes) a cut or a flipped byte of the serialized file."""
    m = _copy(model)
    what = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        f = rng.choice(MUTATIONS)
        try:
            what.append(f(m, rng))
        except (ValueError, IndexError, StopIteration, TypeError):
            what.append(f"{f.__name__}: not applicable")
    data = m.SerializeToString()
    r = rng.random()
    if r < 0.08:
        cut = rng.randrange(len(data))
        data, what = data[:cut], [*what, f"cut at {cut}"]
    elif r < 0.12:
        k = rng.randrange(len(data))
        data = data[:k] + bytes([data[k] ^ (1 << rng.randrange(8))]) + data[k + 1 :]
        what.append(f"bit flip at {k}")
    return data, "; ".join(what)


@dataclass
class Outcome:
    code: int
    err: str
    what: str


@dataclass
class Tally:
    """Outcomes by kind; ``problems`` are what the fuzz test forbids (with the mutation that caused them)."""

    kinds: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def add(self, o: Outcome, command: str, out_files: list[Path], folder: Path) -> None:
        lines = [x for x in o.err.splitlines() if x.strip()]
        if o.code == 0:
            self.kinds[f"{command}: ok"] += 1
            if command != "validate" and not all(p.exists() for p in out_files):
                self.problems.append(f"{command} exit 0 without its output: {o.what}")
        elif o.code in (1, 2):
            self.kinds[f"{command}: exit {o.code}"] += 1
            errors = [x for x in lines if x.startswith(PREFIX)]
            if o.code == 2 and len(errors) != 1:
                self.problems.append(f"{command} exit 2 with {len(errors)} error lines ({o.err!r}): {o.what}")
            if any("internal error" in x for x in errors):
                self.problems.append(f"{command} internal error ({errors[0]}): {o.what}")
            if o.code == 2 and any(p.exists() for p in out_files):
                self.problems.append(f"{command} failed but wrote an output: {o.what}")
        else:
            self.problems.append(f"{command} exit {o.code}: {o.err!r}: {o.what}")
        if "Traceback" in o.err:
            self.problems.append(f"{command} printed a traceback: {o.what}")
        leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
        if leftovers:
            self.problems.append(f"{command} left temporary files {leftovers}: {o.what}")


    def certify(self, path: Path, what: str) -> None:
        """A strict rewrite and the integer-only certificate agree: what strict mode wrote is certified."""
        from ivit_onnx.certify import float_offenders

        self.kinds["rewrite strict: certified"] += 1
        bad = float_offenders(onnx.load(str(path)))
        if bad:
            self.problems.append(f"strict rewrite wrote a model the certificate rejects ({bad[0]}): {what}")


def run_cli(argv: list[str], what: str) -> Outcome:
    """``ivit-onnx`` in-process with stdout/stderr captured; an exception escaping ``main`` is exit -1."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:  # noqa: PERF203
            code = e.code if isinstance(e.code, int) else -2
        except BaseException as e:  # noqa: BLE001 - an escaping exception is the failure we look for
            import traceback

            return Outcome(-1, "Traceback: " + "".join(traceback.format_exception(e))[-2000:], what)
    return Outcome(code, err.getvalue(), what)


def fuzz(
    seeds: dict[str, onnx.ModelProto], commands: dict[str, list[str]], count: int, seed: int, folder: Path
) -> Tally:
    """``count`` mutations spread over ``seeds`` (name -> model); each runs the commands listed for its
    seed (``rewrite``, ``validate``, ``compile``). Files live in ``folder``; outputs are removed after each
    run."""
    rng = random.Random(seed)
    tally = Tally()
    names = sorted(seeds)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        name = names[i % len(names)]
        data, what = mutate(seeds[name], rng)
        src = folder / f"m{i}.onnx"
        src.write_bytes(data)
        what = f"#{i} {name}: {what}"
        for command in commands[name]:
            out = folder / f"m{i}_out.onnx"
            outs = [out]
            if command == "rewrite":
                argv = [
                    "rewrite",
                    str(src),
                    "-o",
                    str(out),
                    *(["--allow-float"] if rng.random() < 0.5 else []),
                ]
            elif command == "compile":  # TVM: seconds per model that builds, so only in the long run
                outs = [out.with_suffix(".so"), out.with_suffix(".json")]
                argv = ["compile", str(src), "-o", str(outs[0]), "-q"]
            else:
                argv = ["validate", str(src), "--samples", "2", "--batch", "2", "--json", str(out)]
            outcome = run_cli(argv, what)
            tally.add(outcome, command, outs, folder)
            if command == "rewrite" and outcome.code == 0 and "--allow-float" not in argv and out.exists():
                tally.certify(out, what)
            for p in (*outs, Path(str(out) + ".data")):
                if p.exists():
                    os.unlink(p)
        os.unlink(src)
    return tally
