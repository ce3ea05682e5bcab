# tests/mpi/dpo.sh: DPO (train_impl: dpo) under data and tensor parallelism. The same pre-trained
# policy is fine-tuned on the same preference pairs (tests/tools/dpo_pairs.py) with the same global
# batch on one rank, dp2 with ZeRO-1, tp2, dp2+tp2, pp2 and tp2+pp2; the losses (DPO's), evaluations,
# reward margins and final parameters must equal the single-rank run's within 1e-5 relative (the
# reference model is sharded and staged as the policy is, and the metrics are averaged over
# data-parallel ranks). A run stopped under pp2 resumes under tp2 on the same trajectory.
source tests/lib.sh

NAME="DPO layouts"
source tests/post_training_setup.sh
check "write the pairs" $PY tests/tools/dpo_pairs.py "$TEXT" "$T/pairs" 0 200 16 15 1

P=$T/pairs
split() {
    echo "\"pos_$1_data_paths\": [\"${P}_chosen_document\"], \"neg_$1_data_paths\": [\"${P}_rejected_document\"],
      \"pos_$1_label_data_paths\": [\"${P}_chosen_label_document\"], \"neg_$1_label_data_paths\": [\"${P}_rejected_label_document\"]"
}
# run NAME RANKS MICRO ACCUM EXTRA: 12 DPO steps of 8 pairs, then the export.
run() {
    cat >"$T/$1.yml" <<EOF2
{$MODEL, "train_impl": "dpo", "dataset_impl": "pairwise", "dpo_beta": 0.1, "pack_impl": "unpacked",
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "clip_grad": 1.0, "train_iters": 12, "eval_interval": 6,
 "train_micro_batch_size_per_gpu": $3, "gradient_accumulation_steps": $4, "load": "$T/pre", "finetune": true,
 "log_dir": "$T/$1/log", "save": "$T/$1/ckpt", "checkpoint_factor": ${CKPT:-12},
 $(split train), $(split valid), $(split test) $5}
EOF2
    local launch=()
    [ "$2" -gt 1 ] && launch=("$MPIEXEC" -n "$2")
    check "DPO $1: train on $2 rank(s)" "${launch[@]}" "$TRAIN" -q "$T/$1.yml"
    check "DPO $1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
# Rewards are beta times differences of sequence log-probabilities near -50: their agreement is
# measured against those sums (1e-5 of beta x |sum|), the sums themselves relative to their size.
margins_same() {
    check "DPO $1: log-probability sums, rewards, margins and accuracies equal the single-rank run's" $PY -c "
import json
SUMS = ('ref_pos', 'chosen_pos', 'chosen_neg')
DIFFS = ('margins', 'chosen_rewards', 'rejected_rewards', 'reward_acc')
def table(run):
    return {(r['iteration'], k): r[k] for r in map(json.loads, open(run + '/log/metrics.jsonl'))
            for k in r if k.split('/')[-1] in SUMS + DIFFS}
a, b = table('$T/one'), table('$T/$1')
assert a and a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
def tol(it, k):
    split, name = k.split('/')
    scale = abs(a[(it, k)]) if name in SUMS else 0.1 * abs(a[(it, split + '/ref_pos')])
    return 1e-5 * scale
bad = [(k, a[k], b[k]) for k in a if abs(a[k] - b[k]) > tol(*k)]
assert not bad, bad[:5]
print(len(a), 'values compared')"
}
run one 1 4 2 ""
for spec in "dp2z1 2 2 2 ', \"zero_optimization\": {\"stage\": 1}'" "tp2 2 4 2 ', \"model_parallel_size\": 2'" \
            "dp2tp2 4 2 2 ', \"model_parallel_size\": 2'" "pp2 2 4 2 ', \"pipe_parallel_size\": 2'" \
            "tp2pp2 4 4 2 ', \"pipe_parallel_size\": 2, \"model_parallel_size\": 2'"; do
    eval "set -- $spec"
    run "$1" "$2" "$3" "$4" "$5"
    check "DPO $1 follows the single-rank run (losses, evaluations, final parameters within 1e-5)" \
        $PY tests/mpi/layouts_check.py same "$T/one" "$T/$1"
    margins_same "$1"
done
# The same pipelined DPO on emulated device ranks (the device paths, collectives queued on the device's
# stream): bit for bit the CPU ranks' run.
run pp2emu 2 4 2 ', "pipe_parallel_size": 2, "compute_backend": "emulated"'
check "DPO pp2 on emulated device ranks equals pp2 on CPU ranks bit for bit" \
    $PY tests/mpi/layouts_check.py identical "$T/pp2" "$T/pp2emu"
# Stopped at step 6 under pp2 and resumed under tp2: the reference, saved by both stages, is read
# back into the other layout.
CKPT=6 run part1 2 4 2 ', "pipe_parallel_size": 2, "exit_interval": 6'
sed -e "s|\"log_dir\": \"$T/part1/log\", \"save\": \"$T/part1/ckpt\"|\"log_dir\": \"$T/part2/log\", \"save\": \"$T/part2/ckpt\"|" \
    -e "s|\"load\": \"$T/pre\", \"finetune\": true|\"load\": \"$T/part1/ckpt\"|" \
    -e 's/"pipe_parallel_size": 2, "exit_interval": 6/"model_parallel_size": 2/' "$T/part1.yml" >"$T/part2.yml"
check "DPO: resumed under tp2 from the pp2 checkpoint" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/part2.yml"
check "DPO: the resumed run continues the single-rank trajectory" $PY -c "
import json
def table(path):
    return {(r['iteration'], k): r[k] for r in map(json.loads, open(path)) for k in ('train/lm_loss', 'train/margins') if k in r}
a, b, c = table('$T/one/log/metrics.jsonl'), table('$T/part1/log/metrics.jsonl'), table('$T/part2/log/metrics.jsonl')
assert max(i for i, _ in b) == 6 and min(i for i, _ in c) == 7 and max(i for i, _ in c) == 12, (sorted(b), sorted(c))
both = {**b, **c}
bad = [(k, a[k], both[k]) for k in a if abs(a[k] - both[k]) > 1e-5 * max(abs(a[k]), 1e-2)]
assert a.keys() == both.keys() and not bad, bad[:5]"
