"""onnxruntime's InferenceSession on the engine's artifact, with the custom-op library registered: the fast
exact path from Python. It keeps onnxruntime's interface (``run(output_names, feeds)``, ``get_inputs()``,
...), so it drops into code written for onnxruntime.

Given ``int.onnx`` as converted, it compiles it in memory first (:func:`.compile.compile_model`). Where the
library's GEMM self-check refuses the forms compiled on this CPU and names exact ones (the int8 fallback where
the uint8 forms are inexact; the uint8 forms where int8 x int8 wraps, on ARM cores without a dot product), it
warns once and compiles those instead; a saved artifact has no such way back, and the refusal's one line is
the error (a ``ConversionError``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onnx
import onnxruntime as ort

from ivit_onnx.opset import native_kernels, ort_library

from .compile import Compiled, compile_model, gemm_forms, is_artifact


def session_options(threads: int | None = None, base: ort.SessionOptions | None = None) -> ort.SessionOptions:
    """Options for one of our sessions: ``threads`` intra-op threads, no idle spinning (validate runs several
    sessions in turn: spinning workers would steal the next one's cores; FP32 DeiT-Tiny 105 ms vs 68 ms)."""
    opts = base or ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return opts


def register(opts: ort.SessionOptions, model: onnx.ModelProto, threads: int | None = None) -> onnx.ModelProto:
    """Register the library for ``model``'s GEMM forms; returns the model to load (the onnxruntime-extensions
    fallback renames its ops). Raises onnxruntime's error where the self-check refuses."""
    native_kernels.set_threads(threads)  # the extensions fallback's kernels (the library: onnxruntime's pool)
    # the forms this model runs, so that the self-check judges those (gemm_check.cpp)
    opts.add_session_config_entry(ort_library.INT8_GEMMS, "1" if gemm_forms(model) == "int8" else "0")
    return ort_library.register(opts, model)


def _refusal(error: Exception) -> str | None:
    """The self-check's line in onnxruntime's error (None where registration failed for another reason)."""
    text = str(error)
    at = text.find("ai.ivit custom-op library:")
    return text[at:].splitlines()[0] if at >= 0 else None


def _alternative(line: str) -> str | None:
    """The exact GEMM forms a refusal names ("int8" or "uint8"), None where it names none."""
    for forms, value in (("int8", "1"), ("uint8", "0")):
        if f"{ort_library.INT8_GEMMS}={value}" in line:
            return forms
    return None


class InferenceSession:
    """The fast exact session on a compiled artifact or a converted ``int.onnx`` (path or ModelProto).

    ``keep`` names intermediates to expose as extra outputs (they stay as ``int.onnx`` computes them only
    where :attr:`compiled` did not re-encode them; :func:`.u8_gemm.decode` maps them back)."""

    def __init__(self, model: str | os.PathLike | onnx.ModelProto, threads: int | None = None,
                 sess_options: ort.SessionOptions | None = None, keep: tuple[str, ...] = (), **rewrites):
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
        self.source = None if is_artifact(proto) else proto
        native = native_kernels.available()
        if self.source is None and not native:
            raise RuntimeError(f"{_name(model)}: a compiled onnxruntime artifact needs the native custom-op "
                               "library, which was not built (reinstall with a C++ compiler)")
        self.threads, self.keep, self._base = threads, tuple(keep), sess_options
        if not native:  # the extensions fallback: no fused ops, and no self-check for the uint8 forms
            rewrites = {**rewrites, "u8_gemm": False, "chain_fold": False, "qgemm": False}
        self.compiled = self._compile(**rewrites) if self.source is not None else Compiled.load(proto)
        try:
            self._session = self._open()
        except Exception as e:  # onnxruntime's Fail carrying the self-check's line
            line = _refusal(e)
            if line is None:
                raise
            self._session = self._fall_back(line, rewrites)

    def _fall_back(self, line: str, rewrites: dict) -> ort.InferenceSession:
        """Where the self-check refused the GEMM forms compiled and names exact ones, compile those with one
        warning; otherwise its line is the error (a saved artifact has no way back)."""
        from ivit_onnx import cpu
        from ivit_onnx.errors import ConversionError

        want = _alternative(line)
        if self.source is None or want is None or (want == "uint8") == self.compiled.uint8_gemms:
            raise ConversionError(line) from None
        now = "uint8 GEMMs are" if self.compiled.uint8_gemms else "int8 x int8 GEMMs are"
        then = ("the int8 GEMMs as converted (exact, slower)" if want == "int8" else
                "the uint8 GEMMs (exact)")
        print(f"ivit-onnx: warning: onnxruntime's {now} not exact on {cpu.describe()}; running {then}",
              file=sys.stderr)
        self.compiled = self._compile(**{**rewrites, "u8_gemm": want == "uint8"})
        return self._open()

    def _compile(self, **rewrites) -> Compiled:
        return compile_model(self.source, keep=self.keep, **rewrites)

    def _open(self) -> ort.InferenceSession:
        opts = session_options(self.threads, self._base)
        model = register(opts, self.compiled.model, self.threads)
        native = native_kernels.available()
        self.gemm_check = opts.get_session_config_entry(ort_library.CHECK) if native else ""
        if self.keep:
            from ivit_onnx.runners import with_outputs

            model = with_outputs(model, list(self.keep))
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    def run(self, output_names, input_feed, run_options=None):
        """onnxruntime's ``run``: a list of outputs, in the order of ``output_names`` (None: all)."""
        return self._session.run(output_names, input_feed, run_options)

    def describe(self) -> str:
        """What runs: the library, the compile step's rewrites and the GEMM self-check's outcome."""
        kernels = ("native custom-op library (compiled kernels, C ABI)" if native_kernels.available() else
                   "numpy reference kernels in onnxruntime-extensions (the native library was not built)")
        check = f"; GEMM self-check: {self.gemm_check}" if self.gemm_check else ""
        return f"{kernels}; {self.compiled.describe()}{check}"

    def __getattr__(self, name: str):
        """Everything else is onnxruntime's session's (``get_inputs``, ``get_outputs``, ...)."""
        return getattr(self._session, name)


def _name(model) -> str:
    return Path(os.fspath(model)).name if not isinstance(model, onnx.ModelProto) else "the model"


__all__ = ["InferenceSession", "register", "session_options"]
