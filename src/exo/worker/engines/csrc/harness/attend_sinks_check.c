/* The harness's check of exo_attend_decode_sinks (gpt-oss's sinks and sliding window) against a
 * double-precision reference: random shapes, windows shorter and longer than the rows, sinks or
 * none, the pages before a row's window left absent (the kernel must not read them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../exo_kernels.h"
#include "reference.h"

typedef struct {
    int B, H, KV, hd, P, max_pages, window;
    int64_t *pages, *pos;
    float *qkv, *rope, *sinks, *out;
} SinkCall;

static void* zalloc(size_t bytes) {
    void* p = calloc(1, bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

static int first_of(const SinkCall* c, int b) {
    const int p = (int)c->pos[b];
    return c->window > 0 && p >= c->window ? p - c->window + 1 : 0;
}

static float* cached_at(const SinkCall* c, int b, int kv, int j, int t) {
    float* page = (float*)(intptr_t)c->pages[(size_t)b * c->max_pages + t / c->P];
    return page + (((size_t)kv * c->KV + j) * c->P + t % c->P) * c->hd;
}

/* Row b's rotated head (hh < H: q head hh; else k head hh - H) into out [hd]. */
static void rotated(const SinkCall* c, int b, int hh, double* out) {
    const float* src = c->qkv + (size_t)b * (c->H + 2 * c->KV) * c->hd + (size_t)hh * c->hd;
    const float* rot = c->rope + (size_t)c->pos[b] * c->hd;
    for (int i = 0; i < c->hd / 2; i++) {
        const double cs = rot[2 * i], sn = rot[2 * i + 1], a = src[2 * i], bb = src[2 * i + 1];
        out[2 * i] = a * cs - bb * sn;
        out[2 * i + 1] = a * sn + bb * cs;
    }
}

/* want [B, H, hd] before the call (the new key and value taken from qkv). */
static void reference(const SinkCall* c, double* want) {
    double q[128], k[128], sc[256];
    const int G = c->H / c->KV, hd = c->hd;
    for (int b = 0; b < c->B; b++) {
        const int p = (int)c->pos[b], lo = first_of(c, b);
        const float* row = c->qkv + (size_t)b * (c->H + 2 * c->KV) * hd;
        for (int h = 0; h < c->H; h++) {
            const int j = h / G;
            rotated(c, b, h, q);
            rotated(c, b, c->H + j, k);
            double mx = c->sinks ? c->sinks[h] : -INFINITY, total = 0.0;
            for (int t = lo; t <= p; t++) {
                double d = 0.0;
                for (int i = 0; i < hd; i++) d += q[i] * (t == p ? k[i] : cached_at(c, b, 0, j, t)[i]);
                sc[t - lo] = d / sqrt((double)hd);
                mx = sc[t - lo] > mx ? sc[t - lo] : mx;
            }
            if (c->sinks) total = exp(c->sinks[h] - mx);
            for (int t = lo; t <= p; t++) total += (sc[t - lo] = exp(sc[t - lo] - mx));
            for (int i = 0; i < hd; i++) {
                double o = 0.0;
                for (int t = lo; t <= p; t++) {
                    const double v = t == p ? row[(size_t)(c->H + c->KV + j) * hd + i] : cached_at(c, b, 1, j, t)[i];
                    o += sc[t - lo] / total * v;
                }
                want[((size_t)b * c->H + h) * hd + i] = o;
            }
        }
    }
}

static void fill(Rng* r, SinkCall* c) {
    const int positions = c->max_pages * c->P, W = (c->H + 2 * c->KV) * c->hd;
    const size_t page_floats = (size_t)2 * c->KV * c->P * c->hd;
    c->pages = zalloc(sizeof(int64_t) * c->B * c->max_pages);
    c->pos = zalloc(sizeof(int64_t) * c->B);
    c->qkv = zalloc(sizeof(float) * c->B * W);
    c->rope = zalloc(sizeof(float) * positions * c->hd);
    c->out = zalloc(sizeof(float) * c->B * c->H * c->hd);
    c->sinks = rng_int(r, 0, 3) ? zalloc(sizeof(float) * c->H) : NULL;
    for (int i = 0; c->sinks && i < c->H; i++) c->sinks[i] = 3.0f * rng_normalish(r);
    for (int i = 0; i < c->B * W; i++) c->qkv[i] = rng_normalish(r);
    for (int t = 0; t < positions; t++)
        for (int i = 0; i < c->hd / 2; i++) {
            const double a = t * rng_unit(r);
            c->rope[(size_t)t * c->hd + 2 * i] = (float)cos(a);
            c->rope[(size_t)t * c->hd + 2 * i + 1] = (float)sin(a);
        }
    for (int b = 0; b < c->B; b++) {
        c->pos[b] = rng_int(r, 0, positions - 1);
        const int lo = first_of(c, b);
        for (int pg = lo / c->P; pg * c->P <= c->pos[b]; pg++) { /* pages before the window: absent */
            float* page = zalloc(sizeof(float) * page_floats);
            for (size_t i = 0; i < page_floats; i++) page[i] = rng_normalish(r);
            c->pages[b * c->max_pages + pg] = (int64_t)(intptr_t)page;
        }
    }
}

static void release(SinkCall* c) {
    for (int i = 0; i < c->B * c->max_pages; i++) free((void*)(intptr_t)c->pages[i]);
    free(c->pages), free(c->pos), free(c->qkv), free(c->rope), free(c->sinks), free(c->out);
}

/* One random call against the reference; 1 (printed) on a mismatch. */
int check_attend_sinks(Rng* r) {
    SinkCall c = {.KV = rng_int(r, 1, 3), .hd = 2 * rng_int(r, 1, 40), .P = rng_int(r, 1, 20),
                  .B = rng_int(r, 1, 4), .max_pages = rng_int(r, 1, 8)};
    c.H = c.KV * rng_int(r, 1, 4);
    c.window = rng_int(r, 0, 2) ? rng_int(r, 1, 2 * c.P + 3) : 0;
    fill(r, &c);
    double* want = zalloc(sizeof(double) * c.B * c.H * c.hd);
    reference(&c, want);
    const int rc = exo_attend_decode_sinks(c.qkv, c.B, c.H, c.KV, c.hd, c.rope, NULL, 1e-5f, c.pages,
                                           c.max_pages, c.P, 0, c.pos, c.sinks, c.window, c.out);
    int bad = rc != 0;
    if (bad) printf("FAIL exo_attend_decode_sinks returned %d\n", rc);
    for (int i = 0; !bad && i < c.B * c.H * c.hd; i++)
        if (!(fabs(c.out[i] - want[i]) <= 1e-4 + 1e-4 * fabs(want[i]))) {
            printf("FAIL exo_attend_decode_sinks B %d H %d KV %d hd %d P %d window %d sinks %d: out[%d] = %g, "
                   "want %g\n", c.B, c.H, c.KV, c.hd, c.P, c.window, c.sinks != NULL, i, (double)c.out[i], want[i]);
            bad = 1;
        }
    int64_t none[1] = {0}, at[1] = {0};
    if (exo_attend_decode_sinks(c.qkv, 1, 1, 1, 2, c.rope, NULL, 1e-5f, none, 1, 4, 0, at, NULL, -1, c.out) != -2) {
        printf("FAIL exo_attend_decode_sinks accepted a negative window\n");
        bad = 1;
    }
    free(want);
    release(&c);
    return bad;
}
