#!/usr/bin/env bash
# bench/fp8_curve.sh: the loss curve of precision fp8 (docs/model.md, "FP8 training") against
# bfloat16 on real text: the same small GPT-NeoX model trained from the same initialisation on the
# same batches of Tiny Shakespeare (../shared/data/text, character-level), once in each precision, on
# the CPU backend. Prints both curves every `every` steps and the final losses (each the mean of the
# last 20 steps' training losses, which averages out the batches' own noise) with their relative
# difference; the goal is within 1%. docs/performance.md records a run.
# Needs `make`. Usage: bench/fp8_curve.sh [key=value...]  keys: layers hidden heads seq batch steps lr
#   every backend threads jobs   (defaults: layers=4 hidden=128 heads=4 seq=128 batch=8 steps=400 lr=0.002
#   every=50 backend=cpu threads=2 jobs=1; jobs=2 trains the two side by side, threads each)
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A opt=([layers]=4 [hidden]=128 [heads]=4 [seq]=128 [batch]=8 [steps]=400 [lr]=0.002 [every]=50
                [backend]=cpu [threads]=2 [jobs]=1)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/fp8_curve.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
BIN=${NEOX_BIN:-build/cpu/bin}
TEXT=${SHARED:-../shared}/data/text/tinyshakespeare_input.txt
[ -x "$BIN/neox-train" ] || { echo "bench/fp8_curve.sh: $BIN/neox-train is missing (run 'make')" >&2; exit 1; }
[ -f "$TEXT" ] || { echo "bench/fp8_curve.sh: $TEXT is missing" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-fp8curve.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${opt[threads]}

python3 tests/tools/train_lib.py paragraphs "$TEXT" "$work/text.jsonl"
"$BIN/neox-preprocess" --input "$work/text.jsonl" --output-prefix "$work/char" --tokenizer-type CharLevelTokenizer \
    --append-eod >"$work/preprocess.log" 2>&1
cat >"$work/model.yml" <<EOF
{
  "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]},
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": ${opt[lr]}, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": $(python3 -c "print(${opt[lr]} / 10)"), "weight_decay": 0.01, "lr_decay_style": "cosine",
  "warmup": 0.05, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": ${opt[batch]}, "gradient_accumulation_steps": 1,
  "train_iters": ${opt[steps]}, "eval_interval": ${opt[steps]}, "eval_iters": 4, "log_interval": 1,
  "compute_backend": "${opt[backend]}",
  "data_path": "$work/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
echo "# model: layers ${opt[layers]}, hidden ${opt[hidden]}, heads ${opt[heads]}, seq ${opt[seq]}, micro-batch ${opt[batch]}," \
     "${opt[steps]} steps, lr ${opt[lr]}; Tiny Shakespeare, character-level; backend ${opt[backend]}, ${opt[threads]} threads"
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc --all) cores"
train() {  # train PRECISION: one run, its wall time printed
    echo "{\"log_dir\": \"$work/$1\", \"precision\": \"$1\"}" >"$work/$1.yml"
    local start=$(date +%s)
    "$BIN/neox-train" -q "$work/model.yml" "$work/$1.yml" >"$work/$1.log" 2>&1 ||
        { tail -20 "$work/$1.log" >&2; return 1; }
    echo "# $1: $(( $(date +%s) - start )) s"
}
if [ "${opt[jobs]}" = 2 ]; then  # side by side (each run's numbers are the same either way)
    train bfloat16 & first=$!
    train fp8 || exit 1
    wait $first || exit 1
else
    train bfloat16 && train fp8 || exit 1
fi
python3 - "$work/bfloat16/metrics.jsonl" "$work/fp8/metrics.jsonl" "${opt[every]}" <<'PY'
import json, sys
def losses(p): return [r["train/lm_loss"] for r in map(json.loads, open(p)) if "train/lm_loss" in r]
bf, f8, every = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
print("step  bfloat16  fp8")
for i in range(0, len(bf), every):
    print(f"{i + 1:5d}  {bf[i]:.4f}  {f8[i]:.4f}")
a, b = sum(bf[-20:]) / 20, sum(f8[-20:]) / 20
print(f"final (mean of the last 20 steps): bfloat16 {a:.4f}, fp8 {b:.4f}, fp8/bfloat16 - 1 = {(b / a - 1) * 100:+.2f}%")
PY
