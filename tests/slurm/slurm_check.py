"""slurm_check.py: checks of the outputs of jobs/ runs for the SLURM tests (standard library, except
`hf-greedy`, which needs transformers and runs in .venv).
  slurm_check.py iterations METRICS N         training records for iterations 1..N, each exactly once
  slurm_check.py eval-test METRICS RESULTS    neox-eval's test lm_loss equals the trainer's final one
  slurm_check.py samples SAMPLES PROMPTS      one generated record per prompt, in order
  slurm_check.py hf-greedy HF SAMPLES N       transformers' greedy continuation of each prompt, with
                                              the exported model, is the text neox-eval generated
"""
import json
import sys


def records(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def iterations(metrics, n):
    its = [r["iteration"] for r in records(metrics) if "train/lm_loss" in r]
    print(f"{len(its)} training records, iterations {its[:3]}...{its[-3:]}")
    return its == list(range(1, int(n) + 1))


def eval_test(metrics, results):
    trained = [r for r in records(metrics) if "test/lm_loss" in r][-1]
    res = json.load(open(results))
    got = res["results"]["test"]["lm_loss,none"]
    print(f"trainer test/lm_loss {trained['test/lm_loss']!r} at iteration {trained['iteration']}, "
          f"neox-eval {got!r} at iteration {res['config']['iteration']}")
    return (abs(got - trained["test/lm_loss"]) <= 1e-6 * abs(got)
            and res["config"]["iteration"] == trained["iteration"])


def samples(path, prompts_path):
    prompts = [p.strip() for p in open(prompts_path).read().split("\n") if p.strip()]
    got = records(path)
    print(f"{len(got)} samples for {len(prompts)} prompts: {[r['text'] for r in got]}")
    return [r["context"] for r in got] == prompts and all(isinstance(r["text"], str) for r in got)


def hf_greedy(hf, samples_path, max_tokens):
    """The oracle tests' greedy decoder (tests/oracle/eval_oracle.py) on the exported folder."""
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
    import torch
    from eval_oracle import HarnessLM
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    class Tok:  # the export's tokenizer.json through HF tokenizers, as HarnessLM uses a tokenizer
        def __init__(self, path):
            self.t = Tokenizer.from_file(path)
        def __len__(self):
            return self.t.get_vocab_size()
        def encode(self, text, add_special_tokens=False):
            return self.t.encode(text, add_special_tokens=add_special_tokens).ids
        def decode(self, ids):
            return self.t.decode(ids, skip_special_tokens=False)

    lm = HarnessLM.__new__(HarnessLM)  # its tokenizer is a tokenizer.json here, not vocab + merges
    lm.tok = Tok(f"{hf}/tokenizer.json")
    lm.model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    lm.max_length = lm.model.config.max_position_embeddings
    lm.eot = lm.model.generation_config.eos_token_id
    ok = True
    for r in records(samples_path):
        gen = lm.greedy(lm.encode(r["context"]), int(max_tokens))
        finished = lm.eot in gen
        if finished:
            gen = gen[:gen.index(lm.eot)]
        text = lm.tok.decode(gen)
        print(f"{r['context']!r}: transformers {text!r} ({len(gen)}), neox-eval {r['text']!r} ({r['length']})")
        ok &= text == r["text"] and len(gen) == r["length"] and finished == r["finished"]
    return ok


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    checks = {"iterations": iterations, "eval-test": eval_test, "samples": samples, "hf-greedy": hf_greedy}
    if cmd not in checks:
        sys.exit(f"unknown check {cmd}")
    sys.exit(0 if checks[cmd](*args) else 1)
