# tests/gpu/e2e.sh: end-to-end parity of the CUDA backend, in the gpu suite of tests/run and
# run by tests/gpu/device-check.sh on a GPU host. Tiny models (tests/layout_config.sh) train 20
# steps with one record per step in metrics.jsonl; the final checkpoints are exported with
# `neox-convert to-hf` and compared by tests/gpu/e2e_check.py:
#   1. fp32, cuda vs cpu: losses (every step, validation, test), gradient norms and final parameters
#      within 1e-4 relative, for a GPT-NeoX model with attention and hidden dropout 0.1 and for a
#      Llama-style one (rmsnorm, swiglu, GQA, untied).
#   2. bf16 on cuda vs fp32 on cpu: losses within 2e-3 relative, gradient norms within 2e-2: ten times
#      what bf16 GEMM operands (and results) moved the same run in PyTorch (tests/gpu/bf16_tolerance.py:
#      1.3e-4 and 1.8e-3 at most over 10 seeds). Parameters are not compared: Adam turns 16-bit rounding
#      of near-zero gradients into steps of size lr.
#   3. resume on cuda: 10 steps, a checkpoint, 10 more steps from it, against the 20-step run: the
#      first run repeats the straight run's iterations 1..10 and the resumed run its 11..20 bit for
#      bit (every logged training and evaluation value and the final parameters).
#   4. fp16 on cuda with initial_scale_power 26 (a forced overflow): the first steps overflow and are
#      skipped; the logged loss scale follows DeepSpeed's rules (hysteresis 2, window 5) and the LR
#      schedule holds over skipped steps (tests/tools/loss_scale_oracle.py); steps are taken once the
#      scale is low enough.
#   5. optimizer offload with pinned buffers (gradients and weights on the copy stream): within 1e-4
#      of the fp32 cpu run, every gradient queued during backward, the weights waited for by forward.
#   6. with two or more GPUs: dp2 (ZeRO-1, overlap_comm, one rank per GPU, NCCL) against the one-rank
#      GPU run within 1e-4, the buckets still in flight when backward ended (comm_stats.json); dp2
#      ZeRO-3 at hidden 512 against dp2 stage 0 within 1e-4, each rank's device peak within 1% of its
#      plan and below stage 0's (the released units' granules given back); precision fp8 at pp2
#      against one GPU within 1e-5 (on sm_89 or newer; a comment line says when the GPU is older); a rank stopped by SIGSTOP
#      ending the job through comm_timeout_seconds (NCCL's watchdog); with one GPU a comment line says
#      it did not run.
#   7. the step captured as a CUDA graph (cuda_graph: true) and replayed: Llama-style, GPT-NeoX with
#      hidden and attention dropout (each micro-batch's masks' row read on the device) and fp16 with a
#      forced overflow (the moving loss scale read on the device): every logged value and the final
#      parameters equal the eager GPU run's bit for bit (the same kernels with the same arguments; the
#      learning rate and step from the step scalars in both), each run captured once, the log saying
#      how many steps were replayed.
# Without a GPU (the CUDA build's neox-train -V sees none) it prints one "# SKIP no GPU: skipped" line
# (counted as skipped, not passed). NEOX_E2E_DRY=1 runs every "cuda" run on the emulated device
# instead (compute_backend: emulated: the CPU ops on memory that faults on host access, so the device
# paths are exercised; the cpu binaries by default), which proves the plumbing anywhere; its TAP
# names say "dry run".
# Environment: NEOX_BIN (default build/cuda/bin; build/cpu/bin in a dry run), NEOX_E2E_PY (python with
# numpy and safetensors: .venv/bin/python, else python3).
if [ "${NEOX_E2E_DRY:-0}" = 1 ]; then NEOX_BIN=${NEOX_BIN:-build/cpu/bin}; else NEOX_BIN=${NEOX_BIN:-build/cuda/bin}; fi
source tests/lib.sh
TRAIN=$NEOX_BIN/neox-train CONVERT=$NEOX_BIN/neox-convert
BF16_LOSS_TOL=2e-3 BF16_NORM_TOL=2e-2

if [ "${NEOX_E2E_DRY:-0}" = 1 ]; then
    GPU=emulated DRY=" (dry run: emulated device for cuda)"
    echo "# dry run: every 'cuda' run below trains on the emulated device; this proves the plumbing only"
else
    GPU=cuda DRY=""
    if [ ! -x "$TRAIN" ]; then
        if command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then echo "not ok - end-to-end GPU parity: $TRAIN is not built (make cuda-check builds it)"
        else skip "end-to-end GPU parity" "no nvcc: the CUDA variant is not built"; fi
        exit 0
    fi
    if ! "$TRAIN" -V 2>/dev/null | grep -qE 'cuda \([0-9]+ devices?:'; then
        skip "end-to-end GPU parity" "no GPU: skipped"; exit 0
    fi
fi
PY=${NEOX_E2E_PY:-.venv/bin/python}
[ -x "$PY" ] || command -v "$PY" >/dev/null || PY=python3
if ! "$PY" -c 'import numpy, safetensors' 2>/dev/null; then
    echo "not ok - end-to-end GPU parity: $PY lacks numpy or safetensors (needed by tests/gpu/e2e_check.py)"; exit 0
fi
"$TRAIN" -V | sed -n 's/^backends: /# backends: /p'

"$PY" tests/mpi/words_corpus.py "$T/docs.jsonl" 300 11
check "preprocess$DRY" "$NEOX_BIN/neox-preprocess" --input "$T/docs.jsonl" --output-prefix "$T/docs" \
    --tokenizer-type CharLevelTokenizer --append-eod
source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

# run NAME KIND BACKEND EXTRA: trains $T/NAME.yml on BACKEND (20 steps, micro-batch 4, accumulation 2,
# one record per step: layout_config.sh's log_interval 1; checkpoints at 10 and 20), exports the last.
run() {
    config "$1" "$2" 4 2 20 ", \"compute_backend\": \"$3\"$4"
    check "$1: train 20 steps on $3$DRY" "$TRAIN" -q "$T/$1.yml"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
compare() {  # compare NAME CMD...: one TAP line for a checker, its findings (# lines, the last line) as comments
    "${@:2}" >"$T/check.out" 2>&1
    local s=$?
    _report $s "$1$DRY" "$T/check.out"
    [ $s = 0 ] && { grep '^#' "$T/check.out"; tail -n 1 "$T/check.out" | grep -v '^#' | sed 's/^/# /'; }
}
CHECK=("$PY" tests/gpu/e2e_check.py)

# 1. fp32 parity, two architectures (dropout on in the GPT-NeoX one: the masks are counter-based).
DROP=', "hidden_dropout": 0.1, "attention_dropout": 0.1'
run neox-cpu neox cpu "$DROP"
run neox-gpu neox "$GPU" "$DROP"
compare "fp32 GPT-NeoX with dropout: $GPU equals cpu within 1e-4 (losses, grad norms, parameters)" \
    "${CHECK[@]}" close 1e-4 1e-4 "$T/neox-cpu" "$T/neox-gpu" params
run llama-cpu llama cpu ""
run llama-gpu llama "$GPU" ""
compare "fp32 Llama-style (GQA, swiglu, rmsnorm): $GPU equals cpu within 1e-4 (losses, grad norms, parameters)" \
    "${CHECK[@]}" close 1e-4 1e-4 "$T/llama-cpu" "$T/llama-gpu" params

# 2. bf16 against the fp32 cpu run.
run neox-bf16 neox "$GPU" "$DROP, \"precision\": \"bfloat16\""
compare "bf16 GPT-NeoX on $GPU follows fp32 cpu (losses within $BF16_LOSS_TOL, grad norms within $BF16_NORM_TOL)" \
    "${CHECK[@]}" close "$BF16_LOSS_TOL" "$BF16_NORM_TOL" "$T/neox-cpu" "$T/neox-bf16"

# 3. Resume on the GPU: 10 steps (exit_interval; the checkpoint at 10), then 10 more from it.
config resume-a neox 4 2 20 ", \"compute_backend\": \"$GPU\", \"exit_interval\": 10$DROP"
config resume-b neox 4 2 20 ", \"compute_backend\": \"$GPU\", \"load\": \"$T/resume-a/ckpt\"$DROP"
check "resume: first 10 steps on $GPU$DRY" "$TRAIN" -q "$T/resume-a.yml"
check "resume: 10 more steps on $GPU from the checkpoint$DRY" "$TRAIN" -q "$T/resume-b.yml"
check "resume: export step 20" "$CONVERT" to-hf --input "$T/resume-b/ckpt" --output "$T/resume-b/hf"
compare "resume on $GPU: the first run repeats the straight run's iterations 1..10 bit for bit" \
    "${CHECK[@]}" identical "$T/neox-gpu" "$T/resume-a" 1 10
compare "resume on $GPU: the resumed run equals the straight run's iterations 11..20 and final parameters bit for bit" \
    "${CHECK[@]}" identical "$T/neox-gpu" "$T/resume-b" 11 20 params

# 4. fp16 dynamic loss scaling with a forced overflow: 2^26 x dlogits (about 1/256 each: 128 tokens, 2
# accumulation steps) exceeds fp16's 65504 from the first step. Checked by the independent statement of
# DeepSpeed's rules in tests/tools/loss_scale_oracle.py, the learning rates against the fp32 cpu run's.
FP16=', "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 26, "loss_scale_window": 5, "hysteresis": 2, "min_loss_scale": 1}'
run fp16 neox "$GPU" "$DROP$FP16"
compare "fp16 on $GPU: overflowed steps skipped, loss scale and LR follow DeepSpeed's rules (hysteresis 2, window 5)" \
    "$PY" tests/tools/loss_scale_oracle.py "$T/fp16/log/metrics.jsonl" 26 5 2 1 "$T/neox-cpu/log/metrics.jsonl"

# 5. Optimizer offload with pinned buffers: the gradients go to the host on the copy stream while
# backward runs, the host's AdamW updates unit by unit and each unit's weights come back on the copy
# stream, waited for by the next forward. The same numbers as the plain run, within the GPU's 1e-4.
run offload neox "$GPU" "$DROP, \"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}"
compare "optimizer offload on $GPU (pinned, streamed) equals cpu within 1e-4 (losses, grad norms, parameters)" \
    "${CHECK[@]}" close 1e-4 1e-4 "$T/neox-cpu" "$T/offload" params
compare "optimizer offload on $GPU: every gradient queued during backward, the weights waited for by forward" \
    "$PY" -c "
import json, sys
o = json.load(open(sys.argv[1]))['ranks'][0]['offload']
print('#', o)
sys.exit(0 if o['steps'] == 20 and o['grad_bytes_in_backward'] == o['grad_bytes'] > 0 and o['units_waited_by_forward'] > 0 else 1)" \
    "$T/offload/log/comm_stats.json"

# 7. The step as a CUDA graph: captured after two eager steps, replayed for the rest (the evaluation and
# checkpoint at 10 run between launches); the same bits as the eager runs of sections 1 and 4, with one
# capture each (the dropout rows, the loss scale and the mask sums reach the replays through memory).
graph_run() {  # graph_run NAME KIND EAGER EXTRA: NAME trains KIND with cuda_graph; the same bits as run EAGER
    config "$1" "$2" 4 2 20 ", \"compute_backend\": \"$GPU\", \"cuda_graph\": true$4"
    check "$1: train 20 steps on $GPU, the step replayed as a CUDA graph$DRY" \
        bash -c "'$TRAIN' '$T/$1.yml' >'$T/$1.out' 2>&1"
    check "$1: captured once, replayed after it$DRY" grep -qE "cuda_graph: 1[0-9] steps replayed, 1 captured" "$T/$1.out"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
    compare "$1 on $GPU: every step and the final parameters equal the eager run's bit for bit" \
        "${CHECK[@]}" identical "$T/$3" "$T/$1" 1 20 params
}
graph_run llama-graph llama llama-gpu ""
graph_run neox-graph neox neox-gpu "$DROP"
graph_run fp16-graph neox fp16 "$DROP$FP16"

# ZeRO-3 over two GPUs with units of several 2 MiB mapping granules (hidden 512): each released unit
# gives its granules back (kernels/cuda/vmm.cu) and its next gather commits them first. The same numbers
# as stage 0 on two GPUs within 1e-4, and each rank's device peak within 1% of its plan, which counts
# the flat buffers as the partition plus the live units (without the release a rank would hold the
# whole fp32 model besides: about a fifth more), and below stage 0's. (ZeRO needs two data-parallel
# ranks: at one, stages 1-3 are stage 0. One rank per GPU: the granules' release and commit on a single
# GPU are tests/gpu/op_parity.c's.)
zero3_over_gpus() {
    for stage in 0 3; do
        LAYERS=2 config "z$stage" neox 4 1 10 ", \"compute_backend\": \"$GPU\", \"zero_optimization\": {\"stage\": $stage}"
        sed -i 's/"hidden_size": 32/"hidden_size": 512/' "$T/z$stage.yml"
        check "z$stage: train 10 steps of a hidden-512 model with ZeRO stage $stage on two ranks on $GPU$DRY" \
            "$MPIEXEC" -n 2 "$TRAIN" -q "$T/z$stage.yml"
        check "z$stage: export" "$CONVERT" to-hf --input "$T/z$stage/ckpt" --output "$T/z$stage/hf"
    done
    compare "dp2 ZeRO-3 on $GPU equals dp2 stage 0 on $GPU within 1e-4 (losses, grad norms, parameters)" \
        "${CHECK[@]}" close 1e-4 1e-4 "$T/z0" "$T/z3" params
    compare "dp2 ZeRO-3 on $GPU: each rank's device peak is within 1% of its plan and below stage 0's" \
        "$PY" -c "
import glob, json, sys
def ranks(run):
    return json.load(open(glob.glob(run + '/**/memory_peaks.json', recursive=True)[0]))['ranks']
z3, z0 = ranks(sys.argv[1]), ranks(sys.argv[2])
for x, y in zip(z3, z0):
    print('# device peak', x['device_peak_bytes'], 'planned', x['planned_bytes'], 'stage 0', y['device_peak_bytes'])
sys.exit(0 if len(z3) == len(z0) == 2 and all(0 < x['device_peak_bytes'] <= 1.01 * x['planned_bytes'] and
                                           x['device_peak_bytes'] < y['device_peak_bytes'] for x, y in zip(z3, z0)) else 1)" \
        "$T/z3" "$T/z0"
}

# precision fp8 pipelined over two GPUs (FP8 tensor cores: sm_89 or newer; on an older GPU the one-GPU
# run is refused naming the GPU and the case says it did not run): the Llama-style model (untied) with
# 4 micro-batches per step, one GPU against pp2 (one stage per GPU), whose stages update their FP8
# scales in one rank's micro-batch order, each backward casting with its own forward's scales kept in
# its activation slot (docs/model.md, "FP8 training"). On the CPU pp2 is one rank bit for bit
# (tests/mpi/fp8_layouts.sh); here within 1e-5 (losses, grad norms).
fp8_pipeline_over_gpus() {
    config fp8one llama 2 4 20 ", \"compute_backend\": \"$GPU\", \"precision\": \"fp8\""
    if ! "$TRAIN" -q "$T/fp8one.yml" >"$T/fp8one.out" 2>&1; then
        if grep -q "FP8 products need sm_89" "$T/fp8one.out"; then
            echo "# fp8 pipelined over GPUs: not run ($(grep -o 'GPU [0-9]* ([^)]*) is sm_[0-9]*' "$T/fp8one.out"))"
        else _report 1 "fp8: train 20 steps on one rank on $GPU$DRY" "$T/fp8one.out"; fi
        return
    fi
    config fp8pp2 llama 2 4 20 ", \"compute_backend\": \"$GPU\", \"precision\": \"fp8\", \"pipe_parallel_size\": 2"
    check "fp8 pp2: train 20 steps on two ranks on $GPU$DRY" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/fp8pp2.yml"
    compare "fp8 pp2 on $GPU equals one rank on $GPU within 1e-5 (losses, grad norms)" \
        "${CHECK[@]}" close 1e-5 1e-5 "$T/fp8one" "$T/fp8pp2"
}

# A rank stopped (SIGSTOP) once both train ends the dp2 job within a few comm_timeout_seconds instead of
# holding both GPUs forever: NCCL's non-blocking communicators are polled by the watchdog and aborted
# (lib/parallel/nccl.c), the message naming the timeout and the group's ranks.
stopped_rank_ends_job() {
    CKPT_FACTOR=1000000 config stopped llama 4 1 1000000 ", \"compute_backend\": \"$GPU\", \"comm_timeout_seconds\": 10"
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/stopped.yml" >"$T/stopped.out" 2>&1 &
    local job=$! rank1= start took status
    for _ in $(seq 600); do
        rank1=$(for p in $(pgrep -f "neox-train -q $T/stopped.yml"); do
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx PMI_RANK=1 && echo "$p"; done | head -1)
        [ -n "$rank1" ] && grep -q iteration "$T/stopped.out" 2>/dev/null && break
        sleep 0.1
    done
    sleep 1
    [ -n "$rank1" ] && kill -STOP "$rank1"
    start=$(date +%s)
    for _ in $(seq 900); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
    took=$(( $(date +%s) - start ))
    if kill -0 "$job" 2>/dev/null; then [ -n "$rank1" ] && kill -CONT "$rank1"; kill "$job"; fi
    wait "$job"; status=$?
    pkill -9 -f "neox-train -q $T/stopped.yml" 2>/dev/null
    check "stopped rank on $GPU: the job fails (status $status) within 60 s of the stop ($took s)$DRY" \
        test "$status" != 0 -a -n "$rank1" -a "$took" -lt 60
    check "stopped rank on $GPU: the message names the timeout$DRY" \
        grep -q "made no progress for 10 s (comm_timeout_seconds)" "$T/stopped.out"
}

# 6. Data parallelism across GPUs (with two or more; the dry run on two emulated ranks): the Llama-style
# model on two ranks, one per GPU, ZeRO-1 with overlap_comm (each bucket reduce-scattered through NCCL
# while backward runs, waited for before the optimizer), the same global batch as the one-rank run
# (micro-batch 4: accumulation 1 on each of two ranks against 2 on one). Within the GPU's 1e-4 of
# the one-rank GPU run, and the buckets were still in flight when backward ended on every rank.
if [ -n "$DRY" ]; then gpus=2; else gpus=$("$TRAIN" -V | sed -n 's/.*cuda (\([0-9]*\) device.*/\1/p'); fi
if [ "${gpus:-0}" -lt 2 ]; then
    echo "# data parallelism across GPUs: not run (one GPU; dp2 needs two)"  # (a host's GPU count, not a failure)
elif ! command -v "$MPIEXEC" >/dev/null; then
    echo "not ok - data parallelism across GPUs: $MPIEXEC is not installed"
else
    config dp2 llama 4 1 20 ", \"compute_backend\": \"$GPU\", \"zero_optimization\": {\"stage\": 1, \"overlap_comm\": true, \"reduce_bucket_size\": 3000}"
    check "dp2: train 20 steps on two ranks on $GPU$DRY" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/dp2.yml"
    check "dp2: export" "$CONVERT" to-hf --input "$T/dp2/ckpt" --output "$T/dp2/hf"
    compare "dp2 (ZeRO-1, overlap_comm) on $GPU equals one rank on $GPU within 1e-4 (losses, grad norms, parameters)" \
        "${CHECK[@]}" close 1e-4 1e-4 "$T/llama-gpu" "$T/dp2" params
    compare "dp2 on $GPU: the overlapped buckets were still in flight when backward ended, every rank and step" \
        "$PY" -c "
import json, sys
ranks = json.load(open(sys.argv[1]))['ranks']
g = [r['gradient_reduction'] for r in ranks]
print('#', [(x['reductions'], x['pending_at_backward_end']) for x in g])
sys.exit(0 if len(g) == 2 and all(x['pending_at_backward_end'] >= x['reductions'] == 20 for x in g) else 1)" \
        "$T/dp2/log/comm_stats.json"
    zero3_over_gpus
    fp8_pipeline_over_gpus
    stopped_rank_ends_job
fi
