# launcher.sh: tools started by mpiexec know their rank and world size from the launcher and tag
# their messages with the rank.
source tests/lib.sh

out=$TEST_TMP/mpi.out
printf 'no_such_key: 1\n' >"$TEST_TMP/bad.yml"
$MPIEXEC -n 2 "$NEOX_BIN/neox-train" --print-config "$TEST_TMP/bad.yml" >"$out" 2>&1
status=$?
check "mpiexec -n 2 neox-train with a bad config fails" test "$status" -ne 0
check "rank 0 tags its error" grep -q '^neox-train: \[rank 0\] error: ' "$out"
check "rank 1 tags its error" grep -q '^neox-train: \[rank 1\] error: ' "$out"
