"""validate's defaults (random inputs, default thresholds) pass a correct model and fail a wrong one.

The tiny fixture is a held-out-style model: random weights, so its logits have low margins on random
inputs and a correct integer graph flips some top-1 predictions. The default must not fail it for that,
and must still fail the same graph with one Requantize multiplier doubled.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ivit_onnx.validate import main


def _status(out: str, check: str) -> str:
    line = next(line for line in out.splitlines() if check in line)
    return line.split()[0]


def _corrupt_requantize(model: onnx.ModelProto, which: int) -> onnx.ModelProto:
    """Double the multiplier of the ``which``-th Requantize (a wrong scale in one layer)."""
    rq = [n for n in model.graph.node if n.op_type == "Requantize"][which]
    t = next(t for t in model.graph.initializer if t.name == rq.input[2])
    b = numpy_helper.to_array(t)
    t.CopyFrom(numpy_helper.from_array((b * 2).astype(b.dtype), t.name))
    return model


def test_default_passes_a_correct_low_margin_model(tiny, capsys):
    code = main([str(tiny.int), "--reference", str(tiny.fq)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "32 samples" in out  # the default random sample count
    assert _status(out, "top-1 agreement vs fake-quant") == "SKIPPED"  # reported, not checked on random data
    assert "not checked on random inputs" in out
    assert _status(out, "output SQNR vs fake-quant") == "PASSED"


def test_default_fails_a_corrupted_requantize(tiny, capsys, save):
    model = tiny.model()
    n = sum(n.op_type == "Requantize" for n in model.graph.node)
    bad = save(_corrupt_requantize(model, n // 4), "bad.onnx")
    code = main([bad, "--reference", str(tiny.fq)])
    out = capsys.readouterr().out
    assert code == 1, out
    failed = {
        c for c in ("output cosine vs fake-quant", "output SQNR vs fake-quant") if _status(out, c) == "FAILED"
    }
    assert failed, out


def test_agreement_is_checked_on_real_data_or_when_asked(tiny, capsys, tmp_path):
    x = np.random.default_rng(3).standard_normal((8, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "x.npz", input=x)
    main(
        [
            str(tiny.int),
            "--reference",
            str(tiny.fq),
            "--data",
            str(tmp_path / "x.npz"),
            "--min-agreement",
            "0",
        ]
    )
    assert _status(capsys.readouterr().out, "top-1 agreement vs fake-quant") == "PASSED"
    main([str(tiny.int), "--reference", str(tiny.fq), "--min-agreement", "1.01"])
    assert _status(capsys.readouterr().out, "top-1 agreement vs fake-quant") == "FAILED"
