/* Runtime ISA dispatch, persistent pthread pool and the exported C API.
 *
 * Why pthreads and not OpenMP: torch ships its own libgomp; a second OpenMP runtime in the same process
 * oversubscribes the cores and its spin-waiting threads steal time from torch's. */
#define _GNU_SOURCE
#include <fenv.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ga_internal.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)
#endif
#endif

#define GA_MAX_THREADS 1024
#define GA_ALIGN_ELEMS 16 /* 64-byte cache line of fp32 */

static const char *const isa_names[GA_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon", "sve"};
static const ga_kernels *kernel_table[GA_ISA_COUNT];
static unsigned g_compiled, g_supported;
static int g_isa = GA_ISA_SCALAR;
static int g_default_threads = 1;
static int64_t g_min_chunk = 32768; /* elements per thread: below this, waking a thread costs more */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------------------------------------------ */
/* thread pool                                                                                        */

typedef void (*task_fn)(void *ctx, int tid, int nth);

typedef struct {
    int id;
    uint64_t gen;
} worker_arg;

static struct {
    pthread_mutex_t call_lock; /* one job at a time; concurrent API calls queue here */
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    int nworkers; /* threads with ids 1..nworkers; the caller is id 0 */
    uint64_t gen;
    int pending, nth;
    task_fn fn;
    void *ctx;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
       PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL};

/* Every participant runs in the default IEEE environment (round to nearest, no FTZ/DAZ) whatever the
 * caller set (e.g. torch.set_flush_denormal), so results cannot depend on which thread ran a chunk. */
static void run_ieee(task_fn fn, void *ctx, int tid, int nth) {
    fenv_t saved;
    fegetenv(&saved);
    fesetenv(FE_DFL_ENV);
    fn(ctx, tid, nth);
    fesetenv(&saved);
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    uint64_t seen = wa.gen;
    free(arg);
    pthread_mutex_lock(&P.mu);
    for (;;) {
        while (P.gen == seen) pthread_cond_wait(&P.start_cv, &P.mu);
        seen = P.gen;
        if (wa.id < P.nth) {
            task_fn fn = P.fn;
            void *ctx = P.ctx;
            int nth = P.nth;
            pthread_mutex_unlock(&P.mu);
            run_ieee(fn, ctx, wa.id, nth);
            pthread_mutex_lock(&P.mu);
            if (--P.pending == 0) pthread_cond_signal(&P.done_cv);
        }
    }
    return NULL;
}

/* Called with call_lock held and no job in flight, so P.gen is stable. Returns the worker count. */
static int ensure_workers(int want) {
    sigset_t all, old;
    if (want > GA_MAX_THREADS - 1) want = GA_MAX_THREADS - 1;
    sigfillset(&all);
    /* Workers block all signals so that SIGINT and friends keep going to Python's main thread. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (P.nworkers < want) {
        pthread_t t;
        pthread_attr_t attr;
        worker_arg *wa = (worker_arg *)malloc(sizeof(worker_arg));
        if (!wa) break;
        wa->id = P.nworkers + 1;
        wa->gen = P.gen;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, worker_main, wa) != 0) {
            pthread_attr_destroy(&attr);
            free(wa);
            break;
        }
        pthread_attr_destroy(&attr);
        P.nworkers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return P.nworkers;
}

static void run_job(task_fn fn, void *ctx, int nth) {
    if (nth <= 1) {
        run_ieee(fn, ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&P.call_lock);
    {
        int have = ensure_workers(nth - 1);
        if (nth > have + 1) nth = have + 1; /* thread creation failed: fewer threads, same results */
    }
    pthread_mutex_lock(&P.mu);
    P.fn = fn;
    P.ctx = ctx;
    P.nth = nth;
    P.pending = nth - 1;
    P.gen++;
    pthread_cond_broadcast(&P.start_cv);
    pthread_mutex_unlock(&P.mu);
    run_ieee(fn, ctx, 0, nth);
    pthread_mutex_lock(&P.mu);
    while (P.pending > 0) pthread_cond_wait(&P.done_cv, &P.mu);
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&P.call_lock);
}

/* After fork() only the forking thread exists in the child: forget the workers (they are respawned on
 * demand) and re-initialise the locks, which may have been held by threads that no longer exist. */
static void atfork_child(void) {
    pthread_mutex_init(&P.call_lock, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.start_cv, NULL);
    pthread_cond_init(&P.done_cv, NULL);
    P.nworkers = 0;
    P.pending = 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* dispatch                                                                                           */

int ga_isa_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < GA_ISA_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) return i;
    return -1;
}

static void detect(void) {
    const char *env;
    kernel_table[GA_ISA_SCALAR] = &ga_kernels_scalar;
    g_compiled = 1u << GA_ISA_SCALAR;
    g_supported = 1u << GA_ISA_SCALAR;
#if defined(GA_HAVE_AVX2) || defined(GA_HAVE_AVX512)
    __builtin_cpu_init();
#endif
#if defined(GA_HAVE_AVX2)
    kernel_table[GA_ISA_AVX2] = &ga_kernels_avx2;
    g_compiled |= 1u << GA_ISA_AVX2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        g_supported |= 1u << GA_ISA_AVX2;
#endif
#if defined(GA_HAVE_AVX512)
    kernel_table[GA_ISA_AVX512] = &ga_kernels_avx512;
    g_compiled |= 1u << GA_ISA_AVX512;
    /* libgcc's cpu model also checks XCR0, i.e. that the OS saves the zmm/opmask state. */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c"))
        g_supported |= 1u << GA_ISA_AVX512;
#endif
#if defined(GA_HAVE_NEON)
    kernel_table[GA_ISA_NEON] = &ga_kernels_neon;
    g_compiled |= 1u << GA_ISA_NEON;
    if (getauxval(AT_HWCAP) & HWCAP_ASIMD) g_supported |= 1u << GA_ISA_NEON;
#endif
#if defined(GA_HAVE_SVE)
    kernel_table[GA_ISA_SVE] = &ga_kernels_sve;
    g_compiled |= 1u << GA_ISA_SVE;
    if ((getauxval(AT_HWCAP) & HWCAP_SVE) && (getauxval(AT_HWCAP) & HWCAP_ASIMD))
        g_supported |= 1u << GA_ISA_SVE;
#endif
    {
        /* Preference order: the widest path this CPU runs. */
        static const int pref[] = {GA_ISA_AVX512, GA_ISA_SVE, GA_ISA_AVX2, GA_ISA_NEON, GA_ISA_SCALAR};
        for (size_t k = 0; k < sizeof(pref) / sizeof(pref[0]); k++)
            if (g_supported & (1u << pref[k])) {
                g_isa = pref[k];
                break;
            }
    }
    env = getenv("GRACE_ADAM_ISA");
    if (env && *env) {
        int want = ga_isa_from_name(env);
        /* An unsupported request keeps the default here; the Python loader turns it into an error. */
        if (want >= 0 && (g_supported & (1u << want))) g_isa = want;
    }
    {
        cpu_set_t set;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        if (sched_getaffinity(0, sizeof(set), &set) == 0) ncpu = CPU_COUNT(&set);
        g_default_threads = ncpu > 0 ? (int)ncpu : 1;
        env = getenv("GRACE_ADAM_NUM_THREADS");
        if (env && atoi(env) > 0) g_default_threads = atoi(env);
        if (g_default_threads > GA_MAX_THREADS) g_default_threads = GA_MAX_THREADS;
    }
    pthread_atfork(NULL, NULL, atfork_child);
}

static void init(void) { pthread_once(&g_once, detect); }

int ga_abi_version(void) { return GA_ABI_VERSION; }

size_t ga_sizeof_adam_args(void) { return sizeof(ga_adam_args); }

const char *ga_status_name(int status) {
    switch (status) {
    case GA_OK: return "GA_OK (success)";
    case GA_EINVAL: return "GA_EINVAL (invalid argument)";
    case GA_EUNSUPPORTED: return "GA_EUNSUPPORTED (ISA not compiled in or not supported by this CPU)";
    case GA_ENOMEM: return "GA_ENOMEM (out of memory)";
    case GA_ETHREAD: return "GA_ETHREAD (thread pool error)";
    default: return "unknown status";
    }
}

int ga_set_isa(int isa) {
    init();
    if (isa < 0 || isa >= GA_ISA_COUNT || !(g_supported & (1u << isa))) return GA_EUNSUPPORTED;
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
    return GA_OK;
}

int ga_get_isa(void) {
    init();
    return __atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
}

unsigned ga_supported_isas(void) {
    init();
    return g_supported;
}

unsigned ga_compiled_isas(void) {
    init();
    return g_compiled;
}

const char *ga_isa_name(int isa) { return (isa >= 0 && isa < GA_ISA_COUNT) ? isa_names[isa] : "unknown"; }

int ga_set_num_threads(int n) {
    init();
    if (n < 1 || n > GA_MAX_THREADS) return GA_EINVAL;
    __atomic_store_n(&g_default_threads, n, __ATOMIC_RELEASE);
    return GA_OK;
}

int ga_get_num_threads(void) {
    init();
    return __atomic_load_n(&g_default_threads, __ATOMIC_ACQUIRE);
}

int ga_set_min_chunk(int64_t n) {
    if (n < 1) return GA_EINVAL;
    __atomic_store_n(&g_min_chunk, n, __ATOMIC_RELEASE);
    return GA_OK;
}

static int threads_for(int64_t units, int64_t min_units, int nthreads) {
    int64_t cap;
    if (nthreads <= 0) nthreads = ga_get_num_threads();
    if (nthreads > GA_MAX_THREADS) nthreads = GA_MAX_THREADS;
    cap = units / (min_units > 0 ? min_units : 1);
    if (cap < 1) cap = 1;
    return (int)(nthreads < cap ? nthreads : cap);
}

/* Split point k of nth over n elements, moved up to an element whose address in `base` is 64-byte
 * aligned so two threads never write the same cache line of the written streams. */
static int64_t split_point(int64_t n, int nth, int k, int64_t a0) {
    int64_t x, r;
    if (k <= 0) return 0;
    if (k >= nth) return n;
    x = (n / nth) * k + ((n % nth) * k) / nth;
    r = ((x - a0) % GA_ALIGN_ELEMS + GA_ALIGN_ELEMS) % GA_ALIGN_ELEMS;
    if (r) x += GA_ALIGN_ELEMS - r;
    return x < n ? x : n;
}

static int64_t align_offset(const void *base) {
    uintptr_t u = (uintptr_t)base;
    if (u % 4) return 0;
    return (int64_t)((GA_ALIGN_ELEMS - (u / 4) % GA_ALIGN_ELEMS) % GA_ALIGN_ELEMS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Adam                                                                                               */

typedef struct {
    const ga_adam_args *a;
    ga_adam_fn fn;
    int64_t a0;
    /* step + statistics: blocks of GA_STATS_BLOCK elements instead of 64-byte-aligned ranges */
    ga_stats_fn stats;
    int64_t nblocks;
    double *sums;
} adam_ctx;

static void adam_task(void *p, int tid, int nth) {
    adam_ctx *c = (adam_ctx *)p;
    int64_t b = split_point(c->a->n, nth, tid, c->a0), e = split_point(c->a->n, nth, tid + 1, c->a0);
    if (e > b) c->fn(c->a, b, e);
}

/* Each block is reduced, then stepped while its gradient is still in L1/L2: one trip to DRAM. */
static void adam_stats_task(void *p, int tid, int nth) {
    adam_ctx *c = (adam_ctx *)p;
    const ga_adam_args *a = c->a;
    int64_t b0 = c->nblocks * tid / nth, b1 = c->nblocks * (tid + 1) / nth;
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * GA_STATS_BLOCK, e = s + GA_STATS_BLOCK < a->n ? s + GA_STATS_BLOCK : a->n;
        c->stats(a->grad, a->grad_dtype, a->grad_scale, a->n, b, b + 1, c->sums);
        c->fn(a, s, e);
    }
}

static int valid_dtype(int32_t dt) { return dt == GA_F32 || dt == GA_BF16 || dt == GA_F16; }

/* Checks the arguments and fills `out` with the form the ISA kernels read: the state destinations
 * exp_avg_out / exp_avg_sq_out / max_exp_avg_sq_out are the inputs themselves when committing, so the
 * kernels never look at `commit` except for the param store. */
static int prepare(const ga_adam_args *a, ga_adam_args *out) {
    if (!a || a->n < 0 || !valid_dtype(a->grad_dtype)) return GA_EINVAL;
    if (a->lowp_dtype != GA_NONE && (a->lowp_dtype != GA_BF16 && a->lowp_dtype != GA_F16)) return GA_EINVAL;
    if (a->lowp_dtype != GA_NONE && !a->lowp_out) return GA_EINVAL;
    if (!a->commit && !a->param_out && a->lowp_dtype == GA_NONE) return GA_EINVAL;
    if (a->commit && (a->exp_avg_out || a->exp_avg_sq_out || a->max_exp_avg_sq_out)) return GA_EINVAL;
    if (!a->commit && (a->exp_avg_out || a->exp_avg_sq_out || a->max_exp_avg_sq_out)) {
        /* out-of-place: the whole new state, or nothing */
        if (!a->exp_avg_out || !a->exp_avg_sq_out || !a->param_out) return GA_EINVAL;
        if ((a->max_exp_avg_sq != NULL) != (a->max_exp_avg_sq_out != NULL)) return GA_EINVAL;
    }
    if (a->n > 0 && (!a->param || !a->grad || !a->exp_avg || !a->exp_avg_sq)) return GA_EINVAL;
    *out = *a;
    if (a->commit) {
        out->exp_avg_out = a->exp_avg;
        out->exp_avg_sq_out = a->exp_avg_sq;
        out->max_exp_avg_sq_out = a->max_exp_avg_sq;
    }
    return GA_OK;
}

int ga_adam_step(const ga_adam_args *a, int nthreads) {
    adam_ctx c;
    ga_adam_args A;
    int rc = prepare(a, &A);
    if (rc != GA_OK || A.n == 0) return rc;
    init();
    c.a = &A;
    c.fn = kernel_table[ga_get_isa()]->adam;
    c.a0 = align_offset(A.param);
    run_job(adam_task, &c, threads_for(A.n, __atomic_load_n(&g_min_chunk, __ATOMIC_ACQUIRE), nthreads));
    return GA_OK;
}

static double sum_blocks(const double *sums, int64_t nblocks);

int ga_adam_step_stats(const ga_adam_args *a, int nthreads, double *norm2, int32_t *all_finite) {
    adam_ctx c;
    ga_adam_args A;
    double stack_sums[64], total;
    int64_t min_blocks;
    int rc = prepare(a, &A);
    if (rc != GA_OK) return rc;
    if (!norm2 || !all_finite) return GA_EINVAL;
    if (A.n == 0) {
        *norm2 = 0.0;
        *all_finite = 1;
        return GA_OK;
    }
    init();
    c.a = &A;
    c.fn = kernel_table[ga_get_isa()]->adam;
    c.stats = kernel_table[ga_get_isa()]->stats;
    c.nblocks = (A.n + GA_STATS_BLOCK - 1) / GA_STATS_BLOCK;
    c.sums = c.nblocks <= 64 ? stack_sums : (double *)malloc((size_t)c.nblocks * sizeof(double));
    if (!c.sums) return GA_ENOMEM;
    min_blocks = __atomic_load_n(&g_min_chunk, __ATOMIC_ACQUIRE) / GA_STATS_BLOCK;
    run_job(adam_stats_task, &c, threads_for(c.nblocks, min_blocks, nthreads));
    total = sum_blocks(c.sums, c.nblocks);
    if (c.sums != stack_sums) free(c.sums);
    *norm2 = total;
    *all_finite = (total - total) == 0.0;
    return GA_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* gradient statistics                                                                                */

typedef struct {
    const void *grad;
    int32_t dt;
    float gs;
    int64_t n, nblocks;
    double *sums;
    ga_stats_fn fn;
} stats_ctx;

static void stats_task(void *p, int tid, int nth) {
    stats_ctx *c = (stats_ctx *)p;
    int64_t b0 = c->nblocks * tid / nth, b1 = c->nblocks * (tid + 1) / nth;
    if (b1 > b0) c->fn(c->grad, c->dt, c->gs, c->n, b0, b1, c->sums);
}

/* Block sums are added in block order: the result does not depend on the thread count. Finite squares
 * of floats cannot overflow fp64, so a finite total means every element was finite. */
static double sum_blocks(const double *sums, int64_t nblocks) {
    double total = 0.0;
    for (int64_t b = 0; b < nblocks; b++) total += sums[b];
    return total;
}

int ga_grad_stats(const void *grad, int32_t dtype, int64_t n, float grad_scale, int nthreads, double *norm2,
                  int32_t *all_finite) {
    stats_ctx c;
    double stack_sums[64], total;
    int64_t min_blocks;
    if (!norm2 || !all_finite || n < 0 || !valid_dtype(dtype)) return GA_EINVAL;
    if (n == 0) {
        *norm2 = 0.0;
        *all_finite = 1;
        return GA_OK;
    }
    if (!grad) return GA_EINVAL;
    init();
    c.grad = grad;
    c.dt = dtype;
    c.gs = grad_scale;
    c.n = n;
    c.nblocks = (n + GA_STATS_BLOCK - 1) / GA_STATS_BLOCK;
    c.sums = c.nblocks <= 64 ? stack_sums : (double *)malloc((size_t)c.nblocks * sizeof(double));
    if (!c.sums) return GA_ENOMEM;
    c.fn = kernel_table[ga_get_isa()]->stats;
    min_blocks = __atomic_load_n(&g_min_chunk, __ATOMIC_ACQUIRE) / GA_STATS_BLOCK;
    run_job(stats_task, &c, threads_for(c.nblocks, min_blocks, nthreads));
    total = sum_blocks(c.sums, c.nblocks);
    if (c.sums != stack_sums) free(c.sums);
    *norm2 = total;
    *all_finite = (total - total) == 0.0;
    return GA_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* roofline probe                                                                                     */

typedef struct {
    float *a, *c, *d;
    const float *b;
    int64_t n, a0;
    ga_stream7_fn fn;
} stream_ctx;

static void stream_task(void *p, int tid, int nth) {
    stream_ctx *s = (stream_ctx *)p;
    int64_t b = split_point(s->n, nth, tid, s->a0), e = split_point(s->n, nth, tid + 1, s->a0);
    if (e > b) s->fn(s->a, s->b, s->c, s->d, b, e);
}

int ga_stream7(float *a, const float *b, float *c, float *d, int64_t n, int nthreads) {
    stream_ctx s;
    if (n < 0 || (n > 0 && (!a || !b || !c || !d))) return GA_EINVAL;
    if (n == 0) return GA_OK;
    init();
    s.a = a;
    s.b = b;
    s.c = c;
    s.d = d;
    s.n = n;
    s.a0 = align_offset(a);
    s.fn = kernel_table[ga_get_isa()]->stream7;
    run_job(stream_task, &s, threads_for(n, __atomic_load_n(&g_min_chunk, __ATOMIC_ACQUIRE), nthreads));
    return GA_OK;
}
