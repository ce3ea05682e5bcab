// cache_identity.c: what ties a sample-index cache to the dataset it was built from. GPT-NeoX
// names its caches by the data prefix and the index parameters only, so re-preprocessing another
// corpus under the same prefix would have the old index served for the new data. Beside the
// three .npy files (kept byte-identical to GPT-NeoX's) neox.c writes {cache}_identity.json: the
// sizes of the .idx and .bin, their item and document counts, and the .idx's CRC-32 (every
// document's length: any change of the corpus changes it). See docs/data.md, "Index caches".
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data.h"

#define IDENTITY_FORMAT "neox.c sample index identity"

static char *identity_path(const char *base) { return neox_asprintf("%s_identity.json", base); }

// The identity of ds as a JSON object (NULL + err when its files cannot be read).
static json_t *identity_of(const neox_indexed_dataset *ds, neox_error *err) {
    uint64_t idx_bytes;
    uint32_t idx_crc32;
    struct stat bin;
    if (neox_file_crc32(ds->idx_path, &idx_bytes, &idx_crc32, err) != 0) return NULL;
    if (stat(ds->bin_path, &bin) != 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot stat", ds->bin_path);
        return NULL;
    }
    return json_pack("{s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:I}", "format", IDENTITY_FORMAT, "version", 1, "idx_bytes",
                     (json_int_t)idx_bytes, "idx_crc32", (json_int_t)idx_crc32, "bin_bytes", (json_int_t)bin.st_size,
                     "items", (json_int_t)ds->num_items, "documents", (json_int_t)(ds->num_doc_idx - 1), "tokens",
                     (json_int_t)ds->total_tokens);
}

int neox_cache_identity_check(const char *base, const neox_indexed_dataset *ds, neox_cache_identity *result,
                              neox_error *err) {
    char *path = identity_path(base);
    json_t *stored = json_load_file(path, JSON_REJECT_DUPLICATES, NULL), *now = stored ? identity_of(ds, err) : NULL;
    int rc = 0;
    if (!stored) *result = NEOX_CACHE_IDENTITY_ABSENT;
    else if (!now) rc = -1;
    else *result = json_equal(stored, now) ? NEOX_CACHE_IDENTITY_MATCHES : NEOX_CACHE_IDENTITY_DIFFERS;
    json_decref(stored);
    json_decref(now);
    free(path);
    return rc;
}

int neox_cache_identity_write(const char *base, const neox_indexed_dataset *ds, neox_error *err) {
    json_t *id = identity_of(ds, err);
    if (!id) return -1;
    char *text = json_dumps(id, JSON_INDENT(2) | JSON_SORT_KEYS), *path = identity_path(base);
    int rc = neox_atomic_write(path, text, strlen(text), err);
    free(text);
    free(path);
    json_decref(id);
    return rc;
}
