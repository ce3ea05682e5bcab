// test_core.c: unit tests of lib/core: errors and bug reports (neox_assert, neox_bug), atomic files
// (also against symlinks planted at temporary names, name collisions and no random source), timers,
// formatting, file reading and a file's CRC-32.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <stdlib.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core.h"


static void test_fail_sets_message_and_status(void **state) {
    (void)state;
    neox_error err = {0};
    assert_int_equal(neox_fail(&err, NEOX_EXIT_USAGE, "key %s: bad", "hidden_size"), -1);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_string_equal(err.message, "key hidden_size: bad");
    neox_fail_context(&err, "a.yml:%d", 3);
    assert_string_equal(err.message, "a.yml:3: key hidden_size: bad");
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    neox_error_clear(&err);
    assert_int_equal(err.status, 0);
    assert_int_equal(neox_fail(NULL, 1, "ignored"), -1);  // NULL err is allowed
}

static void test_atomic_write_replaces_whole_file(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = neox_asprintf("%s/out.txt", tmpdir);
    assert_int_equal(neox_atomic_write(path, "first", 5, &err), 0);
    assert_int_equal(neox_atomic_write(path, "second!", 7, &err), 0);
    size_t size = 0;
    char *data = neox_read_file(path, &size, &err);
    assert_non_null(data);
    assert_int_equal(size, 7);
    assert_string_equal(data, "second!");
    free(data);
    free(path);
}

static void test_atomic_abort_leaves_nothing(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = neox_asprintf("%s/aborted.txt", tmpdir);
    neox_atomic_file *af = neox_atomic_open(path, &err);
    assert_non_null(af);
    char *tmp = neox_strdup(af->tmp_path);
    fputs("partial", af->fp);
    struct stat st;
    assert_int_equal(stat(tmp, &st), 0);       // content goes to the temporary name
    assert_int_not_equal(stat(path, &st), 0);  // never to the final one before commit
    neox_atomic_abort(af);
    assert_int_not_equal(stat(tmp, &st), 0);
    assert_int_not_equal(stat(path, &st), 0);
    free(tmp);
    free(path);
}

static void test_atomic_open_in_missing_directory_fails(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = neox_asprintf("%s/no/such/dir/file", tmpdir);
    assert_null(neox_atomic_open(path, &err));
    assert_int_equal(err.status, NEOX_EXIT_FAILURE);
    assert_non_null(strstr(err.message, "no/such/dir/file: cannot create"));
    assert_non_null(strstr(err.message, "No such file or directory"));
    free(path);
}

// A file written in place (an appended log) where a symlink was planted: refused naming the file,
// and the symlink's target is untouched.
static void test_output_opened_in_place_follows_no_symlink(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = tmp_path("log.jsonl"), *target = tmp_path("log_target.txt");
    assert_int_equal(neox_atomic_write(target, "precious", 8, &err), 0);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(neox_open_output(path, O_APPEND, &err), -1);
    assert_non_null(strstr(err.message, path));
    assert_non_null(strstr(err.message, "symbolic link"));
    size_t size;
    char *data = neox_read_file(target, &size, &err);
    assert_string_equal(data, "precious");
    free(data);
    unlink(path);
    int fd = neox_open_output(path, O_APPEND, &err);  // a plain file: created, then appended to
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "a", 1), 1);
    close(fd);
    fd = neox_open_output(path, O_APPEND, &err);
    assert_int_equal(write(fd, "b", 1), 1);
    close(fd);
    data = neox_read_file(path, &size, &err);
    assert_string_equal(data, "ab");
    free(data);
    assert_int_equal(neox_open_output(path, O_EXCL, &err), -1);  // exclusive: an existing file is refused
    assert_non_null(strstr(err.message, path));
    free(target);
    free(path);
}

// The temporary name a writer of path used before names became unpredictable: a symlink planted
// there must not redirect the write.
static void test_symlink_at_old_temporary_name_is_not_followed(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = neox_asprintf("%s/victim_out.txt", tmpdir), *target = neox_asprintf("%s/precious.txt", tmpdir);
    char *planted = neox_asprintf("%s.tmp.%ld", path, (long)getpid());
    assert_int_equal(neox_atomic_write(target, "precious", 8, &err), 0);
    assert_int_equal(symlink(target, planted), 0);
    assert_int_equal(neox_atomic_write(path, "output", 6, &err), 0);
    size_t size;
    char *data = neox_read_file(target, &size, &err);
    assert_string_equal(data, "precious");
    free(data);
    data = neox_read_file(path, &size, &err);
    assert_string_equal(data, "output");
    free(data);
    unlink(planted);
    free(planted);
    free(target);
    free(path);
}

// A fill that gives the same random bytes on its first two calls, then others: the first name is
// taken by a planted symlink, so creation must retry under another name.
static int fill_calls;
static int repeating_fill(unsigned char *buf, size_t n) {
    memset(buf, fill_calls++ < 2 ? 'a' : 'b', n);
    return 0;
}

// A broken invariant is a bug report, not an error: it names the file and line, asks for a report
// and aborts (SIGABRT, a core dump) instead of going through the exit hook a tool installed.
static void exit_hook_exits_quietly(int status) { _exit(status + 100); }

static void failing_assert(void) {
    neox_set_progname("neox-test");
    neox_set_exit_hook(exit_hook_exits_quietly);
    int layers = 3;
    neox_assert(layers % 2 == 0, "%d layers cannot be split in two", layers);
}
static const int failing_assert_line = __LINE__ - 2;

static void named_bug(void) {
    neox_set_progname("neox-test");
    neox_bug("key '%s' is not in the schema", "hidden_size");
}
static const int named_bug_line = __LINE__ - 2;

static void test_failed_assert_is_a_bug_report(void **state) {
    (void)state;
    char where[64];
    snprintf(where, sizeof where, "test_core.c:%d", failing_assert_line);
    const char *want[] = {"neox-test: internal error: 3 layers cannot be split in two (a bug in neox.c; please report)",
                          where};
    child_dies(failing_assert, SIGABRT, want, 2);
}

static void test_named_bug_is_a_bug_report(void **state) {
    (void)state;
    char where[64];
    snprintf(where, sizeof where, "test_core.c:%d", named_bug_line);
    const char *want[] = {"internal error: key 'hidden_size' is not in the schema (a bug in neox.c; please report)",
                          where};
    child_dies(named_bug, SIGABRT, want, 2);
}

// A check that holds costs nothing and evaluates its condition once.
static void test_passing_assert_evaluates_once(void **state) {
    (void)state;
    int calls = 0;
    neox_assert(++calls == 1, "evaluated %d times", calls);
    assert_int_equal(calls, 1);
}

// A random source that has nothing to give (getrandom failing) is an error naming the file.
static int failing_fill(unsigned char *buf, size_t n) {
    (void)buf, (void)n;
    errno = ENOSYS;
    return -1;
}

static void test_temporary_without_random_bytes_is_an_error(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = neox_asprintf("%s/norandom.txt", tmpdir), *tmp = NULL;
    assert_int_equal(neox_temp_create_with(path, failing_fill, &tmp, &err), -1);
    assert_null(tmp);
    assert_int_equal(err.status, NEOX_EXIT_FAILURE);
    assert_non_null(strstr(err.message, path));
    assert_non_null(strstr(err.message, "no random bytes"));
    free(path);
}

static void test_temporary_name_collision_retries(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = neox_asprintf("%s/collide.txt", tmpdir), *target = neox_asprintf("%s/collide_target", tmpdir);
    char *first = NULL, *second = NULL;
    fill_calls = 0;
    int fd = neox_temp_create_with(path, repeating_fill, &first, &err);
    assert_true(fd >= 0);
    close(fd);
    unlink(first);  // the name is free again; plant a symlink there
    assert_int_equal(symlink(target, first), 0);
    fd = neox_temp_create_with(path, repeating_fill, &second, &err);  // the same first draw
    assert_true(fd >= 0);
    assert_string_not_equal(first, second);
    assert_int_equal(write(fd, "x", 1), 1);
    close(fd);
    struct stat st;
    assert_int_not_equal(lstat(target, &st), 0);  // the symlink's target was never created
    assert_int_equal(lstat(first, &st), 0);
    assert_true(S_ISLNK(st.st_mode));  // and the symlink itself is untouched
    assert_int_equal(fill_calls, 3);
    neox_cleanup_unregister(first);
    neox_cleanup_unregister(second);
    unlink(first);
    unlink(second);
    free(first);
    free(second);
    free(target);
    free(path);
}

// A temporary left by a process that is no longer running is removed by the next writer beside it;
// one of a running process (this one) is kept.
static void test_stale_temporaries_of_dead_processes_removed(void **state) {
    (void)state;
    char host[64];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    long dead = 0;
    for (long p = 32767; p > 300 && !dead; p--)
        if (kill((pid_t)p, 0) != 0 && errno == ESRCH) dead = p;
    assert_true(dead > 0);
    char *stale = neox_asprintf("%s/data.bin.tmp.%ld.Xy12Zw.%s", tmpdir, dead, host);
    char *live = neox_asprintf("%s/data.bin.tmp.%ld.Xy12Zw.%s", tmpdir, (long)getpid(), host);
    char *other_host = neox_asprintf("%s/data.bin.tmp.%ld.Xy12Zw.%s-elsewhere", tmpdir, dead, host);
    neox_error err = {0};
    char *paths[] = {stale, live, other_host};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(paths[i], "w");
        assert_non_null(f);
        fclose(f);
    }
    assert_int_equal(neox_cleanup_stale(tmpdir), 1);
    struct stat st;
    assert_int_not_equal(stat(stale, &st), 0);
    assert_int_equal(stat(live, &st), 0);
    assert_int_equal(stat(other_host, &st), 0);
    (void)err;
    for (int i = 0; i < 3; i++) {
        unlink(paths[i]);
        free(paths[i]);
    }
}

static void test_read_missing_file_names_it(void **state) {
    (void)state;
    neox_error err = {0};
    assert_null(neox_read_file("/nonexistent/neox.yml", NULL, &err));
    assert_string_equal(err.message, "/nonexistent/neox.yml: No such file or directory");
}

// A file's CRC-32 is the standard CRC-32 (its published check value: "123456789" -> CBF43926),
// the same over a file longer than the streaming buffer as over its bytes in memory, and an error
// naming a file that is missing.
static void test_file_crc32(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = tmp_path("check.txt");
    assert_int_equal(neox_atomic_write(path, "123456789", 9, &err), 0);
    uint64_t bytes = 0;
    uint32_t crc = 0;
    assert_int_equal(neox_file_crc32(path, &bytes, &crc, &err), 0);
    assert_int_equal(bytes, 9);
    assert_int_equal(crc, 0xCBF43926u);

    size_t n = 3 * (1 << 20) + 12345;  // three buffers and a part
    unsigned char *big = neox_malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
    assert_int_equal(neox_atomic_write(path, big, n, &err), 0);
    assert_int_equal(neox_file_crc32(path, &bytes, &crc, &err), 0);
    assert_int_equal(bytes, n);
    assert_int_equal(crc, (uint32_t)crc32_z(0L, big, n));
    free(big);

    char *missing = tmp_path("missing.bin");
    assert_int_equal(neox_file_crc32(missing, &bytes, &crc, &err), -1);
    assert_int_equal(err.status, NEOX_EXIT_FAILURE);
    assert_non_null(strstr(err.message, missing));
    free(missing);
    free(path);
}

static void test_timer_accumulates(void **state) {
    (void)state;
    neox_timer t;
    neox_timer_reset(&t);
    neox_timer_start(&t);
    usleep(20000);
    double dt = neox_timer_stop(&t);
    assert_true(dt >= 0.019 && dt < 1.0);
    neox_timer_start(&t);
    usleep(10000);
    neox_timer_stop(&t);
    assert_int_equal(t.count, 2);
    assert_true(neox_timer_seconds(&t) >= 0.029);
    assert_true(neox_timer_stop(&t) == 0.0);  // stopping a stopped timer adds nothing
    assert_int_equal(t.count, 2);
}

static void test_format_duration_and_count(void **state) {
    (void)state;
    char buf[32];
    assert_string_equal(neox_format_duration(6.72, buf, sizeof buf), "6.7s");
    assert_string_equal(neox_format_duration(245, buf, sizeof buf), "4m05s");
    assert_string_equal(neox_format_duration(3723, buf, sizeof buf), "1h02m03s");
    assert_string_equal(neox_format_duration(-1, buf, sizeof buf), "?");
    assert_string_equal(neox_format_count(999, buf, sizeof buf), "999");
    assert_string_equal(neox_format_count(1234567, buf, sizeof buf), "1.23M");
    assert_string_equal(neox_format_count(45600, buf, sizeof buf), "45.6k");
}

static void test_asprintf_and_strndup(void **state) {
    (void)state;
    char *s = neox_asprintf("%s-%d", "layer", 12);
    assert_string_equal(s, "layer-12");
    free(s);
    s = neox_strndup("abcdef", 3);
    assert_string_equal(s, "abc");
    free(s);
}

// Off a terminal the progress bar prints plain lines: a final one always, with the total, the rate
// and the elapsed time.
static void test_progress_plain_lines(void **state) {
    (void)state;
    char *path = neox_asprintf("%s/progress.txt", tmpdir);
    fflush(stderr);
    int saved = dup(fileno(stderr));
    assert_non_null(freopen(path, "w", stderr));
    neox_progress *p = neox_progress_start("encode", 200, "docs");
    neox_progress_update(p, 50, NULL);  // within the interval: nothing printed
    neox_progress_finish(p, 200, "3.0 MB/s");
    fflush(stderr);
    dup2(saved, fileno(stderr));
    close(saved);
    neox_error err = {0};
    char *text = neox_read_file(path, NULL, &err);
    assert_non_null(text);
    assert_non_null(strstr(text, "encode: 200/200 docs (100.0%), "));
    assert_non_null(strstr(text, "docs/s, 3.0 MB/s, "));
    assert_null(strchr(text, '\r'));           // no redraws in a log file
    assert_ptr_equal(strchr(text, '\n'), strrchr(text, '\n'));  // exactly one line
    free(text);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fail_sets_message_and_status),
        cmocka_unit_test(test_atomic_write_replaces_whole_file),
        cmocka_unit_test(test_atomic_abort_leaves_nothing),
        cmocka_unit_test(test_atomic_open_in_missing_directory_fails),
        cmocka_unit_test(test_symlink_at_old_temporary_name_is_not_followed),
        cmocka_unit_test(test_output_opened_in_place_follows_no_symlink),
        cmocka_unit_test(test_temporary_name_collision_retries),
        cmocka_unit_test(test_temporary_without_random_bytes_is_an_error),
        cmocka_unit_test(test_failed_assert_is_a_bug_report),
        cmocka_unit_test(test_named_bug_is_a_bug_report),
        cmocka_unit_test(test_passing_assert_evaluates_once),
        cmocka_unit_test(test_stale_temporaries_of_dead_processes_removed),
        cmocka_unit_test(test_read_missing_file_names_it),
        cmocka_unit_test(test_file_crc32),
        cmocka_unit_test(test_timer_accumulates),
        cmocka_unit_test(test_format_duration_and_count),
        cmocka_unit_test(test_asprintf_and_strndup),
        cmocka_unit_test(test_progress_plain_lines),
    };
    return cmocka_run_group_tests_name("core", tests, make_tmpdir, remove_tmpdir);
}
