# tests/mpi/adaptive_link.sh: data-parallel training across a real, shaped link. Two ranks, each in a
# network namespace of its own, MPI over TCP between them, every rank's egress limited by tc
# (scripts/shaped_link.sh):
# - gradient_compression: adaptive follows the link: it starts at 10 Gbit/s, and the test drops it
#   to 20 Mbit/s once the run has logged a decision at iteration 40 or later (the gradient in one
#   bucket, so each plan is one scheme for all of it). While the link is fast
#   the overlapped uncompressed reduction hides behind backward and is kept (dense or bf16; a trial
#   of a compressor may come between, so one decision before the drop must be uncompressed); every
#   decision from 10 steps after the drop on chooses a compressor (PowerSGD or 1-bit), and the
#   bandwidth the decisions measured falls with the link;
# - the overlapped reduction with a progress thread (comm_progress_thread_us) over the link gives
#   bit for bit the run without it, and the thread tests buckets in flight on every rank.
# Network namespaces need root: elsewhere the test is reported skipped with the reason.
source tests/lib.sh
source scripts/shaped_link.sh

command -v "$MPIEXEC" >/dev/null || { skip "adaptive compression on a shaped link" "$MPIEXEC is not installed"; exit 0; }
trap 'link_down; rm -rf "$TEST_TMP"' EXIT
if ! link_up 2 10gbit 2>"$T/link.err"; then
    skip "adaptive compression on a shaped link" "$(head -1 "$T/link.err")"
    exit 0
fi
export OMP_NUM_THREADS=1
char_shakespeare "adaptive compression on a shaped link" || exit 0

base() {  # base ITERS BUCKET: the model and data, trained for ITERS steps with reduction buckets of
          # BUCKET elements, in $T/base-ITERS.yml
cat >"$T/base-$1.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "norm": "layernorm", "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "gradient_clipping": 1.0, "lr_decay_style": "cosine", "warmup": 0.05,
  "train_micro_batch_size_per_gpu": 8, "train_iters": $1, "eval_interval": $1, "eval_iters": 2,
  "log_interval": 10, "seed": 1234, "split": "949,50,1",
  "zero_optimization": {"stage": 0, "overlap_comm": true, "reduce_bucket_size": $2},
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
}
base 100 500000000  # the whole gradient in one bucket
# Buckets of 50,000 elements go out during backward, so a progress thread has buckets to test while
# the layers below compute (one bucket for the whole gradient would go out only as backward ends,
# and be waited on at once).
base 20 50000

# run NAME ITERS EXTRA_JSON: 2 ranks across the link, log_dir $T/NAME. MPICH's MPI_Finalize over
# UCX's TCP transport can hang after a complete run (docs/parallel.md); the tools end such a hang
# after 20 s with a warning, and the launcher then reports an error of its own. That case counts
# as a finished run when the warning is there and the run's last file (comm_stats.json) was written.
run() {
    echo "{\"log_dir\": \"$T/$1\" $3}" >"$T/$1.yml"
    link_mpiexec "$TRAIN" -q "$T/base-$2.yml" "$T/$1.yml"
    timeout 600 "${LINK_CMD[@]}" >"$T/$1.log" 2>&1 && return 0
    if grep -q "MPI_Finalize has not returned" "$T/$1.log" && [ -s "$T/$1/comm_stats.json" ]; then
        echo "# $1: MPI_Finalize hung after the run and was ended (MPICH over UCX's TCP transport)" >&2
        return 0
    fi
    cat "$T/$1.log"
    return 1
}

# Drops the link once the decisions log holds a decision at iteration 40 or later, and notes which.
drop_after_40() {
    local log=$T/adaptive/gradient_compression.jsonl at
    for _ in $(seq 3000); do
        at=$([ -f "$log" ] && python3 -c "import json, sys; its = [json.loads(l)['iteration'] for l in open(sys.argv[1])]
print(max(its) if its and max(its) >= 40 else '')" "$log" 2>/dev/null)
        if [ -n "$at" ]; then link_rate 20mbit && echo "$at" >"$T/dropped_at"; return; fi
        sleep 0.1
    done
    return 1
}

ADAPTIVE='"gradient_compression": "adaptive", "gradient_compression_start": 20, "gradient_compression_interval": 20'
drop_after_40 &
dropper=$!
check "adaptive across the link, 10 Gbit/s dropping to 20 Mbit/s after a decision at 40 or later" run adaptive 100 ", $ADAPTIVE"
check "the link was dropped during the run" wait $dropper
check "the decisions follow the link: uncompressed at 10 Gbit/s, a compressor at 20 Mbit/s" python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
dropped = int(open(f"{t}/dropped_at").read())
log = [json.loads(l) for l in open(f"{t}/adaptive/gradient_compression.jsonl")]
print("dropped after", dropped, "decisions:", [(d["iteration"], d["buckets"], f'{d["bytes_per_s"] * 8 / 1e9:.3f} Gbit/s') for d in log])
before = [d for d in log if d["iteration"] <= dropped]
after = [d for d in log if d["iteration"] >= dropped + 10]  # the drop is in force by then
assert before and after, (before, after)
schemes = lambda d: {c.split(":")[0] for c in d["buckets"]}  # each bucket's (one bucket here)
assert any(schemes(d) <= {"dense", "bf16"} for d in before), before
assert all(schemes(d) <= {"powersgd", "onebit"} for d in after), after
fast, slow = max(d["bytes_per_s"] for d in before), max(d["bytes_per_s"] for d in after)
assert slow * 5 < fast, (fast, slow)  # the measured link fell with the real one
PY

# The progress thread over a real link: the same sums, whenever they complete.
link_rate 1gbit
check "overlapped reduction across the link (1 Gbit/s)" run polled 20 ""
check "the same with a progress thread" run threaded 20 ", \"comm_progress_thread_us\": 200"
check "a progress thread changes no bit (losses, gradient norms, validation)" $LIB same \
    "$T/polled/metrics.jsonl" "$T/threaded/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss
check "the thread polled while buckets were in flight" python3 - "$T" <<'PY'
import json, sys
stats = json.load(open(f"{sys.argv[1]}/threaded/comm_stats.json"))["ranks"]
polls = [r["gradient_reduction"]["thread_polls"] for r in stats]
print("thread polls per rank:", polls)
assert all(p > 0 for p in polls), polls
PY
