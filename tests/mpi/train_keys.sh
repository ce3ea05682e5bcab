# tests/mpi/train_keys.sh: GPT-NeoX keys under parallel layouts. eval_tasks under data parallelism
# (mpiexec -n 2) spreads the task requests as neox-eval does: the in-training scores at the end equal
# `mpiexec -n 2 neox-eval --tasks` on the final checkpoint exactly; under tensor parallelism they are
# refused by name. log_param_norm under tensor x pipeline parallelism (2 x 2) counts every tensor once:
# the norms at the last iteration equal numpy's on the exported weights.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "GPT-NeoX keys under parallel layouts" "$MPIEXEC is not installed"; exit 0; }
char_shakespeare "GPT-NeoX keys under parallel layouts" || exit 0

model() {  # model FILE MORE-JSON
    cat >"$1" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": 2, "train_iters": 6, "eval_interval": 6, "eval_iters": 1, "log_interval": 3,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "checkpoint_factor": 6 $2
}
EOF
}

# ---- eval_tasks, data parallel ----
if [ -f "$DATA/eval/piqa_valid.jsonl" ]; then
    model "$T/dp.yml" ", \"eval_tasks\": [\"lambada_openai\", \"piqa\"], \"eval_data_dir\": \"$DATA/eval\", \"eval_task_limit\": 10"
    echo "{\"save\": \"$T/dp-ckpt\", \"log_dir\": \"$T/dp-log\"}" >"$T/dp-run.yml"
    echo "{\"load\": \"$T/dp-ckpt\"}" >"$T/dp-load.yml"
    check "dp2: train with eval_tasks" $MPIEXEC -n 2 $TRAIN -q "$T/dp.yml" "$T/dp-run.yml"
    check "dp2: neox-eval --tasks on the final checkpoint" $MPIEXEC -n 2 $EVAL -q "$T/dp.yml" "$T/dp-load.yml" \
        --tasks lambada_openai,piqa --bootstrap-iters 0 --results-prefix "$T/dp-eval"
    check "dp2: the in-training scores at the end equal neox-eval's exactly" python3 - "$T" <<'PY'
import glob, json, sys
t = sys.argv[1]
results = json.load(open(glob.glob(f"{t}/dp-eval_eval_results_*.json")[0]))["results"]
want = {f"validation/{task}_{k}": v for task, m in results.items() for k, v in m.items() if "," in k and "stderr" not in k}
last = [json.loads(line) for line in open(f"{t}/dp-log/metrics.jsonl") if "validation/lm_loss" in line][-1]
bad = {k: (last.get(k), v) for k, v in want.items() if last.get(k) != v}
print(f"{len(want)} scores compared, {len(bad)} differ: {bad}")
sys.exit(1 if bad or len(want) != 4 else 0)
PY
    model "$T/tp.yml" ", \"eval_tasks\": [\"piqa\"], \"model_parallel_size\": 2"
    check_fails "tp2: eval_tasks are refused by name" 2 'eval_tasks: tasks are scored with pipe_parallel_size and model_parallel_size 1' \
        $MPIEXEC -n 2 $TRAIN -q "$T/tp.yml"
else
    skip "eval_tasks under data parallelism" "no task files in $DATA/eval"
fi

# ---- log_param_norm, tensor x pipeline parallel ----
model "$T/tp2pp2.yml" ", \"log_param_norm\": true, \"model_parallel_size\": 2, \"pipe_parallel_size\": 2, \"gradient_accumulation_steps\": 2"
echo "{\"save\": \"$T/norm-ckpt\", \"log_dir\": \"$T/norm-log\"}" >"$T/norm-run.yml"
check "tp2 x pp2: train with log_param_norm" $MPIEXEC -n 4 $TRAIN -q "$T/tp2pp2.yml" "$T/norm-run.yml"
check "export the checkpoint" $NEOX_BIN/neox-convert to-hf --input "$T/norm-ckpt" --output "$T/norm-hf"
if [ -x .venv/bin/python ]; then
    check "tp2 x pp2: every parameter's norm and the total equal numpy's on the weights" .venv/bin/python - "$T" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file
t = sys.argv[1]
w = load_file(f"{t}/norm-hf/model.safetensors")
want = {k: float(np.sqrt(np.sum(v.astype(np.float64) ** 2))) for k, v in w.items()}
last = [json.loads(line) for line in open(f"{t}/norm-log/metrics.jsonl") if "train/param_norm" in line][-1]
assert last["iteration"] == 6, last["iteration"]
got = {k[len("parameter_norms/"):]: v for k, v in last.items() if k.startswith("parameter_norms/")}
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
bad = [k for k in want if abs(got[k] - want[k]) > 1e-6 * want[k]]
total = float(np.sqrt(sum(v * v for v in want.values())))
print(f"{len(want)} norms compared, {len(bad)} differ; total {last['train/param_norm']} vs {total}")
assert not bad and abs(last["train/param_norm"] - total) <= 1e-6 * total
PY
else
    skip "parameter norms against numpy" ".venv is missing"
fi
