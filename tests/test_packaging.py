"""The wheel's package list is the source folders' list: a module added in a new folder cannot be left out
of a normal (non-editable) install. ``.ci/run`` also builds the wheel and imports every module from it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layout() -> dict[str, str]:
    """setup.py's ``LAYOUT`` (package -> folder) read without running setup.py, as folder -> package."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "LAYOUT":
            return {folder: pkg for pkg, folder in ast.literal_eval(node.value).items()}
    raise RuntimeError("setup.py has no LAYOUT")


#: source folder -> the package it is installed as (the design's top-level layout)
LAYOUT = _layout()


def _sources() -> list[Path]:
    """The .py files under the four roots that git tracks (all of them where git is not available)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--", *LAYOUT], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        files = [ROOT / f for f in out if f.endswith(".py")]
    except (OSError, subprocess.CalledProcessError):
        files = []
    return files or [
        f for root in LAYOUT for f in (ROOT / root).rglob("*.py") if "__pycache__" not in f.parts
    ]


def _dotted(f: Path, with_module: bool) -> str:
    root = f.relative_to(ROOT).parts[0]
    parts = f.relative_to(ROOT / root).with_suffix("").parts
    names = list(parts[:-1]) + ([parts[-1]] if with_module and parts[-1] != "__init__" else [])
    return ".".join([LAYOUT[root], *names])


def source_packages() -> set[str]:
    """Every folder holding Python modules under the four roots, as a dotted package name."""
    return {_dotted(f, with_module=False) for f in _sources()}


def source_modules() -> list[str]:
    """Every module of the installed package, by dotted name (what the wheel check imports)."""
    return sorted({_dotted(f, with_module=True) for f in _sources()})


def _setup_module():
    """setup.py as a module (not run as __main__, so it does not call setup())."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ivit_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_derives_every_source_package():
    """setup.py's package list, derived from the folders, is every folder holding modules (none lacks an
    ``__init__.py``)."""
    setup = _setup_module()
    listed = setup.packages()
    missing, extra = sorted(source_packages() - set(listed)), sorted(set(listed) - source_packages())
    assert not missing and not extra, f"setup.py packages(): missing {missing} (no __init__?), extra {extra}"
    assert len(listed) == len(set(listed))


def import_all() -> int:
    """Import every source module from the installed package (run outside the checkout, as .ci/run does).

    A module that needs an extra that is not installed (torch, scikit-learn, ...) is skipped and counted;
    a missing ``ivit_onnx`` module, or ``ivit_onnx`` imported from the checkout, is a failure."""
    import importlib

    import ivit_onnx

    if Path(ivit_onnx.__file__).resolve().parent == ROOT / "ivit_onnx":
        print(f"ivit_onnx imported from the checkout ({ivit_onnx.__file__}), not the installed wheel")
        return 1
    bad, skipped, mods = [], [], source_modules()
    for m in mods:
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            (bad if (e.name or "").startswith("ivit_onnx") else skipped).append(f"{m} ({e.name})")
    print(
        f"imported {len(mods) - len(bad) - len(skipped)} of {len(mods)} modules from "
        f"{Path(ivit_onnx.__file__).parent}; skipped (extra not installed): {', '.join(skipped) or 'none'}"
    )
    for m in bad:
        print(f"MISSING from the installed package: {m}")
    return 1 if bad else 0


if __name__ == "__main__":  # python tests/test_packaging.py --import-all (what .ci/run's wheel step runs)
    sys.exit(import_all() if "--import-all" in sys.argv else print("\n".join(source_modules())))
