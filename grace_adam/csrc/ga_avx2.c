/* AVX2 + F16C path: 8 fp32 lanes. The tail is copied into zero-padded stack buffers and run through
 * the very same vector body, so body and tail cannot round differently. No FMA is used although the
 * file is compiled with -mfma: -ffp-contract=off keeps mul+add separate, as in the scalar path. */
#include <immintrin.h>
#include "ga_internal.h"

#define AI static inline __attribute__((always_inline))

typedef struct {
    __m256 gs, wd, decay, lerp_c, beta2, omb2, step_size, bc2s, eps, hi;
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

AI void step8(const ga_adam_args *A, const consts8 *C, int64_t i, int gdt, int ldt) {
    __m256 g = _mm256_mul_ps(ld_grad(A->grad, gdt, i), C->gs);
    __m256 p = _mm256_loadu_ps(A->param + i);
    __m256 m = _mm256_loadu_ps(A->exp_avg + i);
    __m256 v = _mm256_loadu_ps(A->exp_avg_sq + i);
    __m256 vu, d;
    if (A->l2) g = _mm256_add_ps(g, _mm256_mul_ps(p, C->wd));
    if (A->decoupled) p = _mm256_mul_ps(p, C->decay);
    d = _mm256_sub_ps(g, m);
    m = _mm256_add_ps(_mm256_blendv_ps(m, g, C->hi), _mm256_mul_ps(d, C->lerp_c));
    v = _mm256_add_ps(_mm256_mul_ps(v, C->beta2), _mm256_mul_ps(_mm256_mul_ps(C->omb2, g), g));
    vu = v;
    if (A->max_exp_avg_sq) {
        __m256 vm = _mm256_loadu_ps(A->max_exp_avg_sq + i);
        __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, vm, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        vm = _mm256_blendv_ps(vm, v, take);
        if (A->max_exp_avg_sq_out) _mm256_storeu_ps(A->max_exp_avg_sq_out + i, vm);
        vu = vm;
    }
    {
        __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vu), C->bc2s), C->eps);
        p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(C->step_size, m), den));
    }
    if (A->commit) _mm256_storeu_ps(A->param + i, p);
    if (A->exp_avg_out) {
        _mm256_storeu_ps(A->exp_avg_out + i, m);
        _mm256_storeu_ps(A->exp_avg_sq_out + i, v);
    }
    if (A->param_out) _mm256_storeu_ps(A->param_out + i, p);
    if (ldt == GA_BF16) _mm_storeu_si128((__m128i *)((uint16_t *)A->lowp_out + i), cvt_bf16(p));
    if (ldt == GA_F16)
        _mm_storeu_si128((__m128i *)((uint16_t *)A->lowp_out + i),
                         _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
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

AI void adam_impl(const ga_adam_args *A, int64_t begin, int64_t end, int gdt, int ldt) {
    consts8 C;
    int64_t i = begin;
    C.gs = _mm256_set1_ps(A->grad_scale);
    C.wd = _mm256_set1_ps(A->weight_decay);
    C.decay = _mm256_set1_ps(A->decay);
    C.lerp_c = _mm256_set1_ps(A->lerp_c);
    C.beta2 = _mm256_set1_ps(A->beta2);
    C.omb2 = _mm256_set1_ps(A->one_minus_beta2);
    C.step_size = _mm256_set1_ps(A->step_size);
    C.bc2s = _mm256_set1_ps(A->bias_correction2_sqrt);
    C.eps = _mm256_set1_ps(A->eps);
    C.hi = _mm256_castsi256_ps(_mm256_set1_epi32(A->lerp_hi ? -1 : 0));
    for (; i + 8 <= end; i += 8) step8(A, &C, i, gdt, ldt);
    if (i < end) tail8(A, &C, i, end - i, gdt, ldt);
}

#define CASE(G, L) \
    case (G) * 4 + (L): adam_impl(&A, begin, end, (G), (L)); break;

static void adam_avx2(const ga_adam_args *a, int64_t begin, int64_t end) {
    const ga_adam_args A = *a; /* local copy: float stores may not alias the constants */
    switch (A.grad_dtype * 4 + A.lowp_dtype) {
        CASE(GA_F32, GA_NONE) CASE(GA_F32, GA_BF16) CASE(GA_F32, GA_F16)
        CASE(GA_BF16, GA_NONE) CASE(GA_BF16, GA_BF16) CASE(GA_BF16, GA_F16)
        CASE(GA_F16, GA_NONE) CASE(GA_F16, GA_BF16) CASE(GA_F16, GA_F16)
        default: break;
    }
}

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

static void stream7_avx2(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256 x = _mm256_loadu_ps(b + i);
        _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), x));
        _mm256_storeu_ps(c + i, _mm256_add_ps(_mm256_loadu_ps(c + i), x));
        _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), x));
    }
    for (; i < end; i++) {
        a[i] += b[i];
        c[i] += b[i];
        d[i] += b[i];
    }
}

const ga_kernels ga_kernels_avx2 = {adam_avx2, stats_avx2, stream7_avx2};
