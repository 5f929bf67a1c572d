/* Runtime ISA dispatch, the jobs handed to the thread pool (ga_pool.c) and the exported C API. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
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

#define GA_ALIGN_ELEMS 16 /* 64-byte cache line of fp32: the unit of an elementwise job */
/* Elements a participant claims at a time: large enough that claiming (an atomic add) and the kernel's
 * per-call setup and store fence are noise, small enough to balance a job across late or slowed threads. */
#define GA_GRAIN_ELEMS 32768

static const char *const isa_names[GA_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon", "sve"};
static const ga_kernels *kernel_table[GA_ISA_COUNT];
static unsigned g_compiled, g_supported;
static int g_isa = GA_ISA_SCALAR;
static int g_default_threads = 1;
static int64_t g_min_chunk = 32768; /* elements per thread: below this, waking a thread costs more */
static int64_t g_nt_threshold = 32 << 20; /* bytes a pass moves before it streams its fresh outputs */
static int g_div_by_recip = 1;             /* GRACE_ADAM_DIV=divide: 0 (for A/B measurements) */
/* Software prefetch distance (elements) of the x86 passes: 512 = 2 KB per fp32 stream; the A/B is in
 * docs/results.md ("GraceAdam x86 tuning"). GRACE_ADAM_PREFETCH or ga_set_prefetch change it, 0 = none. */
#ifndef GA_PREFETCH
#define GA_PREFETCH 512
#endif
static int64_t g_prefetch = GA_PREFETCH;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void div_atfork_child(void);

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
    {
        long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
        llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
        if (llc > 0) g_nt_threshold = llc;
        env = getenv("GRACE_ADAM_NT_THRESHOLD");
        if (env && *env && atoll(env) >= 0) g_nt_threshold = atoll(env);
    }
    env = getenv("GRACE_ADAM_PREFETCH");
    if (env && *env && atoll(env) >= 0) g_prefetch = atoll(env);
    env = getenv("GRACE_ADAM_DIV");
    if (env && strcmp(env, "divide") == 0) g_div_by_recip = 0;
    ga_pool_init();
    pthread_atfork(NULL, NULL, div_atfork_child);
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

static int64_t min_chunk(void) { return __atomic_load_n(&g_min_chunk, __ATOMIC_ACQUIRE); }

/* Units claimed at a time: at most max_grain, and at least 8 claims per home range so that a small job
 * still balances. */
static int64_t grain_for(int64_t nunits, int nth, int64_t max_grain) {
    int64_t g = nunits / nth / 8;
    if (g > max_grain) g = max_grain;
    return g > 1 ? g : 1;
}

/* An elementwise job over n elements is split into units of GA_ALIGN_ELEMS elements whose boundaries are
 * 64-byte aligned in the buffer at `base_ptr` (the first unit is shorter when it is not aligned), so no
 * two threads write the same cache line. Unit j starts at element elem_of(base, n, j). */
static int64_t unit_base(const void *base_ptr, int32_t elem_size) {
    uintptr_t u = (uintptr_t)base_ptr;
    int64_t a0;
    if (elem_size != 4 || u % 4) return 0;
    a0 = (int64_t)((GA_ALIGN_ELEMS - (u / 4) % GA_ALIGN_ELEMS) % GA_ALIGN_ELEMS);
    return a0 ? a0 - GA_ALIGN_ELEMS : 0;
}

static int64_t elem_of(int64_t base, int64_t n, int64_t j) {
    int64_t x = base + GA_ALIGN_ELEMS * j;
    return x < 0 ? 0 : (x > n ? n : x);
}

static int64_t units_of(int64_t base, int64_t n) { return (n - base + GA_ALIGN_ELEMS - 1) / GA_ALIGN_ELEMS; }

static void run_elementwise(ga_range_fn fn, void *ctx, int64_t base, int64_t n, int nthreads, int steal) {
    ga_job j;
    j.fn = fn;
    j.ctx = ctx;
    j.nunits = units_of(base, n);
    j.nth = threads_for(n, min_chunk(), nthreads);
    j.grain = steal ? grain_for(j.nunits, j.nth, GA_GRAIN_ELEMS / GA_ALIGN_ELEMS) : j.nunits;
    j.steal = steal;
    j.inline_ok = n < 2 * min_chunk();
    ga_pool_run(&j);
}

/* ------------------------------------------------------------------------------------------------ */
/* Adam                                                                                               */

typedef struct {
    const ga_adam_args *a;
    ga_adam_fn fn;
    int64_t base;
    ga_pass pass;
    /* step + statistics: units are GA_STATS_BLOCK-element blocks instead of 16-element units */
    ga_stats_fn stats;
    double *sums;
} adam_ctx;

static void adam_units(void *p, int64_t u0, int64_t u1) {
    adam_ctx *c = (adam_ctx *)p;
    int64_t b = elem_of(c->base, c->a->n, u0), e = elem_of(c->base, c->a->n, u1);
    if (e > b) c->fn(c->a, b, e, &c->pass);
}

/* Each block is reduced, then stepped while its gradient is still in L1/L2: one trip to DRAM. */
static void adam_stats_units(void *p, int64_t b0, int64_t b1) {
    adam_ctx *c = (adam_ctx *)p;
    const ga_adam_args *a = c->a;
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * GA_STATS_BLOCK, e = s + GA_STATS_BLOCK < a->n ? s + GA_STATS_BLOCK : a->n;
        c->stats(a->grad, a->grad_dtype, a->grad_scale, a->n, b, b + 1, c->sums);
        c->fn(a, s, e, &c->pass);
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

/* Whether the pass moves enough bytes (every stream read and written) to stream its fresh outputs. */
static int nt_ok_for(const ga_adam_args *A) {
    int64_t per = 12 + (A->grad_dtype == GA_F32 ? 4 : 2) + (A->max_exp_avg_sq ? 4 : 0); /* reads */
    int64_t threshold = ga_get_nt_threshold();
    if (A->exp_avg_out) per += 8 + (A->max_exp_avg_sq_out ? 4 : 0); /* the state, in place or not */
    if (A->commit || A->param_out) per += 4;
    if (A->lowp_dtype != GA_NONE) per += 2;
    return A->n >= threshold / per + (threshold % per != 0);
}

/* ---- division by bias_correction2_sqrt through its reciprocal (ga_internal.h, GA_DIV_MANTISSAS) ---- */

#define GA_DIV_UNIT 4096  /* mantissas per unit of the exhaustive check job */
#define GA_DIV_CACHE 16   /* (ISA, divisor) verdicts kept: one step count's divisor serves every bucket */
#define GA_DIV_CAP (4 * (GA_DIV_NEAR + 2) * 2 + 64) /* near_midpoint_mantissas' count, with room */

typedef struct {
    ga_divcheck_fn fn;
    float c, r;
    int64_t bad;
} divcheck_ctx;

static void divcheck_units(void *p, int64_t u0, int64_t u1) {
    divcheck_ctx *d = (divcheck_ctx *)p;
    uint32_t mant[GA_DIV_UNIT];
    int64_t bad = 0;
    for (int64_t u = u0; u < u1; u++) {
        for (int k = 0; k < GA_DIV_UNIT; k++) mant[k] = (uint32_t)(u * GA_DIV_UNIT + k);
        bad += d->fn(d->c, d->r, mant, GA_DIV_UNIT);
    }
    if (bad) __atomic_fetch_add(&d->bad, bad, __ATOMIC_RELAXED);
}

/* a^-1 mod m, for m odd > 1 and a coprime to it (a power of two) */
static int64_t inv_mod(int64_t a, int64_t m) {
    int64_t r0 = m, r1 = a % m, t0 = 0, t1 = 1;
    while (r1) {
        int64_t q = r0 / r1, t = t0 - q * t1, r = r0 - q * r1;
        t0 = t1, t1 = t, r0 = r1, r1 = r;
    }
    return t0 < 0 ? t0 + m : t0;
}

/* The mantissas X - 2^23 of the x = X 2^-23 in [1, 2) whose quotient by c lies within GA_DIV_NEAR steps
 * of a rounding midpoint: |D| <= GA_DIV_NEAR for D = X 2^s - (2M + 1) C, with C the 24-bit significand
 * of c, s = 24 where x / c is in [1, 2) (X >= C) and 25 where it is in [1/2, 1) (ga_internal.h says why
 * only those can round differently). Each once; returns how many (at most GA_DIV_CAP).
 * With C = C' 2^j (C' odd): 2^j divides D, and X 2^(s-j) = d (mod C') for d = D / 2^j, so the X of one d
 * form the progression X0 + k C', X0 = d (2^(s-j))^-1 mod C'. 2M + 1 = (X 2^(s-j) - d) / C' has the
 * parity of d (s - j >= 2, C' odd), so only odd d count. Count: at most (GA_DIV_NEAR / 2^j + 1) odd d
 * per s, each with at most 2^23 / C' + 1 <= 2^j + 1 X; none once 2^j > GA_DIV_NEAR (no odd d left). */
static int64_t near_midpoint_mantissas(float c, uint32_t *out) {
    const int64_t C = (int64_t)((ga_f32_bits(c) & 0x7FFFFFu) | 0x800000u);
    const int j = __builtin_ctzll((unsigned long long)C);
    const int64_t Cp = C >> j, lo = INT64_C(1) << 23, hi = INT64_C(1) << 24, dmax = GA_DIV_NEAR >> j;
    int64_t n = 0;
    if (Cp == 1) return 0; /* c a power of two: x * r is exact and e = 0 */
    for (int s = 24; s <= 25; s++) {
        const int64_t inv = inv_mod((INT64_C(1) << (s - j)) % Cp, Cp);
        const int64_t x_lo = s == 24 ? C : lo, x_hi = s == 24 ? hi : C; /* the quotient's binade */
        const int64_t d0 = -dmax | 1; /* the first odd d >= -dmax */
        int64_t X0 = (((d0 % Cp) + Cp) % Cp) * inv % Cp, step2 = 2 * inv % Cp;
        for (int64_t d = d0; d <= dmax; d += 2, X0 = X0 + step2 >= Cp ? X0 + step2 - Cp : X0 + step2) {
            int64_t X = X0;
            if (X < x_lo) X += (x_lo - X + Cp - 1) / Cp * Cp;
            for (; X < x_hi; X += Cp) {
                if (n == GA_DIV_CAP) return -1;
                out[n++] = (uint32_t)(X - lo);
            }
        }
    }
    return n;
}

int64_t ga_divisor_check(int isa, float c, float r, int exhaustive, int nthreads) {
    divcheck_ctx d;
    init();
    if (isa < 0 || isa >= GA_ISA_COUNT || !(g_supported & (1u << isa))) return GA_EUNSUPPORTED;
    if (!kernel_table[isa]->divcheck) return GA_EUNSUPPORTED;
    if (!(c >= 0x1p-126f && c <= 0x1.fffffep127f)) return GA_EINVAL; /* positive normal */
    d.fn = kernel_table[isa]->divcheck;
    d.c = c;
    d.r = r;
    d.bad = 0;
    if (exhaustive) {
        ga_job j;
        j.fn = divcheck_units;
        j.ctx = &d;
        j.nunits = GA_DIV_MANTISSAS / GA_DIV_UNIT;
        j.nth = threads_for(j.nunits, 1, nthreads);
        j.grain = grain_for(j.nunits, j.nth, 64);
        j.steal = 1;
        j.inline_ok = 0;
        ga_pool_run(&j);
    } else {
        uint32_t *mant = (uint32_t *)malloc(GA_DIV_CAP * sizeof(uint32_t));
        int64_t n;
        if (!mant) return GA_ENOMEM;
        n = near_midpoint_mantissas(c, mant);
        d.bad = n < 0 ? GA_EINVAL : d.fn(c, r, mant, n);
        free(mant);
    }
    return d.bad;
}

static pthread_mutex_t g_div_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint32_t c_bits;
    int isa;
    float r; /* 0: divide */
} g_div_cache[GA_DIV_CACHE];
static int g_div_cached, g_div_next;

/* RN(1 / c) if the ISA's division through it equals its divide instruction for every x the kernels see
 * (ga_internal.h: the inputs near a rounding midpoint decide it, c in [2^-20, 1]); 0 (divide) otherwise.
 * Checked once per (ISA, c), a few thousand inputs: microseconds. */
static float divisor_recip(int isa, float c) {
    float r = 0.0f;
    uint32_t bits = ga_f32_bits(c);
    int k, hit = 0;
    if (!__atomic_load_n(&g_div_by_recip, __ATOMIC_ACQUIRE) || !kernel_table[isa]->divcheck) return 0.0f;
    if (!(c >= 0x1p-20f && c <= 1.0f)) return 0.0f; /* also NaN */
    pthread_mutex_lock(&g_div_lock);
    for (k = 0; k < g_div_cached && !hit; k++)
        if (g_div_cache[k].c_bits == bits && g_div_cache[k].isa == isa) {
            r = g_div_cache[k].r;
            hit = 1;
        }
    pthread_mutex_unlock(&g_div_lock);
    if (hit) return r;
    r = 1.0f / c;
    if (ga_divisor_check(isa, c, r, 0, 1) != 0) r = 0.0f; /* never seen; the pass divides then */
    pthread_mutex_lock(&g_div_lock);
    g_div_cache[g_div_next].c_bits = bits;
    g_div_cache[g_div_next].isa = isa;
    g_div_cache[g_div_next].r = r;
    g_div_next = (g_div_next + 1) % GA_DIV_CACHE;
    if (g_div_cached < GA_DIV_CACHE) g_div_cached++;
    pthread_mutex_unlock(&g_div_lock);
    return r;
}

/* After fork() only the forking thread exists in the child: the lock may have been held by another thread,
 * and an entry may be half written. Start both afresh (a verdict is recomputed in microseconds). */
static void div_atfork_child(void) {
    pthread_mutex_init(&g_div_lock, NULL);
    g_div_cached = 0;
    g_div_next = 0;
}

float ga_divisor_recip(float c) {
    init();
    return divisor_recip(ga_get_isa(), c);
}

int ga_set_prefetch(int64_t elements) {
    init();
    if (elements < 0) return GA_EINVAL;
    __atomic_store_n(&g_prefetch, elements, __ATOMIC_RELEASE);
    return GA_OK;
}

int64_t ga_get_prefetch(void) {
    init();
    return __atomic_load_n(&g_prefetch, __ATOMIC_ACQUIRE);
}

int ga_set_div_by_recip(int on) {
    init();
    __atomic_store_n(&g_div_by_recip, on ? 1 : 0, __ATOMIC_RELEASE);
    return GA_OK;
}

static void init_adam_ctx(adam_ctx *c, const ga_adam_args *A) {
    int isa = ga_get_isa();
    c->a = A;
    c->fn = kernel_table[isa]->adam;
    c->base = unit_base(A->param, 4);
    c->pass.nt_ok = nt_ok_for(A);
    c->pass.bc2s_recip = divisor_recip(isa, A->bias_correction2_sqrt);
    c->pass.prefetch = ga_get_prefetch();
    c->stats = kernel_table[isa]->stats;
    c->sums = NULL;
}

int ga_adam_step(const ga_adam_args *a, int nthreads) {
    adam_ctx c;
    ga_adam_args A;
    int rc = prepare(a, &A);
    if (rc != GA_OK || A.n == 0) return rc;
    init();
    init_adam_ctx(&c, &A);
    run_elementwise(adam_units, &c, c.base, A.n, nthreads, 1);
    return GA_OK;
}

static double sum_blocks(const double *sums, int64_t nblocks);
static void run_blocks(ga_range_fn fn, void *ctx, int64_t nblocks, int nthreads);

int ga_adam_step_stats(const ga_adam_args *a, int nthreads, double *norm2, int32_t *all_finite) {
    adam_ctx c;
    ga_adam_args A;
    double stack_sums[64], total;
    int64_t nblocks;
    int rc = prepare(a, &A);
    if (rc != GA_OK) return rc;
    if (!norm2 || !all_finite) return GA_EINVAL;
    if (A.n == 0) {
        *norm2 = 0.0;
        *all_finite = 1;
        return GA_OK;
    }
    init();
    init_adam_ctx(&c, &A);
    nblocks = (A.n + GA_STATS_BLOCK - 1) / GA_STATS_BLOCK;
    c.sums = nblocks <= 64 ? stack_sums : (double *)malloc((size_t)nblocks * sizeof(double));
    if (!c.sums) return GA_ENOMEM;
    run_blocks(adam_stats_units, &c, nblocks, nthreads);
    total = sum_blocks(c.sums, nblocks);
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
    int64_t n;
    double *sums;
    ga_stats_fn fn;
} stats_ctx;

static void stats_units(void *p, int64_t b0, int64_t b1) {
    stats_ctx *c = (stats_ctx *)p;
    c->fn(c->grad, c->dt, c->gs, c->n, b0, b1, c->sums);
}

static void run_blocks(ga_range_fn fn, void *ctx, int64_t nblocks, int nthreads) {
    ga_job j;
    int64_t min_blocks = min_chunk() / GA_STATS_BLOCK;
    j.fn = fn;
    j.ctx = ctx;
    j.nunits = nblocks;
    j.nth = threads_for(nblocks, min_blocks, nthreads);
    j.grain = grain_for(nblocks, j.nth, 2);
    j.steal = 1;
    j.inline_ok = nblocks < 2 * (min_blocks > 0 ? min_blocks : 1);
    ga_pool_run(&j);
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
    int64_t nblocks;
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
    nblocks = (n + GA_STATS_BLOCK - 1) / GA_STATS_BLOCK;
    c.sums = nblocks <= 64 ? stack_sums : (double *)malloc((size_t)nblocks * sizeof(double));
    if (!c.sums) return GA_ENOMEM;
    c.fn = kernel_table[ga_get_isa()]->stats;
    run_blocks(stats_units, &c, nblocks, nthreads);
    total = sum_blocks(c.sums, nblocks);
    if (c.sums != stack_sums) free(c.sums);
    *norm2 = total;
    *all_finite = (total - total) == 0.0;
    return GA_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* streaming-store threshold and first touch                                                          */

int ga_set_nt_threshold(int64_t bytes) {
    init();
    if (bytes < 0) return GA_EINVAL;
    __atomic_store_n(&g_nt_threshold, bytes, __ATOMIC_RELEASE);
    return GA_OK;
}

int64_t ga_get_nt_threshold(void) {
    init();
    return __atomic_load_n(&g_nt_threshold, __ATOMIC_ACQUIRE);
}

typedef struct {
    char *p;
    int64_t n, base;
    int32_t esize;
} touch_ctx;

static void touch_units(void *p, int64_t u0, int64_t u1) {
    touch_ctx *c = (touch_ctx *)p;
    int64_t b = elem_of(c->base, c->n, u0), e = elem_of(c->base, c->n, u1);
    if (e > b) memset(c->p + b * c->esize, 0, (size_t)((e - b) * c->esize));
}

int ga_first_touch(void *p, int64_t n, int32_t elem_size, int nthreads) {
    touch_ctx c;
    if (n < 0 || (n > 0 && !p) || !(elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8))
        return GA_EINVAL;
    if (n == 0) return GA_OK;
    init();
    c.p = (char *)p;
    c.n = n;
    c.esize = elem_size;
    c.base = unit_base(p, elem_size);
    /* the same element split as an fp32 Adam pass over n elements, each range by its owner only */
    run_elementwise(touch_units, &c, c.base, n, nthreads, 0);
    return GA_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* roofline probe                                                                                     */

typedef struct {
    float *a, *c, *d;
    const float *b;
    int64_t n, base;
    ga_stream7_fn fn;
} stream_ctx;

static void stream_units(void *p, int64_t u0, int64_t u1) {
    stream_ctx *s = (stream_ctx *)p;
    int64_t b = elem_of(s->base, s->n, u0), e = elem_of(s->base, s->n, u1);
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
    s.base = unit_base(a, 4);
    s.fn = kernel_table[ga_get_isa()]->stream7;
    run_elementwise(stream_units, &s, s.base, n, nthreads, 1);
    return GA_OK;
}
