// hdf5_util.c: HDF5 error handling shared by the checkpoint reader and writer: HDF5's own stack
// printing is switched off and its innermost message goes into our error text instead, with the
// operating system's error ("No space left on device") when HDF5's stack records one.
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hdf5_util.h"

typedef struct {
    char outer[120], inner[120];
    int sys_errno;  // "errno = N" in a message of the stack (the sec2 driver's I/O failures)
} error_ends;

// Walking downward goes from the API call to where the error was detected: keep both ends.
static herr_t keep_ends(unsigned n, const H5E_error2_t *e, void *data) {
    error_ends *ends = data;
    const char *desc = e->desc && *e->desc ? e->desc : "HDF5 error";
    if (n == 0) snprintf(ends->outer, sizeof ends->outer, "%s", desc);
    snprintf(ends->inner, sizeof ends->inner, "%s", desc);
    const char *at = strstr(desc, "errno = ");
    if (at && !ends->sys_errno) ends->sys_errno = atoi(at + 8);
    return 0;
}

// HDF5 prints its own error stacks unless told not to; we report its innermost message instead.
// Its atexit shutdown is switched off too: after a failed H5Fclose (a full disk) the shutdown
// flushes the half-closed file again and crashes, and a process ending has nothing to release.
void neox_hdf5_quiet(void) {
    static int done;
    if (done) return;
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    done = 1;
}

const char *neox_hdf5_error(char *buf) {
    error_ends ends = {"", "", 0};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_ends, &ends);
    if (ends.sys_errno > 0) snprintf(buf, 256, "%s (%s)", strerror(ends.sys_errno), ends.outer);
    else if (!ends.outer[0]) snprintf(buf, 256, "HDF5 error");
    else if (!strcmp(ends.outer, ends.inner)) snprintf(buf, 256, "%s", ends.outer);
    else snprintf(buf, 256, "%s (%s)", ends.outer, ends.inner);
    return buf;
}
