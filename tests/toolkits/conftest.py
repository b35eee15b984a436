"""The end-to-end tests' digits fixtures (trained ViT, split, FP32 file), for the toolkit tests."""

import importlib.util

if importlib.util.find_spec("torch") is not None:  # the form tests run without torch
    from tests.e2e.conftest import digits, digits_fp32_path, digits_torch  # noqa: F401
