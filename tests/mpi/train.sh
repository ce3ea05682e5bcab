# tests/mpi/train.sh: neox-train as data parallel under mpiexec -n 2: each rank reads its slice of
# the global batch and gradients are averaged, so the losses follow the one-rank run with the same
# global batch (within floating-point reordering); the 2-rank checkpoint has one shard per rank
# and resumes on one rank (layout-free checkpoints).
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "neox-train data parallel" "$MPIEXEC is not installed"; exit 0; }

# A small synthetic corpus (char-level ids), written by neox-preprocess from jsonl.
words_dataset 400 5

model() {  # model FILE MICRO ACCUMULATION
    cat >"$1" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": $2, "gradient_accumulation_steps": $3,
  "train_iters": 12, "eval_interval": 6, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
}
model "$T/one.yml" 4 2
model "$T/two.yml" 2 2
echo "{\"log_dir\": \"$T/log1\"}" >"$T/log1.yml"
echo "{\"log_dir\": \"$T/log2\", \"save\": \"$T/ckpt\", \"checkpoint_factor\": 6}" >"$T/log2.yml"
check "one rank, global batch 8" $TRAIN -q "$T/one.yml" "$T/log1.yml"
check "mpiexec -n 2, micro-batch 2 per rank, global batch 8" $MPIEXEC -n 2 $TRAIN -q "$T/two.yml" "$T/log2.yml"
check "losses and evaluations agree within 1e-5 relative" python3 - "$T/log1/metrics.jsonl" "$T/log2/metrics.jsonl" <<'EOF'
import json, sys
def table(p):
    return {(r["iteration"], k): v for r in map(json.loads, open(p)) for k, v in r.items()
            if k in ("train/lm_loss", "validation/lm_loss", "test/lm_loss")}
a, b = table(sys.argv[1]), table(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
bad = [(k, a[k], b[k]) for k in a if abs(a[k] - b[k]) > 1e-5 * abs(a[k])]
print(f"{len(a)} values, {len(bad)} differ: {bad[:5]}")
sys.exit(1 if bad else 0)
EOF
check "the 2-rank checkpoint has a shard per rank" test -f "$T/ckpt/global_step12/rank_00001.h5"
echo "{\"load\": \"$T/ckpt\", \"train_iters\": 13, \"override_lr_scheduler\": true, \"log_dir\": \"$T/log3\"}" >"$T/resume.yml"
sed 's/"train_iters": 12, //' "$T/one.yml" >"$T/one-noiters.yml"
check "one rank resumes the 2-rank checkpoint" bash -c \
    "$TRAIN -q '$T/one-noiters.yml' '$T/resume.yml' && grep -q '\"iteration\":13,' '$T/log3/metrics.jsonl'"
