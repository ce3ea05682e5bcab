"""test_wandb.py: use_wandb and its keys. neox.c writes no W&B files: rank 0's notice gives the command that
uploads the run's TensorBoard events with W&B's own client (checked by splitting it as a shell would, with
shlex), and the event file carries the run's W&B settings as a text summary at step 0 (read back with
TensorBoard's own reader). W&B keys without use_wandb are named as having no effect."""
import json
import shlex
import subprocess

import numpy as np
import pytest

from data_oracle import BIN, write_indexed

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("wandb") / "docs_text_document")
    rng = np.random.default_rng(3)
    write_indexed(prefix, [list(rng.integers(0, 250, size=int(rng.integers(20, 200)))) for _ in range(50)], np.uint16)
    return {
        "num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 16,
        "max_position_embeddings": 16, "pos_emb": "rotary", "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
        "train_iters": 1, "train_micro_batch_size_per_gpu": 1, "eval_interval": 1000, "eval_iters": 1,
        "do_valid": False, "do_test": False, "data_path": prefix, "tokenizer_type": "CharLevelTokenizer",
    }


def train(tmp_path, config):
    (tmp_path / "run.yml").write_text(json.dumps(config))
    r = subprocess.run([f"{BIN}/neox-train", str(tmp_path / "run.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr


def test_notice_gives_the_sync_command_and_events_carry_the_run(config, tmp_path):
    tb = tmp_path / "tb dir"
    stderr = train(tmp_path, dict(config, use_wandb=True, wandb_project="pythia", wandb_team="eleuther",
                                  wandb_group="ablation 'b'", wandb_run_name="pythia-14m-seed1",
                                  wandb_host="https://wandb.example.org", tensorboard_dir=str(tb)))
    assert "no effect" not in stderr
    line = [x for x in stderr.splitlines() if "notice: use_wandb:" in x]
    assert len(line) == 1, stderr
    argv = shlex.split(line[0].split("events with: ", 1)[1])
    env = [a for a in argv if "=" in a and not a.startswith("-") and a.split("=")[0].isupper()]
    assert env == ["WANDB_BASE_URL=https://wandb.example.org", "WANDB_RUN_GROUP=ablation 'b'",
                   "WANDB_NAME=pythia-14m-seed1"]
    assert argv[len(env):] == ["wandb", "sync", "--sync-tensorboard", "--project", "pythia", "--entity", "eleuther",
                               str(tb)]
    acc = EventAccumulator(str(tb))
    acc.Reload()
    events = acc.Tensors("wandb/run")
    assert len(events) == 1 and events[0].step == 0
    text = events[0].tensor_proto.string_val[0].decode()
    for row in ("| wandb_project | pythia |", "| wandb_team | eleuther |", "| wandb_group | ablation 'b' |",
                "| wandb_run_name | pythia-14m-seed1 |", "| wandb_host | https://wandb.example.org |"):
        assert row in text, text
    assert line[0].split("events with: ", 1)[1] in text
    assert acc.summary_metadata["wandb/run"].plugin_data.plugin_name == "text"


def test_without_tensorboard_dir_the_notice_asks_for_it(config, tmp_path):
    stderr = train(tmp_path, dict(config, use_wandb=True))
    assert "without tensorboard_dir this run writes no TensorBoard events" in stderr, stderr


def test_wandb_keys_without_use_wandb_have_no_effect(config, tmp_path):
    stderr = train(tmp_path, dict(config, wandb_group="g", wandb_run_name="n", tensorboard_dir=str(tmp_path / "tb")))
    for key in ("wandb_group", "wandb_run_name"):
        assert f"config key with no effect in this run: {key} (use_wandb is not true)" in stderr, stderr
    assert "wandb sync" not in stderr
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "wandb/run" not in acc.Tags()["tensors"]
