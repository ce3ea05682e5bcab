"""test_train_keys.py: GPT-NeoX keys of neox-train checked against independent restatements.

- log_param_norm: the parameter norms in metrics.jsonl, TensorBoard and the log line at the checkpoint's
  iteration equal numpy's norms of the checkpoint's weights (exported with neox-convert to-hf, read with
  safetensors), per tensor (GPT-NeoX's parameter_norms/NAME) and over all of them.
- peak_theoretical_tflops: MFU is the per-device FLOP/s over peak_theoretical_tflops x 1e12, so doubling
  the peak halves it; without the key the CPU run reports none.
- override_lr_scheduler / use_checkpoint_lr_scheduler: a resume with a changed lr or schedule fails
  naming the value without either key (GPT-NeoX's AnnealingLR asserts), trains on the config's schedule
  with override_lr_scheduler and on the checkpoint's with use_checkpoint_lr_scheduler, against GPT-NeoX's
  AnnealingLR formula (test_train_lr.annealing_lr).
- char_level_ppl: lm_loss_char_lvl_ppl of training's validation and of neox-eval's valid split is
  exp(lm_loss x tokens / characters) of the evaluated samples, rebuilt here from the sample-index caches
  (GPT2Dataset.__getitem__) and detokenized with HF tokenizers (GPT-NeoX's CharCounter)."""
import glob
import json
import math
import os
import re
import subprocess

import numpy as np
import pytest

from data_oracle import BIN, DATA, get_sample, read_indexed, write_indexed
from test_train_lr import annealing_lr
from tokenizer_corpus import hf_gpt2_from_files

safetensors_numpy = pytest.importorskip("safetensors.numpy")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("keys") / "docs_text_document")
    rng = np.random.default_rng(5)
    write_indexed(prefix, [list(rng.integers(0, 250, size=int(rng.integers(20, 200)))) for _ in range(200)], np.uint16)
    return prefix


def base_config(dataset, tmp_path, **extra):
    config = {
        "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 16,
        "max_position_embeddings": 16, "pos_emb": "rotary", "no_weight_tying": True,
        "optimizer": {"type": "Adam", "params": {"lr": 0.004}}, "min_lr": 0.0004, "warmup": 0.1,
        "lr_decay_style": "cosine", "train_iters": 12, "train_micro_batch_size_per_gpu": 2,
        "eval_interval": 1000, "eval_iters": 1, "log_interval": 1,
        "data_path": dataset, "tokenizer_type": "CharLevelTokenizer", "log_dir": str(tmp_path / "logs"),
    }
    config.update(extra)
    return config


def train(tmp_path, name, config, expect=0):
    path = tmp_path / f"{name}.yml"
    path.write_text(json.dumps(config))
    r = subprocess.run([f"{BIN}/neox-train", str(path)], capture_output=True, text=True)
    assert r.returncode == expect, r.stderr[-2000:]
    return r


def records(path):
    return [json.loads(line) for line in open(path)]


def test_param_norms_equal_numpy_on_the_checkpoint(dataset, tmp_path):
    config = base_config(dataset, tmp_path, log_param_norm=True, log_interval=4, save=str(tmp_path / "ckpt"),
                         checkpoint_factor=12, tensorboard_dir=str(tmp_path / "tb"))
    out = train(tmp_path, "norm", config)
    subprocess.run([f"{BIN}/neox-convert", "to-hf", "--input", str(tmp_path / "ckpt"), "--output", str(tmp_path / "hf")],
                   check=True, capture_output=True)
    weights = safetensors_numpy.load_file(str(tmp_path / "hf" / "model.safetensors"))
    want = {name: float(np.sqrt(np.sum(w.astype(np.float64) ** 2))) for name, w in weights.items()}
    total = float(np.sqrt(sum(v * v for v in want.values())))
    last = [r for r in records(tmp_path / "logs" / "metrics.jsonl") if r["iteration"] == 12 and "train/param_norm" in r]
    assert len(last) == 1
    got = {k[len("parameter_norms/"):]: v for k, v in last[0].items() if k.startswith("parameter_norms/")}
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-6), name
    assert last[0]["train/param_norm"] == pytest.approx(total, rel=1e-6)
    lines = re.findall(r"iteration +12/ +12 .* param norm: ([0-9.]+) \|", out.stdout)
    assert lines and float(lines[0]) == pytest.approx(total, abs=1e-3)
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    for name in want:   # every step, as GPT-NeoX logs them
        events = acc.Scalars(f"parameter_norms/{name}")
        assert [e.step for e in events] == list(range(1, 13))
        assert events[-1].value == pytest.approx(want[name], rel=1e-6)
    assert acc.Scalars("train/param_norm")[-1].value == pytest.approx(total, rel=1e-6)


def test_no_param_norms_by_default(dataset, tmp_path):
    out = train(tmp_path, "plain", base_config(dataset, tmp_path))
    assert "param norm" not in out.stdout
    assert not any(k.startswith(("parameter_norms/", "train/param_norm"))
                   for r in records(tmp_path / "logs" / "metrics.jsonl") for k in r)


def mfu_records(tmp_path, dataset, name, peak):
    extra = {"peak_theoretical_tflops": peak} if peak is not None else {}
    config = base_config(dataset, tmp_path / name, **extra)
    (tmp_path / name).mkdir()
    out = train(tmp_path, name, config)
    return out.stdout, [r for r in records(tmp_path / name / "logs" / "metrics.jsonl") if "runtime/iteration_time" in r]


def test_peak_theoretical_tflops_is_the_mfu_denominator(dataset, tmp_path):
    for peak in (0.001, 0.002):
        stdout, recs = mfu_records(tmp_path, dataset, f"peak{peak}", peak)
        assert len(recs) == 12
        for r in recs:
            assert r["runtime/mfu"] == pytest.approx(r["runtime/flops_per_sec_per_gpu"] / (peak * 1e12), rel=1e-12)
        shown = [float(x) for x in re.findall(r" MFU: ([0-9.]+)% \|", stdout)]
        assert len(shown) == 12
        assert shown[-1] == pytest.approx(100 * recs[-1]["runtime/mfu"], abs=0.006)
    stdout, recs = mfu_records(tmp_path, dataset, "nopeak", None)
    assert "MFU" not in stdout and not any("runtime/mfu" in r for r in recs)


def learning_rates(path):
    return {r["iteration"]: r["train/learning_rate"] for r in records(path) if "train/learning_rate" in r}


@pytest.fixture(scope="module")
def checkpoint(dataset, tmp_path_factory):
    """6 of 12 iterations of lr 0.004 cosine (warmup 0.1), saved at 6."""
    d = tmp_path_factory.mktemp("lrckpt")
    config = base_config(dataset, d, save=str(d / "ckpt"), checkpoint_factor=6, exit_interval=6)
    train(d, "first", config)
    return d / "ckpt"


def resume(dataset, tmp_path, checkpoint, expect=0, **extra):
    config = base_config(dataset, tmp_path, load=str(checkpoint), **extra)
    return train(tmp_path, "resume", config, expect)


def test_changed_schedule_without_a_key_is_refused(dataset, tmp_path, checkpoint):
    r = resume(dataset, tmp_path, checkpoint, 2, optimizer={"type": "Adam", "params": {"lr": 0.001}})
    assert re.search(r"lr: the checkpoint's LR schedule has 0.004.*, the config 0.001.*override_lr_scheduler", r.stderr)
    r = resume(dataset, tmp_path, checkpoint, 2, lr_decay_style="linear")
    assert "lr_decay_style: the checkpoint's LR schedule is cosine, the config's linear" in r.stderr
    r = resume(dataset, tmp_path, checkpoint, 2, train_iters=20)
    assert "lr_decay_iters: the checkpoint's LR schedule decays over 12 iterations, the config's over 20" in r.stderr


@pytest.mark.parametrize("style,lr,iters", [("cosine", 0.001, 12), ("linear", 0.004, 12), ("exponential", 0.002, 18)])
def test_override_lr_scheduler_takes_the_configs_schedule(dataset, tmp_path, checkpoint, style, lr, iters):
    r = resume(dataset, tmp_path, checkpoint, override_lr_scheduler=True, lr_decay_style=style, train_iters=iters,
               optimizer={"type": "Adam", "params": {"lr": lr}})
    assert "override_lr_scheduler: the config's LR schedule replaces the checkpoint's" in r.stderr
    got = learning_rates(tmp_path / "logs" / "metrics.jsonl")
    assert sorted(got) == list(range(7, iters + 1))
    for i in got:   # the schedule's iteration continues from the checkpoint's
        assert got[i] == pytest.approx(annealing_lr(i - 1, lr, 0.0004, 0.1 * iters, iters, style), rel=1e-12)


def test_use_checkpoint_lr_scheduler_keeps_the_checkpoints(dataset, tmp_path, checkpoint):
    resume(dataset, tmp_path, checkpoint, use_checkpoint_lr_scheduler=True, lr_decay_style="linear",
           optimizer={"type": "Adam", "params": {"lr": 0.001}}, min_lr=0.0)
    got = learning_rates(tmp_path / "logs" / "metrics.jsonl")
    assert sorted(got) == list(range(7, 13))
    for i in got:
        assert got[i] == pytest.approx(annealing_lr(i - 1, 0.004, 0.0004, 1.2, 12, "cosine"), rel=1e-12)


def test_both_schedule_keys_are_refused(dataset, tmp_path, checkpoint):
    r = resume(dataset, tmp_path, checkpoint, 2, use_checkpoint_lr_scheduler=True, override_lr_scheduler=True)
    assert "override_lr_scheduler and use_checkpoint_lr_scheduler are both true" in r.stderr


# ---- char_level_ppl ---------------------------------------------------------------------------

GPT2 = f"{DATA}/tokenizers/gpt2"


@pytest.fixture(scope="module")
def gpt2_dataset(tmp_path_factory):
    """Tiny Shakespeare paragraphs as GPT-2 ids (HF tokenizers), EOD after each."""
    pytest.importorskip("tokenizers")
    text_path = f"{DATA}/text/tinyshakespeare_input.txt"
    if not os.path.exists(text_path) or not os.path.exists(f"{GPT2}/vocab.json"):
        pytest.skip("no Tiny Shakespeare or GPT-2 tokenizer in ../shared/data")
    tok = hf_gpt2_from_files()
    paragraphs = [p + "\n\n" for p in open(text_path, encoding="utf-8").read().split("\n\n")[:600] if p.strip()]
    docs = [tok.encode(p).ids + [50256] for p in paragraphs]
    prefix = str(tmp_path_factory.mktemp("gpt2") / "shakespeare_text_document")
    write_indexed(prefix, docs, np.uint16)
    return prefix, tok


def gpt2_config(prefix, tmp_path, **extra):
    config = base_config(prefix, tmp_path, tokenizer_type="GPT2BPETokenizer", vocab_file=f"{GPT2}/vocab.json",
                         merge_file=f"{GPT2}/merges.txt", seq_length=32, max_position_embeddings=32, train_iters=6,
                         eval_interval=6, eval_iters=3, split="90,10,0", char_level_ppl=True)
    config.update(extra)
    return config


def first_valid_samples(prefix, count):
    """The valid split's first samples in order, from the sample-index caches (GPT2Dataset.__getitem__)."""
    sizes, pointers, _, tokens = read_indexed(prefix)
    stem = glob.glob(f"{prefix}_valid_indexmap_*_doc_idx.npy")
    assert len(stem) == 1, stem
    stem = stem[0][: -len("_doc_idx.npy")]
    index = tuple(np.load(f"{stem}_{n}.npy") for n in ("doc_idx", "sample_idx", "shuffle_idx"))
    return [get_sample(tokens, pointers, tokens.itemsize, sizes, index, i, 32) for i in range(count)]


def tokens_per_char(tok, samples):
    """megatron/utils.py CharCounter: len(sample) / len(tokenizer.detokenize(sample)), summed."""
    tokens = sum(len(s) for s in samples)
    chars = sum(len(tok.decode([int(x) for x in s], skip_special_tokens=False)) for s in samples)
    return tokens / chars


def test_char_level_ppl_in_training_and_neox_eval(gpt2_dataset, tmp_path):
    prefix, tok = gpt2_dataset
    config = gpt2_config(prefix, tmp_path, save=str(tmp_path / "ckpt"), checkpoint_factor=6)
    out = train(tmp_path, "char", config)
    ratio = tokens_per_char(tok, first_valid_samples(prefix, 3 * 2))   # eval_iters x micro-batch
    assert 1 / 6 < ratio < 1 / 2   # a GPT-2 token of English text is about 4 characters
    first = [r for r in records(tmp_path / "logs" / "metrics.jsonl") if "validation/lm_loss" in r][0]
    assert first["iteration"] == 6
    want = math.exp(first["validation/lm_loss"] * ratio)
    assert first["validation/lm_loss_char_lvl_ppl"] == pytest.approx(want, rel=1e-12)
    assert re.search(r"validation results at iteration 6 \| lm_loss value: \S+ \| lm_loss_ppl value: \S+ \| "
                     r"lm_loss_char_lvl_ppl value: ", out.stdout)
    # neox-eval's valid perplexity reads the same first samples.
    config["load"] = str(tmp_path / "ckpt")
    (tmp_path / "eval.yml").write_text(json.dumps(config))
    subprocess.run([f"{BIN}/neox-eval", "-q", str(tmp_path / "eval.yml"), "--tasks", "valid", "--results-prefix",
                    str(tmp_path / "res"), "--bootstrap-iters", "0"], check=True, capture_output=True)
    result = json.load(open(glob.glob(f"{tmp_path}/res_eval_results_*.json")[0]))["results"]["validation"]
    assert result["lm_loss_char_lvl_ppl,none"] == pytest.approx(math.exp(result["lm_loss,none"] * ratio), rel=1e-12)


def test_no_char_level_ppl_by_default(gpt2_dataset, tmp_path):
    prefix, _ = gpt2_dataset
    train(tmp_path, "plain", gpt2_config(prefix, tmp_path, char_level_ppl=False))
    assert not any("char_lvl" in k for r in records(tmp_path / "logs" / "metrics.jsonl") for k in r)
