"""bench/eval_transformers.py: the transformers side of bench/eval.sh, on the model neox-eval scores:
lambada_openai requests tokenized and truncated as lm-evaluation-harness does, batched like neox-eval
(sorted by length, micro-batch rows padded to the longest), loglikelihood + greedy from log_softmax;
then greedy generation with transformers' KV cache. Prints `eval_tokens_per_s`, `gen_tokens_per_s`.
Runs on transformers 4.49 (.venv) and 5 (bench/peers_torch.sh): the tokenizer is read with
from_pretrained (constructing GPT2TokenizerFast from vocab_file/merges_file gives an empty tokenizer
on 5), the dtype and KV-cache keywords are whichever the version takes (`cache` replaces
`past_key_values` in later 5.x) and the vocabulary is the output layer's."""
import inspect
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, GPT2TokenizerFast

from lambada import lambada_requests

model_dir, lambada, limit, batch, max_length, prompts_file, max_new, threads = sys.argv[1:9]
limit, batch, max_length, max_new = int(limit), int(batch), int(max_length), int(max_new)
torch.set_num_threads(int(threads))
tok = GPT2TokenizerFast.from_pretrained(model_dir)
dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
model = AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_key: torch.float32}).eval()
vocab = min(len(tok), model.get_output_embeddings().weight.shape[0])  # the padded rows are no tokens
eot = tok.eos_token_id
cache_key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

requests = sorted(lambada_requests(tok, lambada, limit, max_length), key=lambda r: -len(r[0]))

with torch.no_grad():
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(requests), batch):
        part = requests[i:i + batch]
        T = len(part[0][0])
        ids = torch.tensor([inp + [0] * (T - len(inp)) for inp, _ in part])
        logprobs = torch.log_softmax(model(ids).logits, dim=-1)
        tokens += sum(len(inp) for inp, _ in part)  # the requests' tokens, as neox-eval counts them
        for b, (inp, cont) in enumerate(part):
            n = min(len(cont), len(inp))
            sel = logprobs[b, len(inp) - n:len(inp)]
            target = torch.tensor(cont[len(cont) - n:])
            float(sel.gather(1, target[:, None]).sum()), bool((sel.argmax(-1) == target).all())
    seconds = time.perf_counter() - start
    print(f"eval_tokens_per_s {tokens / seconds:.1f}")

    start, generated = time.perf_counter(), 0
    for prompt in [p.strip() for p in open(prompts_file, encoding="utf-8") if p.strip()]:
        ids = tok.encode(prompt)
        past, inp, n = None, torch.tensor([ids]), 0
        while n < max_new and len(ids) + n < max_length:
            out = model(inp, **{cache_key: past}, use_cache=True)
            past = getattr(out, cache_key)
            nxt = int(out.logits[0, -1, :vocab].argmax())
            n += 1
            if nxt == eot:
                break
            inp = torch.tensor([[nxt]])
        generated += n
    print(f"gen_tokens_per_s {generated / (time.perf_counter() - start):.1f}")
