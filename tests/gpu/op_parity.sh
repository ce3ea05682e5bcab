# op_parity.sh: the CUDA backend against the CPU backend, op by op (tests/gpu/op_parity.c), in the
# gpu suite of tests/run. Where no GPU is visible the harness prints one "# SKIP no GPU: skipped"
# line, counted as skipped (not passed). Its own plumbing is checked everywhere with --self.
. tests/lib.sh
bin=build/cuda/tests/gpu/op_parity
if [ ! -x "$bin" ]; then
    if command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
        echo "not ok - op parity: $bin is not built (make cuda-check builds it)"
    else
        skip "op parity" "no nvcc: the CUDA variant is not built"
    fi
    exit 0
fi
check "op parity harness compares the CPU backend with itself exactly" "$bin" --self
"$bin"
