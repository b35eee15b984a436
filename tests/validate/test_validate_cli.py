"""`python -m ivit_onnx.validate` end to end: checks, corruptions caught, bad input, JSON, per-layer."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from ivit_onnx import opset
from ivit_onnx.runners import OrtRunner, node_outputs
from ivit_onnx.validate import main

from .conftest import x_batch

STATUSES = ("PASSED", "FAILED", "WARNING", "SKIPPED")
DOMAIN = opset.DOMAIN


def run_main(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def status(out: str, check: str) -> str:
    """The STATUS word of the table line whose CHECK column starts with ``check``."""
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0] in STATUSES and parts[1].startswith(check):
            return parts[0]
    raise AssertionError(f"no check {check!r} in\n{out}")


# ------------------------------------------------------------------------------------------ passing


def test_api_result_is_what_the_json_dumps(tiny, tmp_path, capsys):
    """``validate(options)`` returns the result object; the CLI's --json is its ``as_dict()``; the new
    spellings (--fake-quant, the interpreter backend) run like the old ones."""
    from ivit_onnx.validate import ValidateOptions, validate

    opts = ValidateOptions(str(tiny.int), backends=["interpreter", "library"], fake_quant=str(tiny.fq))
    result = validate(opts)
    assert result.passed and result.exit_code == 0
    assert status_of(result, "bit-exact: library == interpreter") == "PASSED"
    report = tmp_path / "r.json"
    code, out, _ = run_main(capsys, tiny.int, "--backends", "interpreter,library", "--fake-quant", tiny.fq,
                            "--json", report)
    data = json.loads(report.read_text())
    assert code == 0 and "run: interpreter" in out
    mine = result.as_dict()
    for d in (mine, data):  # throughput is measured, the rest is determined
        d.pop("throughput")
        for c in d["checks"]:
            c["summary"] = "" if c["name"].startswith("run") else c["summary"]
    assert mine == data


def status_of(result, name: str) -> str:
    return next(c.status for c in result.checks if c.name == name)


def test_converted_model_passes_every_check(tiny, capsys, tmp_path):
    report = tmp_path / "r.json"
    code, out, err = run_main(capsys, tiny.int, "--backends", "library,functions,reference",
                              "--reference", tiny.fq, "--fp32", tiny.fp32, "--min-agreement", "0.5",
                              "--json", report)
    assert code == 0, out
    for check in ("onnx.checker", "private opset", "integer-only certificate", "run: library",
                  "run: functions", "run: reference", "bit-exact: functions == library",
                  "bit-exact: reference == library",
                  "top-1 agreement vs fake-quant", "output cosine vs fake-quant"):
        assert status(out, check) == "PASSED", check
    assert out.rstrip().splitlines()[-1].startswith("PASSED")
    data = json.loads(report.read_text())
    assert data["passed"] is True and data["exit_code"] == 0
    assert {c["status"] for c in data["checks"]} <= {"PASSED", "SKIPPED"}
    cmp = data["comparisons"]["fake-quant"]["logits"]
    assert cmp["cosine_mean"] > 0.99 and cmp["samples"] == 32  # the default random sample count
    assert set(data["comparisons"]) == {"fake-quant", "fp32", "fake-quant vs fp32"}


def test_module_entry_point_and_help():
    r = subprocess.run([sys.executable, "-m", "ivit_onnx.validate", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "--backends" in r.stdout and "--per-layer" in r.stdout and "exit status" in r.stdout


def test_thresholds_fail_with_exit_1(tiny, capsys):
    code, out, _ = run_main(capsys, tiny.int, "--reference", tiny.fq, "--min-cosine", "1.01",
                            "--min-agreement", "0")
    assert code == 1
    assert status(out, "output cosine vs fake-quant") == "FAILED"
    assert out.rstrip().splitlines()[-1].startswith("FAILED: 1 of")


# ----------------------------------------------------------------------------- integer-only certificate


def test_injected_float_op_fails_the_certificate_naming_the_node(tiny, capsys, save):
    m = tiny.model()
    iadd = next(n for n in m.graph.node if n.op_type == "IAdd")
    t = iadd.output[0]
    iadd.output[0] = t + "_pre"
    idx = list(m.graph.node).index(iadd)
    m.graph.node.insert(idx + 1, helper.make_node("Cast", [t + "_pre"], ["to_float"], name="sneaky_to_float",
                                                  to=TensorProto.FLOAT))
    m.graph.node.insert(idx + 2, helper.make_node("Cast", ["to_float"], [t], name="sneaky_back",
                                                  to=TensorProto.INT8))
    code, out, _ = run_main(capsys, save(m), "--backends", "functions")
    assert code == 1
    assert status(out, "integer-only certificate") == "FAILED"
    assert "Cast 'sneaky_to_float': tensor 'to_float' is float32" in out
    assert status(out, "run: functions") == "PASSED"  # it still runs: only the certificate fails


def test_float_inside_a_function_body_is_named_by_its_call_site(tiny, capsys, save):
    m = tiny.model()
    body = next(f for f in m.functions if f.domain == DOMAIN and f.name == "Shiftmax")
    first = body.node[0]
    x = first.output[0]
    first.output[0] = "pre"
    body.node.insert(1, helper.make_node("Cast", ["pre"], ["fl"], to=TensorProto.DOUBLE))
    body.node.insert(2, helper.make_node("Cast", ["fl"], [x], to=TensorProto.INT64))
    code, out, _ = run_main(capsys, save(m), "--backends", "functions")
    assert code == 1
    call = next(n for n in m.graph.node if n.op_type == "Shiftmax")
    assert f"Shiftmax '{call.name}' > body Cast" in out and "is float64" in out
    assert status(out, "function bodies canonical") == "WARNING"


def test_unknown_private_op_fails(tiny, capsys, save):
    m = tiny.model()
    next(n for n in m.graph.node if n.domain == DOMAIN).op_type = "Bogus"
    code, out, _ = run_main(capsys, save(m), "--backends", "functions")
    assert code == 1
    assert status(out, "private opset") == "FAILED"
    assert "unknown op ai.ivit.Bogus" in out


def test_unknown_domain_fails(tiny, capsys, save):
    m = tiny.model()
    n = next(n for n in m.graph.node if n.domain == DOMAIN)
    n.domain = "com.example"
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    code, out, _ = run_main(capsys, save(m), "--backends", "functions")
    assert code == 1 and "unknown domain 'com.example'" in out


# ------------------------------------------------------------------------------- bit-exact cross-check


def _first_above(tiny, op_type: str, limit: int) -> str:
    """The first ``op_type`` output (topological order) with a value above ``limit`` on the default inputs."""
    m = tiny.model()
    x = np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32)
    values = OrtRunner(m, "functions").run_with({"input": x}, node_outputs(m))
    outs = [n.output[0] for n in m.graph.node if n.op_type == op_type]
    return next(t for t in outs if values[t].max() > limit)


def test_corrupted_function_body_fails_bit_exact_naming_the_tensor(tiny, capsys, save, tmp_path):
    m = tiny.model()
    body = next(f for f in m.functions if f.domain == DOMAIN and f.name == "Requantize")
    const = next(n for n in body.node if n.op_type == "Constant" and n.attribute[0].ref_attr_name == "qmax")
    const.ClearField("attribute")
    const.attribute.append(helper.make_attribute("value_int", 100))  # qmax 127 -> 100: body only
    expected = _first_above(tiny, "Requantize", 100)
    report = tmp_path / "r.json"
    code, out, _ = run_main(capsys, save(m), "--backends", "library,functions", "--json", report)
    assert code == 1
    assert status(out, "bit-exact: functions == library") == "FAILED"
    assert f"first differing tensor: '{expected}'" in out
    check = next(c for c in json.loads(report.read_text())["checks"] if c["name"].startswith("bit-exact"))
    assert expected in check["details"][0]


def _pin_body_attribute(m, op: str, attr: str) -> int:
    """Replace ``attr`` in ``op``'s function body by its (common) literal value; returns the value."""
    values = {helper.get_attribute_value(a) for n in m.graph.node if n.op_type == op
              for a in n.attribute if a.name == attr}
    assert len(values) == 1, values
    body = next(f for f in m.functions if f.domain == DOMAIN and f.name == op)
    const = next(c for c in body.node if c.op_type == "Constant" and c.attribute[0].ref_attr_name == attr)
    const.ClearField("attribute")
    const.attribute.append(helper.make_attribute("value_int", values.pop()))
    return helper.get_attribute_value(const.attribute[0])


def test_corrupted_library_attribute_fails_bit_exact_naming_the_tensor(tiny, capsys, save):
    m = tiny.model()
    _pin_body_attribute(m, "ILayerNorm", "qmax")  # the body keeps 127: only the library reads the attribute
    target = [n for n in m.graph.node if n.op_type == "ILayerNorm"][-1]
    next(a for a in target.attribute if a.name == "qmax").i = 20
    code, out, _ = run_main(capsys, save(m), "--backends", "functions,library")
    assert code == 1
    assert status(out, "bit-exact: library == functions") == "FAILED"
    assert f"first differing tensor: '{target.output[0]}' (ai.ivit.ILayerNorm '{target.name}')" in out


def test_hidden_intermediate_difference_is_caught_with_per_layer(tiny, capsys, save):
    """A Shiftmax change that the outputs do not show (attention is tiny next to the residual here)."""
    m = tiny.model()
    _pin_body_attribute(m, "Shiftmax", "bits")
    target = [n for n in m.graph.node if n.op_type == "Shiftmax"][1]
    next(a for a in target.attribute if a.name == "bits").i -= 1
    code, out, _ = run_main(capsys, save(m), "--backends", "functions,library", "--per-layer")
    assert code == 1
    assert status(out, "bit-exact intermediates: library == functions") == "FAILED"
    assert f"'{target.output[0]}' (ai.ivit.Shiftmax '{target.name}')" in out


def test_per_layer_checks_intermediates_and_names_the_worst_tensor(tiny, capsys, tmp_path):
    report = tmp_path / "r.json"
    code, out, _ = run_main(capsys, tiny.int, "--backends", "functions,reference", "--reference", tiny.fq,
                            "--per-layer", "--min-agreement", "0", "--json", report)
    assert code == 0, out
    assert status(out, "bit-exact intermediates: reference == functions") == "PASSED"
    tmap = json.loads(next(p.value for p in tiny.model().metadata_props if p.key == "ivit_onnx.tensor_map"))
    worst = [line for line in out.splitlines() if line.lstrip().startswith("worst: '")]
    assert len(worst) == 1
    name = worst[0].split("'")[1]
    assert name in tmap
    rows = json.loads(report.read_text())["per_layer"]
    assert len(rows) > 20 and [r["tensor"] for r in rows if "worst" in r["marks"]] == [name]
    first = rows[0]
    assert first["cosine"] > 0.999 and first["max_lsb"] <= 1.0  # the input quantize matches exactly


def test_per_layer_without_reference_is_skipped(tiny, capsys):
    code, out, _ = run_main(capsys, tiny.int, "--backends", "functions", "--per-layer")
    assert code == 0 and status(out, "per-layer vs fake-quant") == "SKIPPED"


# --------------------------------------------------------------------------------------------- inputs


def test_npz_with_labels_reports_accuracy(tiny, capsys, tmp_path):
    x = x_batch(6)
    np.savez(tmp_path / "d.npz", images=x, labels=np.arange(6) % 10)
    code, out, _ = run_main(capsys, tiny.int, "--backends", "functions", "--data", tmp_path / "d.npz",
                            "--reference", tiny.fq, "--batch", "4", "--min-agreement", "0")
    assert code == 0, out
    assert "ACCURACY" in out and "6 samples, batch 4" in out


def test_image_folder_with_classes(tiny, capsys, tmp_path):
    from .test_images import write_png

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(2):
            write_png(tmp_path / "imgs" / cls / f"{i}.png", rng.integers(0, 256, (40, 50, 3), dtype=np.uint8))
    code, out, _ = run_main(capsys, tiny.int, "--backends", "functions", "--data", tmp_path / "imgs",
                            "--preprocess", "imagenet")
    assert code == 0, out
    assert "4 images, 2 classes, preset imagenet" in out and "ACCURACY" in out


# ------------------------------------------------------------------------------------------ bad input


def _bad_files(tiny, tmp_path):
    raw = tiny.int.read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(raw[: len(raw) // 3])
    (tmp_path / "text.onnx").write_text("definitely not a protobuf\n" * 20)
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    np.savez(tmp_path / "keys.npz", a=x_batch(2), b=x_batch(2))
    np.savez(tmp_path / "shape.npz", input=np.zeros((2, 3, 16, 16), np.float32))
    return [
        [tmp_path / "missing.onnx"],
        [tmp_path / "trunc.onnx"],
        [tmp_path / "text.onnx"],
        [tmp_path],
        [tiny.int, "--reference", tmp_path / "missing_fq.onnx"],
        [tiny.int, "--data", tmp_path / "bad.npz"],
        [tiny.int, "--data", tmp_path / "keys.npz"],
        [tiny.int, "--data", tmp_path / "shape.npz"],
        [tiny.int, "--data", tmp_path / "nowhere"],
    ]


def test_bad_input_exits_2_with_one_line(tiny, capsys, tmp_path):
    for argv in _bad_files(tiny, tmp_path):
        code, out, err = run_main(capsys, *argv)
        assert code == 2, (argv, out, err)
        assert out == "" and len(err.strip().splitlines()) == 1, (argv, err)
        assert err.startswith("ivit-onnx: error: "), (argv, err)
        assert "Traceback" not in err


def test_bad_input_in_a_subprocess_has_no_traceback(tmp_path):
    (tmp_path / "t.onnx").write_bytes(b"\x08\x07\x12\x04abcd\x1a\xff")
    r = subprocess.run([sys.executable, "-m", "ivit_onnx.validate", str(tmp_path / "t.onnx")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_unknown_backend_is_a_usage_error(tiny, capsys):
    assert main([str(tiny.int), "--backends", "library,tvm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ivit-onnx: error:") and "tvm" in err and len(err.strip().splitlines()) == 1


def test_bundled_digits_workflow(capsys, tmp_path):
    """The README's command on a slice of the digits test split: real data, labels, ``--reference digits``."""
    pytest.importorskip("sklearn")
    from ivit_onnx.models.bundled import default_model_path

    if not default_model_path().exists():
        pytest.skip("bundled digits model not built")
    from ivit_onnx import rewrite

    rewrite(default_model_path(), tmp_path / "digits_int.onnx")
    report = tmp_path / "r.json"
    code, out, _ = run_main(capsys, tmp_path / "digits_int.onnx", "--reference", "digits", "--fp32", "digits",
                            "--data", "digits", "--limit", "128", "--batch", "64",
                            "--backends", "library,functions", "--min-agreement", "0.95", "--json", report)
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["samples"] == 128 and set(data["accuracy"]) == {"int", "fake-quant", "fp32"}
    assert data["accuracy"]["int"]["top1"] > 0.85
    assert status(out, "bit-exact: functions == library") == "PASSED"
