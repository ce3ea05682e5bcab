// test_trace.c: the range API of a profiled run (lib/core/trace.c, trace_file.c). Without a capture
// nothing is recorded and the sink hears nothing; in one, ranges nest with their depth and times
// inside their parent's, a collective is recorded where it was called, a pop with no push of this
// capture is ignored, a helper thread gets its own track, the sink sees every push, pop and the
// capture's start and stop, and the file written is Chrome trace-event JSON (read back with jansson)
// with one complete event per range, pid the rank, and each collective's group and bytes.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>

#include "unit_util.h"

static int pushes, pops, captures_on, captures_off;
static void count_push(const char *name) { (void)name, pushes++; }
static void count_pop(void) { pops++; }
static void count_capture(int on) { on ? captures_on++ : captures_off++; }
static const neox_trace_sink counting = {count_push, count_pop, count_capture};

static const neox_trace_event *find(const char *name, size_t *n) {
    const neox_trace_event *events = neox_trace_events(n);
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(events[i].name, name)) return &events[i];
    return NULL;
}

static void test_nothing_without_a_capture(void **state) {
    (void)state;
    neox_trace_set_sink(&counting);
    pushes = pops = 0;
    neox_range_push("outside");
    neox_range_pop();
    size_t n;
    neox_trace_events(&n);
    assert_int_equal(n, 0);
    assert_int_equal(pushes + pops, 0);
    neox_trace_set_sink(NULL);
}

static void test_ranges_nest(void **state) {
    (void)state;
    neox_trace_set_sink(&counting);
    pushes = pops = captures_on = captures_off = 0;
    neox_trace_start(neox_now());
    neox_range_pop();  // (opened before the capture: ignored)
    neox_range_push("step 1");
    neox_range_pushf("forward layer %d", 3);
    double t0 = neox_now();
    neox_trace_complete_at("all_reduce", "data", t0, 1e-6, 64, 0);
    neox_range_pop();
    neox_range_pop();
    neox_trace_stop();
    neox_range_push("after");  // (the capture is over)
    neox_range_pop();
    size_t n;
    const neox_trace_event *step = find("step 1", &n), *layer = find("forward layer 3", &n), *comm = find("all_reduce", &n);
    assert_int_equal(n, 3);
    assert_non_null(step), assert_non_null(layer), assert_non_null(comm);
    assert_int_equal(step->depth, 0);
    assert_int_equal(layer->depth, 1);
    assert_int_equal(comm->depth, 2);
    assert_int_equal(comm->kind, NEOX_TRACE_COLLECTIVE);
    assert_string_equal(comm->group, "data");
    assert_true(layer->start >= step->start && layer->start + layer->seconds <= step->start + step->seconds);
    assert_true(comm->start >= layer->start);
    assert_int_equal(step->tid, 0);
    assert_int_equal(pushes, 2);
    assert_int_equal(pops, 2);
    assert_int_equal(captures_on, 1);
    assert_int_equal(captures_off, 1);
    neox_trace_set_sink(NULL);
    neox_trace_free();
}

static void *helper(void *arg) {
    (void)arg;
    neox_trace_complete_at("all_gather", "model", neox_now(), 0.0, 8, 1);
    return NULL;
}

static void test_helper_thread_has_its_own_track(void **state) {
    (void)state;
    neox_trace_start(neox_now());
    neox_range_push("main");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, helper, NULL), 0);
    pthread_join(th, NULL);
    neox_range_pop();
    neox_trace_stop();
    size_t n;
    const neox_trace_event *wait = find("all_gather", &n), *main_range = find("main", &n);
    assert_int_equal(n, 2);
    assert_int_equal(wait->kind, NEOX_TRACE_WAIT);
    assert_int_equal(wait->tid, 1);
    assert_int_equal(wait->depth, 0);  // (the main thread's range is not the helper's)
    assert_int_equal(main_range->tid, 0);
    neox_trace_free();
}

static void test_file_is_trace_event_json(void **state) {
    (void)state;
    neox_trace_start(neox_now());
    neox_range_push("step \"quoted\"");
    neox_trace_complete_at("broadcast", "pipe", neox_now(), 2e-3, 1024, 0);
    neox_range_pop();
    neox_trace_stop();
    char *path = neox_asprintf("%s/trace_rank3.json", tmpdir);
    neox_error err = {0};
    assert_int_equal(neox_trace_write(path, 3, &err), 0);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    assert_non_null(doc);
    json_t *events = json_object_get(doc, "traceEvents");
    int complete = 0, named = 0;
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *e = json_array_get(events, i);
        assert_int_equal(json_integer_value(json_object_get(e, "pid")), 3);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (!strcmp(ph, "M")) {
            named++;
            continue;
        }
        assert_string_equal(ph, "X");
        complete++;
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!strcmp(name, "broadcast pipe")) {
            json_t *args = json_object_get(e, "args");
            assert_string_equal(json_string_value(json_object_get(args, "group")), "pipe");
            assert_int_equal(json_integer_value(json_object_get(args, "bytes")), 1024);
            assert_true(fabs(json_number_value(json_object_get(e, "dur")) - 2000.0) < 1e-3);
        } else {
            assert_string_equal(name, "step _quoted_");
        }
    }
    assert_int_equal(complete, 2);
    assert_true(named >= 2);
    json_decref(doc);
    free(path);
    neox_trace_free();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nothing_without_a_capture),
        cmocka_unit_test(test_ranges_nest),
        cmocka_unit_test(test_helper_thread_has_its_own_track),
        cmocka_unit_test(test_file_is_trace_event_json),
    };
    return cmocka_run_group_tests_name("trace", tests, make_tmpdir, remove_tmpdir);
}
