"""The validate suite's tiny ViT (fake-quant, FP32 and integer), shared with the engine tests."""

from tests.validate.conftest import tiny  # noqa: F401
