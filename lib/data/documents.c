// documents.c: reading corpora as records — jsonl lines or whole .txt files — from plain, zstd
// (streaming) or gzip files, directories (recursive, sorted) and stdin, without holding a whole
// file in memory (except a .txt document). Truncated compressed input is an error naming the file.
// Parsing JSON (neox_record_text) is separate so worker threads can do it.
#include "data.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

enum { RAW_CHUNK = 1 << 18 };

typedef enum { CODEC_PLAIN, CODEC_ZSTD, CODEC_GZIP } codec;

struct neox_doc_reader {
    char **files;
    int nfiles, cap_files, current;  // current: index of the open file, -1 before the first
    FILE *fp;
    int is_txt;
    codec codec;
    int raw_eof, stream_end;          // raw input exhausted; compressed stream complete
    uint8_t *raw;                     // compressed bytes read but not yet decoded
    size_t raw_pos, raw_len;
    ZSTD_DStream *zstd;
    size_t zstd_last;                 // last ZSTD_decompressStream result: 0 at a frame end
    z_stream gz;
    int gz_open;
    char *buf;                        // decoded text; [pos, len) not yet handed out
    size_t pos, len, cap;
    size_t max_record;                // longest record accepted (decoded bytes)
    int64_t line;
    int64_t bytes_read, total_bytes;
};

// ---------------------------------------------------------------------------------------------
// Input list

static void add_file(neox_doc_reader *r, const char *path) {
    if (r->nfiles == r->cap_files) {
        r->cap_files = r->cap_files ? r->cap_files * 2 : 16;
        r->files = neox_realloc(r->files, (size_t)r->cap_files * sizeof *r->files);
    }
    r->files[r->nfiles++] = neox_strdup(path);
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int add_directory(neox_doc_reader *r, const char *dir, neox_error *err) {
    DIR *d = opendir(dir);
    if (!d) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;  // ".", ".." and hidden files
        if (n == cap) names = neox_realloc(names, (cap = cap ? cap * 2 : 32) * sizeof *names);
        names[n++] = neox_asprintf("%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, compare_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (rc == 0) {
            if (stat(names[i], &st) != 0) rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s", names[i], strerror(errno));
            else if (S_ISDIR(st.st_mode)) rc = add_directory(r, names[i], err);
            else if (S_ISREG(st.st_mode)) add_file(r, names[i]), r->total_bytes += st.st_size;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

neox_doc_reader *neox_doc_reader_open(const char *const *inputs, int ninputs, neox_error *err) {
    neox_doc_reader *r = neox_calloc(1, sizeof *r);
    r->current = -1;
    int stdin_used = 0;
    for (int i = 0; i < ninputs; i++) {
        struct stat st;
        if (!strcmp(inputs[i], "-")) {
            add_file(r, "-");
            stdin_used = 1;
        } else if (stat(inputs[i], &st) != 0) {
            neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s", inputs[i], strerror(errno));
            goto fail;
        } else if (S_ISDIR(st.st_mode)) {
            if (add_directory(r, inputs[i], err) != 0) goto fail;
        } else {
            add_file(r, inputs[i]);
            r->total_bytes += st.st_size;
        }
    }
    if (stdin_used) r->total_bytes = 0;  // unknown
    if (r->nfiles == 0) {
        neox_fail(err, NEOX_EXIT_USAGE, "no input files (the directories given are empty)");
        goto fail;
    }
    r->raw = neox_malloc(RAW_CHUNK);
    r->max_record = NEOX_MAX_DOCUMENT_BYTES;
    return r;
fail:
    neox_doc_reader_close(r);
    return NULL;
}

static void close_file(neox_doc_reader *r) {
    if (r->fp && r->fp != stdin) fclose(r->fp);
    r->fp = NULL;
    if (r->zstd) ZSTD_freeDStream(r->zstd), r->zstd = NULL;
    if (r->gz_open) inflateEnd(&r->gz), r->gz_open = 0;
}

void neox_doc_reader_close(neox_doc_reader *r) {
    if (!r) return;
    close_file(r);
    for (int i = 0; i < r->nfiles; i++) free(r->files[i]);
    free(r->files);
    free(r->raw);
    free(r->buf);
    free(r);
}

int64_t neox_doc_reader_bytes_read(const neox_doc_reader *r) { return r->bytes_read; }
int64_t neox_doc_reader_total_bytes(const neox_doc_reader *r) { return r->total_bytes; }
int neox_doc_reader_file_count(const neox_doc_reader *r) { return r->nfiles; }
const char *neox_doc_reader_file(const neox_doc_reader *r, int i) { return r->files[i]; }

static const char *current_name(const neox_doc_reader *r) {
    return strcmp(r->files[r->current], "-") ? r->files[r->current] : "(stdin)";
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

// ---------------------------------------------------------------------------------------------
// Decoding

static int fill_raw(neox_doc_reader *r, neox_error *err) {
    if (r->raw_pos < r->raw_len || r->raw_eof) return 0;
    r->raw_pos = 0;
    r->raw_len = fread(r->raw, 1, RAW_CHUNK, r->fp);
    r->bytes_read += (int64_t)r->raw_len;
    if (r->raw_len < RAW_CHUNK) {
        if (ferror(r->fp)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: read error: %s", current_name(r), strerror(errno));
        r->raw_eof = 1;
    }
    return 0;
}

static int open_next_file(neox_doc_reader *r, neox_error *err) {
    close_file(r);
    r->current++;
    const char *path = r->files[r->current];
    r->fp = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!r->fp) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot open: %s", path, strerror(errno));
    r->is_txt = ends_with(path, ".txt");
    r->raw_pos = r->raw_len = 0;
    r->raw_eof = r->stream_end = 0;
    r->pos = r->len = 0;
    r->line = 0;
    if (fill_raw(r, err) != 0) return -1;
    const uint8_t *m = r->raw;
    r->codec = CODEC_PLAIN;
    if (r->raw_len >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) {
        r->codec = CODEC_ZSTD;
        r->zstd = ZSTD_createDStream();
        ZSTD_initDStream(r->zstd);
        r->zstd_last = 1;
    } else if (r->raw_len >= 2 && m[0] == 0x1f && m[1] == 0x8b) {
        r->codec = CODEC_GZIP;
        memset(&r->gz, 0, sizeof r->gz);
        if (inflateInit2(&r->gz, 15 + 16) != Z_OK) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: zlib init failed", path);
        r->gz_open = 1;
    }
    return 0;
}

static void reserve(neox_doc_reader *r, size_t more) {
    if (r->len + more <= r->cap) return;
    if (r->pos > 0) {  // compact first: everything before pos was handed out already
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
        if (r->len + more <= r->cap) return;
    }
    while (r->cap < r->len + more) r->cap = r->cap ? r->cap * 2 : RAW_CHUNK * 4;
    char what[PATH_MAX + 64];
    snprintf(what, sizeof what, "%s (a document of the corpus)", current_name(r));
    const char *previous = neox_alloc_reading(what);
    r->buf = neox_realloc(r->buf, r->cap + 1);
    neox_alloc_reading(previous);
}

// Appends more decoded text to buf. Returns 1 when it added some, 0 at the end of the file.
static int decode_more(neox_doc_reader *r, neox_error *err) {
    for (;;) {
        if (fill_raw(r, err) != 0) return -1;
        size_t avail = r->raw_len - r->raw_pos;
        if (avail == 0 && r->raw_eof) {
            if (r->codec == CODEC_ZSTD && r->zstd_last != 0)
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: truncated zstd stream", current_name(r));
            if (r->codec == CODEC_GZIP && !r->stream_end)
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: truncated gzip stream", current_name(r));
            return 0;
        }
        reserve(r, RAW_CHUNK * 2);
        size_t room = r->cap - r->len, produced;
        if (r->codec == CODEC_PLAIN) {
            produced = avail < room ? avail : room;
            memcpy(r->buf + r->len, r->raw + r->raw_pos, produced);
            r->raw_pos += produced;
        } else if (r->codec == CODEC_ZSTD) {
            ZSTD_inBuffer in = {r->raw, r->raw_len, r->raw_pos};
            ZSTD_outBuffer out = {r->buf + r->len, room, 0};
            size_t ret = ZSTD_decompressStream(r->zstd, &out, &in);
            if (ZSTD_isError(ret))
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: corrupt zstd data: %s", current_name(r), ZSTD_getErrorName(ret));
            r->zstd_last = ret;
            r->raw_pos = in.pos;
            produced = out.pos;
        } else {
            if (r->stream_end) {  // another gzip member follows (concatenated .gz files)
                inflateReset(&r->gz);
                r->stream_end = 0;
            }
            r->gz.next_in = r->raw + r->raw_pos;
            r->gz.avail_in = (uInt)avail;
            r->gz.next_out = (Bytef *)r->buf + r->len;
            r->gz.avail_out = (uInt)room;
            int ret = inflate(&r->gz, Z_NO_FLUSH);
            if (ret != Z_OK && ret != Z_STREAM_END && ret != Z_BUF_ERROR)
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: corrupt gzip data: %s", current_name(r),
                                 r->gz.msg ? r->gz.msg : "inflate failed");
            if (ret == Z_STREAM_END) r->stream_end = 1;
            produced = room - r->gz.avail_out;
            r->raw_pos = r->raw_len - r->gz.avail_in;
        }
        r->len += produced;
        if (produced) return 1;
    }
}

// Python's universal newlines, as lm_dataformat reads .txt files: \r\n and \r become \n.
static size_t universal_newlines(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r') {
            s[o++] = '\n';
            if (i + 1 < n && s[i + 1] == '\n') i++;
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}

void neox_doc_reader_set_max_record(neox_doc_reader *r, size_t max_record_bytes) { r->max_record = max_record_bytes; }

// Fails when the record being assembled ([pos, len) of buf, no end found yet) is over the limit.
static int check_record_size(neox_doc_reader *r, neox_error *err) {
    if (r->len - r->pos <= r->max_record) return 0;
    return neox_fail(err, NEOX_EXIT_FAILURE,
                     "%s:%lld: a document longer than %zu bytes (the limit; neox-preprocess --max-document-bytes raises it)",
                     current_name(r), (long long)(r->is_txt ? 1 : r->line + 1), r->max_record);
}

static int read_txt(neox_doc_reader *r, neox_record *rec, neox_error *err) {
    int rc;
    while ((rc = decode_more(r, err)) == 1)
        if (check_record_size(r, err) != 0) return -1;
    if (rc < 0) return -1;
    if (!r->buf) r->buf = neox_calloc(1, 1), r->cap = 1;  // an empty file: one empty document
    size_t n = universal_newlines(r->buf + r->pos, r->len - r->pos);
    *rec = (neox_record){.data = r->buf + r->pos, .size = n, .file = r->files[r->current], .line = 1, .is_json = 0};
    r->pos = r->len;
    return 1;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

int neox_doc_reader_next(neox_doc_reader *r, neox_record *recs, int max_records, size_t max_bytes, neox_error *err) {
    int count = 0;
    size_t bytes = 0;
    for (;;) {
        if (r->current < 0 || !r->fp) {
            if (count) return count;
            if (r->current + 1 >= r->nfiles) return 0;
            if (open_next_file(r, err) != 0) return -1;
            if (r->is_txt) {
                int rc = read_txt(r, recs, err);
                close_file(r);
                return rc;
            }
        }
        char *start = r->buf ? r->buf + r->pos : NULL;
        char *nl = start ? memchr(start, '\n', r->len - r->pos) : NULL;
        size_t n;
        if (nl) {
            n = (size_t)(nl - start);
            r->pos += n + 1;
        } else {
            // Records handed out in this call point into buf: return them before it moves.
            if (count) return count;
            if (check_record_size(r, err) != 0) return -1;
            int rc = decode_more(r, err);
            if (rc < 0) return -1;
            if (rc == 1) continue;
            if (r->pos == r->len) {  // end of file
                close_file(r);
                continue;
            }
            start = r->buf + r->pos;  // a last line without a newline
            n = r->len - r->pos;
            r->pos = r->len;
        }
        r->line++;
        if (blank(start, n)) continue;
        recs[count++] = (neox_record){.data = start, .size = n, .file = r->files[r->current], .line = r->line, .is_json = 1};
        bytes += n;
        if (count == max_records || bytes >= max_bytes) return count;
    }
}

// ---------------------------------------------------------------------------------------------
// Records

static char *join_paragraphs(const json_t *list, const neox_record *rec, const char *key, size_t *size, neox_error *err) {
    size_t total = 0, i;
    json_t *item;
    json_array_foreach(list, i, item) {
        if (!json_is_string(item)) {
            neox_fail(err, NEOX_EXIT_FAILURE, "%s:%lld: '%s'[%zu] is not a string", rec->file, (long long)rec->line, key, i);
            return NULL;
        }
        total += json_string_length(item) + 2;
    }
    char *out = neox_malloc(total + 1), *p = out;
    json_array_foreach(list, i, item) {
        if (i) memcpy(p, "\n\n", 2), p += 2;
        memcpy(p, json_string_value(item), json_string_length(item));
        p += json_string_length(item);
    }
    *p = 0;
    *size = (size_t)(p - out);
    return out;
}

char *neox_record_text(const neox_record *rec, const char *key, size_t *size, neox_error *err) {
    if (!rec->is_json) {
        *size = rec->size;
        return neox_strndup(rec->data, rec->size);
    }
    json_error_t jerr;
    json_t *root = json_loadb(rec->data, rec->size, JSON_ALLOW_NUL, &jerr);
    if (!root) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s:%lld:%d: invalid JSON: %s", rec->file, (long long)rec->line,
                  jerr.column > 0 ? jerr.column : 1, jerr.text);
        return NULL;
    }
    char *out = NULL;
    json_t *value = json_is_object(root) ? json_object_get(root, key) : NULL;
    if (!json_is_object(root)) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s:%lld:1: expected a JSON object", rec->file, (long long)rec->line);
    } else if (!value) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s:%lld: no key '%s'", rec->file, (long long)rec->line, key);
    } else if (json_is_string(value)) {
        *size = json_string_length(value);
        out = neox_malloc(*size + 1);
        memcpy(out, json_string_value(value), *size);
        out[*size] = 0;
    } else if (json_is_array(value)) {
        out = join_paragraphs(value, rec, key, size, err);
    } else {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s:%lld: '%s' is not a string or a list of strings", rec->file,
                  (long long)rec->line, key);
    }
    json_decref(root);
    return out;
}
