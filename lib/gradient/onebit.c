// onebit.c: the 1-bit compressed all-reduce with error feedback of gradient.h (DeepSpeed's
// compressed_allreduce, as 1-bit Adam uses it for the momentum): the layout of segments, chunks and
// message blocks, the worker phase (compensate, scale, pack: the backend's onebit_compress), one
// all-to-all that brings every rank the chunks it serves, the server phase (onebit_average, then
// onebit_compress again) and one all-gather of the servers' chunks (onebit_decompress). What goes
// over the wire is packed signs and float scales only, in the backend's memory; the host never
// reads it or the buffers it reduces.
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "gradient.h"

typedef struct segment {
    size_t offset;  // in the caller's buffer
    size_t size;    // elements of the caller's buffer
    size_t padded;  // size rounded up to a multiple of p x lcm(p, 8)
    size_t worker;  // offset of the segment in the worker error (and the padded scratch)
    size_t server;  // offset of this rank's chunk in the server error
    size_t bytes;   // offset of the chunk's signs inside a message block (after the scales)
} segment;

// The error buffers, the scratch and both messages live on the backend (be), beside the buffers the
// calls reduce: its ops compress and decompress, and the collectives carry its memory.
struct neox_onebit {
    neox_comm *comm;
    const neox_backend *be;
    int nseg;
    segment *seg;
    size_t worker_len, server_len;
    float *worker_error, *server_error;
    float *scratch;             // a server's average, per segment at its worker offset (worker_len)
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

static void *zeroed(const neox_backend *be, size_t bytes) {
    void *p = be->alloc(bytes);
    be->memset_zero(p, bytes);
    return p;
}

neox_onebit *neox_onebit_make(neox_comm *c, const neox_backend *be, const size_t *seg_size, int nseg) {
    neox_onebit *o = neox_calloc(1, sizeof *o);
    size_t p = (size_t)c->size, unit = p * (p * 8 / gcd(p, 8));
    o->comm = c, o->be = be ? be : neox_backend_cpu(), o->nseg = nseg;
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
    o->worker_error = zeroed(o->be, (o->worker_len + 1) * sizeof(float));
    o->server_error = zeroed(o->be, (o->server_len + 1) * sizeof(float));
    o->scratch = zeroed(o->be, (o->worker_len + 1) * sizeof(float));
    o->send = zeroed(o->be, o->block * p + 1);
    o->recv = zeroed(o->be, o->block * p + 1);
    return o;
}

void neox_onebit_free(neox_onebit *o) {
    if (!o) return;
    free(o->seg);
    void *mem[] = {o->worker_error, o->server_error, o->scratch, o->send, o->recv};
    for (size_t i = 0; i < sizeof mem / sizeof *mem; i++) o->be->free(mem[i]);
    free(o);
}

float *neox_onebit_error(neox_onebit *o, int server, size_t *count) {
    *count = server ? o->server_len : o->worker_len;
    return server ? o->server_error : o->worker_error;
}

void neox_onebit_reset(neox_onebit *o) {
    o->be->memset_zero(o->worker_error, o->worker_len * sizeof(float));
    o->be->memset_zero(o->server_error, o->server_len * sizeof(float));
}

// Where segment s's signs and scale sit in a block of the span's messages.
static size_t signs_at(const span *sp, const segment *g) { return sp->head + g->bytes - sp->bits0; }
static size_t scale_at(const span *sp, int s) { return (size_t)(s - sp->first) * sizeof(float); }

// Worker phase of segment s: compensate, chunk r's signs and the segment's scale to rank r's block,
// keep the error.
static void worker_phase(neox_onebit *o, const span *sp, int s, const float *x) {
    const segment *g = &o->seg[s];
    o->be->onebit_compress(o->send + signs_at(sp, g), sp->block, o->send + scale_at(sp, s), sp->block,
                           o->worker_error + g->worker, x, g->size, g->padded, o->comm->size);
}

// Server phase of segment s: average every rank's compressed chunk, compensate with the server
// error, re-compress; the signs and scale go to this rank's block of the all-gather (o->send).
static void server_phase(neox_onebit *o, const span *sp, int s) {
    const segment *g = &o->seg[s];
    size_t chunk = g->padded / (size_t)o->comm->size;
    float *sum = o->scratch + g->worker;
    o->be->onebit_average(sum, o->recv, sp->block, signs_at(sp, g), scale_at(sp, s), chunk, o->comm->size);
    o->be->onebit_compress(o->send + signs_at(sp, g), 0, o->send + scale_at(sp, s), 0, o->server_error + g->server,
                           sum, chunk, chunk, 1);
}

// Every server's chunk of segment s, decompressed into x (the padding dropped).
static void gather_phase(neox_onebit *o, const span *sp, int s, float *x) {
    const segment *g = &o->seg[s];
    o->be->onebit_decompress(x, o->recv, sp->block, signs_at(sp, g), scale_at(sp, s), g->padded / (size_t)o->comm->size,
                             g->size);
}

void neox_onebit_allreduce_range(neox_onebit *o, float *buf, int first, int count) {
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
        size_t chunk = g->padded / p, mine = rank * chunk;
        float *worker = o->worker_error + g->worker, *server = o->server_error + g->server;
        // The padding's error is dropped with the padding: it never reaches the caller's elements.
        o->be->add_inplace(buf + g->offset, worker, g->size);
        if (mine < g->size)
            o->be->add_scaled(buf + g->offset + mine, server, chunk < g->size - mine ? chunk : g->size - mine, (float)p);
        o->be->memset_zero(worker, g->padded * sizeof(float));
        o->be->memset_zero(server, chunk * sizeof(float));
    }
}

void neox_onebit_flush(neox_onebit *o, float *buf) { neox_onebit_flush_range(o, buf, 0, o->nseg); }
