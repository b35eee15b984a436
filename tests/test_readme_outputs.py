"""The command outputs quoted in README.md and docs/*.md are what the commands print today
(benchmarks/readme_outputs.py regenerates them; TVM builds, which take minutes, are left to it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import readme_outputs  # noqa: E402

DOCUMENTS = readme_outputs.documents()


def commands(path: Path) -> list[str]:
    return [c for _, _, c in readme_outputs.blocks(path.read_text().split("\n"))]


def test_blocks_are_found():
    found = commands(readme_outputs.README)
    assert found[0].startswith("ivit-onnx rewrite digits")
    assert any(c.startswith("python -m ivit_onnx.validate") and "--help" not in c for c in found)
    for step in ("compile", "run", "bench"):
        assert any(c.startswith(f"ivit-onnx {step} ") for c in found), f"README quotes no 'ivit-onnx {step}'"
    docs = {p.name: commands(p) for p in DOCUMENTS if p.parent == readme_outputs.DOCS}
    assert "python -m ivit_onnx.validate --help" in docs["validate.md"]
    assert any(c.startswith("ivit-onnx compile") for c in docs["library.md"])


def test_slow_is_only_tvm():
    slow = readme_outputs.SLOW.match
    assert slow("ivit-onnx compile digits_int.onnx -o digits_int.so --shape input=8,1,8,8")
    assert slow("ivit-onnx run digits_int.so")
    assert slow("ivit-onnx bench digits_int.onnx --engines onnxruntime,tvm")
    assert not slow("ivit-onnx compile digits_int.onnx -o digits_int.ort.onnx")
    assert not slow("ivit-onnx run digits_int.ort.onnx")
    assert not slow("ivit-onnx bench digits_int.onnx --fp32 digits")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(readme_outputs.ROOT).as_posix())
def test_quoted_outputs_match_the_commands(path):
    pytest.importorskip("sklearn")  # --data digits
    if any(c.startswith("ivit-onnx bench ") for c in commands(path)):
        pytest.importorskip("openvino")  # bench's peers (the bench extra)
    _, changed = readme_outputs.regenerate(path.read_text(), skip_slow=True)
    assert not changed, f"{path.name}: outputs drifted; run python benchmarks/readme_outputs.py: {changed}"


def test_normalize_hides_only_throughput():
    a = "PASSED   run: library   450 samples, 1781.9 samples/s"
    assert readme_outputs.normalize(a) == readme_outputs.normalize(a.replace("1781.9", "20.0"))
    assert readme_outputs.normalize(a) != readme_outputs.normalize(a.replace("450", "451"))


def test_normalize_hides_bench_timings_not_structure():
    a = "\n".join(
        [
            "device: AMD EPYC (avx2, no VNNI); 2 cores, 2 logical CPUs, 2 threads; onnxruntime 1.31.1",
            "name                          median ms     p90 ms   samples/s  time/fp32",
            "int: onnxruntime (library)        2.864      3.101      2793.7       0.27",
            "fp32: onnxruntime                10.505     10.662       761.6       1.00",
            "int: onnxruntime (library): native custom-op library; GEMM self-check: uint8 GEMMs exact",
            "exact: library == function bodies: yes",
        ]
    )
    b = (
        a.replace("AMD EPYC (avx2, no VNNI)", "Intel(R) Xeon(R) (avx2 avx512_vnni)")
        .replace("2.864      3.101      2793.7       0.27", "12.864     13.101       622.0       1.27")
        .replace("GEMM self-check: uint8 GEMMs exact", "GEMM self-check: uint8 GEMMs exact with x64")
    )
    assert readme_outputs.normalize(a) == readme_outputs.normalize(b)
    for changed in (
        a.replace("bodies: yes", "bodies: no"),
        a.replace("p90 ms", "p99 ms"),
        a.replace("fp32: onnxruntime ", "fp32: openvino    "),
    ):
        assert readme_outputs.normalize(a) != readme_outputs.normalize(changed)
