// pt_pickle.c: neox.c's own unpickler for torch.save's data.pkl (lib/torch_pt.h). It is a stack
// machine over protocol 2+ opcodes that builds inert values and never calls anything: a GLOBAL is
// looked up in a fixed table (the globals torch's weights_only loader allows, DeepSpeed's loss
// scalers kept as records of their attributes, numpy's RNG state skipped), and one that is not in it
// ends the read with an error naming it. Every length is checked against the bytes left, so a
// hostile or truncated pickle is an error, never an overread or a huge allocation.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torch_pt.h"

typedef enum {
    G_REBUILD_TENSOR_V2, G_REBUILD_TENSOR, G_REBUILD_PARAMETER, G_ORDERED_DICT, G_SIZE, G_SET, G_FROZENSET,
    G_CODECS_ENCODE, G_STORAGE, G_RECORD_CLASS, G_SKIPPED, G_GETATTR, G_ENUM, G_DTYPE,
} global_id;

typedef struct {
    const char *module, *name;
    global_id id;
    neox_pt_dtype dtype;  // G_STORAGE
} global_entry;

// What a pickle may name. "__builtin__" is how protocol 2 writes "builtins".
static const global_entry allowed_globals[] = {
    {"torch._utils", "_rebuild_tensor_v2", G_REBUILD_TENSOR_V2, 0},
    {"torch._utils", "_rebuild_tensor", G_REBUILD_TENSOR, 0},
    {"torch._utils", "_rebuild_parameter", G_REBUILD_PARAMETER, 0},
    {"collections", "OrderedDict", G_ORDERED_DICT, 0},
    {"torch", "Size", G_SIZE, 0},
    {"builtins", "set", G_SET, 0},
    {"__builtin__", "set", G_SET, 0},
    {"builtins", "frozenset", G_FROZENSET, 0},
    {"__builtin__", "frozenset", G_FROZENSET, 0},
    {"_codecs", "encode", G_CODECS_ENCODE, 0},
    {"torch", "FloatStorage", G_STORAGE, NEOX_PT_F32},
    {"torch", "HalfStorage", G_STORAGE, NEOX_PT_F16},
    {"torch", "BFloat16Storage", G_STORAGE, NEOX_PT_BF16},
    {"torch", "DoubleStorage", G_STORAGE, NEOX_PT_F64},
    {"torch", "LongStorage", G_STORAGE, NEOX_PT_I64},
    {"torch", "IntStorage", G_STORAGE, NEOX_PT_I32},
    {"torch", "ShortStorage", G_STORAGE, NEOX_PT_I16},
    {"torch", "CharStorage", G_STORAGE, NEOX_PT_I8},
    {"torch", "ByteStorage", G_STORAGE, NEOX_PT_U8},
    {"torch", "BoolStorage", G_STORAGE, NEOX_PT_BOOL_DTYPE},
    // torch's dtypes (a DynamicLossScaler keeps one): read as their names, "torch.float16".
    {"torch", "float16", G_DTYPE, 0},
    {"torch", "bfloat16", G_DTYPE, 0},
    {"torch", "float32", G_DTYPE, 0},
    {"torch", "float64", G_DTYPE, 0},
    {"torch", "int64", G_DTYPE, 0},
    // DeepSpeed's fp16 loss scalers: plain attributes (cur_scale, cur_iter, last_overflow_iter, ...).
    {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", G_RECORD_CLASS, 0},
    {"deepspeed.runtime.fp16.loss_scaler", "LossScaler", G_RECORD_CLASS, 0},
    // ZeRO's param_slice_mappings: where each parameter's fragment lies in a rank's partition (numel, start).
    {"deepspeed.utils.tensor_fragment", "fragment_address", G_RECORD_CLASS, 0},
    // DeepSpeed stores its ZeRO stage as an enum member: getattr(ZeroStageEnum, 'optimizer_states'),
    // which is read as the member's number and nothing else (getattr of anything else is refused).
    {"__builtin__", "getattr", G_GETATTR, 0},
    {"builtins", "getattr", G_GETATTR, 0},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", G_ENUM, 0},
    // numpy's RNG state (GPT-NeoX's np_rng_state): neox.c seeds its own generators.
    {"numpy.core.multiarray", "_reconstruct", G_SKIPPED, 0},
    {"numpy.core.multiarray", "scalar", G_SKIPPED, 0},
    {"numpy", "ndarray", G_SKIPPED, 0},
    {"numpy", "dtype", G_SKIPPED, 0},
};

struct neox_pt_arena {
    neox_pt_value **values;
    int nvalues, cap_values;
    neox_pt_storage **storages;
    int nstorages, cap_storages;
    neox_pt_tensor **tensors;
    int ntensors, cap_tensors;
};

typedef struct {
    const unsigned char *data;
    size_t size, pos;
    const char *name;
    neox_pt_arena *arena;
    neox_pt_value **stack;
    size_t depth, cap_stack;
    size_t *marks;
    size_t nmarks, cap_marks;
    neox_pt_value **memo;
    size_t memo_len;   // slots allocated
    size_t memo_count; // slots set (MEMOIZE's next index)
    neox_error *err;
} unpickler;

#define GROW(ptr, n, cap)                                                   \
    do {                                                                    \
        if ((n) >= (cap)) {                                                 \
            (cap) = (cap) ? 2 * (cap) : 16;                                 \
            (ptr) = neox_realloc((ptr), (size_t)(cap) * sizeof *(ptr));     \
        }                                                                   \
    } while (0)

static neox_pt_value *new_value(unpickler *u, neox_pt_kind kind) {
    neox_pt_arena *a = u->arena;
    GROW(a->values, a->nvalues, a->cap_values);
    neox_pt_value *v = neox_calloc(1, sizeof *v);
    v->kind = kind;
    a->values[a->nvalues++] = v;
    return v;
}

static int fail(unpickler *u, const char *fmt, const char *detail) {
    return neox_fail(u->err, NEOX_EXIT_FAILURE, "%s: pickle at byte %zu: %s%s", u->name, u->pos, fmt,
                     detail ? detail : "");
}

static int push(unpickler *u, neox_pt_value *v) {
    GROW(u->stack, u->depth, u->cap_stack);
    u->stack[u->depth++] = v;
    return 0;
}

static neox_pt_value *pop(unpickler *u) {
    size_t floor = u->nmarks ? u->marks[u->nmarks - 1] : 0;
    if (u->depth <= floor) {
        fail(u, "the stack is empty", NULL);
        return NULL;
    }
    return u->stack[--u->depth];
}

static neox_pt_value *top(unpickler *u) {
    size_t floor = u->nmarks ? u->marks[u->nmarks - 1] : 0;
    if (u->depth <= floor) {
        fail(u, "the stack is empty", NULL);
        return NULL;
    }
    return u->stack[u->depth - 1];
}

// The items above the last mark, removed from the stack: *first and *n. -1 without a mark.
static int pop_mark(unpickler *u, neox_pt_value ***first, size_t *n) {
    if (!u->nmarks) return fail(u, "no MARK before a collection", NULL);
    size_t at = u->marks[--u->nmarks];
    *n = u->depth - at;
    *first = *n ? u->stack + at : NULL;  // (a mark on an empty stack: the stack may not exist yet)
    u->depth = at;
    return 0;
}

static const unsigned char *take(unpickler *u, size_t n) {
    if (n > u->size - u->pos) {
        fail(u, "truncated", NULL);
        return NULL;
    }
    const unsigned char *p = u->data + u->pos;
    u->pos += n;
    return p;
}

static int read_uint(unpickler *u, int bytes, uint64_t *out) {
    const unsigned char *p = take(u, (size_t)bytes);
    if (!p) return -1;
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    *out = v;
    return 0;
}

static void add_item(neox_pt_value *c, neox_pt_value *key, neox_pt_value *v) {
    if (c->count == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 4;
        c->items = neox_realloc(c->items, (size_t)c->cap * sizeof *c->items);
        if (c->kind == NEOX_PT_DICT || c->kind == NEOX_PT_RECORD)
            c->keys = neox_realloc(c->keys, (size_t)c->cap * sizeof *c->keys);
    }
    if (key) c->keys[c->count] = key;
    c->items[c->count++] = v;
}

static int is_text(const neox_pt_value *v) { return v && v->kind == NEOX_PT_STR; }

// dict[key] = v, replacing an equal string or integer key as Python would.
static void dict_set(neox_pt_value *d, neox_pt_value *key, neox_pt_value *v) {
    for (int i = 0; i < d->count; i++) {
        neox_pt_value *k = d->keys[i];
        int same = k->kind == key->kind &&
                   ((is_text(k) && k->len == key->len && memcmp(k->str, key->str, k->len) == 0) ||
                    (k->kind == NEOX_PT_INT && k->i == key->i));
        if (same) {
            d->items[i] = v;
            return;
        }
    }
    add_item(d, key, v);
}

static neox_pt_value *new_string(unpickler *u, neox_pt_kind kind, const unsigned char *p, size_t n) {
    neox_pt_value *v = new_value(u, kind);
    v->str = neox_malloc(n + 1);
    memcpy(v->str, p, n);
    v->str[n] = 0;
    v->len = n;
    return v;
}

static int op_string(unpickler *u, neox_pt_kind kind, int len_bytes) {
    uint64_t n;
    if (read_uint(u, len_bytes, &n) < 0) return -1;
    if (n > u->size - u->pos) return fail(u, "truncated string", NULL);
    const unsigned char *p = take(u, (size_t)n);
    return push(u, new_string(u, kind, p, (size_t)n));
}

static int op_int(unpickler *u, int bytes, int is_signed) {
    uint64_t raw;
    if (read_uint(u, bytes, &raw) < 0) return -1;
    neox_pt_value *v = new_value(u, NEOX_PT_INT);
    v->i = is_signed && bytes == 4 ? (int64_t)(int32_t)raw : (int64_t)raw;
    return push(u, v);
}

// LONG1/LONG4: little-endian two's complement of n bytes; neox.c holds what fits 64 bits.
static int op_long(unpickler *u, int len_bytes) {
    uint64_t n;
    if (read_uint(u, len_bytes, &n) < 0) return -1;
    if (n > 8) return fail(u, "an integer wider than 64 bits", NULL);
    const unsigned char *p = take(u, (size_t)n);
    if (!p) return -1;
    uint64_t raw = 0;
    for (int i = (int)n - 1; i >= 0; i--) raw = raw << 8 | p[i];
    if (n > 0 && n < 8 && (p[n - 1] & 0x80)) raw |= ~(uint64_t)0 << (8 * n);
    neox_pt_value *v = new_value(u, NEOX_PT_INT);
    v->i = (int64_t)raw;
    return push(u, v);
}

static int op_float(unpickler *u) {
    const unsigned char *p = take(u, 8);
    if (!p) return -1;
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++) bits = bits << 8 | p[i];  // big-endian
    neox_pt_value *v = new_value(u, NEOX_PT_FLOAT);
    memcpy(&v->f, &bits, 8);
    return push(u, v);
}

static int op_memo_put(unpickler *u, uint64_t index) {
    neox_pt_value *v = top(u);
    if (!v) return -1;
    // An index is at most the number of opcodes, so at most the pickle's size.
    if (index > u->size) return fail(u, "memo index out of range", NULL);
    if (index >= u->memo_len) {
        size_t len = (size_t)index + 1 > 2 * u->memo_len ? (size_t)index + 1 : 2 * u->memo_len;
        u->memo = neox_realloc(u->memo, len * sizeof *u->memo);
        memset(u->memo + u->memo_len, 0, (len - u->memo_len) * sizeof *u->memo);
        u->memo_len = len;
    }
    if (!u->memo[index]) u->memo_count++;
    u->memo[index] = v;
    return 0;
}

static int op_memo_get(unpickler *u, uint64_t index) {
    if (index >= u->memo_len || !u->memo[index]) return fail(u, "memo index not set", NULL);
    return push(u, u->memo[index]);
}

static int op_global(unpickler *u, const char *module, size_t mlen, const char *name, size_t nlen) {
    for (size_t i = 0; i < sizeof allowed_globals / sizeof allowed_globals[0]; i++) {
        const global_entry *g = &allowed_globals[i];
        if (strlen(g->module) == mlen && strlen(g->name) == nlen && memcmp(g->module, module, mlen) == 0 &&
            memcmp(g->name, name, nlen) == 0) {
            neox_pt_value *v = new_value(u, g->id == G_DTYPE ? NEOX_PT_STR : NEOX_PT_GLOBAL);
            v->str = neox_asprintf("%s.%s", g->module, g->name);
            v->len = strlen(v->str);
            v->i = (int64_t)i;
            return push(u, v);
        }
    }
    char *what = neox_asprintf("%.*s.%.*s", (int)(mlen > 200 ? 200 : mlen), module, (int)(nlen > 200 ? 200 : nlen), name);
    neox_fail(u->err, NEOX_EXIT_FAILURE,
              "%s: refuses the global '%s' (not run: a tensor checkpoint holds only tensors, containers, numbers "
              "and strings)", u->name, what);
    free(what);
    return -1;
}

// GLOBAL: "module\nname\n".
static int op_global_text(unpickler *u) {
    const unsigned char *start = u->data + u->pos, *end = u->data + u->size;
    const unsigned char *nl1 = memchr(start, '\n', (size_t)(end - start));
    const unsigned char *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
    if (!nl2) return fail(u, "truncated GLOBAL", NULL);
    u->pos = (size_t)(nl2 + 1 - u->data);
    return op_global(u, (const char *)start, (size_t)(nl1 - start), (const char *)nl1 + 1, (size_t)(nl2 - nl1 - 1));
}

static int op_stack_global(unpickler *u) {
    neox_pt_value *name = pop(u), *module = name ? pop(u) : NULL;
    if (!module) return -1;
    if (!is_text(name) || !is_text(module)) return fail(u, "STACK_GLOBAL of a non-string", NULL);
    return op_global(u, module->str, module->len, name->str, name->len);
}

static const global_entry *global_of(const neox_pt_value *v) {
    return v && v->kind == NEOX_PT_GLOBAL ? &allowed_globals[v->i] : NULL;
}

static neox_pt_value *collection(unpickler *u, neox_pt_kind kind, neox_pt_value **items, size_t n) {
    neox_pt_value *v = new_value(u, kind);
    for (size_t i = 0; i < n; i++) add_item(v, NULL, items[i]);
    return v;
}

// BINPERSID: ('storage', storage type, key, location, numel) -> a storage, one per key.
static int op_persid(unpickler *u) {
    neox_pt_value *pid = pop(u);
    if (!pid) return -1;
    if (pid->kind != NEOX_PT_TUPLE || pid->count < 5 || !is_text(pid->items[0]) || strcmp(pid->items[0]->str, "storage"))
        return fail(u, "a persistent id that is not ('storage', type, key, location, numel)", NULL);
    const global_entry *g = global_of(pid->items[1]);
    if (!g || g->id != G_STORAGE) return fail(u, "a storage of an unknown type", NULL);
    if (!is_text(pid->items[2]) || pid->items[2]->len == 0 || strchr(pid->items[2]->str, '/') ||
        strlen(pid->items[2]->str) != pid->items[2]->len)
        return fail(u, "a storage key that is not a file name", NULL);
    neox_pt_arena *a = u->arena;
    neox_pt_storage *s = NULL;
    for (int i = 0; i < a->nstorages && !s; i++)
        if (strcmp(a->storages[i]->key, pid->items[2]->str) == 0) s = a->storages[i];
    if (s && s->dtype != g->dtype) return fail(u, "storage key used with two dtypes: ", pid->items[2]->str);
    if (!s) {
        s = neox_calloc(1, sizeof *s);
        s->key = neox_strdup(pid->items[2]->str);
        s->dtype = g->dtype;
        GROW(a->storages, a->nstorages, a->cap_storages);
        a->storages[a->nstorages++] = s;
    }
    neox_pt_value *v = new_value(u, NEOX_PT_STORAGE);
    v->storage = s;
    return push(u, v);
}

static int int_tuple(const neox_pt_value *v, int64_t *out, int max) {
    if (!v || (v->kind != NEOX_PT_TUPLE && v->kind != NEOX_PT_LIST) || v->count > max) return -1;
    for (int i = 0; i < v->count; i++) {
        if (v->items[i]->kind != NEOX_PT_INT || v->items[i]->i < 0) return -1;
        out[i] = v->items[i]->i;
    }
    return v->count;
}

// _rebuild_tensor(_v2)(storage, storage_offset, size, stride, ...).
static neox_pt_value *rebuild_tensor(unpickler *u, const neox_pt_value *args) {
    if (args->count < 4 || args->items[0]->kind != NEOX_PT_STORAGE || args->items[1]->kind != NEOX_PT_INT ||
        args->items[1]->i < 0) {
        fail(u, "_rebuild_tensor_v2 with arguments that are not (storage, offset, size, stride, ...)", NULL);
        return NULL;
    }
    neox_pt_tensor *t = neox_calloc(1, sizeof *t);
    neox_pt_arena *a = u->arena;
    GROW(a->tensors, a->ntensors, a->cap_tensors);
    a->tensors[a->ntensors++] = t;
    t->storage = args->items[0]->storage;
    t->dtype = t->storage->dtype;
    t->offset = args->items[1]->i;
    int ndim = int_tuple(args->items[2], t->shape, NEOX_PT_MAX_DIMS);
    int nstride = int_tuple(args->items[3], t->stride, NEOX_PT_MAX_DIMS);
    if (ndim < 0 || nstride != ndim) {
        fail(u, "a tensor whose size and stride are not equal-length tuples of at most 8 sizes", NULL);
        return NULL;
    }
    t->ndim = ndim;
    neox_pt_value *v = new_value(u, NEOX_PT_TENSOR);
    v->tensor = t;
    return v;
}

// The bytes a latin-1 encoding of UTF-8 text gives (each code point below 256 is one byte).
static neox_pt_value *latin1_bytes(unpickler *u, const neox_pt_value *text) {
    unsigned char *out = neox_malloc(text->len + 1);
    size_t n = 0;
    for (size_t i = 0; i < text->len; i++) {
        unsigned char c = (unsigned char)text->str[i];
        if (c < 0x80) out[n++] = c;
        else if ((c & 0xFE) == 0xC2 && i + 1 < text->len && ((unsigned char)text->str[i + 1] & 0xC0) == 0x80)
            out[n++] = (unsigned char)((c & 0x03) << 6 | ((unsigned char)text->str[++i] & 0x3F));
        else {
            free(out);
            fail(u, "_codecs.encode of text that is not latin-1", NULL);
            return NULL;
        }
    }
    neox_pt_value *v = new_string(u, NEOX_PT_BYTES, out, n);
    free(out);
    return v;
}

// getattr(enum class, member name) -> the member's value, for the enums in this table only.
static neox_pt_value *enum_member(unpickler *u, const neox_pt_value *args) {
    static const struct { const char *cls, *member; int64_t value; } members[] = {
        {"deepspeed.runtime.zero.config.ZeroStageEnum", "disabled", 0},
        {"deepspeed.runtime.zero.config.ZeroStageEnum", "optimizer_states", 1},
        {"deepspeed.runtime.zero.config.ZeroStageEnum", "gradients", 2},
        {"deepspeed.runtime.zero.config.ZeroStageEnum", "weights", 3},
    };
    const global_entry *g = args->count == 2 ? global_of(args->items[0]) : NULL;
    if (g && g->id == G_ENUM && is_text(args->items[1]))
        for (size_t i = 0; i < sizeof members / sizeof members[0]; i++)
            if (strcmp(members[i].cls, args->items[0]->str) == 0 && strcmp(members[i].member, args->items[1]->str) == 0) {
                neox_pt_value *v = new_value(u, NEOX_PT_INT);
                v->i = members[i].value;
                return v;
            }
    fail(u, "getattr of something that is not a known enum member", NULL);
    return NULL;
}

// REDUCE: callable(*args) for the allowed callables, as values.
static neox_pt_value *reduce(unpickler *u, const neox_pt_value *fn, const neox_pt_value *args) {
    const global_entry *g = global_of(fn);
    if (!g) {
        fail(u, "REDUCE of something that is not an allowed global", NULL);
        return NULL;
    }
    if (args->kind != NEOX_PT_TUPLE) {
        fail(u, "REDUCE with arguments that are not a tuple: ", fn->str);
        return NULL;
    }
    const neox_pt_value *a0 = args->count ? args->items[0] : NULL;
    switch (g->id) {
    case G_REBUILD_TENSOR_V2:
    case G_REBUILD_TENSOR: return rebuild_tensor(u, args);
    case G_REBUILD_PARAMETER:  // (tensor, requires_grad, hooks): a parameter is its tensor
        if (a0 && a0->kind == NEOX_PT_TENSOR) return (neox_pt_value *)a0;
        break;
    case G_ORDERED_DICT:
        if (!a0) return new_value(u, NEOX_PT_DICT);
        break;
    case G_SIZE:
        if (a0 && (a0->kind == NEOX_PT_TUPLE || a0->kind == NEOX_PT_LIST))
            return collection(u, NEOX_PT_TUPLE, a0->items, (size_t)a0->count);
        break;
    case G_SET:
    case G_FROZENSET:
        if (!a0) return new_value(u, NEOX_PT_SET);
        if (a0->kind == NEOX_PT_LIST || a0->kind == NEOX_PT_TUPLE || a0->kind == NEOX_PT_SET)
            return collection(u, NEOX_PT_SET, a0->items, (size_t)a0->count);
        break;
    case G_CODECS_ENCODE:  // protocol 2's bytes: encode(text, 'latin1'), each code point one byte
        if (a0 && is_text(a0) && args->count == 2 && is_text(args->items[1]) && strcmp(args->items[1]->str, "latin1") == 0)
            return latin1_bytes(u, a0);
        break;
    case G_SKIPPED: {
        neox_pt_value *v = new_value(u, NEOX_PT_SKIPPED);
        v->str = neox_strdup(fn->str);
        return v;
    }
    case G_GETATTR: return enum_member(u, args);
    case G_STORAGE:
    case G_RECORD_CLASS:
    case G_ENUM:
    case G_DTYPE: break;
    }
    fail(u, "REDUCE of an allowed global with arguments it does not take: ", fn->str);
    return NULL;
}

static int op_reduce(unpickler *u) {
    neox_pt_value *args = pop(u), *fn = args ? pop(u) : NULL;
    if (!fn) return -1;
    neox_pt_value *v = reduce(u, fn, args);
    return v ? push(u, v) : -1;
}

// NEWOBJ: cls.__new__(cls, *args) for a data-only class (a record) or skipped state.
static int op_newobj(unpickler *u) {
    neox_pt_value *args = pop(u), *cls = args ? pop(u) : NULL;
    if (!cls) return -1;
    const global_entry *g = global_of(cls);
    if (!g || (g->id != G_RECORD_CLASS && g->id != G_SKIPPED))
        return fail(u, "NEWOBJ of a class that is not a data-only one: ", cls->kind == NEOX_PT_GLOBAL ? cls->str : "?");
    neox_pt_value *v = new_value(u, g->id == G_RECORD_CLASS ? NEOX_PT_RECORD : NEOX_PT_SKIPPED);
    v->str = neox_strdup(cls->str);
    return push(u, v);
}

// BUILD: obj.__setstate__(state); a record takes a dict of attributes (or (dict, slots)).
static int op_build(unpickler *u) {
    neox_pt_value *state = pop(u), *obj = state ? top(u) : NULL;
    if (!obj) return -1;
    if (obj->kind == NEOX_PT_SKIPPED) return 0;
    // A module's state dict (an OrderedDict) carries its modules' versions as _metadata: not needed.
    if (obj->kind == NEOX_PT_DICT && state->kind == NEOX_PT_DICT) return 0;
    if (obj->kind != NEOX_PT_RECORD) return fail(u, "BUILD on an object that is not a data-only record", NULL);
    if (state->kind == NEOX_PT_TUPLE && state->count == 2 && state->items[0]->kind == NEOX_PT_DICT) state = state->items[0];
    if (state->kind != NEOX_PT_DICT) return fail(u, "BUILD of a record with a state that is not a dict: ", obj->str);
    for (int i = 0; i < state->count; i++) dict_set(obj, state->keys[i], state->items[i]);
    return 0;
}

static int op_setitems(unpickler *u, int one) {
    neox_pt_value **items = NULL;
    size_t n = 0;
    neox_pt_value *pair[2];
    if (one) {
        pair[1] = pop(u);
        pair[0] = pair[1] ? pop(u) : NULL;
        if (!pair[0]) return -1;
        items = pair;
        n = 2;
    } else if (pop_mark(u, &items, &n) < 0) {
        return -1;
    }
    neox_pt_value *d = top(u);
    if (!d) return -1;
    if (d->kind != NEOX_PT_DICT) return fail(u, "SETITEM on something that is not a dict", NULL);
    if (n % 2) return fail(u, "SETITEMS with an odd number of items", NULL);
    for (size_t i = 0; i < n; i += 2) {
        if (items[i]->kind != NEOX_PT_STR && items[i]->kind != NEOX_PT_INT) {
            // Keys neox.c never looks up (tuples, floats) are kept in order but never match a lookup.
            add_item(d, items[i], items[i + 1]);
            continue;
        }
        dict_set(d, items[i], items[i + 1]);
    }
    return 0;
}

static int op_appends(unpickler *u, int one, neox_pt_kind kind) {
    neox_pt_value **items = NULL, *single;
    size_t n = 1;
    if (one) {
        if (!(single = pop(u))) return -1;
        items = &single;
    } else if (pop_mark(u, &items, &n) < 0) {
        return -1;
    }
    neox_pt_value *c = top(u);
    if (!c) return -1;
    if (c->kind != kind) return fail(u, kind == NEOX_PT_SET ? "ADDITEMS on something that is not a set"
                                                            : "APPEND on something that is not a list", NULL);
    for (size_t i = 0; i < n; i++) add_item(c, NULL, items[i]);
    return 0;
}

static int op_tuple_of(unpickler *u, int n, neox_pt_kind kind) {
    neox_pt_value *items[3];
    for (int i = n - 1; i >= 0; i--)
        if (!(items[i] = pop(u))) return -1;
    return push(u, collection(u, kind, items, (size_t)n));
}

static int op_mark_collection(unpickler *u, neox_pt_kind kind) {
    neox_pt_value **items = NULL;
    size_t n = 0;
    if (pop_mark(u, &items, &n) < 0) return -1;
    return push(u, collection(u, kind, items, n));
}

static int op_mark(unpickler *u) {
    GROW(u->marks, u->nmarks, u->cap_marks);
    u->marks[u->nmarks++] = u->depth;
    return 0;
}

static int push_simple(unpickler *u, neox_pt_kind kind, int64_t i) {
    neox_pt_value *v = new_value(u, kind);
    v->i = i;
    return push(u, v);
}

// One opcode; 1 at STOP.
static int step(unpickler *u) {
    const unsigned char *p = take(u, 1);
    if (!p) return -1;
    uint64_t n;
    switch (*p) {
    case 0x80: return read_uint(u, 1, &n) < 0 ? -1 : n < 2 ? fail(u, "pickle protocol below 2", NULL) : 0;
    case 0x95: return read_uint(u, 8, &n);  // FRAME: a length hint
    case '.': return 1;
    case '}': return push(u, new_value(u, NEOX_PT_DICT));
    case ']': return push(u, new_value(u, NEOX_PT_LIST));
    case ')': return push(u, new_value(u, NEOX_PT_TUPLE));
    case 0x8f: return push(u, new_value(u, NEOX_PT_SET));
    case 'N': return push_simple(u, NEOX_PT_NONE, 0);
    case 0x88: return push_simple(u, NEOX_PT_BOOL, 1);
    case 0x89: return push_simple(u, NEOX_PT_BOOL, 0);
    case 'K': return op_int(u, 1, 0);
    case 'M': return op_int(u, 2, 0);
    case 'J': return op_int(u, 4, 1);
    case 0x8a: return op_long(u, 1);
    case 0x8b: return op_long(u, 4);
    case 'G': return op_float(u);
    case 'X': return op_string(u, NEOX_PT_STR, 4);
    case 0x8c: return op_string(u, NEOX_PT_STR, 1);
    case 0x8d: return op_string(u, NEOX_PT_STR, 8);
    case 'B': return op_string(u, NEOX_PT_BYTES, 4);
    case 'C': return op_string(u, NEOX_PT_BYTES, 1);
    case 0x8e: return op_string(u, NEOX_PT_BYTES, 8);
    case 'q': return read_uint(u, 1, &n) < 0 ? -1 : op_memo_put(u, n);
    case 'r': return read_uint(u, 4, &n) < 0 ? -1 : op_memo_put(u, n);
    case 0x94: return op_memo_put(u, u->memo_count);
    case 'h': return read_uint(u, 1, &n) < 0 ? -1 : op_memo_get(u, n);
    case 'j': return read_uint(u, 4, &n) < 0 ? -1 : op_memo_get(u, n);
    case '(': return op_mark(u);
    case 't': return op_mark_collection(u, NEOX_PT_TUPLE);
    case 'l': return op_mark_collection(u, NEOX_PT_LIST);
    case 0x91: return op_mark_collection(u, NEOX_PT_SET);
    case 0x85: return op_tuple_of(u, 1, NEOX_PT_TUPLE);
    case 0x86: return op_tuple_of(u, 2, NEOX_PT_TUPLE);
    case 0x87: return op_tuple_of(u, 3, NEOX_PT_TUPLE);
    case 's': return op_setitems(u, 1);
    case 'u': return op_setitems(u, 0);
    case 'a': return op_appends(u, 1, NEOX_PT_LIST);
    case 'e': return op_appends(u, 0, NEOX_PT_LIST);
    case 0x90: return op_appends(u, 0, NEOX_PT_SET);
    case 'c': return op_global_text(u);
    case 0x93: return op_stack_global(u);
    case 'Q': return op_persid(u);
    case 'R': return op_reduce(u);
    case 0x81: return op_newobj(u);
    case 'b': return op_build(u);
    case '0': return pop(u) ? 0 : -1;
    case '2': {
        neox_pt_value *v = top(u);
        return v ? push(u, v) : -1;
    }
    case '1': {
        neox_pt_value **items = NULL;
        size_t k = 0;
        return pop_mark(u, &items, &k);
    }
    default: {
        char what[8];
        snprintf(what, sizeof what, "0x%02x", *p);
        u->pos--;
        return fail(u, "an opcode neox.c does not read (only protocol 2+ opcodes of plain data): ", what);
    }
    }
}

neox_pt_value *neox_pt_unpickle(const unsigned char *data, size_t size, const char *name, neox_pt_arena **arena,
                                neox_error *err) {
    unpickler u = {.data = data, .size = size, .name = name, .err = err};
    u.arena = neox_calloc(1, sizeof *u.arena);
    int status = 0;
    if (size < 2 || data[0] != 0x80) status = fail(&u, "not a pickle of protocol 2 or above", NULL);
    while (status == 0) status = step(&u);
    neox_pt_value *root = status == 1 ? pop(&u) : NULL;
    free(u.stack);
    free(u.marks);
    free(u.memo);
    if (!root) {
        neox_pt_arena_free(u.arena);
        *arena = NULL;
        return NULL;
    }
    *arena = u.arena;
    return root;
}

void neox_pt_arena_free(neox_pt_arena *a) {
    if (!a) return;
    for (int i = 0; i < a->nvalues; i++) {
        free(a->values[i]->str);
        free(a->values[i]->items);
        free(a->values[i]->keys);
        free(a->values[i]);
    }
    for (int i = 0; i < a->nstorages; i++) {
        free(a->storages[i]->key);
        free(a->storages[i]);
    }
    for (int i = 0; i < a->ntensors; i++) free(a->tensors[i]);
    free(a->values);
    free(a->storages);
    free(a->tensors);
    free(a);
}

int neox_pt_arena_storages(const neox_pt_arena *a, neox_pt_storage ***storages) {
    *storages = a->storages;
    return a->nstorages;
}

int neox_pt_arena_tensors(const neox_pt_arena *a, neox_pt_tensor ***tensors) {
    *tensors = a->tensors;
    return a->ntensors;
}
