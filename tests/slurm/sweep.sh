# tests/slurm/sweep.sh: jobs/sweep.sbatch as a 3-task job array on the test SLURM over the keys the
# base config leaves out (GPT-NeoX configs refuse a key given twice): inline learning rates, seed
# and dropout, and a config file (a wider model); a comment and a blank line in the list are
# skipped. Each task must complete in its own folder with the variation it was given and train
# exactly as neox-train does on the same configs outside SLURM.
source tests/lib.sh
source tests/slurm/jobs.lib
shakespeare_cluster "jobs/sweep.sbatch"
char_dataset
cat >"$T/base.yml" <<EOF2
{
  "num_layers": 2, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 4, "train_iters": 30, "eval_interval": 15, "eval_iters": 2,
  "log_interval": 1, "checkpoint_factor": 15,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "split": "949,50,1"
}
EOF2
printf '# a wider model\nhidden_size: 48\noptimizer:\n  type: Adam\n  params: {lr: 0.003}\n' >"$T/wide.yml"
variations=('{"hidden_size": 32, "optimizer": {"type": "Adam", "params": {"lr": 0.003}}}'
            '{"hidden_size": 32, "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "seed": 7, "hidden_dropout": 0.1}'
            "$T/wide.yml")
{ echo "${variations[0]}"; echo "# a comment"; echo; echo "${variations[1]}"; echo "${variations[2]}"; } >"$T/sweep.txt"

mkdir -p "$T/logs"
job=$(NEOX_SWEEP_LIST=$T/sweep.txt NEOX_SWEEP_DIR=$T/sweep sbatch --parsable --array=0-2 --cpus-per-task 1 \
      -o "$T/logs/sweep-%a.out" jobs/sweep.sbatch "$T/base.yml")
check "sbatch takes the array" test -n "$job"
jobs_done "the three tasks complete with status 0" 180 "$T/logs" "$job"

for i in 0 1 2; do
    d=$T/sweep/task_000$i
    v=${variations[$i]}
    if [ -f "$v" ]; then cp "$v" "$T/ref$i.yml"; else echo "$v" >"$T/ref$i.yml"; fi
    check "task $i: its folder holds its variation" cmp "$T/ref$i.yml" "$d/sweep.yml"
    check_output "task $i: latest names iteration 30" '^global_step30$' cat "$d/checkpoints/latest"
    check "task $i: checkpoints verify" "$NEOX_BIN/neox-convert" verify "$d/checkpoints"
    check "task $i: iterations 1..30 logged once" python3 tests/slurm/slurm_check.py iterations "$d/logs/metrics.jsonl" 30
    echo "{\"log_dir\": \"$T/ref$i\"}" >"$T/reflog$i.yml"
    check "task $i: neox-train on the same configs outside SLURM" $TRAIN -q "$T/base.yml" "$T/ref$i.yml" "$T/reflog$i.yml"
    check "task $i: identical losses, norms, learning rates and evaluations" python3 tests/tools/train_lib.py same \
        "$T/ref$i/metrics.jsonl" "$d/logs/metrics.jsonl" train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss
done
differ() { ! python3 tests/tools/train_lib.py same "$1" "$2" train/lm_loss; }
check "the three variations train differently" bash -c "$(declare -f differ); differ '$T/ref0/metrics.jsonl' '$T/ref1/metrics.jsonl' &&
    differ '$T/ref1/metrics.jsonl' '$T/ref2/metrics.jsonl' && differ '$T/ref0/metrics.jsonl' '$T/ref2/metrics.jsonl'"
check_output "task 2's checkpoint is the wider model" 'hidden 48' "$NEOX_BIN/neox-convert" inspect "$T/sweep/task_0002/checkpoints"
