// outdir.c: output directories that appear complete or not at all. A conversion writes into
// "<final>.tmp.<pid>" and renames it to its final name only after every file in it is closed and
// fsynced, so an interrupted conversion never leaves a folder that looks like a finished one.
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert.h"

char *neox_cvt_outdir_begin(const char *final_path, neox_error *err) {
    struct stat st;
    if (stat(final_path, &st) == 0) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s already exists; give a new output path", final_path);
        return NULL;
    }
    char *tmp = neox_asprintf("%s.tmp.%ld", final_path, (long)getpid());
    if (mkdir(tmp, 0777) != 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create directory: %s", tmp, strerror(errno));
        free(tmp);
        return NULL;
    }
    return tmp;
}

int neox_cvt_outdir_commit(const char *tmp, const char *final_path, neox_error *err) {
    if (rename(tmp, final_path) != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "cannot rename %s to %s: %s", tmp, final_path, strerror(errno));
    return neox_fsync_dir_of(final_path, err);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void neox_cvt_outdir_abort(const char *tmp) {
    if (tmp) nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
