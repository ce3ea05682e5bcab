"""bench/generate_transformers.py: the transformers side of bench/generate.sh: greedy generation of
`tokens` tokens after the prompt on the benchmark's Hugging Face folder, fp32, torch's intra-op
threads set to `threads` (torch.set_num_threads, as its users set them), under torch.no_grad. The
loop is the model's forward with its KV cache, one token at a time, argmax of the last logits: the
faster of the two ways here (generate() adds its logits processors and stopping checks per token,
and on .venv's torch 1.13 it does not import on Python 3.11). One untimed warm-up of a few tokens
first (torch's first calls build its kernels' caches), then the timed run, which never stops early.
Prints tokens/s, then the generated ids.
With `score` after THREADS it scores the prompt instead: one forward of the whole prompt with the KV
cache, as a completion's first pass (the last position's logits only where the model's forward can
be told so: logits_to_keep), one untimed warm-up pass first; prints the prompt's tokens per second.
Usage: python bench/generate_transformers.py HF_DIR PROMPT TOKENS THREADS [score]"""
import inspect
import sys
import time

import torch
import transformers

model_dir, prompt, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_key: torch.float32}).eval()
forward_params = inspect.signature(model.forward).parameters
cache_key = "cache" if "cache" in forward_params else "past_key_values"
keep_key = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in forward_params), None)
prompt_ids = tok(prompt, add_special_tokens=False).input_ids


def greedy(n):
    past, inp, out = None, torch.tensor([prompt_ids]), []
    for _ in range(n):
        result = model(inp, **{cache_key: past}, use_cache=True)
        past = getattr(result, cache_key)
        out.append(int(result.logits[0, -1].argmax()))
        inp = torch.tensor([[out[-1]]])
    return out


def score():
    start = time.perf_counter()
    model(torch.tensor([prompt_ids]), use_cache=True, **({keep_key: 1} if keep_key else {}))
    return time.perf_counter() - start


if len(sys.argv) > 5 and sys.argv[5] == "score":
    with torch.no_grad():
        score()
        print(f"{len(prompt_ids) / score():.2f}")
    sys.exit(0)
with torch.no_grad():
    greedy(4)
    start = time.perf_counter()
    ids = greedy(tokens)
    seconds = time.perf_counter() - start
print(f"{tokens / seconds:.2f}")
print(" ".join(map(str, ids)))
