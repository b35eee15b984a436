"""One trained model per family and one file per export and quantization, shared by every test of the
session (``models/hf_matrix.Workshop`` makes each once)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def workshop(tmp_path_factory):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    from ivit_onnx.models.hf_matrix import Workshop

    return Workshop(tmp_path_factory.mktemp("hf"))
