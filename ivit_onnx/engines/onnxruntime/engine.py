"""The onnxruntime engine behind the :class:`~ivit_onnx.engines.base.Engine` interface: compile writes the
artifact (:func:`.compile.compile_model`), load opens :class:`.session.InferenceSession` on it."""

from __future__ import annotations

from ..base import Engine


class OnnxruntimeEngine(Engine):
    """The custom-op library's engine: artifact ``.onnx`` (``int.onnx`` as converted also loads, compiled in
    memory)."""

    name, suffix = "onnxruntime", ".onnx"
    bench_label, exact_label, compiles = "int: onnxruntime (library)", "library", False

    def compile(self, model_arg: str, output: str, args) -> int:
        from ivit_onnx.errors import ConversionError
        from ivit_onnx.io import check_output_path, load_model, save_model
        from ivit_onnx.models.bundled import resolve

        from .compile import compile_model, is_artifact

        check_output_path(output)
        model = load_model(resolve(model_arg))
        if is_artifact(model):
            raise ConversionError(f"{model_arg}: already compiled for onnxruntime")
        if not any(n.domain == "ai.ivit" for n in model.graph.node):
            raise ConversionError(f"{model_arg}: not an integer model (no ai.ivit ops): convert it with "
                                  "'ivit-onnx rewrite' first")
        compiled = compile_model(model)
        save_model(compiled.model, output)
        if not args.quiet:
            print(f"wrote {output} (onnxruntime engine: {compiled.describe()})")
        return 0

    def load(self, path, threads: int | None = None, **kwargs):
        from .session import InferenceSession

        return InferenceSession(path, threads, **kwargs)

    def session(self, model, threads: int | None = None, shapes: dict | None = None, **options):
        """The session on ``model`` compiled in memory (``options``: ``keep`` and the compile step's
        rewrites, as :class:`.session.InferenceSession` takes them); any shape runs."""
        return self.load(model, threads, **options)
