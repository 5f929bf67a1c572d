/*
 * grace_adam: fused host Adam/AdamW step for flat fp32 buckets (plain C ABI, no torch/Python).
 *
 * Exactness contract (see docs/grace_adam.md): every element is computed with the same sequence of
 * IEEE-754 single-precision operations (no FMA contraction anywhere, sqrt and division correctly
 * rounded, round-to-nearest-even, no flush-to-zero) on every ISA path, SIMD body and tail, thread count
 * and bucket split, so results are bit-identical for finite inputs.
 */
#ifndef GRACE_ADAM_H
#define GRACE_ADAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the struct below or the exported functions change (3: ga_sizeof_adam_args,
 * ga_status_name; 4: ga_set_affinity, ga_get_affinity, ga_first_touch, ga_set_nt_threshold,
 * ga_get_nt_threshold; 5: ga_set_div_by_recip, ga_divisor_recip, ga_divisor_check, ga_set_prefetch,
 * ga_get_prefetch). The Python loader refuses a library with another version. */
#define GA_ABI_VERSION 5

#if defined(__GNUC__)
#define GA_API __attribute__((visibility("default")))
#else
#define GA_API
#endif

/* Element types of the gradient and of the low-precision output copy. */
enum ga_dtype { GA_F32 = 0, GA_BF16 = 1, GA_F16 = 2, GA_NONE = 3 };

/* Instruction-set paths; the bit (1u << isa) is used in masks. */
enum ga_isa { GA_ISA_SCALAR = 0, GA_ISA_AVX2 = 1, GA_ISA_AVX512 = 2, GA_ISA_NEON = 3, GA_ISA_SVE = 4, GA_ISA_COUNT = 5 };

enum ga_status { GA_OK = 0, GA_EINVAL = -1, GA_EUNSUPPORTED = -2, GA_ENOMEM = -3, GA_ETHREAD = -4 };

/*
 * One Adam step over n elements. All scalar constants are computed once by the host (in double, then
 * rounded to float) so every thread and ISA uses identical values. Per element i (all fp32 ops):
 *
 *   g  = to_f32(grad[i]) * grad_scale
 *   p  = param[i]
 *   if (l2)        g = g + p * weight_decay          (Adam, coupled weight decay)
 *   if (decoupled) p = p * decay                     (AdamW: decay = 1 - lr * weight_decay)
 *   d  = g - m;  m = (lerp_hi ? g : m) + d * lerp_c  (torch's lerp; lerp_c = w or -(1 - w), w = 1 - beta1)
 *   v  = v * beta2 + (one_minus_beta2 * g) * g
 *   if (amsgrad)   vmax = (v > vmax || v != v) ? v : vmax;  v_used = vmax   else v_used = v
 *   den = sqrt(v_used) / bias_correction2_sqrt + eps
 *   p  = p - (step_size * m) / den
 *
 * commit != 0: param, exp_avg, exp_avg_sq (and max_exp_avg_sq) are written in place; the *_out state
 *   pointers must be NULL.
 * commit == 0: the inputs are never written (speculative step). Either only param_out / lowp_out are
 *   written (deferred commit: a later commit != 0 call recomputes the same bits), or, with exp_avg_out
 *   and exp_avg_sq_out (and max_exp_avg_sq_out under amsgrad) and param_out all given, the whole new
 *   state goes to those separate buffers (double-buffered state: committing is swapping buffers).
 * param_out (fp32) and lowp_out (bf16/fp16, round-to-nearest-even of the new p) are optional.
 */
typedef struct ga_adam_args {
    float *param;
    const void *grad;
    float *exp_avg;
    float *exp_avg_sq;
    float *max_exp_avg_sq; /* NULL unless amsgrad */
    float *param_out;      /* optional */
    void *lowp_out;        /* optional */
    int64_t n;
    int32_t grad_dtype;    /* GA_F32 / GA_BF16 / GA_F16 */
    int32_t lowp_dtype;    /* GA_BF16 / GA_F16, or GA_NONE */
    int32_t commit;
    int32_t decoupled;
    int32_t l2;
    int32_t lerp_hi;
    float grad_scale;
    float weight_decay;
    float decay;
    float lerp_c;
    float beta2;
    float one_minus_beta2;
    float step_size;
    float bias_correction2_sqrt;
    float eps;
    float *exp_avg_out;        /* commit == 0 only: new exp_avg (out-of-place step) */
    float *exp_avg_sq_out;     /* with exp_avg_out */
    float *max_exp_avg_sq_out; /* with exp_avg_out when amsgrad */
} ga_adam_args;

GA_API int ga_abi_version(void);
/* sizeof(ga_adam_args) as this library was compiled: a binding that mirrors the struct checks its own
 * layout against it (the version alone cannot catch a mirror edited out of step). */
GA_API size_t ga_sizeof_adam_args(void);
/* Name and meaning of a ga_status, e.g. "GA_EINVAL (invalid argument)"; "unknown status" otherwise. */
GA_API const char *ga_status_name(int status);

/* nthreads <= 0 means the library default (ga_set_num_threads). Returns a ga_status. */
GA_API int ga_adam_step(const ga_adam_args *args, int nthreads);

/*
 * Sum of squares of (to_f32(grad[i]) * grad_scale) accumulated in fp64, and whether all of those are
 * finite. Deterministic: fixed blocks of GA_STATS_BLOCK elements, 16 interleaved lanes per block reduced
 * in a fixed tree, block sums added in order, so the result depends on neither threads nor ISA.
 */
#define GA_STATS_BLOCK 16384
GA_API int ga_grad_stats(const void *grad, int32_t dtype, int64_t n, float grad_scale, int nthreads,
                         double *norm2, int32_t *all_finite);

/*
 * ga_adam_step and, in the same pass over memory, ga_grad_stats of the gradient as the step uses it
 * (grad_scale applied): each GA_STATS_BLOCK block is reduced and then stepped while it is still in cache.
 * norm2 / all_finite are bit-identical to ga_grad_stats(grad, grad_dtype, n, grad_scale).
 */
GA_API int ga_adam_step_stats(const ga_adam_args *args, int nthreads, double *norm2, int32_t *all_finite);

/* Roofline probe with Adam's memory pattern (read 4 fp32 streams, write 3): a+=b, c+=b, d+=b. */
GA_API int ga_stream7(float *a, const float *b, float *c, float *d, int64_t n, int nthreads);

GA_API int ga_set_num_threads(int n);
GA_API int ga_get_num_threads(void);

/*
 * Pin the pool (Linux): worker k runs on cpus[(k-1) % n] and the calling thread takes no share of the
 * work (it waits), so a job runs on exactly these CPUs; also sets the default thread count to n. Each CPU
 * must be in the process's affinity mask (GA_EINVAL otherwise). n == 0 unpins: workers may run anywhere
 * in the mask again and the caller works again (the thread count is left as it is). Elsewhere: n == 0 is
 * GA_OK, pinning is GA_EUNSUPPORTED and changes nothing. Results never depend on pinning.
 */
GA_API int ga_set_affinity(const int32_t *cpus, int n);
/* The pinned CPUs: copies up to cap of them to cpus, returns how many there are (0: not pinned). */
GA_API int ga_get_affinity(int32_t *cpus, int cap);

/*
 * Zero n elements of elem_size bytes (1, 2, 4 or 8) at p, each home range written by the thread that an
 * Adam pass over n fp32 elements with the same nthreads gives that range first, so that on a NUMA host
 * the pages of a fresh (never touched) allocation land on the node of the thread that will step them.
 * Useful with pinned threads (ga_set_affinity): unpinned threads may move between nodes.
 */
GA_API int ga_first_touch(void *p, int64_t n, int32_t elem_size, int nthreads);

/*
 * Streaming (non-temporal) stores are used for the outputs a pass writes but does not read (out-of-place
 * state, param_out, lowp_out) only when the pass moves at least this many bytes in all (reads + writes):
 * a smaller bucket stays in cache, where plain stores leave its outputs for their next reader. The
 * default is the last-level cache size (sysconf), 32 MiB where unknown, or GRACE_ADAM_NT_THRESHOLD
 * (bytes) when set; 0 = always, a huge value = never. Values are the same either way.
 */
GA_API int ga_set_nt_threshold(int64_t bytes);
GA_API int64_t ga_get_nt_threshold(void);
/* Minimum elements per thread before another thread is used (tests lower it to exercise splits). */
GA_API int ga_set_min_chunk(int64_t n);
/*
 * The SIMD paths divide by bias_correction2_sqrt through its reciprocal and two FMAs (one divide per
 * element fewer) when that gives the IEEE quotient for every input, which is checked once per (ISA,
 * divisor) over 2^23 inputs; the values are the same bits either way. ga_set_div_by_recip(0), or
 * GRACE_ADAM_DIV=divide at load, makes every pass divide (A/B measurements).
 * ga_divisor_recip: the reciprocal the current ISA's passes use for c (0: they divide).
 * ga_divisor_check: how many inputs x in [1, 2) the ISA's division by c through r gets wrong: all 2^23
 * of them (exhaustive; spread over nthreads), or the few thousand near a rounding midpoint that decide it
 * (what the library checks; ga_internal.h says why). < 0: GA_EUNSUPPORTED for an ISA that always divides
 * (scalar) or is not available, GA_EINVAL for a c that is not a positive normal float.
 */
/* Software prefetch distance in elements of the x86 passes (AVX-512: every pass; AVX2: passes larger than
 * the last-level cache); 0 = none. Default 512, or GRACE_ADAM_PREFETCH at load. Values are the same. */
GA_API int ga_set_prefetch(int64_t elements);
GA_API int64_t ga_get_prefetch(void);
GA_API int ga_set_div_by_recip(int on);
GA_API float ga_divisor_recip(float c);
GA_API int64_t ga_divisor_check(int isa, float c, float r, int exhaustive, int nthreads);
GA_API int ga_set_isa(int isa); /* GA_EUNSUPPORTED if not compiled in or not supported by this CPU */
GA_API int ga_get_isa(void);
GA_API unsigned ga_supported_isas(void); /* compiled in AND supported by the CPU */
GA_API unsigned ga_compiled_isas(void);
GA_API const char *ga_isa_name(int isa);
GA_API int ga_isa_from_name(const char *name); /* -1 if unknown */

#ifdef __cplusplus
}
#endif
#endif
