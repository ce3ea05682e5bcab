#!/usr/bin/env bash
# bench/train_cpu.sh: CPU training throughput of neox.c against PyTorch, and against OpenBLAS SGEMM,
# all measured in one run with the same thread count. Each round runs, one after the other:
#   1. OpenBLAS cblas_sgemm (its own threads) on the GEMMs of one training step (bench/train_sgemm.c)
#   2. neox.c: lib/model forward + backward + the AdamW kernel (bench/train_neox.c)
#   3. PyTorch: transformers' GPTNeoXForCausalLM + torch.optim.AdamW (bench/train_torch.py), once
#      per variant of the peer (below)
# on the same model (Pythia-70M's shape by default: 6 layers, hidden 512, 8 heads, vocabulary 50304,
# sequence 512, micro-batch 8) and prints tokens/s, the neox.c/PyTorch ratio and neox.c's model
# FLOP/s as a fraction of the SGEMM FLOP/s, per round and summarised as the median over the rounds
# and as best against best (on a shared machine other work slows each measurement differently),
# plus tokens per CPU second of each program, which other work disturbs much less.
# The peer: peer=torch1 (default) is .venv's torch (Debian's 1.13) in eager mode, bfloat16 through
# CPU autocast. peer=torch2 is the newest PyPI torch of bench/peers_torch.sh (set up on first use in
# ${NEOX_BENCH_PEERS:-build/bench-peers}/torch-venv) with torch.compile of the forward and loss
# (the backward compiled from it) and AdamW as adamw= says (default fused); under precision=bfloat16
# it runs two variants, autocast over fp32 weights and pure bfloat16 weights, and the summary
# compares neox.c with the faster of them. Compilation happens in the peer's warm-up steps
# (peer_warmup, default 1 for torch1 and 2 for torch2), which are not timed.
# Model FLOPs per step = 6 * P_matmul * tokens + 12 * layers * seq * hidden * tokens, where P_matmul
# counts the weights that take part in matrix multiplies (every layer's QKV, output, MLP matrices
# and the output layer; not embeddings, biases or norms) and the second term is attention's
# q k^T and p v, forward and backward, over the full (T, T) (PaLM's convention).
# Needs `make` and `make deps` (.venv with torch and transformers).
# Usage: bench/train_cpu.sh [key=value...]  keys: threads rounds steps warmup layers hidden heads
#        vocab seq batch precision peer peer_warmup adamw   (defaults: threads=2 rounds=3 steps=2
#        warmup=1 precision=fp32 peer=torch1 and the model above; precision=bfloat16: neox.c's
#        precision bfloat16 against the peer's bfloat16 training; adamw=default|foreach|fused|compiled
#        only with peer=torch2)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x .venv/bin/python ] || { echo "bench/train_cpu.sh: .venv is missing (run 'make deps')" >&2; exit 1; }
[ -f build/cpu/libneox.a ] || { echo "bench/train_cpu.sh: build/cpu/libneox.a is missing (run 'make')" >&2; exit 1; }
declare -A opt=([threads]=2 [rounds]=3 [steps]=2 [warmup]=1 [layers]=6 [hidden]=512 [heads]=8 [vocab]=50304
                [seq]=512 [batch]=8 [precision]=fp32 [peer]=torch1 [peer_warmup]= [adamw]=)
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

# The peer's Python and its variants: name -> train_torch.py keys beyond the model's.
declare -A variants=()
case ${opt[peer]} in
torch1)
    [ -z "${opt[adamw]}" ] || { echo "bench/train_cpu.sh: adamw= needs peer=torch2" >&2; exit 2; }
    peer_py=.venv/bin/python
    variants[eager]="warmup=${opt[peer_warmup]:-1} bf16=$([ "${opt[precision]}" = bfloat16 ] && echo 1 || echo 0)" ;;
torch2)
    peer_py=${NEOX_BENCH_PEERS:-build/bench-peers}/torch-venv/bin/python
    [ -x "$peer_py" ] || bench/peers_torch.sh
    compiled="compile=1 adamw=${opt[adamw]:-fused} warmup=${opt[peer_warmup]:-2}"
    if [ "${opt[precision]}" = bfloat16 ]; then
        variants[autocast]="$compiled bf16=1 weights=fp32"
        variants[bf16_weights]="$compiled bf16=0 weights=bf16"
    else
        variants[fp32]="$compiled bf16=0 weights=fp32"
    fi ;;
*) echo "bench/train_cpu.sh: peer must be torch1 or torch2" >&2; exit 2 ;;
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
echo "# peer: ${opt[peer]}, $("$peer_py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
echo "# model: $train"
# The peer takes its warm-up from its variant (compilation needs more steps than neox.c warms up for).
peer_train="$model heads=${opt[heads]} steps=${opt[steps]}"
for ((r = 1; r <= opt[rounds]; r++)); do
    echo "# round $r ($(uptime | sed 's/.*load/load/'))"
    "$work/train_sgemm" $model | tee -a "$work/sgemm.jsonl"
    "$work/train_neox" $train | tee -a "$work/neox.jsonl"
    for name in $(printf '%s\n' "${!variants[@]}" | sort); do
        echo -n "$name: "
        "$peer_py" bench/train_torch.py $peer_train ${variants[$name]} | tee -a "$work/torch-$name.jsonl"
    done
done
echo "# end ($(uptime | sed 's/.*load/load/'))"

.venv/bin/python - "$work" ${opt[layers]} ${opt[hidden]} ${opt[vocab]} ${opt[seq]} ${opt[threads]} <<'EOF'
import glob, json, os, statistics, sys
work, L, C, V, T, threads = sys.argv[1], *map(int, sys.argv[2:])
rows = lambda path: [json.loads(line) for line in open(path)]
sgemm, neox = rows(f"{work}/sgemm.jsonl"), rows(f"{work}/neox.jsonl")
peers = {os.path.basename(p)[len("torch-"):-len(".jsonl")]: rows(p) for p in sorted(glob.glob(f"{work}/torch-*.jsonl"))}
p_matmul = L * (3 * C * C + C * C + 2 * 4 * C * C) + V * C
flops_per_token = 6 * p_matmul + 12 * L * T * C
# CPU-time view, much less sensitive to other work on the machine than wall time: tokens per CPU
# second of all the process's threads (busy-waiting included), times the thread count.
cpu_rate = lambda r: r["tokens_per_step"] * r["steps"] / r["cpu_s"] * threads
median = statistics.median
print(f"\nmodel FLOPs per token = 6 * {p_matmul} + 12 * {L} * {T} * {C} = {flops_per_token:.4e}")
print(f"{'round':>6} {'sgemm GFLOP/s':>14} {'neox tok/s':>11} " + " ".join(f"{name + ' tok/s':>20} {'ratio':>6}" for name in peers)
      + f" {'neox GFLOP/s':>13} {'of sgemm':>9}")
fractions = []
for i, (s, n) in enumerate(zip(sgemm, neox)):
    g, sg = n["tokens_per_s"] * flops_per_token / 1e9, s["openblas"]["gflops_per_s"]
    fractions.append(g / sg)
    cells = " ".join(f"{t[i]['tokens_per_s']:>20.1f} {n['tokens_per_s'] / t[i]['tokens_per_s']:>6.2f}" for t in peers.values())
    print(f"{i + 1:>6} {sg:>14.1f} {n['tokens_per_s']:>11.1f} {cells} {g:>13.1f} {fractions[-1]:>8.0%}")
best_s, best_n = max(r["openblas"]["gflops_per_s"] for r in sgemm), max(r["tokens_per_s"] for r in neox)
g = best_n * flops_per_token / 1e9
cells = " ".join(f"{max(r['tokens_per_s'] for r in t):>20.1f} {best_n / max(r['tokens_per_s'] for r in t):>6.2f}"
                 for t in peers.values())
print(f"{'best':>6} {best_s:>14.1f} {best_n:>11.1f} {cells} {g:>13.1f} {g / best_s:>8.0%}")
print(f"\nneox.c: tokens/s median {median(r['tokens_per_s'] for r in neox):.1f}; tokens per CPU second x {threads} threads "
      + ", ".join(f"{cpu_rate(n):.1f}" for n in neox) + f" (median {median(map(cpu_rate, neox)):.1f}); "
      f"forward {median(r['forward_s'] for r in neox):.2f} s, backward {median(r['backward_s'] for r in neox):.2f} s, "
      f"AdamW {median(r['adamw_s'] for r in neox):.2f} s (medians); losses {neox[0]['first_loss']} -> {neox[0]['last_loss']}")
summary = {}
for name, t in peers.items():
    wall = [n["tokens_per_s"] / r["tokens_per_s"] for n, r in zip(neox, t)]
    cpu = [cpu_rate(n) / cpu_rate(r) for n, r in zip(neox, t)]
    summary[name] = (median(cpu), median(wall))
    print(f"{name} (torch {t[0]['torch']}, compile {t[0].get('compile', False)}, adamw {t[0].get('adamw', 'default')}, "
          f"weights {t[0].get('weights', 'fp32')}): tokens/s median {median(r['tokens_per_s'] for r in t):.1f}; "
          f"tokens per CPU second x {threads} threads " + ", ".join(f"{cpu_rate(r):.1f}" for r in t)
          + f" (median {median(map(cpu_rate, t)):.1f}); forward {median(r['forward_s'] for r in t):.2f} s, "
          f"backward {median(r['backward_s'] for r in t):.2f} s, AdamW {median(r['adamw_s'] for r in t):.2f} s; "
          f"warm-up steps {[r.get('warmup_step_s') for r in t]} s; losses {t[0]['first_loss']} -> {t[0]['last_loss']}")
    print(f"  neox.c / {name}: tokens per CPU second, median of rounds {summary[name][0]:.2f}x; tokens/s, median of rounds "
          f"{summary[name][1]:.2f}x, best vs best {best_n / max(r['tokens_per_s'] for r in t):.2f}x")
# The peer's faster variant is the one with more tokens per CPU second (the measure other work
# disturbs least); the headline compares neox.c with it.
fastest = min(summary, key=lambda name: summary[name][0])
print(f"\nneox.c / PyTorch ({fastest}, the faster variant): tokens per CPU second {summary[fastest][0]:.2f}x, "
      f"tokens/s {summary[fastest][1]:.2f}x (medians of rounds; goal >= 1.5x)")
print(f"neox.c model FLOP/s / OpenBLAS SGEMM FLOP/s: median of rounds {median(fractions):.0%}, best vs best "
      f"{g / best_s:.0%} (goal >= 60%)")
EOF
