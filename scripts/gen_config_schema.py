#!/usr/bin/env python3
"""Generates lib/config/schema_gen.c, the typed table of every GPT-NeoX configuration key and of every
sub-key of the dicts GPT-NeoX hands to DeepSpeed, from GPT-NeoX's argument dataclasses
(neox_args.py, deepspeed_args.py: read with Python's ast, never imported) plus neox.c's decisions
about each key (the tables below).

    scripts/gen_config_schema.py --out . [../shared/reference/gpt-neox-args]

writes lib/config/schema_gen.c and lib/config_keys_gen.h under the --out folder (the repository root
to regenerate them; tests/tools/generated.sh generates into a temporary folder and compares). Without
--out, the schema goes to stdout (with --header, the key ids instead). The generated files are project
source (committed; the _gen suffix and their first line mark them): rerun this script when the
reference or a decision changes, never edit them by hand. Decisions: USED keys are read by neox.c; IGNORED keys (DeepSpeed, launcher, logging-service and
kernel-fusion knobs with no meaning here) are accepted and listed once in a notice; UNSUPPORTED keys are
refused when set to anything but their default. CHOICE keys (and INT keys) may also refuse single values
(SUPPORTED). docs/config.md explains each decision."""
import ast
import json
import os
import re
import sys

INT_MAX = 1 << 53

ARG_FILES = ("neox_args.py", "deepspeed_args.py")

# Keys GPT-NeoX computes in calculate_derived that its dataclasses do not declare.
EXTRA_KEYS = [
    ("NeoXArgsTraining", "save_iters", "list", None),
]

# The dataclasses' annotation is not what GPT-NeoX accepts for these: key -> schema type.
TYPE_OVERRIDES = {
    "communication_data_type": "CHOICE",  # declared bool; DeepSpeed takes a dtype name (CHOICES)
    "checkpoint_factor": "INT",        # Union[int, float]; neox.c saves at whole iterations
}
CHOICES = {"communication_data_type": "fp32|fp16|bf16",  # the choices of an overridden CHOICE
           # neox.c adds fp8: the linear layers' products on FP8 operands (Transformer Engine's recipe,
           # configured by the te_fp8_* keys; docs/model.md, "FP8 training")
           "precision": "fp16|fp32|bfloat16|fp8"}

# neox.c's own keys: (group, name, type, default, choices, derived, min, max, description).
OWN_KEYS = [
    # Hugging Face's rope_scaling dict (Llama 3.x, linear position interpolation); sub-keys below.
    ("neox.c", "rope_scaling", "DICT", None, None, 0, None, None),
    # false: q/k/v keep use_bias_in_attn_linear's biases, the attention output has none (Qwen2).
    ("neox.c", "use_bias_in_attn_output", "BOOL", None, None, 0, None, None),
    # topk router: the chosen experts' softmax weights divided by their sum (Mixtral's rule).
    ("neox.c", "moe_topk_renormalize", "BOOL", "false", None, 0, None, None),
    ("neox.c", "compute_backend", "CHOICE", "auto", "auto|cpu|cuda|emulated", 0, None, None),
    # false: bf16 attention on a GPU always runs on the own kernels instead of cuDNN's fused attention.
    ("neox.c", "cudnn_attention", "BOOL", "true", None, 0, None, None),
    # true: one rank's training step is captured once as a CUDA graph and replayed (docs/cuda.md).
    ("neox.c", "cuda_graph", "BOOL", "false", None, 0, None, None),
    ("neox.c", "gradient_compression", "CHOICE", "none", "none|onebit|powersgd|adaptive", 0, None, None),
    ("neox.c", "gradient_compression_rank", "INT", "4", None, 0, 1, 1024),
    ("neox.c", "gradient_compression_start", "INT", "0", None, 0, 0, float("inf")),
    # adaptive: steps between decisions (20 when unset), and a decisions file to replay instead of measuring.
    ("neox.c", "gradient_compression_interval", "INT", None, None, 0, 1, float("inf")),
    ("neox.c", "gradient_compression_replay", "STR", None, None, 0, None, None),
    # torch.distributed's default timeout (30 minutes): no job waits forever on a lost rank; 0 waits forever.
    ("neox.c", "comm_timeout_seconds", "FLOAT", "1800", None, 0, 0, float("inf")),
    # overlap_comm on CPU ranks: microseconds between a progress thread's polls (0: no thread).
    ("neox.c", "comm_progress_thread_us", "INT", "0", None, 0, 0, 1000000),
    ("neox.c", "data_parallel_size", "INT", None, None, 1, None, None),
    ("neox.c", "warmup_iters", "FLOAT", None, None, 1, None, None),
    ("neox.c", "adam_beta1", "FLOAT", None, None, 1, None, None),
    ("neox.c", "adam_beta2", "FLOAT", None, None, 1, None, None),
    ("neox.c", "adam_eps", "FLOAT", None, None, 1, None, None),
    ("neox.c", "onebitadam_freeze_step", "INT", None, None, 1, None, None),
    ("neox.c", "onebitadam_weight_decay", "FLOAT", None, None, 1, None, None),
    ("neox.c", "sgd_momentum", "FLOAT", None, None, 1, None, None),
    ("neox.c", "lion_beta1", "FLOAT", None, None, 1, None, None),
    ("neox.c", "lion_beta2", "FLOAT", None, None, 1, None, None),
    ("neox.c", "madgrad_momentum", "FLOAT", None, None, 1, None, None),
    ("neox.c", "madgrad_eps", "FLOAT", None, None, 1, None, None),
    ("neox.c", "sm3_momentum", "FLOAT", None, None, 1, None, None),
    ("neox.c", "sm3_beta", "FLOAT", None, None, 1, None, None),
    ("neox.c", "sm3_eps", "FLOAT", None, None, 1, None, None),
    ("neox.c", "data_cache_dir", "STR", None, None, 0, None, None),
    ("neox.c", "eval_data_dir", "STR", "data/eval", None, 0, None, None),
    ("neox.c", "eval_task_limit", "INT", "0", None, 0, 0, float("inf")),
    # The padded vocabulary in rows, the same under every model_parallel_size (GPT-NeoX's padding,
    # make_vocab_size_divisible_by x model_parallel_size, changes with it).
    ("neox.c", "pinned_padded_vocab_size", "INT", None, None, 0, 1, float("inf")),
    # Expert parallelism: each group of this many consecutive data-parallel ranks shares out the
    # experts of every MoE layer, tokens travelling to them by all-to-all (docs/parallel.md).
    ("neox.c", "moe_expert_parallel_size", "INT", "1", None, 0, 1, 4096),
    # Context parallelism: each group of this many consecutive data-parallel ranks shares out every
    # sequence (2 x cp chunks, rank i holding chunks i and 2cp-1-i), keys and values all-gathered per
    # layer (docs/parallel.md, "Context parallel").
    ("neox.c", "context_parallel_size", "INT", "1", None, 0, 1, 4096),
]

# Values GPT-NeoX computes itself; a file may not set them (derive.c computes them).
DERIVED = {"is_pipe_parallel", "batch_size", "dynamic_loss_scale", "save_iters",
           "zero_stage", "zero_reduce_scatter", "zero_contiguous_gradients", "zero_reduce_bucket_size",
           "zero_allgather_bucket_size", "config_files"}
# global_num_gpus stays settable: GPT-NeoX takes it as the GPU count; here it must match the world size.

IGNORED = set("""
wandb_init_all_ranks git_hash use_comet comet_workspace
comet_project comet_experiment_name comet_experiment comet_tags comet_others
rpe_num_buckets rpe_max_distance param_sharing_style layernorm_fusion rmsnorm_fusion
use_flashattn_swiglu scaled_upper_triang_masked_softmax_fusion scaled_masked_softmax_fusion bias_dropout_fusion
rope_fusion fused_kernels_build_path apply_query_key_layer_scaling use_cpu_initialization attention_softmax_in_fp32
rotary_save_freqs_buffer gmlp_attn_dim mamba_selective_scan_fusion mamba_causal_conv_fusion mamba_inner_func_fusion
mamba_selective_fp32_params mamba_use_bias_in_conv mamba_use_bias_in_linears dim_att head_size ffn_dim
distributed_backend local_rank rank lazy_mpu_init short_seq_prob adlr_autoresume adlr_autoresume_interval
deepscale deepscale_config deepspeed_mpi deepspeed_slurm user_script
world_size dpo_fp32 kto_fp32
use_shared_fs mmap_warmup s3_chunk_size config_files checkpoint_validation_with_forward_pass
deepspeed_activation_checkpointing contiguous_checkpointing synchronize_each_layer profile_backward
mup_init_scale mup_attn_temp mup_output_temp mup_embedding_mult mup_rp_embedding_mult mup_width_scale base_shapes_file
deepspeed prescale_gradients steps_per_print
dump_state flops_profiler autotuning tensorboard wandb csv_monitor
checkpoint data_types
hostfile include exclude num_nodes num_gpus master_port master_addr launcher force_multi autotuning_run
no_ssh_check comment account
moe_lbl_in_fp32
checkpoint_num_layers loss_scale hysteresis loss_scale_window min_scale
""".split())

# Keys whose non-default value is refused, with the feature it would select.
UNSUPPORTED = {
    "opt_pos_emb_offset": "OPT position-embedding offset",
    "sparsity_config": "sparse attention",
    "num_unique_layers": "parameter sharing across layers",
    "fp16_lm_cross_entropy": "fp16 cross entropy",
    "gpt_j_tied": "tied GPT-J residual layernorms",
    "soft_prompt_tuning": "soft prompt tuning",
    # te_mha, te_layernorm_mlp, te_columnparallel and te_rowparallel are used (lib/model/desc.c), and
    # the te_fp8_* recipe keys by precision fp8 (lib/train/fp8.c); FP8 attention is not built.
    "te_fp8_mha": "Transformer Engine's FP8 attention (precision fp8 runs the linear layers in FP8; attention stays bfloat16)",
    "use_bnb_optimizer": "bitsandbytes 8-bit optimizer",
    "scheduler": "DeepSpeed's LR scheduler, which replaces GPT-NeoX's (set lr_decay_style and warmup)",
    "s3_path": "checkpoint upload to S3",
    "train_epochs": "training by epochs (set train_iters)",
    "use_mup": "muP", "coord_check": "muP coordinate check", "save_base_shapes": "muP base shapes",
    "amp": "apex AMP", "curriculum_learning": "curriculum learning",
    "curriculum_seqlen": "curriculum learning", "sparse_attention": "sparse attention",
    "data_efficiency": "DeepSpeed data efficiency", "elasticity": "DeepSpeed elasticity",
    "compression_training": "DeepSpeed compression training",
}
# Post-training: SFT's label datasets (*_label_data_paths), DPO and its pairwise data, KTO and its
# reward datasets (*_reward_data_paths), reward models (train_impl rm, z_loss) are used; REINFORCE and
# the online data and weight servers are refused by name, every key.
POST_TRAINING = "post-training"
UNSUPPORTED["precompute_model_name"] = ("precomputed reference log-probabilities (neox.c keeps the reference "
                                        "model in memory and computes them; unset the key)")
for key in "kl_impl kl_div_beta reinforce_leave_one_out fp32_reinforce".split():
    UNSUPPORTED[key] = POST_TRAINING + " (REINFORCE)"
for key in "online_dataserver_ips online_dataserver_ports serve_model_weights weight_server_port".split():
    UNSUPPORTED[key] = POST_TRAINING + " (online data and weight servers)"

# CHOICE keys of which neox.c implements only some values: key -> (supported values, feature word).
SUPPORTED = {
    "pos_emb": ("learned|rotary|none|alibi", "position embedding"),
    "init_method": ("normal|scaled_normal|small_init|wang_init", "init method"),
    "output_layer_init_method": ("normal|scaled_normal|small_init|wang_init", "init method"),
    "data_impl": ("infer|mmap", "dataset format"),
    "dataset_impl": ("gpt2|pairwise", "dataset (online data is REINFORCE's)"),
    "train_impl": ("normal|dpo|kto|rm", "post-training method"),
}

# Numeric ranges (inclusive).
RANGES = {}
for k in ("num_layers hidden_size num_attention_heads num_kv_heads seq_length max_position_embeddings "
          "intermediate_size mlp_multiple_of make_vocab_size_divisible_by train_batch_size "
          "train_micro_batch_size_per_gpu gradient_accumulation_steps eval_interval log_interval "
          "checkpoint_factor rotary_emb_base num_samples maximum_tokens padded_vocab_size").split():
    RANGES[k] = (1, INT_MAX)
for k in ("pipe_parallel_size model_parallel_size train_iters lr_decay_iters eval_iters seed top_k "
          "keep_last_n_checkpoints exit_interval hysteresis moe_num_experts iteration global_num_gpus num_workers "
          "profile_step_start profile_step_stop").split():
    RANGES[k] = (0, INT_MAX)
for k in ("attention_dropout hidden_dropout warmup lr_decay_fraction rotary_pct top_p "
          "weighted_sampler_alpha").split():
    RANGES[k] = (0, 1)
# A learning rate above 10 diverges at once (docs/config.md); inf and NaN are refused with it.
for k in ("lr min_lr").split():
    RANGES[k] = (0, 10)
for k in ("weight_decay init_method_std gradient_clipping clip_grad temperature layernorm_epsilon "
          "rms_norm_epsilon scalenorm_epsilon expansion_factor loss_scale loss_scale_window min_scale peak_theoretical_tflops").split():
    RANGES[k] = (0, float("inf"))



# ---- sub-keys of the dicts GPT-NeoX passes to DeepSpeed ----------------------------------------------
# (path, type, default YAML text or None, use, feature of a refusal or None, choices/supported values,
# range). Names, types and defaults are DeepSpeed's (docs/config-json.md and its config classes:
# runtime/precision_config.py, runtime/zero/config.py, runtime/zero/offload_config.py,
# profiling/config.py, autotuning/config.py, monitor/config.py, comm/config.py,
# runtime/activation_checkpointing/config.py). A dict listed here has exactly these sub-keys: any other
# is an error with the closest one. Dicts not listed (comet_others, and the refused feature dicts) are
# not looked into.
def sub(path, ctype, default=None, use="USED", feature=None, choices=None, supported=None, lo=None, hi=None):
    return dict(path=path, type=ctype, default=default, use=use, feature=feature, choices=choices,
                supported=supported, lo=lo, hi=hi)


LOSS_SCALER = [  # DeepSpeed's dynamic loss scaler settings (fp16)
    ("loss_scale", "FLOAT", "0", 0, float("inf")), ("initial_scale_power", "INT", "16", 0, 120),
    ("loss_scale_window", "INT", "1000", 1, float("inf")), ("hysteresis", "INT", "2", 1, float("inf")),
    ("consecutive_hysteresis", "BOOL", "false", None, None), ("min_loss_scale", "FLOAT", "1", 0, float("inf")),
]

SUBKEYS = [sub("fp16.enabled", "BOOL", "false"),
           sub("fp16.type", "STR", None)]  # GPT-NeoX's old spelling of bf16: type: bfloat16
SUBKEYS += [sub("fp16." + n, t, d, lo=lo, hi=hi) for n, t, d, lo, hi in LOSS_SCALER]
SUBKEYS += [
    sub("fp16.auto_cast", "BOOL", "false", "IGNORED"),   # casts float inputs; a language model's are token ids
    sub("fp16.fp16", "BOOL", None, "IGNORED"),           # not a DeepSpeed key; GPT-NeoX's configs carry it
    sub("fp16.fp16_master_weights_and_grads", "BOOL", "false", "UNSUPPORTED", "fp16 master weights and gradients"),
    sub("bf16.enabled", "BOOL", "false"),
    sub("bf16.bf16", "BOOL", None, "IGNORED"),
    sub("bf16.immediate_grad_update", "BOOL", "false", "IGNORED"),
    sub("bf16.check_grad_overflow", "BOOL", "false", "UNSUPPORTED", "bf16 overflow checks (skipped steps)"),
]
# bf16 needs no loss scaling: GPT-NeoX's bf16 configs copy the fp16 scaler settings, which DeepSpeed ignores.
SUBKEYS += [sub("bf16." + n, t, d, "IGNORED") for n, t, d, lo, hi in LOSS_SCALER]

OFFLOAD_OPTIMIZER = "ZeRO optimizer-state offload"
OFFLOAD_PARAM = "ZeRO parameter offload"
SUBKEYS += [
    sub("zero_optimization.stage", "INT", "0", lo=0, hi=3),
    sub("zero_optimization.reduce_scatter", "BOOL", "true"),
    sub("zero_optimization.contiguous_gradients", "BOOL", "false", "IGNORED"),  # gradients are one flat buffer
    sub("zero_optimization.reduce_bucket_size", "INT", "500000000", lo=1, hi=float("inf")),
    sub("zero_optimization.allgather_bucket_size", "INT", "500000000", lo=1, hi=float("inf")),
    sub("zero_optimization.overlap_comm", "BOOL", "false"),
    sub("zero_optimization.allgather_partitions", "BOOL", "true", "IGNORED"),
    sub("zero_optimization.load_from_fp32_weights", "BOOL", "true", "IGNORED"),
    sub("zero_optimization.elastic_checkpoint", "BOOL", "false", "IGNORED"),
    sub("zero_optimization.round_robin_gradients", "BOOL", "false", "IGNORED"),
    sub("zero_optimization.ignore_unused_parameters", "BOOL", "true", "IGNORED"),
    sub("zero_optimization.legacy_stage1", "BOOL", "false", "IGNORED"),
    sub("zero_optimization.use_multi_rank_bucket_allreduce", "BOOL", "true", "IGNORED"),
    sub("zero_optimization.cpu_offload", "BOOL", "false"),  # DeepSpeed's older offload_optimizer.device: cpu
    sub("zero_optimization.cpu_offload_param", "BOOL", "false", "UNSUPPORTED", OFFLOAD_PARAM),
    sub("zero_optimization.cpu_offload_use_pin_memory", "BOOL", "false", "UNSUPPORTED", OFFLOAD_PARAM),
    sub("zero_optimization.offload_optimizer", "DICT", None),
    sub("zero_optimization.offload_param", "DICT", None, "UNSUPPORTED", OFFLOAD_PARAM),
    sub("zero_optimization.zero_hpz_partition_size", "INT", "1", "UNSUPPORTED", "ZeRO++ hierarchical partitioning"),
    sub("zero_optimization.zero_quantized_weights", "BOOL", "false", "UNSUPPORTED", "ZeRO++ quantized weights"),
    sub("zero_optimization.zero_quantized_nontrainable_weights", "BOOL", "false", "UNSUPPORTED", "ZeRO++ quantized weights"),
    sub("zero_optimization.zero_quantized_gradients", "BOOL", "false", "UNSUPPORTED", "ZeRO++ quantized gradients"),
    sub("zero_optimization.mics_shard_size", "INT", "-1", "UNSUPPORTED", "MiCS sharding"),
    sub("zero_optimization.mics_hierarchical_params_gather", "BOOL", "false", "UNSUPPORTED", "MiCS sharding"),
]
# Stage 3's own settings, read at stage 3 (lib/train/zero3.c), each also under DeepSpeed's older name
# without the prefix; at stages 0-2 a notice names them (lib/config/load.c).
for n, t, d in (("stage3_prefetch_bucket_size", "INT", "50000000"), ("prefetch_bucket_size", "INT", "50000000"),
                ("stage3_param_persistence_threshold", "INT", "100000"), ("param_persistence_threshold", "INT", "100000"),
                ("stage3_model_persistence_threshold", "INT", None), ("model_persistence_threshold", "INT", None),
                ("stage3_max_live_parameters", "INT", "1000000000"), ("max_live_parameters", "INT", "1000000000"),
                ("stage3_max_reuse_distance", "INT", "1000000000"), ("max_reuse_distance", "INT", "1000000000")):
    SUBKEYS.append(sub("zero_optimization." + n, t, d, lo=0, hi=float("inf")))
# The optimizer steps over the whole partition at once (sub_group_size splits DeepSpeed's step to
# bound its temporary buffers); checkpoints always hold whole fp32 tensors any layout reads (the
# 16-bit gather on save); the gathered unit is always a whole layer (module granularity).
for n, t, d in (("sub_group_size", "INT", "1000000000"),
                ("stage3_gather_16bit_weights_on_model_save", "BOOL", "false"),
                ("stage3_gather_fp16_weights_on_model_save", "BOOL", "false"),
                ("gather_16bit_weights_on_model_save", "BOOL", "false"),
                ("stage3_module_granularity_threshold", "INT", "0"), ("module_granularity_threshold", "INT", "0")):
    SUBKEYS.append(sub("zero_optimization." + n, t, d, "IGNORED"))
# Parameters are gathered with all-gathers only.
for n in ("stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"):
    SUBKEYS.append(sub("zero_optimization." + n, "BOOL", "false", "UNSUPPORTED", "ZeRO-3 parameter fetch by all-reduce"))
# Optimizer offload to the host (lib/train/offload.c): device cpu; NVMe and its settings are refused,
# and so is a partial offload (ratio); pin_memory page-locks the host copies (the backend's host_alloc).
OFFLOAD_NVME = "ZeRO optimizer-state offload to NVMe"
SUBKEYS.append(sub("zero_optimization.offload_optimizer.device", "CHOICE", "none", choices="none|cpu|nvme",
                   supported="none|cpu", feature=OFFLOAD_NVME))
for n, t, d in (("nvme_path", "STR", None), ("buffer_count", "INT", "4"), ("pipeline_read", "BOOL", "false"),
                ("pipeline_write", "BOOL", "false"), ("fast_init", "BOOL", "false")):
    SUBKEYS.append(sub("zero_optimization.offload_optimizer." + n, t, d, "UNSUPPORTED", OFFLOAD_NVME))
SUBKEYS.append(sub("zero_optimization.offload_optimizer.ratio", "FLOAT", "1.0", "UNSUPPORTED",
                   "partial ZeRO optimizer offload (ratio)"))
SUBKEYS.append(sub("zero_optimization.offload_optimizer.pin_memory", "BOOL", "false", "USED"))
SUBKEYS.append(sub("zero_optimization.offload_param.device", "CHOICE", "none", "UNSUPPORTED", OFFLOAD_PARAM,
                   choices="none|cpu|nvme"))
for n, t, d in (("nvme_path", "STR", None), ("buffer_count", "INT", "5"), ("pin_memory", "BOOL", "false"),
                ("buffer_size", "INT", "100000000"), ("max_in_cpu", "INT", "1000000000")):
    SUBKEYS.append(sub("zero_optimization.offload_param." + n, t, d, "UNSUPPORTED", OFFLOAD_PARAM))

SUBKEYS += [
    sub("optimizer.type", "CHOICE", "adam", choices="adam|onebitadam|cpu_adam|cpu_torch_adam|sm3|madgrad_wd|sgd|lion"),
    sub("optimizer.params", "DICT", None),
    sub("optimizer.params.lr", "FLOAT", None, lo=0, hi=10),  # as lr (RANGES)
    sub("optimizer.params.betas", "LIST", None),
    sub("optimizer.params.eps", "FLOAT", None, lo=0, hi=1),
    sub("optimizer.params.momentum", "FLOAT", None, lo=0, hi=1),
    sub("optimizer.params.beta", "FLOAT", None, lo=0, hi=1),  # sm3's
    sub("optimizer.params.weight_decay", "FLOAT", None, lo=0, hi=float("inf")),
    sub("optimizer.params.freeze_step", "INT", None, lo=0, hi=float("inf")),
    sub("optimizer.params.amsgrad", "BOOL", "false"),
]
# DeepSpeed's OnebitAdam stores these and its step does not use them; cuda_aware and comm_backend_name
# pick a transport (here always MPI).
SUBKEYS += [sub("optimizer.params." + n, t, None, "IGNORED")
            for n, t in (("cuda_aware", "BOOL"), ("comm_backend_name", "STR"), ("bias_correction", "BOOL"),
                         ("eps_inside_sqrt", "BOOL"), ("max_grad_norm", "FLOAT"))]
# Parameters of DeepSpeed's and GPT-NeoX's other optimizers (FusedAdam, SGD, SM3, MADGRAD, Lion).
SUBKEYS += [sub("optimizer.params." + n, "ANY", None, "UNSUPPORTED", "this optimizer parameter")
            for n in ("adam_w_mode", "torch_adam", "fused", "dampening", "nesterov", "set_grad_none")]

SCHEDULER = UNSUPPORTED["scheduler"]
SUBKEYS += [sub("scheduler.type", "CHOICE", None, "UNSUPPORTED", SCHEDULER,
                choices="LRRangeTest|OneCycle|WarmupLR|WarmupDecayLR|WarmupCosineLR"),
            sub("scheduler.params", "DICT", None, "UNSUPPORTED", SCHEDULER)]
SUBKEYS += [sub("scheduler.params." + n, "ANY", None, "UNSUPPORTED", SCHEDULER) for n in (
    "lr_range_test_min_lr lr_range_test_step_size lr_range_test_step_rate lr_range_test_staircase "
    "cycle_min_lr cycle_max_lr decay_lr_rate cycle_first_step_size cycle_second_step_size "
    "cycle_first_stair_count cycle_second_stair_count decay_step_size cycle_momentum cycle_min_mom "
    "cycle_max_mom decay_mom_rate warmup_min_lr warmup_max_lr warmup_num_steps warmup_type "
    "total_num_steps warmup_min_ratio cos_min_ratio last_batch_iteration").split()]

COMMS_LOGGER = [("enabled", "BOOL", "false"), ("verbose", "BOOL", "false"), ("prof_all", "BOOL", "true"),
                ("prof_ops", "LIST", None), ("debug", "BOOL", "false")]
SUBKEYS += [sub("comms_logger." + n, t, d) for n, t, d in COMMS_LOGGER]

# deepspeed_extra_args is merged into DeepSpeed's config over GPT-NeoX's: comms_logger is read from it;
# a key GPT-NeoX has its own argument for is refused (it would override that argument behind its back).
SUBKEYS.append(sub("deepspeed_extra_args.comms_logger", "DICT", None))
SUBKEYS += [sub("deepspeed_extra_args.comms_logger." + n, t, d) for n, t, d in COMMS_LOGGER]
SUBKEYS += [sub("deepspeed_extra_args." + n, "ANY", None, "IGNORED")
            for n in ("zero_force_ds_cpu_optimizer", "memory_breakdown",
                      "dump_state", "timers")]
# DeepSpeed's engine refuses an optimizer its ZeRO was not tested with unless this is set (lib/optim).
SUBKEYS.append(sub("deepspeed_extra_args.zero_allow_untested_optimizer", "BOOL", "false"))
# (the refusals of NeoXArgsDeepspeedConfig's keys inside deepspeed_extra_args: subkey_rows)

# DeepSpeed features with no meaning here, each with its documented sub-keys (all ignored).
IGNORED_DICTS = {
    "flops_profiler": "enabled recompute_fwd_factor profile_step module_depth top_modules detailed output_file",
    "autotuning": "enabled start_step end_step metric_path arg_mappings metric model_info results_dir exps_dir "
                  "overwrite fast start_profile_step end_profile_step tuner_type tuner_early_stopping tuner_num_trials "
                  "model_info_path mp_size max_train_batch_size min_train_batch_size max_train_micro_batch_size_per_gpu "
                  "min_train_micro_batch_size_per_gpu num_tuning_micro_batch_sizes",
    "csv_monitor": "enabled output_path job_name",
    "tensorboard": "enabled output_path job_name",
    "wandb": "enabled group team project",
    "checkpoint": "tag_validation load_universal use_node_local_storage parallel_write",
}
for dict_name, names in IGNORED_DICTS.items():
    SUBKEYS += [sub(f"{dict_name}.{n}", "ANY", None, "IGNORED") for n in names.split()]

# DeepSpeed's activation-checkpointing settings (GPT-NeoX also has top-level keys for them:
# partition_activations, checkpoint_in_cpu, contiguous_checkpointing, synchronize_each_layer,
# profile_backward). Partitioning and the host store are read (lib/train/recompute.c);
# the plan is one contiguous arena sized from the model (contiguous_memory_optimization,
# number_checkpoints), device ops run in order on one stream (synchronize_checkpoint_boundary), and
# the forward and backward timers already cover the recomputation (profile): docs/config.md.
SUBKEYS += [
    sub("activation_checkpointing.partition_activations", "BOOL", "false"),
    sub("activation_checkpointing.cpu_checkpointing", "BOOL", "false"),
    sub("activation_checkpointing.contiguous_memory_optimization", "BOOL", "false", "IGNORED"),
    sub("activation_checkpointing.number_checkpoints", "INT", None, "IGNORED", lo=1, hi=float("inf")),
    sub("activation_checkpointing.synchronize_checkpoint_boundary", "BOOL", "false", "IGNORED"),
    sub("activation_checkpointing.profile", "BOOL", "false", "IGNORED"),
]

# rope_scaling as transformers' config.json writes it (modeling_rope_utils); `type` is its older
# spelling of rope_type. The other scalings change attention too (yarn's and longrope's attention
# factor, dynamic's sequence-dependent base) and are refused.
ROPE_TYPES = "default|linear|llama3|dynamic|yarn|longrope"
SUBKEYS += [
    sub("rope_scaling.rope_type", "CHOICE", None, feature="rope scaling", choices=ROPE_TYPES,
        supported="default|linear|llama3"),
    sub("rope_scaling.type", "CHOICE", None, feature="rope scaling", choices=ROPE_TYPES,
        supported="default|linear|llama3"),
    sub("rope_scaling.factor", "FLOAT", None, lo=1, hi=float("inf")),
    sub("rope_scaling.low_freq_factor", "FLOAT", None, lo=0, hi=float("inf")),
    sub("rope_scaling.high_freq_factor", "FLOAT", None, lo=0, hi=float("inf")),
    sub("rope_scaling.original_max_position_embeddings", "INT", None, lo=1, hi=INT_MAX),
]

# Apex AMP (refused as a whole): amp.initialize's arguments.
SUBKEYS += [sub("amp." + n, "ANY", None, "UNSUPPORTED", "apex AMP") for n in (
    "enabled opt_level cast_model_type patch_torch_functions keep_batchnorm_fp32 master_weights loss_scale "
    "min_loss_scale max_loss_scale").split()]

# neox.c accumulates gradients in fp32, which is grad_accum_dtype's fp32; a 16-bit accumulator is refused.
SUBKEYS.append(sub("data_types.grad_accum_dtype", "CHOICE", None, "IGNORED", "gradient accumulation type",
                   choices="fp32|fp16|bf16", supported="fp32"))


def parse_dataclasses(directory):
    """(class, key, annotation text, default value) for every field of GPT-NeoX's argument dataclasses,
    in file order; a default that is not a literal (git_hash's subprocess call) reads as None."""
    keys = []
    for name in ARG_FILES:
        tree = ast.parse(open(os.path.join(directory, name)).read(), name)
        for cls in tree.body:
            if not isinstance(cls, ast.ClassDef):
                continue
            for field in cls.body:
                if not isinstance(field, ast.AnnAssign):
                    continue
                try:
                    default = ast.literal_eval(field.value) if field.value is not None else None
                except ValueError:
                    default = None
                keys.append((cls.name, field.target.id, ast.unparse(field.annotation), default))
    return keys


def schema_type(annotation):
    """The schema type and choices of a dataclass annotation."""
    if annotation.startswith("Literal["):
        return "CHOICE", "|".join(ast.literal_eval(annotation[len("Literal"):]))
    if annotation.startswith("Optional["):
        annotation = annotation[len("Optional["):-1]
    simple = {"bool": "BOOL", "int": "INT", "float": "FLOAT", "str": "STR", "list": "LIST", "dict": "DICT"}
    return simple.get(annotation, "ANY"), None  # Union[...] and Any: checked by the key's reader


def yaml_text(value):
    """The YAML text of a Python default (None for None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # YAML 1.1 reads a float only with a '.' and a signed exponent
        mantissa, _, exponent = repr(value).partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        return mantissa + ("e" + exponent if exponent else "")
    return json.dumps(value)  # a double-quoted YAML scalar


def c_str(s):
    if s is None:
        return "NULL"
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def c_num(x):
    if x == float("inf"):
        return "INFINITY"
    return repr(float(x)) if isinstance(x, float) else str(x)


def key_rows(directory):
    seen, rows = set(), []
    deepspeed_config_keys = []
    for group, name, annotation, default in parse_dataclasses(directory) + EXTRA_KEYS:
        if group == "NeoXArgsDeepspeedConfig":
            deepspeed_config_keys.append(name)
        if name in seen:  # a key declared twice (autotuning): the first declaration wins
            continue
        seen.add(name)
        ctype, choices = schema_type(annotation)
        ctype = TYPE_OVERRIDES.get(name, ctype)
        choices = CHOICES.get(name, choices)
        use = "UNSUPPORTED" if name in UNSUPPORTED else "IGNORED" if name in IGNORED else "USED"
        supported, feature = SUPPORTED.get(name, (None, UNSUPPORTED.get(name)))
        lo, hi = RANGES.get(name, (1, 0))
        rows.append(dict(name=name, type=ctype, default=yaml_text(default), choices=choices,
                         supported=supported, feature=feature, group=group, use=use, nullable=default is None,
                         min=lo, max=hi, derived=name in DERIVED))
    for group, name, ctype, default, choices, derived, lo, hi in OWN_KEYS:
        rows.append(dict(name=name, type=ctype, default=default, choices=choices, supported=None, feature=None,
                         group=group, use="USED", nullable=default is None, min=1 if lo is None else lo,
                         max=0 if hi is None else hi, derived=bool(derived)))
    return rows, deepspeed_config_keys


def subkey_rows(deepspeed_config_keys):
    subkeys = list(SUBKEYS)
    present = {s["path"] for s in subkeys}
    for name in deepspeed_config_keys:
        if "deepspeed_extra_args." + name not in present:
            present.add("deepspeed_extra_args." + name)
            subkeys.append(sub("deepspeed_extra_args." + name, "ANY", None, "UNSUPPORTED",
                               f"deepspeed_extra_args overriding GPT-NeoX's own key (set the top-level key '{name}')"))
    rows = []
    for s in subkeys:
        lo, hi = (1, 0) if s["lo"] is None else (s["lo"], s["hi"])
        choices = s["choices"] if s["type"] == "CHOICE" else None
        rows.append(dict(name=s["path"], type=s["type"], default=s["default"], choices=choices,
                         supported=s["supported"], feature=s["feature"], group=s["path"].split(".")[0],
                         use=s["use"], nullable=s["default"] is None, min=lo, max=hi, derived=False))
    return rows


def write_table(out, c_name, rows):
    out.write("const neox_key_spec %s[] = {\n" % c_name)
    for r in rows:
        out.write("    {.name = %s, .type = NEOX_TYPE_%s, .default_text = %s, .choices = %s, .supported = %s,\n"
                  "     .feature = %s, .group = %s, .use = NEOX_KEY_%s, .nullable = %d, .derived = %d,\n"
                  "     .min = %s, .max = %s},\n" % (
                      c_str(r["name"]), r["type"], c_str(r["default"]), c_str(r["choices"]),
                      c_str(r["supported"]), c_str(r["feature"]), c_str(r["group"]), r["use"],
                      int(r["nullable"]), int(r["derived"]), c_num(r["min"]), c_num(r["max"])))
    out.write("};\n\n")


def c_id(name):
    """The C identifier of a key or a dotted sub-key path: '.' becomes '__'."""
    ident = name.replace(".", "__")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
        sys.exit(f"gen_config_schema.py: key '{name}' is not a C identifier")
    return ident


def write_ids(out, c_type, prefix, rows):
    out.write("typedef enum %s {\n" % c_type)
    for i, r in enumerate(rows):
        out.write("    %s%s = %d,\n" % (prefix, c_id(r["name"]), i))
    out.write("    %sCOUNT = %d\n} %s;\n\n" % (prefix, len(rows), c_type))


# The first line of every generated file.
DO_NOT_EDIT = "// Generated by scripts/gen_config_schema.py; do not edit (edit the script and regenerate).\n"

HEADER_PATH = "lib/config_keys_gen.h"
SCHEMA_PATH = "lib/config/schema_gen.c"


def write_header(out, rows, subrows):
    out.write(DO_NOT_EDIT +
              "// config_keys_gen.h: one id per configuration key and per sub-key, in the order of the tables in\n"
              "// lib/config/schema_gen.c, so that config.h's accessors take a key by name and a misspelt key\n"
              "// fails to compile (neox_config_int(cfg, seq_length) reads NEOX_K_seq_length).\n"
              "#ifndef NEOX_CONFIG_KEYS_GEN_H\n#define NEOX_CONFIG_KEYS_GEN_H\n\n")
    write_ids(out, "neox_key_id", "NEOX_K_", rows)
    out.write("// Sub-keys: the dotted path with '.' as '__' (optimizer.params.lr is NEOX_SK_optimizer__params__lr).\n")
    write_ids(out, "neox_subkey_id", "NEOX_SK_", subrows)
    out.write("#endif\n")


def write_schema(out, rows, subrows):
    out.write(DO_NOT_EDIT +
              "// schema_gen.c: the typed table of every GPT-NeoX configuration key (type, default, choices,\n"
              "// range, argument group) and of every sub-key of the dicts it hands to DeepSpeed, and what neox.c\n"
              "// does with each (used, ignored, or refused when set), from GPT-NeoX's neox_args.py and\n"
              "// deepspeed_args.py and the decisions listed in the script.\n"
              "#include <math.h>\n#include <string.h>\n\n#include \"config.h\"\n\n")
    write_table(out, "neox_key_specs", rows)
    out.write("const int neox_key_count = (int)(sizeof neox_key_specs / sizeof neox_key_specs[0]);\n\n")
    write_table(out, "neox_subkey_specs", subrows)
    out.write("const int neox_subkey_count = (int)(sizeof neox_subkey_specs / sizeof neox_subkey_specs[0]);\n")


def write_file(root, path, writer, rows, subrows):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", newline="\n") as out:
        writer(out, rows, subrows)


def main():
    """gen_config_schema.py [--out ROOT | --header] [REFERENCE_DIR]: lib/config/schema_gen.c and
    lib/config_keys_gen.h under ROOT; without --out the schema (with --header the key ids) to stdout."""
    args = sys.argv[1:]
    header = "--header" in args
    args = [a for a in args if a != "--header"]
    root = None
    if "--out" in args:
        i = args.index("--out")
        if i + 1 >= len(args):
            sys.exit("gen_config_schema.py: --out needs a folder")
        root = args[i + 1]
        del args[i:i + 2]
    directory = args[0] if args else "../shared/reference/gpt-neox-args"
    rows, deepspeed_config_keys = key_rows(directory)
    subrows = subkey_rows(deepspeed_config_keys)
    if root is None:
        (write_header if header else write_schema)(sys.stdout, rows, subrows)
        return
    write_file(root, SCHEMA_PATH, write_schema, rows, subrows)
    write_file(root, HEADER_PATH, write_header, rows, subrows)


if __name__ == "__main__":
    main()
