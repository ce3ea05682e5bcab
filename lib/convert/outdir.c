// outdir.c: output directories that appear complete or not at all. A conversion writes into a
// temporary directory beside the final one (lib/core/atomic_file.c: an unpredictable name; one a
// killed conversion left is removed by the next) and renames it to its final name only after
// every file in it is closed and fsynced, so an interrupted conversion never leaves a folder that
// looks like a finished one.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert.h"

char *neox_cvt_outdir_begin(const char *final_path, neox_error *err) {
    struct stat st;
    if (stat(final_path, &st) == 0) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s already exists; give a new output path", final_path);
        return NULL;
    }
    return neox_temp_dir_create(final_path, err);
}

int neox_cvt_outdir_commit(const char *tmp, const char *final_path, neox_error *err) {
    if (rename(tmp, final_path) != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "cannot rename %s to %s: %s", tmp, final_path, strerror(errno));
    return neox_fsync_dir_of(final_path, err);
}

void neox_cvt_outdir_abort(const char *tmp) { neox_remove_tree(tmp); }
