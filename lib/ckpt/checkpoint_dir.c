// checkpoint_dir.c: the directory side of checkpoints: SAVE/global_stepN/ with its shard files and
// manifest.json (layout, iteration, every file with size and CRC-32), written under a temporary
// directory name and switched into place whole (never modifying the directory `latest` names),
// and SAVE/latest, which is replaced atomically only once a checkpoint is complete, then old
// checkpoints are pruned.
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt.h"

#define MANIFEST_FORMAT "neox.c checkpoint"
#define MANIFEST_VERSION 1
#define MAX_WORLD_SIZE (1 << 24)  // ranks a manifest may declare

char *neox_ckpt_dir(const char *save, int64_t iteration) {
    return neox_asprintf("%s/global_step%lld", save, (long long)iteration);
}

void neox_ckpt_shard_name(int rank, char *buf, size_t size) { snprintf(buf, size, "rank_%05d.h5", rank); }

static int make_one_dir(const char *path, neox_error *err) {
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create directory: %s", path, strerror(errno));
}

int neox_ckpt_make_dir(const char *save, int64_t iteration, neox_error *err) {
    if (make_one_dir(save, err) < 0) return -1;
    char *dir = neox_ckpt_dir(save, iteration);
    int rc = make_one_dir(dir, err);
    free(dir);
    return rc;
}

char *neox_ckpt_begin_dir(const char *save, int64_t iteration, neox_error *err) {
    if (make_one_dir(save, err) < 0) return NULL;
    char *dir = neox_ckpt_dir(save, iteration);
    char *tmp = neox_temp_dir_create(dir, err);
    free(dir);
    return tmp;
}

// Puts tmp in place of an existing dir in one step (both names stay valid throughout), so a
// crash leaves either the old complete checkpoint or the new one under the name; tmp then holds
// the old one.
static int exchange_dirs(const char *tmp, const char *dir, neox_error *err) {
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot switch to the new checkpoint: %s", dir, strerror(errno));
    // A file system without the exchange: the old directory is moved aside first, leaving a
    // moment in which the name is missing (a resume then reports it and is rerun).
    char *aside = neox_asprintf("%s.old", tmp);
    int rc = rename(dir, aside) == 0 && rename(tmp, dir) == 0 && rename(aside, tmp) == 0
                 ? 0 : neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot switch to the new checkpoint: %s", dir, strerror(errno));
    free(aside);
    return rc;
}

int neox_ckpt_switch_dir(const char *save, int64_t iteration, const char *tmp, neox_error *err) {
    char *dir = neox_ckpt_dir(save, iteration);
    struct stat st;
    int replacing = lstat(dir, &st) == 0;
    int rc = replacing ? exchange_dirs(tmp, dir, err)
                       : rename(tmp, dir) == 0 ? 0
                       : neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot rename the new checkpoint into place: %s", dir,
                                   strerror(errno));
    if (rc == 0) rc = neox_fsync_dir_of(dir, err);
    if (rc == 0 && replacing) neox_remove_tree(tmp);  // the old checkpoint, now under the temporary name
    free(dir);
    return rc;
}

// ---- manifest ---------------------------------------------------------------------------------

int neox_ckpt_manifest_write(const char *dir, const neox_ckpt_manifest *m, neox_error *err) {
    json_t *files = json_array();
    for (int i = 0; i < m->nfiles; i++) {
        char crc[16];
        snprintf(crc, sizeof crc, "%08x", m->files[i].crc32);
        json_array_append_new(files, json_pack("{s:s, s:i, s:I, s:s}", "name", m->files[i].name, "rank", m->files[i].rank,
                                               "bytes", (json_int_t)m->files[i].bytes, "crc32", crc));
    }
    json_t *root = json_pack("{s:s, s:i, s:I, s:{s:i, s:i, s:i, s:i, s:i}, s:o}", "format", MANIFEST_FORMAT, "version",
                             MANIFEST_VERSION, "iteration", (json_int_t)m->iteration, "layout", "world_size",
                             m->world_size, "pipe_parallel_size", m->pipe_size, "data_parallel_size", m->data_size,
                             "model_parallel_size", m->model_size, "zero_stage", m->zero_stage, "files", files);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    char *path = neox_asprintf("%s/manifest.json", dir);
    size_t len = strlen(text);
    text = neox_realloc(text, len + 2);
    text[len] = '\n';
    int rc = neox_atomic_write(path, text, len + 1, err);
    free(text);
    free(path);
    return rc;
}

static int manifest_int(json_t *obj, const char *key, const char *path, int64_t min, int64_t *out, neox_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < min)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: '%s' is missing or not an integer >= %lld", path, key, (long long)min);
    *out = json_integer_value(v);
    return 0;
}

static int read_file_entry(json_t *f, const char *path, int i, neox_ckpt_file_entry *e, neox_error *err) {
    json_t *name = json_object_get(f, "name"), *crc = json_object_get(f, "crc32");
    int64_t rank = 0, bytes = 0;
    if (!json_is_object(f) || !json_is_string(name) || json_string_length(name) >= sizeof e->name ||
        strchr(json_string_value(name), '/') || !json_is_string(crc))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: files[%d] needs a plain 'name' and a 'crc32' string", path, i);
    if (manifest_int(f, "rank", path, -1, &rank, err) < 0 || manifest_int(f, "bytes", path, 0, &bytes, err) < 0)
        return neox_fail_context(err, "files[%d]", i);
    char *end;
    unsigned long value = strtoul(json_string_value(crc), &end, 16);
    if (*end || json_string_length(crc) != 8)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: files[%d]: crc32 '%s' is not 8 hex digits", path, i,
                         json_string_value(crc));
    snprintf(e->name, sizeof e->name, "%s", json_string_value(name));
    e->rank = (int)rank;
    e->bytes = (uint64_t)bytes;
    e->crc32 = (uint32_t)value;
    return 0;
}

// Every world rank of the layout has exactly one shard file listed: a manifest declaring more
// ranks than it lists would load with pieces missing.
static int check_ranks(const neox_ckpt_manifest *m, const char *path, neox_error *err) {
    unsigned char *seen = neox_calloc((size_t)m->world_size, 1);
    int rc = 0;
    for (int i = 0; i < m->nfiles && rc == 0; i++) {
        int r = m->files[i].rank;
        if (r >= m->world_size)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: files[%d] has rank %d, outside world_size %d", path, i, r, m->world_size);
        else if (r >= 0 && seen[r]++)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: rank %d is listed twice", path, r);
    }
    for (int r = 0; r < m->world_size && rc == 0; r++)
        if (!seen[r])
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: world_size is %d but no shard file of rank %d is listed", path,
                           m->world_size, r);
    free(seen);
    return rc;
}

// Whether world == pipe * data * model, within MAX_WORLD_SIZE; the product of forged sizes could
// overflow int64 before it was compared, so it is multiplied with overflow checks.
static int layout_product_is(int64_t world, int64_t pipe, int64_t data, int64_t model) {
    int64_t product;
    if (__builtin_mul_overflow(pipe, data, &product) || __builtin_mul_overflow(product, model, &product)) return 0;
    return world == product && world <= MAX_WORLD_SIZE;
}

int neox_ckpt_manifest_read(const char *dir, neox_ckpt_manifest *m, neox_error *err) {
    memset(m, 0, sizeof *m);
    char *path = neox_asprintf("%s/manifest.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    int rc = 0;
    int64_t v[6];
    if (!root) {
        rc = errno == ENOENT && jerr.line < 1
                 ? neox_fail(err, NEOX_EXIT_FAILURE, "%s: missing: the checkpoint is incomplete", path)
                 : neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    } else if (!json_is_object(root) || !json_is_string(json_object_get(root, "format")) ||
               strcmp(json_string_value(json_object_get(root, "format")), MANIFEST_FORMAT)) {
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a neox.c checkpoint manifest", path);
    } else {
        json_t *layout = json_object_get(root, "layout"), *files = json_object_get(root, "files");
        int64_t version = 0;
        if (manifest_int(root, "version", path, 1, &version, err) < 0 || manifest_int(root, "iteration", path, 0, &v[0], err) < 0)
            rc = -1;
        else if (version != MANIFEST_VERSION)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: manifest version %lld is not supported (this build reads %d)",
                           path, (long long)version, MANIFEST_VERSION);
        else if (!json_is_object(layout) || !json_is_array(files))
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: 'layout' must be an object and 'files' an array", path);
        else if (manifest_int(layout, "world_size", path, 1, &v[1], err) < 0 ||
                 manifest_int(layout, "pipe_parallel_size", path, 1, &v[2], err) < 0 ||
                 manifest_int(layout, "data_parallel_size", path, 1, &v[3], err) < 0 ||
                 manifest_int(layout, "model_parallel_size", path, 1, &v[4], err) < 0 ||
                 manifest_int(layout, "zero_stage", path, 0, &v[5], err) < 0)
            rc = -1;
        else if (!layout_product_is(v[1], v[2], v[3], v[4]))
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: world_size %lld is not pipe x data x model (%lld x %lld x %lld), "
                           "or above %d ranks", path, (long long)v[1], (long long)v[2], (long long)v[3], (long long)v[4],
                           MAX_WORLD_SIZE);
        else {
            m->iteration = v[0];
            m->world_size = (int)v[1], m->pipe_size = (int)v[2], m->data_size = (int)v[3];
            m->model_size = (int)v[4], m->zero_stage = (int)v[5];
            m->nfiles = (int)json_array_size(files);
            m->files = neox_calloc(m->nfiles, sizeof *m->files);
            for (int i = 0; i < m->nfiles && rc == 0; i++)
                rc = read_file_entry(json_array_get(files, i), path, i, &m->files[i], err);
            if (rc == 0) rc = check_ranks(m, path, err);
        }
    }
    if (rc < 0) neox_ckpt_manifest_free(m);
    json_decref(root);
    free(path);
    return rc;
}

void neox_ckpt_manifest_free(neox_ckpt_manifest *m) {
    free(m->files);
    m->files = NULL;
    m->nfiles = 0;
}

// ---- latest and pruning -----------------------------------------------------------------------

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

// Iterations of every SAVE/global_stepN directory, sorted ascending.
static int64_t *list_checkpoints(const char *save, int *count) {
    *count = 0;
    DIR *d = opendir(save);
    if (!d) return NULL;
    int64_t *its = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "global_step", 11) || !e->d_name[11]) continue;
        long long it = strtoll(e->d_name + 11, &end, 10);
        if (*end || it < 0) continue;
        if (*count == cap) its = neox_realloc(its, (cap = cap ? 2 * cap : 16) * sizeof *its);
        its[(*count)++] = it;
    }
    closedir(d);
    for (int i = 1; i < *count; i++)  // insertion sort: a handful of entries
        for (int j = i; j > 0 && its[j - 1] > its[j]; j--) {
            int64_t t = its[j];
            its[j] = its[j - 1], its[j - 1] = t;
        }
    return its;
}

int neox_ckpt_mark_latest(const char *save, int64_t iteration, int keep_last, neox_error *err) {
    char *path = neox_asprintf("%s/latest", save), *text = neox_asprintf("global_step%lld\n", (long long)iteration);
    int rc = neox_atomic_write(path, text, strlen(text), err);
    free(path);
    free(text);
    if (rc < 0 || keep_last <= 0) return rc;
    int count;
    int64_t *its = list_checkpoints(save, &count);
    // Only directories older than the one just marked are candidates: never remove the latest.
    int older = 0;
    while (older < count && its[older] < iteration) older++;
    for (int i = 0; i + keep_last - 1 < older && rc == 0; i++) {
        char *dir = neox_ckpt_dir(save, its[i]);
        if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot remove old checkpoint: %s", dir, strerror(errno));
        free(dir);
    }
    free(its);
    return rc;
}

int neox_ckpt_read_latest(const char *save, int64_t *iteration, int *found, neox_error *err) {
    *iteration = 0;
    *found = 0;
    char *path = neox_asprintf("%s/latest", save);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) {  // a fresh run: nothing to resume
        free(path);
        return 0;
    }
    size_t size;
    char *text = neox_read_file(path, &size, err);
    int rc = 0;
    if (!text) {
        rc = -1;
    } else {
        char *end;
        long long it = strncmp(text, "global_step", 11) ? -1 : strtoll(text + 11, &end, 10);
        if (it < 0 || end == text + 11 || (*end && strcmp(end, "\n")))
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: expected 'global_stepN', found '%.40s'", path, text);
        else
            *iteration = it, *found = 1;
    }
    free(text);
    free(path);
    return rc;
}
