"""test_train_lr.py: the learning rate neox-train uses at every iteration (read back from its JSONL
metrics) against an independent Python restatement of GPT-NeoX's AnnealingLR
(megatron/learning_rates.py), for each decay style, with fractional warmup, min_lr floors,
lr_decay_iters shorter than the run and gradient accumulation.

GPT-NeoX steps the scheduler after each optimizer step, so iteration i (1-based) trains with the
schedule's value at i - 1. neox.c's one documented difference: cosine stays at min_lr after the
decay iterations (GPT-NeoX's clamp holds it above min_lr)."""
import json
import math
import subprocess

import numpy as np
import pytest

from data_oracle import BIN, write_indexed


def annealing_lr(num_iters, start_lr, min_lr, warmup_iter, end_iter, style):
    """GPT-NeoX's AnnealingLR.get_lr at scheduler iteration num_iters."""
    if style == "cosine" and num_iters > end_iter:   # neox.c's deliberate difference (docs/training.md)
        return min_lr
    clamped = min(num_iters, end_iter - warmup_iter)
    if warmup_iter > 0 and num_iters <= warmup_iter:
        return float(start_lr) * clamped / warmup_iter
    t = clamped - warmup_iter
    if style == "linear":
        lr = start_lr * (end_iter - t) / end_iter
    elif style == "cosine":
        lr = start_lr / 2.0 * (math.cos(math.pi * t / end_iter) + 1)
    elif style == "exponential":
        lr = start_lr * math.exp(-0.693 * t / end_iter)
    else:
        lr = start_lr
    return max(lr, min_lr)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("lr") / "docs_text_document")
    rng = np.random.default_rng(3)
    write_indexed(prefix, [list(rng.integers(0, 250, size=int(rng.integers(20, 200)))) for _ in range(200)], np.uint16)
    return prefix


CASES = [  # style, lr, min_lr, warmup fraction, train_iters, lr_decay_iters (None: train_iters), accumulation
    ("constant", 0.01, 0.0, 0.1, 12, None, 1),
    ("linear", 0.02, 0.001, 0.15, 30, None, 2),
    ("linear", 0.02, 0.0, 0.0, 20, 10, 1),
    ("cosine", 0.006, 0.0006, 0.05, 40, None, 1),
    ("cosine", 0.006, 0.0006, 0.25, 30, 16, 1),   # past the decay: min_lr
    ("exponential", 0.01, 0.0005, 0.1, 30, None, 1),
    ("exponential", 0.01, 0.0, 0.33, 20, 9, 2),
]


@pytest.mark.parametrize("style,lr,min_lr,warmup,iters,decay,accum", CASES)
def test_lr_every_iteration(dataset, tmp_path, style, lr, min_lr, warmup, iters, decay, accum):
    config = {
        "num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 16,
        "max_position_embeddings": 16, "pos_emb": "rotary",
        "optimizer": {"type": "Adam", "params": {"lr": lr}}, "min_lr": min_lr, "warmup": warmup,
        "lr_decay_style": style, "train_iters": iters, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": accum, "eval_interval": 1000, "eval_iters": 1, "log_interval": 1,
        "data_path": dataset, "tokenizer_type": "CharLevelTokenizer", "log_dir": str(tmp_path / "logs"),
    }
    if decay is not None:
        config["lr_decay_iters"] = decay
    path = tmp_path / "config.yml"
    path.write_text(json.dumps(config))
    subprocess.run([f"{BIN}/neox-train", "-q", str(path)], check=True, capture_output=True)
    got = {}
    for line in open(tmp_path / "logs" / "metrics.jsonl"):
        record = json.loads(line)
        if "train/learning_rate" in record:
            got[record["iteration"]] = record["train/learning_rate"]
    assert sorted(got) == list(range(1, iters + 1))
    end = decay if decay is not None else iters
    for i in range(1, iters + 1):
        want = annealing_lr(i - 1, lr, min_lr, warmup * end, end, style)
        assert got[i] == pytest.approx(want, rel=1e-12, abs=1e-15), f"iteration {i}"
