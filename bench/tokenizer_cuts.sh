#!/usr/bin/env bash
# bench/tokenizer_cuts.sh: neox.c on Tiny Shakespeare (one 1.1 MB document) at 1 and 2 threads,
# the document cut into pieces (lib/tokenizer/cut.c) against encoded whole, in interleaved rounds;
# prints the medians: MB/s (1 thread in CPU time, 2 threads on the wall clock), the 2-thread
# ratio cut / whole (the same load hits both), and the speed-up on idle cores that the schedule of
# the pieces gives (bench/tokenizers_bench.c's SCHEDULE).
# Usage: bench/tokenizer_cuts.sh [ROUNDS]   (default 15). Needs `make`.
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
ROUNDS=${1:-15}
TEXT=../shared/data/text/tinyshakespeare_input.txt
[ -f build/cpu/libneox.a ] || { echo "bench/tokenizer_cuts.sh: build/cpu/libneox.a is missing (run 'make')" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-tokcuts.XXXXXX")
trap 'rm -rf "$work"' EXIT
PKGS="yaml-0.1 jansson libutf8proc libpcre2-8 sentencepiece libzstd zlib hdf5 openblas mpich"
gcc -std=c11 -D_GNU_SOURCE -O3 -march=x86-64-v2 -fopenmp -I. -Ilib $(pkg-config --cflags $PKGS) \
    bench/tokenizers_bench.c build/cpu/libneox.a $(pkg-config --libs $PKGS) -lstdc++ -lm -lpthread -o "$work/driver"
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for tok in "GPT2BPETokenizer ../shared/data/tokenizers/gpt2/vocab.json ../shared/data/tokenizers/gpt2/merges.txt" \
           "HFTokenizer ../shared/data/tokenizers/neox/20B_tokenizer.json -"; do
  : >"$work/cut"; : >"$work/whole"; : >"$work/one"; : >"$work/ratio"
  for _ in $(seq "$ROUNDS"); do
    cut=$(NEOX_BENCH_WHOLE=0 "$work/driver" "$TEXT" $tok 1 2)
    whole=$(NEOX_BENCH_WHOLE=1 "$work/driver" "$TEXT" $tok 2)
    awk '$2 == 1 {print $3}' <<<"$cut" >>"$work/one"
    awk '$2 == 2 {print $3, $6}' <<<"$cut" >>"$work/cut"
    awk '{print $3}' <<<"$whole" >>"$work/whole"
    paste <(awk '$2 == 2 {print $3}' <<<"$cut") <(awk '{print $3}' <<<"$whole") | awk '{print $1 / $2}' >>"$work/ratio"
  done
  printf "%-17s 1 thread %6.1f MB/s | 2 threads: cut %6.1f MB/s, whole %6.1f MB/s, cut/whole %.2fx | schedule of the pieces on 2 idle cores %.2fx\n" \
    "${tok%% *}" "$(median <"$work/one")" "$(cut -d' ' -f1 "$work/cut" | median)" "$(median <"$work/whole")" \
    "$(median <"$work/ratio")" "$(cut -d' ' -f2 "$work/cut" | median)"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
