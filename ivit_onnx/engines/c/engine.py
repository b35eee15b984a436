"""The C engine behind the :class:`~ivit_onnx.engines.base.Engine` interface: compile writes ``model.c`` and
``model.h`` and prints the footprint; load compiles ``model.c`` with the host C compiler and runs it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import onnx

from ..base import Engine


@dataclass
class Generated:
    """The C text of a model and its footprint."""

    c: str
    h: str
    info: dict  # prefix, inputs, outputs, arena_bytes, weight_bytes


def generate(model: onnx.ModelProto, shapes: dict[str, list[int]], prefix: str = "model") -> Generated:
    """``model`` (integer-only) as C99 for one sample of ``shapes`` (each input's shape, batch 1)."""
    from ivit_onnx.errors import ConversionError

    from .emit import write
    from .plan import plan

    if not re.fullmatch(r"[A-Za-z_]\w*", prefix):
        raise ConversionError(f"--prefix {prefix!r}: not a C identifier")
    bad = {k: v for k, v in shapes.items() if v and v[0] != 1}
    if bad:
        name = next(iter(bad))
        raise ConversionError(
            f"--shape {name}: the C engine runs one sample per call: the batch (first) "
            f"dimension must be 1, got {bad[name][0]}"
        )
    c, h, info = write(plan(model, shapes), prefix)
    return Generated(c, h, info)


class CEngine(Engine):
    """Integer-only C99 for microcontrollers: artifact ``model.c`` (with ``model.h`` beside it)."""

    name, suffix = "c", ".c"
    bench_label, exact_label, compiles = "int: c (gcc -O2, 1 thread)", "c", True

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--prefix",
            default=None,
            help="C engine: the name of the entry <prefix>_run and of "
            "the header's macros (default: the output's file name)",
        )

    def require(self, where: str) -> None:
        from .session import compiler

        compiler(where)

    def compile(self, model_arg: str, output: str, args) -> int:
        from ivit_onnx.cli import compile_shapes
        from ivit_onnx.io import atomic_output, check_output_path, load_model
        from ivit_onnx.models.bundled import resolve

        check_output_path(output)
        header = os.path.splitext(output)[0] + ".h"
        check_output_path(header)
        model = load_model(resolve(model_arg))
        shapes = compile_shapes(model, args.shape, model_arg)
        stem = os.path.splitext(os.path.basename(output))[0]
        prefix = getattr(args, "prefix", None) or re.sub(r"\W", "_", stem)
        if prefix[0].isdigit():
            prefix = "m_" + prefix
        gen = generate(model, shapes, prefix)
        gen.c = gen.c.replace(f'#include "{prefix}.h"', f'#include "{os.path.basename(header)}"')
        for path, text in ((header, gen.h), (output, gen.c)):
            with atomic_output(path) as tmp, open(tmp, "w") as f:
                f.write(text)
        print(
            f"wrote {output} and {header} (C engine: arena {gen.info['arena_bytes']} bytes, weights "
            f"{gen.info['weight_bytes']} bytes; entry {prefix}_run)"
        )
        return 0

    def load(self, path, threads: int | None = None):
        from .session import CSession

        return CSession.from_source(path)

    def session(self, model, threads: int | None = None, shapes: dict | None = None, **options):
        """``model`` generated for one sample (``shapes``' batch is run sample by sample) and compiled."""
        import time

        from .session import CSession

        t0 = time.perf_counter()
        one = {k: [1, *v[1:]] for k, v in (shapes or {}).items()}
        if not one:
            from ivit_onnx.cli import compile_shapes

            one = compile_shapes(model, [], "the model")
        gen = generate(model, one, "model")
        session = CSession.from_text(gen.c, gen.h, gen.info)
        session.compile_s = time.perf_counter() - t0
        return session
