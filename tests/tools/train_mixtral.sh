# tests/tools/train_mixtral.sh: a Mixtral-style Mixture of Experts through the tools — gated (swiglu)
# experts (w1 gate, w3 up, w2 down) and the topk router with moe_topk_renormalize. It trains on Tiny
# Shakespeare and learns; it resumes bit for bit; the emulated device gives the CPU's losses bit for
# bit; it trains in bfloat16; renormalisation changes the run; the checkpoint holds w3 and GPT-NeoX's
# default expert width for a gated MLP (int(2 x hidden x 4 / 3) rounded up to 256);
# moe_topk_renormalize with the Sinkhorn router is refused; generation with the KV cache gives
# recomputation's text; to-hf writes a MixtralForCausalLM folder and refuses the unrenormalised run
# naming the field. (Numerics against transformers' MixtralForCausalLM: tests/oracle/test_mixtral.py.)
source tests/lib.sh

char_shakespeare "Mixtral-style MoE" || exit 0

source tests/small_model.sh
small_model model '"num_kv_heads": 2, "seq_length": 64, "max_position_embeddings": 64, "pos_emb": "rotary",
  "no_weight_tying": true, "norm": "rmsnorm", "activation": "swiglu", "use_bias_in_attn_linear": false,
  "use_bias_in_mlp": false, "moe_num_experts": 4, "moe_top_k": 2, "moe_router_type": "topk"'
run() {  # run NAME JSON: trains model.yml + JSON (renormalised unless JSON says) with logs in $T/NAME
    case $2 in *moe_topk_renormalize*) echo "{\"log_dir\": \"$T/$1\" $2}" ;;
               *) echo "{\"log_dir\": \"$T/$1\", \"moe_topk_renormalize\": true $2}" ;; esac >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml"
}

check "gated experts, renormalised top 2 of 4: 30 steps" run straight ", \"save\": \"$T/ckpt\""
check "the loss falls" $LIB falls "$T/straight/metrics.jsonl" 30 0.7
check_resume_and_emulated

check "moe_topk_renormalize: false" run plain ", \"moe_topk_renormalize\": false, \"save\": \"$T/ckpt_plain\""
check "renormalisation changes the run" python3 - "$T/straight/metrics.jsonl" "$T/plain/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r["train/lm_loss"] for r in map(json.loads, open(p)) if "train/lm_loss" in r] for p in sys.argv[1:])
print(a[:3], b[:3])
assert len(a) == len(b) == 30 and a[0] != b[0]
PY

# bfloat16: the 16-bit GEMM scratch holds the gated experts' 2 x width first projections.
check "bfloat16: 30 steps" run bf16 ", \"precision\": \"bfloat16\""
check "bfloat16: the loss falls" $LIB falls "$T/bf16/metrics.jsonl" 30 0.7

# hidden 64: int(2 * 64 * 4 / 3) = 170, rounded up to 256 (ParallelGroupedLLaMAMLP).
check_output "the checkpoint holds gated experts of GPT-NeoX's default width (256)" \
    "params/model\.layers\.1\.block_sparse_moe\.experts\.3\.w3\.weight +256x64 " $CONVERT inspect "$T/ckpt"
sed 's/"moe_router_type": "topk"/"moe_router_type": "sinkhorn", "moe_topk_renormalize": true/' "$T/model.yml" \
    >"$T/sinkhorn.yml"
check_fails "moe_topk_renormalize with the Sinkhorn router is refused naming both" 2 \
    "moe_topk_renormalize applies to moe_router_type: topk only" $TRAIN -q "$T/sinkhorn.yml"
echo "{\"load\": \"$T/ckpt\", \"moe_topk_renormalize\": true}" >"$T/load.yml"
check_cached_generation "$T/model.yml" "$T/load.yml"  # the KV cache's gated experts, token by token
check "to-hf exports it" $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check "as MixtralForCausalLM with its experts and width" python3 -c "
import json
c = json.load(open('$T/hf/config.json'))
print(c)
assert c['architectures'] == ['MixtralForCausalLM'] and c['num_local_experts'] == 4 and c['num_experts_per_tok'] == 2
assert c['intermediate_size'] == 256 and c['hidden_act'] == 'silu' and c['num_key_value_heads'] == 2"
check_fails "to-hf refuses the unrenormalised run naming the field" 2 "moe_topk_renormalize: false" \
    $CONVERT to-hf --input "$T/ckpt_plain" --output "$T/hf2"
check "the refused export wrote nothing" test ! -e "$T/hf2"
