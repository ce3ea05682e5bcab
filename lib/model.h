// model.h: the GPT-NeoX / Llama-style decoder: its description (sizes and features), its parameters
// in one buffer with Hugging Face names and layouts, one gradient buffer of the same layout,
// activations planned once for (micro-batch, sequence), and the forward and backward passes.
// A model object may be one rank's part of the whole model (docs/design.md, decision 5): a tensor-parallel
// shard (heads, MLP rows and vocabulary rows cut tp_size ways, with Megatron's column- and
// row-parallel linears, vocab-parallel embedding and cross-entropy) of one pipeline stage (a range
// of layers, the embedding on the first stage, the final norm and output layer on the last). The
// tensor-parallel reductions go through the communicator in neox_model.tp (none on one rank);
// the pipeline transfers between stages are the caller's (docs/model.md, "Parallel layouts").
#ifndef NEOX_MODEL_H
#define NEOX_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "core.h"
#include "kernels/kernels.h"

// ScaleNorm (GPT-NeoX's): x / max(||x||, eps) * g, one scalar g per norm. Non-parametric
// LayerNorm (GPT-NeoX's NonParametricLayernorm): a LayerNorm with no weight and no bias, so no
// tensors. Stored in checkpoints: append new kinds.
typedef enum { NEOX_NORM_LAYERNORM, NEOX_NORM_RMSNORM, NEOX_NORM_SCALENORM, NEOX_NORM_NONPARAMETRIC } neox_norm_kind;
// ALiBi: no embedding; attention scores get a linear bias per head (GPT-NeoX slopes). The values are
// stored in checkpoints: append new kinds.
typedef enum { NEOX_POS_ROTARY, NEOX_POS_LEARNED, NEOX_POS_NONE, NEOX_POS_ALIBI } neox_pos_kind;
// GPT-NeoX's `activation` values (swish is silu), with gelu split by bias_gelu_fusion (tanh) and
// onnx_safe (erf_gelu). The gated ones (from NEOX_ACT_SWIGLU on) take a (2F)-wide first projection.
// geglu with the tanh gelu is Transformer Engine's (te_layernorm_mlp). Stored in checkpoints: append.
typedef enum {
    NEOX_ACT_GELU, NEOX_ACT_GELU_TANH, NEOX_ACT_GELU_ONNX, NEOX_ACT_RELU, NEOX_ACT_SILU, NEOX_ACT_SOFTSIGN,
    NEOX_ACT_MISH, NEOX_ACT_SWIGLU, NEOX_ACT_GEGLU, NEOX_ACT_REGLU, NEOX_ACT_BILINEAR, NEOX_ACT_GLU,
    NEOX_ACT_GEGLU_TANH
} neox_activation;
// GPT-NeoX's moe_router_type: sinkhorn (training picks experts by Sinkhorn-balanced scores,
// evaluation by the scores) or topk (the softmax's top k).
typedef enum { NEOX_MOE_SINKHORN, NEOX_MOE_TOPK } neox_moe_router;
typedef enum { NEOX_INIT_NORMAL, NEOX_INIT_SCALED_NORMAL, NEOX_INIT_SMALL, NEOX_INIT_WANG } neox_init_method;
// Which Hugging Face class the parameter names and layouts follow: GPTNeoXForCausalLM (fused QKV
// interleaved per head, dense_h_to_4h/dense_4h_to_h) or LlamaForCausalLM (q/k/v/o_proj, gate/up/
// down_proj). GPT-NeoX names are used whenever GPTNeoXForCausalLM can hold the model (layernorm,
// gelu, no GQA, MLP biases); Llama names otherwise.
typedef enum { NEOX_NAMES_GPT_NEOX, NEOX_NAMES_LLAMA } neox_naming;

typedef struct neox_model_desc {
    int vocab_size;         // padded vocabulary (the embedding rows)
    int hidden_size;        // C
    int num_layers;
    int num_heads;          // query heads
    int num_kv_heads;       // key/value heads (== num_heads without GQA)
    int head_size;          // hidden_size / num_heads
    int ffn_size;           // MLP width F (per gate half for swiglu)
    int max_positions;      // learned position table rows / longest sequence
    neox_norm_kind norm;
    float norm_eps;
    int norm_bias;          // layernorm has a bias
    neox_pos_kind pos_emb;
    int rotary_dims;        // R: leading dims of each head that rotate (int(head_size * rotary_pct))
    double rotary_base;
    neox_rope_scaling rope_scaling;  // the frequencies' scaling (config key rope_scaling)
    int parallel_residual;  // gpt_j_residual: x + attn(ln1(x)) + mlp(ln2(x))
    neox_activation activation;
    int attn_bias, mlp_bias;
    int attn_out_unbiased;  // with attn_bias: q/k/v have biases, the attention output none (Qwen2)
    int attn_window;        // keys each query sees, itself included: sliding_window_width + 1 (0: all)
    // use_qk_layernorm: queries and keys normalised before rotary by one shared norm of weight (and
    // bias) (num_heads, head_size), GPT-NeoX's: a LayerNorm over all the token's heads together, or
    // an RMSNorm per head (qk_norm_group gives how many heads share statistics).
    int qk_norm;
    // Mixture of Experts (GPT-NeoX's dropless MoE, docs/model.md): layers l with l % moe_interval == 0
    // replace the MLP by moe_experts experts of width moe_ffn_size (no biases) and a router
    // (moe_experts x hidden, no bias) sending each token to moe_top_k of them. 0 experts: none.
    // With a gated activation each expert is gated (w1 gate, w3 up, w2 down: GPT-NeoX's grouped
    // LLaMA MLP, Mixtral's experts).
    int moe_experts, moe_top_k, moe_interval, moe_ffn_size;
    neox_moe_router moe_router;
    int moe_renormalize;    // moe_topk_renormalize: the chosen experts' weights divided by their sum (Mixtral)
    float moe_jitter_eps;   // topk router in training: its input times uniform noise in [1 - eps, 1 + eps) (0: off)
    int tied;               // the output layer reuses the input embedding
    // A reward model (train_impl: rm): the output layer is a scalar value head, score.weight (1, C)
    // without bias as in GPT-NeoX's RowParallelLinear(hidden, 1) and Hugging Face's
    // ...ForSequenceClassification, giving one value per position instead of logits. It is
    // replicated on every tensor-parallel rank (C numbers; no reduction), and cannot be tied.
    int value_head;
    neox_init_method init_method, output_init_method;
    double init_std;
    float hidden_dropout, attention_dropout;
    int checkpoint_activations;  // recompute each layer's forward in backward
    // With checkpoint_activations, where each layer's input is kept for its recomputation
    // (docs/memory.md, "Activation checkpoints"): cut into tp_size pieces, one per tensor-parallel
    // rank, all-gathered again just before the layer is recomputed (DeepSpeed's partition_activations);
    // in host memory, copied back to the backend just before (checkpoint_in_cpu). Either keeps the
    // inputs apart from the residual stream in a store the model owns; both off: kept in place.
    int partition_recompute_inputs;
    int recompute_inputs_on_host;
    // Megatron's sequence parallelism (docs/parallel.md, "Sequence parallel"), with tp_size > 1: the
    // residual stream, the norms and the hidden dropouts hold 1/tp_size of the rows (B x T flattened,
    // cut into tp_size contiguous pieces: with one sample per micro-batch, pieces of the sequence);
    // the column-parallel linears' inputs are all-gathered and the row-parallel linears' outputs
    // reduce-scattered. Needs T divisible by tp_size (neox_model_plan refuses others).
    int sequence_parallel;
    neox_naming naming;
    // This rank's part of the model; zeros mean the whole model (neox_model_desc_check fills them).
    int tp_size, tp_rank;         // tensor parallel
    int pp_size, pp_rank;         // pipeline stage
    int layer_begin, layer_end;   // the stage's transformer layers [begin, end)
    // Expert parallelism: experts are shared out over ep_size ranks (0 or 1: every rank holds every
    // expert); rank ep_rank holds experts [ep_rank, ep_rank + 1) x moe_experts / ep_size.
    int ep_size, ep_rank;
    // Context parallelism (docs/parallel.md, "Context parallel"): each sequence is cut into 2 x
    // cp_size chunks and this rank holds chunks cp_rank and 2 cp_size - 1 - cp_rank (0 or 1: the
    // whole sequence). Keys and values are all-gathered over the context group for attention.
    int cp_size, cp_rank;
} neox_model_desc;

// Fills desc from a loaded GPT-NeoX config (GPT-NeoX's semantics for the MLP width, rotary dims,
// padded vocabulary, epsilons). tokenizer_vocab is the tokenizer's size, padded here as GPT-NeoX
// pads it; <= 0 takes the config's padded_vocab_size. Bad combinations fail naming the key.
int neox_model_desc_from_config(neox_model_desc *desc, const neox_config *cfg, int64_t tokenizer_vocab,
                                neox_error *err);
// Whether the activation is gated, and its GPT-NeoX name ("gelu" for every gelu variant); parse
// takes a GPT-NeoX name, swish included (-1 when unknown).
int neox_activation_gated(neox_activation a);
const char *neox_activation_name(neox_activation a);
int neox_activation_parse(const char *name, neox_activation *out);
// Checks sizes and features for consistency; picks desc->naming; fills the layout fields (the whole
// model when they are zero) and checks that tp_size divides the heads, kv heads, MLP width and
// vocabulary. Called by neox_model_create.
int neox_model_desc_check(neox_model_desc *desc, neox_error *err);

// How layers are spread over pipe stages (GPT-NeoX's pipe_partition_method): "type:transformer"
// balances transformer layers; "parameters" balances parameter counts (the embedding counts on the
// first stage, the output layer on the last); "uniform" balances layers counting the embedding and
// the output layer as one layer each. bounds: (pp + 1), stage s holds [bounds[s], bounds[s+1]).
// Every stage gets at least one transformer layer. An unknown method fails naming the key.
int neox_model_pipe_partition(const neox_model_desc *desc, int pp, const char *method, int *bounds, neox_error *err);
// The weights of one norm: a scale per channel, ScaleNorm's one gain, or none (a parameter-free
// norm: no tensors; it is computed with the model's constant weight of ones, neox_model.norm_ones).
static inline int neox_norm_weights(const neox_model_desc *d) {
    return d->norm == NEOX_NORM_SCALENORM ? 1 : d->norm == NEOX_NORM_NONPARAMETRIC ? 0 : d->hidden_size;
}
// The arithmetic of the model's norm, which picks its kernels: a non-parametric LayerNorm is a
// LayerNorm whose weight is ones.
static inline neox_norm_kind neox_norm_arith(const neox_model_desc *d) {
    return d->norm == NEOX_NORM_NONPARAMETRIC ? NEOX_NORM_LAYERNORM : d->norm;
}
// The heads whose values use_qk_layernorm normalises together: all of them for a LayerNorm
// (GPT-NeoX's LayerNorm([heads, head_size])), one for an RMSNorm (GPT-NeoX's reduces the last dim).
static inline int neox_qk_norm_group(const neox_model_desc *d, int local_heads) {
    return neox_norm_arith(d) == NEOX_NORM_LAYERNORM ? local_heads : 1;
}
// Whether layer l's MLP is a Mixture of Experts.
static inline int neox_model_moe_layer(const neox_model_desc *d, int l) {
    return d->moe_experts > 1 && l % d->moe_interval == 0;
}
// Experts each rank holds, and whether global expert e is one of this rank's.
static inline int neox_model_local_experts(const neox_model_desc *d) {
    return d->ep_size > 1 ? d->moe_experts / d->ep_size : d->moe_experts;
}
static inline int neox_model_expert_local(const neox_model_desc *d, int e) {
    return d->ep_size <= 1 || e / neox_model_local_experts(d) == d->ep_rank;
}
// The rows of an expert's first projection: [w3; w1] (up, gate: 2 x width) when gated, else w1.
static inline int neox_model_moe_in_rows(const neox_model_desc *d) {
    return neox_activation_gated(d->activation) ? 2 * d->moe_ffn_size : d->moe_ffn_size;
}
static inline int neox_model_first_stage(const neox_model_desc *d) { return d->pp_rank == 0; }
static inline int neox_model_last_stage(const neox_model_desc *d) { return d->pp_rank == d->pp_size - 1; }

// One named parameter: a view into the parameter buffer (and the same offset in the gradient buffer).
// Under tensor parallelism the buffer holds a block of the global tensor: shape at block_offset in
// global_shape (Megatron cuts one dimension; see split).
typedef enum { NEOX_SPLIT_NONE, NEOX_SPLIT_ROWS, NEOX_SPLIT_COLS } neox_split;
typedef struct neox_param {
    char name[96];          // Hugging Face name
    int ndim;
    int64_t shape[2];       // this rank's block
    int64_t global_shape[2];
    int64_t block_offset[2];
    size_t offset, numel;   // in floats, within the buffers
    int no_decay;           // biases and norm weights (no weight decay)
    neox_split split;       // NONE: every tensor-parallel rank holds the whole tensor (replicated)
    int index;              // position in the whole model's parameter list (its init stream)
    int tied_copy;          // the last stage's copy of the tied input embedding: not saved, gradient
                            // summed with the first stage's
} neox_param;

typedef struct neox_layer_params {  // pointers into a buffer (parameters or gradients)
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    float *qkv_w, *qkv_b;    // ((NH + 2*NKV) * HS, C): fused QKV, or q/k/v_proj side by side
    float *qk_norm_w, *qk_norm_b;  // (NH, HS): use_qk_layernorm's norm of queries and keys
    float *proj_w, *proj_b;  // (C, C): attention output
    float *fc_w, *fc_b;      // (F or 2F, C): dense_h_to_4h, or [up_proj; gate_proj]
    float *fc2_w, *fc2_b;    // (C, F)
    // A Mixture-of-Experts layer has these in place of fc/fc2: the router (E, C), then expert e's
    // first projection (I, C) and w2 (C, Fe) at experts + e * (I + Fe) * C, I = neox_model_moe_in_rows:
    // w1 (Fe, C), or when gated [w3; w1] (2Fe, C), up then gate as the dense MLP's [up_proj; gate_proj].
    float *router_w, *experts_w;
} neox_layer_params;

typedef struct neox_model_weights {
    float *wte, *wpe, *lnf_w, *lnf_b, *lm_head;  // lm_head == wte when tied
    neox_layer_params *layers;
} neox_model_weights;

typedef struct neox_comm neox_comm;
typedef struct neox_model neox_model;
typedef struct neox_backend neox_backend;

// The element type of the linear layers' GEMM operands (GPT-NeoX's `precision`): fp32, or
// bfloat16 / fp16 copies of the weights and of each product's input and output gradient, with
// products accumulated in fp32 into fp32 results (torch.autocast's rule for linear layers). The
// parameters, their gradients, the optimizer state and every other op stay fp32: the parameters
// are the master weights.
// NEOX_PRECISION_FP8 (neox.c's own value, "fp8"): the transformer layers' linear products (QKV,
// attention output, the MLP's two) on FP8 operands scaled by Transformer Engine's delayed-scaling
// recipe (lib/model/fp8.c), every other product as bfloat16 (docs/model.md, "FP8 training").
typedef enum { NEOX_PRECISION_FP32, NEOX_PRECISION_BF16, NEOX_PRECISION_FP16, NEOX_PRECISION_FP8 } neox_precision;
// Parses "fp32" | "bfloat16" | "fp16" (GPT-NeoX's values) | "fp8"; -1 when unknown.
int neox_precision_parse(const char *name, neox_precision *out);
// The activations' storage type under precision p (docs/model.md, "Activation storage"): bf16 under
// bfloat16 (fp32 for a Mixture of Experts and a value head), fp32 otherwise (fp16's loss scaling
// needs fp32's range in the activations' gradients; fp8's products read fp32 inputs).
neox_elem neox_model_storage_elem(const neox_model_desc *d, neox_precision p);
// Overrides the storage set_precision chose (after it; the plan is carved again): fp32 storage under
// bfloat16 keeps only the products' rounding, which tests/oracle/test_model_parity.py holds apart.
void neox_model_set_storage(neox_model *m, neox_elem act);
const char *neox_precision_name(neox_precision p);
// Called by backward between its operations with the parameters [begin, end) (indices into
// params; possibly none) whose gradients became final for this micro-batch since the last call:
// data-parallel reduction can start on them, and communication in flight can be progressed.
// Every parameter of the stage is reported exactly once per backward.
typedef void (*neox_grads_ready_fn)(void *ctx, int begin, int end);
// ZeRO-3: called by forward and backward with use 1 just before they read the weights of a unit
// and with use 0 when they are done with them, so that the owner can gather the unit's parameters
// into param_buf first and release them after. Units: NEOX_UNIT_EMBED (the parameters before the
// first layer), layer l as NEOX_UNIT_LAYER(l), and the head (final norm and output layer) as
// neox_model_unit_head(desc); with tied weights on one stage the head also uses the embedding.
// While the hook is installed the 16-bit weight copy is its owner's to keep (neox_model_refresh_range).
// Expert parallelism's all-to-all bookkeeping (lib/model/moe_exchange.c), for one MoE layer and
// micro-batch on one rank of an expert group of `ranks` ranks holding `local` experts each.
typedef struct neox_moe_exchange {
    int ranks, local, cap;         // cap: the most rows the buffers behind to_expert hold
    int *send_count, *send_displ;  // (ranks) rows to each rank out of the expert-sorted rows
    int *recv_count, *recv_displ;  // (ranks) rows from each rank, received source-major
    int *from;                     // (ranks, local) rows from rank s for local expert e
    int *local_count;              // (local) rows of each local expert, every source together
    int *to_expert, *to_source;    // (received) expert-major row i is source-major row to_expert[i]; inverse
    int received;
} neox_moe_exchange;
neox_moe_exchange *neox_moe_exchange_new(int ranks, int local, int cap);
void neox_moe_exchange_free(neox_moe_exchange *x);
// count: this rank's rows per global expert (ranks x local); from: what every rank of the group
// sends this one (exchanged first). Fails when more than cap rows would arrive.
int neox_moe_exchange_plan(neox_moe_exchange *x, const int *count, const int *from, neox_error *err);

typedef void (*neox_weights_use_fn)(void *ctx, int unit, int use);
enum { NEOX_UNIT_EMBED = 0 };
#define NEOX_UNIT_LAYER(l) (1 + (l))
struct neox_model {
    neox_model_desc desc;
    // Where every buffer below lives and every op runs (kernels/backend.h): on the CUDA backend
    // param_buf, grad_buf and act_buf are device memory and must be read through be->to_host.
    const neox_backend *be;
    neox_precision precision;  // set with neox_model_set_precision
    struct neox_fp8 *fp8;      // precision fp8's scales and scratch (private: lib/model/fp8.c), else NULL
    uint16_t *param16;         // 16-bit copy of param_buf (16-bit precisions), refreshed lazily
    int param16_stale;         // param_buf changed since param16 was made
    uint16_t *half_in, *half_out;  // 16-bit GEMM operand scratch (planned with the activations)
    size_t half_elems;         // their size together
    neox_elem act_elem;        // the activations' storage type (kernels.h, "Activation storage"): fp32 (0) until
                               // neox_model_set_precision chooses bf16 storage
    void *host_stage;          // host copies of the N-sized loss statistics (private; forward.c)
    int input_sets;            // page-locked staging sets of the inputs (neox_model_set_input_sets; 0: 2)
    int inputs_staged;         // forward copies its inputs from the set neox_model_fill_inputs filled
    int nparams;
    neox_param *params;      // in buffer order
    // Layer l's parameters are params[layer_first_param[l] .. layer_first_param[l + 1]) (empty
    // off this stage); before the first are the embeddings, from [num_layers] on the head.
    int *layer_first_param;
    // Parameters from dense_params on are this rank's experts under expert parallelism (after
    // everything else: neox_model_desc's ep_size); dense_params = nparams otherwise.
    int dense_params;
    size_t num_floats;       // total parameter count
    float *param_buf, *grad_buf;
    neox_model_weights w, g; // views into param_buf and grad_buf
    // A parameter-free norm (neox_norm_weights 0): its weight views in w point at norm_ones, a
    // constant of ones (max(hidden, local heads x head size) floats, backend memory), and its
    // gradient views in g at norm_sink, where the kernels' weight gradients go and nothing reads.
    float *norm_ones, *norm_sink;
    // Activations, planned by neox_model_plan for (B, T), in nslots independent sets (pipeline
    // schedules keep several micro-batches between their forward and backward). Under context
    // parallelism T is this rank's rows of each sequence (2 chunks) and cp_T the whole sequence
    // (the T planned for, whose whole rows the inputs still come in); cp_T = T otherwise.
    int B, T, cp_T;
    // Rows of the output layer's logits held at a time (asked with neox_model_set_head_rows before
    // planning; all B*T rows by default). With fewer rows than B*T, a forward with targets computes
    // the logits chunk by chunk, keeping only the loss statistics, and backward recomputes each
    // chunk's logits for its gradient (unless the fused loss made the gradient in the forward).
    int head_rows_asked, head_rows;
    // The fused loss (neox_model_set_fused_head): asked before planning; head_loss_scale is set by
    // the caller before each training forward (the backward's loss_scale, known then).
    int fused_head;
    float head_loss_scale;
    // The ranks whose micro-batch means the training loss averages (the data-parallel group's size,
    // set by a trainer whose gradient exchange sums; 0 counts as 1): each micro-batch's loss gradient
    // is divided by it too, in the denominator with the mask's sum (neox_model_head_scale's
    // mask_sum), so a rank's loss gradient is one rank's over the whole global batch.
    int loss_ranks;
    // NULL, or the micro-batch's loss gradient scale (neox_model_head_scale of its loss scale and mask
    // sum) in backend memory, which the loss's ops read in place of the one made from head_loss_scale
    // and the staged mask (a captured step's micro-batch: its trainer writes it there, kept in the slot
    // for its backward).
    const float *head_scale_at;
    void *act_buf;
    size_t act_bytes;
    size_t layer_set_bytes, layer_input_bytes;  // one layer's saved set and kept input (neox_model_activation_layout)
    void *recompute_inputs_host;      // host memory of the kept layer inputs (recompute_inputs_on_host), else NULL
    size_t recompute_inputs_host_bytes;
    int nslots, slot;
    void *slots;             // private layout (lib/model/forward.c)
    void *acts;              // the current slot
    // Set by the caller before forward: dropout on/off, the run's dropout seed and the index of this
    // micro-batch's first row among all rows of the run that drew masks (kept in the slot for its
    // backward). Masks are indexed by global row, position, channel and head, so any layout that
    // gives each sample the same row draws the same masks.
    int training;
    unsigned long long dropout_seed, dropout_row0;
    // NULL, or a row index in backend memory that the masks add to dropout_row0 when they are drawn (a
    // captured step's micro-batch, whose row changes at every replay: its trainer writes it there).
    const unsigned long long *dropout_row0_at;
    float loss;              // of the last forward with targets (on the last pipe stage)
    // Set by the caller: leave the loss on the backend (loss is then NaN; neox_model_loss_sums has it),
    // so that a forward never waits for the device (the trainer reads its steps' losses a step late).
    int defer_loss;
    // Set by the caller: the tensor-parallel group (NULL on one rank), and the hook backward calls.
    neox_comm *tp;
    neox_comm *ep;  // the expert-parallel group (desc.ep_size ranks), NULL without expert parallelism
    neox_comm *cp;  // the context-parallel group (desc.cp_size ranks), NULL without context parallelism
    neox_grads_ready_fn grads_ready;
    void *grads_ready_ctx;
    // Set by the caller with grads_ready: the output layer's weight gradient is computed
    // head_grad_rows vocabulary rows per product (0: one product) and each piece's range of grad_buf
    // [begin, end) reported to grad_range_ready (same ctx) as it becomes final, instead of the whole
    // parameter to grads_ready: a large vocabulary's reduction starts, and its memory can be given
    // back, piece by piece. Only for an output layer of its own (not tied to the embedding).
    int head_grad_rows;
    void (*grad_range_ready)(void *ctx, size_t begin, size_t end);
    neox_weights_use_fn weights_use;
    void *weights_use_ctx;
    // ZeRO-3 with the output layer in pieces (head_grad_rows): called with use 1 and 0 around each
    // use of the range [begin, end) of param_buf holding a piece of it; the head's unit leaves the
    // output layer out, so no rank holds it whole (same ctx as weights_use).
    void (*weights_piece)(void *ctx, size_t begin, size_t end, int use);
};

static inline int neox_model_unit_head(const neox_model_desc *d) { return NEOX_UNIT_LAYER(d->num_layers); }
// Activation storage (docs/model.md, "Activation storage"): the bytes of n elements of the model's
// activations or their gradients, stored as act_elem. Every copy, message and offset of them is sized
// by it (lib/model/model_internal.h's neox_act_at for offsets), so the storage type is one switch.
static inline size_t neox_model_act_bytes(const neox_model *m, size_t n) { return n * neox_elem_size(m->act_elem); }
// Units in all: the embedding, every layer, the head.
static inline int neox_model_unit_count(const neox_model_desc *d) { return d->num_layers + 2; }
// Unit u's parameters are params[first[u] .. first[u + 1]) (first: unit_count + 1 entries).
void neox_model_unit_params(const neox_model *m, int *first);
// The units one pass uses, in the order forward (and with backward, then backward) acquires them
// (the weights_use calls with use 1); returns how many (at most 2 x unit_count + 2).
int neox_model_weight_trace(const neox_model *m, int backward, int *trace);
// Casts elements [begin, end) of param_buf into the 16-bit copy (16-bit precisions; else nothing).
void neox_model_refresh_range(neox_model *m, size_t begin, size_t end);

// Allocates the parameter and gradient buffers (gradients zeroed; parameters zero) on the CPU
// backend, or on backend be. On the host their pages are mapped only when first written.
neox_model *neox_model_create(const neox_model_desc *desc, neox_error *err);
neox_model *neox_model_create_on(const neox_model_desc *desc, const neox_backend *be, neox_error *err);
// Chooses the linear layers' operand precision (before or after planning).
void neox_model_set_precision(neox_model *m, neox_precision p);
// Precision fp8's recipe (Transformer Engine's DelayedScaling as GPT-NeoX's te_fp8_* keys set it):
// forward tensors (each FP8 linear's input and weight) E4M3, output gradients backward_format (E5M2
// under te_fp8_format hybrid, E4M3 under e4m3); wgrad 0: the weight gradient's product in bfloat16
// (te_fp8_wgrad false); each tensor's scale from its amax history of history_len passes (the
// newest amax, or with algo_max the largest), fp8 max * 2^-margin / amax.
typedef struct neox_fp8_recipe {
    neox_fp8_format backward_format;
    int wgrad, history_len, algo_max, margin;
} neox_fp8_recipe;
// After neox_model_set_precision(m, NEOX_PRECISION_FP8): sets the recipe and makes the scaling
// state (scales 1, histories zero, as Transformer Engine starts). A training forward (m->training)
// records each FP8 tensor's amax; its backward each output gradient's.
void neox_model_set_fp8_recipe(neox_model *m, const neox_fp8_recipe *recipe);
// The scaled tensors (3 per FP8 linear: input, weight, output gradient), and the scaling state in
// the backend's memory: history (history_len, n) row-major, row 0 the amaxes recorded since the last
// update (reduce it with max over the ranks that share the tensors before updating); scale (n).
int neox_model_fp8_tensors(const neox_model *m);
float *neox_model_fp8_history(const neox_model *m);
float *neox_model_fp8_scale(const neox_model *m);
// Delayed scaling's update after a training pass (and its amax reduction): rolls the histories and
// sets every scale and its inverse (kernels.h's neox_fp8_update_scales).
void neox_model_fp8_update(neox_model *m);
// The same in two halves, for a pipeline schedule that runs other micro-batches' forwards between a
// micro-batch's forward and its backward: _forward after a training forward (the forward tensors'
// columns; the current slot keeps the scales its forward was cast with, which its backward and a
// recomputed forward cast with again, recording nothing), _backward after the current slot's
// backward (the output gradients' columns). Each half's amaxes: neox_model_fp8_newest_amaxes.
void neox_model_fp8_update_forward(neox_model *m);
void neox_model_fp8_update_backward(neox_model *m);
// Row 0 of the history's forward columns (gradients 0: 2 per FP8 linear) or output-gradient columns
// (1: one per linear), *count of them, contiguous: what a half's reduction over the ranks covers.
float *neox_model_fp8_newest_amaxes(const neox_model *m, int gradients, int *count);
// After the scales are written from outside: remakes their inverses.
void neox_model_fp8_scales_changed(neox_model *m);
// The scaling state (every layout's output gradients are one rank's: neox_model.loss_ranks), as
// host copies history (history_len, n) and scale (n); _set also remakes the inverses.
void neox_model_fp8_state_get(const neox_model *m, float *history, float *scale);
void neox_model_fp8_state_set(neox_model *m, const float *history, const float *scale);
// Whoever writes param_buf outside neox_model_init (an optimizer step, a checkpoint load) calls
// this so that the 16-bit weight copy is remade before the next forward.
void neox_model_weights_changed(neox_model *m);
// The parameter holding the first NaN or inf of param_buf (NULL when every weight is finite),
// and the same as a check: fails with "WHAT: parameter NAME holds NaN or inf" (lib/model/finite.c).
const neox_param *neox_model_first_nonfinite(const neox_model *m);
int neox_model_check_finite(const neox_model *m, const char *what, neox_error *err);
// Whether buf, holding elements [begin, end) of the flat parameter layout of a state tensor group
// (optimizer moments, on the model's device), is all finite; else an error naming the tensor as
// the checkpoint stores it ("GROUP/PARAM") and the element.
int neox_model_check_finite_state(const neox_model *m, const float *buf, size_t begin, size_t end, const char *group,
                                  neox_error *err);
void neox_model_free(neox_model *m);
// The parameters desc lays out (names, shapes, offsets, in buffer order) without allocating the
// model: for tools that handle checkpoints tensor by tensor. malloc'ed; NULL + err for a bad desc.
neox_param *neox_model_param_list(const neox_model_desc *desc, int *count, neox_error *err);
const neox_param *neox_model_find_param(const neox_model *m, const char *name);
// Elements [begin, end) of parameter p's block (row-major, relative to the block's start) as
// blocks of the global tensor: at most three (a partial row, whole rows, a partial row). Each
// piece's data starts at element `start` of the block. Returns the number of pieces.
typedef struct neox_param_piece {
    int64_t offset[2], count[2];  // in the global tensor
    size_t start;
} neox_param_piece;
int neox_param_pieces(const neox_param *p, size_t begin, size_t end, neox_param_piece out[3]);
// GPT-NeoX's init methods with a counter-based RNG: a value depends on (seed, parameter, element)
// only. Biases 0, norm weights 1, norm biases 0.
void neox_model_init(neox_model *m, unsigned long long seed);
// The same values for elements [begin, end) of the flat layout only, written to dst[0, end - begin)
// in host memory (ZeRO-3 initialises its partition without the whole model).
void neox_model_init_range(const neox_model *m, unsigned long long seed, size_t begin, size_t end, float *dst);
void neox_model_zero_grad(neox_model *m);
// Plans (allocates once) the activations for micro-batch B and sequence T (T <= max_positions
// for learned positions). Forward and backward then allocate nothing.
int neox_model_plan(neox_model *m, int B, int T, neox_error *err);
// The same with nslots sets of saved activations (scratch is shared); neox_model_use_slot picks
// the set the next forward or backward works in.
int neox_model_plan_slots(neox_model *m, int B, int T, int nslots, neox_error *err);
void neox_model_use_slot(neox_model *m, int slot);
// The logits that training holds at once: above this many elements (2 GiB of fp32) the head runs in
// row chunks (a (B*T) x V product of 125M's micro-batch 32 would be 3.3e9 elements, 13 GB).
#define NEOX_MODEL_HEAD_ELEMS ((size_t)1 << 29)
// Asks for the output layer in chunks of `rows` rows, NEOX_MODEL_HEAD_AUTO (chunks only above
// NEOX_MODEL_HEAD_ELEMS: what training asks for) or 0 (every row at once: the default, which a forward
// without targets needs); takes effect at the next plan. The loss and gradients are those of the
// whole product up to the GEMM's summation order (bit for bit when one chunk holds every row).
#define NEOX_MODEL_HEAD_AUTO (-1)
void neox_model_set_head_rows(neox_model *m, int rows);
// The fused loss (docs/model.md, "The fused loss"), for training whose loss gradient is known at
// forward time (no DPO/KTO token weights set after it): on, a training forward with targets (m->
// training) computes each chunk's loss and dlogits in one op and runs the output layer's backward
// for d(m->head_loss_scale * loss) right after, so the logits are never made twice; the backward
// that follows (with the same loss_scale) starts from the final norm. The automatic chunks are then
// at most NEOX_MODEL_HEAD_FUSED_ELEMS logits. Not used for a value head or when the output layer is
// used in pieces (neox_model_head_piece_rows: each piece's gradient is reported as backward makes
// it). Takes effect at the next plan; the loss and gradients are the unfused path's (bit for bit on
// the CPU with the same chunks).
#define NEOX_MODEL_HEAD_FUSED_ELEMS ((size_t)1 << 26)
// The scale of a micro-batch's loss gradient: its loss scale over its mask's sum (the mean's
// normalisation; as the model keeps it, times loss_ranks), 0 for an empty mask. The one expression
// for the model's loss ops and for a trainer that puts it in backend memory (head_scale_at).
static inline float neox_model_head_scale(float loss_scale, float mask_sum) {
    return mask_sum > 0 ? loss_scale / mask_sum : 0.0f;
}
void neox_model_set_fused_head(neox_model *m, int on);
// The inputs' page-locked staging for a captured step (lib/train/graph.c). set_input_sets: how many
// micro-batches' ids, targets and masks it holds (2 unless asked: a forward refills the set of two
// forwards before); with one per micro-batch and restart_inputs at each step, micro-batch k of every
// step takes set k, from which a replayed capture copies it. fill_inputs: the next set filled as a
// forward fills it, without the copies (the replay makes them); *mask_sum: the loss mask's sum, as
// forward takes it for the loss's normalisation. While m->inputs_staged is set, forward takes its
// inputs from the next set as fill_inputs left it (its ids, targets and mask arguments only say which
// it has).
void neox_model_set_input_sets(neox_model *m, int sets);
void neox_model_restart_inputs(neox_model *m);
int neox_model_fill_inputs(neox_model *m, const int *ids, const int *targets, const float *loss_mask, float *mask_sum,
                           neox_error *err);
// The activations' memory, with the 16-bit GEMM scratch of 16-bit precisions (the backend's).
size_t neox_model_activation_bytes(const neox_model *m);
// The activation plan by layer (docs/memory.md, "Activations per layer"): per_layer, the bytes each
// layer keeps from its forward to its backward for one micro-batch in flight (its input, with
// checkpoint_activations this rank's piece of it, and otherwise its saved set too), held by layers x
// slots; layer_set, one layer's saved set besides its input (under checkpoint_activations one such
// set serves every layer's recomputation); rest, the remainder of neox_model_activation_bytes (the
// stage's output, the head, the scratch every slot shares, the recomputation's set, 16-bit scratch).
typedef struct neox_activation_layout {
    size_t per_layer, layer_set, rest;
    int layers, slots;
} neox_activation_layout;
neox_activation_layout neox_model_activation_layout(const neox_model *m);
// The host memory holding kept layer inputs (desc.recompute_inputs_on_host; else 0).
size_t neox_model_host_recompute_bytes(const neox_model *m);

// Pipeline stages. A stage without the embedding reads its input from neox_model_stage_input
// ((B, T, C), filled by the caller before forward); a stage without the output layer leaves its
// output in neox_model_stage_output and takes the gradient of that output in
// neox_model_stage_output_grad (filled before backward). After backward, a stage without the
// embedding leaves the gradient of its input in neox_model_stage_input_grad (until the next backward).
// Each holds neox_model_stream_floats(desc, B, T) floats: (B, T, C), or under sequence parallelism
// this rank's 1/tp_size of its rows.
size_t neox_model_stream_floats(const neox_model_desc *d, int B, int T);
float *neox_model_stage_input(neox_model *m);
const float *neox_model_stage_output(const neox_model *m);
float *neox_model_stage_output_grad(neox_model *m);
const float *neox_model_stage_input_grad(const neox_model *m);

// ids, targets: (B, T) token ids in [0, vocab); loss_mask: (B, T) weights or NULL. targets may be
// NULL (logits only); a value-head model ignores targets and loss_mask (its loss is the caller's). Returns -1 (err) on an out-of-range id. The loss is the mask-weighted mean.
// ids are read on the first pipe stage only, targets and loss_mask on the last only.
int neox_model_forward(neox_model *m, const int *ids, const int *targets, const float *loss_mask, neox_error *err);
// The last forward's loss as the backend holds it: 2 doubles in the backend's memory, the masked sum
// of the token losses and the sum of the mask (kernels.h's neox_mean_loss makes the loss of them);
// overwritten by the next forward with targets.
const double *neox_model_loss_sums(const neox_model *m);
// The logits of the last forward: (B, T, vocab) (this rank's vocabulary columns under tensor
// parallelism), or (B, T) values of a value head. Overwritten by backward. A forward without targets
// needs a plan holding every row's logits (head_rows == B*T; it fails otherwise).
const float *neox_model_logits(const neox_model *m);
// n activation elements (act_elem storage, backend memory: the logits above, a stage's output) to
// fp32 on the host: the one boundary where a reader that wants fp32 values takes them.
void neox_model_act_to_host(const neox_model *m, float *out, const float *src, size_t n);
// Adds d(loss_scale * loss)/d(params) into the gradient buffer. Needs a forward with targets.
void neox_model_backward(neox_model *m, float loss_scale);
// Vocabulary rows per piece of the output layer when it is used in pieces (head_grad_rows set with
// grad_range_ready, an output layer of its own), else 0; begin, end (may be NULL): its range of
// param_buf and grad_buf.
int neox_model_head_piece_rows(const neox_model *m);
void neox_model_head_range(const neox_model *m, size_t *begin, size_t *end);
// With the output layer in pieces, the input embedding's forward uses its rows in pieces of as
// many rows too when it is a parameter of its own (untied; this rank's vocabulary rows), else 0.
int neox_model_embed_piece_rows(const neox_model *m);
int neox_model_embed_rows(const neox_model *m);
// The most elements of grad_buf one product of backward writes before they are reported final
// (with head_grad_rows set): the largest tensor computed whole, a piece of the output layer, or the
// rows a micro-batch's tokens touch in the input embedding. Needs a plan (B, T).
size_t neox_model_grad_fill_elems(const neox_model *m);

// Objectives other than the mean token loss (DPO: lib/train/preference.c) are built from the
// per-token log-probabilities of the targets and give back the loss's gradient per token.
// After a forward with targets on the last stage: out (B * T) = log p(target) at every position,
// from the same vocabulary-parallel log-sum-exp as the loss (whole under tensor parallelism).
void neox_model_token_logprobs(const neox_model *m, double *out);
// Makes the next backward that of the loss L = sum_i w[i] * (-log p(target_i)), w (B * T) being
// dL/d(token loss): the mean loss is the case w = mask / sum(mask). Replaces the forward's mask.
void neox_model_set_token_weights(neox_model *m, const float *w);

// Value-head models (desc.value_head): after a forward on the last stage, out (B * T) = the value
// at every position (host memory; whole on every tensor-parallel rank). set_value_grads makes the
// next backward that of a loss L with dL/d(value_i) = dv[i] (B * T), scaled by backward's loss_scale.
void neox_model_values(const neox_model *m, float *out);
void neox_model_set_value_grads(neox_model *m, const float *dv);

#endif
