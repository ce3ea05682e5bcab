// test_torch_pt.c: the .pt writer and reader (lib/torch_pt.h) under ASan/UBSan: a file written with
// every value kind read back exactly (tensors of several dtypes and ranks, nested containers, big
// and negative integers, floats, strings), lookups by path, and hostile pickles refused with a
// message naming the file and what is wrong (a global that is not allowed, a memo index never set,
// a truncated pickle, a protocol-0 pickle, a tensor reaching past its storage). Files torch itself
// writes are tests/oracle/test_pt_reader.py's.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "torch_pt.h"

static char *temp_path(void) {
    char *dir = neox_strdup("/tmp/neox-pt-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char *path = neox_asprintf("%s/model_states.pt", dir);
    free(dir);
    return path;
}

static void remove_file(char *path) {
    unlink(path);
    char *slash = strrchr(path, '/');
    *slash = 0;
    rmdir(path);
    free(path);
}

static void test_round_trip(void **state) {
    (void)state;
    char *path = temp_path();
    neox_error err = {0};
    neox_pt_writer *w = neox_pt_writer_open(path, &err);
    assert_non_null(w);
    float m[6] = {1, -2, 3.5f, 4, 5, 6e-9f};
    int64_t shape[2] = {2, 3}, n4 = 4;
    int64_t ids[4] = {-1, 0, 1LL << 40, 7};
    neox_pt_value *root = neox_pt_new(w, NEOX_PT_DICT), *module = neox_pt_new(w, NEOX_PT_DICT);
    neox_pt_set(w, module, "sequential.0.word_embeddings.weight", neox_pt_new_tensor(w, NEOX_PT_F32, 2, shape, m));
    neox_pt_set(w, root, "module", module);
    neox_pt_set(w, root, "ids", neox_pt_new_tensor(w, NEOX_PT_I64, 1, &n4, ids));
    neox_pt_set(w, root, "iteration", neox_pt_new_int(w, 1LL << 40));
    neox_pt_set(w, root, "negative", neox_pt_new_int(w, -70000));
    neox_pt_set(w, root, "lr", neox_pt_new_float(w, 6e-4));
    neox_pt_set(w, root, "name", neox_pt_new_str(w, "gpt-neox"));
    neox_pt_value *groups = neox_pt_new(w, NEOX_PT_LIST), *betas = neox_pt_new(w, NEOX_PT_TUPLE);
    neox_pt_append(betas, neox_pt_new_float(w, 0.9));
    neox_pt_append(betas, neox_pt_new_float(w, 0.95));
    neox_pt_value *g = neox_pt_new(w, NEOX_PT_DICT);
    neox_pt_set(w, g, "betas", betas);
    neox_pt_append(groups, g);
    neox_pt_set(w, root, "param_groups", groups);
    neox_pt_set(w, root, "empty", neox_pt_new(w, NEOX_PT_LIST));
    neox_pt_set(w, root, "none", neox_pt_new(w, NEOX_PT_NONE));
    assert_int_equal(neox_pt_writer_commit(w, root, &err), 0);

    neox_pt_file *f = neox_pt_open(path, &err);
    if (!f) fail_msg("%s", err.message);
    const neox_pt_value *r = neox_pt_root(f);
    const neox_pt_value *t = neox_pt_find(r, "module.sequential.0.word_embeddings.weight");
    assert_null(t);  // a dotted key is not a path: looked up with neox_pt_get
    t = neox_pt_get(neox_pt_get(r, "module"), "sequential.0.word_embeddings.weight");
    assert_non_null(t);
    assert_int_equal(t->kind, NEOX_PT_TENSOR);
    assert_int_equal(t->tensor->ndim, 2);
    assert_int_equal(t->tensor->shape[1], 3);
    float back[6];
    assert_int_equal(neox_pt_read_f32(f, t->tensor, "w", back, &err), 0);
    assert_memory_equal(back, m, sizeof m);
    int64_t ids_back[4];
    assert_int_equal(neox_pt_read(f, neox_pt_get(r, "ids")->tensor, ids_back, &err), 0);
    assert_memory_equal(ids_back, ids, sizeof ids);
    assert_int_equal(neox_pt_read_f32(f, neox_pt_get(r, "ids")->tensor, "ids", back, &err), -1);
    assert_non_null(strstr(err.message, "int64"));
    int64_t i;
    double x;
    assert_int_equal(neox_pt_integer(f, neox_pt_get(r, "iteration"), "iteration", &i, &err), 0);
    assert_true(i == 1LL << 40);
    assert_int_equal(neox_pt_integer(f, neox_pt_get(r, "negative"), "negative", &i, &err), 0);
    assert_int_equal(i, -70000);
    assert_int_equal(neox_pt_number(f, neox_pt_find(r, "param_groups.0.betas.1"), "beta2", &x, &err), 0);
    assert_true(x == 0.95);
    assert_int_equal(neox_pt_number(f, neox_pt_get(r, "lr"), "lr", &x, &err), 0);
    assert_true(x == 6e-4);
    assert_string_equal(neox_pt_get(r, "name")->str, "gpt-neox");
    assert_int_equal(neox_pt_get(r, "empty")->count, 0);
    assert_int_equal(neox_pt_get(r, "none")->kind, NEOX_PT_NONE);
    assert_int_equal(neox_pt_number(f, neox_pt_get(r, "missing"), "missing", &x, &err), -1);
    assert_non_null(strstr(err.message, "missing"));
    neox_pt_close(f);
    remove_file(path);
}

static void refused(const char *pickle, size_t size, const char *needle) {
    neox_error err = {0};
    neox_pt_arena *arena = NULL;
    neox_pt_value *v = neox_pt_unpickle((const unsigned char *)pickle, size, "evil.pkl", &arena, &err);
    if (v) fail_msg("accepted a pickle that should be refused (%s)", needle);
    if (!strstr(err.message, needle)) fail_msg("message '%s' does not mention '%s'", err.message, needle);
    assert_non_null(strstr(err.message, "evil.pkl"));
}

static void test_hostile_pickles(void **state) {
    (void)state;
    static const char os_system[] = "\x80\x02" "cposix\nsystem\n" "X\x02\x00\x00\x00ls" "\x85R.";
    refused(os_system, sizeof os_system - 1, "posix.system");
    static const char builtins_eval[] = "\x80\x02" "c__builtin__\neval\n" ")R.";
    refused(builtins_eval, sizeof builtins_eval - 1, "__builtin__.eval");
    static const char memo[] = "\x80\x02" "h\x05.";
    refused(memo, sizeof memo - 1, "memo");
    static const char truncated[] = "\x80\x02" "X\xff\x00\x00\x00" "abc";
    refused(truncated, sizeof truncated - 1, "truncated");
    static const char proto0[] = "(dp0\n.";
    refused(proto0, sizeof proto0 - 1, "protocol");
    static const char getattr_os[] = "\x80\x02" "c__builtin__\ngetattr\n" "cdeepspeed.runtime.zero.config\nZeroStageEnum\n"
                                     "X\x08\x00\x00\x00__init__" "\x86R.";
    refused(getattr_os, sizeof getattr_os - 1, "enum member");
    static const char build[] = "\x80\x02" "]}b.";
    refused(build, sizeof build - 1, "BUILD");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hostile_pickles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
