# nccl_parity.sh: the NCCL half of the communication layer against its MPI half, collective by
# collective, on device buffers (tests/gpu/nccl_parity.c), in the gpu suite of tests/run. One rank
# on every visible GPU (NCCL refuses two ranks of a communicator on one GPU), one rank on a
# machine with one GPU; where no GPU is visible the program prints one "# SKIP no GPU" line.
. tests/lib.sh
bin=build/cuda/tests/gpu/nccl_parity
if [ ! -x "$bin" ]; then
    if command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
        echo "not ok - nccl parity: $bin is not built (make cuda-check builds it)"
    else
        skip "nccl parity" "no nvcc: the CUDA variant is not built"
    fi
    exit 0
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
ranks=$(( gpus < 1 ? 1 : gpus ))
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
timeout 300 "$MPIEXEC" -n "$ranks" "$bin"
