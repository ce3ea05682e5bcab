#!/usr/bin/env bash
# bench/gemm_bf16.sh: neox.c's bfloat16 matrix product (kernels/cpu/gemm_bf16.c, bench/gemm_bf16.c)
# beside torch's bf16 matmul (oneDNN; bench/gemm_bf16_torch.py, the newest PyPI torch of
# bench/peers_torch.sh) on the products of one training step of the model given (every linear layer's
# forward, input gradient and weight gradient), on one thread by default. Prints per product: the
# shape, neox.c's and torch's GFLOP per CPU second (the process's CPU time: other programs on a
# shared machine disturb it much less than wall time), neox.c's as a fraction of the vdpbf16ps peak
# measured on this core the same way (bench/gemm_bf16.c: 64 FLOPs per instruction, registers only),
# and the ratio neox.c / torch; then the whole step's mix (total FLOPs / total seconds).
# Usage: bench/gemm_bf16.sh [key=value...]  keys: threads hidden vocab tokens repeats
#        (defaults: threads=1 hidden=256 vocab=8192 tokens=1024 repeats=5; tokens = batch x seq)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -f build/cpu/libneox.a ] || { echo "bench/gemm_bf16.sh: build/cpu/libneox.a is missing (run 'make')" >&2; exit 1; }
declare -A opt=([threads]=1 [hidden]=256 [vocab]=8192 [tokens]=1024 [repeats]=5)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/gemm_bf16.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
peer_py=${NEOX_BENCH_PEERS:-build/bench-peers}/torch-venv/bin/python
[ -x "$peer_py" ] || bench/peers_torch.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-gemmbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
PKGS="yaml-0.1 jansson libutf8proc libzstd zlib hdf5 openblas mpich"
gcc -std=c11 -D_GNU_SOURCE -O3 -march=x86-64-v2 -fopenmp -I. -Ilib $(pkg-config --cflags $PKGS) \
    bench/gemm_bf16.c build/cpu/libneox.a $(pkg-config --libs $PKGS) -lm -lpthread -o "$work/gemm_bf16"
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; threads ${opt[threads]}"
# Passive waits for both programs: a thread spinning at the end of a product is CPU time neither
# product needs, and the process's CPU clock counts another thread's running time only up to its
# last tick or sleep, so with spinning workers a short product on 2 threads reads as up to twice the
# instruction's peak per CPU second. Asleep, every thread's time is counted.
export OMP_NUM_THREADS=${opt[threads]} OPENBLAS_NUM_THREADS=${opt[threads]} OMP_WAIT_POLICY=passive
keys="hidden=${opt[hidden]} vocab=${opt[vocab]} tokens=${opt[tokens]} repeats=${opt[repeats]}"
echo "# peer: $("$peer_py" -c 'import torch; print("torch", torch.__version__, "oneDNN", torch.backends.mkldnn.is_available())')"
echo "# start ($(uptime | sed 's/.*load/load/'))"
"$work/gemm_bf16" $keys > "$work/neox.jsonl"
"$peer_py" bench/gemm_bf16_torch.py $keys > "$work/torch.jsonl"
echo "# end ($(uptime | sed 's/.*load/load/'))"
python3 - "$work" <<'PY'
import json, sys
rows = lambda p: [json.loads(l) for l in open(p)]
neox, torch = rows(f"{sys.argv[1]}/neox.jsonl"), rows(f"{sys.argv[1]}/torch.jsonl")
peak = neox.pop(0)
print(f"vdpbf16ps peak on one thread: {peak['gflops_per_s']:.1f} GFLOP per CPU second; products on {peak['threads']} thread(s)")
print(f"{'product':<18} {'M':>6} {'N':>6} {'K':>6} {'neox GFLOP/s':>13} {'of peak':>8} {'torch GFLOP/s':>14} {'ratio':>6}")
flops = ns = ts = 0.0
for n, t in zip(neox, torch):
    assert n["name"] == t["name"]
    print(f"{n['name']:<18} {n['M']:>6} {n['N']:>6} {n['K']:>6} {n['gflops_per_s']:>13.1f} {n['of_peak']:>8.0%} "
          f"{t['gflops_per_s']:>14.1f} {n['gflops_per_s'] / t['gflops_per_s']:>6.2f}")
    flops += 2.0 * n["M"] * n["N"] * n["K"]
    ns, ts = ns + n["s"], ts + t["s"]
print(f"{'step mix':<18} {'':>6} {'':>6} {'':>6} {flops / ns / 1e9:>13.1f} {flops / ns / 1e9 / peak['gflops_per_s']:>8.0%} "
      f"{flops / ts / 1e9:>14.1f} {ts / ns:>6.2f}")
PY
