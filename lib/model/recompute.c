// recompute.c: the store of the layer inputs that activation checkpointing recomputes from. With
// checkpoint_activations each layer's input is all backward needs to recompute the layer; the store
// keeps it smaller or elsewhere than the residual stream would. Partitioned (DeepSpeed's
// partition_activations, Megatron's), each tensor-parallel rank keeps only its 1/P of the flattened
// input, which the P ranks hold identical copies of anyway, and the pieces are all-gathered just
// before the recomputation; on the host (checkpoint_in_cpu), the pieces live in host memory and are
// copied back to the backend then. Copies and all-gathers move values unchanged, so training is bit
// for bit that without the store.
#include "kernels/backend.h"
#include "model_internal.h"

// The floats of one layer input that this rank keeps, and where its piece starts in the whole.
static size_t piece_floats(const neox_model *m) {
    return (size_t)neox_model_stream_rows(m) * m->desc.hidden_size / (size_t)neox_model_recompute_ways(&m->desc);
}

static size_t piece_start(const neox_model *m) {
    return neox_model_recompute_ways(&m->desc) > 1 ? (size_t)m->desc.tp_rank * piece_floats(m) : 0;
}

float *neox_model_layer_input(const neox_model *m, int i) {
    const neox_acts *a = m->acts;
    if (neox_model_recompute_store(&m->desc)) return a->gather;
    return neox_act_at(m, a->x, (size_t)i * neox_model_stream_rows(m) * m->desc.hidden_size);
}

float *neox_model_stage_out(const neox_model *m) {
    const neox_acts *a = m->acts;
    if (neox_model_recompute_store(&m->desc)) return a->x;
    return neox_act_at(m, a->x, (size_t)neox_model_shard(&m->desc).L * neox_model_stream_rows(m) * m->desc.hidden_size);
}

void neox_model_keep_recompute_input(neox_model *m, int i) {
    neox_acts *a = m->acts;
    size_t n = piece_floats(m);
    float *dst = neox_act_at(m, a->kept, (size_t)i * n);
    const float *src = neox_act_at(m, a->gather, piece_start(m));
    if (m->desc.recompute_inputs_on_host) m->be->to_host(dst, src, neox_model_act_bytes(m, n));
    else m->be->copy(dst, src, neox_model_act_bytes(m, n));
}

void neox_model_fetch_recompute_input(neox_model *m, int i) {
    neox_acts *a = m->acts;
    size_t n = piece_floats(m);
    const float *src = neox_act_at(m, a->kept, (size_t)i * n);
    float *dst = neox_act_at(m, a->gather, piece_start(m));
    if (m->desc.recompute_inputs_on_host) m->be->to_device(dst, src, neox_model_act_bytes(m, n));
    else m->be->copy(dst, src, neox_model_act_bytes(m, n));
    if (neox_model_recompute_ways(&m->desc) > 1) neox_allgatherv_inplace(m->tp, a->gather, a->gather_counts, neox_dtype_of_elem(m->act_elem));
}
