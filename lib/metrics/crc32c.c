// crc32c.c: CRC32C (Castagnoli), the checksum of TFRecord framing in TensorBoard event files.
// A byte-at-a-time table is plenty: event files carry a few hundred bytes per log interval.
#include <pthread.h>

#include "metrics/internal.h"

static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void build_crc_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int bit = 0; bit < 8; bit++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t neox_crc32c(const void *data, size_t size) {
    pthread_once(&crc_table_once, build_crc_table);
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < size; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t neox_crc32c_masked(const void *data, size_t size) {
    uint32_t c = neox_crc32c(data, size);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
