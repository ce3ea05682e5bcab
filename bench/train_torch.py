"""train_torch.py: the PyTorch side of bench/train_cpu.sh.

Trains Hugging Face transformers' GPTNeoXForCausalLM with the same architecture as bench/train_neox.c
(Pythia-70M's shape by default: rotary on a quarter of each head, parallel residual, exact GELU,
untied output) on random token ids with torch.optim.AdamW, on the CPU with a fixed thread count,
and prints one JSON line with tokens/s, the time in forward, backward and the optimizer, and the CPU
seconds all threads used in the timed steps.

    train_torch.py key=value...   keys: layers hidden heads vocab seq batch steps warmup threads
"""
import json
import resource
import sys
import time

import torch
import torch.nn.functional as F
import transformers


def main(argv):
    opts = dict(layers=6, hidden=512, heads=8, vocab=50304, seq=512, batch=8, steps=3, warmup=1, threads=2, bf16=0)
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in opts:
            sys.exit(f"train_torch.py: bad argument '{arg}' (keys: {' '.join(opts)})")
        opts[key] = int(value)
    torch.set_num_threads(opts["threads"])
    torch.manual_seed(1234)
    config = transformers.GPTNeoXConfig(
        vocab_size=opts["vocab"], hidden_size=opts["hidden"], num_hidden_layers=opts["layers"],
        num_attention_heads=opts["heads"], intermediate_size=4 * opts["hidden"], rotary_pct=0.25,
        rotary_emb_base=10000, max_position_embeddings=opts["seq"], use_parallel_residual=True,
        hidden_act="gelu", layer_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0,
        hidden_dropout=0.0, initializer_range=0.02, attention_bias=True, use_cache=False)
    model = transformers.GPTNeoXForCausalLM(config).float().train()
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    n = opts["batch"] * opts["seq"]
    gen = torch.Generator().manual_seed(42)
    tokens = torch.randint(0, opts["vocab"], (n + 1,), generator=gen)
    ids = tokens[:-1].view(opts["batch"], opts["seq"])
    targets = tokens[1:].reshape(-1)

    def cpu_seconds():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    fwd = bwd = step = cpu = 0.0
    first = last = None
    for s in range(opts["warmup"] + opts["steps"]):
        if s == opts["warmup"]:
            cpu = cpu_seconds()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        # bf16=1: torch's CPU autocast, its users' bfloat16 training (linear layers on bf16 operands).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(opts["bf16"])):
            logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(n, -1), targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        first = loss.item() if first is None else first
        last = loss.item()
        if s >= opts["warmup"]:
            fwd, bwd, step = fwd + t1 - t0, bwd + t2 - t1, step + t3 - t2
    cpu = cpu_seconds() - cpu
    total = fwd + bwd + step
    print(json.dumps({
        "impl": "pytorch", "precision": "bfloat16" if opts["bf16"] else "fp32", "torch": torch.__version__, "transformers": transformers.__version__,
        "params": sum(p.numel() for p in model.parameters()), "tokens_per_step": n, "steps": opts["steps"],
        "seconds": round(total, 4), "tokens_per_s": round(n * opts["steps"] / total, 2),
        "forward_s": round(fwd / opts["steps"], 4), "backward_s": round(bwd / opts["steps"], 4),
        "adamw_s": round(step / opts["steps"], 4), "cpu_s": round(cpu, 4), "first_loss": round(first, 4), "last_loss": round(last, 4)}))


if __name__ == "__main__":
    main(sys.argv[1:])
