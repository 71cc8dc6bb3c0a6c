/* The weight kinds' traits table (see kinds.h). tests/test_engine_kind_table.py parses this table
 * (one row per kind, its first six fields as written below, in that order) and checks it against the
 * Python table, engines/kinds.py. */
#include "kinds.h"
#include "iq4.h" /* MXFP4, IQ4_NL, IQ4_XS */

#if EXO_AVX2
#define X86(f) f
#else
#define X86(f) NULL
#endif

/* tile_rows masks: from n activation rows on; one count */
#define ROWS_FROM(n) (0xFFFFFFFFu << (n))
#define ROWS(n) (1u << (n))
/* The per-row kernels (dot.c, arch/x86/dot.c) run 4 rows at once and unpack faster than a tile
 * is built: Q8_0 at 2 or 4 rows, Q4_K / Q5_K at 2, 4 or 5 stay on them (measured with weights not
 * in cache); a repacked layout turns a group into a tile from a few rows on (measured). */
#define FILE_OPS(dot, pair, unpacked)                                                              \
    {[EXO_ISA_GENERIC] = {exo_generic_##dot, exo_generic_##pair, unpacked ? exo_generic_unpacked : NULL, NULL, NULL}, \
     [EXO_ISA_AVX2] = {X86(exo_x86_##dot), X86(exo_x86_##pair), unpacked ? X86(exo_x86_unpacked) : NULL,               \
                       X86(exo_x86_tile), NULL} NEON_OPS(dot, pair)}
#define GROUPED_OPS(grouped)                                                                       \
    {[EXO_ISA_GENERIC] = {NULL, NULL, NULL, NULL, exo_generic_grouped},                            \
     [EXO_ISA_AVX2] = {NULL, NULL, NULL, X86(exo_x86_tile), X86(exo_x86_##grouped)}}
#define DOT8(k) {[EXO_ISA_GENERIC] = exo_generic_dot8_##k, [EXO_ISA_AVX2] = X86(exo_x86_dot8_##k) NEON_DOT8(k)}
/* issue 22: the repacked Q4 groups' 8-bit strategy */
#define GROUPED8(k) {[EXO_ISA_GENERIC] = exo_generic_grouped8, [EXO_ISA_AVX2] = X86(exo_x86_grouped8_##k) NEON_GROUPED8(k)}
/* issue 22 q5dots: Q5_0's groups' 8-bit strategy */
#define GROUPED8_Q5_0 {[EXO_ISA_GENERIC] = exo_generic_grouped8_q5_0, [EXO_ISA_AVX2] = X86(exo_x86_grouped8_q5_0) NEON_GROUPED8(q5_0)}
/* issue 22 q5g: Q5_1's / Q5_K's groups: at 16 bits the tile from the group (x86) at every row count, else
 * the generic groups; at 8 bits their grouped8 kernels */
#define GROUPED_TILE_OPS                                                                           \
    {[EXO_ISA_GENERIC] = {NULL, NULL, NULL, NULL, exo_generic_grouped},                            \
     [EXO_ISA_AVX2] = {NULL, NULL, NULL, X86(exo_x86_tile), NULL}}
#define GROUPED8_Q5G(k) {[EXO_ISA_GENERIC] = exo_generic_grouped8_q5g, [EXO_ISA_AVX2] = X86(exo_x86_grouped8_##k) NEON_GROUPED8(k)}
#define exo_generic_none NULL
/* a kind with the dot strategy alone (MXFP4, IQ4_NL, IQ4_XS, Q2_K, Q3_K) */
#define DOT_OPS(k)                                                                                 \
    {[EXO_ISA_GENERIC] = {exo_generic_dot_##k, NULL, NULL, NULL, NULL},                            \
     [EXO_ISA_AVX2] = {X86(exo_x86_dot_##k), NULL, NULL, NULL, NULL}}
#define exo_x86_none NULL
/* arm: the NEON column of aarch64 builds (arch/arm/: every file layout's per-row dot, Q8_0's and
 * Q5_0's pair; with dotprod, every 8-bit dot: the file layouts' per-row dot8 and the repacked
 * groups' grouped8); the other 16-bit strategies (tile, unpacked, grouped) take the generic entry
 * points. Nothing in x86 builds. */
#if defined(__aarch64__)
#if EXO_NEON
#define NEON(f) f
#else
#define NEON(f) NULL
#endif
#if EXO_NEON_DOTPROD
#define NEON8(f) f
#else
#define NEON8(f) NULL
#endif
#define NEON_OPS(dot, pair) , [EXO_ISA_NEON] = {NEON(exo_arm_##dot), NEON(exo_arm_##pair), NULL, NULL, NULL}
#define NEON_DOT8(k) , [EXO_ISA_NEON] = NEON8(exo_arm_dot8_##k)
#define exo_arm_none NULL
/* issue 22 arm8: the repacked groups' 8-bit strategy (arch/arm/grouped8.c) */
#define NEON_GROUPED8(k) , [EXO_ISA_NEON] = NEON8(exo_arm_grouped8_##k)
#else
#define NEON_OPS(dot, pair)
#define NEON_DOT8(k)
#define NEON_GROUPED8(k)
#endif

static const KindTraits KINDS[] = {
    {.kind = KIND_Q4_1, .name = "Q4_1", .file_kind = KIND_Q4_1, .grouped = KIND_Q4_1_G8, .block_values = 32,
     .block_bytes = 20, .act = ACT_X16, .tile_rows = ROWS_FROM(2), .unpack_from = 8, .pair_below = 0,
     .ops = FILE_OPS(dot_q4_1, none, 1), .act8 = ACT_X8, .dot8 = DOT8(q4_1)},
    {.kind = KIND_Q4_0, .name = "Q4_0", .file_kind = KIND_Q4_0, .grouped = KIND_Q4_0_G8, .block_values = 32, .block_bytes = 18,
     .act = ACT_X16, .tile_rows = ROWS_FROM(2), .unpack_from = 0, .pair_below = 0,
     .ops = FILE_OPS(dot_q4_0, none, 0), .act8 = ACT_X8, .dot8 = DOT8(q4_0)},
    {.kind = KIND_Q8_0, .name = "Q8_0", .file_kind = KIND_Q8_0, .grouped = KIND_Q8_0_G8, .block_values = 32,
     .block_bytes = 34, .act = ACT_X16, .tile_rows = ROWS_FROM(2) & ~ROWS(2) & ~ROWS(4), .unpack_from = 8,
     .pair_below = 4, .ops = FILE_OPS(dot_q8_0, pair_q8_0, 1), .act8 = ACT_X8, .dot8 = DOT8(q8_0)},
    {.kind = KIND_Q5_0, .name = "Q5_0", .file_kind = KIND_Q5_0, .grouped = KIND_Q5_0_G8, .block_values = 32,
     .block_bytes = 22, .act = ACT_X16, .tile_rows = ROWS_FROM(2), .unpack_from = 8, .pair_below = 4,
     .ops = FILE_OPS(dot_q5_0, pair_q5_0, 1), .act8 = ACT_X8, .dot8 = DOT8(q5_0)},
    {.kind = KIND_Q5_1, .name = "Q5_1", .file_kind = KIND_Q5_1, .grouped = KIND_Q5_1_G8, .block_values = 32, .block_bytes = 24,
     .act = ACT_X16, .tile_rows = ROWS_FROM(2), .unpack_from = 8, .pair_below = 0,
     .ops = FILE_OPS(dot_q5_1, none, 1), .act8 = ACT_X8, .dot8 = DOT8(q5_1)},
    {.kind = KIND_Q4_K, .name = "Q4_K", .file_kind = KIND_Q4_K, .grouped = KIND_Q4_K_G8, .block_values = 256,
     .block_bytes = 144, .act = ACT_X16, .tile_rows = ROWS(3) | ROWS_FROM(6), .unpack_from = 0, .pair_below = 0,
     .ops = FILE_OPS(dot_q4_k, none, 0), .act8 = ACT_X8, .dot8 = DOT8(q4_k)},
    {.kind = KIND_Q5_K, .name = "Q5_K", .file_kind = KIND_Q5_K, .grouped = KIND_Q5_K_G8, .block_values = 256,
     .block_bytes = 176, .act = ACT_X16, .tile_rows = ROWS(3) | ROWS_FROM(6), .unpack_from = 0, .pair_below = 0,
     .ops = FILE_OPS(dot_q5_k, none, 0), .act8 = ACT_X8, .dot8 = DOT8(q5_k)},
    {.kind = KIND_Q6_K, .name = "Q6_K", .file_kind = KIND_Q6_K, .grouped = KIND_Q6_K_G8, .block_values = 256,
     .block_bytes = 210, .act = ACT_X16, .tile_rows = ROWS_FROM(2), .unpack_from = 0, .pair_below = 0,
     .ops = FILE_OPS(dot_q6_k, none, 0), .act8 = ACT_X8, .dot8 = DOT8(q6_k)},
    {.kind = KIND_Q4_1_G8, .name = "Q4_1_G8", .file_kind = KIND_Q4_1, .grouped = 0, .block_values = 32,
     .block_bytes = 20, .act = ACT_X16, .tile_rows = ROWS_FROM(16), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_OPS(grouped_q4_1), .act8 = ACT_X8, .dot8 = GROUPED8(q4_1)},
    {.kind = KIND_Q4_0_G8, .name = "Q4_0_G8", .file_kind = KIND_Q4_0, .grouped = 0, .block_values = 32,
     .block_bytes = 18, .act = ACT_X16, .tile_rows = ROWS_FROM(16), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_OPS(grouped_q4_0), .act8 = ACT_X8, .dot8 = GROUPED8(q4_0)},
    {.kind = KIND_Q8_0_G8, .name = "Q8_0_G8", .file_kind = KIND_Q8_0, .grouped = 0, .block_values = 32,
     .block_bytes = 34, .act = ACT_X16, .tile_rows = ROWS_FROM(6), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_OPS(grouped_q8_0), .act8 = ACT_X8, .dot8 = GROUPED8(q8_0)},
    {.kind = KIND_Q5_0_G8, .name = "Q5_0_G8", .file_kind = KIND_Q5_0, .grouped = 0, .block_values = 32,
     .block_bytes = 22, .act = ACT_X16, .tile_rows = ROWS_FROM(4), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_OPS(grouped_q5_0), .act8 = ACT_X8, .dot8 = GROUPED8_Q5_0},
    {.kind = KIND_Q4_K_G8, .name = "Q4_K_G8", .file_kind = KIND_Q4_K, .grouped = 0, .block_values = 256,
     .block_bytes = 144, .act = ACT_X16, .tile_rows = ROWS_FROM(16), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_OPS(grouped_q4_k), .act8 = ACT_X8, .dot8 = GROUPED8(q4_k)},
    {.kind = KIND_Q6_K_G8, .name = "Q6_K_G8", .file_kind = KIND_Q6_K, .grouped = 0, .block_values = 256,
     .block_bytes = 210, .act = ACT_X16, .tile_rows = ROWS_FROM(4), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_OPS(grouped_q6_k), .act8 = ACT_X8, .dot8 = GROUPED8(q6_k)},
    /* MXFP4, IQ4_NL, IQ4_XS (iq4.h): the per-row dot at every row count */
    {.kind = KIND_MXFP4, .name = "MXFP4", .file_kind = KIND_MXFP4, .grouped = 0, .block_values = 32,
     .block_bytes = 17, .act = ACT_X16, .tile_rows = 0, .unpack_from = 0, .pair_below = 0, .ops = DOT_OPS(mxfp4)},
    {.kind = KIND_IQ4_NL, .name = "IQ4_NL", .file_kind = KIND_IQ4_NL, .grouped = 0, .block_values = 32,
     .block_bytes = 18, .act = ACT_X16, .tile_rows = 0, .unpack_from = 0, .pair_below = 0, .ops = DOT_OPS(iq4_nl)},
    {.kind = KIND_IQ4_XS, .name = "IQ4_XS", .file_kind = KIND_IQ4_XS, .grouped = 0, .block_values = 256,
     .block_bytes = 136, .act = ACT_X16, .tile_rows = 0, .unpack_from = 0, .pair_below = 0, .ops = DOT_OPS(iq4_xs)},
    /* issue 23: Q2_K, Q3_K (kquant23.h): the per-row dot at every row count (no tile, no groups) */
    {.kind = KIND_Q2_K, .name = "Q2_K", .file_kind = KIND_Q2_K, .grouped = 0, .block_values = 256,
     .block_bytes = 84, .act = ACT_X16, .tile_rows = 0, .unpack_from = 0, .pair_below = 0,
     .ops = DOT_OPS(q2_k)},
    {.kind = KIND_Q3_K, .name = "Q3_K", .file_kind = KIND_Q3_K, .grouped = 0, .block_values = 256,
     .block_bytes = 110, .act = ACT_X16, .tile_rows = 0, .unpack_from = 0, .pair_below = 0,
     .ops = DOT_OPS(q3_k)},
    /* issue 22 q5g: Q5_1 and Q5_K in groups of 8 rows */
    {.kind = KIND_Q5_1_G8, .name = "Q5_1_G8", .file_kind = KIND_Q5_1, .grouped = 0, .block_values = 32,
     .block_bytes = 24, .act = ACT_X16, .tile_rows = ROWS_FROM(1), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_TILE_OPS, .act8 = ACT_X8, .dot8 = GROUPED8_Q5G(q5_1)},
    {.kind = KIND_Q5_K_G8, .name = "Q5_K_G8", .file_kind = KIND_Q5_K, .grouped = 0, .block_values = 256,
     .block_bytes = 176, .act = ACT_X16, .tile_rows = ROWS_FROM(1), .unpack_from = 0, .pair_below = 0,
     .ops = GROUPED_TILE_OPS, .act8 = ACT_X8, .dot8 = GROUPED8_Q5G(q5_k)},
};

_Static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ5_0) == 22 &&
                   sizeof(BlockQ5_1) == 24 && sizeof(BlockQ4K) == 144 && sizeof(BlockQ5K) == 176 &&
                   sizeof(BlockQ6K) == 210,
               "a file block's size is not its row's block_bytes");
_Static_assert(sizeof(BlockQ4_0x8) == 8 * 18 && sizeof(BlockQ4_1x8) == 8 * 20 && sizeof(BlockQ5_0x8) == 8 * 22 && sizeof(BlockQ8_0x8) == 8 * 34 &&
                   sizeof(BlockQ4Kx8) == 8 * 144 && sizeof(BlockQ6Kx8) == 8 * 210,
               "a repacked group's block is not its 8 rows' bytes");
/* issue 22 q5g */
_Static_assert(sizeof(BlockQ5_1x8) == 8 * 24 && sizeof(BlockQ5Kx8) == 8 * 176, "a repacked Q5 group's block is not its 8 rows' bytes");
_Static_assert(sizeof(BlockMXFP4) == 17 && sizeof(BlockIQ4NL) == 18 && sizeof(BlockIQ4XS) == 136,
               "an MXFP4 / IQ4 block's size is not its row's block_bytes");

const KindTraits* exo_kind_traits(int kind) {
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (KINDS[i].kind == kind) return &KINDS[i];
    return NULL;
}
