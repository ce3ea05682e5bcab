# tests/mpi/kto.sh: KTO (train_impl: kto) under data, tensor and pipeline parallelism. The same
# pre-trained policy is fine-tuned on the same unpaired examples (tests/tools/kto_data.py) with the
# same micro-batches on one rank, dp2 with ZeRO-1, tp2, dp2+tp2, pp2 and tp2+pp2 (KTO's loss takes
# each micro-batch's halves as each other's KL baselines, so every layout keeps micro-batches of 4
# and spreads the steps' two micro-batches over ranks or accumulation); the losses, evaluations,
# GPT-NeoX's KTO metrics and final parameters must equal the single-rank run's within 1e-5 relative.
# A run stopped under pp2 resumes under tp2 on the same trajectory (the reference read back).
source tests/lib.sh

NAME="KTO layouts"
source tests/post_training_setup.sh
check "write the examples" $PY tests/tools/kto_data.py "$TEXT" "$T/ex" 0 200 16 15 1

E=$T/ex
split() {
    echo "\"$1_data_paths\": [\"${E}_messages_document\"], \"$1_label_data_paths\": [\"${E}_messages_label_document\"],
      \"$1_reward_data_paths\": [\"${E}_messages_reward_document\"]"
}
# run NAME RANKS ACCUM EXTRA: 12 KTO steps of two micro-batches of 4, then the export.
run() {
    cat >"$T/$1.yml" <<EOF2
{$MODEL, "train_impl": "kto", "kto_beta": 1.0, "kto_undesirable_weight": 1.5, "pack_impl": "unpacked",
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "clip_grad": 1.0, "train_iters": 12, "eval_interval": 6,
 "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": $3, "load": "$T/pre", "finetune": true,
 "log_dir": "$T/$1/log", "save": "$T/$1/ckpt", "checkpoint_factor": ${CKPT:-12},
 $(split train), $(split valid), $(split test) $4}
EOF2
    local launch=()
    [ "$2" -gt 1 ] && launch=("$MPIEXEC" -n "$2")
    check "KTO $1: train on $2 rank(s)" "${launch[@]}" "$TRAIN" -q "$T/$1.yml"
    check "KTO $1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
# Log-probability sums are compared relative to their size; the KL estimate, policy rewards and
# reward accuracy (differences of those sums) to 1e-5 of the reference's sums.
metrics_same() {
    check "KTO $1: GPT-NeoX's KTO metrics equal the single-rank run's" $PY -c "
import json
SUMS = ('ref_logp', 'policy_logp', 'pos_ref_logp', 'neg_ref_logp', 'pos_policy_logp', 'neg_policy_logp')
DIFFS = ('kl', 'reward_acc', 'policy_rewards')
def table(run):
    return {(r['iteration'], k): r[k] for r in map(json.loads, open(run + '/log/metrics.jsonl'))
            for k in r if k.split('/')[-1] in SUMS + DIFFS}
a, b = table('$T/one'), table('$T/$1')
assert len(a) > 100 and a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
def tol(it, k):
    split, name = k.split('/')
    return 1e-5 * (abs(a[(it, k)]) if name in SUMS else abs(a[(it, split + '/ref_logp')]))
bad = [(k, a[k], b[k]) for k in a if abs(a[k] - b[k]) > tol(*k)]
assert not bad, bad[:5]
print(len(a), 'values compared')"
}
run one 1 2 ""
for spec in "dp2z1 2 1 ', \"zero_optimization\": {\"stage\": 1}'" "tp2 2 2 ', \"model_parallel_size\": 2'" \
            "dp2tp2 4 1 ', \"model_parallel_size\": 2'" "pp2 2 2 ', \"pipe_parallel_size\": 2'" \
            "tp2pp2 4 2 ', \"pipe_parallel_size\": 2, \"model_parallel_size\": 2'"; do
    eval "set -- $spec"
    run "$1" "$2" "$3" "$4"
    check "KTO $1 follows the single-rank run (losses, evaluations, final parameters within 1e-5)" \
        $PY tests/mpi/layouts_check.py same "$T/one" "$T/$1"
    metrics_same "$1"
done
# dp2 x tp2 on emulated device ranks: bit for bit the CPU ranks' run.
run dp2tp2emu 4 1 ', "model_parallel_size": 2, "compute_backend": "emulated"'
check "KTO dp2tp2 on emulated device ranks equals dp2tp2 on CPU ranks bit for bit" \
    $PY tests/mpi/layouts_check.py identical "$T/dp2tp2" "$T/dp2tp2emu"
# Stopped at step 6 under pp2 and resumed under tp2: the reference, saved by both stages, is read
# back into the other layout.
CKPT=6 run part1 2 2 ', "pipe_parallel_size": 2, "exit_interval": 6'
sed -e "s|\"log_dir\": \"$T/part1/log\", \"save\": \"$T/part1/ckpt\"|\"log_dir\": \"$T/part2/log\", \"save\": \"$T/part2/ckpt\"|" \
    -e "s|\"load\": \"$T/pre\", \"finetune\": true|\"load\": \"$T/part1/ckpt\"|" \
    -e 's/"pipe_parallel_size": 2, "exit_interval": 6/"model_parallel_size": 2/' "$T/part1.yml" >"$T/part2.yml"
check "KTO: resumed under tp2 from the pp2 checkpoint" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/part2.yml"
check "KTO: the resumed run continues the single-rank trajectory" $PY -c "
import json
def table(path):
    return {(r['iteration'], k): r[k] for r in map(json.loads, open(path)) for k in ('train/lm_loss', 'train/kl') if k in r}
a, b, c = table('$T/one/log/metrics.jsonl'), table('$T/part1/log/metrics.jsonl'), table('$T/part2/log/metrics.jsonl')
assert max(i for i, _ in b) == 6 and min(i for i, _ in c) == 7 and max(i for i, _ in c) == 12, (sorted(b), sorted(c))
both = {**b, **c}
def tol(k):
    return 1e-5 * max(abs(a[k]), 1e-2) if k[1] == 'train/lm_loss' else 1e-5 * 50
bad = [(k, a[k], both[k]) for k in a if abs(a[k] - both[k]) > tol(k)]
assert a.keys() == both.keys() and not bad, bad[:5]"
