# cudnn_graphs.sh: every cuDNN graph the model uses (attention; the MLP's products with GELU fused)
# passes cudnn-frontend's validate() for sm_90, without a GPU (tests/gpu/cudnn_graphs.c), in the gpu
# suite of tests/run. Skipped where the CUDA variant cannot be built (no nvcc) or libcudnn does not
# load; a CUDA build without the cudnn-frontend headers (make deps) fails here, since its attention
# would never use cuDNN.
. tests/lib.sh
bin=build/cuda/tests/gpu/cudnn_graphs
if [ ! -x "$bin" ]; then
    if command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
        echo "not ok - cuDNN attention graphs: $bin is not built (make cuda-check builds it)"
    else
        skip "cuDNN attention graphs" "no nvcc: the CUDA variant is not built"
    fi
    exit 0
fi
"$bin"
