# bench/gemm_bf16_torch.py: the peer side of bench/gemm_bf16.sh. torch's bfloat16 matmul (oneDNN on
# an AVX512_BF16 CPU) on the products bench/gemm_bf16.c times, in the same order and with the same
# shapes and transposes (a transposed operand is a transposed view, as autograd hands it over; the
# forward is F.linear with the layer's bias, as bench/gemm_bf16.c adds it; the weight gradient accumulates into fp32 as neox.c's does: a
# bf16 product widened and added), best of `repeats` after one warm-up, on torch.get_num_threads();
# times are the process's CPU seconds, as bench/gemm_bf16.c takes them.
# Prints one JSON line per product.
#   python bench/gemm_bf16_torch.py key=value...   keys: hidden vocab tokens repeats
import json, sys, time

import torch

opt = {"hidden": 256, "vocab": 8192, "tokens": 1024, "repeats": 5}
for arg in sys.argv[1:]:
    key, _, value = arg.partition("=")
    if key not in opt or not value:
        sys.exit(f"gemm_bf16_torch.py: bad argument '{arg}' (keys: {' '.join(opt)})")
    opt[key] = int(value)
C, V, T, repeats = opt["hidden"], opt["vocab"], opt["tokens"], opt["repeats"]
torch.manual_seed(0)
rnd = lambda *shape: (torch.rand(*shape) / 64).to(torch.bfloat16)


def timed(f):
    f()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        f()
        best = min(best, time.process_time() - t0)
    return best


for name, fan_in, fan_out in (("qkv", C, 3 * C), ("attn_out", C, C), ("mlp_up", C, 4 * C), ("mlp_down", 4 * C, C),
                              ("logits", C, V)):
    x, w, dy = rnd(T, fan_in), rnd(fan_out, fan_in), rnd(T, fan_out)
    b = None if name == "logits" else rnd(fan_out)  # every layer but the output layer has a bias
    dw = torch.zeros(fan_out, fan_in)
    products = {
        "forward": (T, fan_out, fan_in, lambda: torch.nn.functional.linear(x, w, b)),
        "dinput": (T, fan_in, fan_out, lambda: torch.matmul(dy, w)),
        "dweight": (fan_out, fan_in, T, lambda: dw.add_(torch.matmul(dy.t(), x))),
    }
    for p, (M, N, K, f) in products.items():
        s = timed(f)
        print(json.dumps({"name": f"{name}.{p}", "M": M, "N": N, "K": K, "s": round(s, 6),
                          "gflops_per_s": round(2 * M * N * K / s / 1e9, 1)}), flush=True)
