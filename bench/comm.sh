#!/usr/bin/env bash
# bench/comm.sh: data-parallel communication on CPU ranks: dense AdamW, ZeRO-1, ZeRO-2, 1-bit Adam
# (optimizer.type onebitadam) and AdamW with gradient_compression (powersgd, onebit), same model,
# data (Tiny Shakespeare, char-level) and global batch. Each layout runs twice: ranks in one
# network namespace (MPI's shared memory), and each rank in its own network namespace joined to
# the others by veth pairs through a bridge, egress limited by `tc` (tbf) to model a slow
# inter-node link, with MPI forced onto TCP over those interfaces (scripts/shaped_link.sh; root only).
# Per layout: median iteration time after freeze_step, bytes sent per step by the data group in
# steady state (log_dir/comm_stats.json: compressed layouts after freeze_step), bytes that really
# left the ranks' interfaces over the whole run (tx_bytes, headers included), and the validation
# loss at the end. 1-bit Adam's and the compressors' warm-up (uncompressed) lasts freeze_step steps.
# gradient_compression: adaptive runs beside the static schemes (a decision every `interval` steps),
# with overlap_comm as adamw-overlap (its dense choice is the overlapped all-reduce).
# drop=RATE changes every rank's tbf rate to RATE once a run passes half its iterations (a link that
# degrades mid-run); the table then gives each layout's median step time before and after the drop,
# and adaptive's ratio to the best static layout in each phase.
# Usage: bench/comm.sh [key=value...]  keys: ranks iters freeze layers hidden heads seq micro rate
#        psgd_rank interval drop layouts progress_us   (defaults: ranks=2 iters=60 freeze=12 layers=4 hidden=256 heads=8
#        seq=64 micro=4 rate=1gbit psgd_rank=4 interval=10 drop=none timeout=600 (seconds per run);
#        rate=none skips the namespaces, shm=0 the shared-memory runs; layouts=a,b,... runs only those,
#        adamw always included; keep=DIR copies every run's log_dir (metrics.jsonl, comm_stats.json,
#        adaptive's gradient_compression.jsonl) to DIR/LAYOUT-MODE before the work folder goes)
# adamw-overlap is AdamW with overlap_comm and 8 buckets: the share of the reduction it hides behind
# backward is 1 - (its exposed reduction time) / (adamw's, where every bucket waits for the end of
# backward), both from log_dir/comm_stats.json (the data group's minimum per reduction).
# adamw-thread is the same with comm_progress_thread_us=progress_us (default 200): a thread that
# polls the buckets in flight between backward's own polls.
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x build/cpu/bin/neox-train ] || { echo "bench/comm.sh: build/cpu/bin/neox-train is missing (run 'make')" >&2; exit 1; }
declare -A opt=([ranks]=2 [iters]=60 [freeze]=12 [layers]=4 [hidden]=256 [heads]=8 [seq]=64 [micro]=4 [rate]=1gbit
                [psgd_rank]=4 [interval]=10 [drop]=none [layouts]=all [timeout]=600 [progress_us]=200 [shm]=1 [keep]=)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/comm.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
BIN=build/cpu/bin
TEXT=../shared/data/text/tinyshakespeare_input.txt
[ -f "$TEXT" ] || { echo "bench/comm.sh: $TEXT is missing" >&2; exit 1; }
N=${opt[ranks]}
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-commbench.XXXXXX")
source scripts/shaped_link.sh
trap 'link_down; rm -rf "$work"' EXIT

python3 tests/tools/train_lib.py paragraphs "$TEXT" "$work/s.jsonl"
"$BIN/neox-preprocess" --input "$work/s.jsonl" --output-prefix "$work/char" --tokenizer-type CharLevelTokenizer \
    --append-eod >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

# ---- the network: one namespace per rank (scripts/shaped_link.sh)
NET=0
if [ "${opt[rate]}" != none ]; then
    if link_up "$N" "${opt[rate]}" 2>"$work/netns.err"; then NET=1
    else echo "bench/comm.sh: no network namespaces ($(head -1 "$work/netns.err")); shared memory only" >&2; link_down; fi
fi

# ---- layouts
config() {  # config NAME OPTIMIZER_JSON EXTRA_JSON
    cat >"$work/$1.yml" <<EOF
{
  "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]}, "pos_emb": "rotary", "norm": "layernorm",
  "optimizer": $2, "min_lr": 0.0003, "lr_decay_style": "cosine", "warmup": 0.05, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": ${opt[micro]}, "train_iters": ${opt[iters]}, "eval_interval": ${opt[iters]},
  "eval_iters": 8, "log_interval": 1, "seed": 1234, "split": "949,50,1",
  "data_path": "$work/char_text_document", "tokenizer_type": "CharLevelTokenizer" $3
}
EOF
}
ADAM='{"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}}'
ONEBIT="{\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.003, \"betas\": [0.9, 0.95], \"eps\": 1.0e-8, \"freeze_step\": ${opt[freeze]}}}"
GC=", \"gradient_compression_start\": ${opt[freeze]}, \"gradient_compression_rank\": ${opt[psgd_rank]}"
config adamw "$ADAM" ""
config zero1 "$ADAM" ', "zero_optimization": {"stage": 1}'
config zero2 "$ADAM" ', "zero_optimization": {"stage": 2}'
config onebitadam "$ONEBIT" ""
config adamw-powersgd "$ADAM" ", \"gradient_compression\": \"powersgd\"$GC"
config adamw-onebit "$ADAM" ", \"gradient_compression\": \"onebit\"$GC"
config adamw-bf16 "$ADAM" ', "communication_data_type": "bf16"'
BUCKET=$(( (${opt[layers]} * 12 * ${opt[hidden]} * ${opt[hidden]} + 8) / 8 ))
config adamw-overlap "$ADAM" ", \"zero_optimization\": {\"stage\": 0, \"overlap_comm\": true, \"reduce_bucket_size\": $BUCKET}"
config adamw-thread "$ADAM" ", \"zero_optimization\": {\"stage\": 0, \"overlap_comm\": true, \"reduce_bucket_size\": $BUCKET}, \"comm_progress_thread_us\": ${opt[progress_us]}"
config adamw-adaptive "$ADAM" ", \"gradient_compression\": \"adaptive\"$GC, \"gradient_compression_interval\": ${opt[interval]},
  \"zero_optimization\": {\"stage\": 0, \"overlap_comm\": true, \"reduce_bucket_size\": $BUCKET}"
LAYOUTS="adamw adamw-overlap adamw-thread zero1 zero2 onebitadam adamw-bf16 adamw-powersgd adamw-onebit adamw-adaptive"
[ "${opt[layouts]}" != all ] && LAYOUTS="adamw ${opt[layouts]//,/ }"

kill_tree() {  # kill_tree PID: the process and its descendants, by id
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill -9 "$1" 2>/dev/null || true
}
run() {  # run NAME MODE(shm|net)
    local log=$work/$1-$2
    echo "{\"log_dir\": \"$log\"}" >"$work/$1-$2.log.yml"
    local cmd=(env OMP_NUM_THREADS=1 "$MPIEXEC" -n "$N" "$BIN/neox-train" -q "$work/$1.yml" "$work/$1-$2.log.yml")
    if [ "$2" = net ]; then
        link_mpiexec "$BIN/neox-train" -q "$work/$1.yml" "$work/$1-$2.log.yml"
        cmd=(env OMP_NUM_THREADS=1 "${LINK_CMD[@]}")
    fi
    local before=0; [ "$2" = net ] && before=$(link_tx_bytes)
    local dropper=
    if [ "$2" = net ] && [ "${opt[drop]}" != none ]; then link_rate "${opt[rate]}"; drop_later "$log" & dropper=$!; fi
    # (Over UCX's TCP transport MPI_Finalize can hang after a complete run; the tools end
    # themselves 20 s into such a hang with their own status: lib/parallel/grid.c.)
    "${cmd[@]}" >"$work/log" 2>&1 &
    local pid=$! waited=0
    while kill -0 $pid 2>/dev/null; do
        sleep 1; waited=$((waited + 1))
        if [ $waited -ge "${opt[timeout]}" ]; then kill_tree $pid; break; fi
    done
    local rc=0; wait $pid || rc=$?
    if [ -n "$dropper" ]; then kill $dropper 2>/dev/null || true; wait $dropper 2>/dev/null || true; fi
    # A finalize hang ended by the tools (their warning) leaves the launcher reporting an error.
    if [ $rc != 0 ] && grep -q "MPI_Finalize has not returned" "$work/log" && [ -s "$log/comm_stats.json" ]; then
        echo "bench/comm.sh: $1 ($2): MPI_Finalize hung after the run and was ended" >&2
    elif [ $rc != 0 ]; then
        echo "bench/comm.sh: $1 ($2) failed (exit $rc):" >&2; tail -20 "$work/log" >&2; exit 1
    fi
    local wire=-1; [ "$2" = net ] && wire=$(( $(link_tx_bytes) - before ))
    echo "$wire" >"$log/wire_bytes"
    if [ -n "${opt[keep]}" ]; then mkdir -p "${opt[keep]}" && rm -rf "${opt[keep]}/$1-$2" && cp -r "$log" "${opt[keep]}/$1-$2"; fi
}
drop_later() {  # drop_later LOG_DIR: the drop, once the run's metrics pass half its iterations
    local half=$((${opt[iters]} / 2))
    while sleep 0.2; do
        [ -f "$1/metrics.jsonl" ] || continue
        if python3 -c "import json, sys; r = [json.loads(l) for l in open('$1/metrics.jsonl')]; sys.exit(0 if r and r[-1]['iteration'] >= $half else 1)" 2>/dev/null; then
            link_rate "${opt[drop]}"; return
        fi
    done
}
modes=""; [ "${opt[shm]}" = 1 ] && modes="shm"; [ $NET = 1 ] && modes="$modes net"
[ -n "$modes" ] || { echo "bench/comm.sh: shm=0 and no shaped link: nothing to run" >&2; exit 1; }
for mode in $modes; do for name in $LAYOUTS; do run "$name" "$mode"; done; done

python3 - "$work" "${opt[iters]}" "${opt[freeze]}" "$N" "${modes# }" "${opt[rate]}" "${opt[drop]}" $LAYOUTS <<'EOF'
import json, statistics, sys
work, iters, freeze, n, modes, rate, drop, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(), sys.argv[6], sys.argv[7], sys.argv[8:]
phases, exposed, progress, thread, polls = {}, {}, {}, {}, {}

def load(name, mode):
    d = f"{work}/{name}-{mode}"
    rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    times = [r["runtime/iteration_time"] for r in rows if "runtime/iteration_time" in r and r["iteration"] > freeze + 1]
    if mode == "net" and drop != "none":  # the phases: before the drop, and after it has settled
        half = iters // 2
        step = lambda lo, hi: statistics.median([r["runtime/iteration_time"] for r in rows
                                                 if "runtime/iteration_time" in r and lo < r["iteration"] <= hi])
        phases[name] = (step(freeze + 1, half), step(half + 2, iters))
    valid = [r["validation/lm_loss"] for r in rows if "validation/lm_loss" in r][0]
    stats = json.load(open(f"{d}/comm_stats.json"))["ranks"][0]
    sent = {op: v["sent"] for op, v in stats["groups"]["data"].items()}
    exposed[mode, name] = stats.get("gradient_reduction", {}).get("exposed_seconds", 0.0)
    progress[mode, name] = stats.get("gradient_reduction", {}).get("progress_seconds", 0.0)
    thread[mode, name] = stats.get("gradient_reduction", {}).get("thread_seconds", 0.0)
    polls[mode, name] = stats.get("gradient_reduction", {}).get("thread_polls", 0)
    return statistics.median(times), valid, sent, int(open(f"{d}/wire_bytes").read())

for mode in modes:
    res = {name: load(name, mode) for name in names}
    dense = res["adamw"][2].get("all_reduce", 0) / iters
    where = f"{n} ranks, one network namespace each, {rate} tbf per rank" if mode == "net" else f"{n} ranks, shared memory"
    print(f"\n{where}; {iters} iterations, compression from step {freeze + 1}")
    print(f"{'layout':16} {'step ms':>8} {'vs AdamW':>9} {'sent/step':>11} {'vs AdamW':>9} {'wire MB/run':>12} {'val loss':>9}")
    base_t = res["adamw"][0]
    for name in names:
        t, valid, sent, wire = res[name]
        total = sum(sent.values())
        if name == "onebitadam" or name == "adamw-onebit":
            steady = (sent.get("all_to_all", 0) + sent.get("all_gather", 0)) / (iters - freeze)
        elif name == "adamw-powersgd" or name == "adamw-adaptive":
            steady = (total - freeze * dense) / (iters - freeze)
        else:
            steady = total / iters
        wire_text = f"{wire / 1e6:12.1f}" if wire >= 0 else f"{'-':>12}"
        print(f"{name:16} {t * 1000:8.1f} {base_t / t:8.2f}x {steady / 1e3:9.1f}kB {dense / steady:8.1f}x {wire_text} {valid:9.4f}")
if phases:
    static = [x for x in phases if x != "adamw-adaptive"]
    print(f"\nnet, {rate} then {drop} from iteration {iters // 2}: median step ms per phase")
    print(f"{'layout':16} {rate:>10} {drop:>10}")
    for name, (a, b) in phases.items():
        print(f"{name:16} {a * 1000:10.1f} {b * 1000:10.1f}")
    if "adamw-adaptive" in phases:
        ad = phases["adamw-adaptive"]
        for k, label in ((0, rate), (1, drop)):
            best = min(static, key=lambda x: phases[x][k])
            print(f"{label}: adaptive {ad[k] * 1000:.1f} ms, best static {best} {phases[best][k] * 1000:.1f} ms: "
                  f"adaptive / best = {ad[k] / phases[best][k]:.2f}, AdamW / adaptive = {phases['adamw'][k] / ad[k]:.2f}x")
for mode in modes:
    path = f"{work}/adamw-adaptive-{mode}/gradient_compression.jsonl"
    try:
        plans = [(d["iteration"], d["scheme"] if d["scheme"] != "mixed" else d["buckets"]) for d in map(json.loads, open(path))]
        print(f"adaptive decisions ({mode}; per bucket where mixed, bucket 0 the first ready):", plans)
    except OSError:
        pass
for mode in modes:
    for name, how in (("adamw-overlap", "backward's polls"), ("adamw-thread", "a progress thread")):
        if name not in names or exposed.get((mode, "adamw"), 0) <= 0:
            continue
        serial, ovl = exposed[mode, "adamw"], exposed[mode, name]
        print(f"overlap_comm with {how} ({mode}): the reduction blocks {ovl / iters * 1e3:.1f} ms per step against "
              f"{serial / iters * 1e3:.1f} ms without: {100 * (1 - ovl / serial):.0f}% hidden behind backward; "
              f"backward spends {progress[mode, name] / iters * 1e3:.1f} ms per step starting and progressing it"
              + (f", the thread {thread[mode, name] / iters * 1e3:.1f} ms in {polls[mode, name] / iters:.0f} polls"
                 if name == "adamw-thread" else ""))
EOF
