"""``rewrite()``: the converter's Python entry point (the CLI's ``rewrite`` calls it)."""

from __future__ import annotations

import onnx

from .pipeline import Options, Pipeline, Report, save_model


def rewrite(
    model, output=None, *, pipeline: Pipeline | None = None, stop_after: str | None = None, **options
) -> tuple[onnx.ModelProto, Report]:
    """Convert a fake-quant model (path or ModelProto) to integer-only ONNX; save it when ``output`` is given.

    ``options`` are :class:`Options` fields (``allow_float``, ``scale_table``, ...). Nothing is written
    unless the whole conversion and the final ONNX check succeed.
    """
    from ivit_onnx.passes.finalize import check

    pipe = pipeline or Pipeline.default()
    out, report = pipe.run(model, Options(**options), stop_after=stop_after)
    if stop_after is None or stop_after == pipe.names[-1]:
        check(out)
    if output is not None:
        save_model(out, output)
    return out, report
