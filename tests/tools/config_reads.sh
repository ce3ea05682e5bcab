# tests/tools/config_reads.sh: no key marked used in the schema goes unread. The four tools run on
# small configs that between them set every used key and sub-key (training with fp16 and the
# communication logger, a resume, two data-parallel ranks under ZeRO, profiling, evaluation, generation, export),
# with NEOX_CONFIG_READS recording each key the config layer hands out; config_reads_check.py then fails
# for any used key of lib/config/schema_gen.c that no run read.
source tests/lib.sh

READS=$T/reads
export NEOX_CONFIG_READS=$READS/run.txt
mkdir -p "$READS"
command -v "$MPIEXEC" >/dev/null || { skip "config reads" "$MPIEXEC is not installed"; exit 0; }

words_dataset 300 3
source tests/layout_config.sh
LAYERS=2

# fp16 with every loss-scaler setting, the communication logger, the data and checkpoint keys.
FP16='"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 100,
  "hysteresis": 2, "consecutive_hysteresis": false, "min_loss_scale": 1}'
COMMS='"comms_logger": {"enabled": true, "verbose": false, "prof_all": false, "prof_ops": ["all_reduce"], "debug": false}'
config neox neox 2 2 4 ", $FP16, $COMMS, \"split\": \"90,5,5\", \"tensorboard_dir\": \"$T/neox/tb\",
  \"checkpoint_activations\": true, \"activation_checkpointing\": {\"partition_activations\": false, \"cpu_checkpointing\": false},
  \"seed\": 5, \"eval_results_prefix\": \"$T/eval\",
  \"sample_output_file\": \"$T/gen.jsonl\""
check "train: fp16, comms_logger, split, tensorboard" "$TRAIN" "$T/neox.yml"
config resume neox 2 2 6 ", \"load\": \"$T/neox/ckpt\", \"no_load_optim\": false, \"finetune\": false,
  \"use_checkpoint_lr_scheduler\": true"
check "train: resume with load" "$TRAIN" "$T/resume.yml"

# Two data-parallel ranks: ZeRO, the wire type, the comms logger inside deepspeed_extra_args, rmsnorm,
# Llama 3.1's rope_scaling (both spellings of its type), Qwen2's unbiased attention output.
ZERO='"zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 3000,
  "allgather_bucket_size": 3000, "contiguous_gradients": true, "offload_optimizer": {"device": "cpu", "pin_memory": true}}'
EXTRA='"deepspeed_extra_args": {"comms_logger": {"enabled": true, "verbose": false, "prof_all": true, "prof_ops": [], "debug": false}}'
ROPE='"rope_scaling": {"rope_type": "llama3", "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}'
config dp2 llama 2 1 4 ", $ZERO, $EXTRA, $ROPE, \"use_bias_in_attn_output\": false, \"communication_data_type\": \"bf16\", \"fp32_allreduce\": false,
  \"gradient_predivide_factor\": 1.0"
check "train: 2 data-parallel ranks under ZeRO-1" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/dp2.yml"
config psgd neox 2 1 3 ", \"gradient_compression\": \"powersgd\", \"gradient_compression_rank\": 2, \"gradient_compression_start\": 1,
  \"sliding_window_width\": 3, \"profile\": true, \"profile_step_start\": 1, \"profile_step_stop\": 2,
  \"memory_profiling\": true, \"memory_profiling_path\": \"$T/psgd/memory\""
check "train: 2 data-parallel ranks with PowerSGD, a sliding window and profiling" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/psgd.yml"
echo '{"iteration": 1, "scheme": "bf16"}' >"$T/decisions.jsonl"
config adaptive neox 2 1 3 ", \"gradient_compression\": \"adaptive\", \"gradient_compression_interval\": 2,
  \"gradient_compression_replay\": \"$T/decisions.jsonl\""
check "train: 2 data-parallel ranks with adaptive compression, replayed" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/adaptive.yml"

# Mixture of Experts: a top-k router on every layer (sequential residual: GPT-NeoX's MoE has no
# parallel one).
config moe neox 2 1 3 ', "moe_num_experts": 2, "moe_top_k": 1, "moe_router_type": "topk", "moe_expert_interval": 1'
sed -i 's/"gpt_j_residual": true/"gpt_j_residual": false/' "$T/moe.yml"
check "train: Mixture of Experts" "$TRAIN" -q "$T/moe.yml"
# A Mixtral-style one: gated experts, the top-k weights renormalised.
config mixtral llama 2 1 3 ', "moe_num_experts": 2, "moe_top_k": 2, "moe_router_type": "topk", "moe_topk_renormalize": true'
check "train: gated experts with renormalised weights" "$TRAIN" -q "$T/mixtral.yml"

# ScaleNorm with its epsilon.
NORM=scalenorm config scalenorm neox 2 1 3 ', "scalenorm_epsilon": 1.0e-6'
check "train: ScaleNorm" "$TRAIN" -q "$T/scalenorm.yml"
# Precision fp8 with every te_fp8_* key (Transformer Engine's delayed-scaling recipe).
config fp8 neox 2 1 3 ', "precision": "fp8", "te_fp8_format": "e4m3", "te_fp8_wgrad": false,
  "te_fp8_amax_history_len": 2, "te_fp8_amax_compute_algo": "max", "te_fp8_margin": 1'
check "train: precision fp8 with its recipe" "$TRAIN" -q "$T/fp8.yml"
# Non-parametric LayerNorm with its epsilon (layernorm_epsilon).
NORM=non_parametric_layernorm config nplayernorm neox 2 1 3 ', "layernorm_epsilon": 1.0e-6'
check "train: non-parametric LayerNorm" "$TRAIN" -q "$T/nplayernorm.yml"

# SGD and 1-bit Adam with their own params (1-bit Adam on 2 ranks, past its freeze step); SGD's
# run with GPT-NeoX's onnx_safe gelu.
# Label datasets (SFT): the token dataset serves as its own label dataset.
D=$T/docs_text_document
config sft neox 2 1 3 ", \"train_data_paths\": [\"$D\"], \"valid_data_paths\": [\"$D\"], \"test_data_paths\": [\"$D\"],
  \"train_label_data_paths\": [\"$D\"], \"valid_label_data_paths\": [\"$D\"], \"test_label_data_paths\": [\"$D\"]"
sed -i 's|"data_path": "[^"]*", ||' "$T/sft.yml"
check "train: label datasets" "$TRAIN" -q "$T/sft.yml"
# DPO on pairwise data (the token dataset as both sides and as their labels).
PAIRS=""
for split in train valid test; do
    PAIRS="$PAIRS, \"pos_${split}_data_paths\": [\"$D\"], \"neg_${split}_data_paths\": [\"$D\"],
      \"pos_${split}_label_data_paths\": [\"$D\"], \"neg_${split}_label_data_paths\": [\"$D\"]"
done
config dpo neox 2 1 3 ", \"train_impl\": \"dpo\", \"dataset_impl\": \"pairwise\", \"dpo_beta\": 0.2,
  \"dpo_reference_free\": false, \"pack_impl\": \"unpacked\" $PAIRS"
sed -i 's|"data_path": "[^"]*", ||' "$T/dpo.yml"
check "train: DPO on pairwise data" "$TRAIN" -q "$T/dpo.yml"
# KTO: the token dataset as its own labels and rewards (each document's first id, > 0: desirable).
REWARDS=""
for split in train valid test; do
    REWARDS="$REWARDS, \"${split}_data_paths\": [\"$D\"], \"${split}_label_data_paths\": [\"$D\"],
      \"${split}_reward_data_paths\": [\"$D\"]"
done
config kto neox 2 1 3 ", \"train_impl\": \"kto\", \"kto_beta\": 0.2, \"kto_desirable_weight\": 1.0,
  \"kto_undesirable_weight\": 1.5, \"pack_impl\": \"unpacked\" $REWARDS"
sed -i 's|"data_path": "[^"]*", ||' "$T/kto.yml"
check "train: KTO on reward datasets" "$TRAIN" -q "$T/kto.yml"
config sgd neox 2 2 3 ', "onnx_safe": true, "log_gradient_noise_scale": true, "gradient_noise_scale_n_batches": 2,
  "gradient_noise_scale_cpu_offload": true'
sed -i 's|"optimizer": {[^}]*}}|"optimizer": {"type": "sgd", "params": {"lr": 0.01, "momentum": 0.9}}|' "$T/sgd.yml"
check "train: sgd with momentum, the gradient noise scale" "$TRAIN" -q "$T/sgd.yml"
OPTIMIZER='{"type": "lion", "params": {"lr": 0.0003, "betas": [0.9, 0.99]}}' config lion neox 2 1 3 ''
check "train: lion" "$TRAIN" -q "$T/lion.yml"
OPTIMIZER='{"type": "madgrad_wd", "params": {"lr": 0.01, "momentum": 0.9, "eps": 1.0e-6}}' config madgrad neox 2 1 3 ''
check "train: madgrad_wd" "$TRAIN" -q "$T/madgrad.yml"
OPTIMIZER='{"type": "sm3", "params": {"lr": 0.01, "momentum": 0.9, "beta": 0.5, "eps": 1.0e-30}}' config sm3 neox 2 1 3 ''
check "train: sm3" "$TRAIN" -q "$T/sm3.yml"
config onebit neox 2 1 3 ''
sed -i 's|"optimizer": {[^}]*}}|"optimizer": {"type": "onebitadam", "params": {"lr": 0.01, "freeze_step": 1, "weight_decay": 0.01, "amsgrad": false}}|' "$T/onebit.yml"
check "train: onebitadam on 2 ranks" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/onebit.yml"

# Evaluation, generation and export of the first run's checkpoint.
sed "s|\"save\": \"$T/neox/ckpt\"|\"load\": \"$T/neox/ckpt\"|" "$T/neox.yml" >"$T/eval.yml"
printf '{"eval_tasks": ["lambada_openai"], "eval_data_dir": "%s", "eval_task_limit": 3}\n' "$DATA/eval" >"$T/tasks.yml"
check "neox-eval: the config's eval_tasks" "$EVAL" -q "$T/eval.yml" "$T/tasks.yml"
printf 'the king\n' >"$T/prompts.txt"
check "neox-eval generate" "$EVAL" generate -q "$T/eval.yml" --text-gen-type input-file --sample-input-file "$T/prompts.txt"
check "neox-convert to-hf" "$NEOX_BIN/neox-convert" to-hf --input "$T/neox/ckpt" --output "$T/hf"

unset NEOX_CONFIG_READS
check_output "every used key and sub-key of the schema is read by some run" "used keys" \
    python3 tests/tools/config_reads_check.py lib/config/schema_gen.c "$READS/run.txt"
