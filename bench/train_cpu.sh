#!/usr/bin/env bash
# bench/train_cpu.sh: CPU training throughput of neox.c against PyTorch, and against OpenBLAS SGEMM,
# all measured in one run with the same thread count. Each round runs, one after the other:
#   1. OpenBLAS cblas_sgemm (its own threads) on the GEMMs of one training step (bench/train_sgemm.c)
#   2. neox.c: lib/model forward + backward + the AdamW kernel (bench/train_neox.c)
#   3. PyTorch: transformers' GPTNeoXForCausalLM + torch.optim.AdamW (bench/train_torch.py)
# on the same model (Pythia-70M's shape by default: 6 layers, hidden 512, 8 heads, vocabulary 50304,
# sequence 512, micro-batch 8) and prints tokens/s, the neox.c/PyTorch ratio and neox.c's model
# FLOP/s as a fraction of the SGEMM FLOP/s, per round and summarised as the median over the rounds
# and as best against best (on a shared machine other work slows each measurement differently),
# plus tokens per CPU second of each program, which other work disturbs much less.
# Model FLOPs per step = 6 * P_matmul * tokens + 12 * layers * seq * hidden * tokens, where P_matmul
# counts the weights that take part in matrix multiplies (every layer's QKV, output, MLP matrices
# and the output layer; not embeddings, biases or norms) and the second term is attention's
# q k^T and p v, forward and backward, over the full (T, T) (PaLM's convention).
# Needs `make` and `make deps` (.venv with torch and transformers).
# Usage: bench/train_cpu.sh [key=value...]  keys: threads rounds steps warmup layers hidden heads
#        vocab seq batch precision   (defaults: threads=2 rounds=3 steps=2 warmup=1 precision=fp32 and
#        the model above; precision=bfloat16: neox.c's precision bfloat16 against torch's CPU autocast)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x .venv/bin/python ] || { echo "bench/train_cpu.sh: .venv is missing (run 'make deps')" >&2; exit 1; }
[ -f build/cpu/libneox.a ] || { echo "bench/train_cpu.sh: build/cpu/libneox.a is missing (run 'make')" >&2; exit 1; }
declare -A opt=([threads]=2 [rounds]=3 [steps]=2 [warmup]=1 [layers]=6 [hidden]=512 [heads]=8 [vocab]=50304
                [seq]=512 [batch]=8 [precision]=fp32)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/train_cpu.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
model="layers=${opt[layers]} hidden=${opt[hidden]} vocab=${opt[vocab]} seq=${opt[seq]} batch=${opt[batch]} threads=${opt[threads]}"
train="$model heads=${opt[heads]} steps=${opt[steps]} warmup=${opt[warmup]}"
case ${opt[precision]} in
fp32) ;;
bfloat16) train="$train bf16=1" ;;
*) echo "bench/train_cpu.sh: precision must be fp32 or bfloat16" >&2; exit 2 ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/neox-trainbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
PKGS="yaml-0.1 jansson libutf8proc libzstd zlib hdf5 openblas mpich"
for prog in train_sgemm train_neox; do
    gcc -std=c11 -D_GNU_SOURCE -O3 -march=x86-64-v2 -fopenmp -I. -Ilib $(pkg-config --cflags $PKGS) \
        "bench/$prog.c" build/cpu/libneox.a $(pkg-config --libs $PKGS) -lm -lpthread -o "$work/$prog"
done

# One thread count for every pool: OpenMP (neox.c, torch), OpenBLAS's pthreads (SGEMM, torch's GEMMs).
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, when set, force an OpenBLAS kernel choice; leave it to
# OpenBLAS's detection here (the core it picked is printed).
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
export OMP_NUM_THREADS=${opt[threads]} OPENBLAS_NUM_THREADS=${opt[threads]}
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; threads ${opt[threads]}"
echo "# OpenBLAS: $(.venv/bin/python - <<'EOF'
import ctypes, ctypes.util
lib = ctypes.CDLL(ctypes.util.find_library("openblas") or "libopenblas.so.0")
for f in ("openblas_get_config", "openblas_get_corename"):
    getattr(lib, f).restype = ctypes.c_char_p
print(lib.openblas_get_config().decode(), "core", lib.openblas_get_corename().decode())
EOF
)"
echo "# model: $train"
for ((r = 1; r <= opt[rounds]; r++)); do
    echo "# round $r"
    "$work/train_sgemm" $model | tee -a "$work/sgemm.jsonl"
    "$work/train_neox" $train | tee -a "$work/neox.jsonl"
    .venv/bin/python bench/train_torch.py $train | tee -a "$work/torch.jsonl"
done

.venv/bin/python - "$work" ${opt[layers]} ${opt[hidden]} ${opt[vocab]} ${opt[seq]} ${opt[threads]} <<'EOF'
import json, statistics, sys
work, L, C, V, T, threads = sys.argv[1], *map(int, sys.argv[2:])
rows = lambda name: [json.loads(line) for line in open(f"{work}/{name}.jsonl")]
sgemm, neox, torch = rows("sgemm"), rows("neox"), rows("torch")
p_matmul = L * (3 * C * C + C * C + 2 * 4 * C * C) + V * C
flops_per_token = 6 * p_matmul + 12 * L * T * C
print(f"\nmodel FLOPs per token = 6 * {p_matmul} + 12 * {L} * {T} * {C} = {flops_per_token:.4e}")
print(f"{'round':>6} {'sgemm GFLOP/s':>14} {'neox tok/s':>11} {'torch tok/s':>12} {'ratio':>6} {'neox GFLOP/s':>13} {'of sgemm':>9}")
ratios, fractions = [], []
for i, (s, n, t) in enumerate(zip(sgemm, neox, torch), 1):
    g, sg = n["tokens_per_s"] * flops_per_token / 1e9, s["openblas"]["gflops_per_s"]
    ratios.append(n["tokens_per_s"] / t["tokens_per_s"])
    fractions.append(g / sg)
    print(f"{i:>6} {sg:>14.1f} {n['tokens_per_s']:>11.1f} {t['tokens_per_s']:>12.1f} {ratios[-1]:>6.2f} {g:>13.1f} "
          f"{fractions[-1]:>8.0%}")
best_s = max(r["openblas"]["gflops_per_s"] for r in sgemm)
best_n, best_t = max(r["tokens_per_s"] for r in neox), max(r["tokens_per_s"] for r in torch)
g = best_n * flops_per_token / 1e9
print(f"{'best':>6} {best_s:>14.1f} {best_n:>11.1f} {best_t:>12.1f} {best_n / best_t:>6.2f} {g:>13.1f} {g / best_s:>8.0%}")
# CPU-time view, much less sensitive to other work on the machine than wall time: tokens per CPU
# second of all the process's threads (busy-waiting included), times the thread count.
cpu_rate = lambda r: r["tokens_per_step"] * r["steps"] / r["cpu_s"] * threads
cpu_ratios = [cpu_rate(n) / cpu_rate(t) for n, t in zip(neox, torch)]
print(f"\ntokens per CPU second x {threads} threads: neox.c " + ", ".join(f"{cpu_rate(n):.1f}" for n in neox) +
      "; PyTorch " + ", ".join(f"{cpu_rate(t):.1f}" for t in torch) +
      f"; ratio median {statistics.median(cpu_ratios):.2f}x")
print(f"\nneox.c / PyTorch tokens/s: median of rounds {statistics.median(ratios):.2f}x, best vs best "
      f"{best_n / best_t:.2f}x (goal >= 1.5x)")
print(f"neox.c model FLOP/s / OpenBLAS SGEMM FLOP/s: median of rounds {statistics.median(fractions):.0%}, best vs best "
      f"{g / best_s:.0%} (goal >= 60%)")
EOF
