/* A small thread pool: the calling thread takes part in every job, workers wait between jobs.
 *
 * Parts are claimed, not assigned: a job's parts are taken one at a time (an atomic claim on a
 * word holding the job's generation, its number of parts and the next part), by the caller and
 * by whichever workers are awake. A worker that is asleep or descheduled (a shared machine)
 * holds nothing back: the caller runs the parts nobody has claimed, and waits only for parts
 * that others are running. Jobs are split into a few parts per thread so that the threads
 * that run share the work.
 *
 * Waiting: a decode step dispatches ~150 small jobs back to back, so waking a sleeping thread
 * each time (tens to hundreds of microseconds) would eat the gain of a second thread. So a
 * worker done with a job spins (pause instructions, watching the generation) for spin_idle_ns
 * before it sleeps on a condition variable: no spinning when idle; and a caller waiting for
 * parts others are running spins up to spin_wait_ns (while they make progress) before it
 * sleeps. Spinning pays only where the threads have their cores (a node's runners share its
 * cores without oversubscription: worker/thread_share.py).
 *
 * Invariants:
 *   - a job's fn and ctx are written before its claim word and generation are published
 *     (release stores; readers acquire), and are not written again before every part has
 *     finished (finished == parts), so whoever claimed a part reads them safely;
 *   - a part is run only by whoever claimed it (a successful compare-and-swap on the claim
 *     word of the current generation): each part runs exactly once; a claim word of another
 *     generation is never taken (generations only grow: no ABA);
 *   - the caller returns only once finished == parts, so ctx (on its stack) outlives every use,
 *     and no worker touches the job after it has finished its claimed part;
 *   - sleepers check the counters under mu, and whoever changes one signals under mu: no
 *     wake-up is lost;
 *   - `dispatch` serialises jobs and thread-count changes: exo_set_threads never changes the
 *     pool under a running job, and concurrent callers take turns.
 */
#include <pthread.h>
#include <time.h>

#include "exo_kernels.h"

#define PARTS_PER_THREAD 4
/* claim word: generation << 24 | parts << 12 | next part (parts <= MAX_THREADS * 4 < 4096) */
#define CLAIM_GEN(c) ((c) >> 24)
#define CLAIM_PARTS(c) ((int)(((c) >> 12) & 0xFFF))
#define CLAIM_NEXT(c) ((int)((c) & 0xFFF))

/* a worker waiting for the next job spins this long, then sleeps; a caller waiting for parts
 * others run spins up to spin_wait_ns without progress. exo_set_spin changes them. */
static long spin_idle_ns = 50000L, spin_wait_ns = 100000L;

/* Spin limits in nanoseconds (0: sleep at once); a negative value keeps the current one.
 * Returns 0. */
int exo_set_spin(long idle_ns, long wait_ns) {
    if (idle_ns >= 0) __atomic_store_n(&spin_idle_ns, idle_ns, __ATOMIC_RELAXED);
    if (wait_ns >= 0) __atomic_store_n(&spin_wait_ns, wait_ns, __ATOMIC_RELAXED);
    return 0;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Spin while *counter == value, for at most limit_ns (time checked every 64 pauses); returns
 * the last value seen. */
static long spin_while_equal(const long* counter, long value, long limit_ns) {
    if (limit_ns <= 0) return __atomic_load_n(counter, __ATOMIC_ACQUIRE);
    long deadline = 0;
    for (int round = 0;; round++) {
        for (int i = 0; i < 64; i++) {
            const long v = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
            if (v != value) return v;
            cpu_relax();
        }
        if (round == 0) deadline = now_ns() + limit_ns;
        else if (now_ns() > deadline) return value;
    }
}

static struct {
    pthread_mutex_t mu, dispatch;
    pthread_cond_t wake, done;
    int n_workers;  /* started worker threads (under mu) */
    int n_active;   /* threads a job may use, the caller included (written under mu, read atomically) */
    long generation; /* atomic: bumped (release) once a job is ready */
    long claim;      /* atomic: the current job's claim word */
    long finished;   /* atomic: parts of the current job finished */
    task_fn fn;
    void* ctx;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 1, 0, 0, 0, NULL, NULL};

static inline long load_generation(void) { return __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE); }

/* Claim and run parts of job `gen` until none is left; returns how many this thread ran. The
 * thread that finishes the job's last part wakes a caller sleeping on it. */
static int run_parts(long gen) {
    int ran = 0;
    long c = __atomic_load_n(&pool.claim, __ATOMIC_ACQUIRE);
    while (CLAIM_GEN(c) == gen && CLAIM_NEXT(c) < CLAIM_PARTS(c)) {
        if (!__atomic_compare_exchange_n(&pool.claim, &c, c + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue; /* c now holds the current word: try again */
        const int parts = CLAIM_PARTS(c);
        pool.fn(pool.ctx, CLAIM_NEXT(c), parts);
        ran++;
        if (__atomic_add_fetch(&pool.finished, 1, __ATOMIC_ACQ_REL) == parts) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_broadcast(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
        c = __atomic_load_n(&pool.claim, __ATOMIC_ACQUIRE);
    }
    return ran;
}

static void* pool_worker(void* arg) {
    const int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.mu);
    long seen = pool.generation;
    pthread_mutex_unlock(&pool.mu);
    for (;;) {
        if (spin_while_equal(&pool.generation, seen, __atomic_load_n(&spin_idle_ns, __ATOMIC_RELAXED)) == seen) {
            pthread_mutex_lock(&pool.mu);
            while (load_generation() == seen) pthread_cond_wait(&pool.wake, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = load_generation();
        if (id < __atomic_load_n(&pool.n_active, __ATOMIC_RELAXED)) run_parts(seen);
    }
    return NULL;
}

/* A forked child has no workers: start over with the calling thread alone. */
static void pool_after_fork_in_child(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_mutex_init(&pool.dispatch, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = 0;
    pool.n_active = 1;
}

static pthread_once_t fork_handler_once = PTHREAD_ONCE_INIT;
static void register_fork_handler(void) { pthread_atfork(NULL, NULL, pool_after_fork_in_child); }

/* Use n threads (the caller plus n - 1 workers, started once, kept). Returns the number in use. */
int exo_set_threads(int n) {
    pthread_once(&fork_handler_once, register_fork_handler);
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_mutex_lock(&pool.dispatch); /* no job runs while the pool changes */
    pthread_mutex_lock(&pool.mu);
    while (pool.n_workers < n - 1) {
        const int id = pool.n_workers + 1;
        pthread_t t;
        if (pthread_create(&t, NULL, pool_worker, (void*)(intptr_t)id) != 0) break;
        pthread_detach(t);
        pool.n_workers++;
    }
    const int active = n < pool.n_workers + 1 ? n : pool.n_workers + 1;
    __atomic_store_n(&pool.n_active, active, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.dispatch);
    return active;
}

int exo_get_threads(void) {
    return __atomic_load_n(&pool.n_active, __ATOMIC_RELAXED);
}

void exo_run_parallel(task_fn fn, void* ctx, int parts) {
    if (parts <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.dispatch);
    const int active = __atomic_load_n(&pool.n_active, __ATOMIC_RELAXED);
    const int most = active * PARTS_PER_THREAD < MAX_THREADS ? active * PARTS_PER_THREAD : MAX_THREADS;
    if (active <= 1 || parts > most) parts = active <= 1 ? 1 : most;
    if (parts <= 1) {
        pthread_mutex_unlock(&pool.dispatch);
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.ctx = ctx;
    const long gen = pool.generation + 1;
    __atomic_store_n(&pool.finished, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.claim, (gen << 24) | ((long)parts << 12), __ATOMIC_RELEASE);
    __atomic_store_n(&pool.generation, gen, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    run_parts(gen);
    long left = parts - __atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE);
    while (left > 0) { /* parts others claimed: spin while they make progress */
        const long now = parts - spin_while_equal(&pool.finished, parts - left, __atomic_load_n(&spin_wait_ns, __ATOMIC_RELAXED));
        if (now == left) break; /* none finished for spin_wait_ns (descheduled?): sleep */
        left = now;
    }
    if (__atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE) < parts) {
        pthread_mutex_lock(&pool.mu);
        while (__atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE) < parts)
            pthread_cond_wait(&pool.done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    pthread_mutex_unlock(&pool.dispatch);
}

/* ---- per-thread scratch, grown on demand, freed when the thread exits ---- */

#include <stdlib.h>

typedef struct {
    void* buf[EXO_SCRATCH_SLOTS];
    size_t size[EXO_SCRATCH_SLOTS];
} Scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void* p) {
    Scratch* s = (Scratch*)p;
    for (int i = 0; i < EXO_SCRATCH_SLOTS; i++) free(s->buf[i]);
    free(s);
}

static void scratch_key_create(void) { pthread_key_create(&scratch_key, scratch_free); }

void* exo_scratch(int slot, size_t bytes) {
    pthread_once(&scratch_once, scratch_key_create);
    Scratch* s = (Scratch*)pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = (Scratch*)calloc(1, sizeof(Scratch));
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (bytes > s->size[slot]) {
        free(s->buf[slot]);
        s->buf[slot] = malloc(bytes);
        s->size[slot] = s->buf[slot] ? bytes : 0;
    }
    return s->buf[slot];
}
