#!/usr/bin/env bash
# bench/generate.sh: generation and prompt-scoring speed of neox.c (fp32 and bfloat16 weights) against
# llama.cpp (F32 and Q4_1) and transformers (fp32) on the same weights: a Llama of SmolLM2-135M's
# shape with random weights made by transformers (bench/llama_model.py), imported with `neox-convert
# from-hf`, converted to an F32 GGUF by llama.cpp's own convert_hf_to_gguf.py and quantized to Q4_1
# by its llama-quantize. Each side runs with the same thread count at its own best settings: neox.c
# and llama.cpp with their default OpenMP threading and wait policy (no OMP_WAIT_POLICY: a passive
# wait slowed llama.cpp 1.6-2.9x; neox-eval's own default is passive), transformers with
# torch.set_num_threads(threads) and no_grad. All ten measurements of a round alternate, `rounds`
# times, so that other work on the machine weighs on all alike.
# Generation: `tokens` tokens greedily after "The king is". neox.c's figure is the one `neox-eval
# generate` reports (all the tokens over the time from the prompt's pass to the last token);
# llama.cpp's is llama-completion's "eval time" line (the one-token passes after the prompt's,
# sampling included); transformers' all the tokens over its loop's time (bench/generate_transformers.py).
# Prompt scoring: one pass over a prompt of 81 GPT-2 tokens (neox-eval generate of one token: the
# prompt's pass and one sampling; llama-bench's pp test of as many tokens, `-n 0 -r 1`, its default
# warm-up and settings; transformers one forward of the prompt), in prompt tokens per second.
# Reported per side: the median tokens/s and the weight bytes streamed per second: a token (or a
# prompt's pass, or a server step) reads every weight once (fp32 4 bytes each, bfloat16 2, a GGUF
# its file's size), so bytes/s = weight bytes x passes/s (generation: tokens/s; a prompt: tokens/s /
# 81; the server: tokens/s / concurrent requests, when they all decode together). Then neox-eval
# serve's throughput (fp32 and bfloat16) at 1, 4 and 16 concurrent greedy requests of `tokens` tokens
# (bench/serve_load.py), and how many of the first greedy tokens neox.c fp32 and llama.cpp F32 agree on.
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
SCORE_PROMPT="The king is dead, and the old castle on the hill stands empty. For three hundred years his family ruled \
the valley from its walls, collecting grain in the autumn and sending soldiers to the river in the spring. Now the \
servants have gone home, the gates hang open, the fields lie unplanted, and the villagers gather in the square to \
wonder who will come to claim the crown, and whether"

.venv/bin/python bench/llama_model.py $DATA/tokenizers/gpt2 "$work/hf" ${opt[layers]} 2>/dev/null
$BIN/neox-convert from-hf --input "$work/hf" --output "$work/neox" >/dev/null 2>&1
"$LLAMA/venv/bin/python" "$LLAMA/convert_hf_to_gguf.py" "$work/hf" --outtype f32 --outfile "$work/f32.gguf" \
    >"$work/convert.log" 2>&1 || { tail -20 "$work/convert.log" >&2; exit 1; }
"$LLAMA/bin/llama-quantize" "$work/f32.gguf" "$work/q4_1.gguf" Q4_1 >"$work/quantize.log" 2>&1 ||
    { tail -20 "$work/quantize.log" >&2; exit 1; }
echo "$PROMPT" >"$work/prompt.txt"
echo "$SCORE_PROMPT" >"$work/score_prompt.txt"
SCORE_TOKENS=$(.venv/bin/python -c 'import sys, tokenizers
print(len(tokenizers.Tokenizer.from_file(sys.argv[1]).encode(sys.argv[2]).ids))' \
    "$DATA/tokenizers/gpt2/gpt2_tokenizer.json" "$SCORE_PROMPT")
echo "precision: bfloat16" >"$work/bf16.yml"
PARAMS=$(.venv/bin/python -c 'import math, sys, safetensors; f = safetensors.safe_open(sys.argv[1], "np")
print(sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()))' "$work/hf/model.safetensors")
declare -A bytes=([neox_fp32]=$((PARAMS * 4)) [neox_bf16]=$((PARAMS * 2)) [llama_f32]=$(stat -c %s "$work/f32.gguf")
                  [llama_q4_1]=$(stat -c %s "$work/q4_1.gguf") [transformers]=$((PARAMS * 4)))

neox() {  # tokens/s; $1: fp32 or bf16, $2: gen or score; the fp32 completion into $work/neox.txt
    local extra=() out=$work/neox_$1.jsonl prompt=$work/prompt.txt tokens=${opt[tokens]}
    [ "$1" = bf16 ] && extra=("$work/bf16.yml")
    [ "$2" = score ] && prompt=$work/score_prompt.txt tokens=1
    $BIN/neox-eval generate "$work/neox/model.yml" "$work/neox/run.yml" "${extra[@]}" --text-gen-type input-file \
        --sample-input-file "$prompt" --sample-output-file "$out" \
        --maximum-tokens $tokens 2>"$work/neox.log" || { cat "$work/neox.log" >&2; exit 1; }
    if [ "$2" = score ]; then  # the prompt's pass (and one sampling): SCORE_TOKENS over its seconds
        sed -n 's/.* in \([0-9.]*\) s: .*/\1/p' "$work/neox.log" | tail -1 |
            awk -v n="$SCORE_TOKENS" '{printf "%.2f\n", n / $1}'
        return
    fi
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
llama_score() {  # prompt tokens/s of llama-bench's pp test; $1: the GGUF's name
    "$LLAMA/bin/llama-bench" -m "$work/$1.gguf" -p "$SCORE_TOKENS" -n 0 -r 1 -t ${opt[threads]} -o csv \
        >"$work/llama_bench.csv" 2>"$work/llama.log" || { tail -20 "$work/llama.log" >&2; exit 1; }
    .venv/bin/python -c 'import csv, sys; print("%.2f" % float(list(csv.DictReader(open(sys.argv[1])))[-1]["avg_ts"]))' \
        "$work/llama_bench.csv"
}
transformers() {  # tokens/s; $1: gen or score
    local mode=() prompt=$PROMPT
    [ "$1" = score ] && mode=(score) prompt=$SCORE_PROMPT
    .venv/bin/python bench/generate_transformers.py "$work/hf" "$prompt" ${opt[tokens]} ${opt[threads]} "${mode[@]}" \
        2>"$work/hf.log" | head -1 || { tail -20 "$work/hf.log" >&2; exit 1; }
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
sides=(neox_fp32 neox_bf16 llama_f32 llama_q4_1 transformers)
echo "model: Llama, SmolLM2-135M shape, ${opt[layers]} layers, vocab 50304, $PARAMS parameters; generation: prompt" \
     "'$PROMPT', ${opt[tokens]} tokens; scoring: a prompt of $SCORE_TOKENS tokens; threads=${opt[threads]}"
echo "settings: neox.c OMP_NUM_THREADS=${opt[threads]} (neox-eval's default wait policy), bf16 = precision: bfloat16;" \
     "llama.cpp -t/-tb ${opt[threads]} (default threading and wait policy, mmap; llama-bench defaults);" \
     "transformers $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')" \
     "set_num_threads(${opt[threads]}), no_grad"
measure() {  # $1: gen or score, $2: side
    case $2 in
        neox_fp32) neox fp32 "$1" ;; neox_bf16) neox bf16 "$1" ;;
        llama_f32 | llama_q4_1) if [ "$1" = gen ]; then llama "${2#llama_}"; else llama_score "${2#llama_}"; fi ;;
        transformers) transformers "$1" ;;
    esac
}
printf "%-6s %-6s" round what; printf " %13s" "${sides[@]}"; printf "  load\n"
declare -A runs
for r in $(seq ${opt[rounds]}); do
    for what in gen score; do
        printf "%-6s %-6s" "$r" "$what"
        for s in "${sides[@]}"; do
            v=$(measure $what $s)
            runs[$what.$s]+="$v "
            printf " %13s" "$v"
        done
        printf "  %s\n" "$(cut -d' ' -f1-3 /proc/loadavg)"
    done
done
for what in gen score; do
    [ $what = gen ] && printf "\ngeneration (%s tokens):\n" "${opt[tokens]}" || printf "\nprompt scoring (%s tokens):\n" "$SCORE_TOKENS"
    printf "%-13s %10s %10s %12s %9s\n" side "MB/pass" "tokens/s" "GB/s" "vs F32"
    ref=$(median ${runs[$what.llama_f32]})
    for s in "${sides[@]}"; do
        m=$(median ${runs[$what.$s]})
        per=1; [ $what = score ] && per=$SCORE_TOKENS
        python3 -c "import sys; b, t, ref, per = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
print(f'{sys.argv[1]:<13} {b / 1e6:10.1f} {t:10.2f} {b * t / per / 1e9:12.2f} {t / ref:8.2f}x')" "$s" "${bytes[$s]}" "$m" "$ref" "$per"
    done
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
printf "\nserver (neox-eval serve, --decode-slots 16), tokens/s overall (weight GB/s: a step per token of each request):\n"
printf "%-13s %18s %18s %18s\n" side 1 4 16
for side in fp32 bf16; do
    extra=()
    [ $side = bf16 ] && extra=("$work/bf16.yml")
    printf "%-13s" "neox_$side"
    for conc in 1 4 16; do
        v=$(serve_rate $conc "${extra[@]}")
        printf " %18s" "$v ($(python3 -c "import sys; print(f'{float(sys.argv[1]) * float(sys.argv[2]) / float(sys.argv[3]) / 1e9:.1f} GB/s')" \
            "${bytes[neox_$side]}" "$v" "$conc"))"
    done
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
