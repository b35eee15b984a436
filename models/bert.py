"""A small BERT-style text encoder with Hugging Face parameter names, its ONNX export and QDQ quantization.

What a real encoder brings that the ViTs do not: Gather embeddings (word, position, token type), an int64
attention mask turned into an additive float mask, post-LN blocks, erf GELU, and masked mean pooling.
Quantization points (``QuantPoint``, identities in float) mark where :func:`fake_quant_bert` puts the
fake-quant ops, as for the ViTs: the embedding tables, every Linear output, the scores *before* the mask
is added (so the -10000 does not spoil their scale), the probabilities, the residual sums, every LayerNorm
output and the pooled vector. Deterministic: the same seed gives the same weights and files.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .layers import QuantPoint

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
OUTPUT_NAME = "logits"
IR_VERSION = 10  # onnxruntime 1.31 reads at most IR 13; match models/export.py


@dataclass(frozen=True)
class BertConfig:
    """BERT sizes (the defaults are a tiny test encoder: 2 layers, hidden 32, 2 heads)."""

    vocab_size: int = 128
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    intermediate_size: int = 64
    max_position_embeddings: int = 32
    type_vocab_size: int = 2
    num_labels: int = 3
    layer_norm_eps: float = 1e-12
    mask_form: str = "arith"  #: "arith": (1 - mask) * -10000 (classic HF); "where": Where(mask, 0, min)


class BertEmbeddings(nn.Module):
    """word + position + token type embeddings, then LayerNorm (HF ``BertEmbeddings``); each table is
    quantized as a whole (a Gather of a quantized table is a Gather of its integers)."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.q_word, self.q_position, self.q_token_type = QuantPoint(), QuantPoint(), QuantPoint()
        self.q_sum = QuantPoint("residual")
        self.q_norm = QuantPoint()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        # 0..S-1 computed elementwise from the ids (RoBERTa's way): a Range of the input's runtime shape would
        # leave the lookup's shape unknown to compilers with static shapes (TVM's fused kernels)
        positions = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1
        x = F.embedding(input_ids, self.q_word(self.word_embeddings.weight))
        x = x + F.embedding(positions, self.q_position(self.position_embeddings.weight))
        x = x + F.embedding(token_type_ids, self.q_token_type(self.token_type_embeddings.weight))
        return self.q_norm(self.LayerNorm(self.q_sum(x)))


class BertSelfAttention(nn.Module):
    """Separate query/key/value projections, scaled scores plus the additive mask, softmax."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads, self.head_dim = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.q_query, self.q_key, self.q_value = QuantPoint(), QuantPoint(), QuantPoint()
        self.q_scores = QuantPoint("scores")
        self.q_prob = QuantPoint("prob")
        self.q_ctx = QuantPoint()

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q = self._split(self.q_query(self.query(x)))
        k = self._split(self.q_key(self.key(x)))
        v = self._split(self.q_value(self.value(x)))
        scores = self.q_scores(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)) + additive_mask
        ctx = self.q_ctx(self.q_prob(scores.softmax(dim=-1)) @ v)
        b, _, s, _ = ctx.shape
        return ctx.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)


class BertSelfOutput(nn.Module):
    """``dense``, residual, then LayerNorm (post-LN); HF's ``BertSelfOutput`` and ``BertOutput``."""

    def __init__(self, d_in: int, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.q_dense, self.q_sum, self.q_norm = QuantPoint(), QuantPoint("residual"), QuantPoint()

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.q_norm(self.LayerNorm(self.q_sum(self.q_dense(self.dense(x)) + residual)))


class BertAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c.hidden_size, c)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, additive_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.intermediate_act_fn = nn.GELU()  # erf form
        self.q_dense, self.q_act = QuantPoint(), QuantPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_act(self.intermediate_act_fn(self.q_dense(self.dense(x))))


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertSelfOutput(c.intermediate_size, c)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, additive_mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, additive_mask)
        return x


class BertForSequenceClassification(nn.Module):
    """Embeddings, post-LN encoder, mean pooling over the unmasked tokens, linear classifier."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.config = c
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.q_pooled = QuantPoint()
        self.classifier = nn.Linear(c.hidden_size, c.num_labels)
        self.q_logits = QuantPoint()
        for m in self.modules():  # HF's init: normal(0, 0.02) weights, zero biases
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, token_type_ids, attention_mask) -> torch.Tensor:
        mask = attention_mask.to(torch.float32)
        if self.config.mask_form == "where":
            keep = attention_mask[:, None, None, :].to(torch.bool)
            additive = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
        else:  # int64 mask -> additive float mask
            additive = (1.0 - mask[:, None, None, :]) * -10000.0
        x = self.encoder(self.embeddings(input_ids, token_type_ids), additive)
        pooled = (x * mask[:, :, None]).sum(dim=1) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return self.q_logits(self.classifier(self.q_pooled(pooled)))


def bert_tiny(seed: int = 0, **config) -> BertForSequenceClassification:
    """The test encoder, seeded (``config`` overrides :class:`BertConfig` fields)."""
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(**config)).eval()


def example_inputs(c: BertConfig, batch: int = 2, seq: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids and token types, and an attention mask with padding at the end of each row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, seq // 2), seq + 1, batch)
    return {
        "input_ids": rng.integers(0, c.vocab_size, (batch, seq)).astype(np.int64),
        "token_type_ids": (np.arange(seq)[None, :] >= seq // 2).repeat(batch, 0).astype(np.int64),
        "attention_mask": (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64),
    }


class _Packed(nn.Module):
    """The encoder called with its three int64 inputs stacked into one tensor, as ``quant.quantize``
    calibrates (it calls ``model(batch)`` with one tensor per batch)."""

    def __init__(self, model: BertForSequenceClassification):
        super().__init__()
        self.model = model

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        return self.model(*packed.unbind(0))


def fake_quant_bert(
    model: BertForSequenceClassification, calib: list[dict[str, np.ndarray]], **options
) -> BertForSequenceClassification:
    """The fake-quant copy of ``model`` (``models.quant.quantize`` with its ``options``: act_dtype,
    residual_bits, softmax_scale), activation ranges calibrated on the feeds in ``calib``."""
    from .quant import quantize

    batches = [torch.from_numpy(np.stack([f[k] for k in INPUT_NAMES])) for f in calib]
    return quantize(_Packed(model), batches, **options).model


def export_bert(
    model: BertForSequenceClassification,
    path: str | Path,
    opset: int = 17,
    seq: int = 8,
    exporter: str = "torchscript",
) -> None:
    """Export (float or fake-quant) with dynamic batch and sequence axes, IR version 10, with the
    ``"torchscript"`` or the ``"dynamo"`` exporter (which starts at opset 18); int16 Q/DQ
    (``residual_bits=16``) is moved to opset 21 as ``models.export`` does for the ViTs."""
    import onnx

    from .export import DYNAMO_MIN_OPSET, EXPORTERS, INT16_MIN_OPSET, _convert_opset, _has_int16_qdq
    from .quant import onnx_translation_table, register_torchscript_symbolics

    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    feeds = example_inputs(model.config, 2, seq)
    args = tuple(torch.from_numpy(feeds[k]) for k in INPUT_NAMES)
    common = dict(input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            register_torchscript_symbolics()
            axes = {k: {0: "batch", 1: "sequence"} for k in INPUT_NAMES}
            dynamic = {**axes, OUTPUT_NAME: {0: "batch"}}
            torch.onnx.export(
                model.eval(),
                args,
                str(path),
                dynamo=False,
                opset_version=opset,
                dynamic_axes=dynamic,
                **common,
            )
        else:
            dims = {
                0: torch.export.Dim("batch"),
                1: torch.export.Dim("sequence", max=model.config.max_position_embeddings),
            }
            torch.onnx.export(
                model.eval(),
                args,
                str(path),
                dynamo=True,
                opset_version=max(opset, DYNAMO_MIN_OPSET),
                external_data=False,
                dynamic_shapes=tuple(dims for _ in INPUT_NAMES),
                custom_translation_table=onnx_translation_table(),
                verbose=False,
                **common,
            )
    m = onnx.load(str(path))
    if opset < INT16_MIN_OPSET and _has_int16_qdq(m):
        m = _convert_opset(m, INT16_MIN_OPSET)
    m.ir_version = min(m.ir_version, IR_VERSION)
    onnx.save(m, str(path))


def quantize_bert(
    fp32_path: str | Path, out_path: str | Path, batches: int = 4, seed: int = 0, exclude_mask: bool = False
):
    """onnxruntime ``quantize_static``: QDQ, int8 symmetric activations, per-channel symmetric weights; with
    ``exclude_mask`` the attention mask's nodes stay float (the recipe, ``ort_qdq.mask_nodes``)."""
    import onnx

    from .ort_qdq import ort_quantize

    c = BertConfig(**_config_of(onnx.load(str(fp32_path))))
    calib = [example_inputs(c, 4, 8, seed + i) for i in range(batches)]
    return ort_quantize(fp32_path, out_path, calib, "int8_sym", exclude_mask=exclude_mask)


def _config_of(model) -> dict:
    """The vocabulary size the exported model was built with (the rest does not matter for calibration)."""
    from onnx import numpy_helper

    for t in model.graph.initializer:
        if t.name == "embeddings.word_embeddings.weight":
            return {"vocab_size": int(numpy_helper.to_array(t).shape[0])}
    return {}
