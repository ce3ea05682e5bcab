# tests/tools/train_nonparametric_norm.sh: norm non_parametric_layernorm (GPT-NeoX's
# NonParametricLayernorm: a LayerNorm with no weight and no bias) through the tools. A model trains on
# Tiny Shakespeare and learns; it resumes bit for bit and the emulated device gives the CPU's losses;
# generation with the KV cache gives the text recomputation gives; layernorm_epsilon reaches the norm;
# the checkpoint holds no norm tensor, with use_qk_layernorm too; Hugging Face export is refused by
# name and writes nothing. (Numerics against a torch restatement:
# tests/oracle/test_model_parity.py::test_nonparametric_layernorm_parity; tensor and pipeline
# parallelism, ZeRO-3: tests/mpi/layouts.sh.)
source tests/lib.sh

char_shakespeare "non_parametric_layernorm" || exit 0

source tests/norm_config.sh
model model '"norm": "non_parametric_layernorm"'

check "non_parametric_layernorm: 30 steps" run straight ", \"save\": \"$T/ckpt\""
check "non_parametric_layernorm: the loss falls" $LIB falls "$T/straight/metrics.jsonl" 30 0.5
check_resume_and_emulated

# The epsilon is added to each row's variance: one far above it flattens every norm's output.
check "layernorm_epsilon 100: 30 steps" run flat ", \"layernorm_epsilon\": 100.0"
check "layernorm_epsilon reaches the norm (other losses)" bash -c \
    "! $LIB same '$T/straight/metrics.jsonl' '$T/flat/metrics.jsonl' train/lm_loss >/dev/null"

echo "{\"load\": \"$T/ckpt\", \"seq_length\": 64, \"max_position_embeddings\": 64}" >"$T/load.yml"
check_cached_generation "$T/model.yml" "$T/load.yml"

check_output "inspect names the norm" "non_parametric_layernorm" $CONVERT inspect "$T/ckpt"
check_output "the checkpoint holds the other tensors" "embed_tokens.weight" $CONVERT inspect "$T/ckpt"
check "the checkpoint holds no norm tensor" bash -c "! $CONVERT inspect '$T/ckpt' | grep -E 'norm\.(weight|bias)'"
check_fails "to-hf refuses non_parametric_layernorm by name" 2 "norm 'non_parametric_layernorm'" \
    $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check "the refused export wrote nothing" test ! -e "$T/hf"

# use_qk_layernorm: GPT-NeoX's NonParametricLayernorm([heads, head_size]) of queries and keys, no tensor.
model qk '"norm": "non_parametric_layernorm", "use_qk_layernorm": true'
check "with use_qk_layernorm: 30 steps" train_model qk qkrun ", \"save\": \"$T/qkckpt\""
check "use_qk_layernorm changes the losses" bash -c \
    "! $LIB same '$T/straight/metrics.jsonl' '$T/qkrun/metrics.jsonl' train/lm_loss >/dev/null"
check "use_qk_layernorm adds no tensor" bash -c "! $CONVERT inspect '$T/qkckpt' | grep -E 'norm\.(weight|bias)'"
echo "{\"load\": \"$T/qkckpt\", \"seq_length\": 64, \"max_position_embeddings\": 64}" >"$T/qkload.yml"
check_cached_generation "$T/qk.yml" "$T/qkload.yml"

# LayerNorm with its weights (use_bias_in_norms false: no biases either) learns other losses.
model ln '"norm": "layernorm", "use_bias_in_norms": false'
check "layernorm: 30 steps" train_model ln lnrun ""
check "non_parametric_layernorm's losses are not LayerNorm's" bash -c \
    "! $LIB same '$T/straight/metrics.jsonl' '$T/lnrun/metrics.jsonl' train/lm_loss >/dev/null"
