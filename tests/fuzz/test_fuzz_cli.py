"""No traceback on any input: 500+ seeded mutations of the bundled and test models through the CLI.

Each mutated file goes through ``ivit-onnx rewrite`` (fake-quant seeds) or ``ivit-onnx validate``
(integer seeds) in-process; every run must end in a valid output or one ``ivit-onnx: error:`` line
(exit 2, or 1 for a failed validate check), with no partial or temporary file left behind
(``tests/fuzz/mutate.py`` states the rules; ``benchmarks/fuzz_cli.py`` runs many more).
"""

from __future__ import annotations

import onnx
import pytest

from ivit_onnx import rewrite
from ivit_onnx.models.bundled import default_model_path
from tests.fuzz.mutate import fuzz
from tests.passes.test_lower_integer import _attention_like, _island

MUTATIONS = 520


@pytest.fixture(scope="module")
def seeds():
    attention = _attention_like()
    models = {"attention": attention, "island": _island(), "int": rewrite(attention)[0]}
    commands = {"attention": ["rewrite"], "island": ["rewrite"], "int": ["validate"]}
    if default_model_path().exists():
        models["digits"] = onnx.load(default_model_path())
        commands["digits"] = ["rewrite"]
    return models, commands


def test_mutations_end_cleanly(seeds, tmp_path):
    models, commands = seeds
    tally = fuzz(models, commands, MUTATIONS, seed=2026, folder=tmp_path)
    assert sum(tally.kinds.values()) >= 500
    assert not tally.problems, "\n".join(tally.problems[:20])
    # the mutations reach every outcome: successes, clean errors and failed validate checks
    assert tally.kinds["rewrite: ok"] and tally.kinds["rewrite: exit 2"] and tally.kinds["validate: exit 1"]
    assert tally.kinds["rewrite strict: certified"]  # strict outputs certified (problems name a failure)
