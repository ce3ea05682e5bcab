# parallel.sh: the process grid and the collectives of lib/parallel under mpiexec, for every
# layout of 4 ranks, plus the failure drills: a rank that dies ends the whole job quickly, and a
# layout that does not divide the world is refused.
source tests/lib.sh

DRIVER=${DRIVER:-build/cpu/tests/drivers/parallel_check}

for layout in "1 1" "1 2" "2 1" "2 2" "1 4" "4 1"; do
    # The driver prints its own TAP lines from rank 0.
    timeout 60 $MPIEXEC -n 4 "$DRIVER" $layout 2>"$TEST_TMP/stderr" || {
        echo "not ok - layout $layout: exited $?"; sed 's/^/#   /' "$TEST_TMP/stderr" | head -20; }
done

start=$(date +%s)
timeout 60 $MPIEXEC -n 4 "$DRIVER" die 2 x >"$TEST_TMP/die.out" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
check "a rank that dies ends the job with a failure status" test "$status" -ne 0 -a "$status" -ne 124
check "the dying rank's message names it" grep -q '\[rank 2\] error: deliberate failure on rank 2' "$TEST_TMP/die.out"
check "the job ends within seconds, not at the timeout ($elapsed s)" test "$elapsed" -lt 30

check_fails "a layout that does not divide the world is refused" 2 \
    "4 ranks cannot be divided into pipe_parallel_size 3 x model_parallel_size 1" \
    timeout 60 $MPIEXEC -n 4 "$DRIVER" 3 1

for n in 2 3 4; do
    timeout 60 $MPIEXEC -n $n build/cpu/tests/drivers/grad_reducer_check 2>"$TEST_TMP/stderr" || {
        echo "not ok - gradient reduction on $n ranks: exited $?"; sed 's/^/#   /' "$TEST_TMP/stderr" | head -20; }
done
