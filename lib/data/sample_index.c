// sample_index.c: GPT-NeoX's GPT2Dataset index (gpt2_dataset.py _build_index_mappings and
// helpers.cpp build_sample_idx): which documents, in which shuffled order, make up each sample of
// seq_length + 1 tokens, and in which shuffled order the samples are served. Built with the same
// RandomState draws as GPT-NeoX and cached in .npy files under GPT-NeoX's names and dtypes.
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int neox_pack_impl_parse(const char *name, neox_pack_impl *out) {
    if (!strcmp(name, "packed")) *out = NEOX_PACK_PACKED;
    else if (!strcmp(name, "pack_until_overflow")) *out = NEOX_PACK_UNTIL_OVERFLOW;
    else if (!strcmp(name, "unpacked")) *out = NEOX_PACK_UNPACKED;
    else return -1;
    return 0;
}

const char *neox_pack_impl_name(neox_pack_impl p) {
    return p == NEOX_PACK_PACKED ? "packed" : p == NEOX_PACK_UNTIL_OVERFLOW ? "pack_until_overflow" : "unpacked";
}

static const char *basename_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int neox_num_epochs(int64_t tokens_per_epoch, int seq_length, int64_t num_samples) {
    // -1: samples overlap by one token, except that the last one needs one token of its own.
    int epochs = 0;
    int64_t total = 0;
    do {
        epochs++;
        total += tokens_per_epoch;
    } while ((total - 1) / seq_length < num_samples);
    return epochs;
}

char *neox_sample_index_cache_name(const neox_sample_index_options *o) {
    char *prefix = o->cache_dir ? neox_asprintf("%s/%s", o->cache_dir, basename_of(o->data_prefix)) : neox_strdup(o->data_prefix);
    char *name = neox_asprintf("%s_%s_indexmap_%" PRId64 "ns_%dsl_%" PRIu32 "s_%spi%s", prefix, o->name, o->num_samples,
                               o->seq_length, o->seed, neox_pack_impl_name(o->pack_impl), o->allow_chopped ? "_ac" : "");
    free(prefix);
    return name;
}

// ---------------------------------------------------------------------------------------------
// packed: documents of every epoch shuffled together (int32), samples cut across document ends.

static void build_doc_idx(neox_sample_index *si, const neox_sample_index_options *o, neox_random_state *rs) {
    int64_t ndocs = o->doc_end - o->doc_begin;
    int64_t n = ndocs * si->num_epochs;
    int32_t *docs = neox_malloc((size_t)n * sizeof *docs + 1);
    for (int64_t i = 0; i < n; i++) docs[i] = (int32_t)(o->doc_begin + i % ndocs);
    neox_random_shuffle(rs, docs, n, sizeof *docs);
    si->doc_idx_len = n;
    si->doc_idx = neox_malloc((size_t)n * sizeof *si->doc_idx + 1);
    for (int64_t i = 0; i < n; i++) si->doc_idx[i] = docs[i];
    free(docs);
}

static void build_sample_idx(neox_sample_index *si, const int32_t *sizes, int seq_length, int64_t tokens_per_epoch) {
    int64_t num_samples = (si->num_epochs * tokens_per_epoch - 1) / seq_length;
    si->sample_idx_len = num_samples + 1;
    int64_t *s = si->sample_idx = neox_malloc((size_t)(num_samples + 1) * 2 * sizeof *s);
    int64_t doc_pos = 0, offset = 0;
    s[0] = 0;
    s[1] = 0;
    for (int64_t sample = 1; sample <= num_samples; sample++) {
        int64_t remaining = seq_length + 1;
        while (remaining != 0) {
            int64_t doc_len = sizes[si->doc_idx[doc_pos]] - offset;
            remaining -= doc_len;
            if (remaining <= 0) {
                // The last token of this sample is the first of the next one.
                offset += remaining + doc_len - 1;
                remaining = 0;
            } else {
                doc_pos++;
                offset = 0;
            }
        }
        s[2 * sample] = doc_pos;
        s[2 * sample + 1] = offset;
    }
}

static void build_shuffle_idx(neox_sample_index *si, int64_t size, neox_random_state *rs) {
    si->shuffle_idx_len = size;
    si->shuffle_idx = neox_malloc((size_t)size * sizeof *si->shuffle_idx + 1);
    if (size >= (int64_t)UINT32_MAX - 1) {
        for (int64_t i = 0; i < size; i++) si->shuffle_idx[i] = i;
        neox_random_shuffle(rs, si->shuffle_idx, size, 8);
        return;
    }
    uint32_t *idx = neox_malloc((size_t)size * sizeof *idx + 1);
    for (int64_t i = 0; i < size; i++) idx[i] = (uint32_t)i;
    neox_random_shuffle(rs, idx, size, sizeof *idx);
    for (int64_t i = 0; i < size; i++) si->shuffle_idx[i] = idx[i];
    free(idx);
}

// ---------------------------------------------------------------------------------------------
// pack_until_overflow: whole documents, in reshuffled passes, packed into a sample until the next
// one would overflow seq_length + 1; a sample never splits a document.

static void push(int64_t **a, int64_t *len, int64_t *cap, int64_t v) {
    if (*len == *cap) {
        *cap = *cap ? *cap * 2 : 1024;
        *a = neox_realloc(*a, (size_t)*cap * sizeof **a);
    }
    (*a)[(*len)++] = v;
}

// pack_until_overflow and unpacked serve their samples in a shuffled np.arange(num_samples) order,
// drawn before anything else.
static void shuffled_sample_order(neox_sample_index *si, int64_t ns, neox_random_state *rs) {
    si->shuffle_idx_len = ns;
    si->shuffle_idx = neox_malloc((size_t)ns * 8 + 1);
    for (int64_t i = 0; i < ns; i++) si->shuffle_idx[i] = i;
    neox_random_shuffle(rs, si->shuffle_idx, ns, 8);
}

// GPT-NeoX shuffles the positions 0..n-1 of the documents and uses them as document ids, which
// reads the train documents for a valid/test split; neox.c offsets them by the split's first
// document (the same result whenever the split starts at document 0).
// Whether GPT-NeoX leaves document doc out of a pack_until_overflow or unpacked index: longer than
// seq_length + 1 without allow_chopped, or (with a label dataset) its first n labels all masked.
static int skips(const neox_sample_index_options *o, const int32_t *sizes, int64_t doc, int64_t n, int32_t *scratch,
                 int *skip, neox_error *err) {
    *skip = !o->allow_chopped && sizes[doc] > o->seq_length + 1;
    if (*skip || !o->labels) return 0;
    return neox_labels_all_masked(o->labels, doc, n, scratch, skip, err);
}

static int none_usable(const neox_sample_index_options *o, neox_error *err) {
    return neox_fail(err, NEOX_EXIT_USAGE, "%s: no usable document (each is longer than seq_length + 1 = %d with "
                     "allow_chopped off, or has only masked labels)", o->name, o->seq_length + 1);
}

int neox_labels_all_masked(const neox_indexed_dataset *labels, int64_t doc, int64_t n, int32_t *scratch, int *masked,
                           neox_error *err) {
    int64_t got = neox_indexed_get(labels, doc, 0, n < labels->sizes[doc] ? n : labels->sizes[doc], scratch, err);
    if (got < 0) return -1;
    *masked = 1;
    for (int64_t i = 0; i < got; i++)
        if (scratch[i] != NEOX_LABEL_MASKED) *masked = 0;
    return 0;
}

static int build_pack_until_overflow(neox_sample_index *si, const int32_t *sizes, const neox_sample_index_options *o,
                                     neox_random_state *rs, neox_error *err) {
    int64_t ns = o->num_samples, ndocs = o->doc_end - o->doc_begin;
    shuffled_sample_order(si, ns, rs);
    int64_t *order = neox_malloc((size_t)ndocs * 8 + 1);
    for (int64_t i = 0; i < ndocs; i++) order[i] = i;
    neox_random_shuffle(rs, order, ndocs, 8);
    int64_t flat = 0, flat_cap = 0, docs_cap = 0, running = 0, cur = 0, skipped_in_row = 0;
    int32_t *scratch = neox_malloc(((size_t)o->seq_length + 1) * sizeof *scratch);
    int rc = 0;
    si->doc_idx_len = 0;
    while (rc == 0 && flat / 2 < ns) {
        int64_t doc = o->doc_begin + order[cur], len = sizes[doc];
        int skip;
        if ((rc = skips(o, sizes, doc, o->seq_length + 1, scratch, &skip, err)) != 0) break;
        if (skip) {
            if (++skipped_in_row > ndocs) rc = none_usable(o, err);
        } else {
            skipped_in_row = 0;
            if (running == 0 || running + len > o->seq_length + 1) {
                push(&si->sample_idx, &flat, &flat_cap, si->doc_idx_len);
                push(&si->sample_idx, &flat, &flat_cap, 0);
                running = len;
            } else {
                running += len;
            }
            push(&si->doc_idx, &si->doc_idx_len, &docs_cap, doc);
        }
        if (++cur == ndocs) {
            cur = 0;
            neox_random_shuffle(rs, order, ndocs, 8);
        }
    }
    push(&si->sample_idx, &flat, &flat_cap, si->doc_idx_len);
    push(&si->sample_idx, &flat, &flat_cap, 0);
    si->sample_idx_len = flat / 2;
    free(order);
    free(scratch);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// unpacked: one document per sample, documents in order (cycling), samples served shuffled.
// GPT-NeoX skips documents whose first seq_length labels are all -100 (and fails without a label
// dataset; neox.c then skips nothing for that reason). Document ids are offset by the split's first
// document, as for pack_until_overflow.
static int build_unpacked(neox_sample_index *si, const int32_t *sizes, const neox_sample_index_options *o,
                          neox_random_state *rs, neox_error *err) {
    int64_t ns = o->num_samples, ndocs = o->doc_end - o->doc_begin;
    shuffled_sample_order(si, ns, rs);
    si->sample_idx_len = ns + 1;
    si->sample_idx = neox_malloc((size_t)(ns + 1) * 16);
    for (int64_t i = 0; i <= ns; i++) si->sample_idx[2 * i] = i, si->sample_idx[2 * i + 1] = 0;
    si->doc_idx_len = ns + 1;
    si->doc_idx = neox_malloc((size_t)(ns + 1) * 8);
    int32_t *scratch = neox_malloc(((size_t)o->seq_length + 1) * sizeof *scratch);
    int64_t d = 0, skipped_in_row = 0;
    int rc = 0;
    for (int64_t i = 0; rc == 0 && i <= ns;) {
        int64_t doc = o->doc_begin + d;
        int skip;
        d = (d + 1) % ndocs;
        if ((rc = skips(o, sizes, doc, o->seq_length, scratch, &skip, err)) != 0) break;
        if (skip) {
            if (++skipped_in_row > ndocs) rc = none_usable(o, err);
            continue;
        }
        skipped_in_row = 0;
        si->doc_idx[i++] = doc;
    }
    free(scratch);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Caches

static int save_caches(const neox_sample_index *si, const char *base, neox_pack_impl pack, neox_error *err) {
    char *doc = neox_asprintf("%s_doc_idx.npy", base), *sample = neox_asprintf("%s_sample_idx.npy", base),
         *shuffle = neox_asprintf("%s_shuffle_idx.npy", base);
    int rc = -1;
    // GPT-NeoX's dtypes: packed doc_idx int32, sample_idx int32 while it fits, shuffle_idx uint32
    // below 2^32 - 2; pack_until_overflow and unpacked save int64 throughout.
    int packed = pack == NEOX_PACK_PACKED;
    int64_t shape1 = si->doc_idx_len, shape2[2] = {si->sample_idx_len, 2}, shape3 = si->shuffle_idx_len;
    int small_samples = packed && 2 * si->sample_idx_len < INT32_MAX;
    int small_shuffle = packed && si->shuffle_idx_len < (int64_t)UINT32_MAX - 1;
    int32_t *d32 = NULL, *s32 = NULL;
    uint32_t *u32 = NULL;
    if (packed) {
        d32 = neox_malloc((size_t)si->doc_idx_len * 4 + 1);
        for (int64_t i = 0; i < si->doc_idx_len; i++) d32[i] = (int32_t)si->doc_idx[i];
    }
    if (small_samples) {
        s32 = neox_malloc((size_t)si->sample_idx_len * 8 + 1);
        for (int64_t i = 0; i < 2 * si->sample_idx_len; i++) s32[i] = (int32_t)si->sample_idx[i];
    }
    if (small_shuffle) {
        u32 = neox_malloc((size_t)si->shuffle_idx_len * 4 + 1);
        for (int64_t i = 0; i < si->shuffle_idx_len; i++) u32[i] = (uint32_t)si->shuffle_idx[i];
    }
    if (neox_npy_write(doc, packed ? "<i4" : "<i8", 1, &shape1, packed ? (void *)d32 : (void *)si->doc_idx, err) == 0 &&
        neox_npy_write(sample, small_samples ? "<i4" : "<i8", 2, shape2, small_samples ? (void *)s32 : (void *)si->sample_idx,
                       err) == 0 &&
        neox_npy_write(shuffle, small_shuffle ? "<u4" : "<i8", 1, &shape3,
                       small_shuffle ? (void *)u32 : (void *)si->shuffle_idx, err) == 0)
        rc = 0;
    free(d32);
    free(s32);
    free(u32);
    free(doc);
    free(sample);
    free(shuffle);
    return rc;
}

static int load_one(const char *base, const char *suffix, int want_ndim, int64_t **out, int64_t *len, neox_error *err) {
    char *path = neox_asprintf("%s_%s.npy", base, suffix);
    neox_npy a;
    int rc = neox_npy_read(path, &a, err);
    if (rc == 0 && (a.ndim != want_ndim || (want_ndim == 2 && a.shape[1] != 2)))
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: unexpected array shape", path);
    if (rc == 0) {
        *out = neox_npy_to_i64(&a);
        *len = a.shape[0];
    }
    free(a.data);
    free(path);
    return rc;
}

static int caches_exist(const char *base) {
    const char *suffixes[] = {"doc_idx", "sample_idx", "shuffle_idx"};
    for (int i = 0; i < 3; i++) {
        char *path = neox_asprintf("%s_%s.npy", base, suffixes[i]);
        int ok = access(path, R_OK) == 0;
        free(path);
        if (!ok) return 0;
    }
    return 1;
}

static int load_caches(neox_sample_index *si, const char *base, neox_error *err) {
    return load_one(base, "doc_idx", 1, &si->doc_idx, &si->doc_idx_len, err) != 0 ||
                   load_one(base, "sample_idx", 2, &si->sample_idx, &si->sample_idx_len, err) != 0 ||
                   load_one(base, "shuffle_idx", 1, &si->shuffle_idx, &si->shuffle_idx_len, err) != 0
               ? -1
               : 0;
}

// Checks that a loaded (possibly foreign) cache only points inside the dataset.
static int check_index(const neox_sample_index *si, const neox_indexed_dataset *ds, const char *base, neox_error *err) {
    for (int64_t i = 0; i < si->doc_idx_len; i++)
        if (si->doc_idx[i] < 0 || si->doc_idx[i] >= ds->num_items)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s_doc_idx.npy: document %lld is outside %s", base,
                             (long long)si->doc_idx[i], ds->idx_path);
    for (int64_t i = 0; i < si->sample_idx_len; i++) {
        int64_t d = si->sample_idx[2 * i], off = si->sample_idx[2 * i + 1];
        if (d < 0 || d > si->doc_idx_len || off < 0 || (d < si->doc_idx_len && off > ds->sizes[si->doc_idx[d]]))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s_sample_idx.npy: row %lld points outside doc_idx", base, (long long)i);
    }
    for (int64_t i = 0; i < si->shuffle_idx_len; i++)
        if (si->shuffle_idx[i] < 0 || si->shuffle_idx[i] >= si->sample_idx_len - 1)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s_shuffle_idx.npy: entry %lld is out of range", base, (long long)i);
    return 0;
}

// ---------------------------------------------------------------------------------------------

static int build(neox_sample_index *si, const neox_indexed_dataset *ds, const neox_sample_index_options *o,
                 neox_error *err) {
    neox_random_state rs;
    neox_random_seed(&rs, o->seed);
    if (o->pack_impl == NEOX_PACK_UNTIL_OVERFLOW) return build_pack_until_overflow(si, ds->sizes, o, &rs, err);
    if (o->pack_impl == NEOX_PACK_UNPACKED) return build_unpacked(si, ds->sizes, o, &rs, err);
    int64_t tokens = 0;
    for (int64_t d = o->doc_begin; d < o->doc_end; d++) tokens += ds->sizes[d];
    if (tokens <= 1) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: dataset %s has %lld tokens; need at least 2", ds->idx_path,
                                      o->name, (long long)tokens);
    build_doc_idx(si, o, &rs);
    build_sample_idx(si, ds->sizes, o->seq_length, tokens);
    build_shuffle_idx(si, si->sample_idx_len - 1, &rs);
    return 0;
}

static void finish(neox_sample_index *si) {
    int64_t a = si->shuffle_idx_len - 1, b = si->sample_idx_len - 1;
    si->length = a < b ? a : b;
    if (si->length < 0) si->length = 0;
}

// Loads the caches when they belong to ds (their identity file matches, or they have none: caches
// GPT-NeoX wrote, adopted with one written now); builds and saves them otherwise, or refuses when
// stale caches sit in a directory that cannot be written.
static int use_or_build(neox_sample_index *si, const neox_indexed_dataset *ds, const neox_sample_index_options *o,
                        const char *base, const char *dir, int *loaded, neox_error *err) {
    neox_cache_identity id = NEOX_CACHE_IDENTITY_ABSENT;
    int writable = access(dir, W_OK) == 0;
    if (caches_exist(base)) {
        if (neox_cache_identity_check(base, ds, &id, err) != 0) return -1;
        if (id != NEOX_CACHE_IDENTITY_DIFFERS) {
            if (load_caches(si, base, err) != 0 || check_index(si, ds, base, err) != 0) return -1;
            if (loaded) *loaded = 1;
            if (id == NEOX_CACHE_IDENTITY_ABSENT && writable) {
                neox_notice("%s_*.npy: index caches without an identity file, taken as built from %s", base, ds->idx_path);
                return neox_cache_identity_write(base, ds, err);
            }
            return 0;
        }
        if (!writable)
            return neox_fail(err, NEOX_EXIT_FAILURE,
                             "%s_*.npy: the index caches were built from another dataset than %s (%s_identity.json "
                             "differs) and %s is not writable; set data_cache_dir to a writable directory",
                             base, ds->idx_path, base, dir);
        neox_notice("%s_*.npy: built from another dataset than %s (%s_identity.json differs): rebuilding", base,
                    ds->idx_path, base);
    } else if (!writable) {
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot write the index caches there; set data_cache_dir to a "
                         "writable directory", dir);
    }
    if (build(si, ds, o, err) != 0 || save_caches(si, base, o->pack_impl, err) != 0) return -1;
    return neox_cache_identity_write(base, ds, err);
}

neox_sample_index *neox_sample_index_build(const neox_indexed_dataset *ds, const neox_sample_index_options *o, int *loaded,
                                           neox_error *err) {
    if (loaded) *loaded = 0;
    if (o->doc_begin < 0 || o->doc_end > ds->num_items || o->doc_begin >= o->doc_end || o->seq_length < 1 ||
        o->num_samples < 0) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s: invalid sample index request (documents [%lld, %lld), seq_length %d)",
                  ds->idx_path, (long long)o->doc_begin, (long long)o->doc_end, o->seq_length);
        return NULL;
    }
    neox_sample_index *si = neox_calloc(1, sizeof *si);
    int64_t tokens = 0;
    for (int64_t d = o->doc_begin; d < o->doc_end; d++) tokens += ds->sizes[d];
    si->num_epochs = tokens > 0 ? neox_num_epochs(tokens, o->seq_length, o->num_samples) : 1;
    if (!o->data_prefix) {
        if (build(si, ds, o, err) != 0) goto fail;
        finish(si);
        return si;
    }
    if (o->cache_dir && mkdir(o->cache_dir, 0777) != 0 && errno != EEXIST) {
        neox_fail(err, NEOX_EXIT_FAILURE, "data_cache_dir %s: %s", o->cache_dir, strerror(errno));
        goto fail;
    }
    char *base = neox_sample_index_cache_name(o);
    // Builders on many ranks or nodes serialise on a lock so only the first builds; the files
    // themselves appear atomically, so a reader without the lock never sees half of one.
    // The lock is on the directory holding the caches, so no lock files are left behind; where
    // flock is unavailable, builders race harmlessly (same bytes, atomic renames).
    char *dir_copy = neox_strdup(base);
    char *slash = strrchr(dir_copy, '/');
    if (slash) *slash = 0;
    int lock_fd = open(slash ? (*dir_copy ? dir_copy : "/") : ".", O_RDONLY | O_DIRECTORY);
    if (lock_fd >= 0) flock(lock_fd, LOCK_EX);
    int rc = use_or_build(si, ds, o, base, slash ? (*dir_copy ? dir_copy : "/") : ".", loaded, err);
    if (lock_fd >= 0) close(lock_fd);
    free(dir_copy);
    free(base);
    if (rc != 0) goto fail;
    finish(si);
    return si;
fail:
    neox_sample_index_free(si);
    return NULL;
}

void neox_sample_index_free(neox_sample_index *si) {
    if (!si) return;
    free(si->doc_idx);
    free(si->sample_idx);
    free(si->shuffle_idx);
    free(si);
}
