// recompute.c: DeepSpeed's activation-checkpointing switches, as GPT-NeoX's top-level
// keys (partition_activations, checkpoint_in_cpu) or inside the activation_checkpointing dict
// (partition_activations, cpu_checkpointing); either spelling turns a switch on. Each is set on the
// model description when it means something for this run (lib/model/recompute.c keeps the
// checkpointed layer inputs accordingly), and named in a notice with the reason when it does not.
// The other switches are ignored for every run (docs/config.md, "Ignored keys"). Megatron's
// sequence_parallel, which shards the same activations along the sequence, is read here too.
#include <stdlib.h>

#include "internal.h"

// Whether the top-level key or the dict's sub-key is true; names the one set in *name.
static int switch_on(const neox_config *cfg, neox_key_id top, neox_subkey_id sub, const char **name) {
    const neox_value *dict = neox_config_value(cfg, activation_checkpointing);
    const neox_value *v = dict && dict->kind == NEOX_VALUE_MAP ? neox_config_sub_id(cfg, sub) : NULL;
    if (v && v->kind == NEOX_VALUE_BOOL && v->boolean) {
        *name = neox_subkey_specs[sub].name;
        return 1;
    }
    *name = neox_key_specs[top].name;
    return neox_config_bool_id(cfg, top);
}

static void no_effect(const neox_trainer *t, const char *name, const char *why) {
    if (t->rank0 && !t->opts.quiet) neox_notice("config key with no effect in this run: %s (%s)", name, why);
}

void neox_train_setup_recompute(neox_trainer *t, neox_model_desc *desc) {
    const char *name;
    if (switch_on(t->cfg, NEOX_K_partition_activations, NEOX_SK_activation_checkpointing__partition_activations, &name)) {
        if (!desc->checkpoint_activations)
            no_effect(t, name, "it partitions the layer inputs kept by checkpoint_activations, which is false");
        else if (desc->tp_size <= 1)
            no_effect(t, name, "model_parallel_size 1: no tensor-parallel ranks to partition the layer inputs over");
        else desc->partition_recompute_inputs = 1;
    }
    if (switch_on(t->cfg, NEOX_K_checkpoint_in_cpu, NEOX_SK_activation_checkpointing__cpu_checkpointing, &name)) {
        if (!desc->checkpoint_activations)
            no_effect(t, name, "it moves the layer inputs kept by checkpoint_activations, which is false");
        else if (!t->be->on_device)
            no_effect(t, name, "the cpu backend keeps activations in host memory already");
        else desc->recompute_inputs_on_host = 1;
    }
}

int neox_train_setup_sequence_parallel(neox_trainer *t, neox_model_desc *desc, neox_error *err) {
    if (!neox_config_bool(t->cfg, sequence_parallel)) return 0;
    int P = desc->tp_size;
    if (P <= 1) {
        no_effect(t, "sequence_parallel", "model_parallel_size 1: no tensor-parallel ranks to shard the sequence over");
        return 0;
    }
    int T = (int)neox_config_int(t->cfg, seq_length);
    if (T % P != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "key 'sequence_parallel': seq_length %d is not divisible by "
                         "model_parallel_size %d", T, P);
    if (desc->moe_experts > 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "key 'sequence_parallel': not supported with a Mixture of Experts "
                         "(moe_num_experts %d)", desc->moe_experts);
    if (desc->recompute_inputs_on_host)
        return neox_fail(err, NEOX_EXIT_USAGE, "key 'sequence_parallel': not supported with checkpoint_in_cpu");
    if (desc->partition_recompute_inputs) {  // each layer input is this rank's rows already
        no_effect(t, "partition_activations", "sequence_parallel keeps each rank's rows of the layer inputs already");
        desc->partition_recompute_inputs = 0;
    }
    desc->sequence_parallel = 1;
    return 0;
}
