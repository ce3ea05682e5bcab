"""test_grad_stats.py: log_grad_norm, log_grad_pct_zeros, log_optimizer_states and log_gradient_noise_scale
checked against numpy restatements on the run's own gradients.

The gradients come from checkpoints saved after every step of an SGD run with momentum mu, no weight decay and
no clipping: torch's SGD (which neox.c's follows) keeps buf_1 = g_1 and buf_k = mu buf_{k-1} + g_k in float32, so
g_k = buf_k - fl32(mu buf_{k-1}) exactly where g_k is 0 and to float32 rounding elsewhere. The buffers are read
from the HDF5 shards with h5dump. Against them:
- gradient_norms/NAME: the Frobenius norm of g_k per tensor, at every step (TensorBoard) and in the JSONL record;
  their squares sum to train/grad_norm's square;
- pct_grad_zeros/NAME: 100 x the fraction of g_k's elements that are 0 (GPT-NeoX's (grad == 0).float().mean() * 100);
- optimizer_state_norms/NAME_momentum_buffer: the norm of buf_k;
- train/noise_scale: GPT-NeoX's GradientNoiseScale restated in numpy (its ema, n_updates and n_batches) on the
  flattened g_k, B_small = train_batch_size."""
import functools
import json
import shutil
import subprocess

import numpy as np
import pytest

from data_oracle import BIN, write_indexed

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

MU = 0.9
STEPS = 6
N_BATCHES = 2

pytestmark = pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump (hdf5-tools) is not installed")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradstats")
    prefix = str(tmp / "docs_text_document")
    rng = np.random.default_rng(7)
    write_indexed(prefix, [list(rng.integers(0, 250, size=int(rng.integers(20, 200)))) for _ in range(200)], np.uint16)
    config = {
        "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 16,
        "max_position_embeddings": 16, "pos_emb": "rotary", "no_weight_tying": True,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": MU}}, "weight_decay": 0.0,
        "gradient_clipping": 0.0, "train_iters": STEPS, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2, "eval_interval": 1000, "eval_iters": 1, "log_interval": 3,
        "data_path": prefix, "tokenizer_type": "CharLevelTokenizer", "log_dir": str(tmp / "logs"),
        "tensorboard_dir": str(tmp / "tb"), "save": str(tmp / "ckpt"), "checkpoint_factor": 1,
        "log_grad_norm": True, "log_grad_pct_zeros": True, "log_optimizer_states": True,
        "log_gradient_noise_scale": True, "gradient_noise_scale_n_batches": N_BATCHES,
    }
    (tmp / "run.yml").write_text(json.dumps(config))
    r = subprocess.run([f"{BIN}/neox-train", str(tmp / "run.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    acc = EventAccumulator(str(tmp / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    records = [json.loads(line) for line in open(tmp / "logs" / "metrics.jsonl")]
    return tmp, config, acc, records


def momentum_buffers(tmp, step):
    """name -> buf_step (float32) from the one-rank shard of global_step<step>."""
    shard = tmp / "ckpt" / f"global_step{step}" / "rank_00000.h5"
    names = subprocess.run(["h5ls", f"{shard}/optimizer/momentum_buffer"], capture_output=True, text=True,
                           check=True).stdout.split()
    names = [n for n in names if not n.startswith("Dataset") and not n.startswith("{")]
    out = {}
    for name in names:
        path = tmp / "buf.bin"
        subprocess.run(["h5dump", "-d", f"/optimizer/momentum_buffer/{name}", "-b", "LE", "-o", str(path), str(shard)],
                       check=True, capture_output=True)
        out[name] = np.fromfile(path, dtype="<f4")
    return out


@functools.lru_cache(maxsize=None)  # both tests read the same checkpoints: h5dump runs once per tensor and step
def gradients(tmp):
    """[(buf_k, g_k) for k = 1..STEPS], each a dict name -> array."""
    out, prev = [], None
    for k in range(1, STEPS + 1):
        buf = momentum_buffers(tmp, k)
        grad = {n: (b.astype(np.float64) if prev is None else
                    b.astype(np.float64) - (np.float32(MU) * prev[n]).astype(np.float64)) for n, b in buf.items()}
        out.append((buf, grad))
        prev = buf
    return out


def scalars(acc, tag):
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_gradient_norms_zeros_and_state_norms_equal_numpy(run):
    tmp, _, acc, records = run
    steps = gradients(tmp)
    assert len(steps[0][1]) == 28   # every tensor of the model
    last = [r for r in records if r["iteration"] == STEPS and "train/lm_loss" in r][0]
    for k, (buf, grad) in enumerate(steps, start=1):
        for name, g in grad.items():
            norm = scalars(acc, f"gradient_norms/{name}")[k]
            assert norm == pytest.approx(float(np.sqrt(np.sum(g * g))), rel=1e-5, abs=1e-9), (k, name)
            pct = scalars(acc, f"pct_grad_zeros/{name}")[k]
            assert pct == pytest.approx(100.0 * float(np.mean(g == 0)), abs=1e-4), (k, name)
            state = scalars(acc, f"optimizer_state_norms/{name}_momentum_buffer")[k]
            b = buf[name].astype(np.float64)
            assert state == pytest.approx(float(np.sqrt(np.sum(b * b))), rel=1e-6), (k, name)
            if k == STEPS:
                assert last[f"gradient_norms/{name}"] == pytest.approx(float(np.sqrt(np.sum(g * g))), rel=1e-5, abs=1e-9)
                assert last[f"pct_grad_zeros/{name}"] == pytest.approx(100.0 * float(np.mean(g == 0)), abs=1e-9)
                assert last[f"optimizer_state_norms/{name}_momentum_buffer"] == pytest.approx(
                    float(np.sqrt(np.sum(b * b))), rel=1e-6)
    # the per-parameter norms are of the gradients train/grad_norm measures: their squares sum to its square
    for k in range(1, STEPS + 1):
        total = sum(scalars(acc, f"gradient_norms/{name}")[k] ** 2 for name in steps[0][1])
        assert np.sqrt(total) == pytest.approx(scalars(acc, "train/grad_norm")[k], rel=1e-5), k
    # the unused rows of the input embedding have zero gradients, so the percentage is not trivially 0
    assert 0 < scalars(acc, "pct_grad_zeros/gpt_neox.embed_in.weight")[1] < 100


class GradientNoiseScale:
    """GPT-NeoX's megatron/gradient_noise_scale/gradient_noise_scale.py, restated in numpy on given gradients."""

    def __init__(self, batch_size_small, n_batches, beta=0.99):
        self.batch_size_small = batch_size_small
        self.batch_size_large = batch_size_small * n_batches
        self.n_batches, self.beta = n_batches, beta
        self.buffer = self.ema_scale = self.ema_noise = self.noise_scale = None
        self.n_updates = 0

    def ema(self, avg, yi, i):
        avg = (0 if avg is None else avg) * self.beta + (1 - self.beta) * yi
        return avg, avg / (1 - self.beta ** (i + 1))

    def update(self, grad):
        self.buffer = grad.copy() if self.buffer is None else self.buffer + grad
        if self.n_updates % self.n_batches == self.n_batches - 1:
            grads = self.buffer / self.n_batches
            self.buffer = None
            g_big, g_small = float(np.sum(grads * grads)), float(np.sum(grad * grad))
            noise = 1 / (self.batch_size_large - self.batch_size_small) * (
                self.batch_size_large * g_big - self.batch_size_small * g_small)
            scale = 1 / (1 / self.batch_size_small - 1 / self.batch_size_large) * (g_small - g_big)
            self.ema_noise, noise = self.ema(self.ema_noise, noise, self.n_updates)
            self.ema_scale, scale = self.ema(self.ema_scale, scale, self.n_updates)
            self.noise_scale = scale / noise
        self.n_updates += 1


def test_noise_scale_equals_gpt_neox_formula(run):
    tmp, config, acc, records = run
    batch = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
    gns = GradientNoiseScale(batch, N_BATCHES)
    logged = scalars(acc, "train/noise_scale")
    want = {}
    for k, (_, grad) in enumerate(gradients(tmp), start=1):
        gns.update(np.concatenate([grad[n] for n in sorted(grad)]))
        if gns.noise_scale is not None:
            want[k] = gns.noise_scale
    assert sorted(logged) == sorted(want) == list(range(N_BATCHES, STEPS + 1))  # from the first estimate on
    for k in want:
        assert logged[k] == pytest.approx(want[k], rel=1e-4), k
    last = [r for r in records if r["iteration"] == STEPS and "train/lm_loss" in r][0]
    assert last["train/noise_scale"] == pytest.approx(want[STEPS], rel=1e-4)


def test_nothing_logged_without_the_keys(run, tmp_path):
    _, config, _, _ = run
    plain = {k: v for k, v in config.items() if not k.startswith(("log_grad", "log_optimizer", "log_gradient"))}
    plain.update(log_dir=str(tmp_path / "logs"), tensorboard_dir=str(tmp_path / "tb"), train_iters=2)
    plain.pop("save")
    (tmp_path / "plain.yml").write_text(json.dumps(plain))
    subprocess.run([f"{BIN}/neox-train", "-q", str(tmp_path / "plain.yml")], check=True, capture_output=True)
    keys = {k for line in open(tmp_path / "logs" / "metrics.jsonl") for k in json.loads(line)}
    assert not any(k.startswith(("gradient_norms/", "pct_grad_zeros/", "optimizer_state_norms/", "train/noise_scale"))
                   for k in keys)
