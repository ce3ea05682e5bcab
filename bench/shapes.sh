#!/usr/bin/env bash
# bench/shapes.sh: the CPU shape matrix. For each model shape (GPT-NeoX 125M, Pythia-160M, SmolLM2-135M,
# a grouped-query Llama-2-style model) one set of random weights is made by transformers and saved as
# a Hugging Face folder, imported with `neox-convert from-hf`, and both sides run from those same
# weights, with the same thread count, in interleaved rounds:
#   train     neox-train steps (tokens/s from its log) vs torch eager (SDPA) and torch.compile, fp32,
#             plus, with bf16=1, neox.c `precision: bfloat16` vs torch's bfloat16 CPU autocast
#   score     neox-eval lambada_openai requests vs transformers on left-padded batches with
#             logits_to_keep (input tokens/s)
#   generate  neox-eval generate (greedy, KV cache) vs transformers generate() (new tokens/s)
# The peer is the newest torch + transformers from bench/peers_torch.sh (run it first).
# Prints one JSON line per measurement and a table of medians and neox.c/peer ratios at the end.
# Usage: bench/shapes.sh [key=value...]
#   keys: quick (0|1) threads rounds shapes (comma list of neox125m,pythia160m,smollm2_135m,llama_gqa)
#         seq batch steps warmup (training) limit sbatch (scoring: requests, rows per batch)
#         tokens prompts (generation) compile (0|1) bf16 (0|1) cases (comma list of train,score,generate)
#   defaults: threads=2 rounds=2 seq=1024 batch=1 steps=2 warmup=1 limit=100 sbatch=8 tokens=64 prompts=4
#   compile=1 bf16=0; quick=1: rounds=1 seq=256 batch=2 limit=24 tokens=32 prompts=2
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
DATA=../shared/data
BIN=${NEOX_BIN:-build/cpu/bin}  # NEOX_BIN: another build's tools, to compare builds
# NEOX_BASE_BIN: a second build's neox-train, run in the same rounds just before this one's (training
# only), so that two builds are compared under the same load: its side is "neox.c base train fp32".
BASE_BIN=${NEOX_BASE_BIN:-}
PEERS=${NEOX_BENCH_PEERS:-build/bench-peers}
PY=$PEERS/torch-venv/bin/python
[ -x "$PY" ] || { echo "bench/shapes.sh: $PY is missing (run bench/peers_torch.sh)" >&2; exit 1; }
[ -x $BIN/neox-train ] || { echo "bench/shapes.sh: $BIN is missing (run 'make')" >&2; exit 1; }
declare -A opt=([quick]=0 [threads]=2 [rounds]=2 [shapes]=neox125m,pythia160m,smollm2_135m,llama_gqa [seq]=1024
                [batch]=1 [steps]=2 [warmup]=1 [limit]=100 [sbatch]=8 [tokens]=64 [prompts]=4 [compile]=1 [bf16]=0
                [cases]=train,score,generate)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/shapes.sh: bad argument '$arg'" >&2; exit 2; }
done
for arg in "$@"; do [[ $arg == quick=1 ]] && opt+=([rounds]=1 [seq]=256 [batch]=2 [limit]=24 [tokens]=32 [prompts]=2); done
for arg in "$@"; do opt[${arg%%=*}]=${arg#*=}; done
export OMP_NUM_THREADS=${opt[threads]} OPENBLAS_NUM_THREADS=${opt[threads]} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# transformers/hub progress bars off: one JSON line per measurement.
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TRANSFORMERS_NO_ADVISORY_WARNINGS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-shapes.XXXXXX")
trap 'rm -rf "$work"' EXIT
T=${opt[threads]}
echo "# $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'); options: $(for k in "${!opt[@]}"; do printf '%s=%s ' "$k" "${opt[$k]}"; done)"
has_case() { [[ ,${opt[cases]}, == *,$1,* ]]; }
log() { tee -a "$work/results.jsonl"; }
rate() { sed -n "s/.*: \([0-9.]*\) tokens\/s.*/\1/p" "$1" | tail -1; }
python3 tests/tools/train_lib.py paragraphs $DATA/text/tinyshakespeare_input.txt "$work/text.jsonl"
printf 'ROMEO:\nFirst Citizen:\nThe king is\nO, what a\nIt was the best of\nIn the beginning\n' |
    head -n "${opt[prompts]}" >"$work/prompts.txt"

# One shape's files: the Hugging Face folder, the imported checkpoint, the data in its tokenizer, and
# the run files for training and for evaluation (each replaces from-hf's run.yml).
prepare() {
    local s=$1 d=$work/$1
    mkdir -p "$d"
    "$PY" bench/shapes.py make "$s" "$d/hf" $DATA/tokenizers/gpt2 $((opt[seq] > 256 ? opt[seq] : 256)) | log
    $BIN/neox-convert from-hf --input "$d/hf" --output "$d/ckpt" >/dev/null
    $BIN/neox-preprocess --input "$work/text.jsonl" --output-prefix "$d/data" --append-eod \
        --tokenizer-type GPT2BPETokenizer --vocab-file "$d/hf/vocab.json" --merge-file "$d/hf/merges.txt" >/dev/null 2>&1
    local common="\"load\": \"$d/ckpt\", \"finetune\": true, \"compute_backend\": \"cpu\""
    cat >"$d/train.yml" <<EOF
{ $common, "seq_length": ${opt[seq]}, "train_micro_batch_size_per_gpu": ${opt[batch]},
  "gradient_accumulation_steps": 1, "train_iters": $((opt[warmup] + opt[steps])), "log_interval": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.0006, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "weight_decay": 0.1, "lr_decay_style": "constant", "eval_interval": 100000, "eval_iters": 0,
  "split": "100,0,0", "data_path": "$d/data_text_document" }
EOF
    sed 's/}$/, "precision": "bfloat16" }/' "$d/train.yml" >"$d/train_bf16.yml"
    echo "{ $common, \"seq_length\": $((opt[seq] > 512 ? opt[seq] : 512)), \"train_micro_batch_size_per_gpu\": ${opt[sbatch]} }" >"$d/eval.yml"
}

# neox-train's tokens/s: the median of the log lines after the warmup steps (bin: the build's tools).
neox_train() {
    local s=$1 cfg=$2 side=$3 bin=${4:-$BIN}
    $bin/neox-train "$work/$s/ckpt/model.yml" "$work/$s/$cfg" >"$work/train.log" 2>&1 ||
        { cat "$work/train.log" >&2; return 1; }
    grep -o 'tokens/sec: [0-9.]*' "$work/train.log" | tail -n +$((opt[warmup] + 1)) | cut -d' ' -f2 | python3 -c "
import statistics, sys
print('{\"side\": \"$side\", \"tokens_per_s\": %.2f}' % statistics.median(float(v) for v in sys.stdin))"
}

round() {
    local s=$1 d=$work/$1 r=$2
    tag() { sed "s/^{/{\"shape\": \"$s\", \"round\": $r, /"; }
    if has_case train; then
        [ -n "$BASE_BIN" ] && { neox_train "$s" train.yml "neox.c base train fp32" "$BASE_BIN" | tag | log; }
        neox_train "$s" train.yml "neox.c train fp32" | tag | log
        "$PY" bench/shapes.py train "$d/hf" ${opt[seq]} ${opt[batch]} ${opt[steps]} ${opt[warmup]} $T eager | tag | log
        [ "${opt[compile]}" = 1 ] && { "$PY" bench/shapes.py train "$d/hf" ${opt[seq]} ${opt[batch]} ${opt[steps]} \
            ${opt[warmup]} $T compile 2>"$work/compile.log" || tail -3 "$work/compile.log" >&2; } | tag | log
        if [ "${opt[bf16]}" = 1 ]; then
            neox_train "$s" train_bf16.yml "neox.c train bf16" | tag | log
            "$PY" bench/shapes.py train "$d/hf" ${opt[seq]} ${opt[batch]} ${opt[steps]} ${opt[warmup]} $T bf16 | tag | log
        fi
    fi
    if has_case score; then
        $BIN/neox-eval "$d/ckpt/model.yml" "$d/eval.yml" --tasks lambada_openai --data-dir $DATA/eval \
            --limit ${opt[limit]} --results-prefix - >/dev/null 2>"$work/eval.log" || { cat "$work/eval.log" >&2; exit 1; }
        echo "{\"side\": \"neox.c score\", \"tokens_per_s\": $(rate "$work/eval.log")}" | tag | log
        "$PY" bench/shapes.py score "$d/hf" $DATA/eval/lambada_test.jsonl ${opt[limit]} ${opt[sbatch]} 512 $T | tag | log
    fi
    if has_case generate; then
        $BIN/neox-eval generate "$d/ckpt/model.yml" "$d/eval.yml" --text-gen-type input-file \
            --sample-input-file "$work/prompts.txt" --sample-output-file "$work/out.jsonl" \
            --maximum-tokens ${opt[tokens]} 2>"$work/gen.log" || { cat "$work/gen.log" >&2; exit 1; }
        echo "{\"side\": \"neox.c generate\", \"tokens_per_s\": $(rate "$work/gen.log")}" | tag | log
        "$PY" bench/shapes.py generate "$d/hf" "$work/prompts.txt" ${opt[tokens]} 512 $T | tag | log
    fi
}

IFS=, read -ra shapes <<<"${opt[shapes]}"
for s in "${shapes[@]}"; do
    prepare "$s"
    for ((r = 1; r <= opt[rounds]; r++)); do round "$s" $r; done
    echo "# $s done, load $(cut -d' ' -f1-3 /proc/loadavg)"
done

python3 - "$work/results.jsonl" <<'EOF'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "side" in l]
med = collections.defaultdict(list)
for r in rows:
    med[r["shape"], r["side"]].append(r["tokens_per_s"])
m = {k: statistics.median(v) for k, v in med.items()}
pairs = [("train fp32", "neox.c train fp32", ["neox.c base train fp32", "torch eager", "torch compile"]),
         ("train bf16", "neox.c train bf16", ["torch bf16"]),
         ("score", "neox.c score", ["transformers score"]),
         ("generate", "neox.c generate", ["transformers generate"])]
print(f"\n{'shape':<13} {'case':<11} {'neox.c tok/s':>12} {'peer':<22} {'peer tok/s':>10} {'ratio':>6}")
for shape in dict.fromkeys(s for s, _ in m):
    for case, ours, peers in pairs:
        for p in peers:
            if (shape, ours) in m and (shape, p) in m:
                print(f"{shape:<13} {case:<11} {m[shape, ours]:>12.1f} {p:<22} {m[shape, p]:>10.1f} "
                      f"{m[shape, ours] / m[shape, p]:>5.2f}x")
EOF
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
