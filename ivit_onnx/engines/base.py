"""What every engine is: a name, an artifact suffix, its compile arguments, ``compile`` (write the artifact)
and ``load`` (a session with onnxruntime's interface). ``ivit-onnx compile/run/bench``, validate's library
backend and :func:`ivit_onnx.InferenceSession` reach every engine through this and the registry
(:data:`ivit_onnx.engines.ENGINES`)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeArg:
    """onnxruntime's ``NodeArg`` shape: a graph input's or output's name, shape and type string."""

    name: str
    shape: list
    type: str


#: onnxruntime's type strings -> numpy dtype names (the artifacts' specs)
_TYPES = {"float": "float32", "float16": "float16", "double": "float64"}


def onnx_type(dtype: str) -> str:
    """``int8`` -> ``int8``, ``float32`` -> ``float`` (the ``tensor(...)`` name onnxruntime uses)."""
    return {v: k for k, v in _TYPES.items()}.get(dtype, dtype)


def spec(arg: NodeArg) -> dict:
    """A session's input/output as a ``name``/``shape``/``dtype`` dict (a symbolic dimension as 1)."""
    inner = arg.type[len("tensor("):-1] if arg.type.startswith("tensor(") else "float"
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]
    return {"name": arg.name, "shape": shape, "dtype": _TYPES.get(inner, inner)}


class Engine:
    """One engine. Subclasses set the class attributes and implement :meth:`compile` and :meth:`load`."""

    #: ``--engine`` value
    name = ""
    #: the artifact's file suffix (``ivit-onnx compile -o X<suffix>`` picks this engine)
    suffix = ""
    #: ``ivit-onnx bench``: the row's label, the exactness line's label, whether preparing it compiles
    bench_label = ""
    exact_label = ""
    compiles = False

    def add_arguments(self, parser) -> None:
        """This engine's own ``ivit-onnx compile`` options (the shared ones: model, -o, --engine, --shape,
        -q)."""

    def require(self, where: str) -> None:
        """Raise a one-line :class:`~ivit_onnx.errors.ConversionError` where this engine cannot run here
        (a missing extra, a missing compiler); ``where`` starts the line."""

    def compile(self, model_arg: str, output: str, args) -> int:
        """``ivit-onnx compile``: write the artifact ``output`` for the model ``model_arg``; exit code."""
        raise NotImplementedError

    def load(self, path: str | os.PathLike, threads: int | None = None):
        """A session on a saved artifact, with onnxruntime's interface (``run``, ``get_inputs``,
        ``get_outputs``)."""
        raise NotImplementedError

    def session(self, model, threads: int | None = None, shapes: dict | None = None, **options):
        """A session on an integer ``model`` in memory, compiled for ``shapes`` (name -> shape) where the
        engine needs static shapes: what ``ivit-onnx bench`` times."""
        raise NotImplementedError
