"""The C example (``examples/c/run_artifact.cpp``): built with g++ against the onnxruntime wheel's
libonnxruntime, it runs the compiled digits artifact through onnxruntime's C API alone and gives the bits of
a plain Python onnxruntime session on the artifact and of the converted int model's function bodies."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ivit_onnx import rewrite
from ivit_onnx.engines.onnxruntime import compile_model, is_artifact
from ivit_onnx.models.bundled import default_model_path
from ivit_onnx.opset import native_kernels, ort_library
from ivit_onnx.runners import OrtRunner

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "examples" / "c" / "run_artifact.cpp"
CAPI = Path(ort.__file__).parent / "capi"
LIBORT = sorted(CAPI.glob("libonnxruntime.so*"))

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="no g++"),
    pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built"),
    pytest.mark.skipif(not LIBORT, reason="the onnxruntime wheel ships no libonnxruntime.so"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The example compiled as the README says: linked against the wheel's library through a link named
    by its SONAME (the wheel ships only the fully versioned file) next to the binary, found by rpath."""
    out = tmp_path_factory.mktemp("c_example")
    (out / "libonnxruntime.so.1").symlink_to(LIBORT[-1])
    exe = out / "run_artifact"
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", str(SOURCE), "-o", str(exe),
           str(out / "libonnxruntime.so.1"), "-Wl,-rpath,$ORIGIN"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return exe


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The bundled digits model converted (int.onnx) and compiled for onnxruntime (the artifact)."""
    out = tmp_path_factory.mktemp("digits")
    int_path, artifact = out / "digits_int.onnx", out / "digits_int.ort.onnx"
    rewrite(default_model_path(), int_path)
    onnx.save(compile_model(onnx.load(int_path)).model, artifact)
    assert is_artifact(onnx.load(artifact))
    return int_path, artifact


def _inputs(n: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = (rng.integers(0, 17, (n, 1, 8, 8)) / 16).astype(np.float32)  # digits-like pixels in [0, 1]
    x[0] = 40.0  # saturating activations: the worst case of the 8-bit GEMMs
    x[1] = rng.standard_normal((1, 8, 8)).astype(np.float32)
    return x


def _run(exe: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_c_example_gives_the_bits_of_python_and_of_the_function_bodies(built, digits, tmp_path):
    int_path, artifact = digits
    x, (src, dst) = _inputs(5), (tmp_path / "in.bin", tmp_path / "out.bin")
    x.tofile(src)
    done = _run(built, artifact, ort_library.native_library(), src, dst, 5, 1)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"logits: float32 [5, 10] -> {dst}"
    got = np.fromfile(dst, dtype=np.float32).reshape(5, 10)

    opts = ort.SessionOptions()
    opts.register_custom_ops_library(ort_library.native_library())
    plain = ort.InferenceSession(str(artifact), opts, providers=["CPUExecutionProvider"])
    (python,) = plain.run(None, {"input": x})
    (bodies,) = OrtRunner(onnx.load(int_path), "functions", 1).run({"input": x}).values()
    assert got.tobytes() == python.tobytes()
    assert bodies.dtype == np.float32 and got.tobytes() == bodies.tobytes()


def test_c_example_errors_are_one_line_and_exit_1(built, digits, tmp_path):
    artifact = digits[1]
    library, src, dst = ort_library.native_library(), tmp_path / "in.bin", tmp_path / "out.bin"
    _inputs(5).tofile(src)
    cases = {
        "expected exactly 1024 bytes": (artifact, library, src, dst, 4),
        "Failed to load library": (artifact, tmp_path / "missing.so", src, dst, 5),
        "usage": (artifact,),
    }
    for needle, args in cases.items():
        done = _run(built, *args)
        assert done.returncode == 1, (needle, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("run_artifact: "), (needle, lines)
        assert needle in lines[0], (needle, lines)
