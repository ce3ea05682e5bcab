# tests/tools/train_tasks.sh: eval_tasks during training. neox-eval's task code scores the model being
# trained with each validation evaluation; the scores of the last one equal `neox-eval --tasks` on the
# checkpoint saved at the end, exactly, in the log line, metrics.jsonl and TensorBoard. Without
# eval_tasks the run logs no task scores; tasks under tensor parallelism are refused by name
# (tests/mpi/train.sh runs the data-parallel case).
source tests/lib.sh

char_shakespeare "eval_tasks" || exit 0
[ -f "$DATA/eval/piqa_valid.jsonl" ] || { skip "eval_tasks" "no task files in $DATA/eval"; exit 0; }

cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "no_weight_tying": true, "hidden_dropout": 0.1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": 4, "train_iters": 8, "eval_interval": 4, "eval_iters": 2, "log_interval": 4,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer",
  "eval_data_dir": "$DATA/eval", "eval_task_limit": 12, "checkpoint_factor": 8
}
EOF
echo '{"eval_tasks": ["lambada_openai", "piqa"], "log_dir": "'"$T"'/log", "tensorboard_dir": "'"$T"'/tb",
  "save": "'"$T"'/ckpt", "load": "'"$T"'/ckpt"}' >"$T/tasks.yml"
check "train with eval_tasks" bash -c "$TRAIN '$T/model.yml' '$T/tasks.yml' >'$T/train.out' 2>&1"
check_output "the validation line carries the task scores" \
    'validation results at the end of training for val data \| lm_loss value: \S+ \| lm_loss_ppl value: \S+ \| lambada_openai_perplexity,none value: \S+ \| lambada_openai_acc,none value: \S+ \| piqa_acc,none value: \S+ \| piqa_acc_norm,none value: ' \
    cat "$T/train.out"
echo '{"load": "'"$T"'/ckpt"}' >"$T/load.yml"
check "neox-eval --tasks on the final checkpoint" $EVAL -q "$T/model.yml" "$T/load.yml" --tasks lambada_openai,piqa \
    --bootstrap-iters 0 --results-prefix "$T/eval"
same_scores() {
    python3 - "$T" <<'PY'
import glob, json, sys
t = sys.argv[1]
results = json.load(open(glob.glob(f"{t}/eval_eval_results_*.json")[0]))["results"]
logged = [json.loads(line) for line in open(f"{t}/log/metrics.jsonl")]
evals = [r for r in logged if "validation/lm_loss" in r]
assert [r["iteration"] for r in evals] == [4, 8, 8], [r["iteration"] for r in evals]
want = {f"validation/{task}_{k}": v for task, m in results.items() for k, v in m.items() if "," in k and "stderr" not in k}
assert len(want) == 4, want
for r in evals:
    assert set(k for k in r if "," in k) == set(want), sorted(r)
last = evals[-1]
bad = {k: (last[k], v) for k, v in want.items() if last[k] != v}
print(f"{len(want)} scores compared, {len(bad)} differ: {bad}")
assert not bad
assert evals[0]["validation/piqa_acc,none"] != last["validation/piqa_acc,none"] or \
    evals[0]["validation/lambada_openai_perplexity,none"] != last["validation/lambada_openai_perplexity,none"]
PY
}
check "the last in-training scores equal neox-eval's exactly" same_scores
tb_scores() {
    .venv/bin/python - "$T" <<'PY'
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(f"{sys.argv[1]}/tb", size_guidance={"scalars": 0})
acc.Reload()
for tag in ("validation/lambada_openai_acc,none", "validation/piqa_acc_norm,none"):
    assert [e.step for e in acc.Scalars(tag)] == [4, 8, 8], (tag, acc.Scalars(tag))
PY
}
if [ -x .venv/bin/python ]; then check "TensorBoard has the task scores at every evaluation" tb_scores
else skip "TensorBoard task scores" ".venv is missing"; fi
echo '{"log_dir": "'"$T"'/plain", "save": "'"$T"'/ckpt2", "load": "'"$T"'/ckpt2"}' >"$T/plain.yml"
check "without eval_tasks no task scores are logged" bash -c \
    "$TRAIN -q '$T/model.yml' '$T/plain.yml' && ! grep -q ',none' '$T/plain/metrics.jsonl'"
echo '{"eval_tasks": ["no_such_task"], "log_dir": "'"$T"'/bad", }' >"$T/bad.yml"
check_fails "an unknown task fails at the first evaluation, naming it" 2 'no_such_task' $TRAIN -q "$T/model.yml" "$T/bad.yml"
