/* AVX2 + F16C path: 8 fp32 lanes. The tail is copied into zero-padded stack buffers and run through
 * the very same vector body, so body and tail cannot round differently. Adam's arithmetic uses no FMA
 * although the file is compiled with -mfma: -ffp-contract=off keeps mul+add separate, as in the scalar
 * path (div_bc2s's FMAs are an exact division, see there). */
#include <immintrin.h>
#include "ga_internal.h"

#define AI static inline __attribute__((always_inline))

typedef struct {
    __m256 gs, wd, decay, lerp_c, beta2, omb2, step_size, bc2s, bc2s_recip, inf, eps, hi;
    int recip;
} consts8;

AI __m256 ld_grad(const void *g, int dt, int64_t i) {
    if (dt == GA_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == GA_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)g + i)));
    return _mm256_loadu_ps((const float *)g + i);
}

AI __m128i cvt_bf16(__m256 p) {
    __m256i u = _mm256_castps_si256(p);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    __m256 nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
    r = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0)), nan));
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

typedef struct {
    __m256 g, p, m, v, vm;
} lanes8;

/* x / C->bc2s for x >= +-0, +inf or NaN: through the reciprocal when it is proven exact for this divisor
 * (ga_internal.h, GA_DIV_MANTISSAS), else the divide instruction. Same bits either way. These two FMAs are
 * the file's only ones: they are part of the division, not of Adam's arithmetic. */
AI __m256 div_bc2s(const consts8 *C, __m256 x) {
    __m256 q, e;
    if (!C->recip) return _mm256_div_ps(x, C->bc2s);
    q = _mm256_mul_ps(x, C->bc2s_recip);
    e = _mm256_fmsub_ps(q, C->bc2s, x);
    /* x < +inf is false only for +inf (e is NaN there; q is the quotient) and NaN (q is NaN) */
    return _mm256_blendv_ps(q, _mm256_fnmadd_ps(e, C->bc2s_recip, q), _mm256_cmp_ps(x, C->inf, _CMP_LT_OQ));
}

AI void compute8(const ga_adam_args *A, const consts8 *C, lanes8 *x) {
    __m256 g = _mm256_mul_ps(x->g, C->gs), p = x->p, m = x->m, v = x->v, vu, d;
    if (A->l2) g = _mm256_add_ps(g, _mm256_mul_ps(p, C->wd));
    if (A->decoupled) p = _mm256_mul_ps(p, C->decay);
    d = _mm256_sub_ps(g, m);
    m = _mm256_add_ps(_mm256_blendv_ps(m, g, C->hi), _mm256_mul_ps(d, C->lerp_c));
    v = _mm256_add_ps(_mm256_mul_ps(v, C->beta2), _mm256_mul_ps(_mm256_mul_ps(C->omb2, g), g));
    vu = v;
    if (A->max_exp_avg_sq) {
        __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, x->vm, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        x->vm = _mm256_blendv_ps(x->vm, v, take);
        vu = x->vm;
    }
    {
        __m256 den = _mm256_add_ps(div_bc2s(C, _mm256_sqrt_ps(vu)), C->eps);
        p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(C->step_size, m), den));
    }
    x->p = p;
    x->m = m;
    x->v = v;
}

/* GA_BLOCK8 vectors at a time, grouped by stream (loads per stream, arithmetic, stores per stream), with
 * streaming stores (`nt`) for buffers this pass does not read, as in ga_avx512.c (the A/B measurements
 * are in docs/results.md, "GraceAdam x86 tuning"). Two vectors are one 64-byte line per stream. */
#define GA_BLOCK8 2
#define STORE_BLOCK(dst, field, nt)                                                       \
    for (u = 0; u < nblk; u++) {                                                          \
        if (nt) _mm256_stream_ps((dst) + i + 8 * u, x[u].field);                          \
        else _mm256_storeu_ps((dst) + i + 8 * u, x[u].field);                             \
    }
#define STORE_BLOCK_U16(dst, expr, nt)                                                    \
    for (u = 0; u < nblk; u++) {                                                          \
        __m128i h_ = (expr);                                                              \
        if (nt) _mm_stream_si128((__m128i *)((uint16_t *)(dst) + i + 8 * u), h_);         \
        else _mm_storeu_si128((__m128i *)((uint16_t *)(dst) + i + 8 * u), h_);            \
    }


/* pf > 0: prefetch the line of each stream the block reads, pf elements ahead, as in ga_avx512.c. The AVX2
 * path does it only in passes larger than the last-level cache (adam_impl): on buckets that stay in cache the
 * extra instructions cost more than they bring (docs/results.md, "GraceAdam x86 tuning"). */
AI void step_block(const ga_adam_args *A, const consts8 *C, int64_t i, int gdt, int ldt, int nt, int nblk,
                   int64_t pf) {
    lanes8 x[GA_BLOCK8];
    int u;
    if (pf > 0 && nblk == GA_BLOCK8) { /* a block is one 64-byte line per fp32 stream */
        int64_t ahead = i + pf;
        _mm_prefetch((const char *)((const char *)A->grad + ahead * (gdt == GA_F32 ? 4 : 2)), _MM_HINT_T0);
        _mm_prefetch((const char *)(A->exp_avg + ahead), _MM_HINT_T0);
        _mm_prefetch((const char *)(A->exp_avg_sq + ahead), _MM_HINT_T0);
        _mm_prefetch((const char *)(A->param + ahead), _MM_HINT_T0);
        if (A->max_exp_avg_sq) _mm_prefetch((const char *)(A->max_exp_avg_sq + ahead), _MM_HINT_T0);
    }
    for (u = 0; u < nblk; u++) x[u].g = ld_grad(A->grad, gdt, i + 8 * u);
    for (u = 0; u < nblk; u++) x[u].m = _mm256_loadu_ps(A->exp_avg + i + 8 * u);
    for (u = 0; u < nblk; u++) x[u].v = _mm256_loadu_ps(A->exp_avg_sq + i + 8 * u);
    for (u = 0; u < nblk; u++) x[u].p = _mm256_loadu_ps(A->param + i + 8 * u);
    for (u = 0; u < nblk; u++)
        x[u].vm = A->max_exp_avg_sq ? _mm256_loadu_ps(A->max_exp_avg_sq + i + 8 * u) : _mm256_setzero_ps();
    for (u = 0; u < nblk; u++) compute8(A, C, &x[u]);
    if (A->commit) { /* in place: the lines were just read, plain stores */
        for (u = 0; u < nblk; u++) _mm256_storeu_ps(A->param + i + 8 * u, x[u].p);
        for (u = 0; u < nblk; u++) _mm256_storeu_ps(A->exp_avg_out + i + 8 * u, x[u].m);
        for (u = 0; u < nblk; u++) _mm256_storeu_ps(A->exp_avg_sq_out + i + 8 * u, x[u].v);
        if (A->max_exp_avg_sq_out)
            for (u = 0; u < nblk; u++) _mm256_storeu_ps(A->max_exp_avg_sq_out + i + 8 * u, x[u].vm);
    } else if (A->exp_avg_out) { /* out of place: a second buffer set */
        STORE_BLOCK(A->exp_avg_out, m, nt);
        STORE_BLOCK(A->exp_avg_sq_out, v, nt);
        if (A->max_exp_avg_sq_out) STORE_BLOCK(A->max_exp_avg_sq_out, vm, nt);
    }
    if (A->param_out) STORE_BLOCK(A->param_out, p, nt);
    if (ldt == GA_BF16) STORE_BLOCK_U16(A->lowp_out, cvt_bf16(x[u].p), nt);
    if (ldt == GA_F16)
        STORE_BLOCK_U16(A->lowp_out, _mm256_cvtps_ph(x[u].p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), nt);
}

/* One vector (the tail's zero-padded copy goes through here too). */
AI void step8(const ga_adam_args *A, const consts8 *C, int64_t i, int gdt, int ldt) {
    step_block(A, C, i, gdt, ldt, 0, 1, 0);
}

/* Runs the vector body on a zero-padded copy of the last r < 8 elements. */
AI void tail8(const ga_adam_args *A, const consts8 *C, int64_t i, int64_t r, int gdt, int ldt) {
    float pb[8] = {0}, mb[8] = {0}, vb[8] = {0}, vmb[8] = {0}, gb[8] = {0}, pob[8];
    uint16_t g16[8] = {0}, lb[8];
    size_t f = (size_t)r * sizeof(float), h = (size_t)r * sizeof(uint16_t);
    ga_adam_args T = *A;
    memcpy(pb, A->param + i, f);
    memcpy(mb, A->exp_avg + i, f);
    memcpy(vb, A->exp_avg_sq + i, f);
    if (A->max_exp_avg_sq) memcpy(vmb, A->max_exp_avg_sq + i, f);
    if (gdt == GA_F32) memcpy(gb, (const float *)A->grad + i, f);
    else memcpy(g16, (const uint16_t *)A->grad + i, h);
    T.param = pb;
    T.exp_avg = mb;
    T.exp_avg_sq = vb;
    T.max_exp_avg_sq = A->max_exp_avg_sq ? vmb : NULL;
    T.exp_avg_out = A->exp_avg_out ? mb : NULL; /* new state goes back to the same scratch */
    T.exp_avg_sq_out = A->exp_avg_out ? vb : NULL;
    T.max_exp_avg_sq_out = A->max_exp_avg_sq_out ? vmb : NULL;
    T.grad = gdt == GA_F32 ? (const void *)gb : (const void *)g16;
    T.param_out = A->param_out ? pob : NULL;
    T.lowp_out = lb;
    step8(&T, C, 0, gdt, ldt);
    if (A->commit) memcpy(A->param + i, pb, f);
    if (A->exp_avg_out) {
        memcpy(A->exp_avg_out + i, mb, f);
        memcpy(A->exp_avg_sq_out + i, vb, f);
    }
    if (A->max_exp_avg_sq_out) memcpy(A->max_exp_avg_sq_out + i, vmb, f);
    if (A->param_out) memcpy(A->param_out + i, pob, f);
    if (ldt != GA_NONE) memcpy((uint16_t *)A->lowp_out + i, lb, h);
}

AI void adam_impl(const ga_adam_args *A, int64_t begin, int64_t end, int gdt, int ldt, const ga_pass *o) {
    consts8 C;
    int64_t i = begin, pf;
    int nt = 0;
    C.gs = _mm256_set1_ps(A->grad_scale);
    C.wd = _mm256_set1_ps(A->weight_decay);
    C.decay = _mm256_set1_ps(A->decay);
    C.lerp_c = _mm256_set1_ps(A->lerp_c);
    C.beta2 = _mm256_set1_ps(A->beta2);
    C.omb2 = _mm256_set1_ps(A->one_minus_beta2);
    C.step_size = _mm256_set1_ps(A->step_size);
    C.bc2s = _mm256_set1_ps(A->bias_correction2_sqrt);
    C.bc2s_recip = _mm256_set1_ps(o->bc2s_recip);
    C.recip = o->bc2s_recip != 0.0f;
    C.inf = _mm256_set1_ps(__builtin_inff());
    C.eps = _mm256_set1_ps(A->eps);
    C.hi = _mm256_castsi256_ps(_mm256_set1_epi32(A->lerp_hi ? -1 : 0));
    /* Streaming stores need aligned destinations; a block keeps the alignment it starts with. */
    nt = o->nt_ok && ga_fresh_outputs_aligned(A, i, 32, 16);
    pf = o->nt_ok ? o->prefetch : 0;
    if (nt)
        for (; i + 8 * GA_BLOCK8 <= end; i += 8 * GA_BLOCK8) step_block(A, &C, i, gdt, ldt, 1, GA_BLOCK8, pf);
    for (; i + 8 * GA_BLOCK8 <= end; i += 8 * GA_BLOCK8) step_block(A, &C, i, gdt, ldt, 0, GA_BLOCK8, pf);
    for (; i + 8 <= end; i += 8) step8(A, &C, i, gdt, ldt);
    if (i < end) tail8(A, &C, i, end - i, gdt, ldt);
    if (nt) _mm_sfence(); /* streaming stores are weakly ordered: drain them before the call returns */
}

GA_DEFINE_ADAM_DISPATCH(adam_avx2)

AI void acc16(const void *grad, int dt, __m256 vgs, int64_t i, __m256d acc[4]) {
    for (int h = 0; h < 2; h++) {
        __m256 f = _mm256_mul_ps(ld_grad(grad, dt, i + 8 * h), vgs);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
        acc[2 * h] = _mm256_add_pd(acc[2 * h], _mm256_mul_pd(lo, lo));
        acc[2 * h + 1] = _mm256_add_pd(acc[2 * h + 1], _mm256_mul_pd(hi, hi));
    }
}

AI void stats_block(const void *grad, int dt, __m256 vgs, int64_t s, int64_t e, double *out) {
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    double lanes[16];
    int64_t i = s;
    for (; i + 16 <= e; i += 16) acc16(grad, dt, vgs, i, acc);
    if (i < e) { /* zero padding adds +0.0 to the lanes: exact */
        float fb[16] = {0};
        uint16_t hb[16] = {0};
        if (dt == GA_F32) memcpy(fb, (const float *)grad + i, (size_t)(e - i) * 4);
        else memcpy(hb, (const uint16_t *)grad + i, (size_t)(e - i) * 2);
        acc16(dt == GA_F32 ? (const void *)fb : (const void *)hb, dt, vgs, 0, acc);
    }
    for (int k = 0; k < 4; k++) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
    *out = ga_reduce16(lanes);
}

static void stats_avx2(const void *grad, int32_t dt, float gs, int64_t n, int64_t b0, int64_t b1,
                       double *block_sums) {
    __m256 vgs = _mm256_set1_ps(gs);
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * GA_STATS_BLOCK;
        int64_t e = s + GA_STATS_BLOCK < n ? s + GA_STATS_BLOCK : n;
        if (dt == GA_BF16) stats_block(grad, GA_BF16, vgs, s, e, block_sums + b);
        else if (dt == GA_F16) stats_block(grad, GA_F16, vgs, s, e, block_sums + b);
        else stats_block(grad, GA_F32, vgs, s, e, block_sums + b);
    }
}

/* Same grouped order as the Adam body, so the probe bounds it. */
static void stream7_avx2(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m256 x0 = _mm256_loadu_ps(b + i), x1 = _mm256_loadu_ps(b + i + 8);
        __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
        __m256 c0 = _mm256_loadu_ps(c + i), c1 = _mm256_loadu_ps(c + i + 8);
        __m256 d0 = _mm256_loadu_ps(d + i), d1 = _mm256_loadu_ps(d + i + 8);
        _mm256_storeu_ps(a + i, _mm256_add_ps(a0, x0));
        _mm256_storeu_ps(a + i + 8, _mm256_add_ps(a1, x1));
        _mm256_storeu_ps(c + i, _mm256_add_ps(c0, x0));
        _mm256_storeu_ps(c + i + 8, _mm256_add_ps(c1, x1));
        _mm256_storeu_ps(d + i, _mm256_add_ps(d0, x0));
        _mm256_storeu_ps(d + i + 8, _mm256_add_ps(d1, x1));
    }
    for (; i < end; i++) {
        a[i] += b[i];
        c[i] += b[i];
        d[i] += b[i];
    }
}

static int64_t divcheck_avx2(float c, float r, const uint32_t *mant, int64_t n) {
    consts8 C;
    int64_t bad = 0;
    C.bc2s = _mm256_set1_ps(c);
    C.bc2s_recip = _mm256_set1_ps(r);
    C.inf = _mm256_set1_ps(__builtin_inff());
    C.recip = 1;
    for (int64_t k = 0; k < n; k += 8) {
        uint32_t mb[8] = {0};
        int live = n - k < 8 ? (int)(n - k) : 8;
        __m256 x;
        __m256i ne;
        unsigned same;
        memcpy(mb, mant + k, (size_t)live * 4);
        x = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_loadu_si256((const __m256i *)mb), _mm256_set1_epi32(0x3F800000)));
        ne = _mm256_xor_si256(_mm256_castps_si256(div_bc2s(&C, x)), _mm256_castps_si256(_mm256_div_ps(x, C.bc2s)));
        same = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(ne, _mm256_setzero_si256())));
        bad += live - __builtin_popcount(same & ((1u << (unsigned)live) - 1u));
    }
    return bad;
}

const ga_kernels ga_kernels_avx2 = {adam_avx2, stats_avx2, stream7_avx2, divcheck_avx2};
