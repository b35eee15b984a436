"""A synthetic sentence-classification task that a tiny BERT learns in seconds on a CPU (no download).

Each sentence is 4..``seq`` tokens followed by padding (id 0, attention mask 0). Token ids 1..vocab-1 fall
into three topics (``id % 3``); the label is the topic that occurs most often in the sentence (the
generator makes it a strict majority). Token types mark a random split into two segments, as BERT's
sentence pairs do; the label does not depend on them. Padding must be masked: a model that attended to
or pooled over the pads would see a different mixture for the same sentence. Deterministic per seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOPICS = 3
PAD = 0


@dataclass(frozen=True)
class TextSplit:
    """Feeds (``input_ids``, ``token_type_ids``, ``attention_mask``; int64 ``[n, seq]``) and labels."""

    feeds: dict[str, np.ndarray]
    labels: np.ndarray

    def batches(self, size: int):
        """The split in consecutive batches of ``size`` (the last one shorter), feeds and labels."""
        n = len(self.labels)
        for i in range(0, n, size):
            yield {k: v[i : i + size] for k, v in self.feeds.items()}, self.labels[i : i + size]


def make_split(n: int, seed: int, vocab: int = 64, seq: int = 16) -> TextSplit:
    """``n`` sentences with labels 0..2 (balanced in expectation)."""
    rng = np.random.default_rng(seed)
    by_topic = [np.arange(1, vocab)[np.arange(1, vocab) % TOPICS == t] for t in range(TOPICS)]
    ids = np.full((n, seq), PAD, np.int64)
    types = np.zeros((n, seq), np.int64)
    mask = np.zeros((n, seq), np.int64)
    labels = rng.integers(0, TOPICS, n)
    for i, label in enumerate(labels):
        length = int(rng.integers(4, seq + 1))
        counts = rng.multinomial(length, [1 / TOPICS] * TOPICS)
        top = int(np.argmax(counts))
        if np.sum(counts == counts[top]) > 1:  # a tie: move one token to the first of the tied topics
            other = int(np.flatnonzero(counts == counts[top])[1])
            counts[top], counts[other] = counts[top] + 1, counts[other] - 1
        counts[[top, label]] = counts[[label, top]]  # the majority topic is the label
        tokens = np.concatenate([rng.choice(by_topic[t], c) for t, c in enumerate(counts)])
        ids[i, :length] = rng.permutation(tokens)
        types[i, int(rng.integers(1, length)) : length] = 1
        mask[i, :length] = 1
    return TextSplit({"input_ids": ids, "token_type_ids": types, "attention_mask": mask}, labels)


def train_text_bert(
    epochs: int = 6, n_train: int = 2048, seed: int = 0, lr: float = 3e-3, batch: int = 64, **config
):
    """A tiny BERT (``models.bert``, 3 labels, vocabulary 64, 16 positions) trained on :func:`make_split`;
    returns the model in eval mode. Deterministic for a seed and thread count."""
    import torch

    from .bert import bert_tiny

    cfg = dict(vocab_size=64, max_position_embeddings=16, num_labels=TOPICS, **config)
    model = bert_tiny(seed=seed, **cfg).train()
    data = make_split(n_train, seed + 1000, cfg["vocab_size"], cfg["max_position_embeddings"])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    tensors = {k: torch.from_numpy(v) for k, v in data.feeds.items()}
    labels = torch.from_numpy(data.labels)
    for _ in range(epochs):
        order = torch.randperm(n_train, generator=gen)
        for i in range(0, n_train, batch):
            idx = order[i : i + batch]
            logits = model(
                tensors["input_ids"][idx], tensors["token_type_ids"][idx], tensors["attention_mask"][idx]
            )
            loss = torch.nn.functional.cross_entropy(logits, labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    """``python -m ivit_onnx.models.text_task OUT_DIR``: train, export FP32 and fake-quant ONNX, convert in
    strict mode, and print accuracy (FP32, fake-quant, integer) and integer vs fake-quant agreement; the test
    split is saved as ``text_test.npz`` (inputs and labels) for ``python -m ivit_onnx.validate --data``."""
    import argparse
    from pathlib import Path

    import numpy as np

    from ivit_onnx import rewrite
    from ivit_onnx.runners import make_runner

    from .bert import export_bert, fake_quant_bert
    from .runtime import ort_session

    p = argparse.ArgumentParser(prog="python -m ivit_onnx.models.text_task", description=main.__doc__)
    p.add_argument("out", type=Path, help="folder for text_{fp32,fq,int}.onnx and text_test.npz")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train", type=int, default=1024, help="training sentences")
    p.add_argument("--test", type=int, default=1000, help="held-out sentences")
    p.add_argument("--backend", default="library", help="integer backend: library, functions or reference")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = train_text_bert(epochs=args.epochs, n_train=args.train)
    paths = {k: args.out / f"text_{k}.onnx" for k in ("fp32", "fq", "int")}
    export_bert(model, paths["fp32"], seq=16)
    export_bert(
        fake_quant_bert(model, [make_split(64, 100 + i).feeds for i in range(4)]), paths["fq"], seq=16
    )
    int_model, report = rewrite(paths["fq"], paths["int"])
    print(report.summary())
    test = make_split(args.test, 7)
    np.savez(args.out / "text_test.npz", **test.feeds, labels=test.labels)  # for `ivit_onnx.validate --data`
    logits = {k: ort_session(paths[k]).run(None, test.feeds)[0] for k in ("fp32", "fq")}
    runner = make_runner(args.backend, int_model)
    logits["int"] = runner.run(test.feeds)[runner.output_names[0]]
    for k, v in logits.items():
        acc = 100 * np.mean(v.argmax(1) == test.labels)
        print(f"accuracy {k:5s} {acc:6.2f}%  ({len(test.labels)} sentences)")
    agree = 100 * np.mean(logits["int"].argmax(1) == logits["fq"].argmax(1))
    print(f"top-1 agreement int vs fake-quant {agree:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
