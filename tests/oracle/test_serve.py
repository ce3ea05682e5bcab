"""test_serve.py: neox-eval serve against the real lm-evaluation-harness and against neox-eval itself,
on the tiny GPT-2-tokenized model test_eval.py trains. The harness (`local-completions`, local task
files from scripts/lm_eval_tasks.py) scores lambada_openai, piqa and wikitext through the server with
the same acc and acc_norm as `neox-eval --tasks` and perplexities within 1e-6 relative; greedy
generation through the server equals `neox-eval generate`; a sampled completion with a seed is the
same twice; SIGTERM in the middle of requests answers them all and exits 0."""
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from data_oracle import BIN, ROOT
from test_eval import EVAL, neox_eval, run, trained  # noqa: F401  (trained: the module's model fixture)

LIMIT = 4  # documents (pages for wikitext) per task: enough to compare every metric, and quick
# neox-eval scores windows of seq_length tokens, as the harness's HFLM; its API models keep one
# position for the token they ask to generate and one for the first token, which has no
# log-probability: with max_length = seq_length + 2 they score the same windows.
SEQ = 128
CONTEXT = SEQ + 2
REL = 1e-6


def harness_available():
    try:
        import importlib.util
        return importlib.util.find_spec("lm_eval") is not None
    except ImportError:
        return False


def longer_context(d):
    """eval_model.yml: the trained model's config with a SEQ-token context (rotary: no table to grow),
    so that no request of the tasks is truncated (the harness's API models refuse a continuation
    longer than their window)."""
    text = (d / "model.yml").read_text()
    for key in ("seq_length", "max_position_embeddings"):
        text = text.replace(f'"{key}": 64', f'"{key}": {SEQ}')
    (d / "eval_model.yml").write_text(text)


class Server:
    def __init__(self, d, *extra):
        self.proc = subprocess.Popen([f"{BIN}/neox-eval", "serve", "-q", f"{d}/eval_model.yml", f"{d}/local.yml",
                                      "--port", "0", *extra],
                                     cwd=ROOT, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        assert "listening on port" in line, line
        self.url = f"http://127.0.0.1:{int(line.split()[-1])}"

    def post(self, body, path="/v1/completions"):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except (urllib.error.URLError, ConnectionError) as e:  # not accepted (after SIGTERM)
            return 0, str(e)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rest = self.proc.stderr.read()
        return self.proc.wait(timeout=60), rest


@pytest.fixture(scope="module")
def served(trained):  # noqa: F811
    longer_context(trained)
    s = Server(trained, "--context", str(CONTEXT))
    yield trained, s
    status, rest = s.stop()
    assert status == 0, rest


def harness(d, url, tasks):
    out = d / "lm_eval_out"
    subprocess.run([sys.executable, "scripts/lm_eval_tasks.py", EVAL, str(d / "tasks")], check=True, cwd=ROOT)
    args = [sys.executable, "tests/oracle/lm_eval_cli.py", "--model", "local-completions", "--model_args",
            f"base_url={url}/v1/completions,tokenizer={d}/hf,tokenizer_backend=huggingface,max_length={CONTEXT},"
            "model=neox,num_concurrent=2", "--batch_size", "16", "--tasks", tasks, "--include_path", str(d / "tasks"),
            "--limit", str(LIMIT), "--output_path", str(out)]
    env = dict(os.environ, HF_HOME=str(d / "hf_home"))
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    files = sorted(out.rglob("results_*.json"))
    assert files, p.stderr[-2000:]
    return json.load(open(files[-1]))["results"]


def close(a, b):
    return abs(a - b) <= REL * max(abs(a), abs(b))


@pytest.mark.skipif(not harness_available(), reason="no lm_eval in the oracle environment (make deps)")
def test_harness_through_server_equals_neox_eval(served):
    d, s = served
    got = harness(d, s.url, "lambada_openai_local,piqa_local,wikitext_local")
    prefix = d / "served_tasks"
    run(f"{BIN}/neox-eval", "-q", f"{d}/eval_model.yml", f"{d}/local.yml", "--tasks",
        "lambada_openai,piqa,wikitext", "--data-dir", EVAL, "--limit", str(LIMIT), "--results-prefix", str(prefix),
        "--bootstrap-iters", "0")
    want = json.load(open(sorted(d.glob("served_tasks_eval_results_*.json"))[-1]))["results"]
    assert got["lambada_openai_local"]["acc,none"] == want["lambada_openai"]["acc,none"]
    assert close(got["lambada_openai_local"]["perplexity,none"], want["lambada_openai"]["perplexity,none"])
    for m in ("acc,none", "acc_norm,none"):
        assert got["piqa_local"][m] == want["piqa"][m], (m, got["piqa_local"], want["piqa"])
    for m in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert close(got["wikitext_local"][m], want["wikitext"][m]), (m, got["wikitext_local"], want["wikitext"])


def test_greedy_generation_equals_neox_eval_generate(served):
    d, s = served
    prompts = ["ROMEO:", "First Citizen: Before we proceed", "KING HENRY"]  # one a line
    (d / "prompts.txt").write_text("\n".join(prompts) + "\n")
    run(f"{BIN}/neox-eval", "generate", "-q", f"{d}/eval_model.yml", f"{d}/local.yml",
        "--text-gen-type", "input-file", "--sample-input-file", f"{d}/prompts.txt", "--sample-output-file",
        f"{d}/generated.jsonl", "--maximum-tokens", "20", "--temperature", "0", "--top-k", "0", "--top-p", "0")
    want = [json.loads(l)["text"] for l in open(d / "generated.jsonl")]
    status, r = s.post({"prompt": prompts, "max_tokens": 20, "temperature": 0})
    assert status == 200, r
    assert [c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])] == want
    assert r["usage"]["completion_tokens"] <= 20 * len(prompts)


def test_sampling_with_a_seed_is_reproducible(served):
    _, s = served
    body = {"prompt": "ROMEO:", "max_tokens": 16, "temperature": 1.0, "top_k": 40, "seed": 7, "n": 3}
    first, second = s.post(body), s.post(body)
    assert first[0] == second[0] == 200
    texts = [c["text"] for c in first[1]["choices"]]
    assert texts == [c["text"] for c in second[1]["choices"]]
    assert len(set(texts)) > 1, texts  # the n completions draw differently
    other = s.post(dict(body, seed=8))[1]
    assert [c["text"] for c in other["choices"]] != texts


def test_echo_logprobs_are_the_scored_loglikelihoods(served):
    """The harness's loglikelihood request shape: the continuation's token log-probabilities sum to
    neox-eval's loglikelihood of the same pair (loglikelihood: task file)."""
    d, s = served
    pairs = [{"context": "ROMEO: What say", "continuation": " you"}, {"context": "To be, or not", "continuation": " to be"}]
    (d / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    prefix = d / "pairs"
    run(f"{BIN}/neox-eval", "-q", f"{d}/eval_model.yml", f"{d}/local.yml", "--tasks",
        f"loglikelihood:{d}/pairs.jsonl", "--results-prefix", str(prefix), "--bootstrap-iters", "0")
    want = json.load(open(sorted(d.glob("pairs_eval_results_*.json"))[-1]))["results"]
    ppl = next(iter(want.values()))["perplexity,none"]
    import math
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(d / "hf"))
    lls = []
    for p in pairs:
        ctx, whole = tok(p["context"])["input_ids"], tok(p["context"] + p["continuation"])["input_ids"]
        status, r = s.post({"prompt": whole, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True})
        assert status == 200, r
        lp = r["choices"][0]["logprobs"]
        assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(whole) + 1
        lls.append(sum(lp["token_logprobs"][len(ctx):-1]))
    assert close(math.exp(-sum(lls) / len(lls)), ppl), (lls, ppl)


def test_sigterm_answers_the_requests_in_flight(trained):  # noqa: F811
    longer_context(trained)
    s = Server(trained)
    answers = []

    def ask():
        answers.append(s.post({"prompt": "ROMEO:", "max_tokens": 40, "temperature": 0}))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    import time
    time.sleep(0.3)
    status, rest = s.stop()
    for t in threads:
        t.join()
    assert status == 0, rest
    assert len(answers) == 6
    # Each was either answered or (if it arrived after the signal) refused: 503, or the connection
    # not accepted; none was cut off.
    assert all(code in (200, 503, 0) for code, _ in answers), answers
    assert any(code == 200 for code, _ in answers)
