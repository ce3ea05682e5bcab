#!/usr/bin/env bash
# bench/generate.sh: greedy generation speed of neox.c against llama.cpp (F32) on the same weights: a
# Llama of SmolLM2-135M's shape with random weights made by transformers (bench/llama_model.py),
# imported with `neox-convert from-hf` and converted to an F32 GGUF by llama.cpp's own
# convert_hf_to_gguf.py. Both generate `tokens` tokens greedily after the same prompt with the
# same thread count; the runs alternate, `rounds` times each, so that other work on the machine
# weighs on both alike. Compared: generated tokens per second, model loading excluded. neox.c's is
# the figure `neox-eval generate` reports (all the tokens over the time from the prompt's pass to
# the last token: the prompt's pass makes the first token); llama.cpp's is llama-completion's
# "eval time" line (the one-token passes after the prompt's, sampling included). Prints each
# round, the medians and their ratio, and how many of the first greedy tokens the two agree on.
# Needs `make`, `make deps` (.venv), ../shared/data and bench/llama_cpp.sh's build (run here if
# missing; NEOX_BENCH_PEERS names its folder as there).
# Usage: bench/generate.sh [key=value...]  keys: threads tokens rounds layers
#        (defaults: threads=2 tokens=128 rounds=3 layers=30)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
DATA=../shared/data
[ -x .venv/bin/python ] || { echo "bench/generate.sh: .venv is missing (run 'make deps')" >&2; exit 1; }
declare -A opt=([threads]=2 [tokens]=128 [rounds]=3 [layers]=30)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/generate.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
LLAMA=$(bench/llama_cpp.sh | tail -1)
export OMP_NUM_THREADS=${opt[threads]} OPENBLAS_NUM_THREADS=${opt[threads]}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-genbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
BIN=build/cpu/bin
PROMPT="The king is"

.venv/bin/python bench/llama_model.py $DATA/tokenizers/gpt2 "$work/hf" ${opt[layers]} 2>/dev/null
$BIN/neox-convert from-hf --input "$work/hf" --output "$work/neox" >/dev/null 2>&1
"$LLAMA/venv/bin/python" "$LLAMA/convert_hf_to_gguf.py" "$work/hf" --outtype f32 --outfile "$work/model.gguf" \
    >"$work/convert.log" 2>&1 || { tail -20 "$work/convert.log" >&2; exit 1; }
echo "$PROMPT" >"$work/prompt.txt"

neox() {  # tokens/s; the completion into $work/neox.txt
    $BIN/neox-eval generate "$work/neox/model.yml" "$work/neox/run.yml" --text-gen-type input-file \
        --sample-input-file "$work/prompt.txt" --sample-output-file "$work/neox.jsonl" \
        --maximum-tokens ${opt[tokens]} 2>"$work/neox.log" || { cat "$work/neox.log" >&2; exit 1; }
    .venv/bin/python -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["text"], end="")' \
        "$work/neox.jsonl" >"$work/neox.txt"
    sed -n 's/.*: \([0-9.]*\) tokens\/s.*/\1/p' "$work/neox.log" | tail -1
}
llama() {  # tokens/s; the completion into $work/llama.txt
    "$LLAMA/bin/llama-completion" -m "$work/model.gguf" -p "$PROMPT" -n ${opt[tokens]} -t ${opt[threads]} \
        -tb ${opt[threads]} --temp 0 --top-k 1 -c 2048 -no-cnv --no-display-prompt --ignore-eos --no-warmup \
        </dev/null >"$work/llama.txt" 2>"$work/llama.log" || { tail -20 "$work/llama.log" >&2; exit 1; }
    sed -n 's/.* eval time .* runs .*, *\([0-9.]*\) tokens per second.*/\1/p' "$work/llama.log" | grep -v '^$' | tail -1
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "model: Llama, SmolLM2-135M shape, ${opt[layers]} layers, vocab 50304, fp32; prompt '$PROMPT';" \
     "${opt[tokens]} tokens; threads=${opt[threads]} OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
printf "%-6s %14s %14s %s\n" round "neox.c tok/s" "llama.cpp tok/s" load
ours=() theirs=()
for r in $(seq ${opt[rounds]}); do
    a=$(neox) b=$(llama)
    ours+=("$a") theirs+=("$b")
    printf "%-6s %14s %14s %s\n" "$r" "$a" "$b" "$(cut -d' ' -f1-3 /proc/loadavg)"
done
mo=$(median "${ours[@]}") mt=$(median "${theirs[@]}")
printf "%-6s %14s %14s  ratio neox.c/llama.cpp %.2fx\n" median "$mo" "$mt" "$(python3 -c "print($mo / $mt)")"
# The same greedy tokens? Both texts through the GPT-2 tokenizer, the leading ids compared.
.venv/bin/python - "$work/neox.txt" "$work/llama.txt" "$DATA/tokenizers/gpt2/gpt2_tokenizer.json" <<'PY'
import sys, tokenizers
tok = tokenizers.Tokenizer.from_file(sys.argv[3])
a, b = (tok.encode(open(p, encoding="utf-8", errors="replace").read()).ids for p in sys.argv[1:3])
same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"greedy tokens: the first {same} of {len(a)} (neox.c) / {len(b)} (llama.cpp) agree")
PY
