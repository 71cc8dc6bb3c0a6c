/* References for MXFP4, IQ4_NL and IQ4_XS rows (kinds 70, 60, 110), written from GGUF's block
 * layouts in double precision, sharing no code with the kernels (reference.c calls these first).
 *   MXFP4  17 B / 32 values: exponent byte e, 16 bytes of codes: 2^(e - 128) * E2M1x2[code]
 *   IQ4_NL 18 B / 32 values: f16 d, 16 bytes of codes: d * NL[code]
 *   IQ4_XS 136 B / 256 values: f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of codes; the
 *          32 values of sub-block j scaled by d * (ls - 32), ls = nibble j % 2 of scales_l[j / 2]
 *          + 16 * (bits 2j, 2j + 1 of scales_h)
 * Codes: byte i of each 16 holds value i in its low nibble and value i + 16 in its high one. */
#include <math.h>
#include <string.h>

#include "reference.h"

static const double NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const double E2M1_TWICE[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static uint16_t half_at(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static void codes(const uint8_t* qs, const double* table, double scale, double* out) {
    for (int i = 0; i < 32; i++) out[i] = scale * table[i < 16 ? qs[i] & 15 : qs[i - 16] >> 4];
}

int ref_iq4_block_bytes(int kind) {
    return kind == 70 ? 17 : kind == 60 ? 18 : kind == 110 ? 136 : 0;
}

int ref_iq4_random_row(Rng* r, int kind, int K, uint8_t* row) {
    const int bb = ref_iq4_block_bytes(kind), bv = kind == 110 ? 256 : 32;
    if (bb == 0) return 0;
    for (int i = 0; i < K / bv * bb; i++) row[i] = (uint8_t)rng_next(r);
    for (int b = 0; b < K / bv; b++) {
        uint8_t* blk = row + (size_t)b * bb;
        if (kind == 70) {
            blk[0] = (uint8_t)rng_int(r, 116, 126); /* 2^-12 .. 2^-2 */
        } else {
            const uint16_t d = rng_half(r, kind == 60 ? -12 : -14, kind == 60 ? -7 : -10);
            memcpy(blk, &d, 2);
        }
    }
    return 1;
}

int ref_iq4_dequant_row(int kind, const uint8_t* row, int K, double* out) {
    if (kind == 70 || kind == 60) {
        for (int b = 0; b < K / 32; b++) {
            const uint8_t* blk = row + (size_t)b * ref_iq4_block_bytes(kind);
            if (kind == 70) codes(blk + 1, E2M1_TWICE, ldexp(1.0, blk[0] - 128), out + 32 * b);
            else codes(blk + 2, NL, ref_half(half_at(blk)), out + 32 * b);
        }
        return 1;
    }
    if (kind != 110) return 0;
    for (int b = 0; b < K / 256; b++) {
        const uint8_t* blk = row + (size_t)b * 136;
        const double d = ref_half(half_at(blk));
        const int high = half_at(blk + 2);
        for (int j = 0; j < 8; j++) {
            const int ls = (blk[4 + j / 2] >> (4 * (j % 2)) & 15) + 16 * ((high >> (2 * j)) & 3);
            codes(blk + 8 + 16 * j, NL, d * (ls - 32), out + 256 * b + 32 * j);
        }
    }
    return 1;
}
