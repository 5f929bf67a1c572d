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

AI void adam_impl(const ga_adam_args *A, int64_t begin, int64_t end, int gdt, int ldt, int nt_ok) {
    (void)nt_ok; /* no streaming stores on ARM yet: untuned there */
    const svfloat32_t gs = svdup_n_f32(A->grad_scale), wd = svdup_n_f32(A->weight_decay);
    const svfloat32_t decay = svdup_n_f32(A->decay), lerp_c = svdup_n_f32(A->lerp_c);
    const svfloat32_t beta2 = svdup_n_f32(A->beta2), omb2 = svdup_n_f32(A->one_minus_beta2);
    const svfloat32_t step_size = svdup_n_f32(A->step_size), bc2s = svdup_n_f32(A->bias_correction2_sqrt);
    const svfloat32_t eps = svdup_n_f32(A->eps);
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
        den = svadd_f32_x(pg, svdiv_f32_x(pg, svsqrt_f32_x(pg, vu), bc2s), eps);
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

const ga_kernels ga_kernels_sve = {adam_sve, ga_stats_neon, stream7_sve};
