# tests/tools/neox_ckpt.sh: neox-convert to-neox and from-neox on a checkpoint neox-train writes (a
# 1-layer model, 2 steps): the DeepSpeed files to-neox writes for 2 tensor-parallel by 2 data-parallel
# ranks, read back by from-neox and resumed by neox-train; the pipeline layer files of --pp 1, read back
# bit-exact; a tied embedding's --pp 2 files (layer_00, tied_modules.embed in both stages' optimizers),
# read back bit-exact and refused when the two copies differ; a Llama-style model's (rmsnorm, swiglu, no biases) pipeline layer files under GPT-NeoX's
# names, read back bit-exact, with grouped-query attention too; and what from-neox (and to-neox) refuse by name before
# writing anything (no output appears): a config whose model_parallel_size differs from the files, a
# ZeRO-3 / bf16-optimizer checkpoint, a ZeRO stage 3 recorded in the optimizer files, a non-Adam
# optimizer state, a missing config, grouped-query attention's key/value heads split over
# tensor-parallel ranks, a grouped-query config against per-head files, a Llama-style MLP under
# dense_h_to_4h names, RMSNorm files against a config's layernorm, a gated MLP's files against an ungated activation. The DeepSpeed oracle is tests/oracle/test_neox_checkpoints.py.
source tests/lib.sh
char_shakespeare "neox-convert to-neox/from-neox" || exit 0
cat >"$T/run.yml" <<EOF2
{"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 16, "max_position_embeddings": 16,
 "pos_emb": "rotary", "no_weight_tying": true, "model_parallel_size": 2, "pipe_parallel_size": 1,
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "weight_decay": 0.01, "lr_decay_style": "constant", "lr_decay_iters": 3,
 "train_micro_batch_size_per_gpu": 2, "train_iters": 2, "eval_interval": 1000, "eval_iters": 1, "log_interval": 1,
 "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "save": "$T/save",
 "checkpoint_factor": 2, "log_dir": "$T/logs"}
EOF2
sed 's/"model_parallel_size": 2/"model_parallel_size": 1/' "$T/run.yml" >"$T/tp1.yml"
check "neox-train writes a checkpoint to export" "$TRAIN" -q "$T/tp1.yml"
check "to-neox writes DeepSpeed's files for tp 2, dp 2" "$CONVERT" to-neox --input "$T/save" --output "$T/neox" --tp 2 --dp 2
check_output "they are GPT-NeoX's file names" \
    "^latest mp_rank_00_model_states.pt mp_rank_01_model_states.pt zero_pp_rank_0_mp_rank_00_optim_states.pt zero_pp_rank_0_mp_rank_01_optim_states.pt zero_pp_rank_1_mp_rank_00_optim_states.pt zero_pp_rank_1_mp_rank_01_optim_states.pt$" \
    bash -c "cd '$T/neox' && echo \$(ls latest global_step2 | grep -v '^global_step2:' | grep -v '^$')"
check "from-neox reads them back" "$CONVERT" from-neox --input "$T/neox" --config "$T/run.yml" --output "$T/back"
check "the import verifies" "$CONVERT" verify "$T/back"
sed -e 's/"train_iters": 2/"train_iters": 3/' -e "s#\"save\": \"$T/save\"#\"load\": \"$T/back\"#" "$T/tp1.yml" >"$T/resume.yml"
check_output "neox-train resumes from it at iteration 3" "iteration +3/ +3" "$TRAIN" "$T/resume.yml"
check_fails "a config whose model_parallel_size differs from the files is refused" 2 "model_parallel_size: the configs say 1" \
    "$CONVERT" from-neox --input "$T/neox" --config "$T/tp1.yml" --output "$T/out1"
cp -r "$T/neox" "$T/bf16"
touch "$T/bf16/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
check_fails "DeepSpeed's bf16 optimizer / ZeRO-3 files are refused" 2 "bf16_zero_pp_rank_\*, zero3_\*" \
    "$CONVERT" from-neox --input "$T/bf16" --config "$T/run.yml" --output "$T/out2"
check_fails "from-neox needs the run's configs" 2 "--config is required" \
    "$CONVERT" from-neox --input "$T/neox" --output "$T/out3"
check "to-neox of the module files for one rank" "$CONVERT" to-neox --input "$T/save" --output "$T/neox-tp1"
check "from-neox of them" "$CONVERT" from-neox --input "$T/neox-tp1" --config "$T/tp1.yml" --output "$T/back-tp1"
check "to-neox --pp 1 writes GPT-NeoX's pipeline layer files" "$CONVERT" to-neox --input "$T/save" --output "$T/pipe" --pp 1
check_output "one per layer holding parameters (0 the embedding, 2 the transformer layer, 4 the norm, 5 the output)" \
    "^layer_00-model_00-model_states.pt layer_02-model_00-model_states.pt layer_04-model_00-model_states.pt layer_05-model_00-model_states.pt mp_rank_00_model_states.pt zero_pp_rank_0_mp_rank_00_optim_states.pt$" \
    bash -c "cd '$T/pipe/global_step2' && echo \$(ls)"
check "from-neox reads the pipeline files back" "$CONVERT" from-neox --input "$T/pipe" --config "$T/tp1.yml" --output "$T/pipe-back"
check_output "bit-exact: the same tensors as the module files' import" "^same$" \
    bash -c "a=\$('$CONVERT' inspect '$T/pipe-back' | grep -E '^  (params|optimizer)/'); b=\$('$CONVERT' inspect '$T/back-tp1' | grep -E '^  (params|optimizer)/'); [ \$(echo \"\$a\" | wc -l) -gt 20 ] && [ \"\$a\" = \"\$b\" ] && echo same"
check_fails "to-neox --pp refuses ZeRO-2 (DeepSpeed's pipeline engine runs ZeRO-1)" 2 "--pp 2 with --zero 2" \
    "$CONVERT" to-neox --input "$T/save" --output "$T/out4" --pp 2 --zero 2
# Tied embeddings under a pipeline (GPT-NeoX's default no_weight_tying false): TiedLayerSpec "embed" (2 layers, one a stage).
sed -e 's/"no_weight_tying": true/"no_weight_tying": false/' -e 's/"num_layers": 1/"num_layers": 2/' -e "s#$T/save#$T/tied#" \
    "$T/tp1.yml" >"$T/tied.yml"
sed 's/"pipe_parallel_size": 1/"pipe_parallel_size": 2/' "$T/tied.yml" >"$T/tied-pp2.yml"
check "neox-train writes a tied-embedding checkpoint" "$TRAIN" -q "$T/tied.yml"
check "to-neox --pp 2 writes its pipeline files" "$CONVERT" to-neox --input "$T/tied" --output "$T/tied-neox" --pp 2
check_output "the embedding in layer_00's file only; tied_modules.embed in both stages' optimizers" \
    "^layer_00-model_00-model_states.pt layer_02-model_00-model_states.pt layer_03-model_00-model_states.pt layer_05-model_00-model_states.pt \[.tied_modules.embed.word_embeddings.weight.\] \[.tied_modules.embed.word_embeddings.weight.\]$" \
    "$PY" -c "
import glob, os, torch
os.chdir('$T/tied-neox/global_step2')
print(*sorted(glob.glob('layer_*')), *([k for k in torch.load(f'zero_pp_rank_0_mp_rank_0{s}_optim_states.pt')
      ['optimizer_state_dict']['param_slice_mappings'][0] if 'embed' in k] for s in (0, 1)))"
check "from-neox reads them back" "$CONVERT" from-neox --input "$T/tied-neox" --config "$T/tied-pp2.yml" --output "$T/tied-back"
check_output "bit-exact: the same tensors as neox-train's" "^same$" \
    bash -c "a=\$('$CONVERT' inspect '$T/tied-back' | grep -E '^  (params|optimizer)/'); b=\$('$CONVERT' inspect '$T/tied' | grep -E '^  (params|optimizer)/'); [ \$(echo \"\$a\" | wc -l) -gt 20 ] && [ \"\$a\" = \"\$b\" ] && echo same"
"$PY" -c "
import torch
p = '$T/tied-neox/global_step2/zero_pp_rank_0_mp_rank_01_optim_states.pt'
sd = torch.load(p)
sd['optimizer_state_dict']['base_optimizer_state']['state'][0]['exp_avg'][0] += 1
torch.save(sd, p)"
check_fails "from-neox refuses a last stage whose tied copy differs from the first stage's, naming it" 1 \
    "the tied embedding's exp_avg on pipeline stage 1 differ from stage 0's" \
    "$CONVERT" from-neox --input "$T/tied-neox" --config "$T/tied-pp2.yml" --output "$T/out9"
# A Llama-style model as GPT-NeoX's llama configs make it (RMSNorm's scale, linear1 = [x | gate]).
sed -e 's/"model_parallel_size": 2/"model_parallel_size": 1/' -e 's/"pos_emb": "rotary"/"pos_emb": "rotary", "rotary_pct": 1, "norm": "rmsnorm", "activation": "swiglu", "use_bias_in_norms": false, "use_bias_in_attn_linear": false, "use_bias_in_mlp": false, "mlp_multiple_of": 16/' \
    -e "s#$T/save#$T/llama#" "$T/run.yml" >"$T/llama.yml"
check "neox-train writes a Llama-style checkpoint" "$TRAIN" -q "$T/llama.yml"
check "to-neox --pp 1 writes its layer files" "$CONVERT" to-neox --input "$T/llama" --output "$T/llama-neox" --pp 1
check_output "under GPT-NeoX's Llama names" "^attention.dense.weight attention.query_key_value.weight input_layernorm.scale mlp.linear1.weight mlp.linear2.weight post_attention_layernorm.scale$" \
    "$PY" -c "import torch; print(*sorted(torch.load('$T/llama-neox/global_step2/layer_02-model_00-model_states.pt')))"
check_fails "to-neox refuses a Llama-style MLP under GPT-NeoX's older dense_h_to_4h names" 2 \
    "--mlp-names dense_h_to_4h: a Llama-style model's MLP has GPT-NeoX names only as mlp.linear1/linear2" \
    "$CONVERT" to-neox --input "$T/llama" --output "$T/out10" --mlp-names dense_h_to_4h
check "from-neox reads them back" "$CONVERT" from-neox --input "$T/llama-neox" --config "$T/llama.yml" --output "$T/llama-back"
check_output "bit-exact: the same tensors as neox-train's" "^same$" \
    bash -c "a=\$('$CONVERT' inspect '$T/llama-back' | grep -E '^  (params|optimizer)/'); b=\$('$CONVERT' inspect '$T/llama' | grep -E '^  (params|optimizer)/'); [ \$(echo \"\$a\" | wc -l) -gt 20 ] && [ \"\$a\" = \"\$b\" ] && echo same"
sed -e 's/"num_attention_heads": 2/"num_attention_heads": 2, "num_kv_heads": 1/' -e "s#$T/llama#$T/gqa#" "$T/llama.yml" >"$T/gqa.yml"
check "neox-train writes a grouped-query Llama-style checkpoint" "$TRAIN" -q "$T/gqa.yml"
check "to-neox --pp 1 writes its layer files" "$CONVERT" to-neox --input "$T/gqa" --output "$T/gqa-neox" --pp 1
check_output "its fused QKV is GPT-NeoX's grouped-query [q | k | v]: 16 + 8 + 8 rows" "^torch.Size\(\[32, 16\]\)$" \
    "$PY" -c "import torch; print(torch.load('$T/gqa-neox/global_step2/layer_02-model_00-model_states.pt')['attention.query_key_value.weight'].shape)"
check "from-neox reads them back" "$CONVERT" from-neox --input "$T/gqa-neox" --config "$T/gqa.yml" --output "$T/gqa-back"
check_output "bit-exact: the same tensors as neox-train's" "^same$" \
    bash -c "a=\$('$CONVERT' inspect '$T/gqa-back' | grep -E '^  (params|optimizer)/'); b=\$('$CONVERT' inspect '$T/gqa' | grep -E '^  (params|optimizer)/'); [ \$(echo \"\$a\" | wc -l) -gt 20 ] && [ \"\$a\" = \"\$b\" ] && echo same"
check_fails "to-neox refuses one key/value head over two tensor-parallel ranks (GPT-NeoX does not copy them)" 2 \
    "num_kv_heads: 1 key/value heads over 2 tensor-parallel ranks" \
    "$CONVERT" to-neox --input "$T/gqa" --output "$T/out5" --tp 2
check_fails "from-neox refuses a grouped-query config against per-head files, naming the tensor and shapes" 2 \
    "self_attn.q_proj.weight of tensor-parallel rank 0 is 48 x 16, the configs' model's 32 x 16" \
    "$CONVERT" from-neox --input "$T/llama-neox" --config "$T/gqa.yml" --output "$T/out6"
sed 's/"norm": "rmsnorm"/"norm": "layernorm"/' "$T/llama.yml" >"$T/llama-ln.yml"
check_fails "from-neox refuses RMSNorm files against a config's layernorm, naming the tensor" 2 \
    "'input_layernorm.scale': RMSNorm's scale, but the configs say norm: not rmsnorm" \
    "$CONVERT" from-neox --input "$T/llama-neox" --config "$T/llama-ln.yml" --output "$T/out7"
sed 's/"activation": "swiglu"/"activation": "gelu"/' "$T/llama.yml" >"$T/llama-gelu.yml"
# (swiglu's linear1 of 2 x 32 rows happens to be gelu's 64: linear2 is where they differ)
check_fails "from-neox refuses gated-MLP files against an ungated activation, naming the tensor and shapes" 2 \
    "mlp.down_proj.weight of tensor-parallel rank 0 is 16 x 32, the configs' model's 16 x 64" \
    "$CONVERT" from-neox --input "$T/llama-neox" --config "$T/llama-gelu.yml" --output "$T/out8"
check "no refused command left an output" bash -c "! ls -d '$T'/out* 2>/dev/null"
