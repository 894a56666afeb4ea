/* Fused clause attention mix (onmt_ext/clause_attention.py, eq. 4-5), one floating type per inclusion
 * (see routing_kernels.c, which also builds these entry points).
 *
 * For every row r = (b, h, q) of the masked scores x, the probabilities
 *
 *     y = cg_r g + sum_d w_{d,r} b^d,   g = softmax(x),   b^d = softmax of x over the span [s, e) of keys
 *                                                               in the query's clause at distinct level d,
 *
 * computed in one pass over the row (clauses are contiguous spans of keys, so each local softmax reads a
 * slice of the row instead of a masked copy of it).  The backward pass recomputes the softmaxes of its row.
 *
 * The clauses of the levels mixed are nested (level d + 1 refines level d), so the span of level d + 1
 * lies inside that of level d, and a key's weight depends only on the finest level whose span holds it:
 * every sum and every weight of a row is found in a few passes over the row, whatever the number of levels.
 *
 * Layout (row-major, contiguous):
 *   x, y, gy, gx  (B, H, L, L)  scores, probabilities and their gradients; a row is the last axis
 *   span          (B, Dd, L, 2) int32: [s, e) of query q's clause at distinct level d, coarse to fine
 *   cg, gcg       (B, H, L)     weight of the global softmax (1 - p_1) and its gradient
 *   w, gw         (Dd, B, H, L) weight of each distinct level's local softmax and its gradient
 */

typedef struct {
    const real *x, *cg, *w, *gy;
    const int32_t *span;
    real *y, *gx, *gcg, *gw;
    int64_t B, H, L, Dd;
} FN(clause_args);

/* A clause whose shared exponentials (below) sum to less than e^-30 gets its own: the shared ones
 * could underflow there.  Above it, the clause's largest exponential is far from float's smallest
 * normal number, so the shared ones are exact to float rounding. */
#define CLAUSE_MIN_SHARED_SUM 9.357622968840175e-14 /* e^-30 */
/* EXP_FLOOR: see routing_kernels.c. */

/* e[s..t) = softmax(x[s..t)); t > s */
static void FN(span_softmax)(const real *x, real *e, int64_t s, int64_t t)
{
    real top = x[s];
    for (int64_t k = s + 1; k < t; k++) top = x[k] > top ? x[k] : top;
    real total = 0;
    for (int64_t k = s; k < t; k++) { e[k] = EXP(x[k] - top); total += e[k]; }
    real scale = (real)1 / total;
    for (int64_t k = s; k < t; k++) e[k] *= scale;
}

/* E (L, L) = exp(x - the row's max), top (L) = the rows' maxima: one long loop of exponentials per block. */
static void FN(block_exp)(const real *x, real *E, real *top, int64_t L)
{
    for (int64_t q = 0; q < L; q++) {
        const real *xr = x + q * L;
        real m = xr[0];
        for (int64_t k = 1; k < L; k++) m = xr[k] > m ? xr[k] : m;
        top[q] = m;
        for (int64_t k = 0; k < L; k++) E[q * L + k] = xr[k] - m;
    }
    for (int64_t k = 0; k < L * L; k++) {
        real arg = E[k] > -(real)EXP_FLOOR ? E[k] : -(real)EXP_FLOOR;
        real e = EXP(arg);
        E[k] = E[k] > -(real)EXP_FLOOR ? e : (real)0;
    }
}

/* Sums over the nested spans from the finest outwards: S[d] = sum of a over span d, U[d] of a * c (c may be
 * NULL).  span points at (s, e) of level 0; the levels are `stride` ints apart. */
static void FN(nested_sums)(const real *a, const real *c, const int32_t *span, int64_t stride, int64_t Dd, real *S,
                            real *U)
{
    int64_t s = span[(Dd - 1) * stride], t = span[(Dd - 1) * stride + 1];
    real sa = 0, sc = 0;
    for (int64_t k = s; k < t; k++) { sa += a[k]; if (c) sc += a[k] * c[k]; }
    S[Dd - 1] = sa;
    if (c) U[Dd - 1] = sc;
    for (int64_t d = Dd - 2; d >= 0; d--) {
        int64_t s0 = span[d * stride], t0 = span[d * stride + 1];
        for (int64_t k = s0; k < s; k++) { sa += a[k]; if (c) sc += a[k] * c[k]; }
        for (int64_t k = t; k < t0; k++) { sa += a[k]; if (c) sc += a[k] * c[k]; }
        S[d] = sa;
        if (c) U[d] = sc;
        s = s0, t = t0;
    }
}

/* out[k] = base + P[j] for every key k whose finest holding span is j - 1 (P[0] = 0 outside all spans). */
static void FN(nested_fill)(real *out, const int32_t *span, int64_t stride, int64_t Dd, int64_t L, real base,
                            const real *P)
{
    int64_t s = 0, t = L;
    for (int64_t d = 0; d < Dd; d++) {
        int64_t s1 = span[d * stride], t1 = span[d * stride + 1];
        for (int64_t k = s; k < s1; k++) out[k] = base + P[d];
        for (int64_t k = t1; k < t; k++) out[k] = base + P[d];
        s = s1, t = t1;
    }
    for (int64_t k = s; k < t; k++) out[k] = base + P[Dd];
}

/* The rows of blocks (b, h) in [g0, g1), forward or backward (inlined into one function for each, below).
 *
 * Forward: with e = exp(x - max x) shared by all softmaxes of a row, g = e / Z and b^d = e / S_d on its span,
 * so y = e * coef with coef = cg / Z + sum_{d: k in span d} w_d / S_d.
 * Backward: gx = cg g (gy - <g, gy>) + sum_d w_d b^d (gy - <b^d, gy>) on its span, gcg = <g, gy> and
 * gw_d = <b^d, gy>; with the shared exponentials gx = e * (coef * gy - sub),
 * sub = cg <g, gy> / Z + sum_{d: k in span d} w_d <b^d, gy> / S_d.
 * Levels whose shared sum is too small (CLAUSE_MIN_SHARED_SUM: in practice the padding's own clause, for a
 * padded query) are the finest ones; they get their own softmax, once per run of equal spans. */
static inline __attribute__((always_inline)) int FN(clause_blocks)(const FN(clause_args) *a, int64_t g0, int64_t g1,
                                                                    const int backward)
{
    int64_t H = a->H, L = a->L, Dd = a->Dd, N = a->B * H * L, LL = L * L;
    real *E = malloc(sizeof(real) * (LL + 4 * L + 5 * Dd + 4));
    if (!E) return -1;
    real *coef = E + LL, *sub = coef + L, *local = sub + L, *top = local + L;
    real *S = top + L, *U = S + Dd, *P = U + Dd, *Q = P + Dd + 1;
    for (int64_t g = g0; g < g1; g++) {
        int64_t b = g / H;
        const real *x = a->x + g * LL;
        FN(block_exp)(x, E, top, L);
        for (int64_t q = 0; q < L; q++) {
            int64_t r = g * L + q;
            const real *xr = x + q * L, *er = E + q * L, *gy = backward ? a->gy + r * L : NULL;
            const int32_t *span = a->span + (b * Dd * L + q) * 2;
            real Z = 0, dot = 0;
            for (int64_t k = 0; k < L; k++) Z += er[k];
            if (backward) {
                for (int64_t k = 0; k < L; k++) dot += er[k] * gy[k];
                dot /= Z;
                a->gcg[r] = dot;
            }
            FN(nested_sums)(er, gy, span, 2 * L, Dd, S, U);
            int64_t shared = 0;  /* levels [0, shared) use the shared exponentials */
            while (shared < Dd && S[shared] >= (real)CLAUSE_MIN_SHARED_SUM) shared++;
            P[0] = Q[0] = 0;
            for (int64_t d = 0; d < Dd; d++) {
                real f = 0, local_dot = 0;
                if (d < shared) {
                    f = a->w[d * N + r] / S[d];
                    if (backward) a->gw[d * N + r] = local_dot = U[d] / S[d];
                }
                P[d + 1] = P[d] + f;
                Q[d + 1] = Q[d] + f * local_dot;
            }
            real base = a->cg[r] / Z;
            FN(nested_fill)(coef, span, 2 * L, Dd, L, base, P);
            real *out = backward ? a->gx + r * L : a->y + r * L;
            if (backward) {
                FN(nested_fill)(sub, span, 2 * L, Dd, L, base * dot, Q);
                for (int64_t k = 0; k < L; k++) out[k] = er[k] * (coef[k] * gy[k] - sub[k]);
            } else {
                for (int64_t k = 0; k < L; k++) out[k] = coef[k] * er[k];
            }
            for (int64_t d = shared; d < Dd;) {
                int64_t s = span[d * 2 * L], t = span[d * 2 * L + 1];
                FN(span_softmax)(xr, local, s, t);
                real local_dot = 0, weight = 0;
                if (backward)
                    for (int64_t k = s; k < t; k++) local_dot += local[k] * gy[k];
                int64_t next = d;
                for (; next < Dd && span[next * 2 * L] == s && span[next * 2 * L + 1] == t; next++) {
                    weight += a->w[next * N + r];
                    if (backward) a->gw[next * N + r] = local_dot;
                }
                for (int64_t k = s; k < t; k++) out[k] += weight * local[k] * (backward ? gy[k] - local_dot : (real)1);
                d = next;
            }
        }
    }
    free(E);
    return 0;
}

static int FN(clause_forward_blocks)(const FN(clause_args) *a, int64_t g0, int64_t g1)
{
    return FN(clause_blocks)(a, g0, g1, 0);
}

static int FN(clause_backward_blocks)(const FN(clause_args) *a, int64_t g0, int64_t g1)
{
    return FN(clause_blocks)(a, g0, g1, 1);
}
