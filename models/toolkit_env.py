"""An isolated virtualenv for the ONNX toolkits whose pins clash with the project's (ModelOpt, Quark).

nvidia-modelopt 0.47 wants onnx~=1.21 and onnxruntime-gpu (CUDA); amd-quark 0.13 wants onnx<=1.22. The
project pins onnx 1.23 and onnxruntime 1.31, so both run here in their own venv, built once and cached
(``$IVIT_TOOLKIT_CACHE``, default ``~/.cache/ivit-onnx``): onnx 1.21 and the CPU onnxruntime 1.24, the
two toolkits without their CUDA extras, and a ``.pth`` that appends the project venv's site-packages
after its own, so ``import torch`` (which ModelOpt's ONNX path needs) finds the project's CPU torch
instead of installing another one. Nothing in the project venv changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

#: installed with their dependencies (pinned: the versions the README table was measured with)
PINS = (
    "onnx==1.21.0",
    "onnxruntime==1.24.4",
    "numpy==2.4.6",
    "onnx-graphsurgeon==0.6.1",
    "onnxslim==0.1.98",
    "onnxconverter-common==1.16.0",
    "polygraphy==0.53.6",
    "ml_dtypes==0.6.0",
    "pydantic==2.14.3",
    "rich==15.0.0",
    "omegaconf==2.4.0",
    "PuLP==3.3.2",
    "scipy==1.17.1",
    "lief==1.0.0",
    "cppimport==26.4.17",
    "nvidia-ml-py",
    "safetensors",
    "regex",
    "tqdm",
    "PyYAML",
    "setuptools>=80",
)
#: installed without dependencies (their declared ones pull onnxruntime-gpu, cupy-cuda12x, datasets, ...)
TOOLS = {"modelopt": "nvidia-modelopt==0.47.0", "quark": "amd-quark==0.13"}
SCRIPT = Path(__file__).with_name("toolkit_onnx_ptq.py")
RECIPES = ("modelopt", "modelopt_all_gemms", "quark")  #: what ``onnx_ptq`` runs (the script's TOOLS)


class ToolkitEnvError(RuntimeError):
    """The isolated environment could not be built (the message ends with pip's last lines)."""


def cache_dir() -> Path:
    return Path(os.environ.get("IVIT_TOOLKIT_CACHE") or Path.home() / ".cache" / "ivit-onnx")


def _venv_dir() -> Path:
    """One venv per pin set and per project venv (the ``.pth`` points into it)."""
    key = json.dumps([PINS, sorted(TOOLS.values()), sysconfig.get_paths()["purelib"], sys.version])
    return cache_dir() / f"toolkits-onnx-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _pip(python: Path, *args: str) -> None:
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
    if r.returncode:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise ToolkitEnvError(f"pip install {' '.join(args)} failed: {tail}")


def _prune() -> None:
    """Remove cached venvs whose project venv is gone (each checkout's venv gets its own, ~600 MB)."""
    for old in cache_dir().glob("toolkits-onnx-*"):
        done = old / ".complete"
        project = done.read_text().splitlines()[0] if done.exists() else ""
        if not project or not Path(project).is_dir():
            shutil.rmtree(old, ignore_errors=True)


def env_python() -> Path:
    """The isolated venv's python, building the venv first if it is not cached (about 30 s)."""
    venv = _venv_dir()
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test processes build it once
        if not (venv / ".complete").exists():
            _prune()
            r = subprocess.run(
                [sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True
            )
            if r.returncode:
                raise ToolkitEnvError(f"python -m venv {venv} failed: {r.stderr.strip()[-300:]}")
            _pip(python, *PINS)
            _pip(python, "--no-deps", *TOOLS.values())
            purelib = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            project = sysconfig.get_paths()["purelib"]
            (Path(purelib) / "zz_ivit_project_venv.pth").write_text(project + "\n")
            (venv / ".complete").write_text("\n".join((project, *PINS, *TOOLS.values())) + "\n")
    return python


def onnx_ptq(tool: str, fp32_path: str | Path, calib: np.ndarray, out_path: str | Path) -> dict:
    """Quantize an FP32 ONNX model with ``tool`` (one of RECIPES) in the isolated venv; returns the
    versions it ran with ({"tool": ..., "version": ..., "onnx": ..., "onnxruntime": ...})."""
    if tool not in RECIPES:
        raise ValueError(f"tool must be one of {RECIPES}, got {tool!r}")
    python = env_python()
    with tempfile.TemporaryDirectory() as tmp:
        calib_path = Path(tmp) / "calib.npy"
        np.save(calib_path, np.ascontiguousarray(calib, np.float32))
        r = subprocess.run(
            [str(python), str(SCRIPT), tool, str(fp32_path), str(calib_path), str(out_path)],
            capture_output=True,
            text=True,
            cwd=tmp,
        )
    if r.returncode:
        raise RuntimeError(f"{tool} failed: {' | '.join(r.stderr.strip().splitlines()[-3:])}")
    return json.loads(r.stdout.strip().splitlines()[-1])
