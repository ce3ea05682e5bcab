# tests/slurm/preempt.sh: jobs/train.sbatch preempted twice mid-run on the test SLURM, on 2 ranks
# (srun --mpi=pmi2), with dropout and gradient accumulation: first `scancel --signal=USR1` (to the
# ranks), then, after the requeued job has resumed, `scancel --batch --signal=USR1` (to the job
# script, which passes it on, as with #SBATCH --signal=B:USR1@120). Each time the trainer saves and
# exits 3 and the template requeues the job. The job ends COMPLETED after two restarts with every
# iteration logged once and losses, gradient norms, learning rates and evaluations bit-identical to
# the same job left alone.
source tests/lib.sh
source tests/slurm/jobs.lib
shakespeare_cluster "train.sbatch preemption"
char_dataset
ITERS=200
cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "rotary_pct": 0.25, "no_weight_tying": true, "hidden_dropout": 0.1, "attention_dropout": 0.1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "train_iters": $ITERS, "eval_interval": 50, "eval_iters": 2, "log_interval": 1, "checkpoint_factor": 1000,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "split": "949,50,1"
}
EOF
for run in straight preempted; do
    echo "{\"save\": \"$T/$run/checkpoints\", \"log_dir\": \"$T/$run/logs\"}" >"$T/$run.yml"
done
submit() {  # submit RUN: train.sbatch on 2 ranks; prints the job id
    sbatch --parsable --ntasks-per-node 2 --cpus-per-task 1 -o "$T/$1.out" -J "train-$1" \
        jobs/train.sbatch "$T/model.yml" "$T/$1.yml"
}
straight=$(submit straight)
job=$(submit preempted)
M=$T/preempted/logs/metrics.jsonl
at_least() { [ "$(iterations "$M")" -ge "$1" ]; }

check "the job trains (20 iterations logged)" wait_for 60 at_least 20
check "scancel --signal=USR1 reaches the ranks" scancel --signal=USR1 "$job"
first_stop() { grep -q 'requeueing job' "$T/preempted.out"; }
check "the trainer saves, exits 3 and the job requeues itself" wait_for 60 first_stop
resumed() { [ "$(grep -c 'resuming from' "$T/preempted.out")" -ge "$1" ]; }
check "the requeued job starts again and resumes from the checkpoint" wait_for 90 resumed 1
stopped_at=$(sed -n 's/.*stopping at iteration \([0-9]*\).*/\1/p' "$T/preempted.out" | head -1)
check_output "it resumes at the iteration it stopped at" "global_step${stopped_at:-none}" \
    grep -m1 'resuming from' "$T/preempted.out"
check "the resumed run trains 20 more iterations" wait_for 60 at_least $((${stopped_at:-0} + 20))
check "scancel --batch --signal=USR1 reaches the job script, which passes it on" \
    scancel --batch --signal=USR1 "$job"
second_stop() { [ "$(grep -c 'requeueing job' "$T/preempted.out")" = 2 ]; }
check "the trainer saves and the job requeues a second time" wait_for 60 second_stop
jobs_done "both jobs complete with status 0" 240 "$T" "$straight" "$job"

check_output "slurmctld counts two restarts" '^2$' job_field "$job" Restarts
check_output "the left-alone job never restarted" '^0$' job_field "$straight" Restarts
check "two stops by a signal, two resumes, in the job log" bash -c \
    "[ \$(grep -c 'stop requested by a signal' '$T/preempted.out') = 2 ] && [ \$(grep -c 'resuming from' '$T/preempted.out') = 2 ]"
check_output "latest names the last iteration" "^global_step$ITERS\$" cat "$T/preempted/checkpoints/latest"
check "every iteration 1..$ITERS is logged exactly once" python3 tests/slurm/slurm_check.py iterations "$M" $ITERS
check "losses, gradient norms, learning rates and evaluations equal the uninterrupted job's" \
    python3 tests/tools/train_lib.py same "$T/straight/logs/metrics.jsonl" "$M" \
    train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss,test/lm_loss

# Outside SLURM the same template runs mpiexec; a SIGTERM to it saves and exits 3 (no requeue).
echo "{\"save\": \"$T/plain/checkpoints\", \"log_dir\": \"$T/plain/logs\"}" >"$T/plain.yml"
plain_stop() {
    env -u SLURM_CONF NEOX_NPROCS=2 NEOX_MPIEXEC="$MPIEXEC" bash jobs/train.sbatch "$T/model.yml" "$T/plain.yml" \
        >"$T/plain.out" 2>&1 &
    local pid=$!
    wait_for 60 eval '[ "$(iterations "$T/plain/logs/metrics.jsonl")" -ge 10 ]' || { kill $pid; return 1; }
    kill -TERM $pid
    local status=0
    wait $pid || status=$?
    cat "$T/plain.out"
    [ $status = 3 ] && grep -q 'run the same command again to resume' "$T/plain.out" && [ -f "$T/plain/checkpoints/latest" ]
}
check "outside SLURM: mpiexec -n 2, SIGTERM to the script saves and exits 3" plain_stop
check "outside SLURM: running it again resumes and finishes" bash -c \
    "env -u SLURM_CONF NEOX_NPROCS=2 NEOX_MPIEXEC='$MPIEXEC' bash jobs/train.sbatch '$T/model.yml' '$T/plain.yml' &&
     python3 tests/tools/train_lib.py same '$T/straight/logs/metrics.jsonl' '$T/plain/logs/metrics.jsonl' train/lm_loss,train/grad_norm"
