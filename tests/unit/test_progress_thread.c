// test_progress_thread.c: the communication progress thread (lib/parallel/progress_thread.c): it
// calls its function only while armed, never while its owner holds the mutex, counts its polls,
// stops while armed or not, and stopping NULL is a no-op.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <time.h>

#include "parallel.h"

typedef struct {
    int64_t calls;
    int inside;      // set while the function runs
    int overlapped;  // the function found the owner inside its critical section
    int owner_inside;
} probe;

static void poll_fn(void *ctx) {
    probe *p = ctx;
    p->inside = 1;
    if (p->owner_inside) p->overlapped = 1;
    p->calls++;
    p->inside = 0;
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static int64_t calls(neox_progress_thread *t, probe *p) {
    neox_progress_thread_lock(t);
    int64_t n = p->calls;
    neox_progress_thread_unlock(t);
    return n;
}

// Waits (up to 10 s: a loaded machine) until the thread has polled more than `than` times.
static int64_t wait_for_calls(neox_progress_thread *t, probe *p, int64_t than) {
    for (int i = 0; i < 10000 && calls(t, p) <= than; i++) sleep_ms(1);
    return calls(t, p);
}

static void test_polls_only_while_armed(void **state) {
    (void)state;
    probe p = {0};
    neox_progress_thread *t = neox_progress_thread_start(poll_fn, &p, 100e-6);
    sleep_ms(30);
    assert_int_equal(calls(t, &p), 0);  // never armed
    neox_progress_thread_lock(t);
    neox_progress_thread_arm(t);
    neox_progress_thread_unlock(t);
    int64_t armed = wait_for_calls(t, &p, 3);
    assert_true(armed > 3);
    neox_progress_thread_lock(t);
    neox_progress_thread_disarm(t);
    int64_t at_disarm = p.calls;
    assert_int_equal(neox_progress_thread_polls(t), at_disarm);
    neox_progress_thread_unlock(t);
    sleep_ms(30);
    assert_int_equal(calls(t, &p), at_disarm);  // disarmed under the lock: no call after it
    neox_progress_thread_lock(t);
    neox_progress_thread_arm(t);  // and armed again, it resumes
    neox_progress_thread_unlock(t);
    assert_true(wait_for_calls(t, &p, at_disarm) > at_disarm);
    neox_progress_thread_stop(t);  // while armed
}

static void test_owner_lock_excludes_the_function(void **state) {
    (void)state;
    probe p = {0};
    neox_progress_thread *t = neox_progress_thread_start(poll_fn, &p, 0.0);  // polls back to back
    neox_progress_thread_lock(t);
    neox_progress_thread_arm(t);
    neox_progress_thread_unlock(t);
    int64_t seen = 0;
    for (int i = 0; i < 2000; i++) {
        neox_progress_thread_lock(t);
        p.owner_inside = 1;
        assert_int_equal(p.inside, 0);
        seen = p.calls;
        p.owner_inside = 0;
        neox_progress_thread_unlock(t);
    }
    assert_true(wait_for_calls(t, &p, seen) > seen);
    neox_progress_thread_stop(t);
    assert_int_equal(p.overlapped, 0);
}

static void test_stop_unarmed_and_null(void **state) {
    (void)state;
    probe p = {0};
    neox_progress_thread_stop(neox_progress_thread_start(poll_fn, &p, 1e-3));
    assert_int_equal(p.calls, 0);
    neox_progress_thread_stop(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_polls_only_while_armed),
        cmocka_unit_test(test_owner_lock_excludes_the_function),
        cmocka_unit_test(test_stop_unarmed_and_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
