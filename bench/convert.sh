#!/usr/bin/env bash
# bench/convert.sh: neox-convert throughput against `cp` of the same bytes on the same disk, in one
# run. A random GPT-NeoX model (bench/convert_model.py; default hidden 768, 6 layers, vocabulary
# 50304: ~120M parameters, 480 MB fp32) is imported (from-hf), resharded tp1 -> tp2 + pp2 and back,
# and exported (to-hf); each is timed against `cp` of its input files. Goal: within 2x of cp.
# Each is run REPEATS times (default 3) and the fastest run counts (the disk is shared and noisy).
#   bench/convert.sh [HIDDEN LAYERS VOCAB [REPEATS]]
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
HIDDEN=${1:-768} LAYERS=${2:-6} VOCAB=${3:-50304} REPEATS=${4:-3}
[ -x .venv/bin/python ] || { echo "bench: .venv is missing (make deps)" >&2; exit 1; }
CONVERT=build/cpu/bin/neox-convert
OUT=$(mktemp -d "${TMPDIR:-/tmp}/neox-bench-convert.XXXXXX"); trap 'rm -rf "$OUT"' EXIT
mkdir "$OUT/hf"
.venv/bin/python bench/convert_model.py "$OUT/hf" "$HIDDEN" "$LAYERS" "$VOCAB"

now() { date +%s.%N; }
# timed NAME OUTPUT CMD...: runs CMD (writing OUTPUT) REPEATS times, each followed by sync; records
# the fastest in SEC[NAME].
declare -A SEC
timed() {
    local name=$1 output=$2 t0 t best=; shift 2
    for _ in $(seq "$REPEATS"); do
        rm -rf "$output"; sync
        t0=$(now); NEOX_PROGRESS_SECONDS=1000 "$@" 2>/dev/null; sync; t=$(echo "$(now) - $t0" | bc -l)
        if [ -z "$best" ] || [ "$(echo "$t < $best" | bc -l)" = 1 ]; then best=$t; fi
    done
    SEC[$name]=$best
}
bytes() { du -sb "$1" | cut -f1; }
report() {  # report NAME COPY BYTES
    printf "%-26s %8.3f s  %8.1f MB/s   cp of the same bytes %8.3f s   ratio %.2fx\n" "$1" "${SEC[$1]}" \
        "$(echo "$3 / ${SEC[$1]} / 1000000" | bc -l)" "${SEC[$2]}" "$(echo "${SEC[$1]} / ${SEC[$2]}" | bc -l)"
}

cat "$OUT/hf/model.safetensors" >/dev/null  # the same warm page cache for every reader
timed cp_hf "$OUT/hf_copy" cp -r "$OUT/hf" "$OUT/hf_copy"
timed from_hf "$OUT/ckpt" $CONVERT from-hf --input "$OUT/hf" --output "$OUT/ckpt"
timed cp_ckpt "$OUT/ckpt_copy" cp -r "$OUT/ckpt/global_step0" "$OUT/ckpt_copy"
timed reshard "$OUT/tp2pp2" $CONVERT reshard --input "$OUT/ckpt" --output "$OUT/tp2pp2" --tp 2 --pp 2
timed cp_tp2pp2 "$OUT/tp2pp2_copy" cp -r "$OUT/tp2pp2/global_step0" "$OUT/tp2pp2_copy"
timed reshard_back "$OUT/tp1" $CONVERT reshard --input "$OUT/tp2pp2" --output "$OUT/tp1"
timed to_hf "$OUT/export" $CONVERT to-hf --input "$OUT/ckpt" --output "$OUT/export"
cmp "$OUT/hf/model.safetensors" "$OUT/export/model.safetensors" >/dev/null 2>&1 \
    || .venv/bin/python -c "
import sys; from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), 'export differs from the import'" \
    "$OUT/hf/model.safetensors" "$OUT/export/model.safetensors"

echo "neox-convert vs cp, $(( $(bytes "$OUT/hf/model.safetensors") / 1000000 )) MB of fp32 parameters ($(nproc) cores, best of $REPEATS)"
report from_hf cp_hf "$(bytes "$OUT/hf")"
report reshard cp_ckpt "$(bytes "$OUT/ckpt/global_step0")"
report reshard_back cp_tp2pp2 "$(bytes "$OUT/tp2pp2/global_step0")"
report to_hf cp_ckpt "$(bytes "$OUT/ckpt/global_step0")"
