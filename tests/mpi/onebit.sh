# tests/mpi/onebit.sh: the 1-bit compressed all-reduce with error feedback (lib/gradient/onebit.c)
# on 2, 3 and 4 ranks against an independent numpy implementation (onebit_oracle.py): the outputs
# of several steps, the worker and server error buffers after them, and the sign packing.
source tests/lib.sh

PY=${PY:-.venv/bin/python}
DRIVER=build/cpu/tests/drivers/onebit_check
command -v "$MPIEXEC" >/dev/null || { skip "1-bit all-reduce" "$MPIEXEC is not installed"; exit 0; }
[ -x "$PY" ] || { skip "1-bit all-reduce" "no $PY (the numpy oracle)"; exit 0; }

for p in 2 3 4; do
    mkdir -p "$TEST_TMP/p$p"
    $PY tests/mpi/onebit_oracle.py gen "$TEST_TMP/p$p" $p 6
    check "1-bit all-reduce on $p ranks runs" timeout 60 $MPIEXEC -n $p $DRIVER "$TEST_TMP/p$p"
    check "1-bit all-reduce on $p ranks equals the numpy oracle (outputs, errors, packing)" \
        $PY tests/mpi/onebit_oracle.py check "$TEST_TMP/p$p" $p
done
