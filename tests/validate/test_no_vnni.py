"""Exactness without VNNI: the library's GEMM self-check, and the fast path under an emulated AVX2-only CPU.

onnxruntime's uint8 x int8 GEMM saturates int16 pair sums on x86 CPUs without VNNI. QEMU user mode
(``qemu-x86_64 -cpu Haswell``, Debian's ``qemu-user``; ``.ci/run`` installs it) presents such a CPU on any x86
host, so these tests see that CPU's kernels whatever machine CI runs on. ``IVIT_GEMM_PROBE_FAULT`` makes the
self-check count forms as wrong (``opset/native/gemm_check.cpp``), reaching its other outcomes on any CPU.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from ivit_onnx.opset import gemm_probe, native_kernels, ort_library
from ivit_onnx.runners import OrtRunner
from tests.qemu import QEMU_X86, haswell
from tests.validate.conftest import x_batch

needs_library = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
needs_qemu = pytest.mark.skipif(QEMU_X86 is None,
                                reason="needs qemu-x86_64 (apt-get install qemu-user) on an x86-64 host")


PROBE = """
import json, onnxruntime as ort
from ivit_onnx.opset import gemm_probe, ort_library
opts = ort.SessionOptions()
if {library}:
    opts.register_custom_ops_library(ort_library.native_library())
s = ort.InferenceSession(gemm_probe.model().SerializeToString(), opts, providers=["CPUExecutionProvider"])
print(json.dumps([int(v.reshape(-1)[0]) for v in s.run(None, gemm_probe.feeds())]))
print(opts.get_session_config_entry("ivit.gemm_check") if {library} else "")
"""


def _firsts() -> list[int]:
    return [int(v.reshape(-1)[0]) for v in gemm_probe.expected().values()]


@needs_qemu
def test_emulated_cpu_saturates_uint8_x_int8_and_the_library_makes_it_exact():
    import json

    plain = haswell(PROBE.format(library=False), timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    got = json.loads(plain.stdout.splitlines()[0])
    want = _firsts()
    assert got[0] == 1048544 != want[0]  # the saturated pair sums: the emulation shows the AVX2 kernels
    assert got[1:] == want[1:]  # uint8 x uint8 and int8 x int8 stay exact there
    if not native_kernels.available():
        pytest.skip("the native library was not built")
    lib = haswell(PROBE.format(library=True), timeout=300)
    assert lib.returncode == 0, lib.stderr[-2000:]
    lines = lib.stdout.splitlines()
    assert json.loads(lines[0]) == want
    assert "session.x64quantprecision=1" in lines[1]


@needs_qemu
@needs_library
def test_fast_path_is_bit_exact_on_the_bundled_model_without_vnni(tmp_path):
    """README's first command's model: the library equals the function bodies bit for bit on the emulated
    CPU, and the accuracies are the ones this host gets."""
    from ivit_onnx import rewrite
    from ivit_onnx.models.bundled import default_model_path

    rewrite(default_model_path(), tmp_path / "int.onnx")
    argv = [str(tmp_path / "int.onnx"), "--reference", "digits", "--data", "digits", "--backends",
            "library,functions", "--json", str(tmp_path / "{}.json")]
    code = ("import sys; from ivit_onnx.validate.cli import main; "
            f"sys.exit(main({[a.format('emulated') for a in argv]!r}))")
    run = haswell(code)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "saturates" in run.stdout  # the self-check switched to the exact kernels there
    native = subprocess.run([sys.executable, "-c", code.replace("emulated", "native")], capture_output=True,
                            text=True, timeout=300)
    assert native.returncode == 0, (native.stdout + native.stderr)[-3000:]
    import json

    got, want = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("emulated", "native"))
    assert [c["status"] for c in got["checks"]].count("FAILED") == 0
    assert got["accuracy"] == want["accuracy"]


def _register(opts: ort.SessionOptions) -> str:
    opts.register_custom_ops_library(ort_library.native_library())
    return opts.get_session_config_entry(ort_library.CHECK)


@needs_library
def test_self_check_switches_to_exact_kernels_where_uint8_x_int8_saturates(monkeypatch):
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "saturate")  # as on an AVX2 CPU, whatever this one is
    opts = ort.SessionOptions()
    assert "session.x64quantprecision=1" in _register(opts)
    assert opts.get_session_config_entry("session.x64quantprecision") == "1"


@needs_library
def test_self_check_refuses_inexact_uint8_gemms_in_one_line_naming_cpu_and_fallback(monkeypatch):
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "uint8")
    with pytest.raises(Exception) as err:
        _register(ort.SessionOptions())
    msg = str(err.value)
    assert "\n" not in msg.strip() and "not exact on" in msg and ort_library.INT8_GEMMS in msg
    opts = ort.SessionOptions()
    opts.add_session_config_entry(ort_library.INT8_GEMMS, "1")
    assert _register(opts).startswith("int8 GEMMs exact")
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "all")
    with pytest.raises(Exception, match="int8 x int8 GEMM is not exact"):
        _register(opts)


@needs_library
def test_self_check_does_not_write_the_callers_files(tmp_path):
    """The probe session runs on a copy of the caller's options, without their profile or optimized model."""
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "prof")
    _register(opts)
    assert list(tmp_path.iterdir()) == []


@needs_library
def test_runner_falls_back_to_int8_gemms_with_one_warning(tiny, monkeypatch, capsys):
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "uint8")
    model = tiny.model()
    lib = OrtRunner(model, "library", 1)
    x = {"input": x_batch(4)}
    got = lib.run(x)
    want = OrtRunner(model, "functions", 1).run(x)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert not lib.engine.compiled.uint8_gemms and lib.engine.gemm_check.startswith("int8 GEMMs exact")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not exact on" in err[0] and "int8 GEMMs as converted" in err[0]


def test_probe_header_is_current():
    assert gemm_probe.HEADER.read_text() == gemm_probe.header(), "run python -m ivit_onnx.opset.gemm_probe"
