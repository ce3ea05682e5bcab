// pt_dump.c: reads a PyTorch .pt file with lib/torch_pt.h and prints what it holds as JSON, for the
// oracle test (tests/oracle/test_pt_reader.py) to compare with torch.load: containers as JSON
// (dict keys that are not strings as "<int>N" or "<other>"), tensors as {"dtype", "shape", "hex"}
// with their elements in row-major order, records as {"record": class, "state": {...}}, skipped
// state as {"skipped": global}. Exit 1 with the library's message when the file is refused.
//   pt_dump FILE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"
#include "torch_pt.h"

static json_t *to_json(neox_pt_file *f, const neox_pt_value *v, int depth);

static json_t *tensor_json(neox_pt_file *f, const neox_pt_tensor *t) {
    size_t bytes = (size_t)neox_pt_numel(t) * neox_pt_dtype_size(t->dtype);
    unsigned char *data = neox_malloc(bytes + 1);
    neox_error err = {0};
    if (neox_pt_read(f, t, data, &err) < 0) neox_die_error(&err);
    char *hex = neox_malloc(2 * bytes + 1);
    hex[0] = 0;
    for (size_t i = 0; i < bytes; i++) snprintf(hex + 2 * i, 3, "%02x", data[i]);
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_t *out = json_pack("{s:s, s:o, s:s}", "dtype", neox_pt_dtype_name(t->dtype), "shape", shape, "hex", hex);
    free(hex);
    free(data);
    return out;
}

static char *key_text(const neox_pt_value *k) {
    if (k->kind == NEOX_PT_STR) return neox_strdup(k->str);
    if (k->kind == NEOX_PT_INT) return neox_asprintf("<int>%lld", (long long)k->i);
    return neox_strdup("<other>");
}

static json_t *items_json(neox_pt_file *f, const neox_pt_value *v, int depth) {
    if (v->kind == NEOX_PT_DICT || v->kind == NEOX_PT_RECORD) {
        json_t *o = json_object();
        for (int i = 0; i < v->count; i++) {
            char *k = key_text(v->keys[i]);
            json_object_set_new(o, k, to_json(f, v->items[i], depth + 1));
            free(k);
        }
        return o;
    }
    json_t *a = json_array();
    for (int i = 0; i < v->count; i++) json_array_append_new(a, to_json(f, v->items[i], depth + 1));
    return a;
}

static json_t *to_json(neox_pt_file *f, const neox_pt_value *v, int depth) {
    if (depth > 64) return json_string("<too deep>");
    switch (v->kind) {
    case NEOX_PT_NONE: return json_null();
    case NEOX_PT_BOOL: return json_boolean(v->i);
    case NEOX_PT_INT: return json_integer(v->i);
    case NEOX_PT_FLOAT: return json_real(v->f);
    case NEOX_PT_STR: return json_stringn(v->str, v->len);
    case NEOX_PT_BYTES: {
        char *hex = neox_malloc(2 * v->len + 1);
        hex[0] = 0;
        for (size_t i = 0; i < v->len; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)v->str[i]);
        json_t *o = json_pack("{s:s}", "bytes", hex);
        free(hex);
        return o;
    }
    case NEOX_PT_TUPLE: return json_pack("{s:o}", "tuple", items_json(f, v, depth));
    case NEOX_PT_SET: return json_pack("{s:o}", "set", items_json(f, v, depth));
    case NEOX_PT_LIST:
    case NEOX_PT_DICT: return items_json(f, v, depth);
    case NEOX_PT_TENSOR: return tensor_json(f, v->tensor);
    case NEOX_PT_RECORD: return json_pack("{s:s, s:o}", "record", v->str, "state", items_json(f, v, depth));
    case NEOX_PT_SKIPPED: return json_pack("{s:s}", "skipped", v->str);
    case NEOX_PT_STORAGE:
    case NEOX_PT_GLOBAL: break;
    }
    return json_string("<internal>");
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    if (argc != 2) neox_die(NEOX_EXIT_USAGE, "usage: pt_dump FILE");
    neox_error err = {0};
    neox_pt_file *f = neox_pt_open(argv[1], &err);
    if (!f) neox_die_error(&err);
    json_t *out = to_json(f, neox_pt_root(f), 0);
    json_dumpf(out, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(out);
    neox_pt_close(f);
    return 0;
}
