// serve_ranks.c: neox-eval serve over data-parallel ranks. Rank 0 answers HTTP and schedules; each
// batch it takes from its queue travels to the other ranks as completions bodies (prompts as token
// ids, the sampling seed already drawn) through the one request parser, every rank computes the
// choices the assignment gives it, and the others send theirs back to rank 0, which answers. The
// assignment depends on the batch alone, so every rank derives the same one: scoring prompts cut
// into contiguous runs of about equal tokens, then each generated choice to the least loaded rank.
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_job.h"
#include "serve_parse.h"

enum { TAG_RESULTS = 7301 };

// ---- who computes what --------------------------------------------------------------------------
void neox_serve_assign(neox_serve_job **jobs, int n, int ranks) {
    double load[ranks], total = 0, before = 0;
    memset(load, 0, sizeof load);
    for (int i = 0; i < n; i++)
        for (int p = 0; neox_serve_is_scoring(&jobs[i]->req) && p < jobs[i]->req.nprompts; p++)
            total += jobs[i]->req.prompts[p].nids;
    for (int i = 0; i < n; i++) {
        const neox_serve_request *r = &jobs[i]->req;
        jobs[i]->owner = neox_calloc((size_t)r->nprompts * r->n, sizeof *jobs[i]->owner);
        for (int p = 0; neox_serve_is_scoring(r) && p < r->nprompts; p++) {
            int nids = r->prompts[p].nids, o = (int)((before + nids / 2.0) * ranks / total);
            o = o < ranks ? o : ranks - 1;
            for (int k = 0; k < r->n; k++) jobs[i]->owner[p * r->n + k] = o;
            load[o] += nids, before += nids;
        }
    }
    for (int i = 0; i < n; i++) {
        const neox_serve_request *r = &jobs[i]->req;
        for (int c = 0; !neox_serve_is_scoring(r) && c < r->nprompts * r->n; c++) {
            int best = 0;
            for (int k = 1; k < ranks; k++)
                if (load[k] < load[best]) best = k;
            jobs[i]->owner[c] = best;
            load[best] += r->prompts[c / r->n].nids + r->max_tokens;
        }
    }
}

// ---- the batch, rank 0 to all -----------------------------------------------------------------------
// The batch's size announced by rank 0: non-blocking on both sides (MPI matches a non-blocking
// broadcast only with another), as the workers wait for it by polling.
static void announce_size(neox_comm *c, int64_t size) {
    neox_request req;
    neox_ibroadcast(c, &size, 1, NEOX_I64, 0, &req);
    neox_wait(&req);
}

void neox_serve_share(neox_comm *c, neox_serve_job **jobs, int n) {
    json_t *list = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(list, neox_serve_request_json(&jobs[i]->req));
    char *text = json_dumps(list, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(list);
    int64_t size = (int64_t)strlen(text);
    announce_size(c, size);
    neox_broadcast(c, text, (size_t)size, NEOX_U8, 0);
    free(text);
}

void neox_serve_stop_workers(neox_comm *c) { announce_size(c, 0); }

// A worker's next batch size: polled with pauses, so that an idle server's workers sleep instead
// of spinning in MPI (and do not run into the communication timeout).
static int64_t next_batch_size(neox_comm *c) {
    int64_t size = 0;
    neox_request req;
    neox_ibroadcast(c, &size, 1, NEOX_I64, 0, &req);
    while (!neox_test(&req)) nanosleep(&(struct timespec){0, 1000000}, NULL);
    return size;
}

static int receive_batch(neox_comm *c, int64_t size, neox_serve_job ***jobs_out) {
    char *text = neox_malloc((size_t)size + 1);
    neox_broadcast(c, text, (size_t)size, NEOX_U8, 0);
    text[size] = 0;
    json_error_t jerr;
    json_t *list = json_loads(text, 0, &jerr);
    free(text);
    // Rank 0 wrote the batch from requests it had parsed itself: the ranks' own protocol, no input.
    neox_assert(json_is_array(list), "serve: rank 0's batch is not a JSON list: %s", jerr.text);
    int n = (int)json_array_size(list);
    neox_serve_job **jobs = neox_calloc(n ? (size_t)n : 1, sizeof *jobs);
    for (int i = 0; i < n; i++) {
        char *body = json_dumps(json_array_get(list, i), JSON_COMPACT | JSON_REAL_PRECISION(17));
        neox_serve_error e = {0};
        jobs[i] = neox_calloc(1, sizeof *jobs[i]);
        int parsed = neox_serve_parse_request(body, strlen(body), &jobs[i]->req, &e);
        neox_assert(parsed == 0, "serve: request %d of rank 0's batch does not parse: %s", i, e.message);
        free(body);
        jobs[i]->choices = neox_calloc((size_t)jobs[i]->req.nprompts * jobs[i]->req.n, sizeof *jobs[i]->choices);
    }
    json_decref(list);
    *jobs_out = jobs;
    return n;
}

// ---- the results, all to rank 0 ---------------------------------------------------------------------
// A growing byte buffer of records: per computed choice (job, index, nprompt, ngen, stop_at,
// finished) and its arrays; per failed job (job, -1, message length) and the message.
typedef struct bytes {
    unsigned char *data;
    size_t size, cap;
} bytes;

static void put(bytes *b, const void *x, size_t n) {
    if (b->size + n > b->cap) b->data = neox_realloc(b->data, b->cap = 2 * (b->size + n));
    memcpy(b->data + b->size, x, n);
    b->size += n;
}

static void take(const bytes *b, size_t *at, void *x, size_t n) {
    neox_assert(*at + n <= b->size, "serve: a rank's results end early");  // pack_results wrote them
    memcpy(x, b->data + *at, n);
    *at += n;
}

static int top_count(const neox_serve_request *r) { return r->logprobs > 0 ? r->logprobs : 0; }

static void put_choice(bytes *b, int job, int index, const neox_serve_request *r, const neox_serve_choice *c) {
    int32_t head[6] = {job, index, c->nprompt, c->ngen, c->stop_at, c->finished};
    put(b, head, sizeof head);
    size_t len = (size_t)(c->nprompt + c->ngen), k = (size_t)top_count(r) + 1;
    put(b, c->tokens, len * sizeof *c->tokens);
    if (!c->logprob) return;
    put(b, c->logprob, len * sizeof *c->logprob);
    put(b, c->top_ids, len * k * sizeof *c->top_ids);
    put(b, c->top_logprob, len * k * sizeof *c->top_logprob);
}

static void take_choice(const bytes *b, size_t *at, const int32_t head[6], neox_serve_job *job) {
    const neox_serve_request *r = &job->req;
    neox_assert(head[1] >= 0 && head[1] < r->nprompts * r->n, "serve: a rank's results name no choice");
    neox_serve_choice *c = &job->choices[head[1]];
    neox_serve_choice_prepare(r, head[1], c);  // the capacity the computing rank had
    c->nprompt = head[2], c->ngen = head[3], c->stop_at = head[4], c->finished = head[5];
    size_t len = (size_t)(c->nprompt + c->ngen), k = (size_t)top_count(r) + 1;
    take(b, at, c->tokens, len * sizeof *c->tokens);
    if (!c->logprob) return;
    take(b, at, c->logprob, len * sizeof *c->logprob);
    take(b, at, c->top_ids, len * k * sizeof *c->top_ids);
    take(b, at, c->top_logprob, len * k * sizeof *c->top_logprob);
}

// What rank computed of jobs: its choices, and its failures.
static bytes pack_results(neox_serve_job **jobs, int n, int rank) {
    bytes b = {0};
    for (int j = 0; j < n; j++) {
        const neox_serve_request *r = &jobs[j]->req;
        int computed = 0;
        for (int i = 0; i < r->nprompts * r->n; i++) {
            if (jobs[j]->owner[i] != rank || (neox_serve_is_scoring(r) && i % r->n != 0)) continue;
            computed = 1;
            if (!jobs[j]->failed) put_choice(&b, j, i, r, &jobs[j]->choices[i]);
        }
        if (computed && jobs[j]->failed) {
            int32_t len = (int32_t)strlen(jobs[j]->err.message), head[6] = {j, -1, len, 0, 0, 0};
            put(&b, head, sizeof head);
            put(&b, jobs[j]->err.message, (size_t)len);
        }
    }
    return b;
}

static void unpack_results(const bytes *b, neox_serve_job **jobs, int n) {
    for (size_t at = 0; at < b->size;) {
        int32_t head[6];
        take(b, &at, head, sizeof head);
        neox_assert(head[0] >= 0 && head[0] < n, "serve: a rank's results name no request");
        neox_serve_job *job = jobs[head[0]];
        if (head[1] >= 0) {
            take_choice(b, &at, head, job);
            continue;
        }
        size_t len = (size_t)head[2] < sizeof job->err.message ? (size_t)head[2] : sizeof job->err.message - 1;
        take(b, &at, job->err.message, len);
        job->err.message[len] = 0;
        at += (size_t)head[2] - len;
        job->failed = 1;
    }
}

static void send_results(neox_comm *c, const bytes *b) {
    int64_t size = (int64_t)b->size;
    neox_send(c, &size, 1, NEOX_I64, 0, TAG_RESULTS);
    if (size) neox_send(c, b->data, b->size, NEOX_U8, 0, TAG_RESULTS);
}

void neox_serve_collect(neox_comm *c, neox_serve_job **jobs, int n) {
    for (int rank = 1; rank < c->size; rank++) {
        int64_t size = 0;
        neox_recv(c, &size, 1, NEOX_I64, rank, TAG_RESULTS);
        bytes b = {.data = neox_malloc(size ? (size_t)size : 1), .size = (size_t)size};
        if (size) neox_recv(c, b.data, b.size, NEOX_U8, rank, TAG_RESULTS);
        unpack_results(&b, jobs, n);
        free(b.data);
    }
}

// ---- a worker rank ----------------------------------------------------------------------------------
int neox_serve_worker_run(neox_serve_engine *en) {
    // Stopping is rank 0's to decide (it drains its queue first): a signal the launcher forwards here
    // is not an exit. Ignored, not blocked: the OpenMP threads already running would take it.
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    neox_comm *c = &neox_serve_engine_evaluator(en)->grid->data;
    for (int64_t size; (size = next_batch_size(c)) > 0;) {
        neox_serve_job **jobs;
        int n = receive_batch(c, size, &jobs);
        neox_serve_assign(jobs, n, c->size);
        neox_serve_compute(en, jobs, n, c->rank);
        bytes b = pack_results(jobs, n, c->rank);
        send_results(c, &b);
        free(b.data);
        for (int i = 0; i < n; i++) neox_serve_job_free(jobs[i]);
        free(jobs);
    }
    return 0;
}
