"""test_serve.py: neox-eval serve against the real lm-evaluation-harness and against neox-eval itself,
on the tiny GPT-2-tokenized model test_eval.py trains. The harness (`local-completions`, local task
files from scripts/lm_eval_tasks.py) scores lambada_openai, piqa and wikitext through the server with
the same acc and acc_norm as `neox-eval --tasks` and perplexities within 1e-6 relative; greedy
generation through the server equals `neox-eval generate`; a sampled completion with a seed is the
same twice; SIGTERM in the middle of requests answers them all and exits 0. /v1/chat/completions:
greedy chat completions equal transformers' apply_chat_template + generate (text, token counts,
log-probabilities), sampling with a seed repeats, bad bodies are refused naming the field."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from data_oracle import BIN, ROOT
from test_eval import EVAL, GPT2 as GPT2_DIR, neox_eval, run, trained  # noqa: F401  (trained: the session's model fixture)

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
    def __init__(self, d, *extra, configs=("eval_model.yml", "local.yml")):
        self.proc = subprocess.Popen([f"{BIN}/neox-eval", "serve", "-q", *(f"{d}/{c}" for c in configs),
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


@pytest.mark.parametrize("k", [1, 3])
def test_packed_echo_logprobs_equal_transformers(served, k):
    """Several prompts in one request (packed into one pass, their rows through the output layer
    together): every position's token log-probability and top-k alternatives, and the one greedy
    token, equal transformers' log-softmax of the exported model, prompt by prompt."""
    import torch
    from eval_oracle import HarnessLM
    d, s = served
    lm = HarnessLM(str(d / "hf"), max_length=CONTEXT)
    texts = ["ROMEO: What say you", "To be, or not to be, that is the question", "First Citizen:", "KING"]
    prompts = [lm.encode(t) for t in texts]
    status, r = s.post({"prompt": prompts, "max_tokens": 1, "temperature": 0, "logprobs": k, "echo": True})
    assert status == 200, r
    choices = sorted(r["choices"], key=lambda c: c["index"])
    ntok = len(lm.tok)
    for ids, c in zip(prompts, choices):
        with torch.no_grad():
            lp = lm.model(torch.tensor([ids])).logits[0].double().log_softmax(-1)
        got = c["logprobs"]
        assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
        for t in range(1, len(ids)):
            assert abs(got["token_logprobs"][t] - lp[t - 1, ids[t]].item()) < 1e-4, (t, got["token_logprobs"][t])
            top = lp[t - 1].topk(k)
            want = {lm.tok.decode([int(i)]): v for v, i in zip(top.values.tolist(), top.indices.tolist())}
            assert list(got["top_logprobs"][t]) == list(want), (t, got["top_logprobs"][t], want)
            assert all(abs(got["top_logprobs"][t][w] - want[w]) < 1e-4 for w in want)
        greedy = int(lp[-1, :ntok].argmax())
        assert got["tokens"][-1] == lm.tok.decode([greedy])
        assert abs(got["token_logprobs"][-1] - lp[-1, greedy].item()) < 1e-4


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


# ---- /v1/chat/completions ---------------------------------------------------------------------------
TEMPLATES = os.path.join(ROOT, "tests", "oracle", "chat_templates")
CONVERSATION = [{"role": "system", "content": "You speak as a king."},
                {"role": "user", "content": "Who goes there?"},
                {"role": "assistant", "content": "A friend, my lord."},
                {"role": "user", "content": "Then speak, friend: what news from Verona?"}]


@pytest.fixture(scope="module")
def chat_served(trained):  # noqa: F811
    """The trained model served with GPT-2's tokenizer.json (the same ids, and <|endoftext|> in text
    is the special token, as in transformers) beside a tokenizer_config.json carrying Zephyr's chat
    template: what transformers reads from a model's folder."""
    longer_context(trained)
    tok = trained / "chat_tokenizer"
    tok.mkdir(exist_ok=True)
    shutil.copy(os.path.join(GPT2_DIR, "gpt2_tokenizer.json"), tok / "tokenizer.json")
    template = open(os.path.join(TEMPLATES, "zephyr.jinja")).read()
    (tok / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}))
    model = [l for l in (trained / "eval_model.yml").read_text().splitlines() if '"tokenizer_type"' not in l]
    (trained / "chat_model.yml").write_text("\n".join(model) + "\n")
    local = json.loads((trained / "local.yml").read_text())
    del local["merge_file"]
    local.update(vocab_file=f"{tok}/tokenizer.json", tokenizer_type="HFTokenizer")
    (trained / "chat_local.yml").write_text(json.dumps(local))
    s = Server(trained, "--context", str(CONTEXT), configs=("chat_model.yml", "chat_local.yml"))
    yield trained, s, template
    status, rest = s.stop()
    assert status == 0, rest


def hf_chat(d, template, messages, max_new_tokens):
    """transformers' side: apply_chat_template with the same template, then greedy decoding with the
    transformers model (eval_oracle's loop: GenerationMixin does not import with this torch build)
    and the log-softmax of each generated token."""
    import torch
    from eval_oracle import HarnessLM
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(d / "hf"))
    tok.chat_template = template
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    lm = HarnessLM(str(d / "hf"), max_length=CONTEXT)
    gen = lm.greedy(ids, max_new_tokens)
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids + gen])).logits[0].double().log_softmax(-1)
    logprobs = [logits[len(ids) + i - 1, t].item() for i, t in enumerate(gen)]
    text = tok.decode(gen[:-1] if gen and gen[-1] == tok.eos_token_id else gen)
    return ids, gen, text, logprobs


def test_chat_greedy_equals_transformers(chat_served):
    d, s, template = chat_served
    status, r = s.post({"messages": CONVERSATION, "max_tokens": 24, "temperature": 0, "logprobs": True,
                        "top_logprobs": 3}, path="/v1/chat/completions")
    assert status == 200, r
    ids, gen, text, logprobs = hf_chat(d, template, CONVERSATION, 24)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    (choice,) = r["choices"]
    assert choice["message"] == {"role": "assistant", "content": text}
    assert r["usage"]["prompt_tokens"] == len(ids)
    assert r["usage"]["completion_tokens"] == len(gen)
    assert choice["finish_reason"] == ("stop" if len(gen) < 24 else "length")
    content = choice["logprobs"]["content"]
    assert len(content) == len(gen)
    for entry, want in zip(content, logprobs):
        assert abs(entry["logprob"] - want) <= 1e-4, (entry, want)
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0]["logprob"] == entry["logprob"]  # greedy: the chosen is the likeliest
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(top, top[1:]))
    body = bytes(b for entry in content for b in entry["bytes"]).decode("utf-8", "replace")
    assert body.startswith(text)  # the tokens' bytes spell the message (and the eos, if it ended there)


def test_chat_default_length_fills_the_context(chat_served):
    """Without max_tokens a chat completion may run to the end of the context (OpenAI's default)."""
    d, s, template = chat_served
    status, r = s.post({"messages": CONVERSATION[-1:], "temperature": 0}, path="/v1/chat/completions")
    assert status == 200, r
    room = CONTEXT - r["usage"]["prompt_tokens"]
    assert r["usage"]["completion_tokens"] <= room
    assert r["choices"][0]["finish_reason"] == "stop" or r["usage"]["completion_tokens"] == room


def test_chat_sampling_with_a_seed_is_reproducible(chat_served):
    _, s, _ = chat_served
    body = {"messages": CONVERSATION, "max_tokens": 12, "temperature": 1.0, "seed": 5, "n": 3}
    first, second = (s.post(body, path="/v1/chat/completions") for _ in range(2))
    assert first[0] == second[0] == 200
    texts = [c["message"]["content"] for c in first[1]["choices"]]
    assert texts == [c["message"]["content"] for c in second[1]["choices"]]
    assert len(set(texts)) > 1, texts


def test_chat_refusals_name_the_field(chat_served, served):
    _, s, _ = chat_served
    for body, param in [({"messages": []}, "messages"),
                        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, "messages"),
                        ({"messages": CONVERSATION, "prompt": "x"}, "prompt"),
                        ({"messages": CONVERSATION, "top_logprobs": 2}, "top_logprobs"),
                        ({"messages": CONVERSATION, "max_tokens": CONTEXT}, "max_tokens")]:
        status, r = s.post(body, path="/v1/chat/completions")
        assert status == 400 and r["error"]["param"] == param, (body, r)
    # The GPT-2 folder has no tokenizer_config.json: chat is refused with the way out.
    _, plain = served
    status, r = plain.post({"messages": CONVERSATION}, path="/v1/chat/completions")
    assert status == 400 and "--chat-template" in r["error"]["message"], r


def test_chat_template_option(chat_served):
    """--chat-template replaces the tokenizer's template (its special tokens stay the folder's); a
    conversation the template refuses (raise_exception) is a 400 with its message; a missing or
    unsupported file stops the start."""
    trained = chat_served[0]
    mistral = os.path.join(TEMPLATES, "mistral-v0.1.jinja")
    s = Server(trained, "--chat-template", mistral, "--context", str(CONTEXT), configs=("chat_model.yml", "chat_local.yml"))
    try:
        status, r = s.post({"messages": CONVERSATION[1:], "max_tokens": 4, "temperature": 0}, path="/v1/chat/completions")
        assert status == 200, r
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(trained / "hf"))
        tok.chat_template = open(mistral).read()
        want = tok.apply_chat_template(CONVERSATION[1:], add_generation_prompt=True, tokenize=True)
        assert r["usage"]["prompt_tokens"] == len(want)
        status, r = s.post({"messages": CONVERSATION[1:2] * 2, "max_tokens": 4}, path="/v1/chat/completions")
        assert status == 400 and "alternate" in r["error"]["message"], r
    finally:
        assert s.stop()[0] == 0
    bad = trained / "bad.jinja"
    bad.write_text("{{ messages | tojson }}")
    for path, words in [(str(trained / "missing.jinja"), "missing.jinja"), (str(bad), "tojson")]:
        p = subprocess.run([f"{BIN}/neox-eval", "serve", "-q", f"{trained}/eval_model.yml", f"{trained}/local.yml",
                            "--port", "0", "--chat-template", path], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and words in p.stderr, p.stderr
