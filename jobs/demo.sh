#!/usr/bin/env bash
# jobs/demo.sh (make demo): the whole neox.c pipeline on this machine, with the job templates run as
# plain scripts under `mpiexec -n 2` (what jobs/pipeline.sh submits to SLURM), on the King James
# Bible from Debian's bible-kjv package: corpus -> BPE tokenizer (neox-preprocess train-tokenizer)
# -> 4 shards preprocessed and merged (split 949,50,1) -> a small model trained a few minutes
# (configs/demo-kjv.yml) -> validation/test perplexity -> generated samples -> Hugging Face export.
# Everything goes to demo/ (NEOX_DEMO_DIR); a second run reuses whatever is already complete, and an
# interrupted run resumes from its last checkpoint. `make demo` first installs what is missing
# (make deps) and builds the tools.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${NEOX_DEMO_DIR:-demo}
mkdir -p "$D"
D=$(cd "$D" && pwd)
export NEOX_LAUNCHER=mpiexec NEOX_NPROCS=${NEOX_DEMO_RANKS:-2}
NEOX_MPIEXEC=${NEOX_MPIEXEC:-$(command -v mpiexec.mpich || echo mpiexec)}
export NEOX_MPIEXEC
# shellcheck source=jobs/common.sh
source jobs/common.sh
CONFIG=configs/demo-kjv.yml
PRE=$(neox_tool neox-preprocess)
command -v bible >/dev/null || neox_die 2 "the corpus comes from Debian's bible-kjv package: run 'make deps' (or apt-get install bible-kjv)"
command -v "$NEOX_MPIEXEC" >/dev/null || neox_die 2 "$NEOX_MPIEXEC not found: run 'make deps' (MPICH)"
step() { printf '\n== %s\n' "$*"; }
start=$(date +%s)
# The demo folder is not part of the repository.
[ -f "$D/.gitignore" ] || echo '*' >"$D/.gitignore"

step "1/7 corpus: the King James Bible (bible-kjv), one document per chapter, in 4 shards"
if [ -f "$D/corpus/done" ]; then
    neox_say "reusing $D/corpus"
else
    mkdir -p "$D/corpus"
    # "Ge1:1 In the beginning ..." -> one jsonl document per chapter, verses on their own lines.
    bible -f gen1:1-rev22:21 >"$D/corpus/bible.txt"
    sed 's/^[^ ]* //' "$D/corpus/bible.txt" >"$D/corpus/verses.txt"
    awk '{ ref = $1; sub(/:[0-9]+$/, "", ref); text = $0; sub(/^[^ ]+ /, "", text)
           gsub(/\\/, "\\\\", text); gsub(/"/, "\\\"", text)
           if (ref != chapter) { if (doc != "") print "{\"text\": \"" doc "\"}"; doc = text; chapter = ref }
           else doc = doc "\\n" text }
         END { if (doc != "") print "{\"text\": \"" doc "\"}" }' "$D/corpus/bible.txt" >"$D/corpus/chapters.jsonl"
    split -n l/4 -d --additional-suffix=.jsonl "$D/corpus/chapters.jsonl" "$D/corpus/shard_"
    ls "$D"/corpus/shard_*.jsonl >"$D/corpus/shards.txt"
    touch "$D/corpus/done"
fi
neox_say "$(wc -l <"$D/corpus/verses.txt") verses, $(wc -l <"$D/corpus/chapters.jsonl") chapters, $(wc -c <"$D/corpus/verses.txt") bytes"

step "2/7 tokenizer: byte-level BPE, 4096 tokens, trained on the verses"
if [ -f "$D/tokenizer.json" ]; then
    neox_say "reusing $D/tokenizer.json"
else
    "$PRE" train-tokenizer --input "$D/corpus/verses.txt" --vocab-size 4096 --output "$D/tokenizer.json"
fi
printf 'In the beginning God created\n' | "$PRE" encode --tokenizer-type HFTokenizer --vocab-file "$D/tokenizer.json" |
    sed "s/^/$NEOX_JOB: 'In the beginning God created' -> /"

step "3/7 preprocess: each shard (jobs/preprocess.sbatch), then merge (jobs/merge.sbatch)"
export NEOX_INPUT_LIST=$D/corpus/shards.txt NEOX_DATA_DIR=$D/data NEOX_DATA_PREFIX=$D/data/kjv_text_document
NEOX_WORKERS=2 bash jobs/preprocess.sbatch --tokenizer-type HFTokenizer --vocab-file "$D/tokenizer.json" --append-eod
bash jobs/merge.sbatch

cat >"$D/paths.yml" <<EOF
# Written by jobs/demo.sh: where make demo keeps its files (given after $CONFIG).
{
  "data_path": $(neox_json_string "$D/data/kjv_text_document"),
  "vocab_file": $(neox_json_string "$D/tokenizer.json"),
  "save": $(neox_json_string "$D/checkpoints"),
  "log_dir": $(neox_json_string "$D/logs"),
  "tensorboard_dir": $(neox_json_string "$D/tensorboard"),
}
EOF
neox_read_config "$NEOX_NPROCS" "$CONFIG" "$D/paths.yml"
iters=$(neox_value train_iters)

step "4/7 train: $NEOX_MPIEXEC -n $NEOX_NPROCS neox-train, $iters iterations (jobs/train.sbatch)"
if [ "$(cat "$D/checkpoints/latest" 2>/dev/null)" = "global_step$iters" ]; then
    neox_say "reusing the trained model: $D/checkpoints/global_step$iters"
else
    bash jobs/train.sbatch "$CONFIG" "$D/paths.yml"
fi

step "5/7 evaluate: validation and test perplexity (jobs/eval.sbatch), then samples"
latest=$D/checkpoints/latest
results=$(ls -t "$D"/eval/results_eval_results_*.json 2>/dev/null | head -1 || true)
printf 'In the beginning\nAnd the LORD said unto Moses,\nBlessed are the\nAnd Jesus answered and said unto them,\n' \
    >"$D/prompts.txt"
if [ -n "$results" ] && [ "$results" -nt "$latest" ] && [ "$D/eval/samples.jsonl" -nt "$latest" ]; then
    neox_say "reusing $results and $D/eval/samples.jsonl"
else
    NEOX_EVAL_TASKS=valid,test NEOX_RESULTS_PREFIX=$D/eval/results NEOX_GENERATE_INPUT=$D/prompts.txt \
    NEOX_GENERATE_OUTPUT=$D/eval/samples.jsonl \
    NEOX_GENERATE_ARGS="--maximum-tokens 48 --temperature 0.7 --top-p 0.9 --seed 1" \
        bash jobs/eval.sbatch "$CONFIG" "$D/paths.yml"
    results=$(ls -t "$D"/eval/results_eval_results_*.json | head -1)
fi

step "6/7 export: Hugging Face folder (jobs/convert.sbatch)"
NEOX_CHECKPOINT=$D/checkpoints NEOX_HF_OUTPUT=$D/hf bash jobs/convert.sbatch

step "7/7 summary"
python3 - "$D/logs/metrics.jsonl" "$results" "$D/eval/samples.jsonl" <<'EOF'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = {r["iteration"]: r["train/lm_loss"] for r in records if "train/lm_loss" in r}
first, last = min(train), max(train)
tail = [train[i] for i in sorted(train)[-25:]]
print(f"training loss: {train[first]:.3f} at iteration {first} -> {sum(tail) / len(tail):.3f} "
      f"(mean of the last {len(tail)} iterations, up to {last})")
valid = [(r["iteration"], r["validation/lm_loss"]) for r in records if "validation/lm_loss" in r]
print("validation loss by iteration: " + ", ".join(f"{i}: {v:.3f}" for i, v in valid))
res = json.load(open(sys.argv[2]))["results"]
for split in ("validation", "test"):
    print(f"{split} perplexity (neox-eval): {res[split]['lm_loss_ppl,none']:.2f} "
          f"(loss {res[split]['lm_loss,none']:.3f})")
print("samples (temperature 0.7, top-p 0.9):")
for s in map(json.loads, open(sys.argv[3])):
    print(f"  > {s['context']}{s['text']}".replace("\n", "\n    "))
EOF
cat <<EOF

Everything is in $D/ (took $(( $(date +%s) - start )) s; run make demo again to reuse it):
  corpus/          the Bible as printed by bible-kjv, verses.txt, chapters.jsonl and its 4 shards
  tokenizer.json   the BPE tokenizer (HFTokenizer)
  data/            the shards' and the merged dataset: kjv_text_document.bin/.idx, sample index caches
  checkpoints/     neox-train checkpoints (HDF5 shards, one per rank; latest -> $(cat "$latest"))
  logs/            metrics.jsonl (every logged value) and comm_stats.json
  tensorboard/     TensorBoard events: tensorboard --logdir $D/tensorboard
  eval/            $(basename "$results") (perplexities) and samples.jsonl
  hf/              Hugging Face model: AutoModelForCausalLM.from_pretrained("$D/hf"), tokenizer.json
  paths.yml        the paths config given with $CONFIG
The same steps on a SLURM cluster: jobs/pipeline.sh (jobs/README.md).
EOF
