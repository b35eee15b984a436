"""ivit-onnx: fake-quant (QDQ) ONNX vision transformers to integer-only ONNX graphs (I-ViT)."""

__version__ = "0.1.0"

from .errors import ConversionError  # noqa: E402
from .io import save_model  # noqa: E402
from .pipeline import Context, Options, Pass, Pipeline, Report  # noqa: E402
from .rewrite import rewrite  # noqa: E402
from .session import InferenceSession  # noqa: E402

__all__ = [
    "ConversionError",
    "Context",
    "InferenceSession",
    "Options",
    "Pass",
    "Pipeline",
    "Report",
    "rewrite",
    "save_model",
    "__version__",
]
