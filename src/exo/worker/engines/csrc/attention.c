/* One decode step of attention on the paged KV cache (exo_attend_decode): rotate q and k,
 * append k and v to the cache, attend over positions 0..pos. exo_attend_decode_sinks adds
 * gpt-oss's attention: a sink logit per head in the softmax's denominator and a sliding window
 * (the last `window` positions only). exo_attend_decode_kv also reads a cache of half floats
 * (f16: keys and values rounded to nearest even when stored, widened to f32 when read; the
 * arithmetic is f32 either way). */
#include <math.h>
#include <string.h>

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

/* The first position row b's query attends to. */
static inline int first_key(const AttendJob* a, int b) {
    const int p = (int)a->pos[b];
    return a->window > 0 && p >= a->window ? p - a->window + 1 : 0;
}

/* Positions [t0, t1) of kv head j of row b are contiguous within a page: the next run's end. */
static inline int run_end(const AttendJob* a, int t, int t1) {
    const int page_end = t - t % a->P + a->P;
    return page_end < t1 ? page_end : t1;
}

/* The keys and values a thread's tasks read, in the order they read them (a pair's keys run by
 * run, then its values; then the next pair's), asked for ATT_AHEAD bytes ahead of the reading
 * (into L2). Between layers they have left the caches (a step streams every layer's weights),
 * and a row's positions of one head are short runs (a page each) that the hardware prefetchers
 * start late on. Asked for a line at a time as the loops read (ahead_pace), not in bursts: the
 * next task's keys and values in slices of a page's run stalled the loads of the task computing
 * (Zen 3, 8 rows of 121 positions not in cache, TLB cold: SmolLM2's 3 kv heads of 64 1.4x,
 * Gemma 3's 1 of 256 1.65x as fast this way, up to 10% slower with all in cache; 2 KB ahead
 * was slower, 16 or 32 KB no faster). */
#define ATT_AHEAD 8192
typedef struct {
    const AttendJob* job;
    const char* at;  /* the next byte to ask for, in the current run */
    long left;       /* bytes of that run from `at` */
    long asked;      /* bytes asked for so far */
    long read;       /* bytes the tasks have read so far */
    int pair, last;  /* the pair asked for now, the thread's last */
    int kv, t;       /* its next run: keys (0) or values (1), first position; kv 2: none left */
} Ahead;

static inline long row_bytes(const AttendJob* a) { return (long)a->hd * (a->half ? 2 : 4); }

/* The reads of pairs first .. last (row b, kv head j: pair b KV + j; none if last < first),
 * none asked for yet. */
static void ahead_start(const AttendJob* a, Ahead* f, int first, int last) {
    f->job = a, f->at = NULL, f->left = 0, f->asked = 0, f->read = 0;
    f->pair = first, f->last = last, f->kv = first <= last ? 0 : 2;
    if (first <= last) f->t = first_key(a, first / a->KV);
}

/* Ask for the bytes up to `upto`, a line at a time (and each run's last byte: a run need not
 * start on a line). */
static void ahead_to(Ahead* f, long upto) {
    const AttendJob* a = f->job;
    while (f->asked < upto) {
        if (f->left == 0) { /* the next run */
            if (f->kv == 2) return;
            const int b = f->pair / a->KV, p = (int)a->pos[b], e = run_end(a, f->t, p + 1);
            f->at = (const char*)cached(a, b, f->kv, f->pair % a->KV, f->t);
            f->left = (long)(e - f->t) * row_bytes(a);
            __builtin_prefetch(f->at + f->left - 1, 0, 2);
            f->t = e;
            if (e > p) { /* the pair's keys done: its values; its values: the next pair */
                if (f->kv == 1) f->pair++;
                f->kv = f->kv == 0 ? 1 : f->pair <= f->last ? 0 : 2;
                if (f->kv < 2) f->t = first_key(a, f->pair / a->KV);
            }
        }
        long n = (upto - f->asked + 63) & ~63L;
        n = n < f->left ? n : f->left;
        for (long off = 0; off < n; off += 64) __builtin_prefetch(f->at + off, 0, 2);
        f->at += n, f->left -= n, f->asked += n;
    }
}

/* The tasks have read `bytes` more (f: NULL, nothing to ask). */
static inline void ahead_pace(Ahead* f, long bytes) {
    if (f == NULL) return;
    f->read += bytes;
    if (f->read + ATT_AHEAD >= f->asked + 64) ahead_to(f, f->read + ATT_AHEAD);
}

/* The inner loops over a run of cached keys or values, once for a cache of floats (scores_f32,
 * weighted_sum_f32) and once for one of half floats (..._f16). ATT_HB: the query heads one pass
 * of the AVX2 loops serves (their accumulators fill the registers). */
#define ATT_HB 4
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
        int i = 0;
#if EXO_AVX2 /* (the rounding of exo_f2h's, 8 at a time) */
        for (; i + 8 <= hd; i += 8) {
            _mm_storeu_si128((__m128i*)(void*)(kh16 + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(kp + i), _MM_FROUND_TO_NEAREST_INT));
            _mm_storeu_si128((__m128i*)(void*)(vh16 + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT));
        }
#endif
        for (; i < hd; i++) {
            kh16[i] = exo_f2h(kp[i]);
            vh16[i] = exo_f2h(v[i]);
        }
    } else {
        float* vp = cached(a, b, 1, j, p);
        for (int i = 0; i < hd; i++) vp[i] = v[i];
    }
}

/* The largest of x[0 .. n) and m (a NaN is passed over, as by `x > m ? x : m`). */
static float max_of(const float* x, int n, float m) {
    int t = 0;
#if EXO_AVX2
    if (n >= 8) {
        __m256 v = _mm256_set1_ps(m);
        for (; t + 8 <= n; t += 8) v = _mm256_max_ps(_mm256_loadu_ps(x + t), v); /* NaN: v */
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        m = _mm_cvtss_f32(h);
    }
#endif
    for (; t < n; t++) m = x[t] > m ? x[t] : m;
    return m;
}

/* Task t: row b, kv head j, and query heads [g0, g1) of the G that share it (all G, or a
 * thread's share when a step has too few (row, kv head) pairs to keep the threads busy); its
 * reads pace `ahead`. A page's run of keys (or values) is read from memory once, and widened
 * once, for the task's query heads together (attend_loops.h; head by head over the whole row,
 * Gemma 3 270M's 4 query heads on one kv head, 4,096 positions not in cache, took 1.2-1.75x as
 * long: a row's keys outgrow L2). The values go in chunks of at most ATT_WCH bytes: a pass of
 * the loops reads a chunk once for each block of dimensions, from L1 (Gemma 3's 64 positions
 * of 512 bytes a page did not stay there). Each query head's arithmetic is the same whichever
 * task holds it, in the same order: the threads and the split never change a result's bits.
 * scratch: n hd + n L floats (n = g1 - g0), then P hd for a cache of half floats (where the
 * loops that cannot widen 8 at a time widen a run once). */
#define ATT_WCH 8192
static void attend_task(const AttendJob* a, int b, int j, int g0, int g1, Ahead* ahead,
                        float* scratch) {
    const int G = a->H / a->KV, hd = a->hd, n = g1 - g0;
    const float* row = a->qkv + (size_t)b * (a->H + 2 * a->KV) * hd;
    const int p = (int)a->pos[b], t0 = first_key(a, b);
    const float* rot = a->rope + (size_t)p * hd;
    const int L = p + 1 - t0; /* keys attended: positions t0 .. p */
    float* q = scratch;                         /* [n, hd]: heads g0 .. g1 - 1 */
    float* scores = scratch + (size_t)n * hd;   /* [n, L] */
    float* wide = a->half ? scores + (size_t)n * L : NULL;
    const float scale = 1.0f / sqrtf((float)hd);
    const int h0 = j * G + g0;                          /* the first query head */
    for (int g = 0; g < n; g++) {
        float* qg = q + (size_t)g * hd;
        memcpy(qg, row + (size_t)(h0 + g) * hd, sizeof(float) * (size_t)hd);
        if (a->qk_norm) rms_norm_head(qg, a->qk_norm + (size_t)(h0 + g) * hd, a->eps, hd);
        rotate_head(qg, rot, hd);
    }
    for (int t = t0, e; t <= p; t = e) { /* a page's keys are contiguous */
        e = run_end(a, t, p + 1);
        const void* k = cached(a, b, 0, j, t);
        if (a->half)
            scores_f16(q, n, k, e - t, hd, scale, scores + (t - t0), (size_t)L, wide, ahead);
        else
            scores_f32(q, n, k, e - t, hd, scale, scores + (t - t0), (size_t)L, NULL, ahead);
    }
    float* o = a->out + ((size_t)b * a->H + h0) * hd; /* [n, hd] */
    for (int g = 0; g < n; g++) {
        float* sg = scores + (size_t)g * L;
        const float sink = a->sinks ? a->sinks[h0 + g] : -INFINITY;
        const float mx = max_of(sg, L, sink);
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
    }
    memset(o, 0, sizeof(float) * (size_t)n * hd);
    const long fit = ATT_WCH / row_bytes(a);
    const int most = fit > 4 ? (int)fit : 4; /* values a chunk */
    for (int t = t0, e; t <= p; t = e) {
        e = run_end(a, t, p + 1);
        e = e - t > most ? t + most : e;
        const void* v = cached(a, b, 1, j, t);
        if (a->half)
            weighted_sum_f16(scores + (t - t0), (size_t)L, n, v, e - t, hd, o, wide, ahead);
        else
            weighted_sum_f32(scores + (t - t0), (size_t)L, n, v, e - t, hd, o, NULL, ahead);
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
    const size_t need = (size_t)G * a->hd + (size_t)G * a->max_pages * a->P +
                        (a->half ? (size_t)a->P * a->hd : 0); /* attend_task's */
    float* scratch_att = exo_scratch(SCRATCH_ATTEND, need * sizeof(float));
    if (scratch_att == NULL) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const long total = a->work_units;
    const int first = task_at(a, total * part / parts), end = task_at(a, total * (part + 1) / parts);
    Ahead ahead;
    ahead_start(a, &ahead, first / per, first < end ? (end - 1) / per : first / per - 1);
    ahead_to(&ahead, ATT_AHEAD);
    for (int t = first; t < end;) { /* this run's tasks of one pair in one call */
        const int pair = t / per, g0 = per == 1 ? 0 : t % per;
        const int stop = per == 1 ? t + 1 : (pair + 1) * per < end ? (pair + 1) * per : end;
        attend_task(a, pair / a->KV, pair % a->KV, g0, per == 1 ? G : g0 + (stop - t), &ahead,
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

int exo_attend_step(const AttendStep* s, const float* qkv, int H, int KV, int hd,
                    const float* qk_norm, float eps, long layer_off, const float* sinks, float* out) {
    return exo_attend_decode_kv(qkv, s->B, H, KV, hd, s->rope, qk_norm, eps, s->pages,
                                s->max_pages, s->P, layer_off, s->pos, sinks, s->window, s->half,
                                out);
}
