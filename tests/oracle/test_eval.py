"""test_eval.py: neox-eval against lm-evaluation-harness 0.4's definitions applied with transformers
(eval_oracle.py) on a tiny GPT-2-tokenized model trained here and exported with `neox-convert to-hf`:
lambada_openai, piqa, wikitext and the generic formats (accuracies exactly, perplexities within 1e-5
relative), the test-split loss equal to the one training logged, and greedy generation token for token
equal to transformers' greedy generate (with the KV cache and with recomputation); under precision:
bfloat16, generation's logits within 1% of the row's largest fp32 logit."""
import glob
import json
import os
import random
import subprocess

import numpy as np

import pytest

from data_oracle import BIN, DATA, ROOT

EVAL = os.path.join(DATA, "eval")
GPT2 = os.path.join(DATA, "tokenizers", "gpt2")
LIMIT = 24
REL = 1e-5

pytestmark = pytest.mark.skipif(not os.path.isdir(EVAL) or not os.path.isdir(GPT2),
                                reason=f"no shared eval data in {EVAL}")


def run(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, cwd=ROOT, **kw)


_trained_dirs = []  # the one trained model of the session (see trained)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """Trains a tiny model (20 iterations) and exports it to Hugging Face format, once a session:
    test_serve.py imports this fixture, which makes pytest hold a second definition of it there, and
    both return the same folder (the tests only add files of their own names to it)."""
    if not _trained_dirs:
        _trained_dirs.append(train_tiny_model(tmp_path_factory.mktemp("eval")))
    return _trained_dirs[0]


def train_tiny_model(d):
    run("python3", "tests/tools/train_lib.py", "paragraphs", f"{DATA}/text/tinyshakespeare_input.txt", f"{d}/text.jsonl")
    run(f"{BIN}/neox-preprocess", "--input", f"{d}/text.jsonl", "--output-prefix", f"{d}/gpt2", "--append-eod",
        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", f"{GPT2}/vocab.json", "--merge-file", f"{GPT2}/merges.txt")
    with open("configs/tiny-shakespeare.yml") as f:
        base = f.read()
    for key, value in [('"train_iters": 200', '"train_iters": 20'), ('"eval_interval": 100', '"eval_interval": 20'),
                       ('"eval_iters": 4', '"eval_iters": 2')]:
        base = base.replace(key, value)
    base = "\n".join(l for l in base.splitlines() if not any(k in l for k in ('"data_path"', '"vocab_file"', '"merge_file"')))
    (d / "model.yml").write_text(base)
    (d / "local.yml").write_text(json.dumps({
        "data_path": f"{d}/gpt2_text_document", "vocab_file": f"{GPT2}/vocab.json", "merge_file": f"{GPT2}/merges.txt",
        "save": f"{d}/ckpt", "load": f"{d}/ckpt", "log_dir": f"{d}/log", "checkpoint_factor": 20}))
    run(f"{BIN}/neox-train", "-q", f"{d}/model.yml", f"{d}/local.yml")
    run(f"{BIN}/neox-convert", "to-hf", "--input", f"{d}/ckpt", "--output", f"{d}/hf")
    return d


@pytest.fixture(scope="module")
def lm(trained):
    from eval_oracle import HarnessLM
    return HarnessLM(str(trained / "hf"), max_length=64)


_results = {}  # (model folder, tasks, extra options) -> results: a run that two tests read is made once


def neox_eval(d, tasks, extra=()):
    key = (str(d), tasks, tuple(extra))
    if key in _results:
        return _results[key]
    prefix = d / ("r_" + tasks.replace(":", "_").replace("/", "_").replace(",", "_"))[:40]
    run(f"{BIN}/neox-eval", "-q", f"{d}/model.yml", f"{d}/local.yml", "--tasks", tasks, "--data-dir", EVAL,
        "--limit", str(LIMIT), "--results-prefix", str(prefix), *extra)
    files = sorted(glob.glob(f"{prefix}_eval_results_*.json"))
    assert files, "no eval_results file written"
    _results[key] = json.load(open(files[-1]))["results"]
    return _results[key]


def close(a, b, rel=REL):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def test_lambada(trained, lm):
    from eval_oracle import lambada
    got = neox_eval(trained, "lambada_openai")["lambada_openai"]
    want = lambada(lm, EVAL, LIMIT)
    assert got["acc,none"] == want["acc"]
    assert close(got["perplexity,none"], want["perplexity"]), (got, want)
    # The same resamples of loglikelihoods that agree to ~1e-6: the standard errors agree as closely
    # (an independent random stream would differ by the bootstrap's own noise, ~0.2% at 100000).
    assert close(got["perplexity_stderr,none"], want["perplexity_stderr"], 1e-4), (got, want)
    assert close(got["acc_stderr,none"], want["acc_stderr"], 1e-9) or want["acc"] == 0


def test_bootstrap_is_the_harness_draw_for_draw():
    """lib/eval/bootstrap.c against the harness's definition on CPython's random module, on the same
    loglikelihoods: equal to the last bits, whatever the chunking and the share of chunks per rank."""
    from eval_oracle import bootstrap_perplexity_stderr
    driver = os.path.join(ROOT, "build/cpu/tests/drivers/bootstrap_driver")
    rng = np.random.default_rng(7)
    for n, iters, parts in [(2, 1000, 1), (7, 999, 1), (24, 100000, 3), (150, 2500, 2), (5, 2, 1), (33, 3000, 5)]:
        lls = [float(x) for x in -rng.gamma(2.0, 1.5, size=n)]
        out = run(driver, "stderr", str(iters), str(parts), input="".join(f"{x!r}\n" for x in lls)).stdout
        got, want = float(out), bootstrap_perplexity_stderr(lls, iters)
        assert close(got, want, 1e-13), (n, iters, parts, got, want)
    for seed, k in [(0, 0), (1, 623), (99, 624), (2**32 + 5, 1000)]:
        r = random.Random(seed)
        for _ in range(k):
            r.random()
        assert float(run(driver, "random", str(seed), str(k)).stdout) == r.random(), (seed, k)


def test_piqa(trained, lm):
    from eval_oracle import piqa
    got = neox_eval(trained, "piqa")["piqa"]
    want = piqa(lm, EVAL, LIMIT)
    assert got["acc,none"] == want["acc"] and got["acc_norm,none"] == want["acc_norm"], (got, want)
    assert close(got["acc_stderr,none"], want["acc_stderr"], 1e-9)
    assert close(got["acc_norm_stderr,none"], want["acc_norm_stderr"], 1e-9)


def test_wikitext(trained, lm):
    from eval_oracle import wikitext
    got = neox_eval(trained, "wikitext", ["--limit", "2"])["wikitext"]
    want = wikitext(lm, EVAL, 2)
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert close(got[f"{metric},none"], want[metric]), (metric, got, want)
        assert got[f"{metric}_stderr,none"] == "N/A"


def test_prefix_token_is_the_declared_bos(trained, tmp_path):
    """A tokenizer folder whose tokenizer_config.json declares a bos of its own: rolling windows start
    from it, as the harness's HFLM.prefix_token_id (transformers' bos_token_id) says."""
    import shutil
    from transformers import AutoTokenizer
    from eval_oracle import HarnessLM, wikitext
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(f"{GPT2}/{f}", folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2TokenizerFast", "bos_token": "!", "eos_token": "<|endoftext|>"}))
    bos = AutoTokenizer.from_pretrained(str(folder)).bos_token_id
    assert bos == 0
    local = json.loads((trained / "local.yml").read_text())
    local.update(vocab_file=f"{folder}/vocab.json", merge_file=f"{folder}/merges.txt")
    (tmp_path / "local_bos.yml").write_text(json.dumps(local))
    run(f"{BIN}/neox-eval", "-q", f"{trained}/model.yml", f"{tmp_path}/local_bos.yml", "--tasks", "wikitext",
        "--data-dir", EVAL, "--limit", "2", "--results-prefix", f"{tmp_path}/bos")
    got = json.load(open(sorted(glob.glob(f"{tmp_path}/bos_eval_results_*.json"))[-1]))["results"]["wikitext"]
    want = wikitext(HarnessLM(str(trained / "hf"), max_length=64, prefix=bos), EVAL, 2)
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert close(got[f"{metric},none"], want[metric]), (metric, got, want)
    with_eod = neox_eval(trained, "wikitext", ["--limit", "2"])["wikitext"]
    assert not close(got["word_perplexity,none"], with_eod["word_perplexity,none"], 1e-9)


def test_generic_formats(trained, lm, tmp_path):
    from eval_oracle import multiple_choice, rolling_metrics
    mc = [{"context": "ROMEO: I love", "choices": [" thee", " the sword", " my lord"], "label": 0},
          {"context": "First Citizen:\n", "choices": ["Before we proceed", "Zebra quantum"], "label": 1},
          {"context": "", "choices": ["KING HENRY", "Hello"], "label": 0}]
    ll = [{"context": "To be, or not to be:", "continuation": " that is the question"},
          {"context": "My lord, ", "continuation": "I will."}]
    roll = [{"text": "O Romeo, Romeo! wherefore art thou Romeo?\n" * 6}, {"text": "Good night."}]
    for name, rows in (("mc", mc), ("ll", ll), ("roll", roll)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = neox_eval(trained, f"mc:{tmp_path}/mc.jsonl,loglikelihood:{tmp_path}/ll.jsonl,rolling:{tmp_path}/roll.jsonl")
    want = multiple_choice(lm, [(r["context"], r["choices"], r["choices"], r["label"]) for r in mc])
    g = got[f"mc:{tmp_path}/mc.jsonl"]
    assert g["acc,none"] == want["acc"] and g["acc_norm,none"] == want["acc_norm"]
    res = lm.loglikelihood([(r["context"], r["continuation"]) for r in ll])
    import math
    g = got[f"loglikelihood:{tmp_path}/ll.jsonl"]
    assert close(g["perplexity,none"], math.exp(-sum(x for x, _ in res) / len(res)))
    assert g["acc,none"] == sum(float(y) for _, y in res) / len(res)
    want = rolling_metrics(lm, [r["text"] for r in roll], [r["text"] for r in roll])
    g = got[f"rolling:{tmp_path}/roll.jsonl"]
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert close(g[f"{metric},none"], want[metric]), (metric, g, want)


def test_test_split_loss_equals_training(trained):
    got = neox_eval(trained, "test")["test"]
    logged = [json.loads(l) for l in open(trained / "log" / "metrics.jsonl")]
    want = [r["test/lm_loss"] for r in logged if "test/lm_loss" in r][-1]
    assert close(got["lm_loss,none"], want, 1e-6), (got, want)


PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak.", "The king"]


@pytest.mark.parametrize("recompute", [False, True])
def test_greedy_generation_matches_transformers(trained, lm, tmp_path, recompute):
    (tmp_path / "prompts.txt").write_text("\n\n".join(PROMPTS) + "\n\n")
    out = tmp_path / "samples.jsonl"
    run(f"{BIN}/neox-eval", "generate", "-q", f"{trained}/model.yml", f"{trained}/local.yml", "--text-gen-type",
        "input-file", "--sample-input-file", str(tmp_path / "prompts.txt"), "--prompt-end", "\n\n",
        "--sample-output-file", str(out), "--maximum-tokens", "24", *(["--recompute"] if recompute else []))
    records = [json.loads(l) for l in open(out)]
    assert [r["context"] for r in records] == PROMPTS
    for r in records:
        ids = lm.encode(r["context"])
        gen = lm.greedy(ids, 24)
        finished = lm.eot in gen
        if finished:
            gen = gen[:gen.index(lm.eot)]
        assert r["finished"] == finished
        assert r["length"] == len(gen)
        assert r["text"] == lm.tok.decode(gen), (r, gen)
        assert set(r) >= {"context", "text", "length", "finished", "duration_seconds"}


def test_return_logits_are_the_models_logits(trained, lm, tmp_path):
    """return_logits: each record's "logits" holds, per generated token (the stop token included), the
    padded vocabulary's logits it was chosen from: transformers' logits of the prompt and the tokens
    generated before it, within 1e-4; sampled tokens too (before temperature and filtering)."""
    import torch
    (tmp_path / "prompts.txt").write_text("\n\n".join(PROMPTS) + "\n\n")
    (tmp_path / "logits.yml").write_text(json.dumps({"return_logits": True}))
    for sampling in ([], ["--temperature", "0.8", "--top-k", "5"]):
        out = tmp_path / "samples.jsonl"
        out.unlink(missing_ok=True)
        run(f"{BIN}/neox-eval", "generate", "-q", f"{trained}/model.yml", f"{trained}/local.yml", str(tmp_path / "logits.yml"),
            "--text-gen-type", "input-file", "--sample-input-file", str(tmp_path / "prompts.txt"), "--prompt-end", "\n\n",
            "--sample-output-file", str(out), "--maximum-tokens", "12", *sampling)
        for r in [json.loads(l) for l in open(out)]:
            rows = np.array(r["logits"], dtype=np.float64)
            ids = lm.encode(r["context"])
            generated = rows.shape[0]
            assert generated == r["length"] + (1 if r["finished"] else 0)
            with torch.no_grad():
                want = lm.model(torch.tensor([ids])).logits[0].double().numpy()
            assert rows.shape[1] == want.shape[1]   # the padded vocabulary
            np.testing.assert_allclose(rows[0], want[-1], atol=1e-4, rtol=1e-4)
            if not sampling:   # greedy: the chosen token is each row's argmax
                chosen = [int(np.argmax(row[:len(lm.tok)])) for row in rows]
                assert lm.tok.decode(chosen[: r["length"]]) == r["text"]
                with torch.no_grad():
                    full = lm.model(torch.tensor([ids + chosen[:-1]])).logits[0].double().numpy()
                np.testing.assert_allclose(rows, full[len(ids) - 1:], atol=1e-4, rtol=1e-4)
    (tmp_path / "plain.jsonl").unlink(missing_ok=True)
    run(f"{BIN}/neox-eval", "generate", "-q", f"{trained}/model.yml", f"{trained}/local.yml", "--text-gen-type",
        "input-file", "--sample-input-file", str(tmp_path / "prompts.txt"), "--prompt-end", "\n\n",
        "--sample-output-file", str(tmp_path / "plain.jsonl"), "--maximum-tokens", "4")
    assert all("logits" not in json.loads(l) for l in open(tmp_path / "plain.jsonl"))


# bfloat16 generation's logits against the fp32 model's (docs/eval.md, "Precision"): each logit
# within this fraction of the row's largest magnitude.
BF16_LOGIT_TOL = 0.01


def test_bfloat16_generation_logits_near_fp32(trained, lm, tmp_path):
    """precision: bfloat16 generates through the weights' bfloat16 copy: each row of logits (greedy,
    return_logits) within BF16_LOGIT_TOL of the row's largest magnitude of transformers' fp32 logits
    of the same prompt and the tokens generated before it, and not equal to the fp32 run's logits
    (the products did run in bfloat16)."""
    import torch
    (tmp_path / "prompts.txt").write_text("\n\n".join(PROMPTS) + "\n\n")
    (tmp_path / "bf16.yml").write_text(json.dumps({"return_logits": True, "precision": "bfloat16"}))
    out = tmp_path / "samples.jsonl"
    run(f"{BIN}/neox-eval", "generate", "-q", f"{trained}/model.yml", f"{trained}/local.yml", str(tmp_path / "bf16.yml"),
        "--text-gen-type", "input-file", "--sample-input-file", str(tmp_path / "prompts.txt"), "--prompt-end", "\n\n",
        "--sample-output-file", str(out), "--maximum-tokens", "12")
    worst = 0.0
    for r in [json.loads(l) for l in open(out)]:
        rows = np.array(r["logits"], dtype=np.float64)
        ids = lm.encode(r["context"])
        chosen = [int(np.argmax(row[:len(lm.tok)])) for row in rows]
        with torch.no_grad():
            full = lm.model(torch.tensor([ids + chosen[:-1]])).logits[0].double().numpy()
        want = full[len(ids) - 1:]
        assert rows.shape == want.shape
        err = np.abs(rows - want).max(axis=1) / np.abs(want).max(axis=1)
        worst = max(worst, float(err.max()))
        assert np.all(err <= BF16_LOGIT_TOL), err
        assert np.abs(rows - want).max() > 0.0
    print(f"bfloat16 logits: worst error {worst:.4g} of the row's largest logit")
