# tests/tools/train_scalenorm.sh: norm scalenorm (GPT-NeoX's ScaleNorm: x / max(||x||, eps) * g, one
# gain per norm) through the tools. A model trains on Tiny Shakespeare and learns; it resumes bit for
# bit and the emulated device gives the CPU's losses; generation with the KV cache gives the text
# recomputation gives; scalenorm_epsilon reaches the norm; each norm holds one gain in the checkpoint;
# Hugging Face export is refused by name and writes nothing; te_rmsnorm trains as rmsnorm does.
# (Numerics against a torch restatement: tests/oracle/test_model_parity.py::test_scalenorm_parity;
# tensor parallelism: tests/mpi/layouts.sh.)
source tests/lib.sh

char_shakespeare "ScaleNorm" || exit 0

source tests/norm_config.sh
model model '"norm": "scalenorm"'

check "ScaleNorm: 30 steps" run straight ", \"save\": \"$T/ckpt\""
check "ScaleNorm: the loss falls" $LIB falls "$T/straight/metrics.jsonl" 30 0.5
check_resume_and_emulated

# The epsilon clamps each row's norm from below: one above every row's norm leaves x * g / eps.
check "scalenorm_epsilon 100: 30 steps" run clamped ", \"scalenorm_epsilon\": 100.0"
check "scalenorm_epsilon reaches the norm (other losses)" bash -c \
    "! $LIB same '$T/straight/metrics.jsonl' '$T/clamped/metrics.jsonl' train/lm_loss >/dev/null"

echo "{\"load\": \"$T/ckpt\", \"seq_length\": 64, \"max_position_embeddings\": 64}" >"$T/load.yml"
check_cached_generation "$T/model.yml" "$T/load.yml"

check_output "each norm holds one gain" "input_layernorm.weight +1 +float32" $CONVERT inspect "$T/ckpt"
check_output "inspect names the norm" "scalenorm" $CONVERT inspect "$T/ckpt"
check_fails "to-hf refuses ScaleNorm by name" 2 "norm 'scalenorm'" $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check "the refused export wrote nothing" test ! -e "$T/hf"

# Transformer Engine's norms are GPT-NeoX's fused kernels for the same arithmetic.
model rms '"norm": "rmsnorm"'
model te_rms '"norm": "te_rmsnorm"'
check "rmsnorm: 30 steps" train_model rms rmsrun ""
check "te_rmsnorm: 30 steps" train_model te_rms terun ""
check "te_rmsnorm trains as rmsnorm, bit for bit" $LIB same "$T/rmsrun/metrics.jsonl" "$T/terun/metrics.jsonl" \
    train/lm_loss,train/grad_norm,validation/lm_loss
check "ScaleNorm's losses are not RMSNorm's" bash -c \
    "! $LIB same '$T/straight/metrics.jsonl' '$T/rmsrun/metrics.jsonl' train/lm_loss >/dev/null"
