"""Isolated virtualenvs for the toolkits whose pins clash with the project's (ModelOpt, Quark; Optimum).

nvidia-modelopt 0.47 wants onnx~=1.21 and onnxruntime-gpu (CUDA); amd-quark 0.13 wants onnx<=1.22. The
project pins onnx 1.23 and onnxruntime 1.31, so both run here in their own venv, built once and cached
(``$IVIT_TOOLKIT_CACHE``, default ``~/.cache/ivit-onnx``): onnx 1.21 and the CPU onnxruntime 1.24, the
two toolkits without their CUDA extras, and a ``.pth`` that appends the project venv's site-packages
after its own, so ``import torch`` (which ModelOpt's ONNX path needs) finds the project's CPU torch
instead of installing another one. Nothing in the project venv changes.

optimum-onnx 0.1.0 (Optimum's ONNX exporter and ``ORTQuantizer``) declares ``transformers<4.58`` and
``optimum~=2.1.0``, while the project's ``hf`` extra pins transformers 5.24: it gets its own venv
(``OPTIMUM``) with transformers 4.57.6 and its hub/tokenizers pins, and the project's torch, onnx,
onnxruntime and numpy through the same ``.pth`` (a constraints file keeps pip from installing others).
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import toolkit_onnx_ptq

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
RECIPES = tuple(toolkit_onnx_ptq.TOOLS)  #: what ``onnx_ptq`` runs (the script's recipes)


@dataclass(frozen=True)
class Env:
    """One isolated venv: ``pins`` installed with their dependencies (the project's torch, onnx,
    onnxruntime and numpy count as installed and are never replaced), then ``no_deps`` without them."""

    name: str
    pins: tuple[str, ...]
    no_deps: tuple[str, ...] = ()


ONNX_PTQ = Env("toolkits-onnx", PINS, tuple(TOOLS.values()))
#: optimum-onnx 0.1.0: transformers<4.58 (the hf extra has 5.24), optimum~=2.1.0, huggingface-hub<1.0
OPTIMUM = Env(
    "toolkits-optimum",
    ("optimum-onnx==0.1.0", "optimum==2.1.0", "transformers==4.57.6", "huggingface-hub==0.36.2"),
)
KEEP = ("torch", "onnx", "onnxruntime", "numpy")  #: the project's, seen through the .pth, never reinstalled


class ToolkitEnvError(RuntimeError):
    """The isolated environment could not be built (the message ends with pip's last lines)."""


def cache_dir() -> Path:
    return Path(os.environ.get("IVIT_TOOLKIT_CACHE") or Path.home() / ".cache" / "ivit-onnx")


def _venv_dir(env: Env) -> Path:
    """One venv per pin set and per project venv (the ``.pth`` points into it)."""
    key = [env.pins, sorted(env.no_deps), sysconfig.get_paths()["purelib"], sys.version]
    if env is not ONNX_PTQ:  # the ONNX toolkits' venv keeps the name it was cached under
        key.append(env.name)
    return cache_dir() / f"{env.name}-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]}"


def _pip(python: Path, *args: str) -> None:
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
    if r.returncode:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise ToolkitEnvError(f"pip install {' '.join(args)} failed: {tail}")


def _prune() -> None:
    """Remove cached venvs whose project venv is gone (each checkout's venv gets its own, ~600 MB)."""
    for old in cache_dir().glob("toolkits-*-*"):
        done = old / ".complete"
        project = done.read_text().splitlines()[0] if done.exists() else ""
        if not project or not Path(project).is_dir():
            shutil.rmtree(old, ignore_errors=True)


def _constraints(path: Path) -> Path:
    """A pip constraints file holding ``KEEP`` at the project venv's versions."""
    from importlib.metadata import PackageNotFoundError, version

    lines = []
    for dist in KEEP:
        try:
            lines.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            pass
    path.write_text("\n".join(lines) + "\n")
    return path


def env_python(env: Env = ONNX_PTQ) -> Path:
    """The isolated venv's python, building the venv first if it is not cached (about 30 s)."""
    venv = _venv_dir(env)
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
            purelib = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            project = sysconfig.get_paths()["purelib"]
            if env is not ONNX_PTQ:  # the project's packages count as installed from the start
                (Path(purelib) / "zz_ivit_project_venv.pth").write_text(project + "\n")
                _pip(python, "-c", str(_constraints(venv / "constraints.txt")), *env.pins)
            else:  # its pins replace the project's onnx/onnxruntime, so the .pth comes after them
                _pip(python, *env.pins)
                _pip(python, "--no-deps", *env.no_deps)
                (Path(purelib) / "zz_ivit_project_venv.pth").write_text(project + "\n")
            (venv / ".complete").write_text("\n".join((project, *env.pins, *env.no_deps)) + "\n")
    return python


def run_script(env: Env, script: Path, *args: str, cwd: str | Path) -> dict:
    """Run a toolkit ``script`` with ``args`` in ``env``'s python; returns the JSON on its last line."""
    r = subprocess.run([str(env_python(env)), str(script), *args], capture_output=True, text=True, cwd=cwd)
    if r.returncode:
        tail = " | ".join(r.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{script.stem} {args[0]} failed: {tail}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def onnx_ptq(tool: str, fp32_path: str | Path, calib: np.ndarray, out_path: str | Path) -> dict:
    """Quantize an FP32 ONNX model with ``tool`` (one of RECIPES) in the isolated venv; returns the
    versions it ran with ({"tool": ..., "version": ..., "onnx": ..., "onnxruntime": ...})."""
    if tool not in RECIPES:
        raise ValueError(f"tool must be one of {RECIPES}, got {tool!r}")
    with tempfile.TemporaryDirectory() as tmp:
        calib_path = Path(tmp) / "calib.npy"
        np.save(calib_path, np.ascontiguousarray(calib, np.float32))
        return run_script(ONNX_PTQ, SCRIPT, tool, str(fp32_path), str(calib_path), str(out_path), cwd=tmp)
