"""Kernel-in-the-loop QAT for what :class:`.qat.IntegerViT` does not cover (the Swin): the fake-quant model
fine-tuned with the integer Softmax, GELU and LayerNorm kernels the converter will emit in its forward.

:class:`KernelLoop` runs a fake-quant model (:func:`.quant.quantize`) with each nonlinear op's float result
replaced by its integer kernel's (``Options.softmax`` / ``gelu`` / ``layernorm``: the ``int_ops`` twins with
:mod:`ivit_onnx.qparams` parameters, through :func:`.qat.softmax_kernel`, :func:`.qat.gelu_kernel`,
:func:`.qat.layernorm_kernel`): the op's input quantized with the scale of the fake-quant point it comes
from, the kernel's output written in the type of the point after it, dequantized; the backward is the float
op's at that value (straight-through), as I-ViT's own QAT trains its integer kernels. Which points: the output
point of ``parent.<name>`` is ``parent.q_<name>`` (the models' naming: ``norm1``/``q_norm1``,
``act``/``q_act``; a softmax writes into its attention's ``q_prob``); the input point is the last activation
quantizer that ran before the op, and the input must lie on its grid (checked); a softmax reads its
attention's ``q_scores`` (Swin's shift mask, added after them, rounded onto the scores' grid: far below every
row's maximum, so it comes out exactly 0 as in the integer graph).

This is not bit-exact: everything else stays fake-quant float arithmetic (the integer graph's Requantize and
IAdd roundings, int32 biases and the mask's fill differ from it here and there), so the converted graph's
accuracy is measured, not implied, and :func:`ptq_and_qat` reports its agreement with the loop model.
Activation scales stay as calibrated; weight scales follow the weights (``max|w| / 127`` per channel, each
forward). ``python -m ivit_onnx.models.qat_swin [--softmax ibert] ...`` runs the recipe on the digits Swin.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ivit_onnx.affine import Affine
from ivit_onnx.pipeline import KERNELS, Options

from . import digits, int_ops
from .digits_swin import train_digits_swin
from .make_default import calibration, deterministic, fit
from .qat import act_type, dequantize, gelu_kernel, layernorm_kernel, softmax_kernel
from .qat_digits import integer_logits, top1
from .quant import ActFakeQuant, act_quantizers, quantize, refresh_weight_scales

#: fine-tuning: AdamW at a small constant-then-cosine rate from the PTQ model, one thread, seeded
SWIN_QAT = dict(epochs=4, batch_size=32, lr=1e-4, weight_decay=0.0, warmup_epochs=0, seed=0, threads=1)
_SOFTMAX = (torch.Tensor.softmax, torch.softmax, nn.functional.softmax)


def _integers(x: Tensor, qz: ActFakeQuant, where: str, check: bool = True) -> tuple[Tensor, Affine]:
    """``x`` as the integers of ``qz``'s type (it must lie on that grid when ``check``), and the type."""
    a = act_type(qz)
    scale = float(qz.scale)
    ratio = x.detach().double() / scale
    q = torch.round(ratio).to(torch.int64)
    lo, hi = a.qrange
    if check and ((ratio - q).abs().max() > 0.01 or q.min() < lo or q.max() > hi):
        raise ValueError(f"{where}: its input is not on the grid of the last quantizer (scale {scale:.4g})")
    if q.min() < lo or q.max() > hi:  # a mask added after the quantizer: the type widens to int32
        a = Affine(a.scale, 0, np.int32, bound=int(q.abs().max()))
    return q, a


class KernelLoop(nn.Module):
    """A fake-quant model run with the integer Softmax/GELU/LayerNorm kernels of ``options`` in its forward
    (see the module). ``calls`` counts the kernel runs by op kind."""

    def __init__(self, fq: nn.Module, options: Options | None = None):
        super().__init__()
        quantizers = act_quantizers(fq)
        if not quantizers:
            raise ValueError("not a fake-quant model (no activation quantizers): quantize() it first")
        for name, qz in quantizers.items():
            if qz.calibrating:
                raise ValueError(f"{name}: quantizer not calibrated")
        self.fq = fq
        self.opt = options or Options()
        self.calls: Counter = Counter()
        # (module, the quantizer after it, its name) of every LayerNorm and GELU, by the models' naming
        self._sites = [
            (child, getattr(parent, f"q_{name}", None), f"{prefix}.{name}".lstrip("."))
            for prefix, parent in fq.named_modules()
            for name, child in parent.named_children()
            if isinstance(child, nn.LayerNorm | nn.GELU)
        ]
        self._attention = [m for m in fq.modules() if hasattr(m, "q_scores") and hasattr(m, "q_prob")]

    def forward(self, x: Tensor) -> Tensor:
        refresh_weight_scales(self.fq)
        return _Loop(self).run(x)


class _Loop(TorchFunctionMode):
    """One forward of a :class:`KernelLoop`: hooks follow the last quantizer and the attention module that
    runs; LayerNorm/GELU results are replaced by forward hooks, softmax in ``__torch_function__``."""

    def __init__(self, owner: KernelLoop):
        super().__init__()
        self.owner, self.last, self.attention = owner, None, None

    def run(self, x: Tensor) -> Tensor:
        handles = [qz.register_forward_hook(self._ran) for qz in act_quantizers(self.owner.fq).values()]
        for module, out_q, name in self.owner._sites:
            handles.append(module.register_forward_hook(self._replacer(out_q, name)))
        for m in self.owner._attention:
            handles.append(m.register_forward_pre_hook(lambda mod, args: setattr(self, "attention", mod)))
            handles.append(m.register_forward_hook(lambda mod, args, out: setattr(self, "attention", None)))
        try:
            with self:
                return self.owner.fq(x)
        finally:
            for h in handles:
                h.remove()

    def _ran(self, module, args, out) -> None:
        self.last = module

    def _target(self, out_q) -> Affine | None:
        return act_type(out_q) if isinstance(out_q, ActFakeQuant) else None

    def _replacer(self, out_q, name: str):
        def hook(module, args, out: Tensor) -> Tensor:
            if not isinstance(self.last, ActFakeQuant):
                raise ValueError(f"{name}: no activation quantizer ran before it")
            q, a = _integers(args[0], self.last, name)
            opt, target = self.owner.opt, self._target(out_q)
            if isinstance(module, nn.LayerNorm):
                y, t = layernorm_kernel(q, a, module, target, opt)
                self.owner.calls["layernorm"] += 1
            else:
                y, t = gelu_kernel(q, a, target, opt)
                self.owner.calls["gelu"] += 1
            return int_ops.ste(dequantize(y, t), out)

        return hook

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        attn = self.attention
        if func not in _SOFTMAX or attn is None:
            return out
        x = args[0]
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if dim not in (-1, x.dim() - 1):
            raise ValueError(f"softmax over dim {dim}: the integer kernels take the last axis")
        q, a = _integers(x, attn.q_scores, "softmax", check=False)
        y, t = softmax_kernel(q, a, self._target(attn.q_prob), self.owner.opt)
        self.owner.calls["softmax"] += 1
        return int_ops.ste(dequantize(y, t), out)


def ptq(fp32: nn.Module, data: tuple, work: Path, options: Options | None = None) -> tuple[nn.Module, float]:
    """``fp32`` min/max-quantized (:func:`.quant.quantize`'s defaults, the training split of ``data``), and
    the top-1 on the test split of its integer graph converted with ``options``."""
    x_tr, _, x_te, y_te = data
    fq = quantize(fp32, calibration(x_tr))
    return fq, top1(integer_logits(fq, x_te, work, "swin_ptq", options), y_te)


def ptq_and_qat(
    fp32: nn.Module, data: tuple, cfg: dict, work: Path, options: Options | None = None, log: bool = True
) -> dict:
    """:func:`ptq`, then the fake-quant model fine-tuned in a :class:`KernelLoop` for ``cfg['epochs']`` and
    converted again with ``options``: each integer graph's top-1 on the test split of ``data``
    (``load_digits_split()``), the loop model's own, its top-1 agreement with the converted graph and their
    largest logit difference, and the QAT CPU seconds."""
    x_tr, y_tr, x_te, y_te = data
    fq, ptq_top1 = ptq(fp32, data, work, options)
    loop = KernelLoop(fq, options)
    start = time.process_time()
    with deterministic(cfg["threads"]):
        torch.manual_seed(cfg["seed"])
        fit(loop, x_tr, y_tr, cfg, log, tag="swin qat epoch")
        seconds = time.process_time() - start
        with torch.no_grad():
            mine = loop.eval()(torch.from_numpy(x_te)).numpy()
    graph = integer_logits(loop.fq, x_te, work, "swin_qat", options)
    return dict(
        ptq=ptq_top1,
        qat=top1(graph, y_te),
        loop=top1(mine, y_te),
        agreement=float((graph.argmax(-1) == mine.argmax(-1)).mean() * 100),
        max_logit_diff=float(np.abs(graph - mine).max()),
        qat_seconds=seconds,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for op, choices in KERNELS.items():
        parser.add_argument(f"--{op}", choices=choices, default=choices[0])
    parser.add_argument("--epochs", type=int, default=SWIN_QAT["epochs"])
    parser.add_argument("--quiet", action="store_true", help="no per-epoch log")
    args = parser.parse_args(argv)
    options = Options(softmax=args.softmax, gelu=args.gelu, layernorm=args.layernorm)
    data = digits.load_digits_split()
    fp32 = train_digits_swin(data[0], data[1])
    with tempfile.TemporaryDirectory() as tmp, deterministic(SWIN_QAT["threads"]):
        row = ptq_and_qat(fp32, data, {**SWIN_QAT, "epochs": args.epochs}, Path(tmp), options, not args.quiet)
    print(", ".join(f"{k} {v:.2f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
