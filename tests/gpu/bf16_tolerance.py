"""tests/gpu/bf16_tolerance.py: how far 16-bit GEMM operands move a short training run, measured with
PyTorch (an independent implementation) to set tests/gpu/e2e.sh's BF16_TOL. Not a test: run by hand
(`.venv/bin/python tests/gpu/bf16_tolerance.py [SEEDS]`), its output is quoted in docs/cuda.md.

The model and run are e2e.sh's GPT-NeoX case (tests/layout_config.sh: 4 layers, hidden 32, 4 heads,
sequence 32, parallel residual, rotary on half of each head, gelu, dropout 0.1; Adam lr 0.003 with
10% warmup and cosine decay, weight decay 0.01, clipping 1.0; micro-batch 4 x 2 accumulation steps;
20 steps) on random word text, char-level (vocabulary 320). It trains twice from the same start and
the same batches and dropout masks: in fp32, and with every matrix product's operands rounded to bf16
(forward and both backward products; accumulation and everything else in fp32, master weights fp32),
which is what `precision: bfloat16` means in neox.c; and again with the products' results rounded to
bf16 as well (bf16 activations, a later layer of the CUDA backend). It prints the largest relative
difference of the per-step losses and gradient norms over the seeds, for each variant.
"""
import math
import random
import sys

import torch
import torch.nn.functional as F
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

L, C, NH, T, V, MICRO, ACCUM, STEPS, LR = 4, 32, 4, 32, 320, 4, 2, 20, 0.003


ROUND_OUTPUTS = False


def bf16(t):
    return t.bfloat16().float()


class Bf16Matmul(torch.autograd.Function):
    """y = x w^T + b with x and w rounded to bf16 (and dy rounded in the backward products); with
    ROUND_OUTPUTS, x w^T and the backward products' results rounded to bf16 too."""

    @staticmethod
    def forward(ctx, x, w, b):
        xb, wb = bf16(x), bf16(w)
        ctx.save_for_backward(xb, wb)
        ctx.has_bias = b is not None
        y = xb @ wb.t()
        y = bf16(y) if ROUND_OUTPUTS else y
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        xb, wb = ctx.saved_tensors
        dyb = bf16(dy)
        dx = dyb @ wb
        dx = bf16(dx) if ROUND_OUTPUTS else dx
        dw = dyb.reshape(-1, dyb.shape[-1]).t() @ xb.reshape(-1, xb.shape[-1])
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db


def bf16_linear(x, w, b=None):
    return Bf16Matmul.apply(x, w, b)


def lr_at(i):  # iteration i (0-based) of GPT-NeoX's AnnealingLR: warmup 10% of 20, then cosine
    warm = 0.1 * STEPS
    if i <= warm:
        return LR * i / warm
    t = min(i, STEPS - warm) - warm
    return LR / 2 * (math.cos(math.pi * t / STEPS) + 1)


def run(seed, bf16, data):
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=NH,
                        intermediate_size=4 * C, rotary_pct=0.5, max_position_embeddings=T, use_parallel_residual=True,
                        hidden_dropout=0.1, attention_dropout=0.1, tie_word_embeddings=False, hidden_act="gelu")
    model = GPTNeoXForCausalLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    linear = F.linear
    if bf16:
        F.linear = bf16_linear
    torch.manual_seed(seed + 1)  # the same dropout masks in both runs
    losses, norms = [], []
    try:
        for step in range(STEPS):
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            total = 0.0
            for k in range(ACCUM):
                batch = data[(step * ACCUM + k) * MICRO:(step * ACCUM + k + 1) * MICRO]
                out = model(input_ids=batch[:, :-1], labels=batch[:, :-1])
                logits = out.logits.float()
                loss = F.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))
                (loss / ACCUM).backward()
                total += loss.item() / ACCUM
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(total)
            norms.append(norm.item())
    finally:
        F.linear = linear
    return losses, norms


def measure(seeds):
    words = ["the", "king", "queen", "sword", "crown", "night", "day", "love", "war", "speak", "thou", "art"]
    worst_loss = worst_norm = 0.0
    for seed in range(seeds):
        rnd = random.Random(seed)
        text = " ".join(rnd.choice(words) for _ in range(STEPS * ACCUM * MICRO * (T + 1)))
        ids = torch.tensor([ord(ch) for ch in text[:STEPS * ACCUM * MICRO * (T + 1)]]).reshape(-1, T + 1)
        a, b = run(seed, False, ids), run(seed, True, ids)
        dl = max(abs(x - y) / abs(x) for x, y in zip(a[0], b[0]))
        dn = max(abs(x - y) / abs(x) for x, y in zip(a[1], b[1]))
        worst_loss, worst_norm = max(worst_loss, dl), max(worst_norm, dn)
        print(f"seed {seed}: losses {a[0][0]:.4f} -> {a[0][-1]:.4f}; max relative difference bf16 vs fp32: "
              f"loss {dl:.2e}, grad norm {dn:.2e}")
    print(f"over {seeds} seeds: loss {worst_loss:.2e}, grad norm {worst_norm:.2e}")


def main():
    global ROUND_OUTPUTS
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for ROUND_OUTPUTS in (False, True):
        print(f"# bf16 operands{', bf16 results' if ROUND_OUTPUTS else ', fp32 results'}")
        measure(seeds)


if __name__ == "__main__":
    main()
