# tests/mpi/devcomm.sh: the emulated device's collectives on two ranks (lib/parallel/emulated_comm.c,
# driven by tests/drivers/devcomm_check.c): every collective of lib/parallel on device buffers, and
# each rule of when a queued collective runs (before the next op for a blocking one; only after
# neox_wait for a non-blocking one, whose output reads NaN until then; in the order queued; 1F1B's
# isend-then-recv); and the overlapped gradient reducer on device gradients (equal to the host's bit
# for bit, every bucket still pending when backward ends, NaN when read before finish). A buffer written before its collective ran stops the job naming the collective;
# a rank that stalls inside a device collective ends the job under comm_timeout_seconds.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "emulated device collectives" "$MPIEXEC is not installed"; exit 0; }
DRIVER=${DRIVER:-build/cpu/tests/drivers/devcomm_check}

# The driver prints its own TAP lines from rank 0.
timeout 60 $MPIEXEC -n 2 "$DRIVER" 2>"$T/stderr" || {
    echo "not ok - the device collectives' driver exited $?"; sed 's/^/#   /' "$T/stderr" | head -20; }

check_fails "a buffer written before its all-reduce ran stops the job, naming the all-reduce" 1 \
    "a buffer of all-reduce on the data group .* changed between the call and when the device ran it" \
    timeout 60 $MPIEXEC -n 2 "$DRIVER" modify

start=$(date +%s)
check_fails "a rank late into a device all-reduce ends the job under comm_timeout_seconds: 1, naming it" 1 \
    "all_reduce on the data group made no progress for 1 s \(comm_timeout_seconds\): rank 1 did not respond" \
    timeout 60 $MPIEXEC -n 2 "$DRIVER" stall 20 1
took=$(( $(date +%s) - start ))
check "... within a few timeouts, not at the stalled rank's wake-up (${took} s)" test "$took" -lt 15
