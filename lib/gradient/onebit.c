// onebit.c: the 1-bit compressed all-reduce with error feedback of gradient.h (DeepSpeed's
// compressed_allreduce, as 1-bit Adam uses it for the momentum): sign packing, the worker phase
// (compensate, scale, pack), one all-to-all that brings every rank the chunks it serves, the
// server phase (average, compensate, re-compress) and one all-gather of the servers' chunks.
// What goes over the wire is packed signs and float scales only.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "gradient.h"

typedef struct segment {
    size_t offset;  // in the caller's buffer
    size_t size;    // elements of the caller's buffer
    size_t padded;  // size rounded up to a multiple of p x lcm(p, 8)
    size_t worker;  // offset of the segment in the worker error (and the padded scratch)
    size_t server;  // offset of this rank's chunk in the server error
    size_t bytes;   // offset of the chunk's signs inside a message block (after the scales)
} segment;

struct neox_onebit {
    neox_comm *comm;
    int nseg;
    segment *seg;
    size_t worker_len, server_len;
    float *worker_error, *server_error;
    float *scratch;             // the padded, compensated buffer (worker_len)
    size_t block;               // bytes of one message block: nseg float scales, then signs
    uint8_t *send, *recv;       // p blocks each
};

// The segments one call reduces, and the layout of its message blocks: a float scale per segment,
// then the segments' signs.
typedef struct span {
    int first, count;
    size_t head;   // bytes of the scales
    size_t bits0;  // the first segment's sign offset in the whole buffer's layout
    size_t block;  // bytes of one block
} span;

static span span_of(const neox_onebit *o, int first, int count) {
    neox_assert(first >= 0 && count >= 0 && first + count <= o->nseg,
                "1-bit compressed all-reduce: segments %d-%d outside 0-%d", first, first + count, o->nseg);
    span sp = {first, count, (size_t)count * sizeof(float), 0, 0};
    if (count == 0) return sp;
    const segment *last = &o->seg[first + count - 1];
    sp.bits0 = o->seg[first].bytes;
    sp.block = sp.head + last->bytes + last->padded / (size_t)o->comm->size / 8 - sp.bits0;
    return sp;
}

static size_t gcd(size_t a, size_t b) { return b ? gcd(b, a % b) : a; }

neox_onebit *neox_onebit_make(neox_comm *c, const size_t *seg_size, int nseg) {
    neox_onebit *o = neox_calloc(1, sizeof *o);
    size_t p = (size_t)c->size, unit = p * (p * 8 / gcd(p, 8));
    o->comm = c, o->nseg = nseg;
    o->seg = neox_calloc(nseg ? (size_t)nseg : 1, sizeof(segment));
    size_t bits = 0;
    for (int s = 0; s < nseg; s++) {
        segment *g = &o->seg[s];
        g->size = seg_size[s], g->offset = s ? o->seg[s - 1].offset + o->seg[s - 1].size : 0;
        g->padded = (g->size + unit - 1) / unit * unit;
        g->worker = o->worker_len, g->server = o->server_len, g->bytes = bits;
        o->worker_len += g->padded;
        o->server_len += g->padded / p;
        bits += g->padded / p / 8;
    }
    o->block = (size_t)nseg * sizeof(float) + bits;
    o->worker_error = neox_calloc(o->worker_len + 1, sizeof(float));
    o->server_error = neox_calloc(o->server_len + 1, sizeof(float));
    o->scratch = neox_calloc(o->worker_len + 1, sizeof(float));
    o->send = neox_calloc(o->block * p + 1, 1);
    o->recv = neox_calloc(o->block * p + 1, 1);
    return o;
}

void neox_onebit_free(neox_onebit *o) {
    if (!o) return;
    free(o->seg);
    free(o->worker_error);
    free(o->server_error);
    free(o->scratch);
    free(o->send);
    free(o->recv);
    free(o);
}

float *neox_onebit_error(neox_onebit *o, int server, size_t *count) {
    *count = server ? o->server_len : o->worker_len;
    return server ? o->server_error : o->worker_error;
}

void neox_onebit_reset(neox_onebit *o) {
    memset(o->worker_error, 0, o->worker_len * sizeof(float));
    memset(o->server_error, 0, o->server_len * sizeof(float));
}

void neox_pack_signs(const float *x, size_t n, uint8_t *bits) {
    #pragma omp parallel for if (n > 65536)
    for (size_t j = 0; j < n / 8; j++) {
        unsigned byte = 0;
        for (int k = 0; k < 8; k++) byte = byte << 1 | (x[8 * j + (size_t)k] >= 0.0f);
        bits[j] = (uint8_t)byte;
    }
}

void neox_unpack_signs(const uint8_t *bits, size_t n, float scale, float *out) {
    #pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) out[i] = bits[i / 8] >> (7 - i % 8) & 1 ? scale : -scale;
}

// x (n elements) becomes its compression's error x - scale * sign(x); returns the scale, the
// L2 norm over sqrt(n) (fp32 as torch.norm(x) / sqrt(n) gives it, summed in double).
static float compress_error(float *x, size_t n) {
    float scale = n ? (float)sqrt(neox_sum_squares(x, n)) / (float)sqrt((double)n) : 0.0f;
    #pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] -= x[i] >= 0.0f ? scale : -scale;
    return scale;
}

// Where segment s's signs and scale sit in a block of the span's messages.
static size_t signs_at(const span *sp, const segment *g) { return sp->head + g->bytes - sp->bits0; }
static size_t scale_at(const span *sp, int s) { return (size_t)(s - sp->first) * sizeof(float); }

// Worker phase of segment s: compensate, send chunk r's signs to rank r, keep the error.
static void worker_phase(neox_onebit *o, const span *sp, int s, const float *x) {
    const segment *g = &o->seg[s];
    size_t p = (size_t)o->comm->size, chunk = g->padded / p;
    float *buf = o->scratch + g->worker, *err = o->worker_error + g->worker;
    for (size_t i = 0; i < g->padded; i++) buf[i] = (i < g->size ? x[i] : 0.0f) + err[i];
    for (size_t r = 0; r < p; r++) neox_pack_signs(buf + r * chunk, chunk, o->send + r * sp->block + signs_at(sp, g));
    memcpy(err, buf, g->padded * sizeof(float));
    float scale = compress_error(err, g->padded);
    for (size_t r = 0; r < p; r++) memcpy(o->send + r * sp->block + scale_at(sp, s), &scale, sizeof scale);
}

static float block_scale(const uint8_t *block, const span *sp, int s) {
    float scale;
    memcpy(&scale, block + scale_at(sp, s), sizeof scale);
    return scale;
}

// Server phase of segment s: average every rank's compressed chunk, compensate with the server
// error, re-compress; the signs and scale go to this rank's block of the all-gather (o->send).
static void server_phase(neox_onebit *o, const span *sp, int s) {
    const segment *g = &o->seg[s];
    size_t p = (size_t)o->comm->size, chunk = g->padded / p;
    float *sum = o->scratch + g->worker, *part = sum + chunk, *err = o->server_error + g->server;
    for (size_t q = 0; q < p; q++) {
        const uint8_t *block = o->recv + q * sp->block;
        // part is free scratch: chunks 1.. of the segment's worker buffer are already sent.
        neox_unpack_signs(block + signs_at(sp, g), chunk, block_scale(block, sp, s) * (1.0f / (float)p), q ? part : sum);
        if (q) neox_add_inplace(sum, part, chunk);
    }
    neox_add_inplace(sum, err, chunk);
    neox_pack_signs(sum, chunk, o->send + signs_at(sp, g));
    memcpy(err, sum, chunk * sizeof(float));
    float scale = compress_error(err, chunk);
    memcpy(o->send + scale_at(sp, s), &scale, sizeof scale);
}

// Every server's chunk of segment s, decompressed into x (the padding dropped).
static void gather_phase(neox_onebit *o, const span *sp, int s, float *x) {
    const segment *g = &o->seg[s];
    size_t p = (size_t)o->comm->size, chunk = g->padded / p;
    float *full = o->scratch + g->worker;
    for (size_t r = 0; r < p; r++) {
        const uint8_t *block = o->recv + r * sp->block;
        neox_unpack_signs(block + signs_at(sp, g), chunk, block_scale(block, sp, s), full + r * chunk);
    }
    memcpy(x, full, g->size * sizeof(float));
}

void neox_onebit_allreduce_range(neox_onebit *o, float *buf, int first, int count) {
    // (The trainer's set-up refuses onebitadam and gradient_compression on a device backend.)
    neox_assert(!neox_comm_on_device(o->comm, buf), "the 1-bit compressed all-reduce runs on host memory only; "
                "these gradients are on the GPU");
    span sp = span_of(o, first, count);
    if (o->comm->size <= 1 || count == 0) return;
    for (int s = first; s < first + count; s++) worker_phase(o, &sp, s, buf + o->seg[s].offset);
    neox_alltoall(o->comm, o->send, o->recv, sp.block, NEOX_U8);
    for (int s = first; s < first + count; s++) server_phase(o, &sp, s);
    neox_allgather(o->comm, o->send, o->recv, sp.block, NEOX_U8);
    for (int s = first; s < first + count; s++) gather_phase(o, &sp, s, buf + o->seg[s].offset);
}

void neox_onebit_allreduce(neox_onebit *o, float *buf) { neox_onebit_allreduce_range(o, buf, 0, o->nseg); }

double neox_onebit_wire_bytes_range(const neox_onebit *o, int first, int count) {
    return 2.0 * (double)(o->comm->size - 1) * (double)span_of(o, first, count).block;
}

double neox_onebit_wire_bytes(const neox_onebit *o) { return neox_onebit_wire_bytes_range(o, 0, o->nseg); }

void neox_onebit_flush_range(neox_onebit *o, float *buf, int first, int count) {
    size_t p = (size_t)o->comm->size, rank = (size_t)o->comm->rank;
    span_of(o, first, count);  // (checks the range)
    for (int s = first; s < first + count; s++) {
        const segment *g = &o->seg[s];
        size_t chunk = g->padded / p, off = g->offset;
        float *worker = o->worker_error + g->worker, *server = o->server_error + g->server;
        // The padding's error is dropped with the padding: it never reaches the caller's elements.
        neox_add_inplace(buf + off, worker, g->size);
        for (size_t j = 0, i = rank * chunk; j < chunk && i < g->size; j++, i++) buf[off + i] += (float)p * server[j];
        memset(worker, 0, g->padded * sizeof(float));
        memset(server, 0, chunk * sizeof(float));
    }
}

void neox_onebit_flush(neox_onebit *o, float *buf) { neox_onebit_flush_range(o, buf, 0, o->nseg); }
