"""``rewrite()``: the converter's Python entry point (the CLI's ``rewrite`` calls it)."""

from __future__ import annotations

import onnx

from .errors import ConversionError, one_line
from .io import check_output_path, save_model, skeleton
from .pipeline import Options, Pipeline, Report
from .weights import unshare_gemm_weights


def rewrite(
    model,
    output=None,
    *,
    pipeline: Pipeline | None = None,
    stop_after: str | None = None,
    base_dir=None,
    external_data: bool | None = None,
    **options,
) -> tuple[onnx.ModelProto, Report]:
    """Convert a fake-quant model (path or ModelProto) to integer-only ONNX; save it when ``output`` is given.

    ``options`` are :class:`Options` fields (``allow_float``, ``scale_table``, ...). Nothing is written
    unless the whole conversion and the final ONNX check succeed. ``base_dir``: the folder of a
    ModelProto's external data files (default: the current one). ``external_data``: write the weights to
    ``<output>.data`` (None: only when the model exceeds protobuf's 2 GiB).
    """
    if output is not None:
        check_output_path(output)  # before the work, naming the path the user gave
    pipe = pipeline or Pipeline.default()
    out, report = pipe.run(model, Options(**options), stop_after=stop_after, base_dir=base_dir)
    if stop_after is None or stop_after == pipe.names[-1]:
        copies = unshare_gemm_weights(out)
        if copies:
            report.counts.setdefault("finalize", {})["shared GEMM weight copied"] = copies
        _check(out)
        if not options.get("allow_float"):
            _certify(out)
        if report.notes.get("fixed_random"):
            from .passes.fix_random import check_draws_ignored

            check_draws_ignored(out, report.notes["fixed_random"])
    if output is not None:
        save_model(out, output, external_data)
    return out, report


def _check(model: onnx.ModelProto) -> None:
    """Full onnx check (with shape inference through the function bodies); one-line error."""
    try:  # on the weight-free skeleton: the same check, without copies of the weights
        onnx.checker.check_model(skeleton(model), full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError, and the checker's C++ errors
        raise ConversionError(f"output fails the ONNX check: {one_line(e)}") from None


def _certify(model: onnx.ModelProto, shown: int = 4) -> None:
    """Strict means certified: the integer-only certificate validate runs (``certify.float_offenders``) must
    pass, or the conversion fails naming the first float tensors, before anything is written."""
    from .certify import float_offenders

    try:
        bad = float_offenders(model)
    except Exception as e:  # noqa: BLE001 - strict shape inference's errors, as validate reports them
        raise ConversionError(f"output fails the integer-only certificate: {one_line(e)}") from None
    if bad:
        more = f"; ... ({len(bad) - shown} more)" if len(bad) > shown else ""
        raise ConversionError(
            f"output fails the integer-only certificate: {len(bad)} float tensor(s) between the input "
            f"quantize and the output dequantize: {'; '.join(map(str, bad[:shown]))}{more}; "
            "rerun with --allow-float to keep them"
        )
