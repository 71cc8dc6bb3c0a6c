/* A small thread pool: the calling thread is part 0, workers block on a condition variable
 * between jobs (no spinning when idle).
 *
 * Invariants (all under pool.mu):
 *   - a worker starts at the generation current when it was created (start_gen), so it never
 *     runs a job that was dispatched before it existed, and always runs one dispatched after;
 *   - `pending` counts the workers that have not yet finished the current job: a dispatch
 *     waits for all of them, so ctx (on the caller's stack) outlives every use;
 *   - `dispatch` serialises jobs and thread-count changes: exo_set_threads never changes the
 *     pool under a running job, and concurrent callers take turns.
 */
#include <pthread.h>

#include "exo_kernels.h"

static struct {
    pthread_mutex_t mu, dispatch;
    pthread_cond_t wake, done;
    int n_workers;  /* started worker threads */
    int n_active;   /* threads a job may use, the caller included (exo_set_threads) */
    long generation;
    long start_gen[MAX_THREADS];
    int pending;
    task_fn fn;
    void* ctx;
    int parts;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 1, 0, {0}, 0, NULL, NULL, 0};

static void* pool_worker(void* arg) {
    const int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.mu);
    long seen = pool.start_gen[id];
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.generation;
        const task_fn fn = pool.fn;
        void* ctx = pool.ctx;
        const int parts = pool.parts;
        pthread_mutex_unlock(&pool.mu);
        if (id < parts) fn(ctx, id, parts);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
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
    pool.pending = pool.n_workers;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    fn(ctx, 0, parts);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
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
