/* AVX-512 (F/BW/VL) path: 16 fp32 lanes, masked loads/stores for the tail so the tail runs exactly the
 * same instruction sequence as the body. bf16 rounding uses integer ops rather than VCVTNEPS2BF16,
 * because that instruction treats denormal inputs as zero and so is not the scalar RNE conversion. */
#include <immintrin.h>
#include "ga_internal.h"

#define AI static inline __attribute__((always_inline))

typedef struct {
    __m512 gs, wd, decay, lerp_c, beta2, omb2, step_size, bc2s, eps;
    __mmask16 hi;
} consts16;

AI __m512 ld_f32(const float *p, __mmask16 k, int full) {
    return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
}

AI void st_f32(float *p, __m512 x, __mmask16 k, int full) {
    if (full) _mm512_storeu_ps(p, x);
    else _mm512_mask_storeu_ps(p, k, x);
}

AI __m256i ld_u16(const uint16_t *p, __mmask16 k, int full) {
    return full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(k, p);
}

AI void st_u16(uint16_t *p, __m256i x, __mmask16 k, int full) {
    if (full) _mm256_storeu_si256((__m256i *)p, x);
    else _mm256_mask_storeu_epi16(p, k, x);
}

AI __m512 ld_grad(const void *g, int dt, int64_t i, __mmask16 k, int full) {
    if (dt == GA_BF16) {
        __m256i h = ld_u16((const uint16_t *)g + i, k, full);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == GA_F16) return _mm512_cvtph_ps(ld_u16((const uint16_t *)g + i, k, full));
    return ld_f32((const float *)g + i, k, full);
}

AI __m256i cvt_bf16(__m512 p) {
    __m512i u = _mm512_castps_si512(p);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

AI void step16(const ga_adam_args *A, const consts16 *C, int64_t i, __mmask16 k, int full, int gdt,
               int ldt) {
    __m512 g = _mm512_mul_ps(ld_grad(A->grad, gdt, i, k, full), C->gs);
    __m512 p = ld_f32(A->param + i, k, full);
    __m512 m = ld_f32(A->exp_avg + i, k, full);
    __m512 v = ld_f32(A->exp_avg_sq + i, k, full);
    __m512 vu, d;
    if (A->l2) g = _mm512_add_ps(g, _mm512_mul_ps(p, C->wd));
    if (A->decoupled) p = _mm512_mul_ps(p, C->decay);
    d = _mm512_sub_ps(g, m);
    m = _mm512_add_ps(_mm512_mask_blend_ps(C->hi, m, g), _mm512_mul_ps(d, C->lerp_c));
    v = _mm512_add_ps(_mm512_mul_ps(v, C->beta2), _mm512_mul_ps(_mm512_mul_ps(C->omb2, g), g));
    vu = v;
    if (A->max_exp_avg_sq) {
        __m512 vm = ld_f32(A->max_exp_avg_sq + i, k, full);
        __mmask16 take = _mm512_cmp_ps_mask(v, vm, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        vm = _mm512_mask_blend_ps(take, vm, v);
        if (A->commit) st_f32(A->max_exp_avg_sq + i, vm, k, full);
        vu = vm;
    }
    {
        __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vu), C->bc2s), C->eps);
        p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(C->step_size, m), den));
    }
    if (A->commit) {
        st_f32(A->param + i, p, k, full);
        st_f32(A->exp_avg + i, m, k, full);
        st_f32(A->exp_avg_sq + i, v, k, full);
    }
    if (A->param_out) st_f32(A->param_out + i, p, k, full);
    if (ldt == GA_BF16) st_u16((uint16_t *)A->lowp_out + i, cvt_bf16(p), k, full);
    if (ldt == GA_F16)
        st_u16((uint16_t *)A->lowp_out + i, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
               k, full);
}

AI void adam_impl(const ga_adam_args *A, int64_t begin, int64_t end, int gdt, int ldt) {
    consts16 C;
    int64_t i = begin;
    C.gs = _mm512_set1_ps(A->grad_scale);
    C.wd = _mm512_set1_ps(A->weight_decay);
    C.decay = _mm512_set1_ps(A->decay);
    C.lerp_c = _mm512_set1_ps(A->lerp_c);
    C.beta2 = _mm512_set1_ps(A->beta2);
    C.omb2 = _mm512_set1_ps(A->one_minus_beta2);
    C.step_size = _mm512_set1_ps(A->step_size);
    C.bc2s = _mm512_set1_ps(A->bias_correction2_sqrt);
    C.eps = _mm512_set1_ps(A->eps);
    C.hi = A->lerp_hi ? (__mmask16)0xFFFF : (__mmask16)0;
    for (; i + 16 <= end; i += 16) step16(A, &C, i, 0xFFFF, 1, gdt, ldt);
    if (i < end) step16(A, &C, i, (__mmask16)((1u << (unsigned)(end - i)) - 1u), 0, gdt, ldt);
}

#define CASE(G, L) \
    case (G) * 4 + (L): adam_impl(&A, begin, end, (G), (L)); break;

static void adam_avx512(const ga_adam_args *a, int64_t begin, int64_t end) {
    /* A local copy: float stores through param/m/v may not alias these constants. */
    const ga_adam_args A = *a;
    switch (A.grad_dtype * 4 + A.lowp_dtype) {
        CASE(GA_F32, GA_NONE) CASE(GA_F32, GA_BF16) CASE(GA_F32, GA_F16)
        CASE(GA_BF16, GA_NONE) CASE(GA_BF16, GA_BF16) CASE(GA_BF16, GA_F16)
        CASE(GA_F16, GA_NONE) CASE(GA_F16, GA_BF16) CASE(GA_F16, GA_F16)
        default: break;
    }
}

AI void stats_block(const void *grad, int dt, __m512 vgs, int64_t s, int64_t e, double *out) {
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    double lanes[16];
    int64_t i = s;
    for (;; i += 16) {
        int full = i + 16 <= e;
        __mmask16 k;
        __m512 f;
        __m512d dl, dh;
        if (i >= e) break;
        k = full ? (__mmask16)0xFFFF : (__mmask16)((1u << (unsigned)(e - i)) - 1u);
        f = _mm512_mul_ps(full ? ld_grad(grad, dt, i, k, 1) : ld_grad(grad, dt, i, k, 0), vgs);
        dl = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
        dh = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
        lo = _mm512_add_pd(lo, _mm512_mul_pd(dl, dl));
        hi = _mm512_add_pd(hi, _mm512_mul_pd(dh, dh));
    }
    _mm512_storeu_pd(lanes, lo);
    _mm512_storeu_pd(lanes + 8, hi);
    *out = ga_reduce16(lanes);
}

static void stats_avx512(const void *grad, int32_t dt, float gs, int64_t n, int64_t b0, int64_t b1,
                         double *block_sums) {
    __m512 vgs = _mm512_set1_ps(gs);
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * GA_STATS_BLOCK;
        int64_t e = s + GA_STATS_BLOCK < n ? s + GA_STATS_BLOCK : n;
        if (dt == GA_BF16) stats_block(grad, GA_BF16, vgs, s, e, block_sums + b);
        else if (dt == GA_F16) stats_block(grad, GA_F16, vgs, s, e, block_sums + b);
        else stats_block(grad, GA_F32, vgs, s, e, block_sums + b);
    }
}

static void stream7_avx512(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m512 x = _mm512_loadu_ps(b + i);
        _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_loadu_ps(a + i), x));
        _mm512_storeu_ps(c + i, _mm512_add_ps(_mm512_loadu_ps(c + i), x));
        _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(d + i), x));
    }
    for (; i < end; i++) {
        a[i] += b[i];
        c[i] += b[i];
        d[i] += b[i];
    }
}

const ga_kernels ga_kernels_avx512 = {adam_avx512, stats_avx512, stream7_avx512};
