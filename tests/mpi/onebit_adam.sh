# tests/mpi/onebit_adam.sh: 1-bit Adam (lib/optim/onebit_adam.c with the compressed all-reduce of
# lib/gradient/onebit.c) on 2, 3 and 4 ranks against DeepSpeed's OnebitAdam restated in torch
# (onebit_adam_oracle.py), fed the same gradients: parameters, exp_avg and exp_avg_sq after every
# step of the warm-up and of the compression phase, on every rank.
source tests/lib.sh

PY=${PY:-.venv/bin/python}
DRIVER=build/cpu/tests/drivers/onebit_adam_check
command -v "$MPIEXEC" >/dev/null || { skip "1-bit Adam oracle" "$MPIEXEC is not installed"; exit 0; }
[ -x "$PY" ] || { skip "1-bit Adam oracle" "no $PY (the torch oracle)"; exit 0; }
export OMP_NUM_THREADS=1

for p in 2 3 4; do
    mkdir -p "$TEST_TMP/p$p"
    $PY tests/mpi/onebit_adam_oracle.py gen "$TEST_TMP/p$p" $p 14 5
    check "1-bit Adam on $p ranks runs" timeout 60 $MPIEXEC -n $p $DRIVER "$TEST_TMP/p$p"
    check "1-bit Adam on $p ranks equals DeepSpeed's OnebitAdam restated (every step, every rank)" \
        $PY tests/mpi/onebit_adam_oracle.py check "$TEST_TMP/p$p" $p
done
