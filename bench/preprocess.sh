#!/usr/bin/env bash
# bench/preprocess.sh: neox-preprocess against a Python pipeline equivalent to GPT-NeoX's
# preprocess_data.py (bench/preprocess_python.py: HF tokenizers + multiprocessing pool + numpy
# writer), on the same corpus in the same run, at 1 and 2 workers; prints docs/s, MB/s, the
# ratio, and neox.c's scaling from 1 to 2 workers. Both outputs are compared byte for byte.
#   bench/preprocess.sh [REPEATS]   (the 697-document dolma sample, listed REPEATS times; default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
REPEATS=${1:-8}
DATA=../shared/data
CORPUS=$DATA/jsonl/dolma_cc_sample_697docs.jsonl.zst
TOK=$DATA/tokenizers/neox/20B_tokenizer.json
[ -f "$CORPUS" ] && [ -f "$TOK" ] || { echo "bench: $CORPUS or $TOK is absent" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo "bench: .venv is missing (make deps)" >&2; exit 1; }
INPUT=$(printf "$CORPUS%.0s," $(seq "$REPEATS")); INPUT=${INPUT%,}
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT

now() { date +%s.%N; }
declare -A SEC
for w in 1 2; do
  t0=$(now)
  NEOX_PROGRESS_SECONDS=1000 build/cpu/bin/neox-preprocess --input "$INPUT" --output-prefix "$OUT/neox$w" \
    --tokenizer-type HFTokenizer --vocab-file "$TOK" --append-eod --workers $w 2>"$OUT/log"
  SEC[neox$w]=$(echo "$(now) - $t0" | bc -l)
  t0=$(now)
  line=$(.venv/bin/python bench/preprocess_python.py --input "$INPUT" --tokenizer "$TOK" --output-prefix "$OUT/py$w" --workers $w)
  SEC[py$w]=$(echo "$(now) - $t0" | bc -l)
  cmp -s "$OUT/neox${w}_text_document.bin" "$OUT/py$w.bin" && cmp -s "$OUT/neox${w}_text_document.idx" "$OUT/py$w.idx" \
    || { echo "bench: outputs differ at $w workers" >&2; exit 1; }
done
docs=$(sed 's/.*docs=\([0-9]*\).*/\1/' <<<"$line"); bytes=$(sed 's/.*bytes=\([0-9]*\).*/\1/' <<<"$line")
echo "corpus: $REPEATS x $(basename "$CORPUS"): $docs documents, $(echo "scale=1; $bytes / 1000000" | bc) MB of text; outputs identical"
printf "%-34s %8s %10s %8s\n" "pipeline" "seconds" "docs/s" "MB/s"
for k in py1 neox1 py2 neox2; do
  name=$([ "${k:0:2}" = py ] && echo "python (GPT-NeoX style)" || echo "neox-preprocess")
  printf "%-34s %8.2f %10.0f %8.2f\n" "$name, ${k: -1} worker(s)" "${SEC[$k]}" \
    "$(echo "$docs / ${SEC[$k]}" | bc -l)" "$(echo "$bytes / 1000000 / ${SEC[$k]}" | bc -l)"
done
printf "ratio neox/python at 1 worker:  %.2fx\n" "$(echo "${SEC[py1]} / ${SEC[neox1]}" | bc -l)"
printf "ratio neox/python at 2 workers: %.2fx\n" "$(echo "${SEC[py2]} / ${SEC[neox2]}" | bc -l)"
printf "neox-preprocess scaling 1 -> 2 workers: %.2fx\n" "$(echo "${SEC[neox1]} / ${SEC[neox2]}" | bc -l)"
