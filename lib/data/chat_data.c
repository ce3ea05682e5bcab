// chat_data.c: chat-formatted jsonl into token and label datasets with GPT-NeoX's masking rule
// (preprocess_data_with_chat_template.py's build_chat). Turn i's tokens are those of the template
// rendered over messages[0..i] (with the generation prompt when the next turn is the generation
// role's), tokenized whole, past the tokens of the turns before: a turn is what its rendering adds.
// Its labels are its tokens when it is the generation role's turn (the last turn only, with
// only_last) and -100 otherwise; an end-of-sequence token closes the conversation, labelled as the
// last turn is. Conversations are processed in input order on one thread (rendering is cheap next to
// training, and the order makes the datasets reproducible). With a reward key, each record's reward
// is kept and written at the end as the reward dataset of every key: int32 when all rewards are
// integers (the bytes GPT-NeoX writes), float32 otherwise (GPT-NeoX would truncate them to int32).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "data.h"

typedef struct {
    int32_t *tokens, *labels;
    size_t n, cap;
    int32_t *scratch;        // the whole rendering's ids, re-encoded per turn
    size_t scratch_len, scratch_cap;
} chat_buffers;

static void push(chat_buffers *b, int32_t token, int32_t label) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        b->tokens = neox_realloc(b->tokens, b->cap * sizeof *b->tokens);
        b->labels = neox_realloc(b->labels, b->cap * sizeof *b->labels);
    }
    b->tokens[b->n] = token;
    b->labels[b->n++] = label;
}

// Renders messages[0..count) and tokenizes the result into b->scratch.
static int render_prefix(const neox_chat_preprocess_options *o, const json_t *messages, size_t count, int generation,
                         chat_buffers *b, neox_error *err) {
    json_t *prefix = json_array();
    for (size_t i = 0; i < count; i++) json_array_append(prefix, json_array_get(messages, i));
    const neox_chat_format *f = o->format;
    neox_chat_context ctx = {.messages = prefix, .bos_token = f->bos_token, .eos_token = f->eos_token,
                             .unk_token = f->unk_token, .pad_token = f->pad_token, .add_generation_prompt = generation};
    size_t size;
    char *text = neox_chat_template_render(f->tmpl, &ctx, &size, err);
    json_decref(prefix);
    if (!text) return -1;
    b->scratch_len = 0;
    int64_t got = neox_tokenizer_encode(o->tok, text, size, &b->scratch, &b->scratch_len, &b->scratch_cap, err);
    free(text);
    return got < 0 ? -1 : 0;
}

static const char *role_of(const json_t *message) { return json_string_value(json_object_get(message, "role")); }

static int check_messages(const neox_chat_preprocess_options *o, const json_t *messages, neox_error *err) {
    if (!json_is_array(messages)) return neox_fail(err, NEOX_EXIT_FAILURE, "the conversation is not a list of messages");
    if (json_array_size(messages) == 0) return neox_fail(err, NEOX_EXIT_FAILURE, "the conversation has no messages");
    int learned = 0;
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *m = json_array_get(messages, i);
        if (!json_is_object(m)) return neox_fail(err, NEOX_EXIT_FAILURE, "message %zu is not an object", i);
        if (!role_of(m)) return neox_fail(err, NEOX_EXIT_FAILURE, "message %zu has no \"role\" string", i);
        learned |= !strcmp(role_of(m), o->generation_role);
    }
    if (!learned && !o->no_mask && !o->for_rm)
        return neox_fail(err, NEOX_EXIT_FAILURE, "the conversation has no '%s' turn: nothing to learn", o->generation_role);
    return 0;
}

// Every token learned (no_mask), or none but a doubled end-of-sequence token (for_rm: the model's
// input drops the last token and its labels the first, so the final prediction is labelled).
static int encode_whole(const neox_chat_preprocess_options *o, const json_t *messages, chat_buffers *b, neox_error *err) {
    if (render_prefix(o, messages, json_array_size(messages), 0, b, err) != 0) return -1;
    for (size_t i = 0; i < b->scratch_len; i++) push(b, b->scratch[i], o->no_mask ? b->scratch[i] : NEOX_LABEL_MASKED);
    if (o->no_mask) return 0;
    if (o->format->eos_id < 0) return neox_fail(err, NEOX_EXIT_USAGE, "--for-rm needs a tokenizer with an eos_token");
    push(b, o->format->eos_id, NEOX_LABEL_MASKED);
    push(b, o->format->eos_id, o->format->eos_id);
    return 0;
}

static int encode_turns(const neox_chat_preprocess_options *o, const json_t *messages, chat_buffers *b, neox_error *err) {
    size_t turns = json_array_size(messages);
    for (size_t i = 0; i < turns; i++) {
        int learned = !strcmp(role_of(json_array_get(messages, i)), o->generation_role) && (!o->only_last || i == turns - 1);
        int generation = i + 1 < turns && !strcmp(role_of(json_array_get(messages, i + 1)), o->generation_role);
        if (render_prefix(o, messages, i + 1, generation, b, err) != 0)
            return neox_fail_context(err, "message %zu", i);
        for (size_t t = b->n; t < b->scratch_len; t++) push(b, b->scratch[t], learned ? b->scratch[t] : NEOX_LABEL_MASKED);
    }
    if (o->format->eos_id >= 0) {
        if (b->n == 0) return neox_fail(err, NEOX_EXIT_FAILURE, "the conversation renders to no tokens");
        push(b, o->format->eos_id, b->labels[b->n - 1] != NEOX_LABEL_MASKED ? o->format->eos_id : NEOX_LABEL_MASKED);
    }
    return 0;
}

int neox_chat_encode(const neox_chat_preprocess_options *o, const json_t *messages, int32_t **tokens,
                     int32_t **labels, size_t *n, neox_error *err) {
    chat_buffers b = {0};
    int rc = check_messages(o, messages, err);
    if (rc == 0) rc = o->no_mask || o->for_rm ? encode_whole(o, messages, &b, err) : encode_turns(o, messages, &b, err);
    free(b.scratch);
    if (rc != 0) {
        free(b.tokens);
        free(b.labels);
        return -1;
    }
    *tokens = b.tokens;
    *labels = b.labels;
    *n = b.n;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// The datasets: {prefix}_{key}_document and {prefix}_{key}_label_document per key (and
// {prefix}_{key}_reward_document with a reward key).

enum { CHAT_CHUNK_RECORDS = 256, CHAT_CHUNK_BYTES = 1 << 20 };

typedef struct {
    double *values;
    size_t n, cap;
} reward_list;

// Python's truth of a JSON value, as `if reward` reads the decoded record.
static int json_truth(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_TRUE: return 1;
    case JSON_FALSE: case JSON_NULL: return 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    default: return json_object_size(v) > 0;
    }
}

// The record's reward as preprocess_data_with_chat_template.py's encode takes it.
static int read_reward(const neox_chat_preprocess_options *o, const json_t *root, double *out, neox_error *err) {
    const json_t *v = json_object_get(root, o->reward_key);
    if (!v) return neox_fail(err, NEOX_EXIT_FAILURE, "no key \"%s\" (--reward-key)", o->reward_key);
    if (o->binary_reward) return *out = json_truth(v) ? 1.0 : -1.0, 0;
    if (json_is_boolean(v)) return *out = json_is_true(v), 0;  // numpy reads True as 1
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < INT32_MIN || x > INT32_MAX)
            return neox_fail(err, NEOX_EXIT_FAILURE, "\"%s\": reward %lld does not fit int32", o->reward_key, (long long)x);
        return *out = (double)x, 0;
    }
    if (json_is_real(v) && isfinite(json_real_value(v))) return *out = json_real_value(v), 0;
    return neox_fail(err, NEOX_EXIT_FAILURE, "\"%s\": the reward must be a number or a boolean (or, with "
                     "--binary-reward, any value, read as true or false)", o->reward_key);
}

static void push_reward(reward_list *r, double v) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 1024;
        r->values = neox_realloc(r->values, r->cap * sizeof *r->values);
    }
    r->values[r->n++] = v;
}

static int write_record(const neox_chat_preprocess_options *o, const neox_record *rec, neox_indexed_writer **writers,
                        reward_list *rewards, neox_preprocess_stats *st, neox_error *err) {
    json_error_t jerr;
    json_t *root = rec->is_json ? json_loadb(rec->data, rec->size, 0, &jerr) : NULL;
    if (!json_is_object(root)) {
        json_decref(root);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%lld: %s", rec->file, (long long)rec->line,
                         !rec->is_json ? "not a jsonl record" : root ? "the record is not a JSON object" : jerr.text);
    }
    int rc = 0;
    if (o->reward_key) {
        double reward = 0.0;
        rc = read_reward(o, root, &reward, err);
        if (rc == 0) push_reward(rewards, reward);
        else neox_fail_context(err, "%s:%lld", rec->file, (long long)rec->line);
    }
    for (int k = 0; k < o->nkeys && rc == 0; k++) {
        const json_t *messages = json_object_get(root, o->keys[k]);
        int32_t *tokens = NULL, *labels = NULL;
        size_t n = 0;
        if (!messages) rc = neox_fail(err, NEOX_EXIT_FAILURE, "no key \"%s\"", o->keys[k]);
        else rc = neox_chat_encode(o, messages, &tokens, &labels, &n, err);
        if (rc == 0) rc = neox_indexed_writer_add_item(writers[2 * k], tokens, n, err);
        if (rc == 0) rc = neox_indexed_writer_add_item(writers[2 * k + 1], labels, n, err);
        if (rc == 0) {
            neox_indexed_writer_end_document(writers[2 * k]);
            neox_indexed_writer_end_document(writers[2 * k + 1]);
            st->tokens += (int64_t)n;
        } else {
            neox_fail_context(err, "%s:%lld: \"%s\"", rec->file, (long long)rec->line, o->keys[k]);
        }
        free(tokens);
        free(labels);
    }
    st->documents++;
    st->text_bytes += (int64_t)rec->size;
    json_decref(root);
    return rc;
}

static neox_indexed_writer **open_chat_writers(const neox_chat_preprocess_options *o, neox_error *err) {
    neox_indexed_writer **writers = neox_calloc(2 * (size_t)o->nkeys, sizeof *writers);
    for (int i = 0; i < 2 * o->nkeys; i++) {
        char *prefix = neox_asprintf("%s_%s%s_document", o->output_prefix, o->keys[i / 2], i % 2 ? "_label" : "");
        writers[i] = neox_indexed_writer_open(prefix, NEOX_DTYPE_I32, err);
        free(prefix);
        if (!writers[i]) {
            for (int j = 0; j < i; j++) neox_indexed_writer_abort(writers[j]);
            free(writers);
            return NULL;
        }
    }
    return writers;
}

static int read_records(const neox_chat_preprocess_options *o, neox_doc_reader *reader, neox_indexed_writer **writers,
                        reward_list *rewards, neox_preprocess_stats *st, neox_error *err) {
    neox_record *recs = neox_malloc(CHAT_CHUNK_RECORDS * sizeof *recs);
    neox_progress *progress = neox_progress_start("preprocess", (double)neox_doc_reader_total_bytes(reader) / 1e6, "MB");
    int n, rc = 0;
    while (rc == 0 && (n = neox_doc_reader_next(reader, recs, CHAT_CHUNK_RECORDS, CHAT_CHUNK_BYTES, err)) > 0) {
        for (int i = 0; i < n && rc == 0; i++) rc = write_record(o, &recs[i], writers, rewards, st, err);
        neox_progress_update(progress, (double)neox_doc_reader_bytes_read(reader) / 1e6, NULL);
    }
    if (rc == 0 && n < 0) rc = -1;
    neox_progress_finish(progress, (double)neox_doc_reader_bytes_read(reader) / 1e6, NULL);
    free(recs);
    return rc;
}

// One key's reward dataset: int32 when every reward is an integer, else float32.
static neox_indexed_writer *reward_writer(const neox_chat_preprocess_options *o, const char *key,
                                          const reward_list *r, neox_error *err) {
    int integral = 1;
    for (size_t i = 0; i < r->n && integral; i++) integral = r->values[i] == floor(r->values[i]);
    char *prefix = neox_asprintf("%s_%s_reward_document", o->output_prefix, key);
    neox_indexed_writer *w = neox_indexed_writer_open(prefix, integral ? NEOX_DTYPE_I32 : NEOX_DTYPE_F32, err);
    free(prefix);
    for (size_t i = 0; w && i < r->n; i++) {
        if (neox_indexed_writer_add_values(w, &r->values[i], 1, err) != 0) {
            neox_indexed_writer_abort(w);
            return NULL;
        }
        neox_indexed_writer_end_document(w);
    }
    return w;
}

// Each key's datasets, committed only when every record was read and every file is ready.
static int commit_all(const neox_chat_preprocess_options *o, neox_indexed_writer **writers, const reward_list *r,
                      int rc, neox_error *err) {
    int nw = 2 * o->nkeys;
    neox_indexed_writer **rw = neox_calloc((size_t)o->nkeys + 1, sizeof *rw);
    for (int k = 0; rc == 0 && o->reward_key && k < o->nkeys; k++)
        if (!(rw[k] = reward_writer(o, o->keys[k], r, err))) rc = -1;
    for (int i = 0; i < nw; i++) {
        if (rc == 0) rc = neox_indexed_writer_commit(writers[i], err);
        else neox_indexed_writer_abort(writers[i]);
    }
    for (int k = 0; k < o->nkeys; k++) {
        if (!rw[k]) continue;
        if (rc == 0) rc = neox_indexed_writer_commit(rw[k], err);
        else neox_indexed_writer_abort(rw[k]);
    }
    free(rw);
    return rc;
}

// A key named like another key's label or reward dataset would overwrite it.
static int check_keys(const neox_chat_preprocess_options *o, neox_error *err) {
    for (int k = 0; k < o->nkeys; k++)
        for (int j = 0; j < o->nkeys; j++) {
            size_t len = strlen(o->keys[k]);
            if (strncmp(o->keys[j], o->keys[k], len)) continue;
            if (!strcmp(o->keys[j] + len, "_label"))
                return neox_fail(err, NEOX_EXIT_USAGE, "--jsonl-keys: '%s' is the label dataset of '%s'", o->keys[j], o->keys[k]);
            if (o->reward_key && !strcmp(o->keys[j] + len, "_reward"))
                return neox_fail(err, NEOX_EXIT_USAGE, "--jsonl-keys: '%s' is the reward dataset of '%s'", o->keys[j], o->keys[k]);
        }
    return 0;
}

int neox_chat_preprocess_run(const neox_chat_preprocess_options *o, neox_preprocess_stats *stats, neox_error *err) {
    memset(stats, 0, sizeof *stats);
    if (check_keys(o, err) != 0) return -1;
    double started = neox_now();
    neox_doc_reader *reader = neox_doc_reader_open(o->inputs, o->ninputs, err);
    if (!reader) return -1;
    if (o->max_document_bytes) neox_doc_reader_set_max_record(reader, o->max_document_bytes);
    neox_indexed_writer **writers = open_chat_writers(o, err);
    reward_list rewards = {0};
    int rc = writers ? read_records(o, reader, writers, &rewards, stats, err) : -1;
    if (writers) rc = commit_all(o, writers, &rewards, rc, err);
    free(rewards.values);
    free(writers);
    stats->input_bytes = neox_doc_reader_bytes_read(reader);
    stats->seconds = neox_now() - started;
    neox_doc_reader_close(reader);
    return rc;
}
