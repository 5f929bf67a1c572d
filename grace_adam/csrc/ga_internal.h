/* Internal declarations shared by the dispatcher and the per-ISA kernel files (ggml-cpu style). */
#ifndef GA_INTERNAL_H
#define GA_INTERNAL_H

#include <string.h>
#include "grace_adam.h"

/* What the dispatcher decided for one Adam pass, beside its arguments. The stored values are the same
 * whatever it decided. */
typedef struct {
    /* streaming (non-temporal) stores may be used for the outputs the pass does not read (the bucket is
     * too large to stay in cache; see ga_set_nt_threshold) */
    int nt_ok;
    /* RN(1 / bias_correction2_sqrt) when dividing by bias_correction2_sqrt through this reciprocal (see
     * GA_DIV_BY_RECIP) is proven to give the IEEE quotient for every input (ga_core.c, divisor_recip);
     * 0: divide */
    float bc2s_recip;
    /* software prefetch distance in elements for the streams the pass reads (0: none; ga_set_prefetch) */
    int64_t prefetch;
} ga_pass;

/* Adam over elements [begin, end) of the bucket described by args. */
typedef void (*ga_adam_fn)(const ga_adam_args *a, int64_t begin, int64_t end, const ga_pass *o);
/* Block sums for the blocks [b0, b1) of a gradient of n elements (see ga_grad_stats). */
typedef void (*ga_stats_fn)(const void *grad, int32_t dtype, float gs, int64_t n, int64_t b0, int64_t b1,
                            double *block_sums);
typedef void (*ga_stream7_fn)(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end);
/* How many of the n inputs x = 1 + mant[k] * 2^-23 (in [1, 2)) the ISA's division by c through the
 * reciprocal r gets wrong, i.e. not bit-identical to its IEEE division x / c (ga_core.c, divisor_recip). */
typedef int64_t (*ga_divcheck_fn)(float c, float r, const uint32_t *mant, int64_t n);

typedef struct ga_kernels {
    ga_adam_fn adam;
    ga_stats_fn stats;
    ga_stream7_fn stream7;
    ga_divcheck_fn divcheck; /* NULL: this ISA always divides */
} ga_kernels;

/*
 * Division by the per-call constant c = bias_correction2_sqrt without a divide instruction (one divide
 * per element is the most expensive arithmetic of the pass at low thread counts):
 *
 *   q  = x * r             r = RN(1 / c), computed once per call
 *   e  = q * c - x         exact (one FMA): the remainder of a quotient within an ulp is representable
 *   q' = q - e * r         one FMA: the correction (Markstein's step)
 *
 * Where q' can differ from the correctly rounded x / c, and how ga_core.c makes sure it does not:
 * - x = +inf gives e = NaN: the kernels take q (= +inf) there; NaN stays NaN; x = +-0 gives e = +0 and
 *   q' = q = +-0 (the sign of a zero is kept).
 * - For c in [2^-20, 1] (c = sqrt(1 - beta2^t) always is) and positive finite x (x = sqrt(v) >= 2^-75),
 *   every step scales exactly with the exponents of x and c (no overflow, no inexact underflow), so the
 *   inputs x in [1, 2) with c scaled into [1, 2) stand for all of them.
 * - There r is within 2^-25 of 1 / c, q within 1.5 ulps of x / c, e exact or (quotient below 1) off by
 *   at most 2^-47, so q + e * r = x / c + d with |d| < 3.5 * 2^-24 ulps of the quotient: RN(q + e * r)
 *   can differ from RN(x / c) only where x / c lies that close to a rounding midpoint. With x = X 2^-23,
 *   c = C 2^-23 and the midpoint (2M + 1) 2^-s (s = 24 for a quotient in [1, 2), 25 in [1/2, 1)), that is
 *   |X 2^s - (2M + 1) C| < 7: a few X per divisor, found by modular arithmetic (ga_core.c,
 *   near_midpoint_mantissas, which takes every X within GA_DIV_NEAR = 1024 instead of 7).
 * ga_core.c runs those inputs through the ISA's own instructions against its divide instruction once per
 * (ISA, c) and hands out r only if all agree (they always have); otherwise the pass divides. The
 * exhaustive check of all 2^23 inputs (ga_divisor_check) agrees with the near-midpoint one on every
 * divisor tested, also for deliberately wrong reciprocals that do fail (tests/grace_adam). Reference: P.
 * Markstein, "Computation of elementary functions on the IBM RISC System/6000 processor", IBM J. Res.
 * Dev. 34(1), 1990; N. Brisebarre, J.-M. Muller, S. K. Raina, "Accelerating correctly rounded
 * floating-point division when the divisor is known in advance", IEEE Trans. Computers 53(8), 2004.
 */
#define GA_DIV_MANTISSAS (INT64_C(1) << 23)
#define GA_DIV_NEAR 1024

/* ---- thread pool (ga_pool.c) ---- */

#define GA_MAX_THREADS 1024

/* Work on units [u0, u1) of a job (what a unit is belongs to the job: 16 fp32 elements, a statistics
 * block, ...). Every unit must be independent of every other, so that which thread runs it, and in what
 * pieces, cannot change a result. */
typedef void (*ga_range_fn)(void *ctx, int64_t u0, int64_t u1);

typedef struct {
    ga_range_fn fn;
    void *ctx;
    int64_t nunits;
    int64_t grain; /* units claimed at a time (>= 1) */
    int nth;       /* participants; participant h's home range is units [nunits*h/nth, nunits*(h+1)/nth) */
    int steal;     /* 1: a participant whose home range is done takes the rest of the others' (load balance);
                    * 0: each does exactly its home range (first touch places pages by it) */
    int inline_ok; /* a one-participant job may run on the calling thread even when the pool is pinned */
} ga_job;

/* Runs the job to completion (threads that cannot be created: fewer participants, same results). Every
 * participant runs in the default IEEE environment. */
void ga_pool_run(const ga_job *job);
/* Once per process, from the library's init: the affinity mask workers return to when unpinned, and the
 * fork handler. */
void ga_pool_init(void);

extern const ga_kernels ga_kernels_scalar;
#if defined(GA_HAVE_AVX2)
extern const ga_kernels ga_kernels_avx2;
#endif
#if defined(GA_HAVE_AVX512)
extern const ga_kernels ga_kernels_avx512;
#endif
#if defined(GA_HAVE_NEON)
extern const ga_kernels ga_kernels_neon;
#endif
#if defined(GA_HAVE_SVE)
extern const ga_kernels ga_kernels_sve;
#endif
/* SVE reuses the NEON statistics kernel (so SVE is only built together with NEON): the 16-lane fp64
 * layout of a statistics block is fixed, not vector-length agnostic. */
void ga_stats_neon(const void *grad, int32_t dtype, float gs, int64_t n, int64_t b0, int64_t b1,
                   double *block_sums);

/* The `adam` entry of an ISA file's kernel table. The file defines
 *   static inline __attribute__((always_inline))
 *   void adam_impl(const ga_adam_args *A, int64_t begin, int64_t end, int grad_dtype, int lowp_dtype,
 *                  const ga_pass *o);
 * and this expands to `static void name(a, begin, end, o)`, which calls it once per (grad dtype, low-precision
 * dtype) pair with constant dtypes, so each of the nine pairs compiles to its own loop with the dtype
 * branches folded away. It reads the arguments from a local copy: float stores through param / m / v may
 * not alias these constants, so they stay in registers. */
#define GA_ADAM_CASE_(G, L) \
    case (G) * 4 + (L): adam_impl(&A, begin, end, (G), (L), o); break;
#define GA_DEFINE_ADAM_DISPATCH(name)                                                    \
    static void name(const ga_adam_args *a, int64_t begin, int64_t end, const ga_pass *o) { \
        const ga_adam_args A = *a;                                               \
        switch (A.grad_dtype * 4 + A.lowp_dtype) {                               \
            GA_ADAM_CASE_(GA_F32, GA_NONE) GA_ADAM_CASE_(GA_F32, GA_BF16)        \
            GA_ADAM_CASE_(GA_F32, GA_F16) GA_ADAM_CASE_(GA_BF16, GA_NONE)        \
            GA_ADAM_CASE_(GA_BF16, GA_BF16) GA_ADAM_CASE_(GA_BF16, GA_F16)       \
            GA_ADAM_CASE_(GA_F16, GA_NONE) GA_ADAM_CASE_(GA_F16, GA_BF16)        \
            GA_ADAM_CASE_(GA_F16, GA_F16)                                        \
            default: break;                                                      \
        }                                                                        \
    }

/* ---- portable scalar helpers (static inline so each ISA file can use them for its own tails) ---- */

static inline uint32_t ga_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ga_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float ga_bf16_to_f32(uint16_t h) { return ga_bits_f32((uint32_t)h << 16); }

/* Round-to-nearest-even; NaN becomes the canonical quiet NaN 0x7FC0 (as c10::BFloat16 does). */
static inline uint16_t ga_f32_to_bf16(float f) {
    uint32_t u = ga_f32_bits(f);
    if (f != f) return 0x7FC0u;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Exact IEEE binary16 -> binary32 (subnormals included). */
static inline float ga_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t out;
    if (exp == 0x1Fu) {
        out = sign | 0x7F800000u | (man << 13); /* inf / NaN (payload kept, as the hardware does) */
    } else if (exp != 0) {
        out = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        out = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while ((man & 0x400u) == 0);
        out = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    return ga_bits_f32(out);
}

/* binary32 -> binary16 with round-to-nearest-even, matching F16C / ARM FCVT (NaN: quiet, payload
 * truncated). */
static inline uint16_t ga_f32_to_f16(float f) {
    uint32_t u = ga_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) { /* inf or NaN */
        if (a == 0x7F800000u) return (uint16_t)(sign | 0x7C00u);
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    }
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: overflow */
    if (a >= 0x38800000u) {                                    /* normal fp16 range (>= 2^-14) */
        uint32_t r = a + 0x0FFFu + ((a >> 13) & 1u) - 0x38000000u; /* rebias 127 -> 15 */
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return sign; /* < 2^-25: rounds to zero */
    {
        /* subnormal fp16: value = man * 2^-24; shift the 24-bit significand and round RNE */
        uint32_t e = a >> 23;
        uint32_t man = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
}

static inline float ga_load_grad(const void *g, int32_t dt, int64_t i) {
    if (dt == GA_BF16) return ga_bf16_to_f32(((const uint16_t *)g)[i]);
    if (dt == GA_F16) return ga_f16_to_f32(((const uint16_t *)g)[i]);
    return ((const float *)g)[i];
}

static inline int ga_aligned(const void *p, uintptr_t a) { return p == NULL || ((uintptr_t)p % a) == 0; }

/* Whether, at element i, every buffer the pass writes but does not read (param_out, lowp_out, and the
 * out-of-place state) is aligned for streaming stores: `f32` bytes for float buffers, `u16` for the
 * low-precision copy. In-place state (commit) is stored normally and does not count. */
static inline int ga_fresh_outputs_aligned(const ga_adam_args *A, int64_t i, uintptr_t f32, uintptr_t u16) {
#ifdef GA_NO_NT
    (void)A, (void)i, (void)f32, (void)u16;
    return 0;
#else
    return ga_aligned(A->param_out ? A->param_out + i : NULL, f32) &&
           ga_aligned(A->lowp_out ? (const uint16_t *)A->lowp_out + i : NULL, u16) &&
           (A->commit || (ga_aligned(A->exp_avg_out ? A->exp_avg_out + i : NULL, f32) &&
                          ga_aligned(A->exp_avg_sq_out ? A->exp_avg_sq_out + i : NULL, f32) &&
                          ga_aligned(A->max_exp_avg_sq_out ? A->max_exp_avg_sq_out + i : NULL, f32)));
#endif
}

/* Fixed reduction tree of the 16 fp64 lanes of one statistics block. */
static inline double ga_reduce16(const double *l) {
    double r8[8], r4[4], r2[2];
    for (int k = 0; k < 8; k++) r8[k] = l[k] + l[k + 8];
    for (int k = 0; k < 4; k++) r4[k] = r8[k] + r8[k + 4];
    for (int k = 0; k < 2; k++) r2[k] = r4[k] + r4[k + 2];
    return r2[0] + r2[1];
}

#endif
