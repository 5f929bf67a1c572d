/* NEON (AArch64 Advanced SIMD) path: 4 fp32 lanes, 2x unrolled body, zero-padded buffer tail through the
 * same body. vmulq/vaddq are never fused (-ffp-contract=off), so results equal the scalar path. */
#include <arm_neon.h>
#include "ga_internal.h"

#define AI static inline __attribute__((always_inline))

typedef struct {
    float32x4_t gs, wd, decay, lerp_c, beta2, omb2, step_size, bc2s, bc2s_recip, inf, eps;
    uint32x4_t hi;
    int recip;
} consts4;

AI float32x4_t ld_grad(const void *g, int dt, int64_t i) {
    if (dt == GA_BF16) return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(vld1_u16((const uint16_t *)g + i)), 16));
    if (dt == GA_F16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)g + i)));
    return vld1q_f32((const float *)g + i);
}

AI uint16x4_t cvt_bf16(float32x4_t p) {
    uint32x4_t u = vreinterpretq_u32_f32(p);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7FFF)), lsb), 16);
    r = vbslq_u32(vceqq_f32(p, p), r, vdupq_n_u32(0x7FC0)); /* p == p is false only for NaN */
    return vmovn_u32(r);
}

/* x / C->bc2s for x >= +-0, +inf or NaN: through the reciprocal when it is proven exact for this divisor
 * (ga_internal.h, GA_DIV_MANTISSAS), else the divide instruction. Same bits either way. vfmaq/vfmsq are
 * fused by definition: they are the division's two FMAs, not Adam's arithmetic. */
AI float32x4_t div_bc2s(const consts4 *C, float32x4_t x) {
    float32x4_t q, e;
    if (!C->recip) return vdivq_f32(x, C->bc2s);
    q = vmulq_f32(x, C->bc2s_recip);
    e = vfmaq_f32(vnegq_f32(x), q, C->bc2s); /* q * c - x: +0 when x = +-0, as on x86 */
    /* x < +inf is false only for +inf (e is NaN there; q is the quotient) and NaN (q is NaN) */
    return vbslq_f32(vcltq_f32(x, C->inf), vfmsq_f32(q, e, C->bc2s_recip), q);
}

AI void step4(const ga_adam_args *A, const consts4 *C, int64_t i, int gdt, int ldt) {
    float32x4_t g = vmulq_f32(ld_grad(A->grad, gdt, i), C->gs);
    float32x4_t p = vld1q_f32(A->param + i);
    float32x4_t m = vld1q_f32(A->exp_avg + i);
    float32x4_t v = vld1q_f32(A->exp_avg_sq + i);
    float32x4_t vu, d;
    if (A->l2) g = vaddq_f32(g, vmulq_f32(p, C->wd));
    if (A->decoupled) p = vmulq_f32(p, C->decay);
    d = vsubq_f32(g, m);
    m = vaddq_f32(vbslq_f32(C->hi, g, m), vmulq_f32(d, C->lerp_c));
    v = vaddq_f32(vmulq_f32(v, C->beta2), vmulq_f32(vmulq_f32(C->omb2, g), g));
    vu = v;
    if (A->max_exp_avg_sq) {
        float32x4_t vm = vld1q_f32(A->max_exp_avg_sq + i);
        uint32x4_t take = vorrq_u32(vcgtq_f32(v, vm), vmvnq_u32(vceqq_f32(v, v)));
        vm = vbslq_f32(take, v, vm);
        if (A->max_exp_avg_sq_out) vst1q_f32(A->max_exp_avg_sq_out + i, vm);
        vu = vm;
    }
    {
        float32x4_t den = vaddq_f32(div_bc2s(C, vsqrtq_f32(vu)), C->eps);
        p = vsubq_f32(p, vdivq_f32(vmulq_f32(C->step_size, m), den));
    }
    if (A->commit) vst1q_f32(A->param + i, p);
    if (A->exp_avg_out) {
        vst1q_f32(A->exp_avg_out + i, m);
        vst1q_f32(A->exp_avg_sq_out + i, v);
    }
    if (A->param_out) vst1q_f32(A->param_out + i, p);
    if (ldt == GA_BF16) vst1_u16((uint16_t *)A->lowp_out + i, cvt_bf16(p));
    if (ldt == GA_F16) vst1_u16((uint16_t *)A->lowp_out + i, vreinterpret_u16_f16(vcvt_f16_f32(p)));
}

AI void tail4(const ga_adam_args *A, const consts4 *C, int64_t i, int64_t r, int gdt, int ldt) {
    float pb[4] = {0}, mb[4] = {0}, vb[4] = {0}, vmb[4] = {0}, gb[4] = {0}, pob[4];
    uint16_t g16[4] = {0}, lb[4];
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
    step4(&T, C, 0, gdt, ldt);
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
    /* o->nt_ok is not read: no streaming stores (STNP) on ARM yet, untuned there */
    consts4 C;
    int64_t i = begin;
    C.gs = vdupq_n_f32(A->grad_scale);
    C.wd = vdupq_n_f32(A->weight_decay);
    C.decay = vdupq_n_f32(A->decay);
    C.lerp_c = vdupq_n_f32(A->lerp_c);
    C.beta2 = vdupq_n_f32(A->beta2);
    C.omb2 = vdupq_n_f32(A->one_minus_beta2);
    C.step_size = vdupq_n_f32(A->step_size);
    C.bc2s = vdupq_n_f32(A->bias_correction2_sqrt);
    C.bc2s_recip = vdupq_n_f32(o->bc2s_recip);
    C.recip = o->bc2s_recip != 0.0f;
    C.inf = vdupq_n_f32(__builtin_inff());
    C.eps = vdupq_n_f32(A->eps);
    C.hi = vdupq_n_u32(A->lerp_hi ? 0xFFFFFFFFu : 0u);
    for (; i + 8 <= end; i += 8) { /* 2x unroll: two independent dependency chains per iteration */
        step4(A, &C, i, gdt, ldt);
        step4(A, &C, i + 4, gdt, ldt);
    }
    for (; i + 4 <= end; i += 4) step4(A, &C, i, gdt, ldt);
    if (i < end) tail4(A, &C, i, end - i, gdt, ldt);
}

GA_DEFINE_ADAM_DISPATCH(adam_neon)

AI void acc16(const void *grad, int dt, float32x4_t vgs, int64_t i, float64x2_t acc[8]) {
    for (int q = 0; q < 4; q++) {
        float32x4_t f = vmulq_f32(ld_grad(grad, dt, i + 4 * q), vgs);
        float64x2_t lo = vcvt_f64_f32(vget_low_f32(f));
        float64x2_t hi = vcvt_high_f64_f32(f);
        acc[2 * q] = vaddq_f64(acc[2 * q], vmulq_f64(lo, lo));
        acc[2 * q + 1] = vaddq_f64(acc[2 * q + 1], vmulq_f64(hi, hi));
    }
}

AI void stats_block(const void *grad, int dt, float32x4_t vgs, int64_t s, int64_t e, double *out) {
    float64x2_t acc[8];
    double lanes[16];
    int64_t i = s;
    for (int k = 0; k < 8; k++) acc[k] = vdupq_n_f64(0.0);
    for (; i + 16 <= e; i += 16) acc16(grad, dt, vgs, i, acc);
    if (i < e) {
        float fb[16] = {0};
        uint16_t hb[16] = {0};
        if (dt == GA_F32) memcpy(fb, (const float *)grad + i, (size_t)(e - i) * 4);
        else memcpy(hb, (const uint16_t *)grad + i, (size_t)(e - i) * 2);
        acc16(dt == GA_F32 ? (const void *)fb : (const void *)hb, dt, vgs, 0, acc);
    }
    for (int k = 0; k < 8; k++) vst1q_f64(lanes + 2 * k, acc[k]);
    *out = ga_reduce16(lanes);
}

void ga_stats_neon(const void *grad, int32_t dt, float gs, int64_t n, int64_t b0, int64_t b1,
                   double *block_sums) {
    float32x4_t vgs = vdupq_n_f32(gs);
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * GA_STATS_BLOCK;
        int64_t e = s + GA_STATS_BLOCK < n ? s + GA_STATS_BLOCK : n;
        if (dt == GA_BF16) stats_block(grad, GA_BF16, vgs, s, e, block_sums + b);
        else if (dt == GA_F16) stats_block(grad, GA_F16, vgs, s, e, block_sums + b);
        else stats_block(grad, GA_F32, vgs, s, e, block_sums + b);
    }
}

static void stream7_neon(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
        float32x4_t x = vld1q_f32(b + i);
        vst1q_f32(a + i, vaddq_f32(vld1q_f32(a + i), x));
        vst1q_f32(c + i, vaddq_f32(vld1q_f32(c + i), x));
        vst1q_f32(d + i, vaddq_f32(vld1q_f32(d + i), x));
    }
    for (; i < end; i++) {
        a[i] += b[i];
        c[i] += b[i];
        d[i] += b[i];
    }
}

static int64_t divcheck_neon(float c, float r, const uint32_t *mant, int64_t n) {
    consts4 C;
    int64_t bad = 0;
    C.bc2s = vdupq_n_f32(c);
    C.bc2s_recip = vdupq_n_f32(r);
    C.inf = vdupq_n_f32(__builtin_inff());
    C.recip = 1;
    for (int64_t k = 0; k < n; k += 4) {
        uint32_t mb[4] = {0}, same[4];
        int live = n - k < 4 ? (int)(n - k) : 4;
        float32x4_t x;
        memcpy(mb, mant + k, (size_t)live * 4);
        x = vreinterpretq_f32_u32(vaddq_u32(vld1q_u32(mb), vdupq_n_u32(0x3F800000u)));
        vst1q_u32(same, vceqq_u32(vreinterpretq_u32_f32(div_bc2s(&C, x)), vreinterpretq_u32_f32(vdivq_f32(x, C.bc2s))));
        for (int l = 0; l < live; l++) bad += same[l] == 0;
    }
    return bad;
}

const ga_kernels ga_kernels_neon = {adam_neon, ga_stats_neon, stream7_neon, divcheck_neon};
