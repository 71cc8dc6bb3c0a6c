/* The tile (AVX2): 8 weight rows' values interleaved so that vector lane c is row c (tile.c). */
#ifndef EXO_X86_TILE_H
#define EXO_X86_TILE_H

#include "exo_kernels.h"

#define TILE_COLS 8
#define TILE_MAX_R 4 /* activation rows per pass over a tile (8 measured slower: registers) */

typedef struct {
    int8_t* q; /* [nb * 256]: see tile_build_kind */
    float* d;  /* [nb * 8]: scale of values 0..15 (and 16..31 unless `halves`) */
    float* d2; /* [nb * 8]: scale of values 16..31 (Q6_K) */
    float* m;  /* [nb * 8]: offset per value */
} Tile;

static inline size_t tile_bytes(int nb) { return (size_t)nb * (256 + 3 * TILE_COLS * sizeof(float)); }

static inline Tile tile_at(void* buf, int nb) {
    char* p = (char*)buf;
    Tile t;
    t.q = (int8_t*)p;
    t.d = (float*)(p + (size_t)nb * 256);
    t.d2 = t.d + (size_t)nb * TILE_COLS;
    t.m = t.d2 + (size_t)nb * TILE_COLS;
    return t;
}

/* The tile of a repacked group (grouped.c): no transpose, the group is one already. */
void exo_x86_tile_from_group(int kind, const uint8_t* grp, int nb, Tile t);
/* issue 22 q5g: the same for Q5_1's and Q5_K's groups (grouped8_q5k.c) */
void exo_x86_tile_from_group_q5g(int kind, const uint8_t* grp, int nb, Tile t);

#endif
