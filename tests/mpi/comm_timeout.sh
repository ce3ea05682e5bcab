# tests/mpi/comm_timeout.sh: comm_timeout_seconds. A two-rank data-parallel job with a timeout set
# (every MPI call then waits by polling) trains exactly as without one (0: blocking calls); with one
# rank stopped by SIGSTOP the job ends (it would hang forever without the timeout) with an error
# naming the silent rank, and the stopped rank is killed with it: on CPU ranks and on emulated device
# ranks, whose device collectives wait under the same timeout.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "communication timeout" "$MPIEXEC is not installed"; exit 0; }

words_dataset 400 5
model() {  # model ITERS [ZERO_STAGE]
    cat <<EOF2
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true, "optimizer": {"type": "Adam", "params": {"lr": 0.003}},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": ${2:-1}},
  "train_iters": $1, "eval_interval": 4, "eval_iters": 1, "log_interval": 1,
  "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF2
}
model 8 >"$T/model.yml"
echo "{\"log_dir\": \"$T/plain\", \"comm_timeout_seconds\": 0}" >"$T/plain.yml"
echo "{\"log_dir\": \"$T/timed\", \"comm_timeout_seconds\": 30}" >"$T/timed.yml"
check "dp2 / ZeRO-1 without a timeout (comm_timeout_seconds: 0)" $MPIEXEC -n 2 $TRAIN -q "$T/model.yml" "$T/plain.yml"
check "dp2 / ZeRO-1 with comm_timeout_seconds: 30" $MPIEXEC -n 2 $TRAIN -q "$T/model.yml" "$T/timed.yml"
check "the same losses, grad norms and evaluations exactly" python3 - "$T/plain/metrics.jsonl" "$T/timed/metrics.jsonl" <<'EOF2'
import json, sys
keys = ("train/lm_loss", "train/grad_norm", "validation/lm_loss", "test/lm_loss")
def table(p):
    return {(r["iteration"], k): v for r in map(json.loads, open(p)) for k, v in r.items() if k in keys}
a, b = table(sys.argv[1]), table(sys.argv[2])
assert a and a == b, (len(a), [k for k in a if a[k] != b.get(k)][:5])
EOF2

# A long run; rank 1 is stopped once both ranks train. stopped_rank NAME BACKEND: on CPU ranks (host
# MPI calls) or emulated device ranks (the device collectives' twin, lib/parallel/emulated_comm.c).
model 1000000 >"$T/long.yml"
stopped_rank() {
    # (4 s: the first run builds the long run's sample index while its peer waits at start-up.)
    echo "{\"comm_timeout_seconds\": 4, \"compute_backend\": \"$2\"}" >"$T/short-$2.yml"
    $MPIEXEC -n 2 $TRAIN -q "$T/long.yml" "$T/short-$2.yml" >"$T/stopped-$2.out" 2>&1 &
    local job=$! rank1= pid start took status
    for _ in $(seq 100); do
        for pid in $(pgrep -x neox-train); do
            tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx 'PMI_RANK=1' && grep -q "^$job\$" <(
                p=$pid; while [ "$p" -gt 1 ]; do echo "$p"; p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1); done) && rank1=$pid
        done
        [ -n "$rank1" ] && grep -q "iteration" "$T/stopped-$2.out" 2>/dev/null && break
        sleep 0.1
    done
    sleep 1
    [ -n "$rank1" ] && kill -STOP "$rank1"
    start=$(date +%s)
    for _ in $(seq 400); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
    took=$(( $(date +%s) - start ))
    if kill -0 $job 2>/dev/null; then  # the job hangs: let it go
        [ -n "$rank1" ] && kill -CONT "$rank1"
        kill $job
    fi
    wait $job; status=$?
    check "$1: a stopped rank ends the job with a failure (status $status)" test "$status" != 0 -a -n "$rank1"
    check "$1: ... within a few timeouts (${took} s)" test "$took" -lt 30
    check_output "$1: ... naming the silent rank" "made no progress for 4 s \(comm_timeout_seconds\): rank 1 did not respond" \
        grep -E "made no progress for 4 s \(comm_timeout_seconds\): rank 1 did not respond" "$T/stopped-$2.out"
    gone() { for _ in $(seq 50); do kill -0 "$rank1" 2>/dev/null || return 0; sleep 0.1; done; return 1; }
    check "$1: ... and the stopped rank is gone" gone
}
stopped_rank "CPU ranks" cpu
stopped_rank "emulated device ranks" emulated

# How ranks wait: where the ranks' threads outnumber the cores (4 single-thread ranks here on a
# machine of fewer than 4 cores, or NEOX_SHARED_CORES=1) a wait sleeps between its polls; that is
# timing only, so ZeRO-3 at dp4 (gathers and bucket reductions waited for during backward) trains
# the same either way.
cores=$(nproc)
model 8 3 >"$T/stage3.yml"
train_waiting() {  # train_waiting 0|1|default
    local env=(OMP_NUM_THREADS=1)
    [ "$1" = default ] || env+=(NEOX_SHARED_CORES=$1)
    echo "{\"log_dir\": \"$T/wait-$1\"}" >"$T/wait-$1.yml"
    env "${env[@]}" $MPIEXEC -n 4 $TRAIN "$T/stage3.yml" "$T/wait-$1.yml" >"$T/wait-$1.out" 2>&1
}
sleeps() { grep -q "ranks share this machine's cores, so waits sleep" "$T/wait-$1.out"; }
spins() { grep -q "grid: " "$T/wait-$1.out" && ! sleeps "$1"; }
for shared in 0 1 default; do check "dp4 / ZeRO-3, NEOX_SHARED_CORES=$shared" train_waiting $shared; done
check "NEOX_SHARED_CORES=1: the start-up says waits sleep" sleeps 1
check "NEOX_SHARED_CORES=0: it does not" spins 0
if [ "$cores" -lt 4 ]; then check "4 ranks on $cores cores: waits sleep" sleeps default
else check "4 ranks on $cores cores: waits spin" spins default; fi
check "the same losses and grad norms with waits that sleep" python3 - "$T/wait-0/metrics.jsonl" "$T/wait-1/metrics.jsonl" <<'EOF2'
import json, sys
keys = ("train/lm_loss", "train/grad_norm", "validation/lm_loss")
def table(p):
    return {(r["iteration"], k): v for r in map(json.loads, open(p)) for k, v in r.items() if k in keys}
a, b = table(sys.argv[1]), table(sys.argv[2])
assert a and a == b, (len(a), [k for k in a if a[k] != b.get(k)][:5])
EOF2
