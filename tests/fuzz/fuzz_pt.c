// fuzz_pt.c: a PyTorch .pt file (torch.save's zip + pickle) through lib/torch_pt.h as neox-convert
// from-neox opens one: the container, the unpickler, the storage checks, then every tensor read
// in full (floats also converted to fp32) and the lookups from-neox makes. An input that is not a
// zip (no "PK" magic) goes to the unpickler alone, as a data.pkl: a zip's CRC-32 stops most
// mutations of a pickle inside it, so the pickle seeds are kept bare too.
#include "fuzz_util.h"
#include "torch_pt.h"

static void read_tensors(neox_pt_file *f) {
    neox_pt_tensor **tensors;
    int n = neox_pt_tensors(f, &tensors);
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)neox_pt_numel(tensors[i]);
        // A checked tensor lies inside its storage, whose entry the input holds (at most ~1000x
        // deflated): its size is bounded by the input, so this allocation is too.
        unsigned char *raw = neox_malloc(numel * neox_pt_dtype_size(tensors[i]->dtype) + 1);
        float *f32 = neox_malloc(numel * sizeof *f32 + 1);
        neox_error err = {0};
        (void)neox_pt_read(f, tensors[i], raw, &err);
        (void)neox_pt_read_f32(f, tensors[i], "tensor", f32, &err);
        free(f32);
        free(raw);
    }
}

static void unpickle_only(const uint8_t *data, size_t size) {
    neox_error err = {0};
    neox_pt_arena *arena;
    neox_pt_value *root = neox_pt_unpickle(data, size, "data.pkl", &arena, &err);
    if (root) {
        (void)neox_pt_find(root, "module.0.x");
        neox_pt_arena_free(arena);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || data[0] != 'P' || data[1] != 'K') {
        unpickle_only(data, size);
        return 0;
    }
    char *path = fuzz_write("model_states.pt", data, size);
    neox_error err = {0};
    neox_pt_file *f = neox_pt_open(path, &err);
    if (f) {
        read_tensors(f);
        const neox_pt_value *root = neox_pt_root(f);
        int64_t i;
        double x;
        (void)neox_pt_integer(f, neox_pt_find(root, "iteration"), "iteration", &i, &err);
        (void)neox_pt_number(f, neox_pt_find(root, "optimizer_state_dict.loss_scaler.cur_scale"), "scale", &x, &err);
        (void)neox_pt_find(root, "optimizer.param_groups.0.lr");
        neox_pt_close(f);
    }
    free(path);
    return 0;
}
