"""eval_oracle.py: lm-evaluation-harness 0.4's task definitions applied with Hugging Face transformers,
written independently of neox.c for its oracle tests: request tokenization (_encode_pair), truncation to
max_length, loglikelihood and greedy checks, rolling windows (get_rolling_token_windows +
make_disjoint_window), the wikitext detokenizer and word counts, and the metric aggregations
(mean, mean_stderr, perplexity, weighted_perplexity, bits_per_byte) and the bootstrapped standard error
of perplexity (bootstrap_stderr on Python's random module)."""
import json
import math
import os
import random
import re
import sys

import numpy as np
import torch

# The data files' names and how WikiText's rows form pages: scripts/lm_eval_tasks.py (the format
# of the data, shared with the harness's local task files; nothing of neox.c's own scoring).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from lm_eval_tasks import FILES, piqa_labels, wikitext_pages  # noqa: E402


class HarnessLM:
    def __init__(self, model_dir, max_length, prefix=None):
        from transformers import AutoModelForCausalLM, GPT2TokenizerFast
        self.tok = GPT2TokenizerFast(vocab_file=f"{model_dir}/vocab.json", merges_file=f"{model_dir}/merges.txt")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        self.max_length = max_length
        self.eot = self.tok.eos_token_id
        # HFLM.prefix_token_id: before empty contexts and rolling windows (the bos when there is one)
        self.prefix = self.eot if prefix is None else prefix

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    def encode_pair(self, context, continuation):
        if context == "":
            return [self.prefix], self.encode(continuation)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.encode(context + continuation)
        ctx = self.encode(context)
        return ctx, whole[len(ctx):]

    @torch.no_grad()
    def loglikelihood_tokens(self, requests):
        out = []
        for ctx, cont in requests:
            inp = (ctx + cont)[-(self.max_length + 1):][:-1]
            logits = self.model(torch.tensor([inp])).logits[0]
            logprobs = torch.log_softmax(logits, dim=-1)
            # A continuation longer than the input (only with a tiny max_length) makes the harness
            # fail on mismatched shapes; neox.c scores its last len(inp) tokens, and so does this.
            n = min(len(cont), len(inp))
            part = logprobs[len(inp) - n:len(inp)]
            target = torch.tensor(cont[len(cont) - n:])
            greedy = bool((part.argmax(dim=-1) == target).all())
            ll = float(torch.gather(part, 1, target[:, None]).sum())
            out.append((ll, greedy))
        return out

    def loglikelihood(self, pairs):
        return self.loglikelihood_tokens([self.encode_pair(c, x) for c, x in pairs])

    @torch.no_grad()
    def greedy(self, ids, max_new):
        """Greedy decoding with the transformers model (its KV cache), as generate(do_sample=False)
        does; GenerationMixin itself does not import with this Debian torch build."""
        out, past, inp = [], None, torch.tensor([ids])
        while len(out) < max_new and len(ids) + len(out) < self.max_length:
            res = self.model(inp, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = int(res.logits[0, -1, :len(self.tok)].argmax())  # ids of the tokenizer only
            out.append(nxt)
            if nxt == self.eot:
                break
            inp = torch.tensor([[nxt]])
        return out

    def rolling(self, text):
        tokens = self.encode(text)
        windows = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, self.prefix, self.max_length, 1)]
        return sum(ll for ll, _ in self.loglikelihood_tokens(windows))


def get_rolling_token_windows(token_list, prefix_token, max_seq_len, context_len):
    if not token_list:
        return
    pred_len = max_seq_len - context_len + 1
    first_seq_len = min(max_seq_len, len(token_list))
    yield [prefix_token] + token_list[:first_seq_len - 1], token_list[:first_seq_len]
    predicted = first_seq_len
    while predicted < len(token_list):
        window_pred_len = min(len(token_list) - predicted, pred_len)
        window_end = predicted + window_pred_len
        yield (token_list[window_end - max_seq_len - 1:window_end - 1],
               token_list[window_end - window_pred_len:window_end])
        predicted += window_pred_len


def make_disjoint_window(pair):
    a, b = pair
    return a[:len(a) - (len(b) - 1)], b


def wikitext_detokenizer(string):
    string = string.replace("s '", "s'")
    string = re.sub(r"/' [0-9]/", r"/'[0-9]/", string)
    for a, b in [(" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "), (" . ", ". "),
                 (" ! ", "! "), (" ? ", "? "), (" , ", ", ")]:
        string = string.replace(a, b)
    string = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", string)
    string = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", string)
    string = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", string)
    string = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', string)
    string = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", string)
    for a, b in [("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" " + chr(176) + " ", chr(176)),
                 (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")]:
        string = string.replace(a, b)
    return string


def mean_stderr(x):
    x = np.asarray(x, dtype=np.float64)
    return float(np.std(x, ddof=1) / math.sqrt(len(x)))


def bootstrap_perplexity_stderr(lls, iters=100000):
    """The harness's bootstrap_stderr(perplexity, lls, iters) (lm_eval/api/metrics.py, 0.4) in one
    process: chunks of min(1000, iters) resamples, chunk i drawn by random.Random(i).choices, each
    resample's perplexity exp(-mean), then the sample standard deviation of all of them. iters is
    the harness's default bootstrap_iters."""
    chunk = min(1000, iters)
    res = []
    for i in range(iters // chunk):
        rnd = random.Random(i)
        for _ in range(chunk):
            sample = rnd.choices(lls, k=len(lls))
            res.append(math.exp(-(sum(sample) / len(sample))))
    mu = sum(res) / len(res)
    return math.sqrt(sum((x - mu) ** 2 for x in res) / (len(res) - 1))


def lambada(lm, data_dir, limit):
    docs = [json.loads(line) for line in open(f"{data_dir}/{FILES['lambada']}", encoding="utf-8")][:limit]
    pairs = [(" ".join(d["text"].split(" ")[:-1]), " " + d["text"].split(" ")[-1]) for d in docs]
    res = lm.loglikelihood(pairs)
    lls = [ll for ll, _ in res]
    acc = [float(g) for _, g in res]
    return {"perplexity": math.exp(-np.mean(lls)), "perplexity_stderr": bootstrap_perplexity_stderr(lls),
            "acc": float(np.mean(acc)), "acc_stderr": mean_stderr(acc)}


def multiple_choice(lm, docs):
    """docs: (context, [continuations], [choice texts], gold)."""
    acc, acc_norm = [], []
    for ctx, conts, choices, gold in docs:
        lls = np.array([ll for ll, _ in lm.loglikelihood([(ctx, c) for c in conts])])
        lengths = np.array([float(len(c)) for c in choices])
        acc.append(float(np.argmax(lls) == gold))
        acc_norm.append(float(np.argmax(lls / lengths) == gold))
    return {"acc": float(np.mean(acc)), "acc_stderr": mean_stderr(acc), "acc_norm": float(np.mean(acc_norm)),
            "acc_norm_stderr": mean_stderr(acc_norm)}


def piqa(lm, data_dir, limit):
    docs = [json.loads(line) for line in open(f"{data_dir}/{FILES['piqa']}", encoding="utf-8")][:limit]
    labels = piqa_labels(f"{data_dir}/{FILES['piqa_labels']}")[:limit]
    return multiple_choice(lm, [(f"Question: {d['goal']}\nAnswer:", [" " + d["sol1"], " " + d["sol2"]],
                                 [d["sol1"], d["sol2"]], g) for d, g in zip(docs, labels)])


def rolling_metrics(lm, texts, originals):
    ll = sum(lm.rolling(t) for t in texts)
    words = sum(len(re.split(r"\s+", o)) for o in originals)
    nbytes = sum(len(o.encode("utf-8")) for o in originals)
    return {"word_perplexity": math.exp(-ll / words), "byte_perplexity": math.exp(-ll / nbytes),
            "bits_per_byte": -ll / nbytes / math.log(2)}


def wikitext(lm, data_dir, limit):
    pages = wikitext_pages(f"{data_dir}/{FILES['wikitext']}")[:limit]
    return rolling_metrics(lm, [wikitext_detokenizer(p) for p in pages], pages)
