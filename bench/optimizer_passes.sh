#!/usr/bin/env bash
# bench/optimizer_passes.sh: each optimizer's update time per parameter against AdamW's on this CPU
# (bench/optimizer_types.c: lib/optim through the CPU backend, the way neox-train steps it), after
# the line naming the CPU. Memory-bound passes: the ratio follows the bytes each reads and writes
# per parameter (AdamW 7 floats, SGD with momentum 5, Lion 5, madgrad_wd with momentum 8, SM3 4 and
# with momentum 6: its accumulators are a row's and a column's, which stay in cache) and the
# arithmetic (madgrad_wd's two cube roots, SM3's square root and division).
# Usage: bench/optimizer_passes.sh [n=162322944] [rounds=5] [threads=2]
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -f build/cpu/libneox.a ] || { echo "bench/optimizer_passes.sh: build/cpu/libneox.a is missing (run 'make')" >&2; exit 1; }
declare -A opt=([n]=162322944 [rounds]=5 [threads]=2)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/optimizer_passes.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-optbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
PKGS="yaml-0.1 jansson libutf8proc libzstd zlib hdf5 openblas mpich"
gcc -std=c11 -D_GNU_SOURCE -O3 -march=x86-64-v2 -fopenmp -I. -Ilib $(pkg-config --cflags $PKGS) \
    bench/optimizer_types.c build/cpu/libneox.a $(pkg-config --libs $PKGS) -lm -lpthread -o "$work/optimizer_types"
OMP_NUM_THREADS=${opt[threads]} OMP_WAIT_POLICY=passive "$work/optimizer_types" "${opt[n]}" "${opt[rounds]}"
