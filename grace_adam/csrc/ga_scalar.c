/* Scalar reference path. Compiled with -ffp-contract=off so the compiler never fuses mul+add: the SIMD
 * paths must reproduce this file bit for bit. */
#include <math.h>
#include "ga_internal.h"

static inline void adam_one(const ga_adam_args *a, int64_t i) {
    float g = ga_load_grad(a->grad, a->grad_dtype, i) * a->grad_scale;
    float p = a->param[i];
    float m = a->exp_avg[i];
    float v = a->exp_avg_sq[i];
    float vu;
    float d;
    if (a->l2) g = g + p * a->weight_decay;
    if (a->decoupled) p = p * a->decay;
    d = g - m;
    m = (a->lerp_hi ? g : m) + d * a->lerp_c;
    v = v * a->beta2 + (a->one_minus_beta2 * g) * g;
    vu = v;
    if (a->max_exp_avg_sq) {
        float vm = a->max_exp_avg_sq[i];
        vm = (v > vm || v != v) ? v : vm;
        if (a->max_exp_avg_sq_out) a->max_exp_avg_sq_out[i] = vm;
        vu = vm;
    }
    p = p - (a->step_size * m) / (sqrtf(vu) / a->bias_correction2_sqrt + a->eps);
    if (a->commit) a->param[i] = p;
    if (a->exp_avg_out) {
        a->exp_avg_out[i] = m;
        a->exp_avg_sq_out[i] = v;
    }
    if (a->param_out) a->param_out[i] = p;
    if (a->lowp_dtype == GA_BF16) ((uint16_t *)a->lowp_out)[i] = ga_f32_to_bf16(p);
    else if (a->lowp_dtype == GA_F16) ((uint16_t *)a->lowp_out)[i] = ga_f32_to_f16(p);
}

/* The reference divides, always (divcheck NULL): the SIMD paths' division through a reciprocal is
 * handed out only where it gives these bits. */
static void adam_scalar(const ga_adam_args *a, int64_t begin, int64_t end, const ga_pass *o) {
    /* A local copy: float stores through param/m/v may not alias these constants, so the compiler can
     * keep them in registers and hoist the loop-invariant branches. */
    const ga_adam_args A = *a;
    (void)o;
    for (int64_t i = begin; i < end; i++) adam_one(&A, i);
}

static void stats_scalar(const void *grad, int32_t dt, float gs, int64_t n, int64_t b0, int64_t b1,
                         double *block_sums) {
    for (int64_t b = b0; b < b1; b++) {
        double lanes[16] = {0};
        int64_t s = b * GA_STATS_BLOCK;
        int64_t e = s + GA_STATS_BLOCK < n ? s + GA_STATS_BLOCK : n;
        for (int64_t i = s; i < e; i++) {
            double x = (double)(ga_load_grad(grad, dt, i) * gs);
            lanes[i & 15] += x * x;
        }
        block_sums[b] = ga_reduce16(lanes);
    }
}

static void stream7_scalar(float *a, const float *b, float *c, float *d, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
        float x = b[i];
        a[i] += x;
        c[i] += x;
        d[i] += x;
    }
}

const ga_kernels ga_kernels_scalar = {adam_scalar, stats_scalar, stream7_scalar, NULL};
