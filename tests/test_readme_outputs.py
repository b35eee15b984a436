"""The README's quoted command outputs are what the commands print today (benchmarks/readme_outputs.py
regenerates them; TVM builds, which take minutes, are left to it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import readme_outputs  # noqa: E402


def test_blocks_are_found():
    found = [c for _, _, c in readme_outputs.blocks(readme_outputs.README.read_text().split("\n"))]
    assert any(c.startswith("ivit-onnx rewrite digits") for c in found)
    assert any(c.startswith("python -m ivit_onnx.validate") and "--help" not in c for c in found)
    assert "python -m ivit_onnx.validate --help" in found


def test_readme_outputs_match_the_commands():
    pytest.importorskip("sklearn")  # --data digits
    _, changed = readme_outputs.regenerate(readme_outputs.README.read_text(), skip_slow=True)
    assert not changed, f"README outputs drifted; run python benchmarks/readme_outputs.py: {changed}"


def test_normalize_hides_only_throughput():
    a = "PASSED   run: library   450 samples, 1781.9 samples/s"
    assert readme_outputs.normalize(a) == readme_outputs.normalize(a.replace("1781.9", "20.0"))
    assert readme_outputs.normalize(a) != readme_outputs.normalize(a.replace("450", "451"))
