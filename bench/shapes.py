"""bench/shapes.py: the Python side of bench/shapes.sh, run by the peer venv's Python (newest torch and
transformers, bench/peers_torch.sh). Subcommands, each printing one JSON line (tokens/s and versions):

    shapes.py make SHAPE DIR TOKENIZER_DIR SEQ  random weights for SHAPE (transformers' own init, seed
                                                 1234) saved as a Hugging Face folder (fp32 safetensors)
                                                 with a GPT-2 byte-level BPE of the model's vocabulary
    shapes.py train DIR SEQ BATCH STEPS WARMUP THREADS MODE   training steps, MODE eager | compile | bf16
    shapes.py score DIR LAMBADA LIMIT BATCH SEQ THREADS       lm-eval-style loglikelihood requests
    shapes.py generate DIR PROMPTS MAX_NEW SEQ THREADS         greedy generate() per prompt

The shapes: GPT-NeoX 125M, Pythia-160M, SmolLM2-135M and a grouped-query Llama-2-style model."""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import transformers

from lambada import lambada_requests

SHAPES = {
    # GPT-NeoX 125M (configs/125M.yml): sequential residual, full rotary, GELU.
    "neox125m": ("gpt_neox", dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072, rotary_pct=1.0, use_parallel_residual=False,
                                  tie_word_embeddings=False)),
    # Pythia-160M: rotary on a quarter of each head, parallel residual.
    "pythia160m": ("gpt_neox", dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                    intermediate_size=3072, rotary_pct=0.25, use_parallel_residual=True,
                                    tie_word_embeddings=False)),
    # SmolLM2-135M: Llama, 9 query / 3 KV heads of 64, SwiGLU 1536, RMSNorm, tied embeddings.
    "smollm2_135m": ("llama", dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, head_dim=64, intermediate_size=1536, rms_norm_eps=1e-5,
                                   rope_theta=100000.0, tie_word_embeddings=True)),
    # Llama-2-style with grouped-query attention, small enough for 2 cores.
    "llama_gqa": ("llama", dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                                num_key_value_heads=4, head_dim=64, intermediate_size=2816, rms_norm_eps=1e-5,
                                rope_theta=10000.0, tie_word_embeddings=False)),
}


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def emit(record):
    print(json.dumps({**record, **versions()}), flush=True)


def write_tokenizer(src, out, vocab_size, seq):
    """GPT-2's byte-level BPE cut to vocab_size ids: the 256 byte tokens, the first vocab_size - 257
    merges (GPT-2's token 256 + i is merge i) and <|endoftext|> as the last id. Models smaller than
    GPT-2's vocabulary get a real tokenizer of their own size that both sides read."""
    vocab = json.load(open(f"{src}/vocab.json", encoding="utf-8"))
    merges = open(f"{src}/merges.txt", encoding="utf-8").read().split("\n")
    header, merges = merges[0], [m for m in merges[1:] if m]
    eot = "<|endoftext|>"
    if vocab_size < len(vocab):
        keep = vocab_size - 1
        vocab = {t: i for t, i in vocab.items() if i < keep}
        vocab[eot] = keep
        merges = merges[:keep - 256]
    json.dump(vocab, open(f"{out}/vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
    open(f"{out}/merges.txt", "w", encoding="utf-8").write("\n".join([header] + merges) + "\n")
    json.dump({"tokenizer_class": "GPT2TokenizerFast", "bos_token": eot, "eos_token": eot, "unk_token": eot,
               "add_prefix_space": False, "model_max_length": seq},
              open(f"{out}/tokenizer_config.json", "w"))


def make(shape, out, tokenizer_dir, seq):
    kind, kw = SHAPES[shape]
    seq = int(seq)
    torch.manual_seed(1234)
    common = dict(max_position_embeddings=max(seq, 2048), bos_token_id=kw["vocab_size"] - 1,
                  eos_token_id=kw["vocab_size"] - 1, initializer_range=0.02)
    if kind == "gpt_neox":
        common["bos_token_id"] = common["eos_token_id"] = 50256
        config = transformers.GPTNeoXConfig(**kw, **common, hidden_act="gelu", layer_norm_eps=1e-5,
                                            rotary_emb_base=10000, attention_bias=True)
        model = transformers.GPTNeoXForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**kw, **common, hidden_act="silu", attention_bias=False, mlp_bias=False)
        model = transformers.LlamaForCausalLM(config)
    os.makedirs(out, exist_ok=True)
    model.float().save_pretrained(out, safe_serialization=True)
    write_tokenizer(tokenizer_dir, out, kw["vocab_size"], seq)
    emit({"made": shape, "params": sum(p.numel() for p in model.parameters())})


def load(model_dir, threads, **kw):
    torch.set_num_threads(int(threads))
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa",
                                                             **{dtype_key: torch.float32}, **kw)


def train(model_dir, seq, batch, steps, warmup, threads, mode):
    """The step neox-train runs: zero the gradients, forward, cross-entropy, backward, AdamW (no decay
    on biases and norms). compile: torch.compile of the model (inductor's C++ kernels); bf16: CPU
    autocast to bfloat16."""
    seq, batch, steps, warmup = int(seq), int(batch), int(steps), int(warmup)
    model = load(model_dir, threads).train()
    V = model.get_output_embeddings().weight.shape[0]
    decay = [p for p in model.parameters() if p.ndim == 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    # The fastest AdamW torch has on the CPU: fused (one kernel over all tensors), else foreach.
    try:
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    run = torch.compile(model) if mode == "compile" else model
    n = batch * seq
    tokens = torch.randint(0, V, (n + batch,), generator=torch.Generator().manual_seed(42)).view(batch, seq + 1)
    ids, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
    times, first = [], None
    t_start = time.perf_counter()
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
            logits = run(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(n, -1), targets)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        if s >= warmup:
            times.append(time.perf_counter() - t0)
        elif s == warmup - 1:
            warm_s = time.perf_counter() - t_start
    emit({"side": f"torch {mode}", "tokens_per_s": round(n / statistics.median(times), 2), "tokens_per_step": n,
          "step_s": [round(t, 3) for t in times], "warmup_s": round(warm_s, 2) if warmup else 0,
          "first_loss": round(first, 4)})


def score(model_dir, lambada, limit, batch, seq, threads):
    """Requests sorted by length and run micro-batch rows at a time, left-padded with an attention mask
    and position ids so that every row's scored positions are the last ones, and only those rows go
    through the output layer (logits_to_keep)."""
    model = load(model_dir, threads).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    requests = sorted(lambada_requests(tok, lambada, int(limit), int(seq)), key=lambda r: -len(r[0]))
    batch, tokens, correct = int(batch), 0, 0
    with torch.inference_mode():
        start = time.perf_counter()
        for i in range(0, len(requests), batch):
            part = requests[i:i + batch]
            T, keep = len(part[0][0]), max(len(c) for _, c in part)
            ids = torch.tensor([[0] * (T - len(inp)) + inp for inp, _ in part])
            mask = torch.tensor([[0] * (T - len(inp)) + [1] * len(inp) for inp, _ in part])
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            tokens += sum(len(inp) for inp, _ in part)  # the requests' tokens, as neox-eval counts them
            for b, (inp, cont) in enumerate(part):
                n = min(len(cont), len(inp))
                sel = logprobs[b, keep - n:]
                target = torch.tensor(cont[len(cont) - n:])
                float(sel.gather(1, target[:, None]).sum())
                correct += bool((sel.argmax(-1) == target).all())
        seconds = time.perf_counter() - start
    emit({"side": "transformers score", "tokens_per_s": round(tokens / seconds, 1), "tokens": tokens,
          "requests": len(requests), "seconds": round(seconds, 2)})


def generate(model_dir, prompts, max_new, seq, threads):
    model = load(model_dir, threads).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    generated, seconds = 0, 0.0
    with torch.inference_mode():
        for prompt in [p.strip() for p in open(prompts, encoding="utf-8") if p.strip()]:
            ids = torch.tensor([tok.encode(prompt)])
            new = min(int(max_new), int(seq) - ids.shape[1])
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                 num_beams=1, pad_token_id=tok.eos_token_id)
            seconds += time.perf_counter() - t0
            generated += out.shape[1] - ids.shape[1]
    emit({"side": "transformers generate", "tokens_per_s": round(generated / seconds, 2), "tokens": generated})


if __name__ == "__main__":
    commands = {"make": make, "train": train, "score": score, "generate": generate}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"shapes.py: usage: shapes.py {'|'.join(commands)} ARGS... (see the docstring)")
    commands[sys.argv[1]](*sys.argv[2:])
