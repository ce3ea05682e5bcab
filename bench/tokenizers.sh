#!/usr/bin/env bash
# bench/tokenizers.sh: neox.c's tokenizers against HF `tokenizers` and `tiktoken` on the same
# corpora (every text in ../shared/data; Tiny Shakespeare alone), each peer called per document
# and through its batch API on its own threads, at 1 and 2 threads (bench/tokenizers_bench.py); then
# the other tokenizer kinds (tokenizer.json families, tiktoken, SentencePiece) against their
# references' batch APIs at 1 and 2 threads (bench/tokenizer_families_bench.py).
# Prints MB/s and ratios. Needs `make` and `make deps` (.venv). Usage: bench/tokenizers.sh [THREADS...]
# NEOX_BENCH_ROUNDS (default 2): interleaved rounds per corpus; NEOX_BENCH_FAMILIES=0 skips the other kinds.
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x .venv/bin/python ] || { echo "bench/tokenizers.sh: .venv is missing (run 'make deps')" >&2; exit 1; }
[ -f build/cpu/libneox.a ] || { echo "bench/tokenizers.sh: build/cpu/libneox.a is missing (run 'make')" >&2; exit 1; }
threads=("$@"); [ ${#threads[@]} -eq 0 ] && threads=(1 2)
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-tokbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
PKGS="yaml-0.1 jansson libutf8proc libpcre2-8 sentencepiece libzstd zlib hdf5 openblas mpich"
gcc -std=c11 -D_GNU_SOURCE -O3 -march=x86-64-v2 -fopenmp -I. -Ilib $(pkg-config --cflags $PKGS) \
    bench/tokenizers_bench.c build/cpu/libneox.a $(pkg-config --libs $PKGS) -lstdc++ -lm -lpthread -o "$work/driver"
.venv/bin/python bench/tokenizers_bench.py "$work/driver" "$work" "${threads[@]}"
# The other kinds against their references' batch APIs, at 1 and 2 threads (their own thread pools).
[ "${NEOX_BENCH_FAMILIES:-1}" = 0 ] || .venv/bin/python bench/tokenizer_families_bench.py "$work/driver" "$work" 1 2
