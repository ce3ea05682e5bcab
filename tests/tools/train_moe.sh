# tests/tools/train_moe.sh: GPT-NeoX's Mixture of Experts through the tools. A MoE model (Sinkhorn
# router, top 2 of 4 experts) trains on Tiny Shakespeare and learns; it resumes bit for bit, and the
# emulated device gives the CPU's losses bit for bit; the router type, top_k and expert interval each
# change the run (and the interval the parameters); the checkpoint lists the experts; Hugging Face
# export of these ungated experts is refused naming the field (gated, renormalised ones export:
# tests/tools/train_mixtral.sh); generation with the KV cache gives recomputation's text;
# moe_jitter_eps changes the topk router's run and resumes bit for bit (refused with Sinkhorn, which
# GPT-NeoX never jitters); moe_lbl_in_fp32 is named as ignored. GPT-NeoX's 125M-dmoe.yml, shrunk,
# trains 10 steps (bfloat16, recomputation, ZeRO-1). (Numerics against a torch restatement of GPT-NeoX's MoE: tests/oracle/test_moe.py.)
source tests/lib.sh

char_shakespeare "MoE" || exit 0

source tests/small_model.sh
small_model model '"seq_length": 64, "max_position_embeddings": 64, "pos_emb": "rotary",
  "no_weight_tying": true, "intermediate_size": 192'
MOE='"moe_num_experts": 4, "moe_top_k": 2'
run() {  # run NAME JSON: trains model.yml + JSON with logs in $T/NAME (top 2 of 4 experts unless JSON says)
    case $2 in *moe_top_k*) echo "{\"log_dir\": \"$T/$1\", \"moe_num_experts\": 4 $2}" ;;
               *) echo "{\"log_dir\": \"$T/$1\", $MOE $2}" ;; esac >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml"
}
differ() {  # differ A B: the two runs' training losses differ from the first step on
    python3 - "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r["train/lm_loss"] for r in map(json.loads, open(p)) if "train/lm_loss" in r] for p in sys.argv[1:])
print(a[:3], b[:3])
assert len(a) == len(b) == 30 and a[0] != b[0]
PY
}

check "MoE (Sinkhorn, top 2 of 4 experts): 30 steps" run straight ", \"save\": \"$T/ckpt\""
check "MoE: the loss falls" $LIB falls "$T/straight/metrics.jsonl" 30 0.7
check_resume_and_emulated

# Each key changes the run.
check "moe_router_type: topk" run topk ", \"moe_top_k\": 2, \"moe_router_type\": \"topk\""
check "the topk router trains differently" differ straight topk
check "moe_top_k: 1" run top1 ", \"moe_top_k\": 1"
check "top 1 (sigmoid weights) trains differently" differ straight top1
check "moe_expert_interval: 2" run interval ", \"moe_expert_interval\": 2, \"save\": \"$T/ckpt_interval\""
check "every second layer's MLP is experts" differ straight interval
check_output "the checkpoint holds layer 0's router and experts" \
    "layers\.0\.block_sparse_moe\.gate\.weight.*|layers\.0\.block_sparse_moe\.experts\.3\.w2\.weight" \
    $CONVERT inspect "$T/ckpt_interval"
check "layer 1 keeps its dense MLP" sh -c "$CONVERT inspect '$T/ckpt_interval' | grep -q 'layers\.1\.mlp\.dense_h_to_4h' &&
    ! $CONVERT inspect '$T/ckpt_interval' | grep -q 'layers\.1\.block_sparse_moe'"

echo "{\"load\": \"$T/ckpt\", \"moe_num_experts\": 2, \"moe_top_k\": 2}" >"$T/two.yml"
check_fails "a checkpoint of 4 experts does not load as 2" 2 "moe_num_experts = 4 but the config gives 2" \
    $TRAIN -q "$T/model.yml" "$T/two.yml"
check_fails "to-hf refuses GPT-NeoX's experts by name" 2 "moe_num_experts 4: MixtralForCausalLM cannot hold this Mixture of Experts: activation" \
    $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check "the refused export wrote nothing" test ! -e "$T/hf"
echo "{\"load\": \"$T/ckpt\", $MOE}" >"$T/load.yml"
check_output "neox-eval: perplexity of the MoE checkpoint (evaluation routing)" "valid" \
    $EVAL -q --tasks valid --results-prefix - "$T/model.yml" "$T/load.yml"
check_cached_generation "$T/model.yml" "$T/load.yml"  # evaluation routing, token by token
JITTER=', "moe_top_k": 2, "moe_router_type": "topk", "moe_jitter_eps": 0.1'
check "moe_jitter_eps with the topk router" run jitter "$JITTER"
check "the jitter changes the topk router's run" differ topk jitter
check "jitter: stop at 15" run jitter_resumed "$JITTER, \"save\": \"$T/ckpt_jitter\", \"exit_interval\": 15"
check "jitter: resume to 30" run jitter_resumed "$JITTER, \"save\": \"$T/ckpt_jitter\", \"load\": \"$T/ckpt_jitter\""
check "jitter: the resumed run equals the straight one bit for bit (the noise is a counter-based stream)" \
    $LIB same "$T/jitter/metrics.jsonl" "$T/jitter_resumed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss
echo "{$MOE, \"moe_jitter_eps\": 0.1}" >"$T/jitter_sinkhorn.yml"
check_fails "moe_jitter_eps with the Sinkhorn router is refused naming both" 2 \
    "moe_jitter_eps applies to moe_router_type: topk only" $TRAIN -q "$T/model.yml" "$T/jitter_sinkhorn.yml"
echo "{$MOE, \"moe_lbl_in_fp32\": true}" >"$T/lbl.yml"
check_output "moe_lbl_in_fp32 is named as ignored" "moe_lbl_in_fp32" \
    sh -c "$TRAIN --print-config '$T/model.yml' '$T/lbl.yml' 2>&1"

# GPT-NeoX's own MoE config, with a tiny model, local data and one process: 10 steps train.
DMOE=$CONFIGS/125M-dmoe.yml
if [ -f "$DMOE" ]; then
    check "shrink GPT-NeoX's 125M-dmoe.yml to a tiny model with local paths" .venv/bin/python -c "
import sys, yaml
sys.path.insert(0, 'tests/tools')
import train_lib
c = yaml.safe_load(open('$DMOE'))
c.update(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=48, max_position_embeddings=48,
         train_micro_batch_size_per_gpu=4, train_iters=10, lr_decay_iters=10, eval_interval=5, eval_iters=1, log_interval=1,
         checkpoint_factor=10, save='$T/dmoe_ckpt', tokenizer_type='CharLevelTokenizer', log_dir='$T/dmoe',
         data_path='$T/char_text_document')
c.pop('hostfile', None)
train_lib.write_config(c, '$T/dmoe.yml')"
    check "the shrunk 125M-dmoe.yml (8 experts, bfloat16, recomputation, ZeRO-1) trains 10 steps" $TRAIN -q "$T/dmoe.yml"
    check "its loss is logged, finite and falling" python3 -c "
import json, math
l = [r['train/lm_loss'] for r in map(json.loads, open('$T/dmoe/metrics.jsonl')) if 'train/lm_loss' in r]
print(l)
assert len(l) == 10 and all(math.isfinite(x) for x in l) and l[-1] < l[0], l"
    check_output "its checkpoint holds 8 experts per layer" "layers\.1\.block_sparse_moe\.experts\.7\.w1\.weight" \
        $CONVERT inspect "$T/dmoe_ckpt"
else
    skip "GPT-NeoX's 125M-dmoe.yml trains" "$DMOE is absent"
fi
