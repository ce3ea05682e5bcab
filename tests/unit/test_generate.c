// test_generate.c: generation's KV-cache path against recomputation: the cached attention kernel
// against neox_attention_forward (whole sequence, and a prompt followed by one position at a time),
// and a tiny model's generator with and without the cache (the same logits within rounding, the
// same tokens greedy and sampled; scoring logits equal to the full forward's), and batched decoding
// against each sequence generated alone; a decoding step in one parallel region (the CPU's thread
// team) against the same step op by op on one thread, bit for bit, fp32 and bfloat16.
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "kernels/kernels.h"

static void fill(float *x, size_t n, unsigned long long seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)neox_normal(seed, i);
}

// Cached attention (all new rows at once, then one position at a time) equals the full forward,
// with every earlier key visible and with a sliding window of them.
static void check_cached_attention(int window, const float *alibi) {
    enum { T = 13, NH = 4, NKV = 2, HS = 8 };
    float q[NH * T * HS], k[NKV * T * HS], v[NKV * T * HS], full[T * NH * HS], lse[NH * T], cached[T * NH * HS];
    fill(q, sizeof q / sizeof *q, 1);
    fill(k, sizeof k / sizeof *k, 2);
    fill(v, sizeof v / sizeof *v, 3);
    neox_attention_opts o = {.scale = 1.0f / sqrtf(HS), .window = window, .operands = NEOX_ELEM_F32, .alibi = alibi};
    neox_attention_forward(full, lse, q, k, v, 1, T, NH, NKV, HS, o, NEOX_ELEM_F32);
    // The cache is (NKV, maxT, HS) with maxT = T: the same layout as k and v here.
    neox_attention_cached(cached, q, k, v, T, 0, NH, NKV, HS, T, o);
    for (int i = 0; i < T * NH * HS; i++) assert_true(fabsf(full[i] - cached[i]) <= 1e-5f * (1 + fabsf(full[i])));
    // One position at a time: query t alone over keys 0..t (its window of them).
    for (int t = 0; t < T; t++) {
        float qt[NH * HS], out[NH * HS];
        for (int h = 0; h < NH; h++) memcpy(qt + h * HS, q + ((size_t)h * T + t) * HS, HS * sizeof(float));
        neox_attention_cached(out, qt, k, v, 1, t, NH, NKV, HS, T, o);
        for (int i = 0; i < NH * HS; i++) assert_true(fabsf(out[i] - full[(size_t)t * NH * HS + i]) <= 1e-5f * (1 + fabsf(out[i])));
    }
}

static void test_cached_attention_matches_full(void **state) {
    (void)state;
    check_cached_attention(0, NULL);
    check_cached_attention(4, NULL);
    float slopes[4];  // ALiBi: the bias follows each query's position in both forms
    neox_alibi_slopes(slopes, 4, 0, 4);
    check_cached_attention(0, slopes);
    check_cached_attention(5, slopes);
}

static neox_model *tiny_model(neox_pos_kind pos, int parallel) {
    neox_model_desc d = {.vocab_size = 48, .hidden_size = 16, .num_layers = 2, .num_heads = 4, .num_kv_heads = 4,
                         .ffn_size = 32, .max_positions = 24, .norm = NEOX_NORM_LAYERNORM, .norm_eps = 1e-5f,
                         .norm_bias = 1, .pos_emb = pos, .rotary_dims = pos == NEOX_POS_ROTARY ? 2 : 0,
                         .rotary_base = 10000, .parallel_residual = parallel, .activation = NEOX_ACT_GELU,
                         .attn_bias = 1, .mlp_bias = 1, .init_std = 0.5, .init_method = NEOX_INIT_NORMAL,
                         .output_init_method = NEOX_INIT_NORMAL};
    neox_error err = {0};
    neox_model *m = neox_model_create(&d, &err);
    if (!m) fail_msg("%s", err.message);
    neox_model_init(m, 11);
    return m;
}

static void generate_both(neox_model *m, const neox_sampling *s, int max_len) {
    neox_error err = {0};
    neox_generator *cached = neox_generator_create(m, max_len, 0, &err), *recompute = neox_generator_create(m, max_len, 1, &err);
    assert_non_null(cached);
    assert_non_null(recompute);
    int32_t prompt[] = {3, 17, 5, 40, 2};
    neox_generation a, b;
    assert_int_equal(neox_generate(cached, prompt, 5, 30, s, NULL, 0, &a, &err), 0);
    assert_int_equal(neox_generate(recompute, prompt, 5, 30, s, NULL, 0, &b, &err), 0);
    assert_int_equal(a.n, max_len - 5);  // no stop ids: runs to the context's end
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.tokens, b.tokens, (size_t)a.n * sizeof *a.tokens);
    const float *la = neox_generator_logits(cached), *lb = neox_generator_logits(recompute);
    for (int i = 0; i < m->desc.vocab_size; i++) assert_true(fabsf(la[i] - lb[i]) <= 1e-4f * (1 + fabsf(lb[i])));
    free(a.tokens);
    free(b.tokens);
    // Scoring: the cached path's logits of every position equal the full forward's.
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (i * 7 + 3) % m->desc.vocab_size;
    assert_int_equal(neox_generator_score(cached, ids, 12, 12, &err), 0);
    float *logits = malloc(12 * (size_t)m->desc.vocab_size * sizeof *logits);
    neox_generator_score_logits(cached, 0, 12, logits);
    assert_int_equal(neox_model_plan(m, 1, 12, &err), 0);
    assert_int_equal(neox_model_forward(m, (const int *)ids, NULL, NULL, &err), 0);
    const float *full = neox_model_logits(m);
    for (int i = 0; i < 12 * m->desc.vocab_size; i++) assert_true(fabsf(full[i] - logits[i]) <= 1e-4f * (1 + fabsf(full[i])));
    free(logits);
    neox_generator_free(cached);
    neox_generator_free(recompute);
}

static void test_cache_equals_recompute(void **state) {
    (void)state;
    neox_sampling greedy = {0}, sampled = {.temperature = 1.3, .top_k = 20, .top_p = 0.95, .seed = 5, .vocab = 40};
    neox_pos_kind kinds[] = {NEOX_POS_ROTARY, NEOX_POS_LEARNED, NEOX_POS_ALIBI};
    for (int k = 0; k < 3; k++)
        for (int parallel = 0; parallel < 2; parallel++) {
            neox_model *m = tiny_model(kinds[k], parallel);
            generate_both(m, &greedy, 24);
            generate_both(m, &sampled, 20);
            neox_model_free(m);
        }
}

// Sequences packed into one scoring pass give, row for row, the logits the full forward gives
// each sequence alone (each from position 0, attending only to itself): with a generator of 24
// positions, and with a packed scorer whose passes hold 22 rows of sequences of at most 9
// positions (more rows than a sequence has positions, beyond the learned table's 24 too).
static void check_packed_scoring(neox_model *m, neox_generator *g, const int32_t *ids, const int *lens) {
    neox_error err = {0};
    assert_int_equal(neox_generator_score_packed(g, ids, lens, 4, &err), 0);
    int V = m->desc.vocab_size, row = 0;
    float *logits = malloc((size_t)9 * V * sizeof *logits);
    for (int s = 0; s < 4; s++) {
        int rows[9];
        for (int t = 0; t < lens[s]; t++) rows[t] = row + lens[s] - 1 - t;  // any order of rows
        neox_generator_rows_logits(g, rows, lens[s], logits);
        assert_int_equal(neox_model_plan(m, 1, lens[s], &err), 0);
        assert_int_equal(neox_model_forward(m, (const int *)ids + row, NULL, NULL, &err), 0);
        const float *full = neox_model_logits(m);
        for (int t = 0; t < lens[s]; t++)
            for (int v = 0; v < V; v++) {
                float want = full[(size_t)(lens[s] - 1 - t) * V + v], got = logits[(size_t)t * V + v];
                if (fabsf(want - got) > 1e-4f * (1 + fabsf(want)))
                    fail_msg("sequence %d row %d id %d: %g, full forward %g", s, t, v, got, want);
            }
        row += lens[s];
    }
    free(logits);
}

static void test_packed_scoring(void **state) {
    (void)state;
    neox_pos_kind kinds[] = {NEOX_POS_ROTARY, NEOX_POS_LEARNED, NEOX_POS_ALIBI};
    int lens[] = {5, 9, 1, 7};
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = (i * 11 + 5) % 48;
    for (int k = 0; k < 3; k++)
        for (int parallel = 0; parallel < 2; parallel++) {
            neox_model *m = tiny_model(kinds[k], parallel);
            neox_error err = {0};
            neox_generator *g = neox_generator_create(m, 24, 0, &err);
            neox_generator *packed = neox_generator_create_packed(m, 22, 9, &err);
            assert_non_null(packed);
            assert_int_equal(neox_generator_rows(packed), 22);
            check_packed_scoring(m, g, ids, lens);
            check_packed_scoring(m, packed, ids, lens);
            int too_long[] = {20, 5}, empty[] = {3, 0}, over_rows[] = {9, 9, 5};
            assert_int_equal(neox_generator_score_packed(g, ids, too_long, 2, &err), -1);
            assert_non_null(strstr(err.message, "a sequence of 5 positions after 20 rows: a context of 24 positions and passes of 24 rows"));
            assert_int_equal(neox_generator_score_packed(packed, ids, too_long, 2, &err), -1);
            assert_non_null(strstr(err.message, "a sequence of 20 positions after 0 rows: a context of 9 positions"));
            assert_int_equal(neox_generator_score_packed(packed, ids, over_rows, 3, &err), -1);
            assert_non_null(strstr(err.message, "a sequence of 5 positions after 18 rows: a context of 9 positions and passes of 22 rows"));
            assert_int_equal(neox_generator_score_packed(g, ids, empty, 2, &err), -1);
            assert_int_equal(neox_generator_score_packed(g, ids, lens, 0, &err), -1);
            if (kinds[k] == NEOX_POS_LEARNED) {  // the positions, not the rows, meet the learned table
                assert_null(neox_generator_create_packed(m, 64, 25, &err));
                assert_non_null(strstr(err.message, "seq_length 25 exceeds max_position_embeddings 24"));
            }
            neox_generator_free(packed);
            neox_generator_free(g);
            neox_model_free(m);
        }
}

static void test_stops_and_errors(void **state) {
    (void)state;
    neox_model *m = tiny_model(NEOX_POS_ROTARY, 1);
    neox_error err = {0};
    neox_generator *g = neox_generator_create(m, 16, 0, &err);
    int32_t prompt[16] = {1, 2, 3};
    neox_generation out;
    neox_sampling greedy = {0};
    assert_int_equal(neox_generate(g, prompt, 3, 5, &greedy, NULL, 0, &out, &err), 0);
    assert_int_equal(out.n, 5);
    assert_false(out.finished);
    int32_t stop = out.tokens[2];
    free(out.tokens);
    assert_int_equal(neox_generate(g, prompt, 3, 5, &greedy, &stop, 1, &out, &err), 0);
    assert_true(out.finished);
    assert_true(out.n <= 3);
    assert_int_equal(out.tokens[out.n - 1], stop);
    free(out.tokens);
    assert_int_equal(neox_generate(g, prompt, 16, 5, &greedy, NULL, 0, &out, &err), -1);
    assert_non_null(strstr(err.message, "the prompt has 16 tokens; the context holds 16"));
    free(out.tokens);
    prompt[0] = 99;
    assert_int_equal(neox_generate(g, prompt, 3, 5, &greedy, NULL, 0, &out, &err), -1);
    assert_non_null(strstr(err.message, "outside the vocabulary"));
    free(out.tokens);
    neox_generator_free(g);
    neox_model_free(m);
}

// Batched decoding: three sequences through a decoder of two slots (the third joins when the
// second leaves, in its slot, while the first is mid-way) give each the logits, bit for bit, and
// the tokens that generating it alone gives, greedy and sampled.
typedef struct batch_seq {
    int32_t prompt[5];
    int nprompt, max_new;
    neox_sampling s;
    neox_generation alone;
    int slot, ngen;
    unsigned long long draws;
    int32_t next;
} batch_seq;

// The sequence's latest logits against its lone run; its next token. Returns 1 when it is done.
static int take_token(neox_generator *g, batch_seq *q, int V) {
    const float *logits = neox_generator_slot_logits(g, q->slot);
    assert_memory_equal(logits, q->alone.logits + (size_t)q->ngen * V, (size_t)V * sizeof *logits);
    q->next = neox_sample_token(logits, V, &q->s, &q->draws);
    assert_int_equal(q->next, q->alone.tokens[q->ngen]);
    return ++q->ngen == q->max_new;
}

// alone_threads: the OpenMP threads the lone runs use (0: as many as the batched ones).
static void check_batched_decoding(neox_model *m, int alone_threads) {
    neox_error err = {0};
    int V = m->desc.vocab_size;
    batch_seq seqs[3] = {{.prompt = {1, 2, 3}, .nprompt = 3, .max_new = 12},
                         {.prompt = {7, 5, 9, 11, 2}, .nprompt = 5, .max_new = 4,
                          .s = {.temperature = 1.3, .top_k = 20, .seed = 5}},
                         {.prompt = {4}, .nprompt = 1, .max_new = 9, .s = {.temperature = 0.8, .top_p = 0.9, .seed = 9, .vocab = 40}}};
    neox_generator *alone = neox_generator_create(m, 24, 0, &err), *g = neox_generator_create_batch(m, 2, 24, &err);
    assert_non_null(g);
    assert_int_equal(neox_generator_slots(g), 2);
    int threads = omp_get_max_threads();
    if (alone_threads) omp_set_num_threads(alone_threads);
    for (int i = 0; i < 3; i++) {
        seqs[i].s.keep_logits = 1;
        assert_int_equal(neox_generate(alone, seqs[i].prompt, seqs[i].nprompt, seqs[i].max_new, &seqs[i].s, NULL, 0,
                                       &seqs[i].alone, &err), 0);
        assert_int_equal(seqs[i].alone.n, seqs[i].max_new);
    }
    omp_set_num_threads(threads);
    batch_seq *in_slot[2] = {NULL, NULL};
    int started = 0, steps = 0;
    for (;;) {
        for (int slot = 0; slot < 2; slot++)
            if (!in_slot[slot] && started < 3) {
                batch_seq *q = in_slot[slot] = &seqs[started++];
                q->slot = slot;
                assert_int_equal(neox_generator_prefill(g, slot, q->prompt, q->nprompt, &err), 0);
                if (take_token(g, q, V)) in_slot[slot] = NULL;
            }
        int slots[2], count = 0;
        int32_t tokens[2];
        for (int slot = 0; slot < 2; slot++)
            if (in_slot[slot]) slots[count] = slot, tokens[count++] = in_slot[slot]->next;
        if (count == 0) break;
        assert_int_equal(neox_generator_decode(g, slots, tokens, count, &err), 0);
        steps++;
        for (int i = 0; i < count; i++)
            if (take_token(g, in_slot[slots[i]], V)) in_slot[slots[i]] = NULL;
    }
    assert_int_equal(steps, 12 - 1);  // the third fits beside the first: 4 + 9 < 12 + 1
    assert_int_equal(neox_generator_slot_len(g, 0), 3 + 12 - 1);
    for (int i = 0; i < 3; i++) free(seqs[i].alone.tokens), free(seqs[i].alone.logits);
    // Misuse is refused with the reason.
    int same[] = {0, 0}, far[] = {2};
    int32_t two[] = {1, 1}, bad[] = {V + 12};
    assert_int_equal(neox_generator_decode(g, same, two, 2, &err), -1);
    assert_non_null(strstr(err.message, "sequence slot 0 twice in one step"));
    assert_int_equal(neox_generator_decode(g, far, two, 1, &err), -1);
    assert_non_null(strstr(err.message, "sequence slot 2 of 2"));
    assert_int_equal(neox_generator_decode(g, same, bad, 1, &err), -1);
    assert_non_null(strstr(err.message, "outside the vocabulary"));
    assert_int_equal(neox_generator_prefill(g, 1, two, 0, &err), -1);
    assert_null(neox_generator_create_batch(m, NEOX_DECODE_MAX_ROWS + 1, 24, &err));
    assert_non_null(strstr(err.message, "batched decoding of 17 sequences: 1 to 16"));
    neox_generator_free(g);
    neox_generator_free(alone);
}

static void test_batched_decoding(void **state) {
    (void)state;
    neox_pos_kind kinds[] = {NEOX_POS_ROTARY, NEOX_POS_LEARNED, NEOX_POS_ALIBI};
    for (int k = 0; k < 3; k++) {
        neox_model *m = tiny_model(kinds[k], k == 1);
        check_batched_decoding(m, 0);
        neox_model_free(m);
    }
}

// A Llama-like model wide enough that each product's rows make several chunks for the threads:
// grouped-query attention, RMSNorm, SwiGLU, no biases; or GPT-NeoX-like with biases, LayerNorm,
// GELU, a parallel residual and use_qk_layernorm.
static neox_model *wide_model(int llama) {
    neox_model_desc d = {.vocab_size = 520, .hidden_size = 64, .num_layers = 2, .num_heads = 4,
                         .num_kv_heads = llama ? 2 : 4, .ffn_size = 160, .max_positions = 40,
                         .norm = llama ? NEOX_NORM_RMSNORM : NEOX_NORM_LAYERNORM, .norm_eps = 1e-5f, .norm_bias = !llama,
                         .pos_emb = NEOX_POS_ROTARY, .rotary_dims = llama ? 16 : 4, .rotary_base = 10000,
                         .parallel_residual = !llama, .activation = llama ? NEOX_ACT_SWIGLU : NEOX_ACT_GELU,
                         .attn_bias = !llama, .mlp_bias = !llama, .qk_norm = !llama, .init_std = 0.5,
                         .init_method = NEOX_INIT_NORMAL, .output_init_method = NEOX_INIT_NORMAL};
    neox_error err = {0};
    neox_model *m = neox_model_create(&d, &err);
    if (!m) fail_msg("%s", err.message);
    neox_model_init(m, 23);
    for (int l = 0; l < d.num_layers && !llama; l++) {  // biases start at zero: give them values to add
        const neox_layer_params *p = &m->w.layers[l];
        float *biases[] = {p->qkv_b, p->proj_b, p->fc_b, p->fc2_b};
        int widths[] = {3 * d.hidden_size, d.hidden_size, d.ffn_size, d.hidden_size};
        for (int i = 0; i < 4; i++) fill(biases[i], (size_t)widths[i], 100 + 4 * l + i);
    }
    return m;
}

// Every generated token's logits with `threads` OpenMP threads (1: the op-by-op step; more: the
// team's), sampled so that the tokens do not settle into a loop.
static neox_generation generate_with_threads(neox_model *m, int threads) {
    neox_error err = {0};
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    neox_generator *g = neox_generator_create(m, 32, 0, &err);
    assert_non_null(g);
    int32_t prompt[] = {3, 17, 5, 400, 2, 99};
    neox_sampling s = {.temperature = 1.0, .seed = 3, .keep_logits = 1};
    neox_generation out;
    assert_int_equal(neox_generate(g, prompt, 6, 20, &s, NULL, 0, &out, &err), 0);
    assert_int_equal(out.n, 20);
    neox_generator_free(g);
    omp_set_num_threads(saved);
    return out;
}

// The team step (several threads) gives the op-by-op step's logits bit for bit, one sequence and
// batched, in fp32 and in bfloat16.
static void test_team_step_as_op_by_op(void **state) {
    (void)state;
    for (int llama = 0; llama < 2; llama++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            neox_model *m = wide_model(llama);
            if (bf16) neox_model_set_precision(m, NEOX_PRECISION_BF16);
            neox_generation one = generate_with_threads(m, 1), team = generate_with_threads(m, 3);
            assert_memory_equal(team.tokens, one.tokens, 20 * sizeof *one.tokens);
            assert_memory_equal(team.logits, one.logits, (size_t)20 * m->desc.vocab_size * sizeof *one.logits);
            free(one.tokens), free(one.logits), free(team.tokens), free(team.logits);
            int saved = omp_get_max_threads();
            omp_set_num_threads(3);
            check_batched_decoding(m, 1);
            omp_set_num_threads(saved);
            neox_model_free(m);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_attention_matches_full),
        cmocka_unit_test(test_cache_equals_recompute),
        cmocka_unit_test(test_packed_scoring),
        cmocka_unit_test(test_stops_and_errors),
        cmocka_unit_test(test_batched_decoding),
        cmocka_unit_test(test_team_step_as_op_by_op),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
