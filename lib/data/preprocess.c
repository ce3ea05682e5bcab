// preprocess.c: the neox-preprocess pipeline. The calling thread reads chunks of records into a
// ring of slots; worker threads parse and tokenize whole chunks; one writer thread appends the
// chunks to the per-key datasets strictly in chunk order. The ring bounds memory whatever the
// input size, and the order makes the output identical for any number of workers. A document
// too large for one worker to finish while the others wait is cut where the tokenizer's ids
// cannot change (neox_tokenizer_cuts); its pieces go on a shared list that idle workers take
// from, and its worker joins their ids in order.
#include "data.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

// Documents of SHARE_BYTES or more are cut into pieces of about PIECE_BYTES: small pieces let two
// workers end a 1 MB document within a piece of each other; smaller documents are units enough.
enum { CHUNK_RECORDS = 512, CHUNK_BYTES = 1 << 20, PIECE_BYTES = 16 << 10, SHARE_BYTES = 256 << 10 };
enum { SLOT_FREE, SLOT_FILLED, SLOT_WORKING, SLOT_DONE };
enum { DOC_KEPT, DOC_EMPTY, DOC_INVALID };

typedef struct slot {
    int state;
    int64_t seq;
    neox_record recs[CHUNK_RECORDS];
    int nrecs;
    char *data;                // copies of the records' bytes
    size_t data_cap;
    int64_t input_bytes;       // reader position after this chunk (for progress)
    int32_t *ids;              // every kept document's ids, record-major then key
    size_t ids_len, ids_cap;
    size_t *ends;              // [rec * nkeys + key]: end of that document in ids
    uint8_t *status;           // [rec * nkeys + key]: DOC_*
    int64_t text_bytes;
    int failed;
    neox_error err;
} slot;

// A large document whose pieces any worker may encode; each piece's ids are kept apart.
typedef struct shared_doc {
    const char *text;
    size_t *bounds;             // n + 1 offsets
    size_t n, next, done;       // pieces; the next to hand out; those encoded
    struct piece_ids { int32_t *ids; size_t len, cap; int64_t rc; neox_error err; } *out;
    struct shared_doc *link;    // the pipeline's list of shared documents
} shared_doc;

typedef struct pipeline {
    const neox_preprocess_options *o;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    slot *slots;
    int nslots;
    int64_t filled, worked, written;   // sequence counters
    int reading_done;                  // no more chunks will be filled
    int abort;
    int reader_failed;
    neox_error reader_err;
    int writer_failed;
    neox_error writer_err;
    neox_indexed_writer **writers;
    neox_preprocess_stats *stats;
    neox_progress *progress;
    double started;
    shared_doc *shared;                // documents being encoded in pieces, oldest first
} pipeline;

// ---------------------------------------------------------------------------------------------
// Workers: parse and tokenize one chunk.

// The next piece to encode of the oldest shared document with pieces left (lock held), or NULL.
static shared_doc *take_piece(pipeline *p, size_t *index) {
    for (shared_doc *d = p->shared; d; d = d->link)
        if (d->next < d->n) {
            *index = d->next++;
            return d;
        }
    return NULL;
}

// Encodes piece i of d without the lock and counts it done with it.
static void encode_piece(pipeline *p, shared_doc *d, size_t i) {
    pthread_mutex_unlock(&p->lock);
    struct piece_ids *o = &d->out[i];
    o->rc = p->o->encode_piece(p->o->encode_ctx, d->text + d->bounds[i], d->bounds[i + 1] - d->bounds[i], i == 0,
                               i == d->n - 1, &o->ids, &o->len, &o->cap, &o->err);
    pthread_mutex_lock(&p->lock);
    d->done++;
    pthread_cond_broadcast(&p->changed);
}

// Encodes a document cut at cuts[0..n_cuts) with the help of idle workers: its pieces are put on
// the shared list, this worker takes them too (then others' while waiting), and joins the ids.
static int encode_shared(pipeline *p, slot *s, const char *text, size_t size, const size_t *cuts, size_t n_cuts) {
    shared_doc d = {.text = text, .n = n_cuts + 1};
    d.bounds = neox_malloc((d.n + 1) * sizeof *d.bounds);
    d.bounds[0] = 0, d.bounds[d.n] = size;
    memcpy(d.bounds + 1, cuts, n_cuts * sizeof *cuts);
    d.out = neox_calloc(d.n, sizeof *d.out);
    pthread_mutex_lock(&p->lock);
    shared_doc **tail = &p->shared;
    while (*tail) tail = &(*tail)->link;
    *tail = &d;
    pthread_cond_broadcast(&p->changed);
    while (d.done < d.n) {
        size_t i;
        shared_doc *x = d.next < d.n ? (i = d.next++, &d) : take_piece(p, &i);
        if (x) encode_piece(p, x, i);
        else pthread_cond_wait(&p->changed, &p->lock);
    }
    for (tail = &p->shared; *tail != &d; tail = &(*tail)->link) {}
    *tail = d.link;
    pthread_mutex_unlock(&p->lock);
    int rc = 0;
    for (size_t i = 0; i < d.n; i++) {
        struct piece_ids *o = &d.out[i];
        if (rc == 0 && o->rc < 0) s->err = o->err, rc = -1;
        if (rc == 0 && s->ids_len + o->len > s->ids_cap)
            s->ids = neox_realloc(s->ids, (s->ids_cap = (s->ids_len + o->len) * 2) * sizeof *s->ids);
        if (rc == 0) memcpy(s->ids + s->ids_len, o->ids, o->len * sizeof *o->ids), s->ids_len += o->len;
        free(o->ids);
    }
    free(d.out);
    free(d.bounds);
    return rc;
}

// One document's ids appended to the chunk's: whole, or in pieces when it is large, the tokenizer
// can cut it and other workers could help.
static int encode_document(pipeline *p, slot *s, const char *text, size_t size) {
    const neox_preprocess_options *o = p->o;
    size_t piece = o->piece_bytes ? o->piece_bytes : PIECE_BYTES;
    if (o->workers > 1 && o->cut && o->encode_piece && size >= SHARE_BYTES && size >= 2 * piece) {
        size_t max_cuts = size / piece + 1, *cuts = neox_malloc(max_cuts * sizeof *cuts);
        size_t n_cuts = o->cut(o->encode_ctx, text, size, piece, cuts, max_cuts);
        int rc = n_cuts > 0 ? encode_shared(p, s, text, size, cuts, n_cuts) : 1;
        free(cuts);
        if (rc <= 0) return rc;
    }
    return o->encode(o->encode_ctx, text, size, &s->ids, &s->ids_len, &s->ids_cap, &s->err) < 0 ? -1 : 0;
}

static int tokenize_record(pipeline *p, slot *s, int r) {
    const neox_preprocess_options *o = p->o;
    size_t record_start = s->ids_len;
    for (int k = 0; k < o->nkeys; k++) {
        size_t i = (size_t)r * o->nkeys + k, size;
        neox_error err = {0};
        char *text = neox_record_text(&s->recs[r], o->keys[k], &size, &err);
        if (!text) {
            if (!o->skip_invalid) {
                s->err = err;
                return -1;
            }
            // The whole record is skipped, also the keys already tokenized.
            s->ids_len = record_start;
            for (int j = 0; j < o->nkeys; j++) {
                s->status[(size_t)r * o->nkeys + j] = DOC_INVALID;
                s->ends[(size_t)r * o->nkeys + j] = record_start;
            }
            return 0;
        }
        s->status[i] = DOC_EMPTY;
        if (size > 0) {
            s->text_bytes += (int64_t)size;
            size_t before = s->ids_len;
            if (encode_document(p, s, text, size) < 0) {
                neox_fail_context(&s->err, "%s:%lld", s->recs[r].file, (long long)s->recs[r].line);
                free(text);
                return -1;
            }
            if (o->append_eod) {
                if (s->ids_len == s->ids_cap) s->ids = neox_realloc(s->ids, (s->ids_cap = s->ids_cap * 2 + 16) * sizeof *s->ids);
                s->ids[s->ids_len++] = o->eod_id;
            }
            if (s->ids_len > before) s->status[i] = DOC_KEPT;
        }
        free(text);
        s->ends[i] = s->ids_len;
    }
    return 0;
}

static void tokenize_chunk(pipeline *p, slot *s) {
    size_t n = (size_t)s->nrecs * p->o->nkeys;
    s->ends = neox_realloc(s->ends, (n + 1) * sizeof *s->ends);
    s->status = neox_realloc(s->status, n + 1);
    s->ids_len = 0;
    s->text_bytes = 0;
    s->failed = 0;
    neox_error_clear(&s->err);
    for (int r = 0; r < s->nrecs; r++)
        if (tokenize_record(p, s, r) != 0) {
            s->failed = 1;
            return;
        }
}

static void *worker_main(void *arg) {
    pipeline *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        size_t piece;
        shared_doc *d = take_piece(p, &piece);
        if (d) {  // a large document's piece first: its chunk holds back the writer
            encode_piece(p, d, piece);
            continue;
        }
        slot *s = &p->slots[p->worked % p->nslots];
        if (p->abort || (p->reading_done && p->worked == p->filled)) break;
        if (p->worked == p->filled || s->state != SLOT_FILLED) {
            pthread_cond_wait(&p->changed, &p->lock);
            continue;
        }
        s->state = SLOT_WORKING;
        p->worked++;
        pthread_mutex_unlock(&p->lock);
        tokenize_chunk(p, s);
        pthread_mutex_lock(&p->lock);
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// Writer: append chunks in order.

static void report_progress(pipeline *p, const slot *s, int final) {
    neox_preprocess_stats *st = p->stats;
    double elapsed = neox_now() - p->started;
    if (elapsed <= 0) elapsed = 1e-9;
    char a[16], b[16], c[16], extra[160];
    snprintf(extra, sizeof extra, "%s docs/s, %s MB/s, %s tokens/s, %s tokens", neox_format_count(st->documents / elapsed, a, sizeof a),
             neox_format_count(st->text_bytes / 1e6 / elapsed, b, sizeof b), neox_format_count(st->tokens / elapsed, c, sizeof c),
             neox_format_count((double)st->tokens, (char[16]){0}, 16));
    double done = p->o->num_docs > 0 ? (double)st->documents : (double)(s ? s->input_bytes : st->input_bytes) / 1e6;
    if (final) neox_progress_finish(p->progress, done, extra);
    else neox_progress_update(p->progress, done, extra);
}

// The label document of preprocess_data_with_mask.py: every token up to and including the first
// occurrence of the mask_before pattern replaced by -100 (the document unchanged without one).
static int write_masked_labels(pipeline *p, const int32_t *ids, size_t n, neox_error *err) {
    const neox_preprocess_options *o = p->o;
    size_t m = (size_t)o->mask_before_len, cut = 0;
    for (size_t at = 0; !cut && n >= m && at <= n - m; at++)
        if (!memcmp(ids + at, o->mask_before, m * sizeof *ids)) cut = at + m;
    int32_t *labels = neox_malloc((n + 1) * sizeof *labels);
    for (size_t t = 0; t < n; t++) labels[t] = t < cut ? NEOX_LABEL_MASKED : ids[t];
    int rc = neox_indexed_writer_add_item(p->writers[o->nkeys], labels, n, err);
    free(labels);
    if (rc == 0) neox_indexed_writer_end_document(p->writers[o->nkeys]);
    return rc;
}

static int write_chunk(pipeline *p, slot *s, neox_error *err) {
    const neox_preprocess_options *o = p->o;
    size_t begin = 0;
    for (int r = 0; r < s->nrecs; r++) {
        int counted = 0;
        for (int k = 0; k < o->nkeys; k++) {
            size_t i = (size_t)r * o->nkeys + k;
            if (s->status[i] == DOC_INVALID) {
                if (!counted) p->stats->skipped_invalid++, counted = 1;
                continue;
            }
            if (s->status[i] == DOC_EMPTY) {
                p->stats->skipped_empty++;
            } else {
                if (neox_indexed_writer_add_item(p->writers[k], s->ids + begin, s->ends[i] - begin, err) != 0) return -1;
                neox_indexed_writer_end_document(p->writers[k]);
                if (o->mask_before_len > 0 && write_masked_labels(p, s->ids + begin, s->ends[i] - begin, err) != 0)
                    return -1;
                p->stats->documents++;
                p->stats->tokens += (int64_t)(s->ends[i] - begin);
            }
            begin = s->ends[i];
        }
    }
    p->stats->text_bytes += s->text_bytes;
    p->stats->input_bytes = s->input_bytes;
    return 0;
}

static void *writer_main(void *arg) {
    pipeline *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        slot *s = &p->slots[p->written % p->nslots];
        if (p->abort || (p->reading_done && p->written == p->filled)) break;
        if (p->written == p->filled || s->state != SLOT_DONE) {
            pthread_cond_wait(&p->changed, &p->lock);
            continue;
        }
        pthread_mutex_unlock(&p->lock);
        int rc = -1;
        if (s->failed) p->writer_err = s->err;
        else rc = write_chunk(p, s, &p->writer_err);
        if (rc == 0) report_progress(p, s, 0);
        pthread_mutex_lock(&p->lock);
        if (rc != 0) p->writer_failed = p->abort = 1;
        s->state = SLOT_FREE;
        p->written++;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// Reader (the calling thread).

static void copy_records(slot *s, const neox_record *recs, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += recs[i].size;
    if (s->data_cap < total + 1) s->data = neox_realloc(s->data, s->data_cap = total + 1);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        s->recs[i] = recs[i];
        memcpy(s->data + at, recs[i].data, recs[i].size);
        s->recs[i].data = s->data + at;
        at += recs[i].size;
    }
    s->nrecs = n;
}

static void read_all(pipeline *p, neox_doc_reader *reader) {
    neox_record *recs = neox_malloc(CHUNK_RECORDS * sizeof *recs);
    for (;;) {
        neox_error err = {0};
        int n = neox_doc_reader_next(reader, recs, CHUNK_RECORDS, CHUNK_BYTES, &err);
        pthread_mutex_lock(&p->lock);
        slot *s = &p->slots[p->filled % p->nslots];
        while (!p->abort && s->state != SLOT_FREE) pthread_cond_wait(&p->changed, &p->lock);
        if (n <= 0 || p->abort) {
            if (n < 0) p->reader_failed = 1, p->reader_err = err;
            p->reading_done = 1;
            pthread_cond_broadcast(&p->changed);
            pthread_mutex_unlock(&p->lock);
            break;
        }
        pthread_mutex_unlock(&p->lock);
        copy_records(s, recs, n);  // the slot is FREE: nobody else touches it
        s->input_bytes = neox_doc_reader_bytes_read(reader);
        pthread_mutex_lock(&p->lock);
        s->state = SLOT_FILLED;
        s->seq = p->filled++;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
    }
    free(recs);
}

// ---------------------------------------------------------------------------------------------

static int open_writers(pipeline *p, neox_error *err) {
    const neox_preprocess_options *o = p->o;
    int labelled = o->mask_before_len > 0;
    p->writers = neox_calloc((size_t)o->nkeys + 1, sizeof *p->writers);
    // preprocess_data_with_mask.py writes its text and label datasets as int32 whatever the vocabulary.
    int dtype = labelled ? NEOX_DTYPE_I32 : neox_dtype_for_vocab(o->vocab_size);
    for (int k = 0; k < o->nkeys + labelled; k++) {
        char *prefix = k < o->nkeys ? neox_asprintf("%s_%s_document", o->output_prefix, o->keys[k])
                                    : neox_asprintf("%s_label_document", o->output_prefix);
        p->writers[k] = neox_indexed_writer_open(prefix, dtype, err);
        free(prefix);
        if (!p->writers[k]) return -1;
    }
    return 0;
}

static void free_pipeline(pipeline *p) {
    for (int i = 0; i < p->nslots; i++) {
        free(p->slots[i].data);
        free(p->slots[i].ids);
        free(p->slots[i].ends);
        free(p->slots[i].status);
    }
    free(p->slots);
    free(p->writers);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->changed);
}

static void run_threads(pipeline *p, neox_doc_reader *reader) {
    int nworkers = p->o->workers;
    pthread_t *workers = neox_malloc((size_t)nworkers * sizeof *workers), writer;
    for (int i = 0; i < nworkers; i++) pthread_create(&workers[i], NULL, worker_main, p);
    pthread_create(&writer, NULL, writer_main, p);
    read_all(p, reader);
    for (int i = 0; i < nworkers; i++) pthread_join(workers[i], NULL);
    pthread_join(writer, NULL);
    free(workers);
}

int neox_preprocess_run(const neox_preprocess_options *o, neox_preprocess_stats *stats, neox_error *err) {
    memset(stats, 0, sizeof *stats);
    if (o->workers < 1 || o->nkeys < 1 || !o->encode)
        return neox_fail(err, NEOX_EXIT_USAGE, "preprocess: need at least one worker, one key and a tokenizer");
    if (o->mask_before_len > 0 && (o->nkeys != 1 || !strcmp(o->keys[0], "label")))
        return neox_fail(err, NEOX_EXIT_USAGE, "--mask-before-token: one jsonl key, not named 'label' (its label dataset is "
                         "{prefix}_label_document)");
    if (o->append_eod && o->eod_id < 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--append-eod: the tokenizer has no end-of-document token (no "
                         "<|endoftext|> and no eos_token in a tokenizer_config.json beside it)");
    neox_doc_reader *reader = neox_doc_reader_open(o->inputs, o->ninputs, err);
    if (!reader) return -1;
    if (o->max_document_bytes) neox_doc_reader_set_max_record(reader, o->max_document_bytes);
    pipeline p = {.o = o, .stats = stats, .started = neox_now()};
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.changed, NULL);
    p.nslots = 2 * o->workers + 2;
    p.slots = neox_calloc((size_t)p.nslots, sizeof *p.slots);
    int rc = open_writers(&p, err);
    if (rc == 0) {
        double total = o->num_docs > 0 ? (double)o->num_docs : (double)neox_doc_reader_total_bytes(reader) / 1e6;
        p.progress = neox_progress_start("preprocess", total, o->num_docs > 0 ? "docs" : "MB");
        run_threads(&p, reader);
        report_progress(&p, NULL, 1);
        if (p.writer_failed) rc = neox_fail(err, p.writer_err.status ? p.writer_err.status : 1, "%s", p.writer_err.message);
        else if (p.reader_failed) rc = neox_fail(err, p.reader_err.status ? p.reader_err.status : 1, "%s", p.reader_err.message);
    }
    for (int k = 0; k < o->nkeys + (o->mask_before_len > 0) && p.writers; k++) {
        if (!p.writers[k]) continue;
        if (rc == 0) rc = neox_indexed_writer_commit(p.writers[k], err);
        else neox_indexed_writer_abort(p.writers[k]);
    }
    stats->seconds = neox_now() - p.started;
    free_pipeline(&p);
    neox_doc_reader_close(reader);
    return rc;
}
