# tests/tools/train_memory.sh: the start-up memory report counts each optimizer's own state: two
# fp32 buffers per parameter for AdamW and 1-bit Adam (the moments), one for SGD (the momentum
# buffer), i.e. optimizer bytes = 2x or 1x the fp32 parameter bytes.
source tests/lib.sh

TRAIN=$NEOX_BIN/neox-train
T=$TEST_TMP
char_shakespeare "neox-train memory report" || exit 0
cat >"$T/model.yml" <<EOF
{ "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "train_micro_batch_size_per_gpu": 2, "train_iters": 1, "eval_iters": 0, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer" }
EOF
# ratio NAME WANT OPTIMIZER_JSON: optimizer bytes / parameter bytes in the report equals WANT (the
# report prints 3 significant figures, so within 1%).
ratio() {
    echo "{\"optimizer\": $3}" >"$T/$1.yml"
    $TRAIN "$T/model.yml" "$T/$1.yml" >"$T/$1.log" 2>&1 || { cat "$T/$1.log"; return 1; }
    python3 - "$T/$1.log" "$2" <<'PY'
import re, sys
units = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
line = next(l for l in open(sys.argv[1]) if "memory of rank 0" in l)
def size(what):
    m = re.search(what + r" ([0-9.]+)\s*([kKMGT]?)B", line)
    return float(m.group(1)) * units[m.group(2)]
got = size("optimizer") / size("parameters")
print(line.strip(), f"-> ratio {got:.3f}")
assert abs(got - float(sys.argv[2])) <= 0.01 * float(sys.argv[2]), got
PY
}
check "AdamW: optimizer state is two fp32 buffers per parameter" \
    ratio adam 2 '{"type": "Adam", "params": {"lr": 0.001}}'
check "1-bit Adam: two buffers too (momentum and frozen variance)" \
    ratio onebit 2 '{"type": "OneBitAdam", "params": {"lr": 0.001, "freeze_step": 1}}'
check "SGD with momentum: one buffer" \
    ratio sgd 1 '{"type": "sgd", "params": {"lr": 0.01, "momentum": 0.9}}'
