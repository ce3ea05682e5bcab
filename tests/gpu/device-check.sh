#!/usr/bin/env bash
# device-check.sh: the check of the CUDA build on a bare GPU host: one with gcc, the CUDA toolkit
# (nvcc and its libraries) and a GPU, but none of the Debian packages the tools link and no network.
#   on a machine with apt and ../shared, once:  tests/gpu/device-check.sh --fetch
#   then copy the checkout with .deps to the GPU host and run there:  bash tests/gpu/device-check.sh
# --fetch downloads the Debian packages (runtime and -dev) that the full CUDA=1 tools need and a bare
# host lacks (libyaml, jansson, libmicrohttpd, utf8proc, zstd, zlib, HDF5 and what it links (libcurl and its
# TLS/Kerberos/LDAP libraries, libaec), OpenBLAS with libgfortran, MPICH with hwloc and UCX, mpiexec:
# 57 packages, about 45 MB) into .deps/, plus the benchmark's data (the GPT-2 tokenizer and Tiny
# Shakespeare from ../shared/data, 2.6 MB) into .deps/data, and the cudnn-frontend headers (make deps'
# .deps/cudnn-frontend) with cuDNN's own headers (.deps/cudnn/include); git ignores .deps. tests/run does not run
# this script (it is not a suite test).
# On the GPU host it unpacks the .deb files into /tmp (never into /), builds the four tools and
# the GPU tests with CUDA=1 for sm_90 against the unpacked copies (their folders in the binaries'
# RPATH, so no LD_LIBRARY_PATH is needed), checks with ldd that every library resolves, then runs,
# each under a time cap so the whole stays under 5 minutes:
#   1. the op-parity harness (every op CUDA vs CPU, verbose: the largest error of each check), after
#      its pipelined-attention checks alone (--attention, seconds, the backward as one pass and as two;
#      if they crash, the two passes alone, and the rest of the run uses the two-pass backward if they
#      pass, else the first tensor-core attention kernels),
#   2. the op speed at the 125M shapes against cuBLAS and copy bandwidth (bench/gpu_ops.c), which
#      also measures the bf16 GEMM rate that MFU is taken against, and the MLP's products with the
#      exact GELU fused as cuDNN graphs against cuBLASLt's product with GELU's pass apart (the rate
#      bench/gpu_predict assumes for them),
#   3. 125M training throughput in bf16 (bench/gpu_train.sh: tokens/s, MFU vs the measured bf16 GEMM
#      rate and vs the H200's nominal 989 TFLOP/s), the number that matters most, early, with the
#      measured per-op profile by class (wall_clock_breakdown) beside bench/gpu_predict's roofline
#      prediction of the same step at the GEMM rate measured in 2,
#   4. the NCCL parity test (tests/gpu/nccl_parity.c: every collective through NCCL vs MPI, one rank
#      on every GPU),
#   5. the end-to-end parity run (tests/gpu/e2e.sh: tiny models trained on cuda vs cpu in fp32 and
#      bf16, resume bit-exact on cuda, fp16 loss scaling on a forced overflow; with 2+ GPUs dp2 with
#      overlap_comm against one rank),
#   6. with --sanitizers only: the harness under compute-sanitizer's memcheck and racecheck where that
#      tool can reach the device (some sandboxed hosts refuse it) and time is left,
# and writes everything into $OUT (a handful of files: the small ones are also appended to
# summary.txt):
#   summary.txt, build.log, op_parity_attention.txt (and _two_pass.txt after a crash), op_parity.txt, e2e.txt, gpu_train.txt, details.txt
#   (device, gpu_ops, ldd, sanitizers, and the op-parity rerun under NEOX_CUDA_SYNC=1 when the harness
#   crashed)
# Exit status: 0 when every check that ran passed.
# Run here (no GPU), it does the same unpack, build and link check and reports each GPU part skipped:
# the dry run of the whole script.
set -uo pipefail
cd "$(dirname "$0")/../.."

# ==== fetch (a machine with apt) ==================================================================
# The Debian packages carried to the GPU host. Every shared library the CUDA=1 tools load (ldd of
# neox-train, neox-eval, neox-convert, neox-preprocess, mpiexec) except glibc, libstdc++, libgcc_s,
# libgomp (gcc's own) and the CUDA libraries, plus the -dev packages whose headers the build reads.
FETCH_DEBS=(
    libyaml-0-2 libyaml-dev                          # configs
    libjansson4 libjansson-dev                       # JSON
    libmicrohttpd12 libmicrohttpd-dev                # neox-eval serve's HTTP server (links GnuTLS, below)
    libutf8proc2 libutf8proc-dev                     # tokenizers
    libpcre2-8-0 libpcre2-dev                        # pre-tokenizer regexes
    libsentencepiece0 libsentencepiece-dev           # SentencePiece models
    libzstd1 libzstd-dev zlib1g zlib1g-dev           # compressed corpora (HDF5 links zlib too)
    libhdf5-103-1 libhdf5-dev libsz2 libaec0         # checkpoints; HDF5's szip filter
    libcurl4 libnghttp2-14 libidn2-0 libunistring2 librtmp1 libssh2-1 libpsl5 libssl3 libbrotli1
    libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
    libldap-2.5-0 libsasl2-2 libgnutls30 libp11-kit0 libffi8 libtasn1-6 libnettle8 libhogweed6 libgmp10
                                                     # ^ libcurl and its libraries (HDF5's ROS3 driver links it)
    libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0   # CPU GEMM
    libmpich12 libmpich-dev libhwloc15 libucx0 libnuma1 libudev1             # MPI
    libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200   # what UCX's InfiniBand modules load
    mpich libslurm38                                 # mpiexec (hydra links libslurm)
)
# The benchmark's corpus and tokenizer (../shared is not on the GPU host).
FETCH_DATA=(tokenizers/gpt2/vocab.json tokenizers/gpt2/merges.txt text/tinyshakespeare_input.txt)
if [ "${1:-}" = --fetch ]; then
    set -e
    rm -rf .deps && mkdir -p .deps/data
    (cd .deps && apt-get download "${FETCH_DEBS[@]}")
    for f in "${FETCH_DATA[@]}"; do cp "${SHARED:-../shared}/data/$f" .deps/data/; done
    # cuDNN's fused attention: the cudnn-frontend headers (PyPI's wheel, as make deps installs them), and
    # cuDNN's own headers from this toolkit, for a GPU host whose CUDA folder has libcudnn but no cudnn.h.
    scripts/deps.sh --cudnn-frontend
    mkdir -p .deps/cudnn/include && cp "${CUDA_HOME:-/usr/local/cuda}"/include/cudnn*.h .deps/cudnn/include/
    ls -l .deps/*.deb .deps/data && du -sh .deps && du -sb .deps
    exit 0
fi

RUN_SANITIZERS=0
[ "${1:-}" = --sanitizers ] && RUN_SANITIZERS=1
OUT=${OUT:-/tmp/neox-device-out}
mkdir -p "$OUT"
summary=$OUT/summary.txt details=$OUT/details.txt
: >"$summary"; : >"$details"
note() { echo "$*" | tee -a "$summary"; }
section() { printf '\n==== %s\n' "$*" >>"$details"; }
start=$(date +%s)
DEADLINE=$((start + ${NEOX_DEVICE_CHECK_SECONDS:-285}))
# cap SECONDS: a part's time limit: SECONDS, or what is left before the deadline if less (at least 1).
cap() { local left=$((DEADLINE - $(date +%s))); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }
status=0
fail() { note "FAIL: $*"; status=1; }

# ==== the machine ===================================================================================
# nvcc need not be on PATH: the toolkit's usual folder serves (CUDA_HOME names another).
if ! command -v nvcc >/dev/null 2>&1; then
    for d in "${CUDA_HOME:-}" /usr/local/cuda; do [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && { export PATH=$d/bin:$PATH; break; }; done
fi
command -v nvcc >/dev/null 2>&1 || { note "FAIL: nvcc is neither on PATH nor in ${CUDA_HOME:-/usr/local/cuda}/bin"; exit 2; }
section device
{ nvidia-smi; nvcc --version; gcc --version | head -1; uname -a; } >>"$details" 2>&1
note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# ==== carried packages ==============================================================================
DEPS=/tmp/neox-deps
rm -rf "$DEPS" && mkdir -p "$DEPS"
if ! ls .deps/*.deb >/dev/null 2>&1; then
    note "FAIL: no .deps/*.deb: run tests/gpu/device-check.sh --fetch on a machine with apt and copy .deps here"; exit 2
fi
unpack() {  # unpack DEB: dpkg -x, or (no dpkg) the .deb's ar members by hand
    if command -v dpkg >/dev/null 2>&1; then dpkg -x "$1" "$DEPS"; return; fi
    local tmp; tmp=$(mktemp -d) && (cd "$tmp" && ar x "$OLDPWD/$1" && tar -xf data.tar.* -C "$DEPS") && rm -rf "$tmp"
}
for f in .deps/*.deb; do unpack "$f" || { note "FAIL: unpacking $f"; exit 2; }; done
L=$DEPS/usr/lib/x86_64-linux-gnu
# Every folder of carried libraries (usrmerge splits them between /usr/lib and /lib).
LIBDIRS=$L/openblas-pthread:$L:$DEPS/lib/x86_64-linux-gnu
INCS="-I$DEPS/usr/include -I$DEPS/usr/include/x86_64-linux-gnu -I$DEPS/usr/include/hdf5/serial"
INCS+=" -I$DEPS/usr/include/x86_64-linux-gnu/openblas-pthread -I$DEPS/usr/include/x86_64-linux-gnu/mpich"
# DT_RPATH (not RUNPATH) so the libraries' own dependencies (HDF5's libcurl, ...) resolve there too.
RPATH="-Wl,--disable-new-dtags -Wl,-rpath,$LIBDIRS -Wl,-rpath-link,$LIBDIRS"
BLAS_LIBS="-L$L/openblas-pthread -lopenblas $RPATH"
PKG_LIBS_DEPS="-L$L -L$L/hdf5/serial -lyaml -ljansson -lmicrohttpd -lutf8proc -lpcre2-8 -lsentencepiece -lzstd -lz -lhdf5 $BLAS_LIBS -lmpich"
# mpiexec: hydra's programs have no RPATH, so a wrapper gives them the carried libraries.
mkdir -p "$DEPS/bin"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LIBDIRS" "$DEPS/usr/bin/mpiexec.hydra" >"$DEPS/bin/mpiexec"
chmod +x "$DEPS/bin/mpiexec"
export PATH=$DEPS/bin:$DEPS/usr/bin:$PATH MPIEXEC=$DEPS/bin/mpiexec

# ==== the CUDA toolkit: headers and libraries where the Makefile expects them =======================
# CUDA_HOME must hold include/{cublas_v2.h,nccl.h} and lib64/lib{cublas,cublasLt,cudart,nccl}.so. When
# the toolkit's folder lacks some (pip's nvidia-* packages, or /usr for NCCL, may hold them instead), a
# folder of links stands in for it.
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
cuda_complete() {
    local h l
    for h in cublas_v2.h nccl.h; do [ -e "$1/include/$h" ] || return 1; done
    for l in cublas cublasLt cudart nccl; do [ -e "$1/lib64/lib$l.so" ] || return 1; done
}
if ! cuda_complete "$CUDA_HOME"; then
    home=/tmp/neox-cuda-home
    rm -rf "$home" && mkdir -p "$home/include" "$home/lib64"
    py_nvidia=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]) + "/nvidia")' 2>/dev/null || true)
    link_all() {  # link_all DEST PATTERN DIR...: links each DIR's files matching PATTERN into DEST (first wins)
        local dest=$1 pattern=$2 dir f; shift 2
        for dir in "$@"; do
            [ -d "$dir" ] || continue
            for f in "$dir"/$pattern; do [ -e "$f" ] && [ ! -e "$dest/${f##*/}" ] && ln -s "$f" "$dest/"; done
        done
    }
    # The toolkit's and pip's folders whole; from /usr only NCCL (the rest of /usr must not shadow the
    # system headers or the carried libraries).
    link_all "$home/include" '*' "$CUDA_HOME/include" "$CUDA_HOME"/targets/x86_64-linux/include $py_nvidia/*/include $py_nvidia/*/*/include
    link_all "$home/include" 'nccl*' /usr/include
    link_all "$home/lib64" 'lib*.so*' "$CUDA_HOME/lib64" "$CUDA_HOME"/targets/x86_64-linux/lib $py_nvidia/*/lib $py_nvidia/*/*/lib
    link_all "$home/lib64" 'libnccl*.so*' /usr/lib/x86_64-linux-gnu
    for name in cublas cublasLt cudart nccl; do  # the linker wants the unversioned name
        [ -e "$home/lib64/lib$name.so" ] || { v=$(ls "$home"/lib64/lib$name.so.* 2>/dev/null | head -1); [ -n "$v" ] && ln -s "$v" "$home/lib64/lib$name.so"; }
    done
    CUDA_HOME=$home
    note "CUDA_HOME assembled from links in $home$(cuda_complete "$home" || echo ' (still incomplete: see build.log)')"
fi

# ==== build: the four tools and the GPU tests, CUDA=1, sm_90, against the carried packages ==========
make_args=(CUDA=1 CUDA_ARCHS=90 "CUDA_HOME=$CUDA_HOME" "PKG_CFLAGS=$INCS -DUTF8PROC_EXPORTS"
           "PKG_LIBS=$PKG_LIBS_DEPS" "OPENBLAS_LIBS=$BLAS_LIBS")
if ! make -j"$(nproc)" "${make_args[@]}" build/cuda/bin/neox-train build/cuda/bin/neox-eval \
        build/cuda/bin/neox-convert build/cuda/bin/neox-preprocess gpu-tests >"$OUT/build.log" 2>&1; then
    note "FAIL: build (last lines of build.log):"; tail -n 30 "$OUT/build.log" | tee -a "$summary"; exit 1
fi
note "build: ok in $(( $(date +%s) - start )) s; warnings: $(grep -c -i 'warning' "$OUT/build.log")"

# ==== link check: every library resolves, from the carried set, CUDA or the base system ==============
# Base: what any machine with gcc has (glibc, libstdc++, libgcc_s, libgomp). Anything else found outside
# the carried folders means the carried set is incomplete (the binary would fail on a bare machine).
section "ldd (carried: $DEPS; CUDA: $CUDA_HOME)"
BIN=build/cuda/bin
outside=()
for b in "$BIN"/neox-* build/cuda/tests/gpu/op_parity build/cuda/bench/gpu_ops "$DEPS/usr/bin/mpiexec.hydra"; do
    if [ "${b##*/}" = mpiexec.hydra ]; then libs=$(LD_LIBRARY_PATH=$LIBDIRS ldd "$b" 2>&1)   # as the wrapper runs it
    else libs=$(env -u LD_LIBRARY_PATH ldd "$b" 2>&1); fi
    echo "$b:" >>"$details"; echo "$libs" >>"$details"
    grep -q 'not found' <<<"$libs" && fail "ldd $b: $(grep 'not found' <<<"$libs" | tr -s ' \t' ' ' | tr '\n' ';')"
    while read -r path; do
        case $path in
            "$DEPS"/*|"$CUDA_HOME"/*|/usr/local/cuda*|*/nvidia/*) ;;
            */libc.so*|*/libm.so*|*/libmvec.so*|*/libpthread.so*|*/libdl.so*|*/librt.so*|*/libresolv.so*|*/ld-linux*) ;;
            */libstdc++.so*|*/libgcc_s.so*|*/libgomp.so*) ;;
            *) outside+=("${b##*/}: $path") ;;
        esac
    done < <(awk '/=>/ && $3 ~ /^\// {print $3}' <<<"$libs")
done
if [ ${#outside[@]} -gt 0 ]; then note "link check: libraries from outside the carried set: ${outside[*]}"
else note "link check: every library is carried, CUDA's or the base system's"; fi
export PATH=$PWD/$BIN:$PATH

# ==== op parity =====================================================================================
harness=build/cuda/tests/gpu/op_parity
# First the pipelined attention kernels alone (kernels/cuda/attention_fa2.cu, which no GPU had run when
# they were written), their backward as the single pass and as the two passes: seconds, every launch
# waited for, so a fault names its kernel. If they crash, the two passes alone are tried; if those pass,
# the full harness and everything after run with NEOX_ATTENTION_BACKWARD=two-pass, else on the first
# tensor-core kernels (NEOX_ATTENTION_KERNELS=first).
NEOX_CUDA_SYNC=1 timeout "$(cap 45)" "$harness" -v --attention >"$OUT/op_parity_attention.txt" 2>&1
early=$?
note "op parity, pipelined attention first: exit $early; $(grep -c '^ok' "$OUT/op_parity_attention.txt") ok, $(grep -c '^not ok' "$OUT/op_parity_attention.txt") not ok"
grep -A1 '^not ok' "$OUT/op_parity_attention.txt" | tee -a "$summary"
[ $early -ne 0 ] && status=1
if [ $early -ne 0 ] && [ $early -ne 1 ]; then
    # A crash or a hang (timeout: 124) in the single-pass backward leaves its two passes to try alone.
    note "the pipelined attention checks crashed (last lines below): again with NEOX_ATTENTION_BACKWARD=two-pass"
    tail -n 5 "$OUT/op_parity_attention.txt" | tee -a "$summary"
    NEOX_ATTENTION_BACKWARD=two-pass NEOX_CUDA_SYNC=1 timeout "$(cap 45)" "$harness" -v --attention \
        >"$OUT/op_parity_attention_two_pass.txt" 2>&1
    two=$?
    note "op parity, pipelined attention with the two-pass backward: exit $two"
    if [ $two -eq 0 ] || [ $two -eq 1 ]; then
        note "the rest runs with NEOX_ATTENTION_BACKWARD=two-pass"
        export NEOX_ATTENTION_BACKWARD=two-pass
    else
        note "the pipelined attention kernels crashed: the rest runs with NEOX_ATTENTION_KERNELS=first"
        export NEOX_ATTENTION_KERNELS=first
    fi
fi
timeout "$(cap 120)" "$harness" -v >"$OUT/op_parity.txt" 2>&1
parity=$?
if grep -q '# SKIP' "$OUT/op_parity.txt"; then parity=3; note "FAIL: the harness saw no GPU"; fi
note "op parity: exit $parity; $(grep -c '^ok' "$OUT/op_parity.txt") ok, $(grep -c '^not ok' "$OUT/op_parity.txt") not ok"
grep -A1 '^not ok' "$OUT/op_parity.txt" | tee -a "$summary"
grep '^neox cuda: attention:' "$OUT/op_parity.txt" | sort -u | tee -a "$summary"  # which attention ran (cuDNN or why not)
grep -E '^neox cuda: (MLP product \+ GELU|biased product):' "$OUT/op_parity.txt" | sort -u | tee -a "$summary"  # likewise the MLP's GELU
[ $parity -ne 0 ] && status=1
if [ $parity -ne 0 ] && [ $parity -ne 1 ] && [ $parity -ne 3 ]; then
    # A crash (an abort inside an op): again with every launch waited for, to name the kernel.
    section "op parity with NEOX_CUDA_SYNC=1"
    NEOX_CUDA_SYNC=1 timeout "$(cap 60)" "$harness" -v >>"$details" 2>&1
    note "rerun with NEOX_CUDA_SYNC=1: exit $?; last lines:"; tail -n 5 "$details" | tee -a "$summary"
fi

# ==== op speed at the 125M shapes (bench/gpu_ops.c): ratios to cuBLAS fp32 and to a device copy ======
section gpu_ops
timeout "$(cap 60)" build/cuda/bench/gpu_ops >"$OUT/gpu_ops.tmp" 2>&1
note "gpu_ops: exit $?"; cat "$OUT/gpu_ops.tmp" | tee -a "$details" >>"$summary"
BF16_TFLOPS=$(awk '/^gemm bf16/ {for (i = 1; i < NF; i++) if ($(i + 1) == "TFLOP/s") print $i}' "$OUT/gpu_ops.tmp" | head -1)
rm -f "$OUT/gpu_ops.tmp"

# ==== training throughput: 125M, seq 2048, bf16 (bench/gpu_train.sh) ================================
# The number that matters most, so it runs right after the GEMM rate it is measured against. At
# micro-batch 32 a step is about 5.96e13 model FLOPs by GPT-NeoX's formula (3 x 24·B·s·l·h²·(1 + s/6h +
# V/16lh)), a quarter of them attention's: 2 warm-up steps and at most 10 measured, in 150 s.
left=$(cap 150)
if [ "$left" -lt 40 ]; then
    note "gpu_train: not run (${left} s left of the time budget)"; status=1
else
    NEOX_BIN=$BIN timeout "$left" bash bench/gpu_train.sh data=.deps/data gemm_tflops="${BF16_TFLOPS:-}" \
        warmup=2 steps=10 seconds=$((left - 10)) profile=1 >"$OUT/gpu_train.txt" 2>&1
    bench=$?
    note "gpu_train: exit $bench"; [ $bench -ne 0 ] && status=1
    # The measured step, its per-op profile by class, and bench/gpu_predict's prediction beside them.
    grep -E '^(#|gpu_train|micro|steps|tokens|model|MFU|result|measured|predict|  [a-z])' "$OUT/gpu_train.txt" | tee -a "$summary"
fi

# ==== NCCL parity (tests/gpu/nccl_parity.c) =========================================================
# The communication layer on device buffers through NCCL against MPI on host copies, collective by
# collective, plus stream order, held sends and the gradient reducer on the device. One rank on every
# GPU of the host (NCCL refuses two ranks on one device); with one GPU an MPI singleton.
section "nccl parity"
if make -j"$(nproc)" "${make_args[@]}" "MPI_LIBS=$PKG_LIBS_DEPS" nccl-tests >>"$details" 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); ranks=$(( gpus < 1 ? 1 : gpus ))
    launch=(); [ "$ranks" -gt 1 ] && launch=("$MPIEXEC" -n "$ranks")
    NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout "$(cap 60)" "${launch[@]}" build/cuda/tests/gpu/nccl_parity >"$OUT/nccl.tmp" 2>&1
    nccl=$?
    note "nccl parity ($ranks rank(s)): exit $nccl; $(grep -c '^ok' "$OUT/nccl.tmp") ok, $(grep -c '^not ok' "$OUT/nccl.tmp") not ok"
    grep -E '^not ok|# SKIP' "$OUT/nccl.tmp" | tee -a "$summary"
    { [ $nccl -ne 0 ] || grep -q '# SKIP' "$OUT/nccl.tmp"; } && status=1
    cat "$OUT/nccl.tmp" >>"$details"; rm -f "$OUT/nccl.tmp"
else
    fail "nccl parity: build (details.txt)"
fi

# ==== end-to-end parity: tiny models, cuda vs cpu (tests/gpu/e2e.sh) =================================
NEOX_BIN=$BIN timeout "$(cap 90)" bash tests/gpu/e2e.sh >"$OUT/e2e.txt" 2>&1
e2e=$?
note "e2e: exit $e2e; $(grep '^ok' "$OUT/e2e.txt" | grep -vc '# SKIP') ok, $(grep -c '^not ok' "$OUT/e2e.txt") not ok, $(grep -c '# SKIP' "$OUT/e2e.txt") skipped"
grep -E '^(not ok|ok .*# SKIP|# [^ ])' "$OUT/e2e.txt" | tee -a "$summary"   # failures, findings (details in e2e.txt)
{ [ $e2e -ne 0 ] || grep -q '^not ok\|# SKIP' "$OUT/e2e.txt"; } && status=1

# ==== memory and race checks (with --sanitizers, where compute-sanitizer can run and time is left) ======
# Not in the first pass: they take minutes, and the numbers above come first.
sanitizer=$(command -v compute-sanitizer || ls "$CUDA_HOME"/bin/compute-sanitizer /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
if [ "$RUN_SANITIZERS" != 1 ]; then
    note "compute-sanitizer: not run (pass --sanitizers to run memcheck and racecheck)"
elif [ -z "$sanitizer" ]; then
    note "compute-sanitizer: not found"
else
    for tool in memcheck racecheck; do
        left=$(cap 90)
        if [ "$left" -lt 30 ]; then note "compute-sanitizer $tool: not run (${left} s left of the time budget)"; continue; fi
        section "compute-sanitizer $tool"
        timeout "$left" "$sanitizer" --tool "$tool" --error-exitcode 99 "$harness" >"$OUT/$tool.tmp" 2>&1
        note "compute-sanitizer $tool: exit $? ($(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY|not supported' "$OUT/$tool.tmp"))"
        cat "$OUT/$tool.tmp" >>"$details"; rm -f "$OUT/$tool.tmp"
    done
fi
note "total: $(( $(date +%s) - start )) s"
exit $status
