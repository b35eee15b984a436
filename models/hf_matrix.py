"""The Hugging Face test matrix, in one place: family x exporter x quantizer cases, the files each one needs,
and what converting it gives (``tests/hf`` asserts it; ``benchmarks/hf_table.py`` prints it).

A case's fake-quant file is ``{family}_{exporter}_{quantizer}.onnx`` and its FP32 export
``{family}_{exporter}_fp32.onnx``, in one folder (:class:`Workshop` makes them, each once).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .hf import CLASSIC, FAMILIES, VISION, Data

EXPORTERS = ("torchscript", "dynamo", "optimum")
#: the families of issue #27 (DINOv2, ..., RoFormer): TorchScript and dynamo, and the quantizer a user of
#: each kind runs (vision: onnxruntime int8; text: the mask recipe and NNCF's transformer preset)
NEW_EXPORTERS = ("torchscript", "dynamo")
NEW_VISION_QUANTIZERS = ("ort_int8",)
NEW_TEXT_QUANTIZERS = ("ort_bert_recipe", "nncf_transformer")
#: quantizers every export gets (hf_quant.QUANTIZERS' keys); Optimum's quantizer runs on Optimum's export,
#: the BERT mask recipe on BERT
QUANTIZERS = ("ort_default", "ort_int8", "nncf_default", "nncf_transformer")
#: quantizers that put BERT's attention mask (its fill value, finfo.min) inside a quantized tensor's scale:
#: onnxruntime without the recipe (defaults and int8 options alike) and NNCF's defaults. The fake-quant model
#: itself has lost the scores there, so the right outcome is a one-line refusal that names the tensor, says
#: it is the mask with its fill value, and points to the recipe (docs/conversion.md's anchor below)
MASK_QUANTIZERS = ("ort_default", "ort_int8", "nncf_default")
MASK_REFUSAL = (r"mask", r"fill value", r"attention-masks-and-quantizers")
#: MPNet's relative position buckets take log(0) = -inf (then clamp it): onnxruntime's quantizer puts the
#: TorchScript export's tensor in a QuantizeLinear whose scale is inf, so the fake-quant model is broken
#: there, and the right outcome is a one-line refusal naming the scale and saying it is not finite (issue
#: #27's one accepted refusal). Measured: NNCF, and the dynamo export, leave that tensor unquantized
INFINITE_SCALE = {"mpnet": (("torchscript", "ort_bert_recipe"),)}
INFINITE_SCALE_REFUSAL = (r"scale", r"not finite|infinite")
#: families whose outputs depend on random numbers drawn at run time: the right outcome is the one-line
#: refusal naming the op and what to export instead. None here: ViTMAEModel shuffles its patches with noise
#: even with nothing masked, but its outputs do not depend on the order, so ``fix_random`` fixes the draw
RANDOM: tuple[str, ...] = ()
RANDOM_REFUSAL = (r"Random", r"random numbers", r"noise=")

# bounds the tests assert (on test inputs whose fake-quant top-1 margin is at least MARGIN logit std devs);
# none depends on how well the weights trained, which differs with the CPU that trains (docs/testing.md)
MIN_COSINE = 0.99
MIN_AGREEMENT = 99.0
MARGIN = 0.25
#: the least number of margin inputs: where one disagreement is the agreement bound
MIN_INPUTS = round(1 / (1 - MIN_AGREEMENT / 100))
#: one-sided z of the accuracy comparison (:func:`accuracy_loss_within_chance`)
ACCURACY_Z = 3.0
#: the least accuracy that says a model trained in a test learned (chance is 0.1; they reach 0.74-0.99)
LEARNED = 0.5
BATCH = 50  #: the batch the models run with (divides both test splits: 450 digits, 500 sentences)


def input_shapes(family: str) -> dict[str, list[int | str]]:
    """``rewrite``'s ``input_shapes`` for a family: BERT's mask index arithmetic depends on the batch and the
    sequence length, so its inputs are fully static ([BATCH, SEQ]); the vision models keep a symbolic batch
    ("N") with the image size fixed (Optimum exports height and width as symbols too)."""
    from .hf import IMAGE, SEQ, VISION, input_names

    if family in VISION:
        side = IMAGE["image_size"]
        return {name: ["N", IMAGE["num_channels"], side, side] for name in input_names(family)}
    return {name: [BATCH, SEQ] for name in input_names(family)}


def convert(case: Case, fq_path: str | Path):
    """Strict ``rewrite`` of a case's fake-quant file (with its family's ``input_shapes``)."""
    from ivit_onnx import rewrite

    return rewrite(str(fq_path), input_shapes=input_shapes(case.family))


@dataclass(frozen=True)
class Case:
    family: str
    exporter: str
    quantizer: str

    @property
    def name(self) -> str:
        return f"{self.family}_{self.exporter}_{self.quantizer}"

    @property
    def fp32_name(self) -> str:
        return f"{self.family}_{self.exporter}_fp32"

    @property
    def refusal_cause(self) -> str | None:
        """Why the right outcome is a refusal ("mask quantized", "infinite scale", "random at run time"), or
        None."""
        if self.family == "bert" and self.quantizer in MASK_QUANTIZERS:
            return "mask quantized"
        if (self.exporter, self.quantizer) in INFINITE_SCALE.get(self.family, ()):
            return "infinite scale"
        if self.family in RANDOM:
            return "random at run time"
        return None

    @property
    def refusal(self) -> tuple[str, ...] | None:
        """The regexes the ConversionError must match, where the right outcome is a refusal."""
        cause = self.refusal_cause
        refusals = {"mask quantized": MASK_REFUSAL, "infinite scale": INFINITE_SCALE_REFUSAL,
                    "random at run time": RANDOM_REFUSAL}
        return None if cause is None else refusals[cause]

    @property
    def slow(self) -> bool:
        """Left out of CI (``pytest.mark.slow``): of issue #27's families, CI runs one case each, the
        TorchScript export with the family's first quantizer (vision: onnxruntime int8; text: the mask
        recipe), which meets every op of the model; dynamo and NNCF repeat them in other forms."""
        if self.family in CLASSIC:
            return False
        first = (NEW_VISION_QUANTIZERS if self.family in VISION else NEW_TEXT_QUANTIZERS)[0]
        return (self.exporter, self.quantizer) != ("torchscript", first)


def cases(families=FAMILIES, exporters=EXPORTERS) -> list[Case]:
    """The matrix (in the order of ``families``, then ``exporters``) restricted to ``families`` and
    ``exporters``: the classic families get every exporter and quantizer, issue #27's families
    NEW_EXPORTERS x their kind's quantizers."""
    out = []
    for family in families:
        for exporter in exporters:
            if family not in CLASSIC:
                if exporter in NEW_EXPORTERS:
                    quantizers = NEW_VISION_QUANTIZERS if family in VISION else NEW_TEXT_QUANTIZERS
                    out += [Case(family, exporter, q) for q in quantizers]
                continue
            quantizers = list(QUANTIZERS)
            if exporter == "optimum":
                quantizers.append("optimum")
            if family == "bert":
                quantizers.append("ort_bert_recipe")
            out += [Case(family, exporter, q) for q in quantizers]
    return out


CASES = cases()


class Workshop:
    """Makes (once) the trained models, FP32 exports and fake-quant files of the cases in ``folder``."""

    def __init__(self, folder: str | Path, trained: bool = True, log: bool = False):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trained, self.log = trained, log
        self._models: dict = {}
        self._data: dict[str, Data] = {}
        self.versions: dict[str, dict] = {}

    def data(self, family: str) -> Data:
        from .hf import data

        if family not in self._data:
            self._data[family] = data(family)
        return self._data[family]

    def model(self, family: str):
        from .hf import build, train

        if family not in self._models:
            model = build(family)
            if self.trained:
                model = train(model, family, self.data(family), self.log)
            self._models[family] = model
        return self._models[family]

    def fp32(self, family: str, exporter: str) -> Path:
        path = self.folder / f"{family}_{exporter}_fp32.onnx"
        if not path.exists():
            if exporter == "optimum":
                from .hf_optimum import optimum_export

                self.versions["optimum"] = optimum_export(self.model(family), family, path)
            else:
                from .hf_export import export

                example = {k: v[:2] for k, v in self.data(family).test.items()}
                export(self.model(family), family, path, exporter, example)
        return path

    def fake_quant(self, case: Case) -> Path:
        path = self.folder / f"{case.name}.onnx"
        if not path.exists():
            fp32 = self.fp32(case.family, case.exporter)
            calib = self.data(case.family).calibration()
            with tempfile.TemporaryDirectory() as tmp, _cwd(tmp):  # quantizers leave files in the cwd
                if case.quantizer == "optimum":
                    from .hf_optimum import optimum_quantize

                    optimum_quantize(fp32, calib, path)
                else:
                    from .hf_quant import QUANTIZERS

                    QUANTIZERS[case.quantizer](fp32, path, calib)
        return path


@contextlib.contextmanager
def _cwd(path: str | Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _logits(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The first output on ``feeds``, in batches of BATCH."""
    from .runtime import ort_session

    session = ort_session(model)
    names = {i.name for i in session.get_inputs()}
    n = len(next(iter(feeds.values())))
    return np.concatenate(
        [
            session.run(None, {k: v[i : i + BATCH] for k, v in feeds.items() if k in names})[0]
            for i in range(0, n, BATCH)
        ]
    )


def discordant(fq_logits: np.ndarray, int_logits: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """(b, c): how many inputs only the fake-quant model gets right, and how many only the integer one."""
    fq_ok, int_ok = fq_logits.argmax(1) == labels, int_logits.argmax(1) == labels
    return int(np.sum(fq_ok & ~int_ok)), int(np.sum(int_ok & ~fq_ok))


def accuracy_loss_within_chance(b: int, c: int, z: float = ACCURACY_Z) -> bool:
    """Whether the integer model's accuracy loss against its fake-quant model is within chance: McNemar's
    paired test on the discordant inputs (:func:`discordant`), ``b - c <= z * sqrt(b + c)`` (one-sided; a
    false failure about once in 700 where flips go either way). It fails a conversion that loses
    systematically, and unlike a bound in points it does not depend on the split's size or on how accurate
    the weights trained on this CPU are."""
    return b - c <= z * float(np.sqrt(b + c))


def margins(logits: np.ndarray) -> np.ndarray:
    """Whether each row's top-1 logit leads the runner-up by at least MARGIN standard deviations of the
    logits (inputs whose class a 1-LSB change cannot flip)."""
    top2 = np.sort(logits, axis=1)[:, -2:]
    return (top2[:, 1] - top2[:, 0]) >= MARGIN * logits.std()


#: the GEMM self-check's fault that makes the library take the path of an x86 CPU without VNNI, whatever CPU
#: runs the check: add ``session.x64quantprecision=1`` (opset/native/gemm_check.cpp), under which onnxruntime
#: re-encodes the int8 weights at session creation (where ALBERT's shared weights once failed to load)
PLAIN_SESSION_FAULT = "saturate"


def plain_session(model, feeds: dict[str, np.ndarray], want: np.ndarray) -> str:
    """Run ``model`` in a plain ``onnxruntime.InferenceSession`` with only the native custom-op library
    registered (docs/library.md's route; GEMM self-check as on AVX2, PLAIN_SESSION_FAULT) on one batch of
    ``feeds``: "exact" (its logits equal ``want``, the integer model's logits on that batch), "inexact",
    "failed: <the error, its last 300 characters>", or "no library" where the native library was not built."""
    import onnxruntime as ort

    from ivit_onnx.opset import ort_library

    path = ort_library.native_library()
    if path is None:
        return "no library"
    old = os.environ.get("IVIT_GEMM_PROBE_FAULT")
    os.environ["IVIT_GEMM_PROBE_FAULT"] = PLAIN_SESSION_FAULT
    try:
        opts = ort.SessionOptions()
        opts.register_custom_ops_library(path)
        session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        got = session.run(None, {k: v[:BATCH] for k, v in feeds.items() if k in names})[0]
    except Exception as e:  # onnxruntime's errors have no common base class
        message = " ".join(str(e).split()) or type(e).__name__
        return "failed: " + (message if len(message) <= 300 else "..." + message[-300:])  # the cause is last
    finally:
        if old is None:
            del os.environ["IVIT_GEMM_PROBE_FAULT"]
        else:
            os.environ["IVIT_GEMM_PROBE_FAULT"] = old
    return "exact" if np.array_equal(got, want[: len(got)]) else "inexact"


def evaluate(case: Case, fq_path: str | Path, split: Data) -> dict:
    """Convert strictly and compare with the fake-quant model: {"case", "result", "error", "float_offenders",
    "library", "cosine", "agreement", "inputs", "fq_accuracy", "int_accuracy", "discordant"}; "result" is
    "strict", "refused" (a ConversionError) or "unrunnable" (converted, but onnxruntime cannot run the integer
    model); "float_offenders": how many tensors the certificate finds float (``certify.float_offenders``);
    "library": :func:`plain_session`'s outcome; "discordant": :func:`discordant`'s (b, c)."""
    from ivit_onnx import ConversionError
    from ivit_onnx.certify import float_offenders

    out = {"case": case.name, "result": "refused"}
    try:
        model, _ = convert(case, fq_path)
    except ConversionError as e:
        return {**out, "error": str(e)}
    fq = _logits(str(fq_path), split.test)
    try:
        integer = _logits(model, split.test)
    except Exception as e:  # onnxruntime's errors have no common base class
        return {**out, "result": "unrunnable", "error": f"{type(e).__name__}: {e}"}
    return {
        **out,
        "result": "strict",
        "float_offenders": len(float_offenders(model)),
        "library": plain_session(model, split.test, integer),
        **compare(fq, integer, split.y_test),
    }


def compare(fq: np.ndarray, integer: np.ndarray, labels: np.ndarray) -> dict:
    """The integer model's logits against the fake-quant model's: "cosine" and "agreement" (%) on the inputs
    with a margin (:func:`margins`), their number "inputs", both accuracies (%), "discordant" (b, c)."""
    from .runtime import cosine

    keep = margins(fq)
    return {
        "cosine": round(cosine(fq[keep], integer[keep]), 5),
        "agreement": round(float(np.mean(fq[keep].argmax(1) == integer[keep].argmax(1))) * 100, 2),
        "inputs": int(keep.sum()),
        "fq_accuracy": round(float(np.mean(fq.argmax(1) == labels)) * 100, 2),
        "int_accuracy": round(float(np.mean(integer.argmax(1) == labels)) * 100, 2),
        "discordant": discordant(fq, integer, labels),
    }


def failed_bounds(result: dict) -> list[str]:
    """The bounds :func:`compare`'s ``result`` breaks (empty: all hold); every one holds on every CPU."""
    checks = [(result["inputs"] >= MIN_INPUTS, f"margin inputs {result['inputs']} < {MIN_INPUTS}"),
              (result["cosine"] >= MIN_COSINE, f"cosine {result['cosine']} < {MIN_COSINE}"),
              (result["agreement"] >= MIN_AGREEMENT, f"agreement {result['agreement']} % < {MIN_AGREEMENT}"),
              (accuracy_loss_within_chance(*result["discordant"]), "accuracy loss beyond chance")]
    return [why for ok, why in checks if not ok]


def summary(result: dict) -> str:
    """One line: "strict: cosine 0.998, agreement 100.0 % (412 inputs), ..." or "refused: <reason>"."""
    if result["result"] != "strict":
        return f"{result['result']}: " + result["error"]
    return (
        f"strict: {result['float_offenders']} float tensors, library session {result['library']}, "
        f"cosine {result['cosine']:.4f}, agreement {result['agreement']:.2f} % ({result['inputs']} "
        f"inputs), accuracy {result['int_accuracy']:.2f} % vs {result['fq_accuracy']:.2f} %"
    )


#: the README's Hugging Face table lies between these lines (tests/hf checks it against its own run)
README_MARKERS = (
    "<!-- HF TABLE (checked by tests/hf; benchmarks/hf_table.py --readme writes it) -->",
    "<!-- /HF TABLE -->",
)


def outcome(case: Case, result: dict) -> str:
    """A README cell: the outcome alone (the measured numbers vary with the CPU the models train on); a strict
    conversion that the certificate rejects or a plain session with the library cannot run says so."""
    if result["result"] == "strict":
        flaws = ["not integer-only"] if result.get("float_offenders") else []
        if result.get("library", "exact") not in ("exact", "no library"):
            flaws.append("library session " + result["library"].split(":")[0])
        return ", ".join(["strict", *flaws])
    if case.refusal and result["result"] == "refused":
        return f"refused: {case.refusal_cause}"
    return result["result"]


def readme_table(results: dict[Case, dict]) -> str:
    """The README's table: one row per family × exporter, one column per quantizer, outcomes only."""
    quantizers = list(dict.fromkeys(c.quantizer for c in CASES))
    rows = ["| model | exporter | " + " | ".join(quantizers) + " |", "|---|---|" + "---|" * len(quantizers)]
    for family, exporter in dict.fromkeys((c.family, c.exporter) for c in CASES):
        cells = [
            outcome(c, results[c]) if c in results else "–"
            for c in (Case(family, exporter, q) for q in quantizers)
        ]
        rows.append(f"| {family} | {exporter} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def to_json(results: list[dict]) -> str:
    return "\n".join(json.dumps(r) for r in results)
