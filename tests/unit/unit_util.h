// unit_util.h: fixtures the cmocka unit tests share: a temporary directory per test group
// (cmocka group setup/teardown) and small file helpers. Include after <cmocka.h>.
#ifndef NEOX_UNIT_UTIL_H
#define NEOX_UNIT_UTIL_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
