"""``ivit-onnx bench`` and the timing engine behind it (:mod:`ivit_onnx.bench`): the CLI on the bundled digits
model (rows, device line, exactness, JSON = text), one-line errors, and the statistics on a fake clock."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from ivit_onnx import bench, cpu
from ivit_onnx.cli import main

PREFIX = "ivit-onnx: error:"
HAVE_OPENVINO = importlib.util.find_spec("openvino") is not None
HAVE_TVM = importlib.util.find_spec("tvm") is not None


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ivit_onnx.cli", "bench", *map(str, args)],
                          capture_output=True, text=True)


def _table(text: str, names: list[str]) -> dict[str, list[str]]:
    """The four numeric columns of each named row of the printed table."""
    rows = {}
    for line in text.splitlines():
        for name in names:
            rest = line[len(name):].split()
            if line.startswith(name) and len(rest) == 4:
                rows[name] = rest
    return rows


def _check_rows_match_json(text: str, data: dict) -> None:
    names = [r["name"] for r in data["rows"]]
    table = _table(text, names)
    assert set(table) == set(names), text
    for r in data["rows"]:
        med, p90, tput, ratio = table[r["name"]]
        assert float(med) == round(r["median_ms"], 3) and float(p90) == round(r["p90_ms"], 3)
        assert float(tput) == round(r["throughput"], 1)
        assert ratio == ("-" if r["time_ratio"] is None else f"{r['time_ratio']:.2f}")
        assert r["median_ms"] > 0 and r["p90_ms"] >= r["median_ms"] and len(r["times_ms"]) == data["iters"]


def test_cli_on_digits(tmp_path):
    out = tmp_path / "bench.json"
    r = _cli("digits", "--fp32", "digits", "--iters", 2, "--warmup", 1, "--batch", 4, "--threads", 1,
             "--json", out)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    device = next(line for line in text.splitlines() if line.startswith("device: "))
    assert cpu.describe() in device and "1 thread" in device and "onnxruntime " in device
    assert "exact: library == function bodies: yes" in text.splitlines()
    assert "[bench] round 2/2" in r.stderr
    data = json.loads(out.read_text())
    names = [row["name"] for row in data["rows"]]
    want = ["int: onnxruntime (library)", "fp32: onnxruntime"] + (["fp32: openvino"] if HAVE_OPENVINO else [])
    assert names == want
    if not HAVE_OPENVINO:
        assert "skipped: fp32: openvino: openvino is not installed" in text
    assert "skipped: qdq: openvino: no --fake-quant model given" in text
    assert data["baseline"] == "fp32: onnxruntime" and data["exact"] == {"library": True}
    assert data["batch"] == 4 and data["iters"] == 2 and data["device"]["threads"] == 1
    assert data["device"]["cpu"] == cpu.describe()
    base = data["rows"][1]
    assert base["time_ratio"] == 1.0
    assert data["rows"][0]["time_ratio"] == pytest.approx(data["rows"][0]["median_ms"] / base["median_ms"])
    _check_rows_match_json(text, data)


@pytest.mark.skipif(not HAVE_OPENVINO, reason="needs openvino")
def test_cli_openvino_qdq_peer_runs_int8(tmp_path):
    out = tmp_path / "b.json"
    r = _cli("digits", "--fake-quant", "digits", "--iters", 1, "--warmup", 0, "--batch", 2, "--threads", 1,
             "--json", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    qdq = next(row for row in data["rows"] if row["name"] == "qdq: openvino")
    assert qdq["time_ratio"] is None  # no FP32 baseline given
    assert "ops run in int8" in qdq["detail"] or "no int8 ops" in qdq["detail"]
    assert "skipped: fp32: onnxruntime, fp32: openvino: no --fp32 model given" in r.stdout


@pytest.mark.parametrize("args, msg", [
    (["missing.onnx"], "missing.onnx: no such file"),
    (["digits", "--engines", "onnxruntime,foo"], "unknown engine 'foo'"),
    (["digits", "--engines", ","], "no engine named"),
    (["digits", "--fp32", "nope_fp32.onnx"], "nope_fp32.onnx: no such file"),
    (["digits", "--batch", "0"], "--batch"),
    (["digits", "--iters", "x"], "--iters"),
    (["digits", "--json", "no_such_folder/x.json"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, msg):
    code = main(["bench", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(PREFIX) and msg in err, err


def test_a_float_model_is_not_an_integer_model(capsys):
    from ivit_onnx.models.bundled import default_model_path

    code = main(["bench", str(default_model_path())])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "not an integer model" in err and len(err.splitlines()) == 1


def test_engine_that_differs_from_the_bodies_exits_1(monkeypatch, capsys):
    class Wrong:
        label, exact_label, compile, compile_s, detail = "int: wrong", "wrong", False, None, ""

        def prepare(self, feeds):
            pass

        def run(self, feeds):
            return {"logits": np.zeros((len(feeds["input"]), 10), np.float32)}

    monkeypatch.setattr(bench, "_engine_runner", lambda name, model, threads: Wrong())
    code = main(["bench", "digits", "--iters", "1", "--warmup", "0", "--batch", "2", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 1 and "exact: wrong == function bodies: no" in out.splitlines()


# ---------------------------------------------------------------- the timing engine, on a fake clock


class FakeClock:
    """A clock that only moves when a fake candidate says it ran for so long."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fake(clock: FakeClock, durations: list[float], calls: list[str], name: str):
    it = iter(durations)

    def run():
        calls.append(name)
        clock.now += next(it)

    return run


def test_measure_interleaves_and_drops_warmup():
    clock, calls = FakeClock(), []
    a = _fake(clock, [9.0, 9.0, 0.001, 0.002, 0.003], calls, "a")  # two slow warm-up calls, then 1-3 ms
    b = _fake(clock, [7.0, 7.0, 0.010, 0.030, 0.020], calls, "b")
    err = io.StringIO()
    times = bench.measure({"a": a, "b": b}, iters=3, warmup=2, clock=clock, progress=err)
    assert calls == ["a", "b"] * 5
    assert times["a"] == pytest.approx([0.001, 0.002, 0.003])
    assert times["b"] == pytest.approx([0.01, 0.03, 0.02])
    lines = err.getvalue().splitlines()
    assert lines[-1] == "[bench] round 3/3" and "[bench] warm-up 2/2" in lines


def test_statistics_on_known_timings():
    clock, calls = FakeClock(), []
    base_ms = [10.0] * 10
    fast_ms = [float(x) for x in (7, 3, 1, 10, 5, 2, 9, 4, 8, 6)]  # 1..10 ms in some order
    cands = {"fast": _fake(clock, [m / 1e3 for m in fast_ms], calls, "fast"),
             "base": _fake(clock, [m / 1e3 for m in base_ms], calls, "base")}
    rep = bench.bench(cands, batch=8, iters=10, warmup=0, baseline="base", clock=clock, progress=None,
                      dev=bench.device(1))
    fast, base = rep.row("fast"), rep.row("base")
    assert fast.median_ms == pytest.approx(5.5) and fast.p90_ms == pytest.approx(9.1)  # linear interpolation
    assert fast.median_ms == pytest.approx(np.median(fast_ms))
    assert fast.p90_ms == pytest.approx(np.percentile(fast_ms, 90))
    assert fast.throughput == pytest.approx(8 / 0.0055)
    assert base.median_ms == pytest.approx(10.0) and base.ratio == pytest.approx(1.0)
    assert fast.ratio == pytest.approx(0.55)
    data = rep.to_dict()
    assert data["rows"][0]["times_ms"] == pytest.approx(fast_ms)
    _check_rows_match_json(rep.text(), json.loads(json.dumps(data)))
    assert rep.text().splitlines()[0].startswith("device: ")


def test_percentile_matches_numpy():
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 7, 50):
        xs = rng.random(n).tolist()
        for q in (0, 10, 50, 90, 100):
            assert bench.percentile(xs, q) == pytest.approx(np.percentile(xs, q))


def test_runners_and_unavailable_peers():
    class Runner:
        prepared = 0

        def prepare(self):
            Runner.prepared += 1

        def run(self, feeds):
            return feeds

    def refuse():
        raise bench.PeerUnavailable("openvino is not installed")

    clock = FakeClock()
    cands = {"runner": Runner(), "peer": bench.Candidate(lambda: None, refuse),
             "fn": lambda: setattr(clock, "now", clock.now + 0.004)}
    rep = bench.bench(cands, feeds={"x": np.zeros(1)}, batch=1, iters=2, warmup=1, clock=clock, progress=None,
                      dev=bench.device(1))
    assert [r.name for r in rep.rows] == ["runner", "fn"] and Runner.prepared == 1
    assert rep.notes == ["skipped: peer: openvino is not installed"]
    assert rep.row("fn").median_ms == pytest.approx(4.0) and rep.row("fn").ratio is None


def test_same_bits():
    a = [np.array([0.0, 1.5], np.float32)]
    assert bench.same_bits(a, [np.array([0.0, 1.5], np.float32)])
    assert not bench.same_bits(a, [np.array([-0.0, 1.5], np.float32)])  # equal values, other bits
    assert not bench.same_bits(a, [np.array([0.0, 1.5], np.float64)])
    assert not bench.same_bits(a, [np.array([[0.0, 1.5]], np.float32)])
    assert bench.same_bits([np.array([np.nan])], [np.array([np.nan])])
    assert bench.as_list({"y": 1, "x": 2}, ["x", "y"]) == [2, 1]


@pytest.mark.tvm
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TVM, reason="needs apache-tvm")
def test_cli_tvm_engine(tmp_path):
    out = tmp_path / "b.json"
    r = _cli("digits", "--engines", "onnxruntime,tvm", "--iters", 2, "--warmup", 1, "--batch", 2,
             "--threads", 1, "--json", out)
    assert r.returncode == 0, r.stderr
    assert "exact: tvm == function bodies: yes" in r.stdout and "compile: tvm " in r.stdout
    data = json.loads(out.read_text())
    assert [row["name"] for row in data["rows"]] == ["int: onnxruntime (library)", "int: tvm (llvm)"]
    assert data["exact"] == {"library": True, "tvm": True} and data["compile_s"]["tvm"] > 0
