// setup.c: builds a trainer from a loaded config — tokenizer (for the vocabulary and the EOD id),
// model (created, activations planned), optimizer settings and state, datasets and batch
// iterators, metrics, the gradient exchange (grad_exchange.c) with this rank's partition and the
// checkpoint schedule, with the registered parts (parts.c) set up at their stages — then loads the
// checkpoint `load` names, or initialises the weights from the seed when there is none, and starts the parts.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "internal.h"

static int check_layout(const neox_trainer *t, neox_error *err) {
    if (!neox_config_has(t->cfg, train_iters))
        return neox_fail(err, NEOX_EXIT_USAGE, "train_iters: not set (neox-train trains for a number of iterations)");
    return 0;
}

static double number_or(const neox_value *v, double fallback) {
    if (v && v->kind == NEOX_VALUE_INT) return (double)v->integer;
    if (v && v->kind == NEOX_VALUE_FLOAT) return v->number;
    return fallback;
}

// precision: GPT-NeoX's key, or derived from its fp16/bf16 dicts (the loss scaler is a part,
// loss_scaler.c).
static int setup_precision(neox_trainer *t, neox_error *err) {
    const char *name = neox_config_str(t->cfg, precision);
    if (neox_precision_parse(name ? name : "fp32", &t->precision) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "precision: '%s' is not fp32, bfloat16, fp16 or fp8", name);
    return 0;
}

// compute_backend: cpu, cuda, auto or emulated; on a GPU, one rank per device (local rank modulo the
// device count) and NCCL communicators for the device buffers; on the emulated device, its twin's.
static int setup_backend(neox_trainer *t, neox_error *err) {
    // cudnn_attention: on a CUDA device, false keeps bf16 attention on the own kernels (the route's
    // rule, kernels/attention_route.c); the CPU backends have no cuDNN to choose.
    int cudnn_attention = neox_config_bool(t->cfg, cudnn_attention);
    t->be = neox_backend_for_rank(neox_config_str(t->cfg, compute_backend), t->grid, err);
    if (!t->be) return -1;
    // wall_clock_breakdown: every op through the per-op profile (reported in loop.c).
    if (neox_config_bool(t->cfg, wall_clock_breakdown)) t->be = neox_profile_install(t->be, 0);
    if (!t->be->on_device) return 0;
    // The emulated device's collectives: its twin of NCCL over MPI (lib/parallel/emulated_comm.c).
    if (!strcmp(t->be->name, "emulated")) return neox_grid_enable_emulated(t->grid, err);
    neox_attention_allow_cudnn(cudnn_attention);
    return neox_grid_enable_device(t->grid, err);
}

// Every rank must train the same configuration: the CRC-32 of the effective config (as JSON)
// is compared over all ranks at start-up.
static int check_same_config(const neox_trainer *t, neox_error *err) {
    if (t->grid->world_size <= 1) return 0;
    char *text = NULL;
    size_t size = 0;
    FILE *mem = open_memstream(&text, &size);
    neox_config_print_as(t->cfg, "json", mem);
    fclose(mem);
    int64_t crc[2] = {(int64_t)crc32(0L, (const Bytef *)text, (uInt)size), 0};
    free(text);
    crc[1] = -crc[0];
    neox_allreduce_max(&t->grid->world, crc, 2, NEOX_I64);  // max and -min
    if (crc[0] != -crc[1])
        return neox_fail(err, NEOX_EXIT_USAGE, "the ranks loaded different configurations (check that every rank reads "
                         "the same files and environment)");
    return 0;
}

// n zeroed floats of the backend's memory.
static float *zeroed(const neox_trainer *t, size_t n) {
    float *p = t->be->alloc(n * sizeof(float));
    t->be->memset_zero(p, n * sizeof(float));
    return p;
}

// GPT-NeoX pads the vocabulary to a multiple of make_vocab_size_divisible_by x model_parallel_size, so
// a tensor-parallel run may train more rows than one rank, and follow another trajectory: say so.
static void notice_vocab_padding(const neox_trainer *t, int vocab) {
    const neox_config *cfg = t->cfg;
    int64_t mp = neox_config_int(cfg, model_parallel_size);
    int64_t one = neox_padded_vocab_size(neox_tokenizer_vocab_size(t->tokenizer),
                                         neox_config_int(cfg, make_vocab_size_divisible_by), 1);
    if (!t->rank0 || t->opts.quiet || neox_config_has(cfg, pinned_padded_vocab_size) || vocab == one) return;
    int64_t pin = (one + mp - 1) / mp * mp;  // the smallest size this layout and one rank can share
    neox_notice("model_parallel_size %lld pads the vocabulary to %d rows where model_parallel_size 1 pads it to %lld "
                "(a multiple of make_vocab_size_divisible_by x model_parallel_size, as GPT-NeoX pads): this run's "
                "trajectory differs from one rank's; set pinned_padded_vocab_size (e.g. %lld) in every run to train "
                "the same rows under each model_parallel_size dividing it", (long long)mp, vocab, (long long)one,
                (long long)pin);
}

static int setup_model(neox_trainer *t, neox_error *err) {
    const neox_config *cfg = t->cfg;
    neox_tokenizer_options to = {neox_config_str(cfg, tokenizer_type), neox_config_str(cfg, vocab_file),
                                 neox_config_str(cfg, merge_file)};
    t->tokenizer = neox_tokenizer_load(&to, err);
    if (!t->tokenizer) return neox_fail_context(err, "tokenizer_type %s", to.type ? to.type : "None");
    t->eod_id = neox_tokenizer_eod_id(t->tokenizer);
    neox_model_desc desc;
    if (neox_model_desc_from_config(&desc, cfg, neox_tokenizer_vocab_size(t->tokenizer), err) != 0) return -1;
    // The padded vocabulary is part of the model: a checkpoint written under another tensor-parallel
    // size (which pads differently) keeps its own, which a pinned size must then be.
    int configured_vocab = desc.vocab_size;
    if (t->load_dir && neox_checkpoint_padded_vocab(t->load_dir, &desc.vocab_size, err) != 0) return -1;
    if (neox_config_has(cfg, pinned_padded_vocab_size) && desc.vocab_size != configured_vocab)
        return neox_fail(err, NEOX_EXIT_USAGE, "key 'pinned_padded_vocab_size': %d does not match the %d vocabulary rows "
                         "of the checkpoint in %s", configured_vocab, desc.vocab_size, t->load_dir);
    if (desc.vocab_size == configured_vocab) notice_vocab_padding(t, desc.vocab_size);
    neox_grid *g = t->grid;
    desc.tp_size = g->model_size, desc.tp_rank = g->model_rank;
    desc.pp_size = g->pipe_size, desc.pp_rank = g->pipe_rank;
    neox_train_setup_recompute(t, &desc);
    if (neox_train_setup_sequence_parallel(t, &desc, err) != 0) return -1;
    if (neox_train_setup_expert_parallel(t, &desc, err) != 0) return -1;
    if (neox_train_setup_context_parallel(t, &desc, err) != 0) return -1;
    int *bounds = neox_calloc((size_t)g->pipe_size + 1, sizeof *bounds);
    int rc = neox_model_pipe_partition(&desc, g->pipe_size, neox_config_str(cfg, pipe_partition_method), bounds, err);
    desc.layer_begin = bounds[g->pipe_rank], desc.layer_end = bounds[g->pipe_rank + 1];
    free(bounds);
    if (rc != 0) return -1;
    t->model = neox_model_create_on(&desc, t->be, err);
    if (!t->model) return -1;
    neox_model_set_precision(t->model, t->precision);
    neox_model_set_head_rows(t->model, NEOX_MODEL_HEAD_AUTO);  // training needs the loss, not the logits
    t->model->tp = g->model_size > 1 ? &g->model : NULL;
    t->model->ep = t->ep_size > 1 ? &g->expert : NULL;
    t->model->cp = g->cp_size > 1 ? &g->context : NULL;
    // 1F1B keeps up to (stages after this one + 1) micro-batches between forward and backward.
    int inflight = g->pipe_size - g->pipe_rank;
    int slots = inflight < t->grad_accum ? inflight : t->grad_accum;
    if (g->pipe_rank > 0) t->pipe_grad_send = zeroed(t, neox_model_stream_floats(&desc, t->rows, t->seq_length));
    return neox_model_plan_slots(t->model, t->rows, t->seq_length, slots, err);
}

// ZeRO-2 and 3 on the host: the buckets are at most reduce_bucket_size elements and their pages are
// given back as they land, so the embeddings are used in pieces of about a bucket each (the output
// layer's gradient made piece by piece, ZeRO-3 gathering them by pieces) and no rank holds one whole;
// under ZeRO-3 a piece is also at most what its live bound allows (zero3.c).
static void use_head_pieces(neox_trainer *t) {
    int64_t bucket = neox_config_int_or(t->cfg, zero_reduce_bucket_size, 500000000);
    if (t->be->on_device || bucket <= 0) return;
    int64_t limit = t->zero_stage == 3 ? (int64_t)neox_train_zero3_piece_limit(t) : bucket;
    int64_t rows = (limit < bucket ? limit : bucket) / t->model->desc.hidden_size;
    t->model->head_grad_rows = rows < 1 ? 1 : rows > INT32_MAX ? INT32_MAX : (int)rows;
    neox_train_install_grad_hook(t);  // (the model reports the pieces to it)
}

// Data-parallel reduction (the gradient exchange, made before): this rank's partition of the flat
// buffers, backward's hook (ZeRO-3 is a part: set up after this).
static void setup_partitions(neox_trainer *t) {
    const neox_model *m = t->model;
    neox_grid *g = t->grid;
    neox_grad_exchange_partition(t->exchange, g->data_rank, &t->part_begin, &t->part_end);
    if (t->ep_size > 1)  // the partition of the whole buffer over the ranks holding the same experts
        neox_train_partition(t, neox_train_state_group(t)->rank, &t->part_begin, &t->part_end);
    // ZeRO-2 on the host: the flat buffer only maps the buckets in flight, starting from none.
    if (neox_grad_exchange_partition_grads(t->exchange) && !t->be->on_device)
        t->be->release(m->grad_buf, m->num_floats * sizeof(float));
    if (neox_grad_exchange_wants_ready(t->exchange)) neox_train_install_grad_hook(t);
}

// The parts set up at NEOX_PART_AFTER_PARTITION (ZeRO-3, the optimizer offload) come between the
// partition and the optimizer.
static int setup_optimizer(neox_trainer *t, neox_error *err) {
    size_t n = t->model->num_floats;
    t->part_begin = 0, t->part_end = n;
    if (t->grid->data_size > 1) t->zero_stage = (int)neox_config_int_or(t->cfg, zero_stage, 0);
    // (Before the exchange: its plan counts the output layer's gradient made in pieces.)
    if (t->grid->data_size > 1 && t->zero_stage >= 2) use_head_pieces(t);
    if (neox_train_setup_exchange(t, err) != 0) return -1;
    if (t->grid->data_size > 1) {
        setup_partitions(t);
    } else if (neox_config_int_or(t->cfg, zero_stage, 0) > 0 && t->rank0 && !t->opts.quiet) {
        neox_notice("zero_optimization.stage %lld: nothing to partition at data-parallel size 1",
                    (long long)neox_config_int_or(t->cfg, zero_stage, 0));
    }
    t->state_begin = t->zero_stage > 0 ? t->part_begin : 0;
    t->state_end = t->zero_stage > 0 ? t->part_end : n;
    if (neox_train_parts_setup(t, NEOX_PART_AFTER_PARTITION, err) != 0) return -1;
    t->optimizer = neox_optimizer_make(&t->optim, neox_train_optimizer_backend(t), t->state_end - t->state_begin);
    neox_train_step_scalars_setup(t);
    // The device step: one rank (no host all-reduce of the norm), AdamW, SGD or Lion (whose kernels take the
    // guard and read the step scalars), the optimizer on the device (not offloaded).
    neox_grid *g = t->grid;
    neox_optimizer_kind kind = t->optim.kind;
    int guarded = kind == NEOX_OPTIMIZER_ADAM || kind == NEOX_OPTIMIZER_SGD || kind == NEOX_OPTIMIZER_LION;
    if (t->be->on_device && !neox_train_offloaded(t) && guarded && g->data_size * g->model_size * g->pipe_size == 1)
        t->step_sumsq = t->be->alloc(sizeof(double));
    // 1-bit Adam averages its momentum with the exchange's compressor (NULL at data-parallel size 1).
    t->optimizer->momentum_allreduce = neox_grad_exchange_momentum_compressor(t->exchange);
    if (neox_train_setup_accumulators(t, err) != 0) return -1;
    if (t->rank0 && !t->opts.quiet) neox_optimizer_warn(t->cfg, &t->optim);
    return 0;
}

// The fused loss (lib/model.h, neox_model_set_fused_head) on the last stage, unless a part's loss
// replaces the model's (DPO's and KTO's token weights come after the forward, the reward model's
// values need no vocabulary) or the output layer is used in pieces: known only once the parts and the
// partition are set up, so the activations are planned again with the fused loss's smaller chunks.
static int setup_fused_head(neox_trainer *t, neox_error *err) {
    neox_model *m = t->model;
    // Not under a dynamic fp16 loss scale: the fused loss applies the scale in forward, and on a
    // device the late read settles the previous step's scale only after the step's first forward
    // (lib/train/step.c), so the stream never drains; a scale kept on the device would lift this.
    if (t->grid->pipe_rank != t->grid->pipe_size - 1 || neox_train_parts_replace_loss(t) || m->desc.value_head ||
        neox_model_head_piece_rows(m) || t->scaler.window > 0)
        return 0;
    neox_model_set_fused_head(m, 1);
    return neox_model_plan_slots(m, m->B, m->cp_T, m->nslots, err);  // (the whole sequence)
}

// The initial weights, when no checkpoint supplies them (neox_train_load decides): under ZeRO-3 only
// the partition's, so that no rank holds the whole model at start-up either. The values depend only
// on the seed and each element's position (counter-based streams), so skipping them when a
// checkpoint is loaded moves no other random stream.
void neox_train_init_weights(neox_trainer *t) {
    if (t->param_partition) neox_train_zero3_init_partition(t);
    else neox_model_init(t->model, t->state.seed);
}

static int setup_data(neox_trainer *t, neox_error *err) {
    if (neox_data_settings_from_config(t->cfg, &t->data_settings, err) != 0) return -1;
    t->data_settings.train_batch_size = t->train_batch_size;
    t->data_settings.train_iters = t->train_iters;
    if (neox_build_datasets(&t->data_settings, t->datasets, err) != 0) return -1;
    for (int i = 0; i < 3; i++)
        if (t->datasets[i]) t->datasets[i]->vocab_size = t->model->desc.vocab_size;
    if (!t->datasets[0]) return neox_fail(err, NEOX_EXIT_USAGE, "data_path: the training split has no samples");
    int eod_mask = neox_config_bool(t->cfg, eod_mask_loss);
    int dp = neox_grid_sample_ways(t->grid), rank = neox_grid_sample_rank(t->grid);  // (a context group reads alike)
    neox_batch_iterator_init(&t->train_it, t->datasets[0], t->micro_batch, dp, rank, t->eod_id, eod_mask);
    if (t->datasets[1]) neox_batch_iterator_init(&t->valid_it, t->datasets[1], t->micro_batch, dp, rank, t->eod_id, eod_mask);
    t->batch = neox_batch_alloc(t->rows, t->seq_length);
    // num_workers (a DataLoader's background readers in GPT-NeoX): one thread reading ahead is
    // enough for a reader that copies from mapped files. Only the stages that read batches need it.
    int reads = t->grid->pipe_rank == 0 || t->grid->pipe_rank == t->grid->pipe_size - 1;
    if (neox_config_int(t->cfg, num_workers) > 0 && reads) t->prefetch = neox_prefetch_start(t->rows, t->seq_length);
    return 0;
}

// The dense bfloat16 tensor-core peak of the GPU (NVIDIA's data sheets: A100 312, H100/H200 SXM
// 989 TFLOP/s), the reference of MFU; 0 (no MFU) on the CPU and on other GPUs.
static double device_peak_flops(const neox_trainer *t) {
    if (strcmp(t->be->name, "cuda") != 0) return 0.0;
#ifdef NEOX_CUDA
    neox_cuda_device_info info;
    if (neox_cuda_device_info_get(neox_grid_local_rank(t->grid) % neox_cuda_device_count(), &info) != 0) return 0.0;
    if (info.major == 9 && info.minor == 0) return 989.4e12;
    if (info.major == 8 && info.minor == 0) return 312e12;
#endif
    return 0.0;
}

// MFU's denominator: peak_theoretical_tflops (GPT-NeoX's key, TFLOP/s per device) when set, else
// the detected GPU's peak.
static double peak_flops(const neox_trainer *t) {
    const neox_value *v = neox_config_has(t->cfg, peak_theoretical_tflops) ? neox_config_value(t->cfg, peak_theoretical_tflops) : NULL;
    double tflops = number_or(v, 0.0);
    return tflops > 0 ? tflops * 1e12 : device_peak_flops(t);
}

// use_wandb and its keys: neox.c has no W&B client; rank 0's notice gives the command that uploads the
// run's TensorBoard events instead (GPT-NeoX's wandb_init_all_ranks has no counterpart: rank 0's
// events already hold every rank's statistics).
static neox_wandb_settings wandb_settings(const neox_trainer *t) {
    const neox_config *cfg = t->cfg;
    neox_wandb_settings w = {
        .enabled = neox_config_has(cfg, use_wandb) && neox_config_bool(cfg, use_wandb),
        .project = neox_config_str(cfg, wandb_project), .team = neox_config_str(cfg, wandb_team),
        .group = neox_config_str(cfg, wandb_group), .run_name = neox_config_str(cfg, wandb_run_name),
        .host = neox_config_str(cfg, wandb_host),
    };
    if (!t->rank0 || t->opts.quiet) return w;
    if (!w.enabled) {
        static const neox_key_id keys[] = {NEOX_K_wandb_project, NEOX_K_wandb_team, NEOX_K_wandb_group,
                                           NEOX_K_wandb_run_name, NEOX_K_wandb_host};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            char source[256];
            if (strcmp(neox_config_source_id(cfg, keys[i], source, sizeof source), "default") != 0)
                neox_notice("config key with no effect in this run: %s (use_wandb is not true)", neox_key_specs[keys[i]].name);
        }
        return w;
    }
    const char *dir = neox_config_str(cfg, tensorboard_dir);
    if (!dir) {
        neox_notice("use_wandb: neox.c writes no W&B files of its own, and without tensorboard_dir this run writes no "
                    "TensorBoard events for `wandb sync --sync-tensorboard` to upload; set tensorboard_dir");
        return w;
    }
    char *cmd = neox_wandb_sync_command(&w, dir);
    neox_notice("use_wandb: neox.c writes no W&B files of its own; upload this run's TensorBoard events with: %s",
                cmd);
    free(cmd);
    return w;
}

static int setup_metrics(neox_trainer *t, neox_error *err) {
    const neox_model_desc *d = &t->model->desc;
    neox_flops_model fm = {d->num_layers, d->hidden_size, d->vocab_size, t->seq_length, t->train_batch_size,
                           d->checkpoint_activations, 0, d->moe_top_k, d->moe_experts, d->moe_ffn_size,
                           neox_activation_gated(d->activation) ? 3 : 2};
    for (int l = 0; l < d->num_layers; l++) fm.moe_layers += neox_model_moe_layer(d, l);
    neox_metrics_options mo = {
        .rank = t->grid->world_rank,
        .world_size = t->grid->world_size,
        .train_iters = t->train_iters,
        .log_interval = neox_config_int(t->cfg, log_interval),
        .train_batch_size = t->train_batch_size,
        .seq_length = t->seq_length,
        .flops_per_iteration = neox_flops_per_iteration(&fm),
        .peak_flops_per_device = peak_flops(t),
        .fp16 = t->precision == NEOX_PRECISION_FP16,
        .wall_clock_breakdown = neox_config_bool(t->cfg, wall_clock_breakdown),
        .log_dir = neox_config_str(t->cfg, log_dir),
        .tensorboard_dir = neox_config_str(t->cfg, tensorboard_dir),
        .wandb = wandb_settings(t),
    };
    if (neox_train_parts_setup(t, NEOX_PART_AFTER_LOAD, err) != 0) return -1;
    t->metrics = neox_metrics_open(&mo, err);
    return t->metrics ? 0 : -1;
}

static void setup_checkpoint_schedule(neox_trainer *t) {
    t->save_dir = neox_config_str(t->cfg, save);
    t->load_dir = neox_config_str(t->cfg, load);
    t->keep_last = (int)neox_config_int_or(t->cfg, keep_last_n_checkpoints, 0);
    t->last_saved = -1;
    const neox_value *v = neox_config_has(t->cfg, save_iters) ? neox_config_value(t->cfg, save_iters) : NULL;
    if (v && v->kind == NEOX_VALUE_LIST) {
        t->save_iters = neox_calloc((size_t)v->count + 1, sizeof *t->save_iters);
        for (int i = 0; i < v->count; i++)
            if (v->items[i]->kind == NEOX_VALUE_INT) t->save_iters[t->nsave_iters++] = v->items[i]->integer;
    }
}

// Parameters of the whole model: each rank's own, replicated ones and the tied copy counted once;
// under expert parallelism the experts from every rank of the first expert group.
static double total_params(const neox_trainer *t) {
    double n[2] = {0, 0};  // the rest, the experts
    for (int i = 0; i < t->model->nparams; i++) {
        const neox_param *p = &t->model->params[i];
        if (!p->tied_copy && (p->split != NEOX_SPLIT_NONE || t->grid->model_rank == 0))
            n[i >= t->model->dense_params] += (double)p->numel;
    }
    if (t->grid->world_size > 1) {
        if (t->grid->data_rank != 0) n[0] = 0;
        if (t->ep_size > 1 ? t->grid->expert_data.rank != 0 : t->grid->data_rank != 0) n[1] = 0;
        neox_allreduce_sum(&t->grid->world, n, 2, NEOX_F64);
    }
    return n[0] + n[1];
}

neox_trainer *neox_trainer_create(const neox_config *cfg, neox_grid *grid, const neox_train_options *opts,
                                  neox_error *err) {
    neox_trainer *t = neox_calloc(1, sizeof *t);
    t->cfg = cfg;
    t->grid = grid;
    if (opts) t->opts = *opts;
    t->rank0 = grid->world_rank == 0;
    t->micro_batch = (int)neox_config_int(cfg, train_micro_batch_size_per_gpu);
    t->rows = t->micro_batch * neox_train_rows_per_sample(cfg);
    t->grad_accum = (int)neox_config_int(cfg, gradient_accumulation_steps);
    t->seq_length = (int)neox_config_int(cfg, seq_length);
    t->train_iters = neox_config_int_or(cfg, train_iters, 0);
    t->train_batch_size = neox_config_int(cfg, train_batch_size);
    t->state.seed = (uint64_t)neox_config_int(cfg, seed);
    setup_checkpoint_schedule(t);
    // (each stage's parts are set up where neox_part_stage says)
    if (check_layout(t, err) != 0 || check_same_config(t, err) != 0 || setup_precision(t, err) != 0 ||
        neox_train_parts_setup(t, NEOX_PART_AFTER_PRECISION, err) != 0 ||
        neox_optimizer_read_settings(cfg, &t->optim, err) != 0 || setup_backend(t, err) != 0 || setup_model(t, err) != 0 ||
        neox_train_parts_setup(t, NEOX_PART_AFTER_MODEL, err) != 0 || setup_optimizer(t, err) != 0 ||
        setup_fused_head(t, err) != 0 ||
        setup_data(t, err) != 0 || neox_train_parts_check_data(t, err) != 0 ||
        neox_train_load(t, err) != 0 || setup_metrics(t, err) != 0) {
        neox_trainer_free(t);
        return NULL;
    }
    neox_train_parts_start(t);
    neox_train_late_setup(t);
    if (neox_train_graph_setup(t, err) != 0) {
        neox_trainer_free(t);
        return NULL;
    }
    // total_params is a collective: every rank computes it, rank 0 prints it.
    double nparams = t->opts.quiet ? 0 : total_params(t);
    if (t->rank0 && !t->opts.quiet) {
        char params[16];
        neox_info("model: %s parameters, %d layers, hidden %d, vocabulary %d (padded)",
                  neox_format_count(nparams, params, sizeof params), t->model->desc.num_layers,
                  t->model->desc.hidden_size, t->model->desc.vocab_size);
        neox_info("grid: %d ranks = pipe %d x data %d (context %d) x model %d; ZeRO stage %d%s%s%s", grid->world_size,
                  grid->pipe_size, grid->data_size, grid->cp_size, grid->model_size, t->zero_stage,
                  t->exchange && neox_grad_exchange_overlapped(t->exchange) ? ", overlapped reduction" : "",
                  neox_train_offloaded(t) ? (neox_train_offload_pinned(t) ? ", optimizer offloaded to the host (pinned buffers)"
                                                             : ", optimizer offloaded to the host") : "",
                  neox_comm_shared_cores() ? "; ranks share this machine's cores, so waits sleep" : "");
        neox_info("compute: %s backend (%s), precision %s%s", t->be->name, neox_backends_description(),
                  neox_precision_name(t->precision), t->precision == NEOX_PRECISION_FP16 ? ", dynamic loss scaling" : "");
    }
    neox_train_report_memory_plan(t);
    if (t->rank0 && !t->opts.quiet) {
        neox_info("batch: %lld samples per iteration = micro-batch %d x accumulation %d x data parallel %d; seq %d",
                  (long long)t->train_batch_size, t->micro_batch, t->grad_accum, neox_grid_sample_ways(grid), t->seq_length);
    }
    return t;
}

void neox_trainer_free(neox_trainer *t) {
    if (!t) return;
    neox_error ignored = {0};
    neox_metrics_close(t->metrics, &ignored);
    neox_prefetch_free(t->prefetch);
    neox_batch_free(t->batch);
    for (int i = 0; i < 3; i++) neox_dataset_free(t->datasets[i]);
    neox_data_settings_release(&t->data_settings);
    neox_train_parts_free(t);
    neox_grad_exchange_free(t->exchange);  // (the optimizer only borrows its momentum compressor)
    if (t->be) {
        neox_optimizer_free(t->optimizer);
        neox_train_graph_free(t);
        neox_train_late_free(t);
        neox_train_step_scalars_free(t);
        if (t->step_sumsq) t->be->free(t->step_sumsq);
        if (t->pipe_grad_send) t->be->free(t->pipe_grad_send);
    }
    neox_model_free(t->model);
    if (t->tokenizer) neox_tokenizer_free(t->tokenizer);
    free(t->save_iters);
    free(t);
}

int64_t neox_trainer_iteration(const neox_trainer *t) { return t->state.iteration; }
