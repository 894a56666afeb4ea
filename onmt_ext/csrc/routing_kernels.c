/* Fused CPU kernels of onmt-ext's routing core (onmt_ext/routing.py) and of its clause attention
 * (onmt_ext/clause_attention.py), loaded by onmt_ext/kernels.py.
 *
 * routing_impl.h and clause_impl.h hold the arithmetic; each is included once for float and
 * once for double (the tests compare gradients in double).  Every exported
 * function splits the groups G over `threads` POSIX threads (no OpenMP, so
 * that no second OpenMP runtime meets torch's) and returns 0, or -1 when a
 * working buffer could not be allocated.  The routing entry points take a last flag, `lanes`, that runs the
 * lane-wise code (routing_impl.h) instead of the per-problem code; onmt_ext/kernels.py sets it by size.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* the constants of onmt_ext/routing.py */
#define NORM_EPS 1e-12
#define MIN_TOTAL 1e-6
#define LOG_2PI 1.8378770664093453
#define HALF_1_LOG_2PI 1.4189385332046727 /* (1 + log 2 pi) / 2 */
/* Exponentials of arguments below -EXP_FLOOR are 0 to float precision next to a softmax row's largest (1);
 * they are set to 0, and the argument is clamped before the exp, because glibc's vector exp takes a slow
 * scalar path for huge negative arguments (masked scores of -1e18; EM log-densities of collapsed Gaussians,
 * which made li2019's EM kernel 4-5 times slower inside a trained layer than on random votes). */
#define EXP_FLOOR 80

/* Four instantiations: float and double, each with the capsule size D read at run time and with D = 1
 * fixed at compile time (li2019's N = d_model capsules of one dimension), where every loop over D
 * disappears and the loops over the outputs vectorise. */
#define EXP expf
#define LOG logf
#define LOG1P log1pf
#define SQRT sqrtf
#define real float
#define FIXED_D(d) (d)
#define FN(name) name##_f32
#include "routing_impl.h"
#include "clause_impl.h"
#undef FN
#undef FIXED_D
#define FIXED_D(d) ((void)(d), (int64_t)1)
#define FN(name) name##_f32_d1
#include "routing_impl.h"
#undef FN
#undef FIXED_D
#undef real
#undef EXP
#undef LOG
#undef LOG1P
#undef SQRT

#define EXP exp
#define LOG log
#define LOG1P log1p
#define SQRT sqrt
#define real double
#define FIXED_D(d) (d)
#define FN(name) name##_f64
#include "routing_impl.h"
#include "clause_impl.h"
#undef FN
#undef FIXED_D
#define FIXED_D(d) ((void)(d), (int64_t)1)
#define FN(name) name##_f64_d1
#include "routing_impl.h"
#undef FN
#undef FIXED_D
#undef real

/* ------------------------------------------------------------ splitting the groups over threads */

typedef int (*group_fn)(const void *args, int64_t g0, int64_t g1);

typedef struct {
    group_fn fn;
    const void *args;
    int64_t g0, g1;
    int status, threaded;
    pthread_t id;
} slice;

static void *run_slice(void *p)
{
    slice *s = p;
    s->status = s->fn(s->args, s->g0, s->g1);
    return NULL;
}

/* fn over the groups [0, groups), split into `threads` contiguous slices; 0, or -1 if any slice failed */
static int run(group_fn fn, const void *args, int64_t groups, int threads)
{
    enum { MAX_THREADS = 64 };
    slice slices[MAX_THREADS];
    if (threads > groups) threads = (int)groups;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1) return fn(args, 0, groups);
    for (int k = 0; k < threads; k++) {
        slices[k] = (slice){.fn = fn, .args = args, .g0 = groups * k / threads, .g1 = groups * (k + 1) / threads};
        /* slice 0 runs on the calling thread; a thread that cannot start runs its slice here too */
        if (k > 0) slices[k].threaded = pthread_create(&slices[k].id, NULL, run_slice, &slices[k]) == 0;
    }
    for (int k = 0; k < threads; k++)
        if (!slices[k].threaded) run_slice(&slices[k]);
    int status = 0;
    for (int k = 0; k < threads; k++) {
        if (slices[k].threaded) pthread_join(slices[k].id, NULL);
        status |= slices[k].status;
    }
    return status;
}

/* ------------------------------------------------------------ exported entry points */

#define EXPORT_SIMPLE(SUF, T_)                                                                                    \
    static int simple_fw_##SUF(const void *a, int64_t g0, int64_t g1) { return simple_forward_groups_##SUF(a, g0, g1); } \
    static int simple_bw_##SUF(const void *a, int64_t g0, int64_t g1) { return simple_backward_groups_##SUF(a, g0, g1); }\
    /* lane-wise for problems with their own votes (S = 1); shared votes keep their own code */                   \
    static int simple_fl_##SUF(const void *a, int64_t g0, int64_t g1)                                              \
    {                                                                                                              \
        const simple_args_##SUF *s = a;                                                                            \
        return s->S > 1 ? simple_forward_groups_##SUF(a, g0, g1) : simple_forward_lanes_##SUF(a, g0, g1);          \
    }                                                                                                              \
    static int simple_bl_##SUF(const void *a, int64_t g0, int64_t g1)                                              \
    {                                                                                                              \
        const simple_args_##SUF *s = a;                                                                            \
        return s->S > 1 ? simple_backward_groups_##SUF(a, g0, g1) : simple_backward_lanes_##SUF(a, g0, g1);        \
    }                                                                                                              \
    /* reals per problem of the state the shared-vote forward pass keeps for the backward pass (S > 1) */          \
    int64_t simple_routing_state_size_##SUF(int64_t I, int64_t O, int64_t D, int T)                               \
    {                                                                                                              \
        return shared_state_size_##SUF(I, O, D, T);                                                                \
    }                                                                                                              \
    /* state: NULL, or (G S state_size) reals (S > 1 only) that the backward pass then reads instead of            \
     * recomputing the iterations */                                                                               \
    int simple_routing_forward_##SUF(const T_ *v, const T_ *keep, const T_ *init, T_ *out, T_ *logits, T_ *state,  \
                                     int64_t G, int64_t S, int64_t I, int64_t O, int64_t D, int T,                 \
                                     int normalize_inputs, int weighted_mean, int threads, int lanes)              \
    {                                                                                                              \
        simple_args_##SUF a = {v, keep, init, NULL, NULL, out, logits, NULL, NULL, G, S, I, O, D, T,              \
                               normalize_inputs, weighted_mean, S > 1 ? state : NULL};                             \
        return run(lanes ? simple_fl_##SUF : simple_fw_##SUF, &a, G, threads);                                                                      \
                                                                                                          \
    }                                                                                                              \
    int simple_routing_backward_##SUF(const T_ *v, const T_ *keep, const T_ *init, const T_ *g_out,               \
                                      const T_ *g_logits, T_ *state, T_ *g_v, T_ *g_init, int64_t G, int64_t S,    \
                                      int64_t I, int64_t O, int64_t D, int T, int normalize_inputs,                \
                                      int weighted_mean, int threads, int lanes)                                   \
    {                                                                                                              \
        simple_args_##SUF a = {v, keep, init, g_out, g_logits, NULL, NULL, g_v, g_init, G, S, I, O, D, T,         \
                               normalize_inputs, weighted_mean, S > 1 ? state : NULL};                             \
        return run(lanes ? simple_bl_##SUF : simple_bw_##SUF, &a, G, threads);                                                                      \
                                                                                                          \
    }

#define EXPORT_EM(SUF, T_)                                                                                        \
    static int em_fw_##SUF(const void *a, int64_t g0, int64_t g1) { return em_forward_groups_##SUF(a, g0, g1); }         \
    static int em_bw_##SUF(const void *a, int64_t g0, int64_t g1) { return em_backward_groups_##SUF(a, g0, g1); }        \
    static int em_fl_##SUF(const void *a, int64_t g0, int64_t g1) { return em_forward_lanes_##SUF(a, g0, g1); }          \
    static int em_bl_##SUF(const void *a, int64_t g0, int64_t g1) { return em_backward_lanes_##SUF(a, g0, g1); }         \
    int em_routing_forward_##SUF(const T_ *v, const T_ *beta_a, const T_ *beta_u, const T_ *lambdas, T_ min_var,    \
                                 T_ *out, T_ *act, int64_t G, int64_t I, int64_t O, int64_t D, int64_t sG,        \
                                 int64_t sI, int T, int threads, int lanes)                                                   \
    {                                                                                                              \
        em_args_##SUF a = {v, beta_a, beta_u, lambdas, NULL, NULL, out, act, NULL, NULL, NULL, min_var, G, I, O, D, \
                           sG, sI, T};                                                                             \
        return run(lanes ? em_fl_##SUF : em_fw_##SUF, &a, G, threads);                                                                          \
                                                                                                          \
    }                                                                                                              \
    int em_routing_backward_##SUF(const T_ *v, const T_ *beta_a, const T_ *beta_u, const T_ *lambdas, T_ min_var,   \
                                  const T_ *g_out, const T_ *g_act, T_ *g_v, T_ *g_beta_a, T_ *g_beta_u, int64_t G, \
                                  int64_t I, int64_t O, int64_t D, int64_t sG, int64_t sI, int T, int threads, int lanes)     \
    {                                                                                                              \
        em_args_##SUF a = {v, beta_a, beta_u, lambdas, g_out, g_act, NULL, NULL, g_v, g_beta_a, g_beta_u, min_var,  \
                           G, I, O, D, sG, sI, T};                                                                 \
        return run(lanes ? em_bl_##SUF : em_bw_##SUF, &a, G, threads);                                                                          \
                                                                                                          \
    }

EXPORT_SIMPLE(f32, float)
EXPORT_SIMPLE(f64, double)
EXPORT_SIMPLE(f32_d1, float)
EXPORT_SIMPLE(f64_d1, double)
EXPORT_EM(f32, float)
EXPORT_EM(f64, double)
EXPORT_EM(f32_d1, float)
EXPORT_EM(f64_d1, double)

/* ------------------------------------------------------------ tanh (li2019's capsule maps, eq. 5) */

/* Elements per group of the element-wise kernels (the unit split over threads). */
#define TANH_CHUNK 16384

typedef struct {
    const void *x, *g;
    void *y;
    int64_t n;
    int64_t K, M; /* tanh_bias_forward: rows of K elements, M rows per row of the bias (x) */
} tanh_args;

/* Rows per group of tanh_bias_forward (about TANH_CHUNK elements). */
static inline int64_t tanh_rows(int64_t K) { return K < TANH_CHUNK ? TANH_CHUNK / K : 1; }

#define EXPORT_TANH(SUF, T_, TANH)                                                                                \
    static int tanh_fw_##SUF(const void *p, int64_t g0, int64_t g1)                                                \
    {                                                                                                              \
        const tanh_args *a = p;                                                                                    \
        const T_ *restrict x = a->x;                                                                               \
        T_ *restrict y = a->y;                                                                                     \
        int64_t end = g1 * TANH_CHUNK < a->n ? g1 * TANH_CHUNK : a->n;                                             \
        for (int64_t k = g0 * TANH_CHUNK; k < end; k++) y[k] = TANH(x[k]);                                         \
        return 0;                                                                                                  \
    }                                                                                                              \
    /* the gradient through y = tanh(x), from y: g (1 - y^2) */                                                    \
    static int tanh_bw_##SUF(const void *p, int64_t g0, int64_t g1)                                                \
    {                                                                                                              \
        const tanh_args *a = p;                                                                                    \
        const T_ *restrict y = a->x, *restrict g = a->g;                                                           \
        T_ *restrict gx = a->y;                                                                                    \
        int64_t end = g1 * TANH_CHUNK < a->n ? g1 * TANH_CHUNK : a->n;                                             \
        for (int64_t k = g0 * TANH_CHUNK; k < end; k++) gx[k] = g[k] * ((T_)1 - y[k] * y[k]);                      \
        return 0;                                                                                                  \
    }                                                                                                              \
    /* y = tanh(y + b), in place, row by row (y: n / K rows of K, row r adds row r / M of b) */                    \
    static int tanh_bias_fw_##SUF(const void *p, int64_t g0, int64_t g1)                                           \
    {                                                                                                              \
        const tanh_args *a = p;                                                                                    \
        const T_ *restrict b = a->x;                                                                               \
        T_ *restrict y = a->y;                                                                                     \
        int64_t K = a->K, per = tanh_rows(K), rows = a->n / K, end = g1 * per < rows ? g1 * per : rows;            \
        for (int64_t r = g0 * per; r < end; r++) {                                                                 \
            T_ *restrict yr = y + r * K;                                                                           \
            const T_ *restrict br = b + r / a->M * K;                                                              \
            for (int64_t k = 0; k < K; k++) yr[k] = TANH(yr[k] + br[k]);                                           \
        }                                                                                                          \
        return 0;                                                                                                  \
    }                                                                                                              \
    /* y = tanh(x) over n contiguous elements (y may be x) */                                                      \
    int tanh_forward_##SUF(const T_ *x, T_ *y, int64_t n, int threads)                                             \
    {                                                                                                              \
        tanh_args a = {x, NULL, y, n, 0, 0};                                                                       \
        return run(tanh_fw_##SUF, &a, (n + TANH_CHUNK - 1) / TANH_CHUNK, threads);                                 \
    }                                                                                                              \
    /* y (P, M, K) = tanh(y + b (P, 1, K)) in place, n = P M K elements */                                         \
    int tanh_bias_forward_##SUF(T_ *y, const T_ *b, int64_t n, int64_t K, int64_t M, int threads)                  \
    {                                                                                                              \
        tanh_args a = {b, NULL, y, n, K, M};                                                                       \
        int64_t per = tanh_rows(K);                                                                                \
        return run(tanh_bias_fw_##SUF, &a, (n / K + per - 1) / per, threads);                                      \
    }                                                                                                              \
    int tanh_backward_##SUF(const T_ *y, const T_ *g, T_ *gx, int64_t n, int threads)                              \
    {                                                                                                              \
        tanh_args a = {y, g, gx, n, 0, 0};                                                                         \
        return run(tanh_bw_##SUF, &a, (n + TANH_CHUNK - 1) / TANH_CHUNK, threads);                                 \
    }

EXPORT_TANH(f32, float, tanhf)
EXPORT_TANH(f64, double, tanh)

#define EXPORT_CLAUSE(SUF, T_)                                                                                    \
    static int clause_fw_##SUF(const void *a, int64_t g0, int64_t g1) { return clause_forward_blocks_##SUF(a, g0, g1); } \
    static int clause_bw_##SUF(const void *a, int64_t g0, int64_t g1) { return clause_backward_blocks_##SUF(a, g0, g1); }\
    int clause_mix_forward_##SUF(const T_ *x, const int32_t *span, const T_ *cg, const T_ *w, T_ *y, int64_t B,     \
                                 int64_t H, int64_t L, int64_t Dd, int threads)                                   \
    {                                                                                                              \
        clause_args_##SUF a = {x, cg, w, NULL, span, y, NULL, NULL, NULL, B, H, L, Dd};                            \
        return run(clause_fw_##SUF, &a, B * H, threads);                                                       \
    }                                                                                                              \
    int clause_mix_backward_##SUF(const T_ *x, const int32_t *span, const T_ *cg, const T_ *w, const T_ *gy,       \
                                  T_ *gx, T_ *gcg, T_ *gw, int64_t B, int64_t H, int64_t L, int64_t Dd,            \
                                  int threads)                                                                     \
    {                                                                                                              \
        clause_args_##SUF a = {x, cg, w, gy, span, NULL, gx, gcg, gw, B, H, L, Dd};                                \
        return run(clause_bw_##SUF, &a, B * H, threads);                                                       \
    }

EXPORT_CLAUSE(f32, float)
EXPORT_CLAUSE(f64, double)
