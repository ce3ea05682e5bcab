# tests/mpi/rm.sh: reward models (train_impl: rm) under data, tensor and pipeline parallelism. The same
# pre-trained language model starts a reward model (its value head new) on the same pairs
# (tests/tools/dpo_pairs.py rm) with the same global batch and z_loss on one rank, dp2 with ZeRO-1,
# tp2 (the value head replicated) and pp2 (the head on the last stage); the losses, evaluations,
# reward metrics and final parameters must equal the single-rank run's within 1e-5 relative. A run
# stopped under pp2 resumes under tp2 on the same trajectory.
source tests/lib.sh

NAME="reward-model layouts"
source tests/post_training_setup.sh
check "write the pairs" $PY tests/tools/dpo_pairs.py "$TEXT" "$T/pairs" 0 200 16 12 1 rm

P=$T/pairs
split() {
    echo "\"pos_$1_data_paths\": [\"${P}_chosen_document\"], \"neg_$1_data_paths\": [\"${P}_rejected_document\"],
      \"pos_$1_label_data_paths\": [\"${P}_chosen_label_document\"], \"neg_$1_label_data_paths\": [\"${P}_rejected_label_document\"]"
}
# run NAME RANKS MICRO ACCUM EXTRA: 12 steps of 8 pairs, then the export.
run() {
    cat >"$T/$1.yml" <<EOF2
{$MODEL, "train_impl": "rm", "dataset_impl": "pairwise", "z_loss": 0.05, "pack_impl": "unpacked",
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "clip_grad": 1.0, "train_iters": 12, "eval_interval": 6,
 "train_micro_batch_size_per_gpu": $3, "gradient_accumulation_steps": $4, "load": "$T/pre", "finetune": true,
 "log_dir": "$T/$1/log", "save": "$T/$1/ckpt", "checkpoint_factor": ${CKPT:-12},
 $(split train), $(split valid), $(split test) $5}
EOF2
    local launch=()
    [ "$2" -gt 1 ] && launch=("$MPIEXEC" -n "$2")
    check "RM $1: train on $2 rank(s)" "${launch[@]}" "$TRAIN" -q "$T/$1.yml"
    check "RM $1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
metrics_same() {
    check "RM $1: pos_values, neg_values, margin and accuracy equal the single-rank run's" $PY -c "
import json
NAMES = ('pos_values', 'neg_values', 'margin', 'accuracy')
def table(run):
    return {(r['iteration'], k): r[k] for r in map(json.loads, open(run + '/log/metrics.jsonl'))
            for k in r if k.split('/')[-1] in NAMES}
a, b = table('$T/one'), table('$T/$1')
assert a and a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
# A mean of rewards of both signs may be near zero: compared at the rewards' own scale (about 0.1 here).
bad = [(k, a[k], b[k]) for k in a if abs(a[k] - b[k]) > 1e-5 * max(abs(a[k]), 0.1)]
assert not bad, bad[:5]
print(len(a), 'values compared')"
}
run one 1 4 2 ""
for spec in "dp2z1 2 2 2 ', \"zero_optimization\": {\"stage\": 1}'" "tp2 2 4 2 ', \"model_parallel_size\": 2'" \
            "pp2 2 4 2 ', \"pipe_parallel_size\": 2'"; do
    eval "set -- $spec"
    run "$1" "$2" "$3" "$4" "$5"
    check "RM $1 follows the single-rank run (losses, evaluations, final parameters within 1e-5)" \
        $PY tests/mpi/layouts_check.py same "$T/one" "$T/$1"
    metrics_same "$1"
done
# dp2 ZeRO-1 on emulated device ranks: bit for bit the CPU ranks' run.
run dp2z1emu 2 2 2 ', "zero_optimization": {"stage": 1}, "compute_backend": "emulated"'
check "RM dp2z1 on emulated device ranks equals dp2z1 on CPU ranks bit for bit" \
    $PY tests/mpi/layouts_check.py identical "$T/dp2z1" "$T/dp2z1emu"
# Stopped at step 6 under pp2 (the value head saved by the last stage) and resumed under tp2.
CKPT=6 run part1 2 4 2 ', "pipe_parallel_size": 2, "exit_interval": 6'
sed -e "s|\"log_dir\": \"$T/part1/log\", \"save\": \"$T/part1/ckpt\"|\"log_dir\": \"$T/part2/log\", \"save\": \"$T/part2/ckpt\"|" \
    -e "s|\"load\": \"$T/pre\", \"finetune\": true|\"load\": \"$T/part1/ckpt\"|" \
    -e 's/"pipe_parallel_size": 2, "exit_interval": 6/"model_parallel_size": 2/' "$T/part1.yml" >"$T/part2.yml"
check "RM: resumed under tp2 from the pp2 checkpoint" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/part2.yml"
check "RM: the resumed run continues the single-rank trajectory" $PY -c "
import json
def table(path):
    return {(r['iteration'], k): r[k] for r in map(json.loads, open(path)) for k in ('train/lm_loss', 'train/margin') if k in r}
a, b, c = table('$T/one/log/metrics.jsonl'), table('$T/part1/log/metrics.jsonl'), table('$T/part2/log/metrics.jsonl')
assert max(i for i, _ in b) == 6 and min(i for i, _ in c) == 7 and max(i for i, _ in c) == 12, (sorted(b), sorted(c))
both = {**b, **c}
bad = [(k, a[k], both[k]) for k in a if abs(a[k] - both[k]) > 1e-5 * max(abs(a[k]), 1e-2)]
assert a.keys() == both.keys() and not bad, bad[:5]"
