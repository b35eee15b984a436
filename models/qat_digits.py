"""QAT recipe on the digits ViT: ``python -m ivit_onnx.models.qat_digits`` (about a minute, one CPU thread).

Starts from the trained FP32 digits ViT (the bundled ``digits_vit_fp32.onnx``'s weights, or ``--train`` to
train it again), quantizes it with min/max calibration (PTQ), fine-tunes the integer model with QAT
(:mod:`.qat`: integer forward, straight-through gradients, EMA activation scales), then exports both,
converts them with ``ivit-onnx rewrite`` and measures every accuracy on the integer ONNX graphs in
onnxruntime; it also checks that each graph's logits equal the torch integer model's bit for bit.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ivit_onnx.pipeline import Options

from . import bundled, digits
from .export import export_onnx
from .make_default import MODEL_CONFIG, QUANT_CONFIG, calibration, deterministic, fit, train_digits_vit
from .qat import IntegerViT, qat
from .vit import VisionTransformer, vit

QAT_CONFIG = dict(
    epochs=4, batch_size=32, lr=2e-4, weight_decay=0.0, warmup_epochs=0, ema=0.9, seed=0, threads=1
)
EXPORT = dict(exporter="dynamo", opset=17)


def load_fp32_onnx(path: str | Path) -> VisionTransformer:
    """The digits ViT with the weights of its FP32 ONNX export (MatMul weights are stored transposed)."""
    model = vit(**MODEL_CONFIG)
    g = onnx.load(str(path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    state = {k: torch.from_numpy(v.copy()) for k, v in inits.items() if k in model.state_dict()}
    consumers = {i: n for n in g.node for i in n.input}
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in inits and n.output[0] in consumers:
            bias = [i for i in consumers[n.output[0]].input if i.endswith(".bias")]
            if bias:
                state[bias[0].removesuffix(".bias") + ".weight"] = torch.from_numpy(
                    inits[n.input[1]].T.copy()
                )
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise ValueError(f"{path}: no weights for {sorted(missing)}")
    model.load_state_dict(state)
    return model.eval()


def integer_logits(
    fq: torch.nn.Module, x: np.ndarray, work: Path, tag: str, options: Options | None = None
) -> np.ndarray:
    """Export the fake-quant ``fq``, convert it with ``ivit-onnx rewrite`` (``options``: the kernel choices)
    and run the integer graph on ``x`` in onnxruntime with the custom-op library: its logits."""
    from ivit_onnx import rewrite
    from ivit_onnx.opset.ort_library import session

    fq_path, int_path = work / f"{tag}_fq.onnx", work / f"{tag}_int.onnx"
    export_onnx(fq, torch.from_numpy(x[:2]), fq_path, **EXPORT)
    rewrite(fq_path, int_path, **asdict(options or Options()))
    return session(onnx.load(str(int_path)), "library").run(None, {"input": x})[0]


def top1(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(-1) == y).mean() * 100)


def integer_accuracy(
    qm: IntegerViT, x: np.ndarray, y: np.ndarray, work: Path, tag: str
) -> tuple[float, bool]:
    """Export, rewrite (with the QAT model's kernel options) and run the integer graph: (top-1 %, logits
    bit-identical to the torch model). The torch model runs first: its forward refreshes the weight scales
    (after training's last step) that the export then carries."""
    with torch.no_grad():
        mine = qm.eval()(torch.from_numpy(x)).numpy()
    logits = integer_logits(qm.fq, x, work, tag, qm.opt)
    return top1(logits, y), bool(np.array_equal(logits, mine))


def finetune(qm: IntegerViT, x: np.ndarray, y: np.ndarray, cfg: dict, log: bool = True) -> IntegerViT:
    """QAT: AdamW, cosine decay, over the integer model's straight-through gradients; deterministic."""
    torch.manual_seed(cfg["seed"])
    return fit(qm, x, y, cfg, log, tag="qat epoch")


def ptq_and_qat(
    fp32: VisionTransformer,
    data: tuple,
    bits: int,
    cfg: dict,
    work: Path,
    options: Options | None = None,
    log: bool = True,
) -> dict:
    """One row: ``fp32`` min/max-quantized (PTQ) with ``bits``-bit weights and the ``options`` kernels, then
    fine-tuned with QAT for ``cfg['epochs']``; each integer graph's accuracy on the test split of ``data``
    (``load_digits_split()``), the QAT CPU seconds, and whether both graphs equal the QAT model bit for
    bit."""
    x_tr, y_tr, x_te, y_te = data
    qm = qat(fp32, calibration(x_tr), weight_bits=bits, ema=cfg["ema"], options=options, **QUANT_CONFIG)
    ptq_acc, ptq_exact = integer_accuracy(qm, x_te, y_te, work, f"ptq_w{bits}")
    start = time.process_time()
    finetune(qm, x_tr, y_tr, cfg, log)
    seconds = time.process_time() - start
    qat_acc, qat_exact = integer_accuracy(qm, x_te, y_te, work, f"qat_w{bits}")
    return dict(
        weight_bits=bits, ptq=ptq_acc, qat=qat_acc, qat_seconds=seconds, bit_identical=ptq_exact and qat_exact
    )


def run(weight_bits: list[int], train: bool, epochs: int, log: bool = True) -> list[dict]:
    """PTQ and QAT of the digits ViT at each weight width; one row of measured accuracies per width."""
    with deterministic(QAT_CONFIG["threads"]):
        data = digits.load_digits_split()
        x_tr, y_tr, x_te, y_te = data
        fp32 = train_digits_vit(x_tr, y_tr, log) if train else load_fp32_onnx(bundled.default_fp32_path())
        with torch.no_grad():
            fp32_acc = top1(fp32(torch.from_numpy(x_te)).numpy(), y_te)
        cfg = {**QAT_CONFIG, "epochs": epochs}
        with tempfile.TemporaryDirectory() as tmp:
            return [
                {"fp32": fp32_acc, **ptq_and_qat(fp32, data, bits, cfg, Path(tmp), log=log)}
                for bits in weight_bits
            ]


def table(rows: list[dict], epochs: int) -> str:
    lines = [
        "| weights | activations | FP32 | PTQ (integer graph) | QAT (integer graph) | QAT CPU s | "
        "int graph == torch QAT model |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| int{r['weight_bits']} per channel | int8 (softmax uint8 2^-8) | {r['fp32']:.2f}% | "
            f"{r['ptq']:.2f}% | {r['qat']:.2f}% | {r['qat_seconds']:.0f} ({epochs} epochs) | "
            f"{'bit for bit' if r['bit_identical'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weight-bits", default="8,2", help="comma list of weight widths (2..8)")
    parser.add_argument("--epochs", type=int, default=QAT_CONFIG["epochs"], help="QAT epochs")
    parser.add_argument("--train", action="store_true", help="train the FP32 model again (about a minute)")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch log")
    args = parser.parse_args(argv)
    bits = [int(b) for b in args.weight_bits.split(",")]
    rows = run(bits, args.train, args.epochs, log=not args.quiet)
    print(table(rows, args.epochs))


if __name__ == "__main__":
    main()
