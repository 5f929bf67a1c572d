/* AVX-512 (F/BW/VL) path: 16 fp32 lanes, masked loads/stores for the tail so the tail runs exactly the
 * same instruction sequence as the body. bf16 rounding uses integer ops rather than VCVTNEPS2BF16,
 * because that instruction treats denormal inputs as zero and so is not the scalar RNE conversion. */
#include <immintrin.h>
#include "ga_internal.h"

#define AI static inline __attribute__((always_inline))

typedef struct {
    __m512 gs, wd, decay, lerp_c, beta2, omb2, step_size, bc2s, bc2s_recip, inf, eps;
    __mmask16 hi;
    int recip;
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

typedef struct {
    __m512 g, p, m, v, vm;
} lanes16;

AI void load16(const ga_adam_args *A, int64_t i, __mmask16 k, int full, int gdt, lanes16 *x) {
    x->g = ld_grad(A->grad, gdt, i, k, full);
    x->p = ld_f32(A->param + i, k, full);
    x->m = ld_f32(A->exp_avg + i, k, full);
    x->v = ld_f32(A->exp_avg_sq + i, k, full);
    /* zero when unused, so the compiler can see every stored lane is initialised */
    x->vm = A->max_exp_avg_sq ? ld_f32(A->max_exp_avg_sq + i, k, full) : _mm512_setzero_ps();
}

/* x / C->bc2s for x >= +-0, +inf or NaN: through the reciprocal when it is proven exact for this divisor
 * (ga_internal.h, GA_DIV_MANTISSAS), else the divide instruction. Same bits either way. */
AI __m512 div_bc2s(const consts16 *C, __m512 x) {
    __m512 q, e;
    if (!C->recip) return _mm512_div_ps(x, C->bc2s);
    q = _mm512_mul_ps(x, C->bc2s_recip);
    e = _mm512_fmsub_ps(q, C->bc2s, x);
    /* x < +inf is false only for +inf (e is NaN there; q is the quotient) and NaN (q is NaN) */
    return _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(x, C->inf, _CMP_LT_OQ), _mm512_fnmadd_ps(e, C->bc2s_recip, q));
}

AI void compute16(const ga_adam_args *A, const consts16 *C, lanes16 *x) {
    __m512 g = _mm512_mul_ps(x->g, C->gs), p = x->p, m = x->m, v = x->v, vu, d;
    if (A->l2) g = _mm512_add_ps(g, _mm512_mul_ps(p, C->wd));
    if (A->decoupled) p = _mm512_mul_ps(p, C->decay);
    d = _mm512_sub_ps(g, m);
    m = _mm512_add_ps(_mm512_mask_blend_ps(C->hi, m, g), _mm512_mul_ps(d, C->lerp_c));
    v = _mm512_add_ps(_mm512_mul_ps(v, C->beta2), _mm512_mul_ps(_mm512_mul_ps(C->omb2, g), g));
    vu = v;
    if (A->max_exp_avg_sq) {
        __mmask16 take = _mm512_cmp_ps_mask(v, x->vm, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        x->vm = _mm512_mask_blend_ps(take, x->vm, v);
        vu = x->vm;
    }
    {
        __m512 den = _mm512_add_ps(div_bc2s(C, _mm512_sqrt_ps(vu)), C->eps);
        p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(C->step_size, m), den));
    }
    x->p = p;
    x->m = m;
    x->v = v;
}

AI void store16(const ga_adam_args *A, int64_t i, __mmask16 k, int full, int ldt, const lanes16 *x) {
    if (A->commit) st_f32(A->param + i, x->p, k, full);
    if (A->exp_avg_out) {
        st_f32(A->exp_avg_out + i, x->m, k, full);
        st_f32(A->exp_avg_sq_out + i, x->v, k, full);
    }
    if (A->max_exp_avg_sq_out) st_f32(A->max_exp_avg_sq_out + i, x->vm, k, full);
    if (A->param_out) st_f32(A->param_out + i, x->p, k, full);
    if (ldt == GA_BF16) st_u16((uint16_t *)A->lowp_out + i, cvt_bf16(x->p), k, full);
    if (ldt == GA_F16)
        st_u16((uint16_t *)A->lowp_out + i, _mm512_cvtps_ph(x->p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
               k, full);
}

AI void step16(const ga_adam_args *A, const consts16 *C, int64_t i, __mmask16 k, int full, int gdt,
               int ldt) {
    lanes16 x;
    load16(A, i, k, full, gdt, &x);
    compute16(A, C, &x);
    store16(A, i, k, full, ldt, &x);
}

/* The body handles GA_BLOCK vectors at a time, grouped by stream: every load of one stream, then the
 * next stream, the arithmetic, then every store of one stream, then the next (two vectors are one
 * 64-byte line per stream). The grouping only reorders memory accesses: per-element arithmetic is
 * unchanged, so the results are the same bits as the one-vector loop and the tail. Why 2 and not 1, 4
 * or 8: the A/B measurements in docs/results.md ("GraceAdam x86 tuning"); rebuild with
 * --cflags=-DGA_BLOCK=N to repeat them. */
#ifndef GA_BLOCK
#define GA_BLOCK 2
#endif


/* Stores of a block to a buffer this pass does not read: with `nt`, streaming (non-temporal) stores,
 * which skip the read-for-ownership of the destination line (the buffer is not read again soon: the next
 * step's inputs, or the upload copy the DMA engine reads). */
#define STORE_BLOCK(dst, field, nt)                                                       \
    for (u = 0; u < GA_BLOCK; u++) {                                                      \
        if (nt) _mm512_stream_ps((dst) + i + 16 * u, x[u].field);                         \
        else _mm512_storeu_ps((dst) + i + 16 * u, x[u].field);                            \
    }
#define STORE_BLOCK_U16(dst, expr, nt)                                                    \
    for (u = 0; u < GA_BLOCK; u++) {                                                      \
        __m256i h_ = (expr);                                                              \
        if (nt) _mm256_stream_si256((__m256i *)((uint16_t *)(dst) + i + 16 * u), h_);     \
        else _mm256_storeu_si256((__m256i *)((uint16_t *)(dst) + i + 16 * u), h_);        \
    }

/* pf > 0: prefetch every line of the streams the block reads, pf elements ahead (ga_core.c, ga_set_prefetch:
 * with a block's square roots and divides in flight the core keeps too few loads outstanding for DRAM at 1-2
 * threads). A prefetch past the end of a buffer is a hint: it never faults. */
AI void step_block(const ga_adam_args *A, const consts16 *C, int64_t i, int gdt, int ldt, int nt, int64_t pf) {
    lanes16 x[GA_BLOCK];
    int u;
    if (pf > 0)
        for (u = 0; u < GA_BLOCK; u++) {
            int64_t ahead = i + pf + 16 * u;
            _mm_prefetch((const char *)((const char *)A->grad + ahead * (gdt == GA_F32 ? 4 : 2)), _MM_HINT_T0);
            _mm_prefetch((const char *)(A->exp_avg + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(A->exp_avg_sq + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(A->param + ahead), _MM_HINT_T0);
            if (A->max_exp_avg_sq) _mm_prefetch((const char *)(A->max_exp_avg_sq + ahead), _MM_HINT_T0);
        }
    for (u = 0; u < GA_BLOCK; u++) x[u].g = ld_grad(A->grad, gdt, i + 16 * u, 0xFFFF, 1);
    for (u = 0; u < GA_BLOCK; u++) x[u].m = _mm512_loadu_ps(A->exp_avg + i + 16 * u);
    for (u = 0; u < GA_BLOCK; u++) x[u].v = _mm512_loadu_ps(A->exp_avg_sq + i + 16 * u);
    for (u = 0; u < GA_BLOCK; u++) x[u].p = _mm512_loadu_ps(A->param + i + 16 * u);
    for (u = 0; u < GA_BLOCK; u++)
        x[u].vm = A->max_exp_avg_sq ? _mm512_loadu_ps(A->max_exp_avg_sq + i + 16 * u) : _mm512_setzero_ps();
    for (u = 0; u < GA_BLOCK; u++) compute16(A, C, &x[u]);
    if (A->commit) { /* in place: the lines were just read, plain stores */
        STORE_BLOCK(A->param, p, 0);
        STORE_BLOCK(A->exp_avg_out, m, 0);
        STORE_BLOCK(A->exp_avg_sq_out, v, 0);
        if (A->max_exp_avg_sq_out) STORE_BLOCK(A->max_exp_avg_sq_out, vm, 0);
    } else if (A->exp_avg_out) { /* out of place: a second buffer set */
        STORE_BLOCK(A->exp_avg_out, m, nt);
        STORE_BLOCK(A->exp_avg_sq_out, v, nt);
        if (A->max_exp_avg_sq_out) STORE_BLOCK(A->max_exp_avg_sq_out, vm, nt);
    }
    if (A->param_out) STORE_BLOCK(A->param_out, p, nt);
    if (ldt == GA_BF16) STORE_BLOCK_U16(A->lowp_out, cvt_bf16(x[u].p), nt);
    if (ldt == GA_F16)
        STORE_BLOCK_U16(A->lowp_out, _mm512_cvtps_ph(x[u].p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), nt);
}

AI void adam_impl(const ga_adam_args *A, int64_t begin, int64_t end, int gdt, int ldt, const ga_pass *o) {
    consts16 C;
    int64_t i = begin;
    int nt = 0;
    C.gs = _mm512_set1_ps(A->grad_scale);
    C.wd = _mm512_set1_ps(A->weight_decay);
    C.decay = _mm512_set1_ps(A->decay);
    C.lerp_c = _mm512_set1_ps(A->lerp_c);
    C.beta2 = _mm512_set1_ps(A->beta2);
    C.omb2 = _mm512_set1_ps(A->one_minus_beta2);
    C.step_size = _mm512_set1_ps(A->step_size);
    C.bc2s = _mm512_set1_ps(A->bias_correction2_sqrt);
    C.bc2s_recip = _mm512_set1_ps(o->bc2s_recip);
    C.recip = o->bc2s_recip != 0.0f;
    C.inf = _mm512_set1_ps(__builtin_inff());
    C.eps = _mm512_set1_ps(A->eps);
    C.hi = A->lerp_hi ? (__mmask16)0xFFFF : (__mmask16)0;
    /* Streaming stores need aligned destinations; a block keeps the alignment it starts with. */
    nt = o->nt_ok && ga_fresh_outputs_aligned(A, i, 64, 32);
    if (nt)
        for (; i + 16 * GA_BLOCK <= end; i += 16 * GA_BLOCK) step_block(A, &C, i, gdt, ldt, 1, o->prefetch);
    for (; i + 16 * GA_BLOCK <= end; i += 16 * GA_BLOCK) step_block(A, &C, i, gdt, ldt, 0, o->prefetch);
    for (; i + 16 <= end; i += 16) step16(A, &C, i, 0xFFFF, 1, gdt, ldt);
    if (i < end) step16(A, &C, i, (__mmask16)((1u << (unsigned)(end - i)) - 1u), 0, gdt, ldt);
    if (nt) _mm_sfence(); /* streaming stores are weakly ordered: drain them before the call returns */
}

GA_DEFINE_ADAM_DISPATCH(adam_avx512)

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

/* Same grouped order as the Adam body (two vectors per stream, loads then stores), so that the probe
 * measures the best this memory pattern achieves rather than a slower access order. */
static void stream7_avx512(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 32 <= end; i += 32) {
        __m512 x0 = _mm512_loadu_ps(b + i), x1 = _mm512_loadu_ps(b + i + 16);
        __m512 a0 = _mm512_loadu_ps(a + i), a1 = _mm512_loadu_ps(a + i + 16);
        __m512 c0 = _mm512_loadu_ps(c + i), c1 = _mm512_loadu_ps(c + i + 16);
        __m512 d0 = _mm512_loadu_ps(d + i), d1 = _mm512_loadu_ps(d + i + 16);
        _mm512_storeu_ps(a + i, _mm512_add_ps(a0, x0));
        _mm512_storeu_ps(a + i + 16, _mm512_add_ps(a1, x1));
        _mm512_storeu_ps(c + i, _mm512_add_ps(c0, x0));
        _mm512_storeu_ps(c + i + 16, _mm512_add_ps(c1, x1));
        _mm512_storeu_ps(d + i, _mm512_add_ps(d0, x0));
        _mm512_storeu_ps(d + i + 16, _mm512_add_ps(d1, x1));
    }
    for (; i < end; i++) {
        a[i] += b[i];
        c[i] += b[i];
        d[i] += b[i];
    }
}

static int64_t divcheck_avx512(float c, float r, const uint32_t *mant, int64_t n) {
    consts16 C;
    int64_t bad = 0;
    C.bc2s = _mm512_set1_ps(c);
    C.bc2s_recip = _mm512_set1_ps(r);
    C.inf = _mm512_set1_ps(__builtin_inff());
    C.recip = 1;
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 live = k + 16 <= n ? (__mmask16)0xFFFF : (__mmask16)((1u << (unsigned)(n - k)) - 1u);
        __m512i mk = _mm512_maskz_loadu_epi32(live, mant + k);
        __m512 x = _mm512_castsi512_ps(_mm512_add_epi32(mk, _mm512_set1_epi32(0x3F800000)));
        __m512i got = _mm512_castps_si512(div_bc2s(&C, x)), want = _mm512_castps_si512(_mm512_div_ps(x, C.bc2s));
        bad += __builtin_popcount((unsigned)_mm512_mask_cmpneq_epi32_mask(live, got, want));
    }
    return bad;
}

const ga_kernels ga_kernels_avx512 = {adam_avx512, stats_avx512, stream7_avx512, divcheck_avx512};
