// train.c: byte-level BPE training. Words (GPT-2 pre-tokenizer pieces of the NFKC-normalized,
// space-prefixed input lines) are counted once; then the trainer repeatedly merges the most
// frequent adjacent pair, updating pair counts only in the words that hold the pair (an index from
// pair to words) and taking the next pair from a lazy max-heap (entries whose count went stale
// are re-queued with the current count when they surface). Ties go to the smallest (left, right)
// id pair, which makes the result deterministic. The alphabet is all 256 bytes, so every text
// can be encoded with the result.
#include <string.h>
#include <utf8proc.h>

#include "tokenizer_internal.h"

typedef struct pair_info {
    uint64_t key;          // left << 32 | right
    int64_t count;
    int32_t *words;        // indices of words that may hold the pair (may be stale or repeated)
    size_t n_words, cap_words;
} pair_info;

typedef struct trainer {
    // Words: symbols of word w are sym[off[w] .. off[w] + len[w]).
    strmap word_index;
    int64_t *word_count;
    size_t *off;
    int32_t *len, *sym;
    size_t n_words, cap_words, n_sym, cap_sym;
    int32_t *visited;      // merge number that last touched each word (dedupes where-lists)
    // Pairs.
    pair_info *pairs;
    size_t n_pairs, cap_pairs;
    uint32_t *pair_slots;  // open addressing: index + 1
    size_t pair_mask;
    uint32_t *touched;     // pairs whose count rose during the current merge
    size_t n_touched, cap_touched;
    // Max-heap of (count, pair index).
    struct heap_item { int64_t count; uint32_t pair; } *heap;
    size_t n_heap, cap_heap;
    // Tokens: byte strings.
    char **token_bytes;
    size_t *token_len;
    size_t n_tokens, cap_tokens;
    strmap token_ids;
} trainer;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33, x *= 0xFF51AFD7ED558CCDull, x ^= x >> 33;
    return x;
}

static uint32_t pair_get(trainer *t, int32_t a, int32_t b, bool create) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    if (create && (t->n_pairs + 1) * 2 > t->pair_mask + 1) {
        size_t n = (t->pair_mask + 1) * 2;
        uint32_t *slots = neox_calloc(n, sizeof *slots);
        for (size_t p = 0; p < t->n_pairs; p++) {
            size_t i = mix(t->pairs[p].key) & (n - 1);
            while (slots[i]) i = (i + 1) & (n - 1);
            slots[i] = (uint32_t)p + 1;
        }
        free(t->pair_slots);
        t->pair_slots = slots, t->pair_mask = n - 1;
    }
    size_t i = mix(key) & t->pair_mask;
    for (; t->pair_slots[i]; i = (i + 1) & t->pair_mask)
        if (t->pairs[t->pair_slots[i] - 1].key == key) return t->pair_slots[i] - 1;
    if (!create) return UINT32_MAX;
    if (t->n_pairs == t->cap_pairs) t->pairs = neox_realloc(t->pairs, (t->cap_pairs = t->cap_pairs * 2 + 1024) * sizeof *t->pairs);
    t->pairs[t->n_pairs] = (pair_info){key, 0, NULL, 0, 0};
    t->pair_slots[i] = (uint32_t)++t->n_pairs;
    return (uint32_t)t->n_pairs - 1;
}

static void pair_add(trainer *t, int32_t a, int32_t b, int64_t delta, int32_t word) {
    uint32_t index = pair_get(t, a, b, true);
    pair_info *p = &t->pairs[index];
    p->count += delta;
    if (delta > 0) {
        if (t->visited) {  // during merging: re-queue this pair afterwards
            if (t->n_touched == t->cap_touched)
                t->touched = neox_realloc(t->touched, (t->cap_touched = t->cap_touched * 2 + 64) * sizeof *t->touched);
            t->touched[t->n_touched++] = index;
        }
        if (p->n_words && p->words[p->n_words - 1] == word) return;
        if (p->n_words == p->cap_words) p->words = neox_realloc(p->words, (p->cap_words = p->cap_words * 2 + 4) * sizeof *p->words);
        p->words[p->n_words++] = word;
    }
}

// Heap order: larger count first, then smaller pair key.
static bool heap_before(const trainer *t, const struct heap_item *x, const struct heap_item *y) {
    if (x->count != y->count) return x->count > y->count;
    return t->pairs[x->pair].key < t->pairs[y->pair].key;
}

static void heap_push(trainer *t, int64_t count, uint32_t pair) {
    if (t->n_heap == t->cap_heap) t->heap = neox_realloc(t->heap, (t->cap_heap = t->cap_heap * 2 + 1024) * sizeof *t->heap);
    struct heap_item it = {count, pair};
    size_t i = t->n_heap++;
    while (i > 0 && heap_before(t, &it, &t->heap[(i - 1) / 2])) t->heap[i] = t->heap[(i - 1) / 2], i = (i - 1) / 2;
    t->heap[i] = it;
}

static struct heap_item heap_pop(trainer *t) {
    struct heap_item top = t->heap[0], last = t->heap[--t->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= t->n_heap) break;
        if (c + 1 < t->n_heap && heap_before(t, &t->heap[c + 1], &t->heap[c])) c++;
        if (!heap_before(t, &t->heap[c], &last)) break;
        t->heap[i] = t->heap[c], i = c;
    }
    t->heap[i] = last;
    return top;
}

static int32_t add_token(trainer *t, const char *bytes, size_t len) {
    int32_t id = strmap_get(&t->token_ids, bytes, len);
    if (id >= 0) return id;
    if (t->n_tokens == t->cap_tokens) {
        t->cap_tokens = t->cap_tokens * 2 + 512;
        t->token_bytes = neox_realloc(t->token_bytes, t->cap_tokens * sizeof *t->token_bytes);
        t->token_len = neox_realloc(t->token_len, t->cap_tokens * sizeof *t->token_len);
    }
    id = (int32_t)t->n_tokens++;
    t->token_bytes[id] = neox_malloc(len + 1);
    memcpy(t->token_bytes[id], bytes, len);
    t->token_len[id] = len;
    strmap_put(&t->token_ids, bytes, len, id);
    return id;
}

static void count_word(trainer *t, const uint8_t *w, size_t len) {
    int32_t i = strmap_get(&t->word_index, w, len);
    if (i < 0) {
        i = (int32_t)t->n_words;
        strmap_put(&t->word_index, w, len, i);
        if (t->n_words == t->cap_words) {
            t->cap_words = t->cap_words * 2 + 1024;
            t->word_count = neox_realloc(t->word_count, t->cap_words * sizeof *t->word_count);
            t->off = neox_realloc(t->off, t->cap_words * sizeof *t->off);
            t->len = neox_realloc(t->len, t->cap_words * sizeof *t->len);
        }
        if (t->n_sym + len > t->cap_sym) t->sym = neox_realloc(t->sym, (t->cap_sym = (t->n_sym + len) * 2) * sizeof *t->sym);
        t->word_count[i] = 0, t->off[i] = t->n_sym, t->len[i] = (int32_t)len;
        for (size_t k = 0; k < len; k++) t->sym[t->n_sym++] = w[k];  // byte ids for now; remapped later
        t->n_words++;
    }
    t->word_count[i]++;
}

// One training sequence: NFKC, prefix space, GPT-2 split, count the words.
static void feed_sequence(trainer *t, const char *s, size_t n) {
    if (n == 0) return;
    utf8proc_uint8_t *norm = NULL;
    utf8proc_ssize_t nn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    const uint8_t *text = nn >= 0 ? norm : (const uint8_t *)s;
    size_t size = nn >= 0 ? (size_t)nn : n;
    uint8_t *buf = neox_malloc(size + 1);
    size_t m = 0;
    if (size && text[0] != ' ') buf[m++] = ' ';
    memcpy(buf + m, text, size);
    m += size;
    for (size_t pos = 0; pos < m;) {
        size_t len = pretok_gpt2_next(buf, m, pos);
        count_word(t, buf + pos, len);
        pos += len;
    }
    free(buf);
    free(norm);
}

static int feed_file(trainer *t, const char *path, neox_progress *progress, double *done, neox_error *err) {
    size_t size;
    char *data = neox_read_file(path, &size, err);
    if (!data) return -1;
    char *text = data;
    if (utf8_valid_prefix((const uint8_t *)data, size) != size) {
        neox_warn("%s: invalid UTF-8 read as U+FFFD", path);
        text = utf8_replace_invalid((const uint8_t *)data, size, &size);
    }
    for (size_t pos = 0; pos < size;) {
        char *eol = memchr(text + pos, '\n', size - pos);
        size_t end = eol ? (size_t)(eol - text) + 1 : size;  // a sequence keeps its newline
        feed_sequence(t, text + pos, end - pos);
        pos = end;
        if ((pos & 0xFFFFF) < end - pos + 1) neox_progress_update(progress, *done + (double)pos, NULL);
    }
    *done += (double)size;
    if (text != data) free(text);
    free(data);
    return 0;
}

// Merges (a, b) -> c in every word that holds it, updating the counts of neighbouring pairs.
static void merge_pair(trainer *t, uint32_t pair, int32_t a, int32_t b, int32_t c, int32_t merge_no) {
    // The where-list may grow while we walk it (new pairs are recorded elsewhere), so copy it out.
    pair_info *p = &t->pairs[pair];
    int32_t *words = p->words;
    size_t n_words = p->n_words;
    p->words = NULL, p->n_words = p->cap_words = 0;
    for (size_t k = 0; k < n_words; k++) {
        int32_t w = words[k];
        if (t->visited[w] == merge_no) continue;
        t->visited[w] = merge_no;
        int32_t *s = t->sym + t->off[w];
        int32_t len = t->len[w], o = 0;
        int64_t cnt = t->word_count[w];
        for (int32_t i = 0; i < len; i++) {
            if (i + 1 < len && s[i] == a && s[i + 1] == b) {
                if (o > 0) pair_add(t, s[o - 1], a, -cnt, w), pair_add(t, s[o - 1], c, cnt, w);
                if (i + 2 < len) pair_add(t, b, s[i + 2], -cnt, w), pair_add(t, c, s[i + 2], cnt, w);
                pair_add(t, a, b, -cnt, w);
                s[o++] = c;
                i++;
            } else {
                s[o++] = s[i];
            }
        }
        t->len[w] = o;
    }
    free(words);
}

static void free_trainer(trainer *t) {
    strmap_free(&t->word_index);
    strmap_free(&t->token_ids);
    free(t->word_count), free(t->off), free(t->len), free(t->sym), free(t->visited);
    for (size_t p = 0; p < t->n_pairs; p++) free(t->pairs[p].words);
    free(t->pairs), free(t->pair_slots), free(t->heap), free(t->touched);
    for (size_t i = 0; i < t->n_tokens; i++) free(t->token_bytes[i]);
    free(t->token_bytes), free(t->token_len);
}

static char *bytelevel_text(const trainer *t, int32_t id) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bytelevel_encode((const uint8_t *)t->token_bytes[id], t->token_len[id], &buf, &len, &cap);
    return buf;
}

static json_t *bytelevel_component(void) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
                     "use_regex", 1);
}

static int write_tokenizer_json(const trainer *t, const char *const *special, size_t n_special, json_t *merges,
                                const char *output, neox_error *err) {
    json_t *added = json_array();
    for (size_t i = 0; i < n_special; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)i, "content",
                                               special[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special", 1));
    json_t *vocab = json_object();
    for (size_t i = 0; i < t->n_tokens; i++) {
        char *text = i < n_special ? neox_strdup(special[i]) : bytelevel_text(t, (int32_t)i);
        json_object_set_new(vocab, text, json_integer((json_int_t)i));
        free(text);
    }
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:{s:s}, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation",
                             "padding", "added_tokens", added, "normalizer", "type", "NFKC", "pre_tokenizer",
                             bytelevel_component(), "post_processor", bytelevel_component(), "decoder",
                             bytelevel_component(), "model", model);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: could not serialize the tokenizer", output);
    int rc = neox_atomic_write(output, text, strlen(text), err);
    free(text);
    return rc;
}

int neox_tokenizer_train_bpe(const neox_bpe_train_options *opts, const char *output, neox_error *err) {
    static const char *const default_special[] = {"<|endoftext|>", "<|padding|>"};
    const char *const *special = opts->special_tokens ? opts->special_tokens : default_special;
    size_t n_special = opts->special_tokens ? opts->n_special : 2;
    if (opts->vocab_size < (int64_t)n_special + 256)
        return neox_fail(err, NEOX_EXIT_USAGE, "--vocab-size %lld is below the %zu special tokens + 256 bytes",
                         (long long)opts->vocab_size, n_special);
    if (opts->vocab_size > (1 << 24)) return neox_fail(err, NEOX_EXIT_USAGE, "--vocab-size %lld is too large", (long long)opts->vocab_size);
    trainer t = {0};
    strmap_init(&t.word_index, 1 << 16);
    strmap_init(&t.token_ids, (size_t)opts->vocab_size);
    t.pair_mask = 1023;
    t.pair_slots = neox_calloc(t.pair_mask + 1, sizeof *t.pair_slots);
    int rc = -1;
    json_t *merges = json_array();
    // Ids: the special tokens, then the byte alphabet in code point order of its characters (as HF
    // sorts the alphabet), then merged tokens in merge order.
    for (size_t i = 0; i < n_special; i++) {
        if (strmap_get(&t.token_ids, special[i], strlen(special[i])) >= 0) {
            neox_fail(err, NEOX_EXIT_USAGE, "special token '%s' is given twice", special[i]);
            goto done;
        }
        add_token(&t, special[i], strlen(special[i]));
    }
    int32_t byte_token[256];
    for (uint32_t cp = 0; cp < 256 + 68; cp++) {
        int b = bytelevel_byte_of_char(cp);
        if (b < 0) continue;
        char c = (char)b;
        // A special token may equal a single byte; keep the ids distinct from the strmap then.
        int32_t existing = strmap_get(&t.token_ids, &c, 1);
        byte_token[b] = existing >= (int32_t)n_special ? existing : add_token(&t, &c, 1);
    }
    double done = 0, total = 0;
    for (size_t i = 0; i < opts->n_inputs; i++) {
        FILE *f = fopen(opts->inputs[i], "rb");
        if (!f) {
            neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot open: %m", opts->inputs[i]);
            goto done;
        }
        fseek(f, 0, SEEK_END);
        total += (double)ftell(f);
        fclose(f);
    }
    neox_progress *progress = neox_progress_start("counting words", total, "bytes");
    for (size_t i = 0; i < opts->n_inputs; i++)
        if (feed_file(&t, opts->inputs[i], progress, &done, err) < 0) {
            neox_progress_finish(progress, done, NULL);
            goto done;
        }
    neox_progress_finish(progress, done, NULL);
    // Words as token ids, and the initial pair counts.
    for (size_t k = 0; k < t.n_sym; k++) t.sym[k] = byte_token[t.sym[k]];
    for (size_t w = 0; w < t.n_words; w++) {
        const int32_t *s = t.sym + t.off[w];
        for (int32_t i = 0; i + 1 < t.len[w]; i++) pair_add(&t, s[i], s[i + 1], t.word_count[w], (int32_t)w);
    }
    t.visited = neox_malloc((t.n_words + 1) * sizeof *t.visited);
    for (size_t w = 0; w < t.n_words; w++) t.visited[w] = -1;
    for (uint32_t p = 0; p < t.n_pairs; p++)
        if (t.pairs[p].count > 0) heap_push(&t, t.pairs[p].count, p);
    int64_t target = opts->vocab_size, merges_done = 0;
    progress = neox_progress_start("merging", (double)(target - (int64_t)t.n_tokens), "merges");
    while ((int64_t)t.n_tokens < target && t.n_heap) {
        struct heap_item top = heap_pop(&t);
        pair_info *p = &t.pairs[top.pair];
        if (top.count != p->count) {  // stale: re-queue with the current count
            if (p->count > 0) heap_push(&t, p->count, top.pair);
            continue;
        }
        if (p->count < 1 || p->count < opts->min_frequency) break;
        int32_t a = (int32_t)(p->key >> 32), b = (int32_t)(uint32_t)p->key;
        size_t la = t.token_len[a], lb = t.token_len[b];
        char *joined = neox_malloc(la + lb);
        memcpy(joined, t.token_bytes[a], la);
        memcpy(joined + la, t.token_bytes[b], lb);
        int32_t c = add_token(&t, joined, la + lb);
        free(joined);
        char *ta = a < (int32_t)n_special ? neox_strdup(special[a]) : bytelevel_text(&t, a);
        char *tb = b < (int32_t)n_special ? neox_strdup(special[b]) : bytelevel_text(&t, b);
        char *line = neox_asprintf("%s %s", ta, tb);
        json_array_append_new(merges, json_string(line));
        free(line), free(ta), free(tb);
        merge_pair(&t, top.pair, a, b, c, (int32_t)merges_done++);
        // Pairs whose count rose were recorded with positive deltas; queue them with fresh counts.
        // (Pairs whose count fell are corrected lazily when they surface.)
        for (size_t k = 0; k < t.n_touched; k++) {
            pair_info *q = &t.pairs[t.touched[k]];
            if (q->count > 0) heap_push(&t, q->count, t.touched[k]);
        }
        t.n_touched = 0;
        if ((merges_done & 255) == 0) neox_progress_update(progress, (double)merges_done, NULL);
    }
    neox_progress_finish(progress, (double)merges_done, NULL);
    rc = write_tokenizer_json(&t, special, n_special, merges, output, err);
    merges = NULL;  // owned by the written JSON now
done:
    json_decref(merges);
    free_trainer(&t);
    return rc;
}
