/* Self-test driver: every supported ISA path must equal the scalar path bit for bit, for odd sizes
 * (SIMD tails), several thread counts and bucket splits, all grad / low-precision dtypes and the
 * Adam variants; also that the library was built from this header (ABI version, struct size).
 * Built with `python grace_adam/build.py --selftest tests/grace_adam/csrc/ga_selftest.c`; run natively by
 * tests/grace_adam/test_build.py and under qemu (NEON, SVE at several vector lengths) by
 * scripts/arm_test.sh. Exit status 0 = pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grace_adam.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static float uniform(void) { return (float)(next32() & 0xFFFFFF) / 16777216.0f; }

/* Values spread over many binades, with some zeros and fp32 subnormals. */
static float wild(void) {
    uint32_t r = next32() % 64;
    float x = (uniform() - 0.5f) * ldexpf(1.0f, (int)(next32() % 40) - 30);
    if (r == 0) return 0.0f;
    if (r == 1) return ldexpf(uniform(), -140); /* subnormal */
    return x;
}

static uint16_t f32_to_bf16_trunc(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16_approx(float f) {
    /* Any bit pattern that is a finite half is fine as a test input. */
    uint16_t h = (uint16_t)(next32() & 0x7BFF);
    (void)f;
    if (next32() & 1) h |= 0x8000;
    return h;
}

typedef struct {
    float *p, *m, *v, *vm, *po, *m2, *v2, *vm2; /* m2/v2/vm2: out-of-place state outputs */
    void *g;
    uint16_t *lo;
} bufs;

/* 64-byte aligned (as torch allocates), so the streaming-store paths run; sub-slices at odd offsets
 * (the split runs) take the plain-store paths. */
static void *alloc64(size_t bytes) { return aligned_alloc(64, (bytes + 127) / 64 * 64); }

static void alloc_bufs(bufs *b, int64_t n) {
    b->p = alloc64(n * 4);
    b->m = alloc64(n * 4);
    b->v = alloc64(n * 4);
    b->vm = alloc64(n * 4);
    b->po = alloc64(n * 4);
    b->g = alloc64(n * 4);
    b->lo = alloc64(n * 2);
    b->m2 = alloc64(n * 4);
    b->v2 = alloc64(n * 4);
    b->vm2 = alloc64(n * 4);
}

static void free_bufs(bufs *b) {
    free(b->p), free(b->m), free(b->v), free(b->vm), free(b->po), free(b->g), free(b->lo);
    free(b->m2), free(b->v2), free(b->vm2);
}

static int failures = 0;

static void check(int ok, const char *what, const char *isa, int64_t n, int threads, int cfg) {
    if (!ok) {
        failures++;
        if (failures < 20) fprintf(stderr, "FAIL %s isa=%s n=%lld threads=%d cfg=%d\n", what, isa, (long long)n, threads, cfg);
    }
}

/* mode 0: as cfg says (commit or speculative); 1: out-of-place step into m2/v2/vm2/po, then copied to
 * p/m/v/vm so the caller compares it with an in-place commit; 2: in-place commit through
 * ga_adam_step_stats, whose statistics go to *norm2 / *finite. */
static void run_once(const bufs *in, bufs *out, int64_t n, int cfg, int gdt, int ldt, int threads, int split,
                     int mode, double *norm2, int32_t *finite) {
    ga_adam_args a;
    memcpy(out->p, in->p, n * 4);
    memcpy(out->m, in->m, n * 4);
    memcpy(out->v, in->v, n * 4);
    memcpy(out->vm, in->vm, n * 4);
    memset(out->po, 0, n * 4);
    memset(out->lo, 0, n * 2);
    memset(&a, 0, sizeof(a));
    a.param = out->p;
    a.grad = in->g;
    a.exp_avg = out->m;
    a.exp_avg_sq = out->v;
    a.max_exp_avg_sq = (cfg & 4) ? out->vm : NULL;
    a.param_out = (cfg & 8) ? out->po : NULL;
    a.lowp_out = ldt == GA_NONE ? NULL : out->lo;
    a.grad_dtype = gdt;
    a.lowp_dtype = ldt;
    a.commit = (cfg & 16) ? 0 : 1;
    if (!a.commit && !a.param_out && ldt == GA_NONE) a.param_out = out->po;
    a.decoupled = cfg & 1;
    a.l2 = (cfg & 2) != 0;
    a.lerp_hi = (cfg & 32) != 0;
    a.grad_scale = (cfg & 64) ? 0.125f : 1.0f;
    a.weight_decay = 0.1f;
    a.decay = 1.0f - 1e-3f * 0.1f;
    a.lerp_c = a.lerp_hi ? -0.3f : 0.1f;
    a.beta2 = 0.999f;
    a.one_minus_beta2 = 1.0f - 0.999f;
    a.step_size = 1e-3f / 0.19f;
    a.bias_correction2_sqrt = 0.0447f;
    a.eps = 1e-8f;
    if (mode == 1) {
        a.commit = 0;
        a.param_out = out->po;
        a.exp_avg_out = out->m2;
        a.exp_avg_sq_out = out->v2;
        a.max_exp_avg_sq_out = a.max_exp_avg_sq ? out->vm2 : NULL;
    }
    if (mode == 2) a.commit = 1;
    if (mode == 2) {
        a.n = n;
        if (ga_adam_step_stats(&a, threads, norm2, finite) != GA_OK) failures++;
    } else if (split <= 0 || split >= n) {
        a.n = n;
        if (ga_adam_step(&a, threads) != GA_OK) failures++;
    } else { /* the same bucket as two calls on sub-slices */
        ga_adam_args b = a;
        a.n = split;
        b.n = n - split;
        b.param += split, b.exp_avg += split, b.exp_avg_sq += split;
        if (b.max_exp_avg_sq) b.max_exp_avg_sq += split;
        if (b.param_out) b.param_out += split;
        if (b.exp_avg_out) b.exp_avg_out += split, b.exp_avg_sq_out += split;
        if (b.max_exp_avg_sq_out) b.max_exp_avg_sq_out += split;
        if (b.lowp_out) b.lowp_out = (uint16_t *)b.lowp_out + split;
        b.grad = (const char *)b.grad + (gdt == GA_F32 ? 4 : 2) * split;
        if (ga_adam_step(&a, threads) != GA_OK || ga_adam_step(&b, threads) != GA_OK) failures++;
    }
    if (mode == 1) { /* the inputs must be untouched; then present the new state where mode 0 puts it */
        if (memcmp(out->p, in->p, n * 4) || memcmp(out->m, in->m, n * 4) || memcmp(out->v, in->v, n * 4) ||
            memcmp(out->vm, in->vm, n * 4))
            failures++;
        memcpy(out->p, out->po, n * 4);
        memcpy(out->m, out->m2, n * 4);
        memcpy(out->v, out->v2, n * 4);
        if (a.max_exp_avg_sq) memcpy(out->vm, out->vm2, n * 4);
    }
}

static int same(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* The SIMD paths divide by bias_correction2_sqrt through its reciprocal where the library proved that
 * exact (grace_adam.h, ga_divisor_check): they must take it for a usual divisor, the check must be able to
 * fail (a reciprocal 4 ulps off), and the special quotients (+-0, +inf, NaN, subnormal v, eps = -0
 * where the sign of a zero quotient reaches p) must equal the scalar path's division bit for bit. */
static void recip_division_checks(unsigned sup, int quick) {
    enum { N = 67 };
    static const float vs[] = {0.0f, INFINITY, 1e-45f, 1e-40f, 3.4e38f, 1e-30f, 2.5f, 0.0f};
    static const float cs[] = {0.0447f, 0.0316227f, 0.7071068f, 1.0f};
    bufs in, ref, got;
    alloc_bufs(&in, N), alloc_bufs(&ref, N), alloc_bufs(&got, N);
    for (int isa = 1; isa < GA_ISA_COUNT; isa++) {
        if (!(sup & (1u << isa))) continue;
        ga_set_isa(isa);
        for (size_t k = 0; k < sizeof(cs) / sizeof(cs[0]); k++) {
            float r = ga_divisor_recip(cs[k]);
            check(r == 1.0f / cs[k], "reciprocal taken", ga_isa_name(isa), 0, 0, (int)k);
        }
        /* a reciprocal 4 ulps off fails for some inputs, all of them near a midpoint still (ga_internal.h):
         * the library's near-midpoint check must count exactly the failures the exhaustive check finds
         * (quick, i.e. under an emulator: the exhaustive 2^23 inputs on the widest path only) */
        {
            float c = 0.0447f, r = 1.0f / c;
            int64_t all, near;
            for (int k = 0; k < 4; k++) r = nextafterf(r, 0.0f);
            near = ga_divisor_check(isa, c, r, 0, 1);
            all = (!quick || (sup >> (isa + 1)) == 0) ? ga_divisor_check(isa, c, r, 1, 2) : near;
            check(near > 0 && near == all, "check can fail", ga_isa_name(isa), all, (int)near, 0);
        }
    }
    for (int64_t i = 0; i < N; i++) {
        in.p[i] = wild() * 1e3f;
        in.m[i] = (i % 5 == 0) ? 0.0f : wild();
        in.v[i] = vs[i % 8];
        in.vm[i] = (i % 3 == 0) ? -0.0f : in.v[i];
        ((float *)in.g)[i] = (i % 4 == 0) ? 0.0f : wild();
    }
    for (int cfg = 0; cfg < 8; cfg++) {
        ga_adam_args a;
        memset(&a, 0, sizeof(a));
        a.n = N;
        a.grad_dtype = GA_F32;
        a.lowp_dtype = GA_NONE;
        a.commit = 1;
        a.grad_scale = 1.0f;
        a.decay = 1.0f;
        a.lerp_c = 0.1f;
        a.beta2 = (cfg & 4) ? 0.0f : 0.999f; /* beta2 = 0: v = g * g, the zeros and subnormals reach sqrt */
        a.one_minus_beta2 = 1.0f - a.beta2;
        a.step_size = 1e-3f;
        a.bias_correction2_sqrt = (cfg & 4) ? 1.0f : 0.0447f;
        a.eps = (cfg & 1) ? -0.0f : 1e-8f; /* -0: den = x / c + eps keeps the sign of a zero quotient */
        for (int isa = 0; isa < GA_ISA_COUNT; isa++) {
            bufs *o = isa == 0 ? &ref : &got;
            if (!(sup & (1u << isa))) continue;
            memcpy(o->p, in.p, N * 4), memcpy(o->m, in.m, N * 4), memcpy(o->v, in.v, N * 4);
            memcpy(o->vm, in.vm, N * 4);
            a.param = o->p, a.exp_avg = o->m, a.exp_avg_sq = o->v, a.grad = in.g;
            a.max_exp_avg_sq = (cfg & 2) ? o->vm : NULL;
            ga_set_isa(isa);
            if (ga_adam_step(&a, 1) != GA_OK) failures++;
            if (isa)
                check(same(ref.p, got.p, N * 4) && same(ref.m, got.m, N * 4) && same(ref.v, got.v, N * 4) &&
                          same(ref.vm, got.vm, N * 4),
                      "special quotients", ga_isa_name(isa), N, 1, cfg);
        }
    }
    free_bufs(&in), free_bufs(&ref), free_bufs(&got);
}

int main(int argc, char **argv) {
    static const int64_t sizes[] = {1, 3, 7, 15, 16, 17, 31, 33, 63, 65, 1000, 1003, 4099, 40001};
    static const int thread_counts[] = {1, 2, 3, 4};
    /* "quick" (for emulators): fewer configurations, sizes and thread counts; same checks. */
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    size_t nsizes = quick ? 13 : sizeof(sizes) / sizeof(sizes[0]);
    size_t nthr = quick ? 3 : 4;
    int cfg_stride = quick ? 7 : 1;
    unsigned sup = ga_supported_isas();
    int64_t nmax = 40001;
    bufs in, ref, got;
    int isa;
    if (ga_abi_version() != GA_ABI_VERSION || ga_sizeof_adam_args() != sizeof(ga_adam_args)) {
        printf("FAIL: library ABI %d / ga_adam_args %zu bytes, this header ABI %d / %zu bytes\n",
               ga_abi_version(), ga_sizeof_adam_args(), GA_ABI_VERSION, sizeof(ga_adam_args));
        return 1;
    }
    ga_set_min_chunk(16); /* use several threads even on small arrays */
    alloc_bufs(&in, nmax);
    alloc_bufs(&ref, nmax);
    alloc_bufs(&got, nmax);
    printf("default ISA path: %s; supported:", ga_isa_name(ga_get_isa()));
    for (isa = 0; isa < GA_ISA_COUNT; isa++)
        if (sup & (1u << isa)) printf(" %s", ga_isa_name(isa));
    printf("\n");
    for (size_t si = 0; si < nsizes; si++) {
        int64_t n = sizes[si];
        for (int gdt = GA_F32; gdt <= GA_F16; gdt++) {
            for (int64_t i = 0; i < n; i++) {
                in.p[i] = wild() * 1e3f;
                in.m[i] = wild();
                in.v[i] = fabsf(wild()) * fabsf(wild());
                in.vm[i] = (next32() & 1) ? in.v[i] * 1.5f : in.v[i] * 0.5f;
                if (gdt == GA_F32) ((float *)in.g)[i] = wild();
                else if (gdt == GA_BF16) ((uint16_t *)in.g)[i] = f32_to_bf16_trunc(wild());
                else ((uint16_t *)in.g)[i] = f32_to_f16_approx(0.0f);
            }
            for (int ldt = GA_BF16; ldt <= GA_NONE; ldt++) {
                if (ldt == GA_F32) continue;
                for (int cfg = 0; cfg < 128; cfg += (n > 5000 ? 13 : cfg_stride)) {
                    ga_set_isa(GA_ISA_SCALAR);
                    run_once(&in, &ref, n, cfg, gdt, ldt, 1, 0, 0, NULL, NULL);
                    for (isa = 0; isa < GA_ISA_COUNT; isa++) {
                        if (!(sup & (1u << isa))) continue;
                        ga_set_isa(isa);
                        for (size_t ti = 0; ti < nthr; ti++) {
                            int th = thread_counts[ti];
                            int split = (int)((cfg + ti) % 3 == 0 ? n / 3 + 1 : 0);
                            run_once(&in, &got, n, cfg, gdt, ldt, th, split, 0, NULL, NULL);
                            check(same(ref.p, got.p, n * 4) && same(ref.m, got.m, n * 4) &&
                                      same(ref.v, got.v, n * 4) && same(ref.vm, got.vm, n * 4),
                                  "state", ga_isa_name(isa), n, th, cfg);
                            check(same(ref.po, got.po, n * 4), "param_out", ga_isa_name(isa), n, th, cfg);
                            if (ldt != GA_NONE)
                                check(same(ref.lo, got.lo, n * 2), "lowp_out", ga_isa_name(isa), n, th, cfg);
                        }
                    }
                }
            }
            /* out-of-place step and step + statistics: the same bits as the in-place step, and the same
             * statistics as ga_grad_stats; every ISA, thread count (and split, out-of-place) */
            for (int cfg = 0; cfg < 128; cfg += 37) {
                int ldt = cfg % 2 ? GA_BF16 : GA_NONE;
                int c = cfg & ~16; /* committing configurations only */
                double r2 = 0, g2 = 0;
                int32_t rf = 0, gf = 0;
                ga_set_isa(GA_ISA_SCALAR);
                run_once(&in, &ref, n, c, gdt, ldt, 1, 0, 0, NULL, NULL);
                ga_grad_stats(in.g, gdt, n, (c & 64) ? 0.125f : 1.0f, 1, &r2, &rf);
                for (isa = 0; isa < GA_ISA_COUNT; isa++) {
                    if (!(sup & (1u << isa))) continue;
                    ga_set_isa(isa);
                    for (size_t ti = 0; ti < nthr; ti++) {
                        int th = thread_counts[ti];
                        for (int mode = 1; mode <= 2; mode++) {
                            run_once(&in, &got, n, c, gdt, ldt, th, mode == 1 && ti % 2 ? n / 3 + 1 : 0, mode,
                                     &g2, &gf);
                            check(same(ref.p, got.p, n * 4) && same(ref.m, got.m, n * 4) &&
                                      same(ref.v, got.v, n * 4) && same(ref.vm, got.vm, n * 4),
                                  mode == 1 ? "out-of-place state" : "step_stats state", ga_isa_name(isa), n, th, c);
                            if (mode == 2)
                                check(memcmp(&r2, &g2, 8) == 0 && rf == gf, "step_stats stats", ga_isa_name(isa), n,
                                      th, c);
                        }
                    }
                }
            }
            /* gradient statistics: identical for every ISA and thread count */
            for (int k = 0; k < 2; k++) {
                int64_t ns = k ? 3 * GA_STATS_BLOCK + 17 : n;
                double r2 = 0, g2 = 0;
                int32_t rf = 0, gf = 0;
                void *gbuf = k ? malloc(ns * 4) : in.g;
                if (k)
                    for (int64_t i = 0; i < ns; i++) {
                        if (gdt == GA_F32) ((float *)gbuf)[i] = wild();
                        else ((uint16_t *)gbuf)[i] = f32_to_bf16_trunc(wild());
                    }
                ga_set_isa(GA_ISA_SCALAR);
                ga_grad_stats(gbuf, gdt, ns, 0.5f, 1, &r2, &rf);
                for (isa = 0; isa < GA_ISA_COUNT; isa++) {
                    if (!(sup & (1u << isa))) continue;
                    ga_set_isa(isa);
                    for (int th = 1; th <= 4; th++) {
                        ga_grad_stats(gbuf, gdt, ns, 0.5f, th, &g2, &gf);
                        check(memcmp(&r2, &g2, 8) == 0 && rf == gf, "grad_stats", ga_isa_name(isa), ns, th, gdt);
                    }
                }
                if (k) free(gbuf);
            }
        }
    }
    free_bufs(&in), free_bufs(&ref), free_bufs(&got);
    recip_division_checks(sup, quick);
    if (failures) {
        printf("FAIL: %d mismatches\n", failures);
        return 1;
    }
    printf("PASS: all ISA paths bit-identical to scalar\n");
    return 0;
}
