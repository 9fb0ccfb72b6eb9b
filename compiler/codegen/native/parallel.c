/* Kiln's parallel-for: the one piece of native support code generated kernels call (besides the
 * GEMM, which is generated). A persistent pool of POSIX threads runs the chunks of a loop.
 *
 *   void kiln_parallel_for(void (*task)(void *ctx, int64_t begin, int64_t end), void *ctx,
 *                          int64_t n, int32_t nthreads);
 *   void kiln_parallel_for_chunks(... the same ..., int32_t chunks_per_thread);
 *   void kiln_parallel_wake(int32_t nthreads);   (a forward pass starts: get the threads polling)
 *   void kiln_profile_mark(kiln_profile_rec *rec, int32_t step, int32_t nsteps);
 *       (profiling builds: step done, charged to the pass's record in its arena; -1 when a pass starts)
 *
 * runs task(ctx, b, e) over [0, n) cut into about 4 chunks per thread (or chunks_per_thread: finer
 * chunks even out threads that run at different speeds, at a cost in locality), on the calling thread and up
 * to nthreads - 1 pool threads, and returns when every chunk is done. Each thread first takes the
 * chunks of its own contiguous range (slot k: the k-th T-th of them; the caller is slot 0, pool
 * thread k slot k), then the chunks left in the other ranges. So a loop over the same data runs on
 * the same threads call after call, and each thread finds its part in its own cache (on a machine
 * whose cores do not share one, e.g. two core complexes, moving it costs more than computing it),
 * while a thread the OS deschedules still holds nobody up (its chunks are taken by the others), and
 * the caller never waits for a thread that has not started. Pool threads are started on first use,
 * poll for the next job (first spinning with pause for a few hundred microseconds, so that the
 * next loop of a forward pass starts without a system call's delay: ResNet-18@64 4%, a batch-1 MLP
 * up to 11% faster; then with sched_yield, which gives the core to any other runnable thread), then
 * sleep on a condition variable. A caller that finds the pool busy (another thread's kernel) runs its loop alone: calls
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
#define KILN_POOL_PAUSE 20000 /* pause-spin polls before the sched_yield ones (~25 ns each) */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef void (*kiln_task)(void *ctx, int64_t begin, int64_t end);

/* Profiling builds (build_program(profile=True)) keep one profile record per forward pass, in its
 * arena: no global state, so concurrent callers (each with its own arena) time their own runs. The
 * forward function calls kiln_profile_mark(rec, -1, n) on entry and kiln_profile_mark(rec, i, n) after
 * step i's kernel, and step i is charged the time since the previous mark. A loop that
 * kiln_parallel_for posts from that thread carries the record: each pool thread adds the time it
 * spends in the loop's chunks to its pending slot, which the next mark charges to the step just done
 * (the caller has joined every pool thread of the step's loops by then). n is the program's step
 * count, a constant of the generated code; the runtime zeroes the record before a timed run
 * (Executable.run_timed; its size: codegen/native profile_record_bytes). */
#define KILN_PROFILE_THREADS 16
typedef struct {
    double last;                           /* the previous mark's clock, seconds */
    double pending[KILN_PROFILE_THREADS];  /* pool thread k's chunk seconds since the previous mark */
    double seconds[];                      /* nsteps step times, then nsteps per pool thread 1.. */
} kiln_profile_rec;

/* the next chunk of one thread's range, alone in its cache line (only that thread writes it, until
 * it is done and others take what is left) */
typedef struct {
    _Alignas(64) atomic_llong next;
} kiln_range;

typedef struct {
    kiln_task fn;
    void *ctx;
    int64_t n, chunk, nchunks;
    int32_t nranges;       /* threads the chunks are divided among */
    atomic_int active;     /* pool threads working on this job */
    kiln_profile_rec *rec; /* the poster's profile record (profiling builds), else 0 */
    kiln_range range[KILN_MAX_THREADS]; /* range k: chunks [k * nchunks / nranges, (k + 1) * ...) */
} kiln_job;

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t pool_owner = PTHREAD_MUTEX_INITIALIZER; /* held by the caller using the pool */
static kiln_job *pool_job;                                       /* guarded by pool_mu */
static atomic_llong pool_generation;
static int pool_threads;                                         /* guarded by pool_mu */

static _Thread_local int pool_slot;                 /* 0: a calling thread; k: the k-th pool thread */
static _Thread_local kiln_profile_rec *thread_rec;  /* the record of the pass this thread runs */

static double clock_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int64_t range_end(const kiln_job *j, int k) {
    return (k + 1) * j->nchunks / j->nranges;
}

static void run_chunks(kiln_job *j) {
    kiln_profile_rec *rec = pool_slot > 0 && pool_slot < KILN_PROFILE_THREADS ? j->rec : 0;
    for (int i = 0; i < j->nranges; i++) {  /* its own range first, then the others' in turn */
        int k = (pool_slot + i) % j->nranges;
        int64_t end = range_end(j, k);
        if (atomic_load_explicit(&j->range[k].next, memory_order_relaxed) >= end)
            continue;  /* (a finished range is not written again: its line stays where it is) */
        for (;;) {
            int64_t c = atomic_fetch_add(&j->range[k].next, 1);
            if (c >= end)
                break;
            int64_t b = c * j->chunk, e = b + j->chunk;
            if (rec) {
                double t0 = clock_seconds();
                j->fn(j->ctx, b, e < j->n ? e : j->n);
                rec->pending[pool_slot] += clock_seconds() - t0;
            } else {
                j->fn(j->ctx, b, e < j->n ? e : j->n);
            }
        }
    }
}

static void *pool_worker(void *slot) {
    pool_slot = (int)(intptr_t)slot;
    long long seen = atomic_load(&pool_generation);
    for (;;) {
        for (int i = 0; i < KILN_POOL_PAUSE && atomic_load_explicit(&pool_generation, memory_order_relaxed) == seen; i++)
            cpu_relax();
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

void kiln_parallel_for_chunks(kiln_task fn, void *ctx, int64_t n, int32_t nthreads, int32_t chunks_per_thread) {
    if (n <= 0)
        return;
    if (chunks_per_thread < 1)
        chunks_per_thread = 1;
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
    j.nchunks = (int64_t)nthreads * chunks_per_thread;
    if (j.nchunks > n)
        j.nchunks = n;
    j.chunk = (n + j.nchunks - 1) / j.nchunks;
    j.nchunks = (n + j.chunk - 1) / j.chunk;
    j.nranges = j.nchunks < nthreads ? (int32_t)j.nchunks : nthreads;
    for (int k = 0; k < j.nranges; k++)
        atomic_init(&j.range[k].next, k * j.nchunks / j.nranges);
    atomic_init(&j.active, 0);
    j.rec = thread_rec;

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

void kiln_parallel_for(kiln_task fn, void *ctx, int64_t n, int32_t nthreads) {
    kiln_parallel_for_chunks(fn, ctx, n, nthreads, KILN_CHUNKS_PER_THREAD);
}

void kiln_profile_mark(kiln_profile_rec *r, int32_t step, int32_t nsteps) {
    double now = clock_seconds();
    thread_rec = r;
    if (step >= 0 && step < nsteps) {
        r->seconds[step] += now - r->last;
        for (int t = 1; t < KILN_PROFILE_THREADS; t++)
            r->seconds[(int64_t)t * nsteps + step] += r->pending[t];
    }
    for (int t = 1; t < KILN_PROFILE_THREADS; t++)
        r->pending[t] = 0.0;
    r->last = now;
}
