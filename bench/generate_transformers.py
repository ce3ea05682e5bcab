"""bench/generate_transformers.py: the transformers side of bench/generate.sh: greedy generation of
`tokens` tokens after the prompt with transformers' KV cache on the benchmark's Hugging Face folder,
fp32, torch's intra-op threads set to `threads` (torch.set_num_threads, as its users set them) and
under torch.inference_mode. One untimed warm-up generation of a few tokens first (torch's first call
builds its kernels' caches), then the timed one, which must not stop early. Prints tokens/s and the
generated ids on one line each.
Usage: python bench/generate_transformers.py HF_DIR PROMPT TOKENS THREADS"""
import sys
import time

import torch
import transformers

model_dir, prompt, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
ids = torch.tensor([tok(prompt, add_special_tokens=False).input_ids])
with torch.inference_mode():
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    seconds = time.perf_counter() - start
print(f"{tokens / seconds:.2f}")
print(" ".join(map(str, out[0, ids.shape[1]:].tolist())))
