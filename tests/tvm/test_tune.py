"""Meta-schedule tuning (slow: the first build imports TVM's tensor intrinsics): a tuned artifact stays
bit-exact and its database is reused without tuning again."""

from __future__ import annotations

import numpy as np
import pytest
from _tvm_cases import chain_model

from ivit_onnx.opset.reference import evaluator

tvm = pytest.importorskip("tvm")
pytest.importorskip("xgboost")
pytest.importorskip("cloudpickle")
from ivit_onnx.engines.tvm import compile_model  # noqa: E402

pytestmark = [pytest.mark.tvm, pytest.mark.slow]


def test_tuned_chain_bitexact_and_database_reused(tmp_path):
    rng = np.random.default_rng(0)
    model = chain_model(rng)
    x = rng.integers(0, 256, (2, 8, 16)).astype(np.uint8)
    expected = evaluator(model).run(None, {"x": x})
    db = tmp_path / "db"
    tuned = compile_model(model, tune_trials=4, tune_db=db)
    assert (db / "database_tuning_record.json").stat().st_size > 0
    reused = compile_model(model, tune_db=db)
    for art in (tuned, reused):
        for out, ref in zip(art.run([x]), expected, strict=True):
            np.testing.assert_array_equal(out, ref)
