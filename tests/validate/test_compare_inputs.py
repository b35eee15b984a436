"""Metrics, bit-exact comparison, and the input loaders (random, npz, digits)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ivit_onnx import compare
from ivit_onnx.inputs import InputError, input_specs, load_dataset


def test_bit_equal_is_strict_about_dtype_shape_and_bits():
    a = np.array([0.0, 1.0], np.float32)
    assert compare.bit_equal(a, a.copy())
    assert not compare.bit_equal(a, a.astype(np.float64))
    assert not compare.bit_equal(a, np.array([-0.0, 1.0], np.float32))  # signed zero differs in bits
    assert not compare.bit_equal(a, a.reshape(2, 1))


def test_first_difference_follows_the_given_order():
    a = {"t1": np.zeros(3, np.int8), "t2": np.ones(3, np.int8), "t3": np.zeros(2, np.int8)}
    b = {"t1": np.zeros(3, np.int8), "t2": np.array([1, 2, 1], np.int8), "t3": np.ones(2, np.int8)}
    d = compare.first_difference(["t1", "t2", "t3"], a, b)
    assert d.tensor == "t2" and "1 of 3 elements differ" in d.detail and "[1]" in d.detail
    assert compare.first_difference(["t3", "t2"], a, b).tensor == "t3"
    assert compare.first_difference(["t1"], a, b) is None


def test_pair_stats_metrics():
    ref = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 0.0]])
    test = np.array([[1.0, 2.0, 3.5], [0.0, 1.0, 3.0]])
    s = compare.PairStats()
    s.update(ref, test)
    assert s.agreement == 0.5 and s.samples == 2
    assert s.max_abs == 3.0
    assert math.isclose(s.sqnr, 10 * math.log10(24 / 18.25))
    assert math.isclose(s.cosine, (compare.cosine(ref[0], test[0]) + compare.cosine(ref[1], test[1])) / 2)
    exact = compare.PairStats()
    exact.update(ref, ref)
    assert exact.sqnr == compare.SQNR_CAP and math.isclose(exact.cosine, 1.0)


def test_accuracy_top1_top5():
    logits = np.tile(np.arange(10.0), (3, 1))
    acc = compare.Accuracy()
    acc.update(logits, np.array([9, 5, 0]))
    assert acc.as_dict() == {"samples": 3, "top1": 1 / 3, "top5": 2 / 3}


def test_dequantize_broadcasts_per_channel_scales():
    q = np.array([[[1, -2]], [[3, 4]]], np.int8)  # [2, 1, 2]
    entry = {"scale": [[[0.5]], [[2.0]]], "zero_point": 1}
    assert compare.dequantize(q, entry).tolist() == [[[0.0, -1.5]], [[4.0, 6.0]]]


def _model(shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]))


def test_random_inputs_are_seeded():
    specs = input_specs(_model(["n", 2, 3]))
    a = load_dataset(None, specs, 5, 7, "raw")
    b = load_dataset(None, specs, 5, 7, "raw")
    (fa, _), (fb, _) = next(a.batches(5)), next(b.batches(5))
    assert fa["x"].shape == (5, 2, 3) and np.array_equal(fa["x"], fb["x"])


def test_npz_single_array_and_labels(tmp_path):
    specs = input_specs(_model(["n", 2, 3]))
    np.savez(tmp_path / "d.npz", pixels=np.ones((4, 2, 3), np.float64), labels=np.arange(4))
    ds = load_dataset(str(tmp_path / "d.npz"), specs, 8, 0, "raw")
    feeds, labels = next(ds.batches(3))
    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (3, 2, 3) and labels.tolist() == [0, 1, 2]
    np.savez(tmp_path / "bad.npz", x=np.ones((4, 2, 3)), labels=np.ones(3))
    with pytest.raises(InputError, match="labels"):
        load_dataset(str(tmp_path / "bad.npz"), specs, 8, 0, "raw")


def test_symbolic_sample_dims_need_data():
    with pytest.raises(InputError, match="give --data"):
        load_dataset(None, input_specs(_model(["n", "c", 3])), 2, 0, "raw")


def test_digits_split_has_labels():
    pytest.importorskip("sklearn")
    ds = load_dataset("digits", input_specs(_model(["n", 1, 8, 8])), 8, 0, "raw")
    assert ds.count == 450 and ds.labels.shape == (450,)
    feeds, labels = next(ds.batches(16))
    assert feeds["x"].shape == (16, 1, 8, 8) and 0 <= feeds["x"].min() and feeds["x"].max() <= 1


def test_onnx_model_without_tensor_map():
    assert compare.tensor_map(onnx.ModelProto()) == {}
