// unit_util.h: fixtures the cmocka unit tests share: a temporary directory per test group
// (cmocka group setup/teardown), small file helpers and the death test. Include after <cmocka.h>.
#ifndef NEOX_UNIT_UTIL_H
#define NEOX_UNIT_UTIL_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"

static char tmpdir[256];

// Group setup: creates tmpdir.
static inline int make_tmpdir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/neox-unit-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

// Group teardown: removes tmpdir and everything in it.
static inline int remove_tmpdir(void **state) {
    (void)state;
    char *cmd = neox_asprintf("rm -rf '%s'", tmpdir);
    int rc = system(cmd);
    free(cmd);
    return rc;
}

// tmpdir/name, malloc'ed.
static inline char *tmp_path(const char *name) { return neox_asprintf("%s/%s", tmpdir, name); }

// Runs body in a child process (a fault or abort there ends only the child) and asserts that it died
// of signal sig with a message on stderr containing each of want[0, nwant).
static inline void child_dies(void (*body)(void), int sig, const char *const *want, int nwant) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        signal(SIGABRT, SIG_DFL);  // (not the test framework's handler)
        body();                    // (no OpenMP op: its threads do not survive fork)
        _exit(0);
    }
    close(fds[1]);
    char text[512] = "";
    ssize_t n = read(fds[0], text, sizeof text - 1);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), sig);
    assert_true(n > 0);
    for (int i = 0; i < nwant; i++) assert_non_null(strstr(text, want[i]));
}

#endif
