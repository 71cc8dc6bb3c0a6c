/* Helpers the kernels of several files share (inline). */
#ifndef EXO_QUANTS_H
#define EXO_QUANTS_H

#include "exo_kernels.h"

/* Sub-block j's 6-bit scale and min of a Q4_K / Q5_K super-block's 12 packed bytes s. */
static inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
