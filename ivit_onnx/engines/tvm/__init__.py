"""The TVM hand-off: inline the private ops, import with relax's ONNX frontend, compile, export, run.

Needs ``pip install -e .[tvm]``; :mod:`.prepare` and :mod:`.conv` use onnx only.
"""

from __future__ import annotations

from .prepare import foreign_nodes, prepare_for_tvm


def __getattr__(name: str):
    """The TVM-dependent API, imported on first use so ``prepare_for_tvm`` works without TVM."""
    if name in ("Artifact", "compile_model", "export", "import_relax", "load", "make_target", "run"):
        from . import compile as _compile

        return getattr(_compile, name)
    raise AttributeError(name)


__all__ = ["Artifact", "compile_model", "export", "foreign_nodes", "import_relax", "load", "make_target",
           "prepare_for_tvm", "run"]
