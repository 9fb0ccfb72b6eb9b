/* Kiln's parallel-for: the one piece of native support code generated kernels call (besides the
 * GEMM, which is generated). A persistent pool of POSIX threads runs the chunks of a loop.
 *
 *   void kiln_parallel_for(void (*task)(void *ctx, int64_t begin, int64_t end), void *ctx,
 *                          int64_t n, int32_t nthreads);
 *   void kiln_parallel_wake(int32_t nthreads);   (a forward pass starts: get the threads polling)
 *   void kiln_profile_mark(int32_t step);        (profiling builds: step done; -1 when a pass starts)
 *   double kiln_profile_seconds(int32_t step);   (seconds spent in step since the last reset)
 *   double kiln_profile_thread_seconds(int32_t thread, int32_t step);
 *                                                (seconds pool thread `thread` (1..) ran chunks of step)
 *   int32_t kiln_profile_threads(void);          (pool threads started)
 *   void kiln_profile_reset(void);
 *
 * runs task(ctx, b, e) over [0, n) cut into about 4 chunks per thread, on the calling thread and up
 * to nthreads - 1 pool threads, and returns when every chunk is done. Chunks are taken from an
 * atomic counter, so a thread the OS deschedules holds nobody up, and the caller never waits for a
 * thread that has not started. Pool threads are started on first use, poll briefly (sched_yield,
 * which gives the core to any other runnable thread) for the next job, then sleep on a condition
 * variable. A caller that finds the pool busy (another thread's kernel) runs its loop alone: calls
 * from several threads are safe and never oversubscribe the machine. Tasks must not call
 * kiln_parallel_for themselves (generated code passes nthreads = 1 inside a task).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define KILN_MAX_THREADS 64
#define KILN_CHUNKS_PER_THREAD 4
#define KILN_POOL_SPIN 2000

typedef void (*kiln_task)(void *ctx, int64_t begin, int64_t end);

typedef struct {
    kiln_task fn;
    void *ctx;
    int64_t n, chunk, nchunks;
    atomic_llong next;   /* the next chunk to take */
    atomic_int active;   /* pool threads working on this job */
} kiln_job;

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t pool_owner = PTHREAD_MUTEX_INITIALIZER; /* held by the caller using the pool */
static kiln_job *pool_job;                                       /* guarded by pool_mu */
static atomic_llong pool_generation;
static int pool_threads;                                         /* guarded by pool_mu */

/* Profiling builds (profile_on, set by the first kiln_profile_mark): each pool thread adds the time
 * it spends in chunks to its pending_busy slot, which kiln_profile_mark charges to the step just done
 * (the caller has joined every pool thread of the step's loops by then). */
#define KILN_PROFILE_THREADS 16
static _Thread_local int pool_slot;                 /* 0: a calling thread; k: the k-th pool thread */
static int profile_on;
static double pending_busy[KILN_PROFILE_THREADS];

static double seconds_since(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + 1e-9 * (double)(now.tv_nsec - t0->tv_nsec);
}

static void run_chunks(kiln_job *j) {
    int timed = profile_on && pool_slot > 0 && pool_slot < KILN_PROFILE_THREADS;
    for (;;) {
        int64_t c = atomic_fetch_add(&j->next, 1);
        if (c >= j->nchunks)
            return;
        int64_t b = c * j->chunk, e = b + j->chunk;
        if (timed) {
            struct timespec t0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            j->fn(j->ctx, b, e < j->n ? e : j->n);
            pending_busy[pool_slot] += seconds_since(&t0);
        } else {
            j->fn(j->ctx, b, e < j->n ? e : j->n);
        }
    }
}

static void *pool_worker(void *slot) {
    pool_slot = (int)(intptr_t)slot;
    long long seen = atomic_load(&pool_generation);
    for (;;) {
        for (int i = 0; i < KILN_POOL_SPIN && atomic_load(&pool_generation) == seen; i++)
            sched_yield();
        pthread_mutex_lock(&pool_mu);
        while (atomic_load(&pool_generation) == seen)
            pthread_cond_wait(&pool_wake, &pool_mu);
        seen = atomic_load(&pool_generation);
        kiln_job *j = pool_job;
        if (j)
            atomic_fetch_add(&j->active, 1);
        pthread_mutex_unlock(&pool_mu);
        if (j) {
            run_chunks(j);
            atomic_fetch_sub(&j->active, 1);
        }
    }
    return 0;
}

static void start_threads(int32_t nthreads) { /* pool_mu held */
    while (pool_threads < nthreads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, pool_worker, (void *)(intptr_t)(pool_threads + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break; /* fewer threads: the caller still does all remaining chunks */
        pool_threads++;
    }
}

/* Wake the pool without a job: called when a forward pass starts, so that threads asleep since the
 * last call are polling again by the time the first parallel loop is posted (a sleeping thread takes
 * tens to hundreds of microseconds to wake on a virtual machine). */
void kiln_parallel_wake(int32_t nthreads) {
    if (nthreads <= 1)
        return;
    if (nthreads > KILN_MAX_THREADS)
        nthreads = KILN_MAX_THREADS;
    pthread_mutex_lock(&pool_mu);
    start_threads(nthreads);
    atomic_fetch_add(&pool_generation, 1);
    pthread_cond_broadcast(&pool_wake);
    pthread_mutex_unlock(&pool_mu);
}

void kiln_parallel_for(kiln_task fn, void *ctx, int64_t n, int32_t nthreads) {
    if (n <= 0)
        return;
    if (nthreads > KILN_MAX_THREADS)
        nthreads = KILN_MAX_THREADS;
    if (nthreads <= 1 || n == 1 || pthread_mutex_trylock(&pool_owner) != 0) {
        fn(ctx, 0, n);
        return;
    }
    kiln_job j;
    j.fn = fn;
    j.ctx = ctx;
    j.n = n;
    j.nchunks = (int64_t)nthreads * KILN_CHUNKS_PER_THREAD;
    if (j.nchunks > n)
        j.nchunks = n;
    j.chunk = (n + j.nchunks - 1) / j.nchunks;
    j.nchunks = (n + j.chunk - 1) / j.chunk;
    atomic_init(&j.next, 0);
    atomic_init(&j.active, 0);

    pthread_mutex_lock(&pool_mu);
    start_threads(nthreads);
    pool_job = &j;
    atomic_fetch_add(&pool_generation, 1);
    pthread_cond_broadcast(&pool_wake);
    pthread_mutex_unlock(&pool_mu);

    run_chunks(&j);

    pthread_mutex_lock(&pool_mu); /* no pool thread can take the job after this */
    pool_job = 0;
    pthread_mutex_unlock(&pool_mu);
    while (atomic_load(&j.active) != 0) /* threads still in run_chunks: their last chunk */
        sched_yield();
    pthread_mutex_unlock(&pool_owner);
}

/* Per-step time of forward passes built with profile=True (build_program): the forward function
 * calls kiln_profile_mark(-1) on entry and kiln_profile_mark(i) after step i's kernel, so step i is
 * charged the time since the previous mark, and each pool thread's chunk time since then. One
 * profiling caller at a time. */
#define KILN_PROFILE_MAX 16384
static struct timespec profile_last;
static double profile_seconds[KILN_PROFILE_MAX];
static double profile_busy[KILN_PROFILE_THREADS][KILN_PROFILE_MAX];
static int32_t profile_steps; /* 1 + the largest step marked since the last reset */

void kiln_profile_mark(int32_t step) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    profile_on = 1;
    if (step >= 0 && step < KILN_PROFILE_MAX) {
        profile_seconds[step] += (double)(now.tv_sec - profile_last.tv_sec) +
                                 1e-9 * (double)(now.tv_nsec - profile_last.tv_nsec);
        for (int t = 1; t < KILN_PROFILE_THREADS; t++)
            profile_busy[t][step] += pending_busy[t];
        if (step >= profile_steps)
            profile_steps = step + 1;
    }
    for (int t = 1; t < KILN_PROFILE_THREADS; t++)
        pending_busy[t] = 0.0;
    profile_last = now;
}

double kiln_profile_seconds(int32_t step) {
    return step >= 0 && step < KILN_PROFILE_MAX ? profile_seconds[step] : 0.0;
}

double kiln_profile_thread_seconds(int32_t thread, int32_t step) {
    if (thread < 1 || thread >= KILN_PROFILE_THREADS || step < 0 || step >= KILN_PROFILE_MAX)
        return 0.0;
    return profile_busy[thread][step];
}

int32_t kiln_profile_threads(void) {
    pthread_mutex_lock(&pool_mu);
    int32_t n = pool_threads < KILN_PROFILE_THREADS - 1 ? pool_threads : KILN_PROFILE_THREADS - 1;
    pthread_mutex_unlock(&pool_mu);
    return n;
}

void kiln_profile_reset(void) {
    for (int i = 0; i < profile_steps; i++) {
        profile_seconds[i] = 0.0;
        for (int t = 1; t < KILN_PROFILE_THREADS; t++)
            profile_busy[t][i] = 0.0;
    }
    profile_steps = 0;
}
