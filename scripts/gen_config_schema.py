#!/usr/bin/env python3
"""Generates lib/config/schema.c, the typed table of every GPT-NeoX configuration key, from GPT-NeoX's
key reference (neox_arguments.md) plus neox.c's decisions about each key (the tables below).

    scripts/gen_config_schema.py [../shared/reference/gpt-neox-configs/neox_arguments.md] > lib/config/schema.c

The generated C file is project source (committed); rerun this script when the reference or a decision
changes. Decisions: USED keys are read by neox.c; IGNORED keys (DeepSpeed, launcher, logging-service and
kernel-fusion knobs with no meaning here) are accepted and listed once in a notice; UNSUPPORTED keys are
refused when set to anything but their default. CHOICE keys may also refuse single values (SUPPORTED).
docs/config.md explains each decision."""
import re
import sys

INT_MAX = 1 << 53

# Keys newer than the reference's neox_arguments.md that GPT-NeoX configs use (transformer engine, and
# neox_args.py's peak_theoretical_tflops and z_loss).
EXTRA_KEYS = [
    ("NeoXArgsModel", "te_columnparallel", "bool", "False"),
    ("NeoXArgsModel", "te_rowparallel", "bool", "False"),
    ("NeoXArgsModel", "te_layernorm_mlp", "bool", "False"),
    ("NeoXArgsModel", "te_mha", "bool", "False"),
    ("NeoXArgsModel", "te_fp8_format", "typing.Literal['e4m3', 'hybrid']", "hybrid"),
    ("NeoXArgsModel", "te_fp8_wgrad", "bool", "True"),
    ("NeoXArgsModel", "te_fp8_amax_history_len", "int", "1"),
    ("NeoXArgsModel", "te_fp8_amax_compute_algo", "str", "most_recent"),
    ("NeoXArgsModel", "te_fp8_margin", "int", "0"),
    ("NeoXArgsModel", "te_fp8_mha", "bool", "False"),
    ("NeoXArgsLogging", "peak_theoretical_tflops", "float", "None"),
    ("NeoXArgsTraining", "z_loss", "float", "0.0"),
]

# neox.c's own keys: (group, name, type, default, choices, derived, min, max, description).
OWN_KEYS = [
    ("neox.c", "compute_backend", "CHOICE", "auto", "auto|cpu|cuda|emulated", 0, None, None),
    ("neox.c", "gradient_compression", "CHOICE", "none", "none|onebit|powersgd", 0, None, None),
    ("neox.c", "gradient_compression_rank", "INT", "4", None, 0, 1, 1024),
    ("neox.c", "gradient_compression_start", "INT", "0", None, 0, 0, float("inf")),
    ("neox.c", "comm_timeout_seconds", "FLOAT", "0", None, 0, 0, float("inf")),
    ("neox.c", "data_parallel_size", "INT", None, None, 1, None, None),
    ("neox.c", "warmup_iters", "FLOAT", None, None, 1, None, None),
    ("neox.c", "adam_beta1", "FLOAT", None, None, 1, None, None),
    ("neox.c", "adam_beta2", "FLOAT", None, None, 1, None, None),
    ("neox.c", "adam_eps", "FLOAT", None, None, 1, None, None),
    ("neox.c", "onebitadam_freeze_step", "INT", None, None, 1, None, None),
    ("neox.c", "onebitadam_weight_decay", "FLOAT", None, None, 1, None, None),
    ("neox.c", "sgd_momentum", "FLOAT", None, None, 1, None, None),
    ("neox.c", "data_cache_dir", "STR", None, None, 0, None, None),
    ("neox.c", "eval_data_dir", "STR", "data/eval", None, 0, None, None),
    ("neox.c", "eval_task_limit", "INT", "0", None, 0, 0, float("inf")),
]

# Values GPT-NeoX computes itself; a file may not set them (derive.c computes them).
DERIVED = {"is_pipe_parallel", "batch_size", "dynamic_loss_scale", "save_iters",
           "zero_stage", "zero_reduce_scatter", "zero_contiguous_gradients", "zero_reduce_bucket_size",
           "zero_allgather_bucket_size", "config_files"}
# global_num_gpus stays settable: GPT-NeoX takes it as the GPU count; here it must match the world size.

IGNORED = set("""
use_wandb wandb_group wandb_team wandb_project wandb_host wandb_init_all_ranks git_hash use_comet comet_workspace
comet_project comet_experiment_name comet_tags comet_others log_grad_pct_zeros log_optimizer_states
log_gradient_noise_scale gradient_noise_scale_n_batches gradient_noise_scale_cpu_offload memory_profiling
memory_profiling_path profile profile_step_start profile_step_stop
scalenorm_epsilon rpe_num_buckets rpe_max_distance param_sharing_style layernorm_fusion rmsnorm_fusion
use_flashattn_swiglu scaled_upper_triang_masked_softmax_fusion scaled_masked_softmax_fusion bias_dropout_fusion
rope_fusion fused_kernels_build_path apply_query_key_layer_scaling use_cpu_initialization attention_softmax_in_fp32
rotary_save_freqs_buffer gmlp_attn_dim mamba_selective_scan_fusion mamba_causal_conv_fusion mamba_inner_func_fusion
mamba_selective_fp32_params mamba_use_bias_in_conv mamba_use_bias_in_linears dim_att head_size ffn_dim
te_fp8_format te_fp8_wgrad te_fp8_amax_history_len te_fp8_amax_compute_algo te_fp8_margin
distributed_backend local_rank rank lazy_mpu_init short_seq_prob adlr_autoresume adlr_autoresume_interval
onnx_safe deepscale deepscale_config deepspeed_mpi deepspeed_slurm user_script
world_size precompute_model_name
dpo_fp32 dpo_reference_free dpo_beta kto_fp32 kto_desirable_weight kto_undesirable_weight kto_beta
z_loss use_shared_fs mmap_warmup s3_chunk_size config_files checkpoint_validation_with_forward_pass num_workers
deepspeed_activation_checkpointing contiguous_checkpointing
checkpoint_in_cpu synchronize_each_layer profile_backward partition_activations
mup_init_scale mup_attn_temp mup_output_temp mup_embedding_mult mup_rp_embedding_mult mup_width_scale base_shapes_file
deepspeed scheduler prescale_gradients steps_per_print
dump_state flops_profiler autotuning activation_checkpointing tensorboard wandb csv_monitor
checkpoint data_types
hostfile include exclude num_nodes num_gpus master_port master_addr launcher force_multi autotuning_run
no_ssh_check comment account
""".split())

# Keys whose non-default value is refused, with the feature it would select.
UNSUPPORTED = {
    "moe_num_experts": "Mixture of Experts",
    "moe_expert_interval": "Mixture of Experts", "moe_top_k": "Mixture of Experts",
    "moe_router_type": "Mixture of Experts", "moe_lbl_in_fp32": "Mixture of Experts",
    "moe_jitter_eps": "Mixture of Experts",
    "sliding_window_width": "sliding-window attention",
    "use_qk_layernorm": "query/key layernorm",
    "opt_pos_emb_offset": "OPT position-embedding offset",
    "sparsity_config": "sparse attention",
    "num_unique_layers": "parameter sharing across layers",
    "fp16_lm_cross_entropy": "fp16 cross entropy",
    "gpt_j_tied": "tied GPT-J residual layernorms",
    "soft_prompt_tuning": "soft prompt tuning",
    "te_columnparallel": "Transformer Engine", "te_rowparallel": "Transformer Engine",
    "te_layernorm_mlp": "Transformer Engine", "te_mha": "Transformer Engine", "te_fp8_mha": "Transformer Engine",
    "use_bnb_optimizer": "bitsandbytes 8-bit optimizer",
    "train_label_data_paths": "label-masked training data", "test_label_data_paths": "label-masked training data",
    "valid_label_data_paths": "label-masked training data",
    "train_reward_data_paths": "reward-model training", "test_reward_data_paths": "reward-model training",
    "valid_reward_data_paths": "reward-model training",
    "s3_path": "checkpoint upload to S3",
    "train_epochs": "training by epochs (set train_iters)",
    "use_mup": "muP", "coord_check": "muP coordinate check", "save_base_shapes": "muP base shapes",
    "amp": "apex AMP", "curriculum_learning": "curriculum learning",
    "curriculum_seqlen": "curriculum learning", "sparse_attention": "sparse attention",
    "data_efficiency": "DeepSpeed data efficiency", "elasticity": "DeepSpeed elasticity",
    "compression_training": "DeepSpeed compression training",
}
for side in ("pos", "neg"):
    for split in ("train", "valid", "test"):
        UNSUPPORTED[f"{side}_{split}_data_paths"] = "pairwise (preference) training data"
        UNSUPPORTED[f"{side}_{split}_label_data_paths"] = "pairwise (preference) training data"

# CHOICE keys of which neox.c implements only some values: key -> (supported values, feature word).
SUPPORTED = {
    "norm": ("layernorm|rmsnorm", "normalization"),
    "pos_emb": ("learned|rotary|none", "position embedding"),
    "activation": ("gelu|swiglu", "activation"),
    "init_method": ("normal|scaled_normal|small_init|wang_init", "init method"),
    "output_layer_init_method": ("normal|scaled_normal|small_init|wang_init", "init method"),
    "optimizer_type": ("adam|onebitadam|sgd", "optimizer"),
    "tokenizer_type": ("GPT2BPETokenizer|HFTokenizer|HFGPT2Tokenizer|SPMTokenizer|CharLevelTokenizer|TiktokenTokenizer", "tokenizer"),
    "data_impl": ("infer|mmap", "dataset format"),
    "pack_impl": ("packed", "sample packing"),
    "dataset_impl": ("gpt2", "dataset"),
    "train_impl": ("normal", "training method"),
}

# Numeric ranges (inclusive).
RANGES = {}
for k in ("num_layers hidden_size num_attention_heads num_kv_heads seq_length max_position_embeddings "
          "intermediate_size mlp_multiple_of make_vocab_size_divisible_by train_batch_size "
          "train_micro_batch_size_per_gpu gradient_accumulation_steps eval_interval log_interval "
          "checkpoint_factor rotary_emb_base num_samples maximum_tokens padded_vocab_size").split():
    RANGES[k] = (1, INT_MAX)
for k in ("pipe_parallel_size model_parallel_size train_iters lr_decay_iters eval_iters seed top_k "
          "keep_last_n_checkpoints exit_interval hysteresis moe_num_experts iteration global_num_gpus").split():
    RANGES[k] = (0, INT_MAX)
for k in ("attention_dropout hidden_dropout warmup lr_decay_fraction rotary_pct top_p "
          "weighted_sampler_alpha").split():
    RANGES[k] = (0, 1)
# A learning rate above 10 diverges at once (docs/config.md); inf and NaN are refused with it.
for k in ("lr min_lr").split():
    RANGES[k] = (0, 10)
for k in ("weight_decay init_method_std gradient_clipping clip_grad temperature layernorm_epsilon "
          "rms_norm_epsilon expansion_factor loss_scale loss_scale_window min_scale peak_theoretical_tflops").split():
    RANGES[k] = (0, float("inf"))


def parse_reference(path):
    keys, group, lines = [], None, open(path).read().split("\n")
    for i, line in enumerate(lines):
        if line.startswith("## "):
            group = line[3:].strip()
        m = re.match(r"^- \*\*(\w+)\*\*: (.*)$", line)
        if not m:
            continue
        default = None
        for follow in lines[i + 1:]:
            if follow.startswith("- **") or follow.startswith("## "):
                break
            d = re.match(r"^\s+Default = (.*)$", follow)
            if d:
                default = d.group(1)
                break
        keys.append((group, m.group(1), m.group(2), default))
    return keys


def c_str(s):
    if s is None:
        return "NULL"
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def c_num(x):
    if x == float("inf"):
        return "INFINITY"
    return repr(float(x)) if isinstance(x, float) else str(x)


def yaml_default(pytype, default):
    """The YAML text of a default as neox_arguments.md prints it (Python repr-ish)."""
    if default is None or default == "None":
        return None
    if pytype == "bool":
        return {"True": "true", "False": "false"}[default]
    if pytype == "float":  # YAML 1.1 reads a float only with a '.' and a signed exponent
        mantissa, _, exponent = repr(float(default)).partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        return mantissa + ("e" + exponent if exponent else "")
    if pytype == "int":
        return default
    if pytype == "str" and default == "":
        return "''"
    if pytype.startswith("typing.Union"):
        return default
    return "'" + default.replace("'", "''") + "'"


def main():
    ref = sys.argv[1] if len(sys.argv) > 1 else "../shared/reference/gpt-neox-configs/neox_arguments.md"
    seen, rows = set(), []
    for group, name, pytype, default in parse_reference(ref) + EXTRA_KEYS:
        if name in seen:  # a key listed twice in the reference: the first entry wins
            continue
        seen.add(name)
        nullable = default in (None, "None")
        choices = None
        if pytype.startswith("typing.Literal"):
            ctype, choices = "CHOICE", "|".join(re.findall(r"'([^']*)'", pytype))
        elif pytype.startswith("typing.Union") or pytype == "Optional":
            ctype = "ANY"
        elif pytype == "typing.Optional[str]":
            ctype = "STR"
        else:
            ctype = {"bool": "BOOL", "int": "INT", "float": "FLOAT", "str": "STR", "list": "LIST",
                     "dict": "DICT"}[pytype]
        if name == "communication_data_type":  # the reference says bool; DeepSpeed takes a dtype name
            ctype = "ANY"
        use = "UNSUPPORTED" if name in UNSUPPORTED else "IGNORED" if name in IGNORED else "USED"
        supported, feature = SUPPORTED.get(name, (None, UNSUPPORTED.get(name)))
        lo, hi = RANGES.get(name, (1, 0))
        rows.append(dict(name=name, type=ctype, default=yaml_default(pytype, default), choices=choices,
                         supported=supported, feature=feature, group=group, use=use, nullable=nullable,
                         min=lo, max=hi, derived=name in DERIVED))
    for group, name, ctype, default, choices, derived, lo, hi in OWN_KEYS:
        rows.append(dict(name=name, type=ctype, default=default, choices=choices, supported=None, feature=None,
                         group=group, use="USED", nullable=default is None, min=1 if lo is None else lo,
                         max=0 if hi is None else hi, derived=bool(derived)))

    out = sys.stdout
    out.write("// schema.c: the typed table of every GPT-NeoX configuration key (type, default, choices, range,\n"
              "// argument group) and what neox.c does with it (used, ignored, or refused when set).\n"
              "// GENERATED by scripts/gen_config_schema.py from GPT-NeoX's neox_arguments.md and the decisions\n"
              "// listed in that script; edit the script and regenerate rather than editing this file.\n"
              "#include <math.h>\n#include <string.h>\n\n#include \"config.h\"\n\n"
              "const neox_key_spec neox_key_specs[] = {\n")
    for r in rows:
        out.write("    {.name = %s, .type = NEOX_TYPE_%s, .default_text = %s, .choices = %s, .supported = %s,\n"
                  "     .feature = %s, .group = %s, .use = NEOX_KEY_%s, .nullable = %d, .derived = %d,\n"
                  "     .min = %s, .max = %s},\n" % (
                      c_str(r["name"]), r["type"], c_str(r["default"]), c_str(r["choices"]),
                      c_str(r["supported"]), c_str(r["feature"]), c_str(r["group"]), r["use"],
                      int(r["nullable"]), int(r["derived"]), c_num(r["min"]), c_num(r["max"])))
    out.write("};\n\nconst int neox_key_count = (int)(sizeof neox_key_specs / sizeof neox_key_specs[0]);\n")


if __name__ == "__main__":
    main()
