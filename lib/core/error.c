// error.c: the neox_error record that library calls fill, the tool-level die functions that
// print "<prog>: error: <message>" and exit with the error's status, and the bug report that a
// broken invariant ends with.
#include "core.h"

#include <stdlib.h>
#include <string.h>

static char progname[64] = "neox";
static void (*exit_hook)(int status);

void neox_set_exit_hook(void (*hook)(int status)) { exit_hook = hook; }

_Noreturn void neox_exit(int status) {
    if (exit_hook) exit_hook(status);
    exit(status);
}

void neox_set_progname(const char *argv0) {
    const char *base = argv0 ? strrchr(argv0, '/') : NULL;
    base = base ? base + 1 : argv0;
    if (base && *base) snprintf(progname, sizeof progname, "%s", base);
}

const char *neox_progname(void) { return progname; }

int neox_fail(neox_error *err, int status, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->status = status ? status : NEOX_EXIT_FAILURE;
    return -1;
}

int neox_fail_context(neox_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char context[512], old[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof old);
    // Context first; the old message fills what room is left (truncated rather than dropped).
    size_t n = strlen(context);
    if (n > sizeof err->message - 3) n = sizeof err->message - 3;
    memcpy(err->message, context, n);
    memcpy(err->message + n, ": ", 2);
    size_t room = sizeof err->message - n - 3, len = strnlen(old, sizeof old);
    if (len > room) len = room;
    memcpy(err->message + n + 2, old, len);
    err->message[n + 2 + len] = '\0';
    if (!err->status) err->status = NEOX_EXIT_FAILURE;
    return -1;
}

void neox_error_clear(neox_error *err) {
    if (!err) return;
    err->status = 0;
    err->message[0] = '\0';
}

_Noreturn void neox_die(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    neox_vlog(NEOX_LOG_ERROR, fmt, ap);
    va_end(ap);
    neox_exit(status ? status : NEOX_EXIT_FAILURE);
}

_Noreturn void neox_die_error(const neox_error *err) {
    neox_die(err->status ? err->status : NEOX_EXIT_FAILURE, "%s", err->message[0] ? err->message : "unknown error");
}

_Noreturn void neox_bug_at(const char *file, int line, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    // Straight to stderr, past the log threshold and its locks: the process is in a state no input
    // explains, so as little as possible runs before the abort.
    fprintf(stderr, "%s: internal error: %s (a bug in neox.c; please report) at %s:%d\n", progname, what, file, line);
    fflush(stderr);
    // abort(), not the exit hook: the core dump and SIGABRT say "bug" to whoever looks, and under
    // MPI the launcher sees a rank killed by a signal and ends the job.
    abort();
}
