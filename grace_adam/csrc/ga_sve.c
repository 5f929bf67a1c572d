/* SVE path, vector-length agnostic: svwhilelt predicates cover the tail, so the body and the tail are
 * the same predicated instructions. Inactive lanes are loaded as zero and never stored. */
#include <arm_sve.h>
#include "ga_internal.h"

#define AI static inline __attribute__((always_inline))

AI svfloat32_t ld_grad(svbool_t pg, const void *g, int dt, int64_t i) {
    if (dt == GA_BF16) {
        svuint32_t h = svld1uh_u32(pg, (const uint16_t *)g + i); /* zero-extends into 32-bit lanes */
        return svreinterpret_f32_u32(svlsl_n_u32_x(pg, h, 16));
    }
    if (dt == GA_F16) {
        /* The half sits in the low 16 bits of each 32-bit container, which is what FCVT reads. */
        svuint32_t h = svld1uh_u32(pg, (const uint16_t *)g + i);
        return svcvt_f32_f16_x(pg, svreinterpret_f16_u32(h));
    }
    return svld1_f32(pg, (const float *)g + i);
}

AI svuint32_t cvt_bf16(svbool_t pg, svfloat32_t p) {
    svuint32_t u = svreinterpret_u32_f32(p);
    svuint32_t lsb = svand_n_u32_x(pg, svlsr_n_u32_x(pg, u, 16), 1);
    svuint32_t r = svlsr_n_u32_x(pg, svadd_u32_x(pg, svadd_n_u32_x(pg, u, 0x7FFF), lsb), 16);
    return svsel_u32(svcmpuo_f32(pg, p, p), svdup_n_u32(0x7FC0), r);
}

/* x / c for x >= +-0, +inf or NaN: through the reciprocal r when it is proven exact for this divisor
 * (ga_internal.h, GA_DIV_MANTISSAS; r != 0), else the divide instruction. Same bits either way. FNMLS and
 * FMLS are fused by definition: they are the division's two FMAs, not Adam's arithmetic. */
AI svfloat32_t div_bc2s(svbool_t pg, svfloat32_t x, svfloat32_t c, svfloat32_t r, int recip) {
    svfloat32_t q, e;
    if (!recip) return svdiv_f32_x(pg, x, c);
    q = svmul_f32_x(pg, x, r);
    e = svnmls_f32_x(pg, x, q, c); /* q * c - x: +0 when x = +-0, as on x86 */
    /* x < +inf is false only for +inf (e is NaN there; q is the quotient) and NaN (q is NaN) */
    return svsel_f32(svcmplt_f32(pg, x, svdup_n_f32(__builtin_inff())), svmls_f32_x(pg, q, e, r), q);
}

AI void adam_impl(const ga_adam_args *A, int64_t begin, int64_t end, int gdt, int ldt, const ga_pass *o) {
    /* o->nt_ok is not read: no streaming stores on ARM yet, untuned there */
    const svfloat32_t gs = svdup_n_f32(A->grad_scale), wd = svdup_n_f32(A->weight_decay);
    const svfloat32_t decay = svdup_n_f32(A->decay), lerp_c = svdup_n_f32(A->lerp_c);
    const svfloat32_t beta2 = svdup_n_f32(A->beta2), omb2 = svdup_n_f32(A->one_minus_beta2);
    const svfloat32_t step_size = svdup_n_f32(A->step_size), bc2s = svdup_n_f32(A->bias_correction2_sqrt);
    const svfloat32_t eps = svdup_n_f32(A->eps), bc2s_recip = svdup_n_f32(o->bc2s_recip);
    const int recip = o->bc2s_recip != 0.0f;
    const svbool_t hi = A->lerp_hi ? svptrue_b32() : svpfalse_b();
    const int64_t vl = (int64_t)svcntw();
    for (int64_t i = begin; i < end; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, end);
        svfloat32_t g = svmul_f32_x(pg, ld_grad(pg, A->grad, gdt, i), gs);
        svfloat32_t p = svld1_f32(pg, A->param + i);
        svfloat32_t m = svld1_f32(pg, A->exp_avg + i);
        svfloat32_t v = svld1_f32(pg, A->exp_avg_sq + i);
        svfloat32_t vu, d, den;
        if (A->l2) g = svadd_f32_x(pg, g, svmul_f32_x(pg, p, wd));
        if (A->decoupled) p = svmul_f32_x(pg, p, decay);
        d = svsub_f32_x(pg, g, m);
        m = svadd_f32_x(pg, svsel_f32(hi, g, m), svmul_f32_x(pg, d, lerp_c));
        v = svadd_f32_x(pg, svmul_f32_x(pg, v, beta2), svmul_f32_x(pg, svmul_f32_x(pg, omb2, g), g));
        vu = v;
        if (A->max_exp_avg_sq) {
            svfloat32_t vm = svld1_f32(pg, A->max_exp_avg_sq + i);
            svbool_t take = svorr_b_z(pg, svcmpgt_f32(pg, v, vm), svcmpuo_f32(pg, v, v));
            vm = svsel_f32(take, v, vm);
            if (A->max_exp_avg_sq_out) svst1_f32(pg, A->max_exp_avg_sq_out + i, vm);
            vu = vm;
        }
        den = svadd_f32_x(pg, div_bc2s(pg, svsqrt_f32_x(pg, vu), bc2s, bc2s_recip, recip), eps);
        p = svsub_f32_x(pg, p, svdiv_f32_x(pg, svmul_f32_x(pg, step_size, m), den));
        if (A->commit) svst1_f32(pg, A->param + i, p);
        if (A->exp_avg_out) {
            svst1_f32(pg, A->exp_avg_out + i, m);
            svst1_f32(pg, A->exp_avg_sq_out + i, v);
        }
        if (A->param_out) svst1_f32(pg, A->param_out + i, p);
        if (ldt == GA_BF16) svst1h_u32(pg, (uint16_t *)A->lowp_out + i, cvt_bf16(pg, p));
        if (ldt == GA_F16)
            svst1h_u32(pg, (uint16_t *)A->lowp_out + i, svreinterpret_u32_f16(svcvt_f16_f32_x(pg, p)));
    }
}

GA_DEFINE_ADAM_DISPATCH(adam_sve)

static void stream7_sve(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end) {
    const int64_t vl = (int64_t)svcntw();
    for (int64_t i = begin; i < end; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, end);
        svfloat32_t x = svld1_f32(pg, b + i);
        svst1_f32(pg, a + i, svadd_f32_x(pg, svld1_f32(pg, a + i), x));
        svst1_f32(pg, c + i, svadd_f32_x(pg, svld1_f32(pg, c + i), x));
        svst1_f32(pg, d + i, svadd_f32_x(pg, svld1_f32(pg, d + i), x));
    }
}

static int64_t divcheck_sve(float c, float r, const uint32_t *mant, int64_t n) {
    const svfloat32_t vc = svdup_n_f32(c), vr = svdup_n_f32(r);
    const int64_t vl = (int64_t)svcntw();
    int64_t bad = 0;
    for (int64_t k = 0; k < n; k += vl) {
        svbool_t pg = svwhilelt_b32_s64(k, n);
        svfloat32_t x = svreinterpret_f32_u32(svadd_n_u32_x(pg, svld1_u32(pg, mant + k), 0x3F800000u));
        svuint32_t got = svreinterpret_u32_f32(div_bc2s(pg, x, vc, vr, 1));
        svuint32_t want = svreinterpret_u32_f32(svdiv_f32_x(pg, x, vc));
        bad += (int64_t)svcntp_b32(pg, svcmpne_u32(pg, got, want));
    }
    return bad;
}

const ga_kernels ga_kernels_sve = {adam_sve, ga_stats_neon, stream7_sve, divcheck_sve};
