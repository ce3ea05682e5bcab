#!/usr/bin/env bash
# bench/generate.sh: greedy generation speed of neox.c (fp32 and bfloat16 weights) against llama.cpp
# (F32 and Q4_1) and transformers (fp32) on the same weights: a Llama of SmolLM2-135M's shape with
# random weights made by transformers (bench/llama_model.py), imported with `neox-convert from-hf`,
# converted to an F32 GGUF by llama.cpp's own convert_hf_to_gguf.py and quantized to Q4_1 by its
# llama-quantize. Each generates `tokens` tokens greedily after the same prompt with the same
# thread count, each at its own best settings: neox.c and llama.cpp with their default OpenMP
# threading and wait policy (no OMP_WAIT_POLICY: a passive wait slowed llama.cpp 1.6-2.9x),
# transformers with torch.set_num_threads(threads) and inference_mode. The five runs alternate,
# `rounds` times each, so that other work on the machine weighs on all alike. Reported per side:
# generated tokens per second (model loading excluded) and the weight bytes a token streams times
# that rate (bytes/s: the model's weights, fp32 4 bytes each, bfloat16 2, a GGUF its file's size).
# neox.c's figure is the one `neox-eval generate` reports (all the tokens over the time from the
# prompt's pass to the last token); llama.cpp's is llama-completion's "eval time" line (the
# one-token passes after the prompt's, sampling included); transformers' all the tokens over
# generate()'s time. Prints each round, the medians, the ratios to llama.cpp F32, and how many of the
# first greedy tokens neox.c fp32 and llama.cpp F32 agree on; then neox-eval serve's throughput at 1, 4
# and 16 concurrent requests (bench/serve_load.py), fp32 and bfloat16.
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
unset OMP_WAIT_POLICY GOMP_SPINCOUNT
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-genbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
BIN=build/cpu/bin
PROMPT="The king is"

.venv/bin/python bench/llama_model.py $DATA/tokenizers/gpt2 "$work/hf" ${opt[layers]} 2>/dev/null
$BIN/neox-convert from-hf --input "$work/hf" --output "$work/neox" >/dev/null 2>&1
"$LLAMA/venv/bin/python" "$LLAMA/convert_hf_to_gguf.py" "$work/hf" --outtype f32 --outfile "$work/f32.gguf" \
    >"$work/convert.log" 2>&1 || { tail -20 "$work/convert.log" >&2; exit 1; }
"$LLAMA/bin/llama-quantize" "$work/f32.gguf" "$work/q4_1.gguf" Q4_1 >"$work/quantize.log" 2>&1 ||
    { tail -20 "$work/quantize.log" >&2; exit 1; }
echo "$PROMPT" >"$work/prompt.txt"
echo "precision: bfloat16" >"$work/bf16.yml"
PARAMS=$(.venv/bin/python -c 'import math, sys, safetensors; f = safetensors.safe_open(sys.argv[1], "np")
print(sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()))' "$work/hf/model.safetensors")
declare -A bytes=([neox_fp32]=$((PARAMS * 4)) [neox_bf16]=$((PARAMS * 2)) [llama_f32]=$(stat -c %s "$work/f32.gguf")
                  [llama_q4_1]=$(stat -c %s "$work/q4_1.gguf") [transformers]=$((PARAMS * 4)))

neox() {  # tokens/s; $1: fp32 or bf16; the fp32 completion into $work/neox.txt
    local extra=() out=$work/neox_$1.jsonl
    [ "$1" = bf16 ] && extra=("$work/bf16.yml")
    $BIN/neox-eval generate "$work/neox/model.yml" "$work/neox/run.yml" "${extra[@]}" --text-gen-type input-file \
        --sample-input-file "$work/prompt.txt" --sample-output-file "$out" \
        --maximum-tokens ${opt[tokens]} 2>"$work/neox.log" || { cat "$work/neox.log" >&2; exit 1; }
    [ "$1" = fp32 ] && .venv/bin/python -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["text"], end="")' \
        "$out" >"$work/neox.txt"
    sed -n 's/.*: \([0-9.]*\) tokens\/s.*/\1/p' "$work/neox.log" | tail -1
}
llama() {  # tokens/s; $1: the GGUF's name; the F32 completion into $work/llama.txt
    "$LLAMA/bin/llama-completion" -m "$work/$1.gguf" -p "$PROMPT" -n ${opt[tokens]} -t ${opt[threads]} \
        -tb ${opt[threads]} --temp 0 --top-k 1 -c 2048 -no-cnv --no-display-prompt --ignore-eos --no-warmup \
        </dev/null >"$work/llama_$1.txt" 2>"$work/llama.log" || { tail -20 "$work/llama.log" >&2; exit 1; }
    [ "$1" = f32 ] && cp "$work/llama_f32.txt" "$work/llama.txt"
    sed -n 's/.* eval time .* runs .*, *\([0-9.]*\) tokens per second.*/\1/p' "$work/llama.log" | grep -v '^$' | tail -1
}
transformers() {  # tokens/s
    .venv/bin/python bench/generate_transformers.py "$work/hf" "$PROMPT" ${opt[tokens]} ${opt[threads]} 2>"$work/hf.log" |
        head -1 || { tail -20 "$work/hf.log" >&2; exit 1; }
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
sides=(neox_fp32 neox_bf16 llama_f32 llama_q4_1 transformers)
echo "model: Llama, SmolLM2-135M shape, ${opt[layers]} layers, vocab 50304, $PARAMS parameters; prompt '$PROMPT';" \
     "${opt[tokens]} tokens; threads=${opt[threads]}"
echo "settings: neox.c OMP_NUM_THREADS=${opt[threads]} (default wait policy), bf16 = precision: bfloat16;" \
     "llama.cpp -t/-tb ${opt[threads]} (default threading, mmap); transformers $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')" \
     "set_num_threads(${opt[threads]}), inference_mode"
printf "%-6s" round; printf " %13s" "${sides[@]}"; printf "  load\n"
declare -A runs
for r in $(seq ${opt[rounds]}); do
    printf "%-6s" "$r"
    for s in "${sides[@]}"; do
        case $s in
            neox_fp32) v=$(neox fp32) ;; neox_bf16) v=$(neox bf16) ;;
            llama_f32) v=$(llama f32) ;; llama_q4_1) v=$(llama q4_1) ;; transformers) v=$(transformers) ;;
        esac
        runs[$s]+="$v "
        printf " %13s" "$v"
    done
    printf "  %s\n" "$(cut -d' ' -f1-3 /proc/loadavg)"
done
printf "\n%-13s %10s %10s %12s %9s\n" side "MB/token" "tokens/s" "GB/s" "vs F32"
ref=$(median ${runs[llama_f32]})
for s in "${sides[@]}"; do
    m=$(median ${runs[$s]})
    python3 -c "import sys; b, t, ref = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f'{sys.argv[1]:<13} {b / 1e6:10.1f} {t:10.2f} {b * t / 1e9:12.2f} {t / ref:8.2f}x')" "$s" "${bytes[$s]}" "$m" "$ref"
done
# The server: 1, 4 and 16 concurrent greedy requests of `tokens` tokens (batched decoding, up to 16
# completions per step), tokens/s overall, the median of `rounds`.
serve_rate() {  # $1: concurrent requests; extra configs after
    local conc=$1 port=""; shift
    $BIN/neox-eval serve --port 0 --context 512 "$work/neox/model.yml" "$work/neox/run.yml" "$@" 2>"$work/serve.log" &
    local pid=$!
    for _ in $(seq 600); do
        port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$work/serve.log")
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { cat "$work/serve.log" >&2; kill $pid; exit 1; }
    .venv/bin/python bench/serve_load.py "$port" "$conc" ${opt[tokens]} ${opt[rounds]}
    kill -TERM $pid
    wait $pid
}
printf "\nserver (neox-eval serve, --decode-slots 16), tokens/s overall:\n%-13s %10s %10s %10s\n" side 1 4 16
for side in fp32 bf16; do
    extra=()
    [ $side = bf16 ] && extra=("$work/bf16.yml")
    printf "%-13s" "neox_$side"
    for conc in 1 4 16; do printf " %10s" "$(serve_rate $conc "${extra[@]}")"; done
    printf "\n"
done
# The same greedy tokens? Both texts through the GPT-2 tokenizer, the leading ids compared.
.venv/bin/python - "$work/neox.txt" "$work/llama.txt" "$DATA/tokenizers/gpt2/gpt2_tokenizer.json" <<'PY'
import sys, tokenizers
tok = tokenizers.Tokenizer.from_file(sys.argv[3])
a, b = (tok.encode(open(p, encoding="utf-8", errors="replace").read()).ids for p in sys.argv[1:3])
same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"greedy tokens: the first {same} of {len(a)} (neox.c fp32) / {len(b)} (llama.cpp F32) agree")
PY
