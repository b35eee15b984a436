"""Comparators: bit-exact equality, output metrics (agreement, cosine, SQNR), accuracy, per-layer error."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx

#: SQNR reported for identical tensors (and used as the cap when looking for the biggest drop)
SQNR_CAP = 150.0


# ------------------------------------------------------------------------------------------- bit-exact


def bit_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (so NaNs with equal payloads and signed zeros count as equal)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def describe_difference(a: np.ndarray, b: np.ndarray) -> str:
    """One line saying how two tensors differ."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    diff = a.astype(np.float64) != b.astype(np.float64) if a.dtype.kind in "iuf" else a != b
    n = int(np.count_nonzero(diff))
    if a.dtype.kind in "iuf":
        delta = np.abs(a.astype(np.float64) - b.astype(np.float64))
        idx = tuple(int(i) for i in np.argwhere(diff)[0]) if n else ()
        return (f"{n} of {a.size} elements differ, max |Δ| {delta.max():.6g}; first at {list(idx)}: "
                f"{a[idx]!r} vs {b[idx]!r}")
    return f"{n} of {a.size} elements differ"


@dataclass
class Mismatch:
    """The first tensor two backends disagree on, the node that makes it, and how they differ."""

    tensor: str
    node: str
    detail: str

    def __str__(self) -> str:
        return f"'{self.tensor}' ({self.node}): {self.detail}"


def first_difference(order: list[str], a: dict, b: dict, nodes: dict | None = None) -> Mismatch | None:
    """The first tensor in ``order`` present in both ``a`` and ``b`` whose values are not bit-equal."""
    for name in order:
        if name in a and name in b and not bit_equal(a[name], b[name]):
            n = (nodes or {}).get(name)
            where = "graph" if n is None else f"{n.domain + '.' if n.domain else ''}{n.op_type} '{n.name}'"
            return Mismatch(name, where, describe_difference(a[name], b[name]))
    return None


# ------------------------------------------------------------------------------------------ metrics


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """``10 log10(Σ ref² / Σ (ref - test)²)``; :data:`SQNR_CAP` when equal."""
    ref = np.asarray(ref, np.float64)
    noise = float(np.sum((ref - np.asarray(test, np.float64)) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0:
        return SQNR_CAP
    if signal == 0:
        return -SQNR_CAP
    return min(SQNR_CAP, 10 * math.log10(signal / noise))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors, flattened; 1 when both are zero."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


@dataclass
class PairStats:
    """Streaming comparison of a test output against a reference output, batch by batch."""

    samples: int = 0
    agree: int = 0
    classify: bool = True
    cos_sum: float = 0.0
    cos_min: float = 1.0
    signal: float = 0.0
    noise: float = 0.0
    max_abs: float = 0.0

    def update(self, ref: np.ndarray, test: np.ndarray) -> None:
        ref = np.asarray(ref, np.float64)
        test = np.asarray(test, np.float64)
        if ref.shape != test.shape:
            raise ValueError(f"output shapes differ: {list(ref.shape)} vs {list(test.shape)}")
        n = ref.shape[0] if ref.ndim else 1
        rows_r, rows_t = ref.reshape(n, -1), test.reshape(n, -1)
        for r, t in zip(rows_r, rows_t, strict=True):
            c = cosine(r, t)
            self.cos_sum += c
            self.cos_min = min(self.cos_min, c)
        self.classify = self.classify and ref.ndim == 2 and ref.shape[1] > 1
        if self.classify:
            self.agree += int(np.sum(ref.argmax(1) == test.argmax(1)))
        self.samples += n
        self.signal += float(np.sum(ref**2))
        self.noise += float(np.sum((ref - test) ** 2))
        self.max_abs = max(self.max_abs, float(np.max(np.abs(ref - test))) if ref.size else 0.0)

    @property
    def agreement(self) -> float | None:
        return self.agree / self.samples if self.classify and self.samples else None

    @property
    def cosine(self) -> float:
        return self.cos_sum / self.samples if self.samples else float("nan")

    @property
    def sqnr(self) -> float:
        if self.noise == 0:
            return SQNR_CAP
        return min(SQNR_CAP, 10 * math.log10(self.signal / self.noise)) if self.signal else -SQNR_CAP

    def as_dict(self) -> dict:
        return {"samples": self.samples, "top1_agreement": self.agreement, "cosine_mean": self.cosine,
                "cosine_min": self.cos_min, "sqnr_db": self.sqnr, "max_abs_error": self.max_abs}


@dataclass
class Accuracy:
    """Streaming top-1/top-5 accuracy of logits against integer labels."""

    samples: int = 0
    top1: int = 0
    top5: int = 0
    classes: int = 0

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        logits = np.asarray(logits)
        if logits.ndim != 2:
            raise ValueError(f"accuracy needs [N, classes] logits, got shape {list(logits.shape)}")
        labels = np.asarray(labels).astype(np.int64).reshape(-1)
        self.classes = logits.shape[1]
        k = min(5, self.classes)
        top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        self.top1 += int(np.sum(top[:, 0] == labels))
        self.top5 += int(np.sum(np.any(top == labels[:, None], axis=1)))
        self.samples += len(labels)

    def as_dict(self) -> dict:
        n = max(self.samples, 1)
        return {"samples": self.samples, "top1": self.top1 / n,
                "top5": self.top5 / n if self.classes >= 5 else None}


# ----------------------------------------------------------------------------------------- per layer


@dataclass
class LayerRow:
    tensor: str
    replaces: str
    dtype: str
    cosine: float
    sqnr: float
    max_abs: float
    max_lsb: float
    drop: float = 0.0
    marks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def dequantize(q: np.ndarray, entry: dict) -> np.ndarray:
    """``(q - zero_point) * scale`` in float64, with the tensor map's (broadcastable) scale."""
    scale = np.asarray(entry["scale"], np.float64)
    zp = np.asarray(entry.get("zero_point", 0), np.float64)
    return (np.asarray(q).astype(np.float64) - zp) * scale


def tensor_map(model: onnx.ModelProto) -> dict:
    """The converter's ``ivit_onnx.tensor_map`` metadata (``{}`` when absent)."""
    import json

    for p in model.metadata_props:
        if p.key == "ivit_onnx.tensor_map":
            return json.loads(p.value)
    return {}


def _mapped_ancestors(model: onnx.ModelProto, mapped: set[str]) -> dict[str, set[str]]:
    """For each mapped tensor, the nearest mapped tensors upstream of it (through unmapped ones)."""
    near: dict[str, frozenset[str]] = {}
    for node in model.graph.node:  # topological order: one forward pass
        ups: set[str] = set()
        for i in node.input:
            if i in mapped:
                ups.add(i)
            elif i:
                ups |= near.get(i, frozenset())
        for o in node.output:
            near[o] = frozenset(ups)
    return {t: set(near.get(t, ())) for t in mapped}


#: ops that select part of a tensor: its SQNR can drop below its input's without any new error (e.g. the
#: class token's row), so they are never marked ``worst``. Ops that move all the data (Reshape, Concat...)
#: can only show a drop when unmapped computation lies upstream, which is then a real divergence.
SELECTION_OPS = frozenset({"Gather", "GatherElements", "GatherND", "Slice", "Split", "MaxPool"})


def _nsr(sqnr: float) -> float:
    return 10 ** (-sqnr / 10)


def per_layer(model: onnx.ModelProto, int_values: dict, fq_values: dict, tmap: dict,
              min_cosine: float) -> list[LayerRow]:
    """Dequantized integer tensors vs the fake-quant tensors they replace, in topological order.

    ``drop`` is the SQNR lost relative to the worst of the nearest mapped tensors upstream. Marks
    ``worst``: the tensor (not a selection) that adds the most relative noise power
    (``Σerr²/Σref²`` minus its upstream's), i.e. where the divergence is introduced; and
    ``first<cos``: the first tensor whose cosine is below ``min_cosine``.
    """
    order = [o for n in model.graph.node for o in n.output] + [i.name for i in model.graph.input]
    pos = {t: i for i, t in enumerate(order)}
    prod = {o: n for n in model.graph.node for o in n.output}
    rows: dict[str, LayerRow] = {}
    for name in sorted((t for t in tmap if t in int_values), key=lambda t: pos.get(t, -1)):
        entry = tmap[name]
        ref = fq_values.get(entry["replaces"])
        if ref is None:
            continue
        deq = dequantize(int_values[name], entry)
        try:
            deq = np.broadcast_to(deq, np.shape(ref))
        except ValueError:
            continue
        err = np.abs(deq - np.asarray(ref, np.float64))
        lsb = err / np.abs(np.broadcast_to(np.asarray(entry["scale"], np.float64), err.shape))
        dtype = str(entry.get("dtype", np.asarray(int_values[name]).dtype))
        rows[name] = LayerRow(name, entry["replaces"], dtype, cosine(ref, deq), sqnr_db(ref, deq),
                              float(err.max()) if err.size else 0.0, float(lsb.max()) if lsb.size else 0.0)
    ups = _mapped_ancestors(model, set(rows))
    added = {}
    for name, row in rows.items():
        base = min((rows[u].sqnr for u in ups[name] if u in rows), default=SQNR_CAP)
        row.drop = base - row.sqnr
        node = prod.get(name)
        if node is not None and node.op_type not in SELECTION_OPS:
            added[name] = _nsr(row.sqnr) - _nsr(base)
    out = list(rows.values())
    if added:
        worst = max(added, key=lambda k: added[k])
        if added[worst] > 0:
            rows[worst].marks.append("worst")
    first = next((r for r in out if r.cosine < min_cosine), None)
    if first is not None:
        first.marks.append("first<cos")
    return out
