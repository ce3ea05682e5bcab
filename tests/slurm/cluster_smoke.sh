# cluster_smoke.sh: the test SLURM comes up on localhost, runs a batch job, and launches MPI ranks
# with `srun --mpi=pmi2` (how jobs/train.sbatch starts neox-train).
source tests/lib.sh
source tests/slurm/cluster.lib
trap 'slurm_stop; rm -rf "$TEST_TMP"' EXIT

if ! slurm_start "$TEST_TMP/slurm" >"$TEST_TMP/start.log" 2>&1; then
    echo "not ok - a single-node SLURM starts on localhost"; sed 's/^/#   /' "$TEST_TMP/start.log"; exit 0
fi
echo "ok - a single-node SLURM starts on localhost"

printf '#!/bin/bash\necho "job $SLURM_JOB_ID ran with $SLURM_NTASKS task(s)"\n' >"$TEST_TMP/job.sh"
id=$(sbatch --parsable -n 1 -o "$TEST_TMP/job.out" "$TEST_TMP/job.sh")
for _ in $(seq 60); do [ -s "$TEST_TMP/job.out" ] && break; sleep 0.5; done
check "sbatch runs a batch job" grep -q "^job $id ran with 1 task(s)$" "$TEST_TMP/job.out"

timeout 120 srun --mpi=pmi2 -n 2 build/cpu/tests/drivers/parallel_check 1 2 >"$TEST_TMP/srun.out" 2>&1
check "srun --mpi=pmi2 starts MPICH ranks that form a grid" grep -q '^ok - pp1 tp2 dp1: grid coordinates' "$TEST_TMP/srun.out"
check "every collective passes under srun" \
    test "$(grep -c '^ok - ' "$TEST_TMP/srun.out")" -ge 10 -a "$(grep -c '^not ok' "$TEST_TMP/srun.out")" = 0
