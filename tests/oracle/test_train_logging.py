"""test_train_logging.py: what a real neox-train run reports, read back independently: TensorBoard
event files with the `tensorboard` package (GPT-NeoX's tag names, one train/lm_loss per iteration),
the JSONL metrics with Python's json, GPT-NeoX's log line on stdout, and the loss of the first step,
which for a fresh model must be close to log(vocabulary) (uniform predictions)."""
import json
import math
import re
import subprocess

import numpy as np
import pytest

from data_oracle import BIN, write_indexed

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

ITERS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_log")
    prefix = str(root / "docs_text_document")
    rng = np.random.default_rng(11)
    write_indexed(prefix, [list(rng.integers(0, 250, size=int(rng.integers(20, 120)))) for _ in range(100)], np.uint16)
    config = {
        "num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 16,
        "max_position_embeddings": 16, "pos_emb": "rotary", "init_method_std": 0.002,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "lr_decay_style": "constant",
        "train_iters": ITERS, "train_micro_batch_size_per_gpu": 2, "eval_interval": 4, "eval_iters": 1,
        "log_interval": 1, "wall_clock_breakdown": True, "data_path": prefix, "split": "80,10,10",
        "tokenizer_type": "CharLevelTokenizer", "log_dir": str(root / "logs"), "tensorboard_dir": str(root / "tb"),
    }
    (root / "config.yml").write_text(json.dumps(config))
    out = subprocess.run([f"{BIN}/neox-train", "-q", str(root / "config.yml")], check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in open(root / "logs" / "metrics.jsonl")]
    return {"root": root, "stdout": out.stdout, "records": records}


def test_tensorboard_scalars_match_jsonl(run):
    acc = EventAccumulator(str(run["root"] / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/lm_loss", "train/learning_rate", "validation/lm_loss", "validation/lm_loss_ppl",
                "test/lm_loss", "runtime/iteration_time"):
        assert tag in tags, tag
    tb_loss = {e.step: e.value for e in acc.Scalars("train/lm_loss")}
    assert sorted(tb_loss) == list(range(1, ITERS + 1))
    jsonl = {r["iteration"]: r["train/lm_loss"] for r in run["records"] if "train/lm_loss" in r}
    for i in range(1, ITERS + 1):
        assert tb_loss[i] == pytest.approx(jsonl[i], rel=1e-6)   # TensorBoard stores float32


def test_log_line_and_timers(run):
    lines = [l for l in run["stdout"].splitlines() if l.startswith(" samples/sec:")]
    assert len(lines) == ITERS
    assert re.search(r"iteration +8/ +8 \| elapsed time per iteration \(ms\): [0-9.]+ \| learning rate: 1\.000E-03", lines[-1])
    assert re.search(r"^time \(ms\) \| forward: [0-9.]+ \| backward: [0-9.]+", run["stdout"], re.M)
    assert "validation results at iteration 4" in run["stdout"]
    assert "test results at the end of training for test data" in run["stdout"]


def test_first_loss_is_uniform(run):
    first = next(r for r in run["records"] if r.get("iteration") == 1 and "train/lm_loss" in r)
    assert first["train/lm_loss"] == pytest.approx(math.log(512), abs=0.05)   # CharLevelTokenizer: 512 padded ids
