// test_backend.c: the backend table (kernels/backend.h) and the CPU ops added with it: the run-time
// choice cpu/cuda/auto/emulated, the emulated device's memory discipline, the CPU table's memory
// entry points and their alignment, fp32 <-> bf16/fp16 casts against values fixed by the IEEE formats, the mixed-precision GEMM against a double-precision product,
// and the segmented AdamW and squared norm against their per-segment forms.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "unit_util.h"

static void test_select(void **state) {
    (void)state;
    char err[256] = "";
    assert_ptr_equal(neox_backend_select("cpu", err, sizeof err), neox_backend_cpu());
    const neox_backend *a = neox_backend_select("auto", err, sizeof err);
    assert_non_null(a);
    assert_ptr_equal(a, neox_backend_cuda() ? neox_backend_cuda() : neox_backend_cpu());
    assert_null(neox_backend_select("tpu", err, sizeof err));
    assert_non_null(strstr(err, "backend 'tpu': expected cpu, cuda, auto or emulated"));
    if (!neox_backend_cuda()) {
        assert_null(neox_backend_select("cuda", err, sizeof err));
        assert_non_null(strstr(err, "backend 'cuda'"));
    }
}

static void test_cpu_table(void **state) {
    (void)state;
    const neox_backend *be = neox_backend_cpu();
    assert_string_equal(be->name, "cpu");
    assert_int_equal(be->on_device, 0);
    assert_ptr_equal(be->attention_forward, neox_attention_forward);
    float host[5] = {1, 2, 3, 4, 5}, back[5];
    float *a = be->alloc(sizeof host), *b = be->alloc(sizeof host);
    be->to_device(a, host, sizeof host);
    be->copy(b, a, sizeof host);
    be->memset_zero(b, sizeof(float));
    be->add_inplace(b, a, 5);
    be->synchronize();
    be->to_host(back, b, sizeof back);
    float want[5] = {1, 4, 6, 8, 10};
    assert_memory_equal(back, want, sizeof want);
    // Small buffers are 64-byte aligned; one of 64 MiB (a model's parameters) starts on a 2 MiB
    // boundary so that huge pages can back it, and reads back what was written at both ends.
    assert_int_equal((uintptr_t)a % 64, 0);
    be->free(a);
    be->free(b);
    size_t big = (size_t)64 << 20;
    unsigned char *p = be->alloc(big);
    assert_int_equal((uintptr_t)p % ((size_t)2 << 20), 0);
    p[0] = 1, p[big - 1] = 2;
    assert_int_equal(p[0] + p[big - 1], 3);
    be->free(p);
}

static uint16_t bits16(float f, int bf16) {
    uint16_t h;
    if (bf16) neox_cast_f32_to_bf16(&h, &f, 1); else neox_cast_f32_to_f16(&h, &f, 1);
    return h;
}

// Expected patterns from the formats: bf16 is fp32's top half (rounded to nearest even), fp16 has
// 5 exponent bits (largest finite 65504, smallest subnormal 2^-24 = 5.96e-8).
static void test_casts(void **state) {
    (void)state;
    assert_int_equal(bits16(1.0f, 1), 0x3F80);
    assert_int_equal(bits16(1.00390625f, 1), 0x3F80);  // 1 + 2^-8: a tie, to the even 1.0
    assert_int_equal(bits16(1.01171875f, 1), 0x3F82);  // 1 + 3 * 2^-8: a tie, to the even 0x3F82
    assert_int_equal(bits16(-2.0f, 1), 0xC000);
    assert_int_equal(bits16(INFINITY, 1), 0x7F80);
    uint16_t nb = bits16(NAN, 1);
    assert_true((nb & 0x7F80) == 0x7F80 && (nb & 0x7F) != 0);
    assert_int_equal(bits16(1.0f, 0), 0x3C00);
    assert_int_equal(bits16(65504.0f, 0), 0x7BFF);
    assert_int_equal(bits16(65520.0f, 0), 0x7C00);  // the tie above the largest finite rounds to infinity
    assert_int_equal(bits16(6e-8f, 0), 0x0001);
    assert_int_equal(bits16(-0.0f, 0), 0x8000);
    uint16_t in[3] = {0x3F80, 0xC049, 0x0001};
    float out[3];
    neox_cast_bf16_to_f32(out, in, 3);
    assert_true(out[0] == 1.0f && out[1] == -3.140625f && out[2] == ldexpf(1.0f, -133));
    uint16_t hin[3] = {0x3C00, 0xC248, 0x0001};
    neox_cast_f16_to_f32(out, hin, 3);
    assert_true(out[0] == 1.0f && out[1] == -3.140625f && out[2] == ldexpf(1.0f, -24));
}

// fp16 against GCC's _Float16 (its own IEEE conversions): every half back to fp32, and fp32 values
// across the whole half range, ties, overflow and subnormals included, to half.
static void test_f16_against_compiler(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t b = (uint16_t)h;
        _Float16 ref;
        memcpy(&ref, &b, 2);
        float got;
        neox_cast_f16_to_f32(&got, &b, 1);
        if (isnan((float)ref)) assert_true(isnan(got));
        else assert_true(got == (float)ref && signbit(got) == signbit((float)ref));
    }
    for (uint32_t bits = 0x30000000u; bits < 0x47900000u; bits += 0x1fb) {  // 2^-31 .. 73728, every 507th
        for (int s = 0; s < 2; s++) {
            uint32_t x = bits | (s ? 0x80000000u : 0) | (bits & 0x1000u ? 0 : 0xfffu & (bits >> 4));
            float f;
            memcpy(&f, &x, 4);
            _Float16 ref = (_Float16)f;
            uint16_t want, got = bits16(f, 0);
            memcpy(&want, &ref, 2);
            if (got != want) fail_msg("fp16 of %a (0x%08x): 0x%04x, compiler 0x%04x", (double)f, x, got, want);
        }
    }
}

// C (M, N) = alpha A^T B + beta C with bf16 A (K, M) and B (K, N): against a double product of the
// same rounded values; a bf16 C is that product rounded once more.
static void test_gemm_ex(void **state) {
    (void)state;
    enum { M = 5, N = 7, K = 33 };
    float a32[K * M], b32[K * N], c32[M * N], aw[K * M], bw[K * N];
    uint16_t a[K * M], b[K * N], c16[M * N];
    for (int i = 0; i < K * M; i++) a32[i] = neox_uniform(1, i) * 2 - 1;
    for (int i = 0; i < K * N; i++) b32[i] = neox_uniform(2, i) * 2 - 1;
    for (int i = 0; i < M * N; i++) c32[i] = neox_uniform(3, i);
    neox_cast_f32_to_bf16(a, a32, K * M);
    neox_cast_f32_to_bf16(b, b32, K * N);
    neox_cast_bf16_to_f32(aw, a, K * M);
    neox_cast_bf16_to_f32(bw, b, K * N);
    float c0[M * N];
    memcpy(c0, c32, sizeof c0);
    neox_cast_f32_to_bf16(c16, c32, M * N);
    neox_gemm_ex(1, 0, M, N, K, 0.5f, a, M, b, N, NEOX_ELEM_BF16, 1.0f, c32, N, NEOX_ELEM_F32);
    neox_gemm_ex(1, 0, M, N, K, 0.5f, a, M, b, N, NEOX_ELEM_BF16, 0.0f, c16, N, NEOX_ELEM_BF16);
    float c16w[M * N];
    neox_cast_bf16_to_f32(c16w, c16, M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)aw[k * M + i] * bw[k * N + j];
            assert_float_equal(c32[i * N + j], 0.5 * s + c0[i * N + j], 1e-5);
            assert_float_equal(c16w[i * N + j], 0.5 * s, fabs(0.5 * s) / 128 + 1e-6);  // within a bf16 ulp
        }
}

static void test_segments(void **state) {
    (void)state;
    enum { n = 1000 };
    static float p1[n], p2[n], g[n], m1[n], m2[n], v1[n], v2[n];
    for (int i = 0; i < n; i++) {
        p1[i] = p2[i] = neox_uniform(4, i) - 0.5f;
        g[i] = neox_uniform(5, i) - 0.5f;
        m1[i] = m2[i] = 0.01f * neox_uniform(6, i);
        v1[i] = v2[i] = 0.001f * neox_uniform(7, i);
    }
    neox_segment segs[] = {{0, 100, 0.1f}, {120, 120, 0.5f}, {130, 900, 0.0f}, {950, n, 0.01f}};
    neox_step_scalars sc = {.lr = 1e-3f, .step = 3};
    neox_adamw_segments(p1, g, m1, v1, segs, 4, &sc, 0.9f, 0.95f, 1e-8f, 1.0f, NULL);
    for (int s = 0; s < 4; s++) {
        size_t b = segs[s].begin;
        neox_adamw(p2 + b, g + b, m2 + b, v2 + b, segs[s].end - b, 1e-3f, 0.9f, 0.95f, 1e-8f, segs[s].weight_decay, 3);
    }
    assert_memory_equal(p1, p2, sizeof p1);
    assert_memory_equal(m1, m2, sizeof m1);
    assert_memory_equal(v1, v2, sizeof v1);
    assert_true(p1[110] == neox_uniform(4, 110) - 0.5f);  // in a gap: untouched
    double want = 0;
    for (int s = 0; s < 4; s++)
        for (size_t i = segs[s].begin; i < segs[s].end; i++) want += (double)g[i] * g[i];
    assert_float_equal(neox_sum_squares_segments(g, segs, 4), want, 1e-12 * want);
}

// The emulated device: its ops give the CPU's results on its own memory, reached through to_device
// and to_host.
static void test_emulated_table(void **state) {
    (void)state;
    char err[256] = "";
    const neox_backend *be = neox_backend_select("emulated", err, sizeof err);
    assert_non_null(be);
    assert_string_equal(be->name, "emulated");
    assert_int_equal(be->on_device, 1);
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50}, out[5];
    float *da = be->alloc(sizeof a), *db = be->alloc(sizeof b);
    be->to_device(da, a, sizeof a);
    be->to_device(db, b, sizeof b);
    be->add_inplace(da, db, 5);
    assert_true(be->sum_squares(db, 5) == 5500.0);
    be->to_host(out, da, sizeof out);
    for (int i = 0; i < 5; i++) assert_true(out[i] == a[i] + b[i]);
    be->free(da);
    be->free(db);
}

static void touch_device_memory(void) {
    const neox_backend *be = neox_backend_emulated();
    float *p = be->alloc(1000 * sizeof(float));
    be->memset_zero(p, 1000 * sizeof(float));  // through the table: fine
    ((volatile float *)p)[17] = 1.0f;          // directly: faults
}

// Host code touching emulated device memory directly dies at once with a message naming it.
static void test_emulated_fault(void **state) {
    (void)state;
    const char *want[] = {"host code touched emulated device memory", "offset 68 of a 4096-byte buffer"};
    child_dies(touch_device_memory, SIGSEGV, want, 2);
}

// Asynchronous copies: on the CPU done at once; on the emulated device as late as a device could
// make them, so a destination read before its wait is wrong (a copy to the host is NaN until then, an
// op queued on a device destination without device_wait sees the old bytes), and waiting for a
// ticket runs every copy queued before it, in order.
static void test_async_copies(void **state) {
    (void)state;
    const neox_backend *cpu = neox_backend_cpu();
    float src[4] = {1, 2, 3, 4}, dst[4] = {0};
    assert_true(cpu->to_host_async(dst, src, sizeof src) == 0);
    assert_true(dst[3] == 4.0f);

    const neox_backend *be = neox_backend_emulated();
    float *host = be->host_alloc(4 * sizeof(float)), back[4];
    float *dev = be->alloc(4 * sizeof(float)), *other = be->alloc(4 * sizeof(float));
    be->to_device(dev, src, sizeof src);
    be->memset_zero(other, sizeof src);
    int64_t down = be->to_host_async(host, dev, sizeof src);
    assert_true(down > 0);
    assert_true(isnan(host[0]) && isnan(host[3]));  // nothing defined before the wait
    float up_src[4] = {5, 6, 7, 8};
    int64_t up = be->to_device_async(other, up_src, sizeof up_src);
    assert_true(up > down);
    assert_true(be->sum_squares(other, 4) == 0.0);  // an op without device_wait: the old bytes
    be->device_wait(up);                             // runs the copy down as well (queued first)
    assert_true(be->sum_squares(other, 4) == 174.0);
    for (int i = 0; i < 4; i++) assert_true(host[i] == src[i]);
    be->host_wait(down);  // done already: returns at once
    be->to_host(back, other, sizeof back);
    for (int i = 0; i < 4; i++) assert_true(back[i] == up_src[i]);
    be->free(dev);
    be->free(other);
    be->host_free(host);
}

// The blocking host waits the emulated device counts, as a device would block: synchronous copies,
// a host value from an op, synchronize, and a host_wait only while its copy has not run; the CPU
// table never waits.
static void test_host_wait_count(void **state) {
    (void)state;
    const neox_backend *cpu = neox_backend_cpu(), *be = neox_backend_emulated();
    float src[4] = {1, 2, 3, 4}, dst[4];
    int64_t before = neox_host_waits();
    cpu->to_host(dst, src, sizeof src);
    cpu->host_wait(cpu->to_host_async(dst, src, sizeof src));
    assert_true(cpu->sum_squares(src, 4) == 30.0);
    assert_true(neox_host_waits() == before);

    float *host = be->host_alloc(sizeof src), *dev = be->alloc(sizeof src);
    be->to_device(dev, src, sizeof src);  // 1
    assert_true(neox_host_waits() == before + 1);
    int64_t up = be->to_device_async(dev, src, sizeof src);
    be->device_wait(up);  // the device waits, not the host
    int64_t down = be->to_host_async(host, dev, sizeof src);
    assert_true(neox_host_waits() == before + 1);
    be->host_wait(down);  // 2: not run yet
    be->host_wait(down);  // done: no wait
    assert_true(neox_host_waits() == before + 2);
    down = be->to_host_async(host, dev, sizeof src);
    be->device_wait(be->to_device_async(dev, src, sizeof src));  // runs the copy down too (queued first)
    be->host_wait(down);  // done already: no wait
    assert_true(neox_host_waits() == before + 2);
    assert_true(be->sum_squares(dev, 4) == 30.0);  // 3
    be->synchronize();                             // 4
    be->to_host(dst, dev, sizeof dst);             // 5
    assert_true(neox_host_waits() == before + 5);
    be->free(dev);
    be->host_free(host);
}

static void change_copied_source(void) {
    const neox_backend *be = neox_backend_emulated();
    float *dev = be->alloc(64 * sizeof(float)), host[64];
    be->memset_zero(dev, 64 * sizeof(float));
    int64_t ticket = be->to_host_async(host, dev, 64 * sizeof(float));
    be->memset_zero(dev, 64 * sizeof(float));  // written, but the same bytes: fine
    float one = 1.0f;
    be->to_device(dev + 5, &one, sizeof one);  // changed
    be->host_wait(ticket);
}

// A source that changes between queuing its copy and the wait stops the process with a message: on
// a device the copy may or may not have read it already.
static void test_async_source_changed(void **state) {
    (void)state;
    const char *want[] = {"the source of an asynchronous copy (256 bytes at", "changed before the copy was waited for"};
    child_dies(change_copied_source, SIGABRT, want, 2);
}

// release gives back the whole pages inside its range: on the emulated device they leave the count
// behind peak_bytes until commit takes them back (a 32 MiB buffer, more than this process held before,
// so the peak moves only by what the device holds); on both tables the range then reads as zero.
static void test_release(void **state) {
    (void)state;
    const neox_backend *emu = neox_backend_emulated(), *cpu = neox_backend_cpu();
    size_t page = (size_t)sysconf(_SC_PAGESIZE), size = (size_t)32 << 20;
    char *a = emu->alloc(size);
    emu->memset_zero(a, size);
    size_t peak = emu->peak_bytes();
    assert_int_equal(emu->release(a, size), size);
    char *b = emu->alloc(size);  // takes the room a gave back
    assert_int_equal(emu->peak_bytes(), peak);
    assert_int_equal(emu->commit(a + 1, page), 2 * page);  // every page the range touches
    assert_int_equal(emu->commit(a, page), 0);              // taken already
    assert_int_equal(emu->peak_bytes(), peak + 2 * page);
    char ones[64], back[64], zeros[64] = {0};
    memset(ones, 1, sizeof ones);
    emu->to_device(a, ones, sizeof ones);
    emu->to_host(back, a + page, sizeof back);
    assert_memory_equal(back, zeros, sizeof back);
    emu->to_host(back, a, sizeof back);
    assert_memory_equal(back, ones, sizeof back);
    emu->free(a), emu->free(b);
    assert_int_equal(cpu->release(NULL, 0), 0);
    char *c = cpu->alloc(4 * page);
    memset(c, 7, 4 * page);
    assert_int_equal(cpu->release(c + 1, 3 * page), 2 * page);  // the partial pages at the ends stay
    for (size_t i = 1; i <= 3 * page; i++) assert_int_equal(c[i], 0);
    assert_int_equal(c[0], 7);
    assert_int_equal(cpu->commit(c, 4 * page), 0);  // host pages come back when written
    c[page] = 1;
    cpu->free(c);
}

// A device cannot fault a released page in: an op writing one before a commit took it back stops the
// emulated device, naming what happened.
static void write_released_page(void) {
    const neox_backend *emu = neox_backend_emulated();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    float *a = emu->alloc(4 * page);
    emu->memset_zero(a, 4 * page);
    emu->release(a, 4 * page);
    emu->commit(a, page);           // the first page only
    emu->memset_zero(a, 2 * page);  // the second is still given back
}

static void test_release_needs_commit(void **state) {
    (void)state;
    const char *want[] = {"emulated device memory given back by release was touched before a commit took it back"};
    child_dies(write_released_page, SIGSEGV, want, 1);
}

// The emulated device's recording (graph_begin/graph_end/graph_launch): recorded ops do not run;
// each launch runs them again with the recorded arguments, the host source of a recorded copy read
// afresh (a per-step value in memory follows), a by-value argument as recorded (it does not), and a
// segment table as it was when recorded; the launch's ticket covers the recorded copy down, and so does
// the ticket the copy returned inside the recording.
static void test_graph_replay(void **state) {
    (void)state;
    const neox_backend *be = neox_backend_emulated();
    float *dev = be->alloc(4 * sizeof(float)), *step = be->host_alloc(sizeof(float)), *out = be->host_alloc(4 * sizeof(float));
    float start[4] = {1, 2, 3, 4}, back[4];
    be->to_device(dev, start, sizeof start);
    neox_segment seg[1] = {{0, 4, 0.0f}};
    double *sumsq = be->alloc(sizeof(double));
    float by_value = 2.0f;
    *step = 10.0f;
    be->graph_begin();
    int64_t up = be->to_device_async(dev, step, sizeof *step);  // dev[0] = the host's *step at each launch
    be->device_wait(up);
    be->scale(dev, 4, by_value);                                // by value: 2 at every launch
    be->sum_squares_segments_into(sumsq, dev, seg, 1);
    int64_t down = be->to_host_async(out, dev, 4 * sizeof(float));
    be->graph_end();
    seg[0].end = 1;  // (the recording keeps the table it was given)
    be->to_host(back, dev, sizeof back);
    assert_true(back[0] == 1.0f && back[3] == 4.0f);  // nothing ran while recording
    for (int launch = 1; launch <= 2; launch++) {
        *step = 10.0f * launch;
        by_value = 100.0f;  // (not seen: the recording holds 2)
        int64_t done = be->graph_launch();
        be->host_wait(launch == 1 ? done : down);
        assert_true(out[0] == 20.0f * launch);
        assert_true(out[1] == (launch == 1 ? 4.0f : 8.0f) && out[3] == (launch == 1 ? 8.0f : 16.0f));
    }
    double sum;
    be->to_host(&sum, sumsq, sizeof sum);
    assert_true(sum == 40.0 * 40.0 + 8.0 * 8.0 + 12.0 * 12.0 + 16.0 * 16.0);  // all four elements
    be->free(dev);
    be->free(sumsq);
    be->host_free(step);
    be->host_free(out);
}

static void wait_inside_recording(void) {
    const neox_backend *be = neox_backend_emulated();
    float *dev = be->alloc(4 * sizeof(float)), host[4];
    be->graph_begin();
    be->scale(dev, 4, 2.0f);
    be->to_host(host, dev, sizeof host);
}

static void allocate_inside_recording(void) {
    const neox_backend *be = neox_backend_emulated();
    be->graph_begin();
    be->alloc(64);
}

static void value_op_inside_recording(void) {
    const neox_backend *be = neox_backend_emulated();
    float *dev = be->alloc(4 * sizeof(float));
    be->graph_begin();
    be->sum_squares(dev, 4);
}

// Inside a recording, what would make the host wait or change the memory map stops the process,
// naming it, as it fails a CUDA capture.
static void test_graph_refusals(void **state) {
    (void)state;
    const char *sync[] = {"to_host (a synchronous copy) inside a graph capture"};
    child_dies(wait_inside_recording, SIGABRT, sync, 1);
    const char *alloc[] = {"alloc inside a graph capture"};
    child_dies(allocate_inside_recording, SIGABRT, alloc, 1);
    const char *value[] = {"sum_squares (an op that returns a host value) inside a graph capture"};
    child_dies(value_op_inside_recording, SIGABRT, value, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_select),   cmocka_unit_test(test_cpu_table), cmocka_unit_test(test_casts),
        cmocka_unit_test(test_f16_against_compiler),
        cmocka_unit_test(test_gemm_ex),  cmocka_unit_test(test_segments),
        cmocka_unit_test(test_emulated_table), cmocka_unit_test(test_emulated_fault),
        cmocka_unit_test(test_async_copies), cmocka_unit_test(test_async_source_changed),
        cmocka_unit_test(test_host_wait_count), cmocka_unit_test(test_release),
        cmocka_unit_test(test_release_needs_commit), cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_graph_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
