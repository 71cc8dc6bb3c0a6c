/* A small thread pool: the calling thread is part 0, workers wait between jobs.
 *
 * Waiting: a decode step dispatches ~150 small jobs back to back, so waking a sleeping thread
 * each time (tens to hundreds of microseconds) would eat the gain of a second thread; worse,
 * a dispatcher that sleeps wakes late, by then its workers have gone to sleep too, and every
 * job pays two wake-ups (measured: 4x slower at 2 threads than at 1). So a worker done with a
 * job spins (pause instructions, watching an atomic counter) for spin_idle_ns before it sleeps
 * on a condition variable: no spinning when idle; and a dispatcher waiting for workers that
 * are running its job spins up to spin_wait_ns before it sleeps. Spinning pays only where the
 * threads have their cores (a node's runners share its cores without oversubscription:
 * worker/thread_share.py); yielding in the spin was measured slower on a loaded machine.
 *
 * Invariants:
 *   - a job's fn, ctx and parts are written before its generation is published (release
 *     store; workers load it with acquire), and are not written again before every worker
 *     has finished it (pending == 0), so a worker that saw the generation reads them safely;
 *   - a worker starts at the generation current when it was created (start_gen, under mu), so
 *     it never runs a job dispatched before it existed and always runs one dispatched after;
 *   - `pending` counts the workers that have not yet finished the current job: a dispatch
 *     waits for all of them, so ctx (on the caller's stack) outlives every use;
 *   - sleepers check the counters under mu, and whoever changes one signals under mu: no
 *     wake-up is lost;
 *   - `dispatch` serialises jobs and thread-count changes: exo_set_threads never changes the
 *     pool under a running job, and concurrent callers take turns.
 */
#include <pthread.h>
#include <time.h>

#include "exo_kernels.h"

/* a worker waiting for the next job spins this long, then sleeps; a dispatcher waiting for
 * its workers (running its job) spins up to spin_wait_ns. exo_set_spin changes them. */
static long spin_idle_ns = 50000L, spin_wait_ns = 100000L;

/* Spin limits in nanoseconds (0: sleep at once, the pool's behaviour before it spun); a
 * negative value keeps the current one. Returns 0. */
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
    int n_active;   /* threads a job may use, the caller included (under mu) */
    long generation; /* atomic: bumped (release) once a job is ready */
    long start_gen[MAX_THREADS];
    long pending;   /* atomic: workers yet to finish the current job */
    task_fn fn;
    void* ctx;
    int parts;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 1, 0, {0}, 0, NULL, NULL, 0};

static inline long load_generation(void) { return __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE); }

static void* pool_worker(void* arg) {
    const int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.mu);
    long seen = pool.start_gen[id];
    pthread_mutex_unlock(&pool.mu);
    for (;;) {
        if (spin_while_equal(&pool.generation, seen, __atomic_load_n(&spin_idle_ns, __ATOMIC_RELAXED)) == seen) {
            pthread_mutex_lock(&pool.mu);
            while (load_generation() == seen) pthread_cond_wait(&pool.wake, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = load_generation();
        const task_fn fn = pool.fn;
        void* ctx = pool.ctx;
        const int parts = pool.parts;
        if (id < parts) fn(ctx, id, parts);
        if (__atomic_sub_fetch(&pool.pending, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
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
    pool.pending = 0;
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
        pool.start_gen[id] = pool.generation;
        if (pthread_create(&t, NULL, pool_worker, (void*)(intptr_t)id) != 0) break;
        pthread_detach(t);
        pool.n_workers++;
    }
    pool.n_active = n < pool.n_workers + 1 ? n : pool.n_workers + 1;
    const int active = pool.n_active;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.dispatch);
    return active;
}

int exo_get_threads(void) {
    pthread_mutex_lock(&pool.mu);
    const int n = pool.n_active;
    pthread_mutex_unlock(&pool.mu);
    return n;
}

void exo_run_parallel(task_fn fn, void* ctx, int parts) {
    if (parts <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.dispatch);
    pthread_mutex_lock(&pool.mu);
    if (parts > pool.n_active) parts = pool.n_active;
    if (parts <= 1) {
        pthread_mutex_unlock(&pool.mu);
        pthread_mutex_unlock(&pool.dispatch);
        fn(ctx, 0, 1);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.parts = parts;
    __atomic_store_n(&pool.pending, (long)pool.n_workers, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.generation, pool.generation + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    fn(ctx, 0, parts);
    long left = __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE);
    while (left > 0) {
        const long now = spin_while_equal(&pool.pending, left, __atomic_load_n(&spin_wait_ns, __ATOMIC_RELAXED));
        if (now == left) break; /* none finished for spin_wait_ns (descheduled?): sleep */
        left = now;
    }
    if (__atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE) > 0) {
        pthread_mutex_lock(&pool.mu);
        while (__atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE) > 0)
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
