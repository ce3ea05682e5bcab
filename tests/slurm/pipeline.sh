# tests/slurm/pipeline.sh: jobs/pipeline.sh on the test SLURM: Tiny Shakespeare cut into three
# shards (jsonl, jsonl, jsonl.gz), a BPE tokenizer trained here, a tiny model on 2 ranks
# (srun --mpi=pmi2). Checks the five jobs and their dependencies, the merged dataset against a
# single-run preprocess of the same shards, the checkpoints, the eval JSON against the trainer's own
# test loss, the samples, the reshard, and the Hugging Face export (transformers' greedy text equals
# neox-eval's); then submits the same pipeline again and checks that every stage reuses its output.
source tests/lib.sh
source tests/slurm/jobs.lib
PRE=$NEOX_BIN/neox-preprocess
shakespeare_cluster "jobs/pipeline.sh"
head -n 2500 "$T/all.jsonl" >"$T/s0.jsonl"
sed -n '2501,5000p' "$T/all.jsonl" >"$T/s1.jsonl"
tail -n +5001 "$T/all.jsonl" | gzip -n >"$T/s2.jsonl.gz"
check "train a 512-token BPE tokenizer" $PRE train-tokenizer --input "$DATA/text/tinyshakespeare_input.txt" \
    --vocab-size 512 --output "$T/tokenizer.json"
cat >"$T/tiny.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "train_iters": 40, "eval_interval": 20, "eval_iters": 2, "log_interval": 1, "checkpoint_factor": 20,
  "split": "949,50,1", "tokenizer_type": "HFTokenizer", "vocab_file": "$T/tokenizer.json"
}
EOF
printf 'KING RICHARD III:\nFirst Citizen:\nROMEO:\n' >"$T/prompts.txt"
R=$T/run
pipeline() {
    jobs/pipeline.sh --run-dir "$R" --input "$T/s0.jsonl" --input "$T/s1.jsonl" --input "$T/s2.jsonl.gz" \
        --config "$T/tiny.yml" --ntasks-per-node 2 --cpus-per-task 1 --reshard "--tp 2" \
        --prompts "$T/prompts.txt" --generate-args "--maximum-tokens 12" \
        --eval-tasks valid,test,lambada_openai --eval-data-dir "$DATA/eval" --eval-limit 10
}
check "jobs/pipeline.sh submits" pipeline
cp "$_last_out" "$T/pipeline.out"
read -r pre merge train evaluation convert < <(awk '{print $2}' "$R/jobs.txt" | tr '\n' ' ')
printed_ids() {  # five distinct ids, each printed on its stage's line
    [ "$(printf '%s\n' "$pre" "$merge" "$train" "$evaluation" "$convert" | grep -E '^[0-9]+$' | sort -u | wc -l)" = 5 ] &&
    grep -qE "^preprocess +$pre +job array 0-2," "$T/pipeline.out" && grep -qE "^merge +$merge " "$T/pipeline.out" &&
    grep -qE "^train +$train " "$T/pipeline.out" && grep -qE "^eval +$evaluation " "$T/pipeline.out" &&
    grep -qE "^convert +$convert " "$T/pipeline.out"
}
check "it prints the five job ids, as jobs.txt records them" printed_ids
deps() {  # the chain, read back from slurmctld before the jobs it waits for have finished
    [ "$(job_field "$convert" Dependency)" = "afterok:${evaluation}(unfulfilled)" ] &&
    [ "$(job_field "$evaluation" Dependency)" = "afterok:${train}(unfulfilled)" ] &&
    [ "$(job_field "$train" Dependency)" = "afterok:${merge}(unfulfilled)" ]
}
check "train, eval and convert wait on the job before them (afterok)" deps
jobs_done "all 3 preprocess tasks and the 4 other jobs complete with status 0" 180 "$R/slurm" \
    "$pre" "$merge" "$train" "$evaluation" "$convert"

# ---- data ----
check "a single-run preprocess of the three shards" $PRE --input "$T/s0.jsonl,$T/s1.jsonl,$T/s2.jsonl.gz" \
    --output-prefix "$T/single" --tokenizer-type HFTokenizer --vocab-file "$T/tokenizer.json" --append-eod
check "the merged dataset is byte-identical to it (.bin and .idx)" bash -c \
    "cmp '$T/single_text_document.bin' '$R/data/corpus_text_document.bin' && cmp '$T/single_text_document.idx' '$R/data/corpus_text_document.idx'"

# ---- training ----
check_output "latest names the last iteration" '^global_step40$' cat "$R/checkpoints/latest"
check "the checkpoints of iterations 20 and 40 verify, one shard per rank" bash -c \
    "$CONVERT verify '$R/checkpoints/global_step20' && $CONVERT verify '$R/checkpoints/global_step40' &&
     [ -f '$R/checkpoints/global_step40/rank_00001.h5' ] && [ ! -e '$R/checkpoints/global_step40/rank_00002.h5' ]"
check "the metrics hold iterations 1..40 once each" python3 tests/slurm/slurm_check.py iterations "$R/logs/metrics.jsonl" 40
check "the training loss fell" python3 - "$R/logs/metrics.jsonl" <<'EOF'
import json, sys
loss = [r["train/lm_loss"] for r in map(json.loads, open(sys.argv[1])) if "train/lm_loss" in r]
print(f"first 5 {sum(loss[:5]) / 5:.3f}, last 5 {sum(loss[-5:]) / 5:.3f}")
sys.exit(0 if sum(loss[-5:]) < sum(loss[:5]) - 0.5 else 1)
EOF
check "ranks were started by srun --mpi=pmi2" grep -q 'running: srun --mpi=pmi2' "$R"/slurm/neox-train-"$train".out

# ---- evaluation ----
results=$(ls "$R"/eval/results_eval_results_*.json 2>/dev/null | head -1)
check "eval wrote its results JSON" test -n "$results"
check "neox-eval's test loss equals the trainer's final test loss (same checkpoint)" \
    python3 tests/slurm/slurm_check.py eval-test "$R/logs/metrics.jsonl" "$results"
check "eval scored the 10 lambada_openai examples it was given" python3 -c "
import json, sys; r = json.load(open(sys.argv[1]))
sys.exit(0 if r['n-samples']['lambada_openai'] == 10 and 'acc,none' in r['results']['lambada_openai'] else 1)" "$results"
check "a sample per prompt" python3 tests/slurm/slurm_check.py samples "$R/eval/samples.jsonl" "$T/prompts.txt"

# ---- conversion ----
check "the resharded copy verifies" $CONVERT verify "$R/resharded"
check_output "it is laid out for tensor parallel 2" 'model 2' $CONVERT inspect "$R/resharded"
check "the Hugging Face folder has config, weights and the tokenizer" bash -c \
    "[ -f '$R/hf/config.json' ] && [ -f '$R/hf/model.safetensors' ] && cmp '$T/tokenizer.json' '$R/hf/tokenizer.json'"
check_output "both conversions record their checkpoint" "^$R/checkpoints/global_step40\$" \
    bash -c "cat '$R/hf/neox-source'; cmp -s '$R/hf/neox-source' '$R/resharded/neox-source' || echo differ"
if [ -x .venv/bin/python ]; then
    check "transformers' greedy text from the export equals neox-eval's samples" \
        .venv/bin/python tests/slurm/slurm_check.py hf-greedy "$R/hf" "$R/eval/samples.jsonl" 12
else
    skip "transformers' greedy text from the export" ".venv is missing (make deps)"
fi

# ---- the same pipeline again: every stage reuses what exists ----
cp "$R/logs/metrics.jsonl" "$T/metrics-first.jsonl"
check "the same pipeline submits again" pipeline
read -r pre merge train evaluation convert < <(awk '{print $2}' "$R/jobs.txt" | tr '\n' ' ')
jobs_done "the second pipeline completes" 180 "$R/slurm" "$pre" "$merge" "$train" "$evaluation" "$convert"
check "preprocess and merge keep their outputs" bash -c \
    "grep -q 'up to date' '$R/slurm/neox-preprocess-${pre}_1.out' && grep -q 'up to date' '$R/slurm/neox-merge-$merge.out'"
check "training resumes from global_step40 and trains no further" bash -c \
    "grep -q 'resuming from .*global_step40' '$R/slurm/neox-train-$train.out' && [ \"\$(cat '$R/checkpoints/latest')\" = global_step40 ] &&
     [ \"\$(grep -c train/lm_loss '$R/logs/metrics.jsonl')\" = 40 ]"
check "convert keeps both conversions" bash -c \
    "[ \$(grep -c 'already the .* conversion' '$R/slurm/neox-convert-$convert.out') = 2 ]"
