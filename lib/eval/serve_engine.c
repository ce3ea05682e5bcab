// serve_engine.c: neox-eval serve's engine. Requests wait in a bounded queue; one scheduler
// thread takes everything queued at once, scores the scoring requests (echo with max_tokens 0, or
// one greedy token: lm-evaluation-harness's loglikelihood requests) together by packing their
// prompts into passes of up to NEOX_SCORE_PACK_ROWS rows, or `context` if more (each in its own
// positions, as neox-eval's batch scoring packs), and generates the others one after the other with the key/value cache. Only
// the rows whose log-probabilities are asked for go through the output layer, as many at a time as
// a 64 MiB block of logits holds (the output layer's weights are read once per block).
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate.h"
#include "kernels/kernels.h"
#include "parallel.h"
#include "serve_job.h"

#define LOGITS_FLOATS (1 << 24)  // the block of logits computed at a time: 64 MiB

// Where a batch's time went, for the debug line after it (serving's own profile).
typedef struct serve_times {
    double decoder, output, rows, respond;
    long long passes, rows_out;
} serve_times;

struct neox_serve_engine {
    neox_evaluator *ev;
    neox_serve_options o;
    neox_generator *scorer, *gen;   // packed scoring; generation with the cache (data-parallel ranks)
    neox_generator *batch;          // batched decoding (one rank): o.decode_slots sequences at once
    float *logits;                  // chunk x vocab
    int chunk;                      // rows of logits at a time
    serve_times t;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    int locks, started, stopping, closed;
    int pending;                    // queued or running
    neox_serve_job *head, *tail;
    long long next_id;
};

const neox_serve_options *neox_serve_engine_options(const neox_serve_engine *en) { return &en->o; }

void neox_serve_choice_release(neox_serve_choice *c) {
    free(c->tokens);
    free(c->logprob);
    free(c->top_ids);
    free(c->top_logprob);
    *c = (neox_serve_choice){0};
}

void neox_serve_job_free(neox_serve_job *job) {
    for (int i = 0; job->choices && i < job->req.nprompts * job->req.n; i++) neox_serve_choice_release(&job->choices[i]);
    free(job->choices);
    free(job->owner);
    neox_serve_request_release(&job->req);
    free(job);
}

// ---- per-row statistics -----------------------------------------------------------------------
static int32_t argmax_of(const float *row, int V) {
    int32_t best = 0;
    for (int v = 1; v < V; v++)
        if (row[v] > row[best]) best = v;
    return best;
}

// The k most likely ids of a row and their log-probabilities (lse: the row's log-sum-exp, from the
// cross-entropy kernel as neox-eval's scoring takes it).
static void top_of(const float *row, int V, float lse, int k, int32_t *top_ids, double *top_lp) {
    // Insertion into the k best so far: k is at most NEOX_SERVE_MAX_LOGPROBS.
    int have = 0;
    for (int v = 0; v < V && k > 0; v++) {
        if (have == k && row[v] <= row[top_ids[k - 1]]) continue;
        int at = have < k ? have++ : k - 1;
        while (at > 0 && row[top_ids[at - 1]] < row[v]) top_ids[at] = top_ids[at - 1], at--;
        top_ids[at] = v;
    }
    for (int i = 0; i < have; i++) top_lp[i] = -(double)(lse - row[top_ids[i]]);
}

// ---- choices --------------------------------------------------------------------------------------
static int wants_logprobs(const neox_serve_request *r) { return r->logprobs >= 0; }
static int top_count(const neox_serve_request *r) { return r->logprobs > 0 ? r->logprobs : 0; }

static void choice_alloc(neox_serve_choice *c, const neox_serve_request *r, const neox_serve_prompt *p, int max_gen) {
    int shown = r->echo ? p->nids : 0, cap = shown + max_gen + 1, k = top_count(r);
    c->tokens = neox_malloc((size_t)cap * sizeof *c->tokens);
    memcpy(c->tokens, p->ids, (size_t)shown * sizeof *c->tokens);
    c->nprompt = shown;
    c->stop_at = -1;
    if (!wants_logprobs(r)) return;
    c->logprob = neox_malloc((size_t)cap * sizeof *c->logprob);
    c->top_ids = neox_calloc((size_t)cap * (k + 1), sizeof *c->top_ids);
    c->top_logprob = neox_calloc((size_t)cap * (k + 1), sizeof *c->top_logprob);
    for (int i = 0; i < cap; i++) c->logprob[i] = NAN;
}

void neox_serve_choice_prepare(const neox_serve_request *r, int index, neox_serve_choice *c) {
    choice_alloc(c, r, &r->prompts[index / r->n], neox_serve_is_scoring(r) ? 1 : r->max_tokens);
}

static void choice_copy(neox_serve_choice *dst, const neox_serve_choice *src, const neox_serve_request *r, int cap) {
    int k = top_count(r);
    *dst = *src;
    dst->tokens = neox_malloc((size_t)cap * sizeof *dst->tokens);
    memcpy(dst->tokens, src->tokens, (size_t)cap * sizeof *dst->tokens);
    if (!src->logprob) return;
    dst->logprob = neox_malloc((size_t)cap * sizeof *dst->logprob);
    memcpy(dst->logprob, src->logprob, (size_t)cap * sizeof *dst->logprob);
    dst->top_ids = neox_malloc((size_t)cap * (k + 1) * sizeof *dst->top_ids);
    memcpy(dst->top_ids, src->top_ids, (size_t)cap * (k + 1) * sizeof *dst->top_ids);
    dst->top_logprob = neox_malloc((size_t)cap * (k + 1) * sizeof *dst->top_logprob);
    memcpy(dst->top_logprob, src->top_logprob, (size_t)cap * (k + 1) * sizeof *dst->top_logprob);
}

// ---- scoring: echo and one greedy token, packed -----------------------------------------------------
int neox_serve_is_scoring(const neox_serve_request *r) {
    return r->max_tokens == 0 || (r->max_tokens == 1 && (r->temperature == 0.0 || r->top_k == 1));
}

// One sequence of a pass: a prompt and the choice that gets its rows.
typedef struct score_seq {
    const neox_serve_prompt *p;
    const neox_serve_request *r;
    neox_serve_choice *c;
} score_seq;

// The first row of a sequence that goes through the output layer: every one when the prompt's
// log-probabilities are returned, else only the last (for the generated token), else none. The
// last row is for the generated token only.
static int first_row(const score_seq *s) {
    if (s->r->echo && wants_logprobs(s->r)) return 0;
    return s->r->max_tokens == 1 ? s->p->nids - 1 : s->p->nids;
}

// Row t of sequence s predicts prompt token t + 1, or (the last row, when max_tokens is 1) the
// generated token: the greedy one among the tokenizer's ids (the padding rows of the embedding are
// no tokens, as in generation). best: the row's argmax over the whole vocabulary.
static int row_target(const neox_serve_engine *en, const score_seq *s, int t, const float *row, int best) {
    if (t != s->p->nids - 1) return s->p->ids[t + 1];
    int ntok = (int)neox_tokenizer_vocab_size(en->ev->tokenizer);
    return best < ntok ? best : argmax_of(row, ntok);
}

// Stores row t's results: -loss is log p(target), as neox-eval's loglikelihood sums it; with one
// alternative asked for (the harness's logprobs 1) it is the row's argmax.
static void take_row(neox_serve_engine *en, const score_seq *s, int t, const float *row, int target, float loss,
                     float lse, int best) {
    const neox_serve_request *r = s->r;
    neox_serve_choice *c = s->c;
    int V = en->ev->model->desc.vocab_size, k = top_count(r);
    int generated = t == s->p->nids - 1, slot = generated ? c->nprompt : t + 1;
    if (wants_logprobs(r)) {
        c->logprob[slot] = -(double)loss;
        int32_t *ids = c->top_ids + (size_t)slot * (k + 1);
        double *lps = c->top_logprob + (size_t)slot * (k + 1);
        if (k == 1) ids[0] = best, lps[0] = -(double)(lse - row[best]);
        else top_of(row, V, lse, k, ids, lps);
    }
    if (generated) {
        c->tokens[c->nprompt + c->ngen++] = target;
        c->finished = neox_evaluator_ends_text(en->ev, target);
    }
}

// The argmax of each of m rows (the first of equal maxima, as argmax_of), in parallel over the rows:
// the vectorised row maximum, then where it first occurs.
static void rows_argmax(int *best, const float *logits, int m, int V) {
    float mx[m];
    neox_cross_entropy_row_max(mx, logits, m, V, NEOX_ELEM_F32);
    #pragma omp parallel for
    for (int j = 0; j < m; j++) {
        const float *row = logits + (size_t)j * V;
        int v = 0;
        while (v < V - 1 && row[v] != mx[j]) v++;
        best[j] = v;
    }
}

// Runs one pass over seqs[0..count): packed through the decoder, the wanted rows through the
// output layer en->chunk at a time.
static int score_pass(neox_serve_engine *en, const score_seq *seqs, int count, neox_error *err) {
    int total = 0, nrows = 0, lens[count], starts[count];
    for (int i = 0; i < count; i++) starts[i] = total, total += lens[i] = seqs[i].p->nids;
    int32_t *ids = neox_malloc((size_t)total * sizeof *ids);
    int *rows = neox_malloc((size_t)total * sizeof *rows), *owner = neox_malloc((size_t)total * sizeof *owner);
    for (int i = 0, at = 0; i < count; at += lens[i++]) {
        memcpy(ids + at, seqs[i].p->ids, (size_t)lens[i] * sizeof *ids);
        int end = seqs[i].r->max_tokens == 1 ? lens[i] : lens[i] - 1;
        for (int t = first_row(&seqs[i]); t < end; t++) rows[nrows] = at + t, owner[nrows++] = i;
    }
    double t0 = neox_now();
    int rc = neox_generator_score_packed(en->scorer, ids, lens, count, err);
    en->t.decoder += neox_now() - t0;
    int V = en->ev->model->desc.vocab_size, chunk = en->chunk;
    int *targets = neox_malloc((size_t)chunk * sizeof *targets), *best = neox_malloc((size_t)chunk * sizeof *best);
    float *losses = neox_malloc((size_t)chunk * sizeof *losses), *lse = neox_malloc((size_t)chunk * sizeof *lse);
    for (int j0 = 0; rc == 0 && j0 < nrows; j0 += chunk) {
        int m = nrows - j0 < chunk ? nrows - j0 : chunk;
        double t1 = neox_now();
        neox_generator_rows_logits(en->scorer, rows + j0, m, en->logits);
        double t2 = neox_now();
        rows_argmax(best, en->logits, m, V);
        for (int j = 0; j < m; j++) {
            int i = owner[j0 + j];
            targets[j] = row_target(en, &seqs[i], rows[j0 + j] - starts[i], en->logits + (size_t)j * V, best[j]);
        }
        neox_cross_entropy_forward(losses, lse, en->logits, targets, m, V, NEOX_ELEM_F32);
        for (int j = 0; j < m; j++) {
            int i = owner[j0 + j];
            take_row(en, &seqs[i], rows[j0 + j] - starts[i], en->logits + (size_t)j * V, targets[j], losses[j], lse[j],
                     best[j]);
        }
        en->t.output += t2 - t1;
        en->t.rows += neox_now() - t2;
    }
    if (rc == 0) en->ev->tokens_scored += total, en->t.passes++, en->t.rows_out += nrows;
    free(ids);
    free(rows);
    free(owner);
    free(targets);
    free(best);
    free(losses);
    free(lse);
    return rc;
}

// Scores every sequence, as many to a pass as fit the scorer's rows.
static int score_all(neox_serve_engine *en, score_seq *seqs, int n, neox_error *err) {
    int pass_rows = neox_generator_rows(en->scorer);
    for (int i = 0; i < n;) {
        int count = 0, rows = 0;
        while (i + count < n && (count == 0 || rows + seqs[i + count].p->nids <= pass_rows))
            rows += seqs[i + count++].p->nids;
        if (score_pass(en, seqs + i, count, err) != 0) return -1;
        i += count;
    }
    return 0;
}

static int mine(const neox_serve_job *job, int choice, int rank) { return !job->owner || job->owner[choice] == rank; }

// The first completion of each prompt of every scoring job that rank owns, in one list, scored
// together; the other n - 1 completions of a prompt are copies (scoring is deterministic), made
// once every rank's part is in (copy_scored).
static int score_jobs(neox_serve_engine *en, neox_serve_job **jobs, int njobs, int rank, neox_error *err) {
    int n = 0, cap = 0;
    score_seq *seqs = NULL;
    for (int j = 0; j < njobs; j++)
        for (int p = 0; p < jobs[j]->req.nprompts; p++) {
            int first = p * jobs[j]->req.n;
            if (!mine(jobs[j], first, rank)) continue;
            if (n == cap) seqs = neox_realloc(seqs, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *seqs);
            neox_serve_choice *c = &jobs[j]->choices[first];
            neox_serve_choice_prepare(&jobs[j]->req, first, c);
            seqs[n++] = (score_seq){&jobs[j]->req.prompts[p], &jobs[j]->req, c};
        }
    int rc = score_all(en, seqs, n, err);
    free(seqs);
    return rc;
}

static void copy_scored(neox_serve_job *job) {
    const neox_serve_request *r = &job->req;
    for (int p = 0; p < r->nprompts; p++)
        for (int k = 1; k < r->n; k++) {
            int cap = (r->echo ? r->prompts[p].nids : 0) + 2;
            choice_copy(&job->choices[p * r->n + k], &job->choices[p * r->n], r, cap);
        }
}

// ---- generation with the key/value cache ----------------------------------------------------------
typedef struct gen_hook_ctx {
    neox_serve_engine *en;
    const neox_serve_request *r;
    neox_serve_choice *c;
} gen_hook_ctx;

// Whether the decoded generated text contains a stop string; *at gets where the first begins.
static int find_stop(const neox_serve_engine *en, const neox_serve_request *r, const int32_t *gen, int n, int *at) {
    if (r->nstop == 0) return 0;
    size_t size;
    neox_error err = {0};
    char *text = neox_tokenizer_decode(en->ev->tokenizer, gen, (size_t)n, &size, &err);
    if (!text) return 0;
    int found = 0;
    for (int i = 0; i < r->nstop; i++) {
        const char *hit = strstr(text, r->stop[i]);
        if (hit && (!found || hit - text < *at)) *at = (int)(hit - text), found = 1;
    }
    free(text);
    return found;
}

static int on_token(void *ctx, const int32_t *gen, int n, const float *logits) {
    gen_hook_ctx *h = ctx;
    neox_serve_choice *c = h->c;
    int slot = c->nprompt + n - 1, k = top_count(h->r);
    c->tokens[slot] = gen[n - 1];
    c->ngen = n;
    if (wants_logprobs(h->r)) {
        int V = h->en->ev->model->desc.vocab_size, target = gen[n - 1];
        float loss, lse;
        neox_cross_entropy_forward(&loss, &lse, logits, &target, 1, V, NEOX_ELEM_F32);
        c->logprob[slot] = -(double)loss;
        top_of(logits, V, lse, k, c->top_ids + (size_t)slot * (k + 1), c->top_logprob + (size_t)slot * (k + 1));
    }
    int at;
    if (find_stop(h->en, h->r, gen, n, &at)) {
        c->stop_at = at;
        return 1;
    }
    return 0;
}

static neox_sampling sampling_of(const neox_serve_request *r, unsigned long long seed, int vocab) {
    if (r->temperature == 0.0 || r->top_k == 1 || r->top_p == 0.0) return (neox_sampling){.seed = seed, .vocab = vocab};
    return (neox_sampling){.temperature = r->temperature, .top_k = r->top_k > 0 ? r->top_k : 0,
                           .top_p = r->top_p < 1.0 ? r->top_p : 0.0, .seed = seed, .vocab = vocab};
}

// Readies completion k of request r in c: its fields, and the echoed prompt's log-probabilities from a
// scoring pass of its own where they are asked for.
static int prepare_choice(neox_serve_engine *en, const neox_serve_request *r, int k, neox_serve_choice *c,
                          neox_error *err) {
    const neox_serve_prompt *p = &r->prompts[k / r->n];
    neox_serve_choice_prepare(r, k, c);
    if (!(r->echo && wants_logprobs(r) && p->nids > 1)) return 0;
    neox_serve_request prompt_only = *r;
    prompt_only.max_tokens = 0;
    score_seq s = {p, &prompt_only, c};
    return score_pass(en, &s, 1, err);
}

// Completion k (prompt-major) of a generation job: the echoed prompt's log-probabilities from a
// scoring pass of its own, then the cached generation.
static int generate_choice(neox_serve_engine *en, neox_serve_job *job, int k, unsigned long long seed, neox_error *err) {
    const neox_serve_request *r = &job->req;
    const neox_serve_prompt *p = &r->prompts[k / r->n];
    neox_serve_choice *c = &job->choices[k];
    if (prepare_choice(en, r, k, c, err) != 0) return -1;
    if (r->max_tokens == 0) return 0;
    neox_sampling smp = sampling_of(r, neox_hash64(seed, (unsigned long long)k), (int)neox_tokenizer_vocab_size(en->ev->tokenizer));
    gen_hook_ctx h = {en, r, c};
    neox_generation g;
    int rc = neox_generate_hooked(en->gen, p->ids, p->nids, r->max_tokens, &smp, en->ev->end_ids, en->ev->nend, on_token, &h, &g, err);
    if (rc == 0) c->finished = g.finished;
    free(g.tokens);
    return rc;
}

static int generate_job(neox_serve_engine *en, neox_serve_job *job, int rank, neox_error *err) {
    for (int k = 0; k < job->req.nprompts * job->req.n; k++)
        if (mine(job, k, rank) && generate_choice(en, job, k, job->req.seed, err) != 0) return -1;
    return 0;
}

void neox_serve_compute(neox_serve_engine *en, neox_serve_job **jobs, int n, int rank) {
    neox_serve_job *scoring[n ? n : 1];
    int ns = 0;
    for (int i = 0; i < n; i++)
        if (neox_serve_is_scoring(&jobs[i]->req)) scoring[ns++] = jobs[i];
    neox_error err = {0};
    if (ns > 0 && score_jobs(en, scoring, ns, rank, &err) != 0)
        for (int i = 0; i < ns; i++) scoring[i]->failed = 1, scoring[i]->err = err;
    for (int i = 0; i < n; i++)
        if (!neox_serve_is_scoring(&jobs[i]->req) && generate_job(en, jobs[i], rank, &jobs[i]->err) != 0) jobs[i]->failed = 1;
    if (n == 0 || !jobs[0]->owner) return;
    int owned = 0, total = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < jobs[i]->req.nprompts * jobs[i]->req.n; c++) owned += jobs[i]->owner[c] == rank, total++;
    neox_debug("serving: computed %d of the batch's %d completions", owned, total);
}

neox_evaluator *neox_serve_engine_evaluator(neox_serve_engine *en) { return en->ev; }

// ---- the scheduler ----------------------------------------------------------------------------------
static void finish(neox_serve_engine *en, neox_serve_job *job) {
    int failed = job->failed;
    const neox_error *err = &job->err;
    neox_serve_error e = {0};
    char *body = NULL;
    if (!failed)
        body = job->req.chat ? neox_serve_chat_body(job, en->ev, en->o.model_name, &e)
                             : neox_serve_completion_body(job, en->ev, en->o.model_name, &e);
    else neox_serve_error_set(&e, 500, "server_error", NULL, "%s", err->message);
    if (!body) body = neox_serve_error_body(&e);
    job->done(job->ctx, body && !failed && !e.http_status ? 200 : (e.http_status ? e.http_status : 500), body);
    neox_serve_job_free(job);
    pthread_mutex_lock(&en->lock);
    en->pending--;
    pthread_cond_broadcast(&en->wake);
    pthread_mutex_unlock(&en->lock);
}

static void prepare_job(neox_serve_job *j) {
    j->choices = neox_calloc((size_t)j->req.nprompts * j->req.n, sizeof *j->choices);
    j->left = j->req.nprompts * j->req.n;
    if (!j->req.has_seed)  // drawn here, so that whichever rank samples a completion draws the same
        j->req.seed = (unsigned long long)time(NULL) ^ (unsigned long long)j->id, j->req.has_seed = 1;
}

// ---- batched decoding (one rank) ----------------------------------------------------------------
// Every generation completion in flight holds a slot of en->batch; each step decodes one token of
// all of them in one pass over the weights. Between steps, requests queued since join: scoring
// ones are answered at once, generation ones take the slots that free up. A completion leaves its
// slot when it ends (end of document, a stop string, max_tokens, the context) or when its client
// has closed the connection; a request is answered when its last completion ends.
typedef struct decode_seq {
    neox_serve_job *job;
    int k;                      // the choice (prompt-major)
    neox_sampling smp;
    unsigned long long draws;   // its sampling draws so far
    int32_t *gen;               // generated ids (max_tokens)
    int n, nprompt;
    int32_t next;               // the token the next step appends
} decode_seq;

typedef struct decoder {
    neox_serve_engine *en;
    decode_seq *slot[NEOX_DECODE_MAX_ROWS];
    neox_serve_job **jobs;      // generation jobs with completions not yet started, in order
    int njobs, cap, next_k;     // next_k: the first job's next completion to start
} decoder;

static void job_done_choice(neox_serve_engine *en, neox_serve_job *job) {
    if (--job->left == 0) finish(en, job);
}

// A job whose computation failed or whose client left: its other completions are dropped (those in
// slots leave them) and it is answered (an error body, to nobody when the client left).
static void drop_job(decoder *d, neox_serve_job *job) {
    for (int s = 0; s < NEOX_DECODE_MAX_ROWS; s++)
        if (d->slot[s] && d->slot[s]->job == job) free(d->slot[s]->gen), free(d->slot[s]), d->slot[s] = NULL;
    int first = d->njobs > 0 && d->jobs[0] == job;
    for (int i = 0; i < d->njobs; i++)
        if (d->jobs[i] == job) memmove(d->jobs + i, d->jobs + i + 1, (size_t)(--d->njobs - i) * sizeof *d->jobs), i--;
    if (first) d->next_k = 0;
    job->failed = 1;
    finish(d->en, job);
}

// The slot's latest logits: the next token, its log-probabilities and stop strings. Returns 1 when
// the completion has ended.
static int take_token(decoder *d, decode_seq *q, int slot) {
    neox_serve_engine *en = d->en;
    const neox_serve_request *r = &q->job->req;
    neox_serve_choice *c = &q->job->choices[q->k];
    const float *logits = neox_generator_slot_logits(en->batch, slot);
    q->next = neox_sample_token(logits, en->ev->model->desc.vocab_size, &q->smp, &q->draws);
    q->gen[q->n++] = q->next;
    gen_hook_ctx h = {en, r, c};
    int stopped = on_token(&h, q->gen, q->n, logits);
    for (int i = 0; i < en->ev->nend; i++) stopped |= q->next == en->ev->end_ids[i];
    if (stopped) c->finished = 1;
    return stopped || q->n == r->max_tokens || q->nprompt + q->n == en->o.context;
}

// Ends the completion in slot s: the slot is free, its job answered if this was its last.
static void end_seq(decoder *d, int s) {
    decode_seq *q = d->slot[s];
    d->slot[s] = NULL;
    neox_serve_job *job = q->job;
    free(q->gen);
    free(q);
    job_done_choice(d->en, job);
}

// Starts completion k of job in free slot s: the echoed prompt's log-probabilities, then its prompt
// through the decoder and its first token. Returns -1 (job->err set) when computing fails.
static int start_seq(decoder *d, neox_serve_job *job, int k, int s) {
    neox_serve_engine *en = d->en;
    const neox_serve_request *r = &job->req;
    const neox_serve_prompt *p = &r->prompts[k / r->n];
    neox_serve_choice *c = &job->choices[k];
    if (prepare_choice(en, r, k, c, &job->err) != 0) return -1;
    if (r->max_tokens == 0) {
        job_done_choice(en, job);
        return 0;
    }
    if (neox_generator_prefill(en->batch, s, p->ids, p->nids, &job->err) != 0) return -1;
    decode_seq *q = neox_calloc(1, sizeof *q);
    *q = (decode_seq){.job = job, .k = k, .nprompt = p->nids, .gen = neox_malloc((size_t)r->max_tokens * sizeof *q->gen),
                      .smp = sampling_of(r, neox_hash64(r->seed, (unsigned long long)k), (int)neox_tokenizer_vocab_size(en->ev->tokenizer))};
    d->slot[s] = q;
    if (take_token(d, q, s)) end_seq(d, s);
    return 0;
}

static void add_job(decoder *d, neox_serve_job *job) {
    if (d->njobs == d->cap) d->jobs = neox_realloc(d->jobs, (size_t)(d->cap = d->cap ? 2 * d->cap : 16) * sizeof *d->jobs);
    d->jobs[d->njobs++] = job;
}

// Fills free slots with the waiting completions, first come first served.
static void admit(decoder *d) {
    for (int s = 0; s < d->en->o.decode_slots && d->njobs > 0; s++) {
        if (d->slot[s]) continue;
        neox_serve_job *job = d->jobs[0];
        int k = d->next_k++;
        if (d->next_k == job->req.nprompts * job->req.n) {  // its last completion: the job leaves the queue
            memmove(d->jobs, d->jobs + 1, (size_t)--d->njobs * sizeof *d->jobs);
            d->next_k = 0;
        }
        if (start_seq(d, job, k, s) != 0) drop_job(d, job);
        else if (!d->slot[s]) s--;  // it ended at once: the slot is free again
    }
}

// Requests queued since the decoding began: scoring ones answered now, generation ones waiting for slots.
static void take_queued(decoder *d) {
    neox_serve_engine *en = d->en;
    pthread_mutex_lock(&en->lock);
    neox_serve_job *list = en->head;
    en->head = en->tail = NULL;
    pthread_mutex_unlock(&en->lock);
    for (neox_serve_job *j = list, *next; j; j = next) {
        next = j->next;
        prepare_job(j);
        if (!neox_serve_is_scoring(&j->req)) {
            add_job(d, j);
            continue;
        }
        neox_serve_compute(en, &j, 1, 0);
        if (!j->failed) copy_scored(j);
        finish(en, j);
    }
}

// Completions whose clients have closed their connections leave their slots.
static void drop_gone(decoder *d) {
    for (int s = 0; s < NEOX_DECODE_MAX_ROWS; s++) {
        neox_serve_job *job = d->slot[s] ? d->slot[s]->job : NULL;
        if (!job || !job->gone || !job->gone(job->ctx)) continue;
        neox_debug("serving: request %lld cancelled: its client closed the connection", job->id);
        neox_fail(&job->err, NEOX_EXIT_FAILURE, "the client closed the connection");
        drop_job(d, job);
    }
}

// One step over every occupied slot. Returns 0 when none is.
static int decode_step(decoder *d) {
    int slots[NEOX_DECODE_MAX_ROWS], count = 0;
    int32_t tokens[NEOX_DECODE_MAX_ROWS];
    for (int s = 0; s < NEOX_DECODE_MAX_ROWS; s++)
        if (d->slot[s]) slots[count] = s, tokens[count++] = d->slot[s]->next;
    if (count == 0) return 0;
    neox_error err = {0};
    if (neox_generator_decode(d->en->batch, slots, tokens, count, &err) != 0) {
        for (int i = 0; i < count; i++)
            if (d->slot[slots[i]]) d->slot[slots[i]]->job->err = err, drop_job(d, d->slot[slots[i]]->job);
        return 1;
    }
    for (int i = 0; i < count; i++)
        if (take_token(d, d->slot[slots[i]], slots[i])) end_seq(d, slots[i]);
    return 1;
}

static void decode_jobs(neox_serve_engine *en, neox_serve_job **jobs, int n) {
    decoder d = {.en = en};
    for (int i = 0; i < n; i++) add_job(&d, jobs[i]);
    for (;;) {
        take_queued(&d);
        drop_gone(&d);
        admit(&d);
        if (!decode_step(&d) && d.njobs == 0) break;
    }
    free(d.jobs);
}

// Runs everything taken from the queue: the scoring jobs together, then each generation job; on
// one rank the scoring answers go out before generation starts, over several ranks every rank's
// share is in before any answer.
static void run_batch(neox_serve_engine *en, neox_serve_job *list) {
    int n = 0;
    for (neox_serve_job *j = list; j; j = j->next) n++;
    neox_serve_job *jobs[n];
    n = 0;
    for (neox_serve_job *j = list; j; j = j->next) prepare_job(jobs[n++] = j);
    neox_comm *data = &en->ev->grid->data;
    if (data->size > 1) {
        neox_serve_share(data, jobs, n);
        neox_serve_assign(jobs, n, data->size);
        neox_serve_compute(en, jobs, n, 0);
        neox_serve_collect(data, jobs, n);
        for (int i = 0; i < n; i++) {
            if (!jobs[i]->failed && neox_serve_is_scoring(&jobs[i]->req)) copy_scored(jobs[i]);
            finish(en, jobs[i]);
        }
        return;
    }
    neox_serve_job *scoring[n], *other[n];
    int ns = 0, no = 0;
    for (int i = 0; i < n; i++) {
        if (neox_serve_is_scoring(&jobs[i]->req)) scoring[ns++] = jobs[i];
        else other[no++] = jobs[i];
    }
    en->t = (serve_times){0};
    neox_serve_compute(en, scoring, ns, 0);
    double t0 = neox_now();
    for (int i = 0; i < ns; i++) {
        if (!scoring[i]->failed) copy_scored(scoring[i]);
        finish(en, scoring[i]);
    }
    en->t.respond += neox_now() - t0;
    if (no > 0) decode_jobs(en, other, no);
    if (ns > 0)
        neox_debug("serving: %d scoring requests in %lld passes, %lld rows through the output layer: decoder %.3f s, "
                   "output layer %.3f s, log-softmax and argmax %.3f s, responses %.3f s",
                   ns, en->t.passes, en->t.rows_out, en->t.decoder, en->t.output, en->t.rows, en->t.respond);
}

static void *scheduler(void *arg) {
    neox_serve_engine *en = arg;
    for (;;) {
        pthread_mutex_lock(&en->lock);
        while (!en->head && !en->stopping) pthread_cond_wait(&en->wake, &en->lock);
        neox_serve_job *list = en->head;
        en->head = en->tail = NULL;
        int stop = !list && en->stopping;
        pthread_mutex_unlock(&en->lock);
        if (stop) break;
        run_batch(en, list);
    }
    if (en->ev->grid->data.size > 1) neox_serve_stop_workers(&en->ev->grid->data);
    return NULL;
}

neox_serve_engine *neox_serve_engine_create(neox_evaluator *ev, const neox_serve_options *o, neox_error *err) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (ev->grid->data_size > 1 && level < MPI_THREAD_SERIALIZED) {  // rank 0's scheduler thread talks to the others
        neox_fail(err, NEOX_EXIT_FAILURE, "neox-eval serve on %d ranks needs MPI_THREAD_SERIALIZED; this MPI gives less",
                  ev->grid->data_size);
        return NULL;
    }
    neox_serve_engine *en = neox_calloc(1, sizeof *en);
    en->ev = ev;
    en->o = *o;
    int pass_rows = o->context > NEOX_SCORE_PACK_ROWS ? o->context : NEOX_SCORE_PACK_ROWS;
    int one_rank = ev->grid->data_size == 1;
    if (!(en->scorer = neox_generator_create_packed(ev->model, pass_rows, o->context, err)) ||
        (one_rank && !(en->batch = neox_generator_create_batch(ev->model, o->decode_slots, o->context, err))) ||
        (!one_rank && !(en->gen = neox_generator_create(ev->model, o->context, 0, err)))) {
        neox_serve_engine_free(en);
        return NULL;
    }
    // The scorer holds up to pass_rows rows (a pass never has more).
    int V = ev->model->desc.vocab_size;
    en->chunk = LOGITS_FLOATS / V > 32 ? LOGITS_FLOATS / V : 32;
    if (en->chunk > pass_rows) en->chunk = pass_rows;
    en->logits = neox_malloc((size_t)en->chunk * V * sizeof *en->logits);
    pthread_mutex_init(&en->lock, NULL);
    pthread_cond_init(&en->wake, NULL);
    en->locks = 1;
    if (ev->grid->data_rank != 0) return en;  // a worker: neox_serve_worker_run
    // SIGTERM and SIGINT are for the HTTP front end's sigwait: blocked here, before the scheduler
    // (and the OpenMP threads it starts) inherit the mask, so no other thread takes them.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    if (pthread_create(&en->thread, NULL, scheduler, en) != 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "cannot start the scheduler thread");
        neox_serve_engine_free(en);
        return NULL;
    }
    en->started = 1;
    return en;
}

void neox_serve_engine_free(neox_serve_engine *en) {
    if (!en) return;
    if (en->started) {
        pthread_mutex_lock(&en->lock);
        en->stopping = 1;
        pthread_cond_broadcast(&en->wake);
        pthread_mutex_unlock(&en->lock);
        pthread_join(en->thread, NULL);
    }
    if (en->locks) {
        pthread_mutex_destroy(&en->lock);
        pthread_cond_destroy(&en->wake);
    }
    neox_generator_free(en->scorer);
    neox_generator_free(en->gen);
    neox_generator_free(en->batch);
    free(en->logits);
    free(en);
}

// ---- submitting ------------------------------------------------------------------------------------
// Tokenizes text prompts and checks ids and lengths against the vocabulary and the context.
static int prepare_prompts(neox_serve_engine *en, neox_serve_request *r, neox_serve_error *e) {
    const neox_evaluator *ev = en->ev;
    int64_t vocab = neox_tokenizer_vocab_size(ev->tokenizer);
    for (int i = 0; i < r->nprompts; i++) {
        neox_serve_prompt *p = &r->prompts[i];
        if (p->text) {
            size_t len = 0, cap = 0;
            neox_error err = {0};
            if (neox_tokenizer_encode(ev->tokenizer, p->text, strlen(p->text), &p->ids, &len, &cap, &err) < 0)
                return neox_serve_error_set(e, 400, "invalid_request_error", "prompt", "prompt %d: %s", i, err.message);
            p->nids = (int)len;
            if (p->nids == 0) {  // an empty prompt starts a document, as neox-eval generate's unconditional samples
                p->ids = neox_realloc(p->ids, sizeof *p->ids);
                p->ids[p->nids++] = ev->eod_id;
            }
        }
        for (int t = 0; t < p->nids; t++)
            if (p->ids[t] >= vocab)
                return neox_serve_error_set(e, 400, "invalid_request_error", "prompt",
                                            "prompt %d: token id %d is outside the vocabulary (%lld ids)", i, p->ids[t],
                                            (long long)vocab);
        if (p->nids > en->o.max_prompt_tokens)
            return neox_serve_error_set(e, 400, "invalid_request_error", r->chat ? "messages" : "prompt",
                                        "prompt %d has %d tokens; the limit is %d", i, p->nids, en->o.max_prompt_tokens);
        if (r->max_tokens < 0 && (r->max_tokens = en->o.context - p->nids) < 1)  // chat's default: what the context leaves
            return neox_serve_error_set(e, 400, "invalid_request_error", "messages",
                                        "the conversation has %d tokens: the context of %d tokens leaves none to generate",
                                        p->nids, en->o.context);
        if (p->nids + r->max_tokens > en->o.context)
            return neox_serve_error_set(e, 400, "invalid_request_error", "max_tokens",
                                        "prompt %d has %d tokens and max_tokens is %d: more than the context of %d tokens",
                                        i, p->nids, r->max_tokens, en->o.context);
    }
    return 0;
}

static int check_request(neox_serve_engine *en, neox_serve_request *r, neox_serve_error *e) {
    if (r->model && strcmp(r->model, en->o.model_name) != 0)
        return neox_serve_error_set(e, 404, "not_found_error", "model", "model '%s' does not exist (this server has '%s')",
                                    r->model, en->o.model_name);
    if (r->chat && neox_serve_render_chat(&en->o, r, e) != 0) return -1;
    return prepare_prompts(en, r, e);
}

int neox_serve_submit(neox_serve_engine *en, neox_serve_request *r, neox_serve_done done, neox_serve_gone gone, void *ctx,
                      neox_serve_error *e) {
    if (check_request(en, r, e) != 0) {
        neox_serve_request_release(r);
        return -1;
    }
    pthread_mutex_lock(&en->lock);
    int refused = en->closed ? 1 : en->pending >= en->o.queue_size ? 2 : 0;
    if (refused) {
        pthread_mutex_unlock(&en->lock);
        neox_serve_request_release(r);
        return neox_serve_error_set(e, 503, "server_error", NULL,
                                    refused == 1 ? "the server is shutting down"
                                                 : "the server is busy: its queue of %d requests is full; retry later",
                                    en->o.queue_size);
    }
    neox_serve_job *job = neox_calloc(1, sizeof *job);
    job->req = *r;
    *r = (neox_serve_request){0};
    job->done = done;
    job->gone = gone;
    job->ctx = ctx;
    job->id = en->next_id++;
    if (en->tail) en->tail->next = job;
    else en->head = job;
    en->tail = job;
    en->pending++;
    pthread_cond_broadcast(&en->wake);
    pthread_mutex_unlock(&en->lock);
    return 0;
}

int neox_serve_pending(neox_serve_engine *en) {
    pthread_mutex_lock(&en->lock);
    int n = en->pending;
    pthread_mutex_unlock(&en->lock);
    return n;
}

void neox_serve_close_queue(neox_serve_engine *en) {
    pthread_mutex_lock(&en->lock);
    en->closed = 1;
    pthread_mutex_unlock(&en->lock);
}
