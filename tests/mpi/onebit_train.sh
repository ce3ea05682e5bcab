# tests/mpi/onebit_train.sh: 1-bit Adam (optimizer.type onebitadam) on Tiny Shakespeare (char-level)
# with two data-parallel ranks, against AdamW on the same data and against itself on one rank:
# - the warm-up (Adam over the uncompressed all-reduce until freeze_step) follows the one-rank run
#   with the same global batch, as plain data-parallel Adam does (tests/mpi/train.sh), and the
#   compression phase does not;
# - after freeze_step the data group sends at most 1/20 of AdamW's gradient all-reduce per step
#   (bytes sent, log_dir/comm_stats.json);
# - the validation loss is at most 2% above AdamW's and within 2% of the uncompressed 1-bit Adam's;
# - resuming in the middle of the compression phase gives bit-identical losses, and a checkpoint
#   resumed on another data-parallel size (4) restarts the error buffers with a notice.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "1-bit Adam" "$MPIEXEC is not installed"; exit 0; }
need_shared "1-bit Adam" || exit 0
export OMP_NUM_THREADS=1

$LIB paragraphs "$DATA/text/tinyshakespeare_input.txt" "$T/s.jsonl"
check "preprocess Tiny Shakespeare (char-level)" $NEOX_BIN/neox-preprocess --input "$T/s.jsonl" \
    --output-prefix "$T/char" --tokenizer-type CharLevelTokenizer --append-eod

ITERS=300 FREEZE=60
model() {  # model FILE MICRO_BATCH
    cat >"$1" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "norm": "layernorm", "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true,
  "init_method": "small_init", "output_layer_init_method": "wang_init",
  "min_lr": 0.0003, "gradient_clipping": 1.0, "lr_decay_style": "cosine", "warmup": 0.05,
  "train_micro_batch_size_per_gpu": $2, "train_iters": $ITERS, "eval_interval": $ITERS, "eval_iters": 8,
  "log_interval": 1, "seed": 1234, "split": "949,50,1",
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
}
model "$T/dp2.yml" 8
model "$T/dp1.yml" 16
opt() {  # opt FILE TYPE LOG_DIR [MORE JSON]
    local extra=""
    [ "$2" = OneBitAdam ] && extra=", \"freeze_step\": $FREEZE, \"cuda_aware\": false, \"comm_backend_name\": \"nccl\""
    echo "{\"optimizer\": {\"type\": \"$2\", \"params\": {\"lr\": 0.003, \"betas\": [0.9, 0.95], \"eps\": 1.0e-8$extra}},
      \"log_dir\": \"$3\" ${4:-}}" >"$1"
}
opt "$T/adam.yml" Adam "$T/adam"
# The straight 2-rank run also leaves the checkpoint at 150 that the resume below starts from.
opt "$T/onebit.yml" OneBitAdam "$T/onebit" ", \"save\": \"$T/ckpt\", \"checkpoint_factor\": 150"
opt "$T/onebit1.yml" OneBitAdam "$T/onebit1"
check "AdamW, 2 ranks" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/adam.yml"
check "1-bit Adam, 2 ranks" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/onebit.yml"
check "1-bit Adam, 1 rank, the same global batch" $TRAIN -q "$T/dp1.yml" "$T/onebit1.yml"

check "warm-up: 2 ranks follow 1 rank within 1e-5 up to freeze_step, not after" python3 - "$T" $FREEZE <<'PY'
import json, sys
t, freeze = sys.argv[1], int(sys.argv[2])
def losses(d):
    return {r["iteration"]: r["train/lm_loss"] for r in map(json.loads, open(f"{t}/{d}/metrics.jsonl")) if "train/lm_loss" in r}
a, b = losses("onebit"), losses("onebit1")
warm = [abs(a[i] - b[i]) / b[i] for i in range(1, freeze + 2)]
later = [abs(a[i] - b[i]) / b[i] for i in range(freeze + 2, freeze + 40)]
print(f"warm-up max relative difference {max(warm):.2e}; compression phase max {max(later):.2e}")
sys.exit(0 if max(warm) < 1e-5 and max(later) > 1e-4 else 1)
PY

check "after freeze_step: bytes sent per step <= 1/20 of AdamW's all-reduce" python3 - "$T" $ITERS $FREEZE <<'PY'
import json, sys
t, iters, freeze = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def data_ops(d):
    return json.load(open(f"{t}/{d}/comm_stats.json"))["ranks"][0]["groups"]["data"]
adam = data_ops("adam")["all_reduce"]["sent"] / iters
ops = data_ops("onebit")
compressed = (ops["all_to_all"]["sent"] + ops["all_gather"]["sent"]) / (iters - freeze)
print(f"AdamW {adam:.0f} bytes/step, 1-bit Adam {compressed:.0f} bytes/step after freeze_step: 1/{adam / compressed:.1f}")
sys.exit(0 if 20 * compressed <= adam and compressed > 0 else 1)
PY

check "validation loss: <= 1.02 x AdamW's, within 2% of uncompressed 1-bit Adam" python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
def valid(d):
    return [r["validation/lm_loss"] for r in map(json.loads, open(f"{t}/{d}/metrics.jsonl")) if "validation/lm_loss" in r][0]
adam, onebit, one_rank = valid("adam"), valid("onebit"), valid("onebit1")
print(f"validation loss: AdamW {adam:.4f}, 1-bit Adam {onebit:.4f} (2 ranks), {one_rank:.4f} (1 rank, uncompressed)")
sys.exit(0 if onebit <= 1.02 * adam and abs(onebit - one_rank) <= 0.02 * one_rank else 1)
PY

# Resume in the middle of the compression phase: the straight run's checkpoint at 150, resumed for
# 150 more, against that run's last 150 steps.
check_output "the checkpoint holds each rank's worker and server errors" \
    "onebit_server_error/rank_00001.*onebit_worker_error/rank_00001" \
    bash -c "h5ls -r '$T/ckpt/global_step150/rank_00001.h5' | grep -o 'onebit_[a-z]*_error/rank_[0-9]*' | tr '\n' ' '"
printf 'global_step150\n' >"$T/ckpt/latest"
opt "$T/second.yml" OneBitAdam "$T/resumed" ", \"load\": \"$T/ckpt\""
check "1-bit Adam: resume at 150 for 150 more" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/second.yml"
python3 -c 'import json, sys
for l in open(sys.argv[1]):
    if json.loads(l).get("iteration", 0) > 150: print(l, end="")' "$T/onebit/metrics.jsonl" >"$T/straight-after150.jsonl"
check "resumed in the compression phase: bit-identical losses, norms and evaluations" $LIB same \
    "$T/straight-after150.jsonl" "$T/resumed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss

printf 'global_step300\n' >"$T/ckpt/latest"
model "$T/dp4.yml" 4
opt "$T/dp4-resume.yml" OneBitAdam "$T/dp4-resume" ", \"load\": \"$T/ckpt\", \"train_iters\": 152, \"override_lr_scheduler\": true"
sed "s/\"train_iters\": $ITERS, //" "$T/dp4.yml" >"$T/dp4-noiters.yml"
check_output "the dp2 checkpoint resumed on 4 ranks: error buffers restart, with a notice" \
    "compression error buffers start from zero: the checkpoint has another layout or none" \
    bash -c "$MPIEXEC -n 4 $TRAIN '$T/dp4-noiters.yml' '$T/dp4-resume.yml' 2>&1"
