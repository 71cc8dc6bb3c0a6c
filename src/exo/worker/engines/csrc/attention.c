/* One decode step of attention on the paged KV cache (exo_attend_decode): rotate q and k,
 * append k and v to the cache, attend over positions 0..pos. exo_attend_decode_sinks adds
 * gpt-oss's attention: a sink logit per head in the softmax's denominator and a sliding window
 * (the last `window` positions only). exo_attend_decode_kv also reads a cache of half floats
 * (f16: keys and values rounded to nearest even when stored, widened to f32 when read; the
 * arithmetic is f32 either way). */
#include <math.h>

#include "exo_kernels.h"

/* Rotate the pairs (x[2i], x[2i+1]) of one head by the angles of `rot` ([hd/2] of (cos, sin)). */
static void rotate_head(float* x, const float* rot, int hd) {
    for (int i = 0; i < hd / 2; i++) {
        const float c = rot[2 * i], s = rot[2 * i + 1];
        const float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

static void rms_norm_head(float* x, const float* g, float eps, int hd) {
    float ss = 0.0f;
    for (int i = 0; i < hd; i++) ss += x[i] * x[i];
    const float scale = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int i = 0; i < hd; i++) x[i] = x[i] * scale * g[i];
}

/* The inner loops over a run of cached keys or values, once for a cache of floats (dot_f32,
 * scores_f32, weighted_sum_f32) and once for one of half floats (..._f16). */
#define KV_SUF f32
#define KV_T float
#define KV_FLOAT(x) (x)
#define KV_LOAD8(p) _mm256_loadu_ps(p)
#include "attend_loops.h"
#define KV_SUF f16
#define KV_T uint16_t
#define KV_FLOAT(x) exo_h2f(x)
#define KV_LOAD8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(const void*)(p)))
#include "attend_loops.h"

typedef struct {
    const float* qkv;
    int B, H, KV, hd;
    const float *rope, *qk_norm;
    float eps;
    const int64_t* pages; /* [B, max_pages] page addresses: page [L, 2, KV, P, hd] elements */
    int max_pages, P;
    long layer_off;       /* elements from a page's start to this layer's keys */
    int half;             /* the cache's elements: 1 f16, 0 f32 */
    const int64_t* pos;
    const float* sinks;   /* [H] sink logits, or NULL */
    int window;           /* > 0: positions pos - window + 1 .. pos only; 0: every position */
    float* out;
    int per;              /* tasks per (row, kv head): 1 (all its query heads) or H / KV (one each) */
    long work_units;      /* the tasks' work in all (task_at's units) */
    int failed;           /* set by any thread that found no memory (under no lock: only 0 -> 1) */
} AttendJob;

/* Row b's key (kv = 0) or value (kv = 1) of kv head j at position t (float or uint16_t). */
static inline void* cached(const AttendJob* a, int b, int kv, int j, int t) {
    char* page = (char*)(intptr_t)a->pages[(size_t)b * a->max_pages + t / a->P];
    const size_t at = a->layer_off + (((size_t)kv * a->KV + j) * a->P + t % a->P) * a->hd;
    return page + at * (a->half ? sizeof(uint16_t) : sizeof(float));
}

/* Ask for the keys and values of positions [t0, t1) of task (b, j) (into L2: a task's 2 L hd
 * floats outgrow L1). Between layers they have left the caches (a step streams every layer's
 * weights) and a row's positions of one head are short runs (a page each) that the hardware
 * prefetchers start late on; asked for in slices while the task before computes, they load in
 * its shadow (measured: ~8% less CPU time for a call whose cache is not in L3, 8 rows of 120
 * positions; asking for all of a task at once measured no better). */
static void prefetch_span(const AttendJob* a, int b, int j, int t0, int t1) {
    const size_t row = (size_t)a->hd * (a->half ? sizeof(uint16_t) : sizeof(float));
    while (t0 < t1) {
        const int in_page = a->P - t0 % a->P;
        const int n = t1 - t0 < in_page ? t1 - t0 : in_page;
        const char* k = (const char*)cached(a, b, 0, j, t0);
        const char* v = (const char*)cached(a, b, 1, j, t0);
        for (size_t off = 0; off < (size_t)n * row; off += 64) {
            __builtin_prefetch(k + off, 0, 2);
            __builtin_prefetch(v + off, 0, 2);
        }
        t0 += n;
    }
}

/* The first position row b's query attends to. */
static inline int first_key(const AttendJob* a, int b) {
    const int p = (int)a->pos[b];
    return a->window > 0 && p >= a->window ? p - a->window + 1 : 0;
}

/* Slice `i` of `n` of the prefetch of task `next` (-1: none). */
static inline void prefetch_slice(const AttendJob* a, int next, int i, int n) {
    if (next < 0) return;
    const int b = next / a->KV, j = next % a->KV, t0 = first_key(a, b);
    const int L = (int)a->pos[b] + 1 - t0;
    prefetch_span(a, b, j, t0 + (int)((long)L * i / n), t0 + (int)((long)L * (i + 1) / n));
}

/* Positions [t0, t1) of kv head j of row b are contiguous within a page: the next run's end. */
static inline int run_end(const AttendJob* a, int t, int t1) {
    const int page_end = t - t % a->P + a->P;
    return page_end < t1 ? page_end : t1;
}

/* Append row b's key and value of kv head j at its position to the cache (the key after its
 * RMSNorm, when qk_norm is given, and rotated; in a cache of half floats, each rounded to nearest
 * even after that float arithmetic). Every task that reads the cache runs after all appends: a
 * task may attend with one query head of a group, so no task owns a head's append. `tmp`: hd
 * floats. */
static void append_kv(const AttendJob* a, int b, int j, float* tmp) {
    const int hd = a->hd, p = (int)a->pos[b];
    const float* row = a->qkv + (size_t)b * (a->H + 2 * a->KV) * hd;
    const int kh = a->H + j; /* k head j within the q | k | v row */
    const float* v = row + (size_t)(a->H + a->KV + j) * hd;
    float* kp = a->half ? tmp : (float*)cached(a, b, 0, j, p);
    for (int i = 0; i < hd; i++) kp[i] = row[(size_t)kh * hd + i];
    if (a->qk_norm) rms_norm_head(kp, a->qk_norm + (size_t)kh * hd, a->eps, hd);
    rotate_head(kp, a->rope + (size_t)p * hd, hd);
    if (a->half) {
        uint16_t* kh16 = cached(a, b, 0, j, p);
        uint16_t* vh16 = cached(a, b, 1, j, p);
        for (int i = 0; i < hd; i++) {
            kh16[i] = exo_f2h(kp[i]);
            vh16[i] = exo_f2h(v[i]);
        }
    } else {
        float* vp = cached(a, b, 1, j, p);
        for (int i = 0; i < hd; i++) vp[i] = v[i];
    }
}

/* Task t: row b, kv head j, and query heads [g0, g1) of the G that share it (all G, or a
 * thread's share when a step has too few (row, kv head) pairs to keep the threads busy); the
 * keys and values of task `next` (-1: none) are asked for meanwhile. A page's run of keys (or
 * values) is read from memory once and used by every query head of the task while it is in
 * this core's caches (head by head over the whole row, Gemma 3 270M's 4 query heads on one kv
 * head, 4,096 positions not in cache, took 1.2-1.75x as long: a row's keys outgrow L2). Each
 * query head's arithmetic is the same whichever task holds it, in the same order: the threads
 * and the split never change a result's bits. */
static void attend_task(const AttendJob* a, int b, int j, int g0, int g1, int next, float* scratch) {
    const int G = a->H / a->KV, hd = a->hd;
    const float* row = a->qkv + (size_t)b * (a->H + 2 * a->KV) * hd;
    const int p = (int)a->pos[b], t0 = first_key(a, b);
    const float* rot = a->rope + (size_t)p * hd;
    const int L = p + 1 - t0; /* keys attended: positions t0 .. p */
    float* q = scratch;                        /* [G, hd] */
    float* scores = scratch + (size_t)G * hd;  /* [G, L] */
    const float scale = 1.0f / sqrtf((float)hd);
    const int runs = (p - (t0 - t0 % a->P)) / a->P + 1; /* pages of positions t0 .. p */
    for (int g = g0; g < g1; g++) {
        const int h = j * G + g;
        float* qg = q + (size_t)g * hd;
        for (int i = 0; i < hd; i++) qg[i] = row[(size_t)h * hd + i];
        if (a->qk_norm) rms_norm_head(qg, a->qk_norm + (size_t)h * hd, a->eps, hd);
        rotate_head(qg, rot, hd);
    }
    int r = 0;
    for (int t = t0, e; t <= p; t = e, r++) { /* a page's keys are contiguous */
        e = run_end(a, t, p + 1);
        const void* k = cached(a, b, 0, j, t);
        for (int g = g0; g < g1; g++) {
            float* sg = scores + (size_t)g * L + (t - t0);
            if (a->half)
                scores_f16(q + (size_t)g * hd, k, e - t, hd, scale, sg);
            else
                scores_f32(q + (size_t)g * hd, k, e - t, hd, scale, sg);
        }
        prefetch_slice(a, next, r, 2 * runs);
    }
    for (int g = g0; g < g1; g++) {
        const int h = j * G + g;
        float* sg = scores + (size_t)g * L;
        const float sink = a->sinks ? a->sinks[h] : -INFINITY;
        float mx = sink;
        for (int t = 0; t < L; t++) mx = sg[t] > mx ? sg[t] : mx;
        float total = a->sinks ? exo_expf(sink - mx) : 0.0f;
        int t = 0;
#if EXO_AVX2
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vtot = _mm256_setzero_ps();
        for (; t + 8 <= L; t += 8) {
            const __m256 e = exo_exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t), vmx));
            _mm256_storeu_ps(sg + t, e);
            vtot = _mm256_add_ps(vtot, e);
        }
        total += exo_hsum8(vtot);
#endif
        for (; t < L; t++) {
            sg[t] = exo_expf(sg[t] - mx);
            total += sg[t];
        }
        const float inv = 1.0f / total;
        for (t = 0; t < L; t++) sg[t] *= inv;
        float* o = a->out + ((size_t)b * a->H + h) * hd;
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
    }
    r = 0;
    for (int t = t0, e; t <= p; t = e, r++) {
        e = run_end(a, t, p + 1);
        const void* v = cached(a, b, 1, j, t);
        for (int g = g0; g < g1; g++) {
            const float* pg = scores + (size_t)g * L + (t - t0);
            float* o = a->out + ((size_t)b * a->H + j * G + g) * hd;
            if (a->half)
                weighted_sum_f16(pg, v, e - t, hd, o);
            else
                weighted_sum_f32(pg, v, e - t, hd, o);
        }
        prefetch_slice(a, next, runs + r, 2 * runs);
    }
}

/* A task of row b in task_at's units: its keys, plus one for what a task costs besides. */
static inline long task_cost(const AttendJob* a, int b) { return (long)a->pos[b] + 2 - first_key(a, b); }

/* The first task whose work starts at or after `work` (tasks in order, each costing its row's
 * keys plus one): the boundary between two threads' runs of tasks. Runs of equal work, not of
 * equal counts: rows of a batch attend over contexts of any lengths. */
static int task_at(const AttendJob* a, long work) {
    const int per_row = a->KV * a->per;
    for (int b = 0; b < a->B; b++) {
        const long cost = task_cost(a, b);
        const long k = work <= 0 ? 0 : (work + cost - 1) / cost;
        if (k < per_row) return b * per_row + (int)k;
        work -= cost * per_row;
    }
    return a->B * per_row;
}

static void attend_part(void* ctx, int part, int parts) {
    AttendJob* a = (AttendJob*)ctx;
    const int G = a->H / a->KV, per = a->per; /* per: tasks of a (row, kv head) pair, 1 or G */
    const size_t need = (size_t)G * a->hd + (size_t)G * a->max_pages * a->P;
    float* scratch_att = exo_scratch(SCRATCH_ATTEND, need * sizeof(float));
    if (scratch_att == NULL) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const long total = a->work_units;
    const int first = task_at(a, total * part / parts), end = task_at(a, total * (part + 1) / parts);
    if (first < end) prefetch_slice(a, first / per, 0, 1);
    for (int t = first; t < end;) { /* this run's tasks of one pair in one call */
        const int pair = t / per, g0 = per == 1 ? 0 : t % per;
        const int stop = per == 1 ? t + 1 : (pair + 1) * per < end ? (pair + 1) * per : end;
        const int next = stop < end ? stop / per : -1; /* the next pair's keys meanwhile */
        attend_task(a, pair / a->KV, pair % a->KV, g0, per == 1 ? G : g0 + (stop - t), next,
                    scratch_att);
        t = stop;
    }
}

/* One decoding step of B rows, one new token each:
 *   q, k = rotate(qkv's q and k heads) (after a per-head RMSNorm when qk_norm is given),
 *   cache[pos] = k, v;  out = softmax(q K^T / sqrt(hd)) V over positions 0..pos.
 * qkv [B, (H + 2KV) * hd]; rope [positions, hd/2, 2] (cos, sin); qk_norm [H + KV, hd] or NULL;
 * the paged cache of floats: pages [B, max_pages] addresses of pages [L, 2, KV, P, hd] (keys,
 * values of P positions), this layer at float offset layer_off; pos [B]; out [B, H * hd].
 * Returns 0 on success, -1 out of memory, -2 bad sizes, -3 a position past the pages, -4 a
 * missing page. */
int exo_attend_decode(const float* qkv, int B, int H, int KV, int hd, const float* rope,
                      const float* qk_norm, float eps, const int64_t* pages, int max_pages, int P,
                      long layer_off, const int64_t* pos, float* out) {
    return exo_attend_decode_kv(qkv, B, H, KV, hd, rope, qk_norm, eps, pages, max_pages, P,
                                layer_off, pos, NULL, 0, 0, out);
}

/* exo_attend_decode with gpt-oss's sinks and sliding window:
 *   out = p V,  p = softmax([q K^T / sqrt(hd), sinks[h]])[:L]  over positions lo..pos,
 * lo = max(0, pos - window + 1) (window 0: lo = 0); sinks [H] or NULL (no sink). Only the
 * pages of positions lo..pos are read (those before may be absent). Returns as
 * exo_attend_decode; -2 also for a negative window. */
int exo_attend_decode_sinks(const float* qkv, int B, int H, int KV, int hd, const float* rope,
                            const float* qk_norm, float eps, const int64_t* pages, int max_pages,
                            int P, long layer_off, const int64_t* pos, const float* sinks,
                            int window, float* out) {
    return exo_attend_decode_kv(qkv, B, H, KV, hd, rope, qk_norm, eps, pages, max_pages, P,
                                layer_off, pos, sinks, window, 0, out);
}

/* exo_attend_decode_sinks on a cache of floats (half 0) or of half floats (half 1: f16 bits;
 * layer_off then counts half floats). Returns as exo_attend_decode_sinks; -2 also for a `half`
 * other than 0 or 1. */
int exo_attend_decode_kv(const float* qkv, int B, int H, int KV, int hd, const float* rope,
                         const float* qk_norm, float eps, const int64_t* pages, int max_pages,
                         int P, long layer_off, const int64_t* pos, const float* sinks,
                         int window, int half, float* out) {
    if (B < 0 || H <= 0 || KV <= 0 || H % KV != 0 || hd <= 0 || hd % 2 != 0 || P <= 0 ||
        max_pages <= 0 || layer_off < 0 || window < 0 || (half != 0 && half != 1))
        return -2;
    AttendJob job = {qkv, B, H, KV, hd, rope, qk_norm, eps, pages, max_pages, P, layer_off,
                     half, pos, sinks, window, out, 1, 0, 0};
    long work = 0;      /* multiply-adds, to decide whether threads pay off */
    long row_costs = 0; /* task_cost over the rows */
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0 || pos[b] >= (int64_t)max_pages * P) return -3;
        const int lo = first_key(&job, b);
        for (int t0 = lo - lo % P; t0 <= pos[b]; t0 += P)
            if (pages[(size_t)b * max_pages + t0 / P] == 0) return -4;
        work += 2 * (pos[b] + 1 - lo) * (long)H * hd;
        row_costs += task_cost(&job, b);
    }
    float* tmp = half ? exo_scratch(SCRATCH_ATTEND, (size_t)hd * sizeof(float)) : NULL;
    if (half && tmp == NULL) return -1;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < KV; j++) append_kv(&job, b, j, tmp);
    /* Too few (row, kv head) pairs to share among the threads evenly (one stream of a model
     * with 1 or 3 kv heads on 2 threads: one idles for a third of the call, or all of it):
     * one task per query head, in one run of consecutive tasks of equal work per thread, so
     * that a pair's keys and values are read by one or two threads, not all (measured: dealt
     * out one task at a time, 2 rows of 3 pairs on 2 threads took 1.2x as long as the pairs
     * whole).
     * Otherwise a pair's query heads stay together, its keys and values read from this core's
     * caches after the first head. */
    const int threads = work >= (1L << 17) ? exo_get_threads() : 1; /* threads pay off? */
    int parts = 1;
    if (threads > 1 && B * KV < 4 * threads) {
        job.per = H / KV;
        parts = threads;
    } else if (threads > 1) {
        parts = B * KV < MAX_THREADS ? B * KV : MAX_THREADS;
    }
    job.work_units = row_costs * KV * job.per;
    exo_run_parallel(attend_part, &job, parts);
    return job.failed ? -1 : 0;
}
