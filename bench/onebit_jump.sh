#!/usr/bin/env bash
# bench/onebit_jump.sh: 1-bit Adam's loss jump after freeze_step, as a new user meets it
# (configs/tiny-shakespeare.yml, GPT-2 BPE, dp2 x micro-batch 8, 120 iterations, lr 0.002), beside
# the runs that locate it: AdamW; 1-bit Adam with freeze_step past the end (never compressed); 1-bit
# Adam on one rank with the same global batch (variance frozen at freeze_step, nothing compressed);
# and longer warm-ups / lower learning rates. Prints the training loss around freeze_step, the final
# validation loss, and from the step-freeze_step checkpoint, per tensor, how much larger the first
# compressed update is than Adam's (the sign x scale momentum over the frozen sqrt(v), see
# docs/communication.md).
# Usage: bench/onebit_jump.sh [freeze=40] [iters=120] [lr=0.002]
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A opt=([freeze]=40 [iters]=120 [lr]=0.002)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/onebit_jump.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
BIN=build/cpu/bin
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
PY=${PY:-.venv/bin/python}
DATA=../shared/data
[ -x $BIN/neox-train ] || { echo "bench/onebit_jump.sh: $BIN/neox-train is missing (run 'make')" >&2; exit 1; }
W=$(mktemp -d "${TMPDIR:-/tmp}/onebit_jump.XXXXXX")
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1
F=${opt[freeze]} I=${opt[iters]} LR=${opt[lr]}

python3 tests/tools/train_lib.py paragraphs "$DATA/text/tinyshakespeare_input.txt" "$W/s.jsonl"
$BIN/neox-preprocess --input "$W/s.jsonl" --output-prefix "$W/bpe" --tokenizer-type GPT2BPETokenizer --append-eod \
    --vocab-file "$DATA/tokenizers/gpt2/vocab.json" --merge-file "$DATA/tokenizers/gpt2/merges.txt" >/dev/null
sed -e "s#\"data_path\": .*#\"data_path\": \"$W/bpe_text_document\",#" -e "s#\"train_iters\": 200#\"train_iters\": $I#" \
    -e "s#\"eval_interval\": 100#\"eval_interval\": $I#" -e 's#"log_interval": 20#"log_interval": 1#' \
    -e '/"optimizer"/d' -e '/"min_lr"/d' configs/tiny-shakespeare.yml >"$W/dp2.yml"
sed 's#"train_micro_batch_size_per_gpu": 8#"train_micro_batch_size_per_gpu": 16#' "$W/dp2.yml" >"$W/dp1.yml"

run() {  # run NAME RANKS TYPE LR FREEZE [MORE JSON]   (min_lr: lr / 2, as lr 0.002 over the config's min_lr 0.001)
    local model=$W/dp$2.yml extra="" min_lr
    min_lr=$(python3 -c "print($4 / 2)")
    [ "$3" = OneBitAdam ] && extra=", \"freeze_step\": $5"
    echo "{\"optimizer\": {\"type\": \"$3\", \"params\": {\"lr\": $4, \"betas\": [0.9, 0.95], \"eps\": 1.0e-8$extra}},
      \"min_lr\": $min_lr, \"log_dir\": \"$W/$1\" ${6:-}}" >"$W/$1.yml"
    if [ "$2" = 1 ]; then $BIN/neox-train -q "$model" "$W/$1.yml" >/dev/null
    else $MPIEXEC -n "$2" $BIN/neox-train -q "$model" "$W/$1.yml" >/dev/null; fi
    echo "$1" >>"$W/runs.txt"
}
run adamw 2 Adam "$LR" 0
run onebit 2 OneBitAdam "$LR" "$F" ", \"save\": \"$W/ckpt\", \"checkpoint_factor\": 100000, \"extra_save_iters\": [$F]"
run never_compressed 2 OneBitAdam "$LR" 100000
run frozen_one_rank 1 OneBitAdam "$LR" "$F"
run freeze_x2 2 OneBitAdam "$LR" $((2 * F))
run lr_div4 2 OneBitAdam "$(python3 -c "print($LR / 4)")" "$F"

# Each rank's shard holds some tensors whole and a part of others (in rank order): concatenate.
for shard in "$W/ckpt/global_step$F"/rank_*.h5; do
    for t in $(h5ls -r "$shard" | awk '$1 ~ /^\/optimizer\/exp_avg\// {print $1}'); do
        name=${t#/optimizer/exp_avg/}
        for k in exp_avg exp_avg_sq; do
            h5dump -d "/optimizer/$k/$name" -b LE -o "$W/part" "$shard" >/dev/null
            cat "$W/part" >>"$W/$k.$name"
        done
    done
done
$PY - "$W" "$F" "$I" <<'PY'
import glob, json, os, sys
import numpy as np
w, freeze, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def metrics(run):
    rows = [json.loads(l) for l in open(f"{w}/{run}/metrics.jsonl")]
    train = {r["iteration"]: r["train/lm_loss"] for r in rows if "train/lm_loss" in r}
    valid = [r["validation/lm_loss"] for r in rows if "validation/lm_loss" in r][-1]
    return train, valid
steps = [freeze, freeze + 2, freeze + 5, freeze + 10, iters]
print("| run | " + " | ".join(f"loss @{s}" for s in steps) + " | validation |")
print("|---|" + "---|" * (len(steps) + 1))
for run in open(f"{w}/runs.txt").read().split():
    train, valid = metrics(run)
    print(f"| {run} | " + " | ".join(f"{train[s]:.3f}" if s in train else "-" for s in steps) + f" | {valid:.3f} |")
print(f"\nFirst compressed update against Adam's, from the moments after step {freeze} (m, frozen v):")
print("| tensor | numel | ||scale sign(m) / sqrt(v)|| / ||m / sqrt(v)|| | max element ratio |")
print("|---|---|---|---|")
for path in sorted(glob.glob(f"{w}/exp_avg.*")):
    name = os.path.basename(path)[len("exp_avg."):]
    m = np.fromfile(path, "<f4").astype(np.float64)
    v = np.fromfile(f"{w}/exp_avg_sq.{name}", "<f4").astype(np.float64)
    scale = np.linalg.norm(m) / np.sqrt(m.size)
    adam = m / (np.sqrt(v) + 1e-8)
    onebit = scale * np.where(m >= 0, 1.0, -1.0) / (np.sqrt(v) + 1e-8)
    if m.size >= 4096:
        print(f"| {name} | {m.size} | {np.linalg.norm(onebit) / np.linalg.norm(adam):.1f} | "
              f"{np.abs(onebit).max() / np.abs(adam).max():.1f} |")
PY
