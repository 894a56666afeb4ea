/* Fused CPU routing kernels, one floating type per inclusion (see routing_kernels.c).
 *
 * Each routing problem is computed start to finish in a few small buffers
 * that stay in cache, forward and backward, instead of the few dozen passes
 * over the whole vote tensor that the tensor code of onmt_ext/routing.py
 * makes.  The arithmetic is exactly that of onmt_ext/routing.py (the tests
 * compare the two, values and gradients); the backward pass recomputes the
 * forward iterations of its problem and then runs them in reverse (with shared
 * votes, S > 1, it reads them from the state the forward pass kept, when given).
 *
 * Layout (row-major, contiguous):
 *   votes  v     (G, I, O, D)   shared by the S problems of group g
 *   keep         (G, S, I)      1 where the input takes part, 0 where masked (or NULL)
 *   init_logits  (G, S, I, O)   (or NULL)
 *   outputs      (G, S, O, D)
 *   logits       (G, S, I, O)
 *   state        (G, S, shared_state_size) with shared votes (or NULL)
 * EM routing has S = 1 and no mask.
 */

/* ------------------------------------------------------------ simple routing */

/* exp(x), or 0 below -EXP_FLOOR; the argument is clamped first, so that a vectorised loop never hands
 * glibc's vector exp an argument that sends it down its slow path. */
static inline real FN(exp_floor)(real x)
{
    real arg = x > -(real)EXP_FLOOR ? x : -(real)EXP_FLOOR;
    real e = EXP(arg);
    return x > -(real)EXP_FLOOR ? e : (real)0;
}

/* Step 1 of simple_routing: the coupling C (I, O) from the logits B, zero where keep is 0. */
static void FN(coupling)(const real *B, const real *keep, real *C, int64_t I, int64_t O, int normalize_inputs)
{
    if (!normalize_inputs) {           /* softmax over the outputs of each input */
        for (int64_t i = 0; i < I; i++) {
            const real *b = B + i * O;
            real *c = C + i * O;
            real k = keep ? keep[i] : (real)1;
            real top = b[0];
            for (int64_t o = 1; o < O; o++) top = b[o] > top ? b[o] : top;
            real total = 0;
            for (int64_t o = 0; o < O; o++) { c[o] = FN(exp_floor)(b[o] - top); total += c[o]; }
            real scale = k / total;
            for (int64_t o = 0; o < O; o++) c[o] *= scale;
        }
        return;
    }
    /* softmax over the unmasked inputs of each output */
    for (int64_t o = 0; o < O; o++) {
        real top = 0;
        int any = 0;
        for (int64_t i = 0; i < I; i++) {
            if (keep && keep[i] == 0) continue;
            real b = B[i * O + o];
            if (!any || b > top) top = b;
            any = 1;
        }
        real total = 0;
        for (int64_t i = 0; i < I; i++) {
            real e = (keep && keep[i] == 0) ? (real)0 : FN(exp_floor)(B[i * O + o] - top);
            C[i * O + o] = e;
            total += e;
        }
        real scale = any ? (real)1 / total : (real)0;
        for (int64_t i = 0; i < I; i++) C[i * O + o] *= scale;
    }
}

/* One routing iteration after the coupling: S (O, D) = sum_i C v [/ total], out = squash(S). */
static void FN(simple_outputs)(const real *v, const real *C, real *S, real *total, real *out, int64_t I, int64_t O,
                               int64_t D, int weighted_mean)
{
    D = FIXED_D(D);
    int64_t OD = O * D;
    for (int64_t k = 0; k < OD; k++) S[k] = 0;
    for (int64_t o = 0; o < O; o++) total[o] = 0;
    for (int64_t i = 0; i < I; i++) {
        const real *c = C + i * O;
        const real *vi = v + i * OD;
        if (D == 1) {
            for (int64_t o = 0; o < O; o++) S[o] += c[o] * vi[o];
        } else {
            for (int64_t o = 0; o < O; o++) {
                real co = c[o];
                const real *vio = vi + o * D;
                real *s = S + o * D;
                for (int64_t d = 0; d < D; d++) s[d] += co * vio[d];
            }
        }
        if (weighted_mean)
            for (int64_t o = 0; o < O; o++) total[o] += c[o];
    }
    for (int64_t o = 0; o < O; o++) {
        real *s = S + o * D;
        if (weighted_mean) {
            real den = total[o] > (real)MIN_TOTAL ? total[o] : (real)MIN_TOTAL;
            for (int64_t d = 0; d < D; d++) s[d] /= den;
        }
        real sq = 0;
        for (int64_t d = 0; d < D; d++) sq += s[d] * s[d];
        real n = SQRT(sq + (real)NORM_EPS);
        real f = n / ((real)1 + n * n);
        for (int64_t d = 0; d < D; d++) out[o * D + d] = s[d] * f;
    }
}

/* B (I, O) += <v_io, out_o> (Alg. 1 line 6). */
static void FN(agreement)(const real *v, const real *out, real *B, int64_t I, int64_t O, int64_t D)
{
    D = FIXED_D(D);
    for (int64_t i = 0; i < I; i++) {
        const real *vi = v + i * O * D;
        real *b = B + i * O;
        if (D == 1) {
            for (int64_t o = 0; o < O; o++) b[o] += vi[o] * out[o];
        } else {
            for (int64_t o = 0; o < O; o++) {
                real a = 0;
                for (int64_t d = 0; d < D; d++) a += vi[o * D + d] * out[o * D + d];
                b[o] += a;
            }
        }
    }
}

/* Starting logits B^0: init where the input takes part, 0 elsewhere. */
static void FN(start_logits)(const real *init, const real *keep, real *B, int64_t I, int64_t O)
{
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++)
            B[i * O + o] = (init && !(keep && keep[i] == 0)) ? init[i * O + o] : (real)0;
}

typedef struct {
    const real *v, *keep, *init, *g_out, *g_logits;
    real *out, *logits, *g_v, *g_init;
    int64_t G, S, I, O, D;
    int T, normalize_inputs, weighted_mean;
    real *state;  /* shared votes: what the forward pass keeps for the backward pass (or NULL: recomputed) */
} FN(simple_args);

/* ---------------------------------------- simple routing with shared votes (S > 1: cao2019's horizontal) */

/* Shared votes are cao2019's horizontal routing: the S = L problems of a sentence route over the same votes
 * (I = L inputs), problem l over the inputs t <= l that are not padding.  So a problem works on the range
 * [0, R) up to its last kept input (its prefix; masked inputs inside the range get a zero coupling), the
 * group's votes are copied once in two layouts, (I, O, Dp) with the capsule size padded with zeros to whole
 * vectors, and transposed, (O, D, Ip) with the inputs padded, and every sum runs in vector registers along a
 * contiguous axis: sum_i C_io v_io along D in the first layout, the agreements <v_io, out_o> (and the
 * coupling's gradient) along the inputs in the second, never a horizontal reduction per input.  Logits and
 * couplings are kept transposed, (O, Ip), so that the softmax over the inputs runs on contiguous rows.
 * A masked input's logits are its agreements alone: inside the range they are updated with the others, past
 * it they are <v_io, sum_t out^t_o>, computed once at the end (in the backward pass only when the logits
 * get a gradient, which cao2019 does not give them). */

#ifndef EM_LANE_BYTES
#define EM_LANE_BYTES 64
#endif
#ifndef SHARED_LANE_BYTES
#define SHARED_LANE_BYTES 32
#endif
/* lanes of a vector (the padding of D and of I); a vector of them (GNU C vector extension), loads and stores
 * of which need no alignment */
#define LANES ((int64_t)(SHARED_LANE_BYTES / sizeof(real)))
typedef real FN(vec) __attribute__((vector_size(SHARED_LANE_BYTES), aligned(sizeof(real)), __may_alias__));
#define VLOAD(p) (*(const FN(vec) *)(p))
#define VSTORE(p, x) (*(FN(vec) *)(p) = (x))
#define NEG_HUGE ((real)-3.0e38)

static inline real FN(hsum)(FN(vec) x)
{
    real total = 0;
    for (int64_t k = 0; k < LANES; k++) total += x[k];
    return total;
}

static inline int64_t FN(round_up)(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Per-thread buffers of the shared-vote routing. */
typedef struct {
    int64_t Dp, Ip;
    real *Vp, *Vt, *gVp, *km, *Bt, *gB, *gC, *Cs, *Ss, *outs, *totals, *outsum, *gout, *gS, *Wm, *gtot, *gAs, *gSs;
    void *memory;
} FN(shared_buffers);

static int FN(shared_alloc)(FN(shared_buffers) *b, int64_t I, int64_t O, int64_t D, int T, int backward)
{
    int64_t Dp = FN(round_up)(FIXED_D(D), LANES), Ip = FN(round_up)(I, LANES), ODp = O * Dp, OIp = O * Ip;
    enum { ARRAYS = 18 };
    int64_t sizes[ARRAYS] = {I * ODp, O * FIXED_D(D) * Ip, backward ? I * ODp : 0, Ip, OIp, OIp, OIp, T * OIp,
                             T * ODp, T * ODp, T * O, ODp, ODp, ODp, ODp, O, backward ? T * OIp : 0,
                             backward ? T * ODp : 0};
    real **arrays[ARRAYS] = {&b->Vp, &b->Vt, &b->gVp, &b->km, &b->Bt, &b->gB, &b->gC, &b->Cs,
                             &b->Ss, &b->outs, &b->totals, &b->outsum, &b->gout, &b->gS, &b->Wm, &b->gtot,
                             &b->gAs, &b->gSs};
    size_t offsets[ARRAYS], count = 0;
    for (int k = 0; k < ARRAYS; k++) {  /* every array starts on a 64-byte line */
        offsets[k] = count;
        count += ((size_t)sizes[k] * sizeof(real) + 63) / 64 * 64;
    }
    char *memory = aligned_alloc(64, count);
    if (!memory) return -1;
    for (int k = 0; k < ARRAYS; k++) *arrays[k] = (real *)(memory + offsets[k]);
    for (size_t k = 0; k < count / sizeof(real); k++) ((real *)memory)[k] = 0;  /* the paddings stay zero */
    b->Dp = Dp;
    b->Ip = Ip;
    b->memory = memory;
    return 0;
}

/* The group's votes v (I, O, D) into Vp (I, O, Dp) and Vt (O, D, Ip); their paddings are zero. */
static void FN(shared_votes)(FN(shared_buffers) *b, const real *v, int64_t I, int64_t O, int64_t D)
{
    D = FIXED_D(D);
    int64_t Dp = b->Dp, Ip = b->Ip;
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t d = 0; d < D; d++) {
                real x = v[(i * O + o) * D + d];
                b->Vp[(i * O + o) * Dp + d] = x;
                b->Vt[(o * D + d) * Ip + i] = x;
            }
}

/* keep (I) into km (1 or 0; km stays 0 past I); returns R, one past the last kept input, and *n, their number */
static int64_t FN(shared_range)(const real *keep, real *km, int64_t I, int64_t *n)
{
    int64_t R = 0, count = 0;
    for (int64_t i = 0; i < I; i++) {
        int k = !keep || keep[i] != 0;
        km[i] = (real)k;
        if (k) { R = i + 1; count++; }
    }
    *n = count;
    return R;
}

/* The coupling Ct (O, Ip) of the inputs [0, Rp) from their logits Bt (O, Ip); zero where km is 0. */
static void FN(shared_coupling)(const real *Bt, const real *km, real *Ct, int64_t n, int64_t Rp, int64_t Ip,
                                int64_t O, int normalize_inputs)
{
    if (n == 0) {
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < Rp; i++) Ct[o * Ip + i] = 0;
        return;
    }
    if (normalize_inputs) {  /* softmax over the kept inputs of each output: a contiguous row */
        enum { CHUNK = 16 };    /* outputs whose rows go through each step together (independent latencies) */
        for (int64_t o0 = 0; o0 < O; o0 += CHUNK) {
            int64_t count = O - o0 < CHUNK ? O - o0 : CHUNK;
            real top[CHUNK], total[CHUNK];
            for (int64_t o = 0; o < count; o++) {
                const real *b = Bt + (o0 + o) * Ip;
                real t = NEG_HUGE;
                for (int64_t i = 0; i < Rp; i++) {
                    real x = b[i] + (km[i] - (real)1) * -NEG_HUGE;  /* far below every kept logit where masked */
                    t = x > t ? x : t;
                }
                top[o] = t;
            }
            for (int64_t o = 0; o < count; o++) {
                const real *b = Bt + (o0 + o) * Ip;
                real *c = Ct + (o0 + o) * Ip, t = top[o], sum = 0;
                for (int64_t i = 0; i < Rp; i++) {
                    real e = FN(exp_floor)((b[i] - t) * km[i]) * km[i];  /* exp(0) times 0 where masked */
                    c[i] = e;
                    sum += e;
                }
                total[o] = sum;
            }
            for (int64_t o = 0; o < count; o++) total[o] = (real)1 / total[o];
            for (int64_t o = 0; o < count; o++) {
                real *c = Ct + (o0 + o) * Ip, scale = total[o];
                for (int64_t i0 = 0; i0 < Rp; i0 += LANES) VSTORE(c + i0, VLOAD(c + i0) * scale);
            }
        }
        return;
    }
    for (int64_t i = 0; i < Rp; i++) {  /* softmax over the outputs of each input */
        real top = Bt[i];
        for (int64_t o = 1; o < O; o++) top = Bt[o * Ip + i] > top ? Bt[o * Ip + i] : top;
        real total = 0;
        for (int64_t o = 0; o < O; o++) {
            Ct[o * Ip + i] = FN(exp_floor)(Bt[o * Ip + i] - top);
            total += Ct[o * Ip + i];
        }
        real scale = km[i] / total;
        for (int64_t o = 0; o < O; o++) Ct[o * Ip + i] *= scale;
    }
}

/* Y (O, Dp) = [Y +] sum_{i < R} W_oi V_io (W (O, Ip), V = Vp (I, O, Dp)): the O Dp / LANES vectors of Y are
 * independent sums over the inputs, accumulated in registers four at a time */
static void FN(sum_over_inputs)(const real *W, const real *Vp, real *Y, int64_t R, int64_t Ip, int64_t O, int64_t Dp,
                                int accumulate)
{
    const FN(vec) zero = {0};
    int64_t ODp = O * Dp, per_output = Dp / LANES, q = 0, Q = O * per_output;
    for (; q + 4 <= Q; q += 4) {
        const real *w0 = W + (q / per_output) * Ip, *w1 = W + ((q + 1) / per_output) * Ip,
                   *w2 = W + ((q + 2) / per_output) * Ip, *w3 = W + ((q + 3) / per_output) * Ip;
        const real *x = Vp + q * LANES;
        real *y = Y + q * LANES;
        FN(vec) a0 = zero, a1 = zero, a2 = zero, a3 = zero;
        if (accumulate) {
            a0 = VLOAD(y);
            a1 = VLOAD(y + LANES);
            a2 = VLOAD(y + 2 * LANES);
            a3 = VLOAD(y + 3 * LANES);
        }
        for (int64_t i = 0; i < R; i++, x += ODp) {
            a0 += w0[i] * VLOAD(x);
            a1 += w1[i] * VLOAD(x + LANES);
            a2 += w2[i] * VLOAD(x + 2 * LANES);
            a3 += w3[i] * VLOAD(x + 3 * LANES);
        }
        VSTORE(y, a0);
        VSTORE(y + LANES, a1);
        VSTORE(y + 2 * LANES, a2);
        VSTORE(y + 3 * LANES, a3);
    }
    for (; q < Q; q++) {
        const real *w = W + (q / per_output) * Ip, *x = Vp + q * LANES;
        real *y = Y + q * LANES;
        FN(vec) a0 = accumulate ? VLOAD(y) : zero;
        for (int64_t i = 0; i < R; i++, x += ODp) a0 += w[i] * VLOAD(x);
        VSTORE(y, a0);
    }
}

/* Y (O, Ip) = [Y +] base_o + sum_d X_od Vt_odi over the inputs [i0, Rp) (X (O, Dp), Vt (O, D, Ip)): the
 * agreements <v_io, out_o>, and the coupling's gradient; the vectors of Y are independent sums over d,
 * accumulated in registers four at a time */
static void FN(sum_over_dims)(const real *X, const real *Vt, const real *base, real *Y, int64_t i0, int64_t Rp,
                              int64_t Ip, int64_t O, int64_t D, int64_t Dp, int accumulate)
{
    D = FIXED_D(D);
    const FN(vec) zero = {0};
    int64_t per_output = (Rp - i0) / LANES, Q = O * per_output, q = 0;
    if (per_output <= 0) return;
#define SOD_SETUP(k)                                                                                               \
    int64_t o##k = (q + k) / per_output, c##k = i0 + ((q + k) % per_output) * LANES;                               \
    const real *x##k = X + o##k * Dp, *r##k = Vt + o##k * D * Ip + c##k;                                          \
    real *y##k = Y + o##k * Ip + c##k;                                                                             \
    FN(vec) a##k = (accumulate ? VLOAD(y##k) : zero) + (base ? base[o##k] : (real)0);
    for (; q + 4 <= Q; q += 4) {
        SOD_SETUP(0)
        SOD_SETUP(1)
        SOD_SETUP(2)
        SOD_SETUP(3)
        for (int64_t d = 0; d < D; d++) {
            a0 += x0[d] * VLOAD(r0 + d * Ip);
            a1 += x1[d] * VLOAD(r1 + d * Ip);
            a2 += x2[d] * VLOAD(r2 + d * Ip);
            a3 += x3[d] * VLOAD(r3 + d * Ip);
        }
        VSTORE(y0, a0);
        VSTORE(y1, a1);
        VSTORE(y2, a2);
        VSTORE(y3, a3);
    }
    for (; q < Q; q++) {
        SOD_SETUP(0)
        for (int64_t d = 0; d < D; d++) a0 += x0[d] * VLOAD(r0 + d * Ip);
        VSTORE(y0, a0);
    }
#undef SOD_SETUP
}

/* out (O, Dp) = squash(S (O, Dp)) */
static void FN(shared_squash_only)(const real *S, real *out, int64_t O, int64_t Dp)
{
    enum { CHUNK = 16 };  /* outputs whose norms are computed together (independent square roots) */
    for (int64_t o0 = 0; o0 < O; o0 += CHUNK) {
        int64_t count = O - o0 < CHUNK ? O - o0 : CHUNK;
        real f[CHUNK];
        for (int64_t o = 0; o < count; o++) {
            const real *s = S + (o0 + o) * Dp;
            FN(vec) sq = {0};
            for (int64_t d0 = 0; d0 < Dp; d0 += LANES) sq += VLOAD(s + d0) * VLOAD(s + d0);
            f[o] = FN(hsum)(sq);
        }
        for (int64_t o = 0; o < count; o++) {
            real nrm = SQRT(f[o] + (real)NORM_EPS);
            f[o] = nrm / ((real)1 + nrm * nrm);
        }
        for (int64_t o = 0; o < count; o++)
            for (int64_t d0 = 0; d0 < Dp; d0 += LANES)
                VSTORE(out + (o0 + o) * Dp + d0, VLOAD(S + (o0 + o) * Dp + d0) * f[o]);
    }
}

/* out (O, Dp) = squash(S), S (O, Dp) divided by the total coupling first when weighted_mean */
static void FN(shared_squash)(const real *Ct, real *S, real *total, real *out, int64_t Rp, int64_t Ip, int64_t O,
                              int64_t Dp, int weighted_mean)
{
    for (int64_t o = 0; o < O; o++) {
        real *s = S + o * Dp;
        if (weighted_mean) {
            real tot = 0;
            for (int64_t i = 0; i < Rp; i++) tot += Ct[o * Ip + i];
            total[o] = tot;
            real den = tot > (real)MIN_TOTAL ? tot : (real)MIN_TOTAL;
            for (int64_t d0 = 0; d0 < Dp; d0 += LANES) VSTORE(s + d0, VLOAD(s + d0) / den);
        }
    }
    FN(shared_squash_only)(S, out, O, Dp);
}

/* The backward of shared_squash: gS (O, Dp) and gtot (O) from gout (O, Dp) */
static void FN(shared_squash_backward)(const real *St, const real *tot, const real *gout, real *gS, real *gtot,
                                       int64_t O, int64_t Dp, int weighted_mean)
{
    for (int64_t o = 0; o < O; o++) {
        const real *so = St + o * Dp, *go = gout + o * Dp;
        real *gs = gS + o * Dp;
        FN(vec) sqv = {0}, dotv = {0};
        for (int64_t d0 = 0; d0 < Dp; d0 += LANES) {
            sqv += VLOAD(so + d0) * VLOAD(so + d0);
            dotv += VLOAD(go + d0) * VLOAD(so + d0);
        }
        real sq = FN(hsum)(sqv), dot = FN(hsum)(dotv);
        real nrm = SQRT(sq + (real)NORM_EPS), n2 = nrm * nrm;
        real f = nrm / ((real)1 + n2);
        real fprime_over_n = ((real)1 - n2) / (((real)1 + n2) * ((real)1 + n2)) / nrm;
        real h = fprime_over_n * dot;
        for (int64_t d0 = 0; d0 < Dp; d0 += LANES) VSTORE(gs + d0, VLOAD(go + d0) * f + VLOAD(so + d0) * h);
        gtot[o] = 0;
        if (weighted_mean) {
            real den = tot[o] > (real)MIN_TOTAL ? tot[o] : (real)MIN_TOTAL;
            FN(vec) gdv = {0};
            for (int64_t d0 = 0; d0 < Dp; d0 += LANES) gdv += VLOAD(gs + d0) * VLOAD(so + d0);
            for (int64_t d0 = 0; d0 < Dp; d0 += LANES) VSTORE(gs + d0, VLOAD(gs + d0) / den);
            gtot[o] = tot[o] >= (real)MIN_TOTAL ? -FN(hsum)(gdv) / den : (real)0;
        }
    }
}

/* Reals per problem of the saved state: per iteration the coupling (O, Ip), S after the weighted mean (O, Dp)
 * and the totals (O). */
static int64_t FN(shared_state_size)(int64_t I, int64_t O, int64_t D, int T)
{
    return (int64_t)T * O * (FN(round_up)(I, LANES) + FN(round_up)(FIXED_D(D), LANES) + 1);
}

/* Where iteration t's coupling, S and totals are: in the saved state of problem p, or in the buffers (slot t
 * when every iteration is kept, else slot 0). */
static void FN(shared_slots)(const FN(simple_args) *a, FN(shared_buffers) *b, int64_t p, int all, real **Cs,
                             real **Ss, real **totals, int64_t *step_C, int64_t *step_S, int64_t *step_t)
{
    int64_t O = a->O, OIp = O * b->Ip, ODp = O * b->Dp;
    if (a->state) {
        *Cs = a->state + p * FN(shared_state_size)(a->I, a->O, a->D, a->T);
        *Ss = *Cs + a->T * OIp;
        *totals = *Ss + a->T * ODp;
    } else {
        *Cs = b->Cs;
        *Ss = b->Ss;
        *totals = b->totals;
    }
    int keep_all = all || a->state;
    *step_C = keep_all ? OIp : 0;
    *step_S = keep_all ? ODp : 0;
    *step_t = keep_all ? O : 0;
}

/* The T forward iterations of problem p over its range [0, R): the logits Bt and, per iteration t, the coupling,
 * S after the weighted mean and the totals (where shared_slots says) and the outputs (b->outs, slot t when all,
 * else slot 0); the sum of the outputs into outsum when asked.  The last agreement only when last_agreement. */
static void FN(shared_iterations)(const FN(simple_args) *a, FN(shared_buffers) *b, int64_t p, int64_t n, int64_t R,
                                  int all, int last_agreement, int sum_outputs)
{
    int64_t I = a->I, O = a->O, D = a->D, Dp = b->Dp, Ip = b->Ip, ODp = O * Dp;
    int64_t Rp = FN(round_up)(R, LANES), step_C, step_S, step_t;
    real *Cs, *Ss, *totals;
    FN(shared_slots)(a, b, p, all, &Cs, &Ss, &totals, &step_C, &step_S, &step_t);
    const real *km = b->km;
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < Rp; i++)
            b->Bt[o * Ip + i] = (a->init && km[i] != 0) ? a->init[(p * I + i) * O + o] : (real)0;
    if (sum_outputs)
        for (int64_t k = 0; k < ODp; k++) b->outsum[k] = 0;
    for (int t = 0; t < a->T; t++) {
        real *C = Cs + t * step_C, *S = Ss + t * step_S, *out = b->outs + (all ? t : 0) * ODp;
        FN(shared_coupling)(b->Bt, km, C, n, Rp, Ip, O, a->normalize_inputs);
        FN(sum_over_inputs)(C, b->Vp, S, R, Ip, O, Dp, 0);
        FN(shared_squash)(C, S, totals + t * step_t, out, Rp, Ip, O, Dp, a->weighted_mean);
        if (t < a->T - 1 || last_agreement) FN(sum_over_dims)(out, b->Vt, NULL, b->Bt, 0, Rp, Ip, O, D, Dp, 1);
        if (sum_outputs)
            for (int64_t k = 0; k < ODp; k++) b->outsum[k] += out[k];
    }
}

static int FN(shared_forward_groups)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    FN(shared_buffers) b;
    if (FN(shared_alloc)(&b, I, O, D, 1, 0)) return -1;
    int64_t Dp = b.Dp, Ip = b.Ip;
    for (int64_t g = g0; g < g1; g++) {
        FN(shared_votes)(&b, a->v + g * I * OD, I, O, D);
        for (int64_t s = 0; s < a->S; s++) {
            int64_t p = g * a->S + s, n;
            int64_t R = FN(shared_range)(a->keep ? a->keep + p * I : NULL, b.km, I, &n);
            FN(shared_iterations)(a, &b, p, n, R, 0, 1, R < I);
            for (int64_t o = 0; o < O; o++)
                for (int64_t d = 0; d < D; d++) a->out[p * OD + o * D + d] = b.outs[o * Dp + d];
            /* past the range: the masked inputs' logits from the sum of the outputs */
            int64_t i0 = R / LANES * LANES;
            if (R < I) FN(sum_over_dims)(b.outsum, b.Vt, NULL, b.gC, i0, Ip, Ip, O, D, Dp, 0);
            real *logits = a->logits + p * IO;
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) logits[i * O + o] = i < R ? b.Bt[o * Ip + i] : b.gC[o * Ip + i];
        }
    }
    free(b.memory);
    return 0;
}

static int FN(shared_backward_groups)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    int T = a->T;
    FN(shared_buffers) b;
    if (FN(shared_alloc)(&b, I, O, D, T, 1)) return -1;
    int64_t Dp = b.Dp, Ip = b.Ip, ODp = O * Dp, OIp = O * Ip;
    for (int64_t g = g0; g < g1; g++) {
        FN(shared_votes)(&b, a->v + g * I * OD, I, O, D);
        for (int64_t k = 0; k < I * ODp; k++) b.gVp[k] = 0;
        for (int64_t s = 0; s < a->S; s++) {
            int64_t p = g * a->S + s, n;
            int64_t R = FN(shared_range)(a->keep ? a->keep + p * I : NULL, b.km, I, &n);
            int64_t Rp = FN(round_up)(R, LANES);
            int masked_logits = a->g_logits && R < I;  /* logits past the range that get a gradient */
            real *Cs, *Ss, *totals;  /* every iteration kept: iteration t at t O Ip, t O Dp and t O */
            int64_t step_C, step_S, step_t;
            FN(shared_slots)(a, &b, p, 1, &Cs, &Ss, &totals, &step_C, &step_S, &step_t);
            if (a->state) {  /* the outputs from the saved S */
                if (masked_logits)
                    for (int64_t k = 0; k < ODp; k++) b.outsum[k] = 0;
                for (int t = 0; t < T; t++) {
                    FN(shared_squash_only)(Ss + t * ODp, b.outs + t * ODp, O, Dp);
                    if (masked_logits)
                        for (int64_t k = 0; k < ODp; k++) b.outsum[k] += b.outs[t * ODp + k];
                }
            } else {
                FN(shared_iterations)(a, &b, p, n, R, 1, 0, masked_logits);
            }
            if (masked_logits) {
                /* logits_io = <v_io, sum_t out^t_o> past R: to the votes now, to every out^t through Wm below */
                for (int64_t k = 0; k < ODp; k++) b.Wm[k] = 0;
                for (int64_t i = R; i < I; i++)
                    for (int64_t o = 0; o < O; o++) {
                        real gl = a->g_logits[(p * I + i) * O + o];
                        const real *x = b.outsum + o * Dp, *v = b.Vp + (i * O + o) * Dp;
                        real *gv = b.gVp + (i * O + o) * Dp, *w = b.Wm + o * Dp;
                        for (int64_t d0 = 0; d0 < Dp; d0 += LANES) {
                            VSTORE(gv + d0, VLOAD(gv + d0) + gl * VLOAD(x + d0));
                            VSTORE(w + d0, VLOAD(w + d0) + gl * VLOAD(v + d0));
                        }
                    }
            }
            for (int64_t o = 0; o < O; o++)
                for (int64_t i = 0; i < Rp; i++)
                    b.gB[o * Ip + i] = (a->g_logits && i < R) ? a->g_logits[(p * I + i) * O + o] : (real)0;
            for (int t = T - 1; t >= 0; t--) {
                const real *C = Cs + t * OIp, *St = Ss + t * ODp, *tot = totals + t * O;
                real *gout = b.gout, *gS = b.gS, *gtot = b.gtot, *gB = b.gB, *gC = b.gC;
                for (int64_t o = 0; o < O; o++)
                    for (int64_t d = 0; d < Dp; d++)
                        gout[o * Dp + d] = (t == T - 1 && a->g_out && d < D) ? a->g_out[p * OD + o * D + d] : (real)0;
                if (masked_logits)
                    for (int64_t k = 0; k < ODp; k++) gout[k] += b.Wm[k];
                /* B^{t+1} = B^t + A^t, A_io = <v_io, out_o> (gB is zero at t = T - 1 without a logits gradient) */
                int agreement = a->g_logits || t < T - 1;
                if (agreement) FN(sum_over_inputs)(gB, b.Vp, gout, R, Ip, O, Dp, 1);
                /* out = squash(S); then the weighted mean */
                FN(shared_squash_backward)(St, tot, gout, gS, gtot, O, Dp, a->weighted_mean);
                /* the votes get gB_oi out_o (agreement) + C_oi gS_o (S_raw = sum_i C_oi v_io), below */
                for (int64_t k = 0; k < OIp; k++) b.gAs[t * OIp + k] = agreement ? gB[k] : (real)0;
                for (int64_t k = 0; k < ODp; k++) b.gSs[t * ODp + k] = gS[k];
                if (t == 0 && !a->g_init) continue;  /* the coupling's gradient only where it is used */
                /* gC_oi = gtot_o + <gS_o, v_io>; C = softmax(B^t): its backward, added to the identity path of B */
                FN(sum_over_dims)(gS, b.Vt, gtot, gC, 0, Rp, Ip, O, D, Dp, 0);
                if (a->normalize_inputs) {
                    for (int64_t o = 0; o < O; o++) {
                        const real *c = C + o * Ip, *gc = gC + o * Ip;
                        real *gb = gB + o * Ip;
                        real dot = 0;
                        for (int64_t i = 0; i < Rp; i++) dot += gc[i] * c[i];
                        for (int64_t i = 0; i < Rp; i++) gb[i] += c[i] * (gc[i] - dot);
                    }
                } else {
                    for (int64_t i = 0; i < Rp; i++) {
                        real dot = 0;
                        for (int64_t o = 0; o < O; o++) dot += gC[o * Ip + i] * C[o * Ip + i];
                        for (int64_t o = 0; o < O; o++) gB[o * Ip + i] += C[o * Ip + i] * (gC[o * Ip + i] - dot);
                    }
                }
            }
            /* the votes: gv_io += sum_t gA^t_oi out^t_o + C^t_oi gS^t_o */
            for (int64_t i = 0; i < R; i++)
                for (int64_t o = 0; o < O; o++) {
                    real *gv = b.gVp + (i * O + o) * Dp;
                    for (int64_t d0 = 0; d0 < Dp; d0 += LANES) {
                        FN(vec) acc = VLOAD(gv + d0);
                        for (int t = 0; t < T; t++) {
                            int64_t ci = t * OIp + o * Ip + i, cd = t * ODp + o * Dp + d0;
                            acc += b.gAs[ci] * VLOAD(b.outs + cd) + Cs[ci] * VLOAD(b.gSs + cd);
                        }
                        VSTORE(gv + d0, acc);
                    }
                }
            if (a->g_init)
                for (int64_t i = 0; i < I; i++)
                    for (int64_t o = 0; o < O; o++)
                        a->g_init[p * IO + i * O + o] = b.km[i] != 0 ? b.gB[o * Ip + i] : (real)0;
        }
        real *gv = a->g_v + g * I * OD;
        for (int64_t r = 0; r < IO; r++)
            for (int64_t d = 0; d < D; d++) gv[r * D + d] += b.gVp[r * Dp + d];
    }
    free(b.memory);
    return 0;
}

#undef LANES
#undef VLOAD
#undef VSTORE
#undef NEG_HUGE

static int FN(simple_forward_groups)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
    if (a->S > 1) return FN(shared_forward_groups)(a, g0, g1);
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    real *C = malloc(sizeof(real) * (IO + OD + O));
    if (!C) return -1;
    real *S = C + IO, *total = S + OD;
    for (int64_t g = g0; g < g1; g++) {
        const real *v = a->v + g * I * OD;
        int64_t p = g;  /* S = 1 here: shared votes (S > 1) take the code above */
        const real *keep = a->keep ? a->keep + p * I : NULL;
        real *B = a->logits + p * IO, *out = a->out + p * OD;
        FN(start_logits)(a->init ? a->init + p * IO : NULL, keep, B, I, O);
        for (int t = 0; t < a->T; t++) {
            FN(coupling)(B, keep, C, I, O, a->normalize_inputs);
            FN(simple_outputs)(v, C, S, total, out, I, O, D, a->weighted_mean);
            FN(agreement)(v, out, B, I, O, D);
        }
    }
    free(C);
    return 0;
}

static int FN(simple_backward_groups)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
    if (a->S > 1) return FN(shared_backward_groups)(a, g0, g1);
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    int T = a->T;
    /* per iteration: C^t, S^t (after the weighted mean), total^t, out^t; then the gradients */
    size_t size = (size_t)T * (IO + 2 * OD + O) + IO + 2 * IO + 2 * OD + O;
    real *buffer = malloc(sizeof(real) * size);
    if (!buffer) return -1;
    real *Cs = buffer, *Ss = Cs + T * IO, *totals = Ss + T * OD, *outs = totals + T * O;
    real *B = outs + T * OD, *gB = B + IO, *gC = gB + IO, *gout = gC + IO, *gS = gout + OD, *gtot = gS + OD;
    for (int64_t g = g0; g < g1; g++) {
        const real *v = a->v + g * I * OD;
        real *gv = a->g_v + g * I * OD;
        int64_t p = g;  /* S = 1 here: shared votes (S > 1) take the code above */
        const real *keep = a->keep ? a->keep + p * I : NULL;
        FN(start_logits)(a->init ? a->init + p * IO : NULL, keep, B, I, O);
        for (int t = 0; t < T; t++) {
            real *C = Cs + t * IO, *out = outs + t * OD;
            FN(coupling)(B, keep, C, I, O, a->normalize_inputs);
            FN(simple_outputs)(v, C, Ss + t * OD, totals + t * O, out, I, O, D, a->weighted_mean);
            FN(agreement)(v, out, B, I, O, D);
        }
        for (int64_t k = 0; k < IO; k++) gB[k] = a->g_logits ? a->g_logits[p * IO + k] : (real)0;
        for (int t = T - 1; t >= 0; t--) {
            const real *C = Cs + t * IO, *St = Ss + t * OD, *out = outs + t * OD, *tot = totals + t * O;
            for (int64_t k = 0; k < OD; k++) gout[k] = (t == T - 1 && a->g_out) ? a->g_out[p * OD + k] : (real)0;
            /* B^{t+1} = B^t + A^t, A_io = <v_io, out_o> */
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    real ga = gB[i * O + o];
                    const real *vio = v + (i * O + o) * D;
                    real *gvio = gv + (i * O + o) * D;
                    for (int64_t d = 0; d < D; d++) {
                        gvio[d] += ga * out[o * D + d];
                        gout[o * D + d] += ga * vio[d];
                    }
                }
            /* out = squash(S); then the weighted mean */
            for (int64_t o = 0; o < O; o++) {
                const real *so = St + o * D;
                real sq = 0, dot = 0;
                for (int64_t d = 0; d < D; d++) { sq += so[d] * so[d]; dot += gout[o * D + d] * so[d]; }
                real n = SQRT(sq + (real)NORM_EPS), n2 = n * n;
                real f = n / ((real)1 + n2);
                real fprime_over_n = ((real)1 - n2) / (((real)1 + n2) * ((real)1 + n2)) / n;
                for (int64_t d = 0; d < D; d++) gS[o * D + d] = gout[o * D + d] * f + so[d] * fprime_over_n * dot;
                gtot[o] = 0;
                if (a->weighted_mean) {
                    real den = tot[o] > (real)MIN_TOTAL ? tot[o] : (real)MIN_TOTAL;
                    real gden = 0;
                    for (int64_t d = 0; d < D; d++) { gden -= gS[o * D + d] * so[d] / den; gS[o * D + d] /= den; }
                    gtot[o] = tot[o] >= (real)MIN_TOTAL ? gden : (real)0;
                }
            }
            /* S_raw = sum_i C_io v_io, total = sum_i C_io */
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    real c = C[i * O + o], gc = gtot[o];
                    const real *vio = v + (i * O + o) * D;
                    real *gvio = gv + (i * O + o) * D;
                    for (int64_t d = 0; d < D; d++) {
                        gc += gS[o * D + d] * vio[d];
                        gvio[d] += c * gS[o * D + d];
                    }
                    gC[i * O + o] = gc;
                }
            /* C = softmax(B^t) (times keep): the softmax backward, added to the identity path of B */
            if (!a->normalize_inputs) {
                for (int64_t i = 0; i < I; i++) {
                    real dot = 0;
                    for (int64_t o = 0; o < O; o++) dot += gC[i * O + o] * C[i * O + o];
                    for (int64_t o = 0; o < O; o++) gB[i * O + o] += C[i * O + o] * (gC[i * O + o] - dot);
                }
            } else {
                for (int64_t o = 0; o < O; o++) {
                    real dot = 0;
                    for (int64_t i = 0; i < I; i++) dot += gC[i * O + o] * C[i * O + o];
                    for (int64_t i = 0; i < I; i++) gB[i * O + o] += C[i * O + o] * (gC[i * O + o] - dot);
                }
            }
        }
        if (a->g_init)
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++)
                    a->g_init[p * IO + i * O + o] = (keep && keep[i] == 0) ? (real)0 : gB[i * O + o];
    }
    free(buffer);
    return 0;
}

/* ------------------------------------------------------------ EM routing */

typedef struct {
    const real *v, *beta_a, *beta_u, *lambdas, *g_out, *g_act;
    real *out, *act, *g_v, *g_beta_a, *g_beta_u;
    real min_var;
    int64_t G, I, O, D;
    int64_t sG, sI; /* element strides of the votes (and their gradient) between groups and between inputs; the
                     * (O, D) block of one input is contiguous */
    int T;
} FN(em_args);

/* m_step's sums over the inputs (w, m and the unnormalised var) for D = 1, MSUM_BLOCK vectors of outputs at a
 * time with the sums held in registers (the loops of m_step keep them in memory, and at li2019's Base size,
 * O = 512, reloading and storing them for every input was most of the M-step's time).  The same sums in the
 * same order; returns the first output it left to m_step's loops (the last O mod (MSUM_BLOCK lanes)). */
#define MSUM_BLOCK 4
#define MLOAD(p) (*(const vec *)(p))
static int64_t FN(m_sums_d1)(const real *restrict v, int64_t sv, const real *restrict C, real *restrict w,
                             real *restrict m, real *restrict var, int64_t I, int64_t O)
{
    typedef FN(vec) vec;
    const int64_t lanes = (int64_t)(sizeof(vec) / sizeof(real)), step = MSUM_BLOCK * lanes;
    int64_t o0 = 0;
    for (; o0 + step <= O; o0 += step) {
        vec wv[MSUM_BLOCK], mv[MSUM_BLOCK], qv[MSUM_BLOCK];
        for (int k = 0; k < MSUM_BLOCK; k++) wv[k] = mv[k] = qv[k] = (vec){0};
        for (int64_t i = 0; i < I; i++)
            for (int k = 0; k < MSUM_BLOCK; k++) {
                vec c = MLOAD(C + i * O + o0 + k * lanes);
                wv[k] += c;
                mv[k] += c * MLOAD(v + i * sv + o0 + k * lanes);
            }
        for (int k = 0; k < MSUM_BLOCK; k++) {
            vec den;
            _Pragma("GCC unroll 0") /* a loop for the vectoriser (unrolled, it stayed scalar) */
            for (int64_t l = 0; l < lanes; l++) den[l] = wv[k][l] > (real)MIN_TOTAL ? wv[k][l] : (real)MIN_TOTAL;
            mv[k] /= den;
        }
        for (int64_t i = 0; i < I; i++)
            for (int k = 0; k < MSUM_BLOCK; k++) {
                vec dev = MLOAD(v + i * sv + o0 + k * lanes) - mv[k];
                qv[k] += MLOAD(C + i * O + o0 + k * lanes) * dev * dev;
            }
        for (int k = 0; k < MSUM_BLOCK; k++) {
            *(vec *)(w + o0 + k * lanes) = wv[k];
            *(vec *)(m + o0 + k * lanes) = mv[k];
            *(vec *)(var + o0 + k * lanes) = qv[k];
        }
    }
    return o0;
}
#undef MSUM_BLOCK
#undef MLOAD

/* The M-step of one iteration: w, mean m, var, the sum over d of log var (lvs) and the activation logit la (all per
 * output); the E-step after it and the backward pass read lvs rather than take the logarithms again. */
static void FN(m_step)(const real *restrict v, int64_t sv, const real *restrict C, real *restrict w, real *restrict m,
                       real *restrict var, real *restrict lvs, real *restrict la, const real *restrict beta_a,
                       const real *restrict beta_u, real lambda, real min_var, int64_t I, int64_t O, int64_t D)
{
    D = FIXED_D(D);
    int64_t o0 = D == 1 ? FN(m_sums_d1)(v, sv, C, w, m, var, I, O) : 0; /* the outputs before o0 are summed */
    for (int64_t o = o0; o < O; o++) w[o] = 0;
    for (int64_t k = o0 * D; k < O * D; k++) { m[k] = 0; var[k] = 0; }
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = o0; o < O; o++) {
            real c = C[i * O + o];
            w[o] += c;
            for (int64_t d = 0; d < D; d++) m[o * D + d] += c * v[i * sv + o * D + d];
        }
    for (int64_t o = o0; o < O; o++) {
        real den = w[o] > (real)MIN_TOTAL ? w[o] : (real)MIN_TOTAL;
        for (int64_t d = 0; d < D; d++) m[o * D + d] /= den;
    }
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = o0; o < O; o++) {
            real c = C[i * O + o];
            for (int64_t d = 0; d < D; d++) {
                real dev = v[i * sv + o * D + d] - m[o * D + d];
                var[o * D + d] += c * dev * dev;
            }
        }
    for (int64_t o = 0; o < O; o++) {
        real den = w[o] > (real)MIN_TOTAL ? w[o] : (real)MIN_TOTAL;
        real log_var_sum = 0;
        for (int64_t d = 0; d < D; d++) {
            var[o * D + d] = var[o * D + d] / den + min_var;
            log_var_sum += LOG(var[o * D + d]);
        }
        lvs[o] = log_var_sum;
        real chi = ((real)0.5 * log_var_sum + (real)D * (real)HALF_1_LOG_2PI) * w[o];
        real ba = beta_a ? beta_a[o] : (real)0, bu = beta_u ? beta_u[o] : (real)0;
        la[o] = lambda * (ba - bu * w[o] - chi);
    }
}

/* The E-step: C (I, O) = softmax_o(logsigmoid(la_o) + log P_io) with the diagonal Gaussian density;
 * base (O + O * D) is scratch for the terms that do not depend on the input. */
static void FN(e_step)(const real *v, int64_t sv, const real *m, const real *var, const real *lvs, const real *la,
                       real *C, real *base, int64_t I, int64_t O, int64_t D)
{
    D = FIXED_D(D);
    real *half_inv = base + O; /* (O, D): 1 / (2 var) */
    for (int64_t o = 0; o < O; o++) {
        for (int64_t d = 0; d < D; d++) half_inv[o * D + d] = (real)0.5 / var[o * D + d];
        /* log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)), one exp and one log1p per output */
        real log_sig = (la[o] < 0 ? la[o] : (real)0) - LOG1P(FN(exp_floor)(la[o] < 0 ? la[o] : -la[o]));
        base[o] = log_sig - (real)0.5 * ((real)D * (real)LOG_2PI + lvs[o]);
    }
    for (int64_t i = 0; i < I; i++) {
        real *c = C + i * O;
        for (int64_t o = 0; o < O; o++) {
            real quad = 0;
            for (int64_t d = 0; d < D; d++) {
                real dev = v[i * sv + o * D + d] - m[o * D + d];
                quad += dev * dev * half_inv[o * D + d];
            }
            c[o] = base[o] - quad;
        }
        real top = c[0];
        for (int64_t o = 1; o < O; o++) top = c[o] > top ? c[o] : top;
        real total = 0;
        for (int64_t o = 0; o < O; o++) { c[o] = FN(exp_floor)(c[o] - top); total += c[o]; }
        real inv_total = (real)1 / total; /* one division: a vector division per output was a quarter of it */
        for (int64_t o = 0; o < O; o++) c[o] *= inv_total;
    }
}

static real FN(sigmoid)(real x)
{
    real e = FN(exp_floor)(x >= 0 ? -x : x);
    return x >= 0 ? (real)1 / ((real)1 + e) : e / ((real)1 + e);
}

static int FN(em_forward_groups)(const FN(em_args) *a, int64_t g0, int64_t g1)
{
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    real *buffer = malloc(sizeof(real) * (IO + 3 * OD + 4 * O));
    if (!buffer) return -1;
    real *C = buffer, *m = C + IO, *var = m + OD, *w = var + OD, *lvs = w + O, *la = lvs + O, *base = la + O;
    for (int64_t g = g0; g < g1; g++) {
        const real *v = a->v + g * a->sG;
        for (int64_t k = 0; k < IO; k++) C[k] = (real)1 / (real)O;
        for (int t = 0; t < a->T; t++) {
            FN(m_step)(v, a->sI, C, w, m, var, lvs, la, a->beta_a, a->beta_u, a->lambdas[t], a->min_var, I, O, D);
            if (t < a->T - 1) FN(e_step)(v, a->sI, m, var, lvs, la, C, base, I, O, D);
        }
        for (int64_t o = 0; o < O; o++) {
            real s = FN(sigmoid)(la[o]);
            a->act[g * O + o] = s;
            for (int64_t d = 0; d < D; d++) a->out[g * OD + o * D + d] = s * m[o * D + d];
        }
    }
    free(buffer);
    return 0;
}

/* ------------------------------------------------------------ EM routing, lane-wise
 * em_forward_groups and em_backward_groups with EM_LANES problems at a time, one per vector lane: the votes of a
 * tile are gathered into V (I, O, D) of lane vectors (lanes past the last group get zero votes, whose results are
 * dropped), and every step is the per-problem code's arithmetic in the same order, element-wise over the lanes.
 * Small problems (li2019's toy layers: I = 4 heads, O = 32 outputs, D = 1) spend most of the per-problem code's
 * time on loop overhead and horizontal reductions over O; here no reduction crosses lanes, and each vector call
 * of exp/log serves EM_LANES problems.  onmt_ext/kernels.py chooses between the two by size. */
#define EM_LANES ((int64_t)(EM_LANE_BYTES / sizeof(real)))
/* loops over the lanes stay loops for the vectoriser (fully unrolled, their exp/log calls stayed scalar) */
#define LANE_LOOP _Pragma("GCC unroll 0")
typedef real FN(lanes) __attribute__((vector_size(EM_LANE_BYTES), aligned(EM_LANE_BYTES)));

/* exp_floor and LOG lane by lane (each loop is one call of glibc's vector function) */
static inline FN(lanes) FN(lanes_exp_floor)(FN(lanes) x)
{
    FN(lanes) y;
    LANE_LOOP
    for (int64_t l = 0; l < EM_LANES; l++) y[l] = FN(exp_floor)(x[l]);
    return y;
}

static inline FN(lanes) FN(lanes_log)(FN(lanes) x)
{
    FN(lanes) y;
    LANE_LOOP
    for (int64_t l = 0; l < EM_LANES; l++) y[l] = LOG(x[l]);
    return y;
}

static inline FN(lanes) FN(lanes_max)(FN(lanes) x, FN(lanes) z)
{
    FN(lanes) y;
    LANE_LOOP
    for (int64_t l = 0; l < EM_LANES; l++) y[l] = x[l] > z[l] ? x[l] : z[l];
    return y;
}

/* log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)) */
static inline FN(lanes) FN(lanes_log_sigmoid)(FN(lanes) x)
{
    FN(lanes) y;
    LANE_LOOP
    for (int64_t l = 0; l < EM_LANES; l++)
        y[l] = (x[l] < 0 ? x[l] : (real)0) - LOG1P(FN(exp_floor)(x[l] < 0 ? x[l] : -x[l]));
    return y;
}

static inline FN(lanes) FN(lanes_sigmoid)(FN(lanes) x)
{
    FN(lanes) y;
    LANE_LOOP
    for (int64_t l = 0; l < EM_LANES; l++) {
        real e = FN(exp_floor)(x[l] < 0 ? x[l] : -x[l]);
        y[l] = x[l] < 0 ? e / ((real)1 + e) : (real)1 / ((real)1 + e);
    }
    return y;
}

static inline FN(lanes) FN(lanes_sqrt)(FN(lanes) x)
{
    FN(lanes) y;
    LANE_LOOP
    for (int64_t l = 0; l < EM_LANES; l++) y[l] = SQRT(x[l]);
    return y;
}

/* y where x >= threshold, else 0 */
static inline FN(lanes) FN(lanes_where_ge)(FN(lanes) x, real threshold, FN(lanes) y)
{
    FN(lanes) z;
    LANE_LOOP
    for (int64_t l = 0; l < EM_LANES; l++) z[l] = x[l] >= threshold ? y[l] : (real)0;
    return z;
}

/* Gathers the votes of groups g .. g + lanes - 1 (group g at v + g sG, its input i at + i sI, each input's (O, D)
 * block contiguous, OD reals) into V (I, O, D) of lanes, zeros in the lanes past them. */
static void FN(lanes_gather)(const real *v, int64_t sG, int64_t sI, int64_t I, int64_t OD, int64_t g, int64_t lanes,
                             FN(lanes) *restrict V)
{
    for (int64_t k = 0; k < I * OD; k++) V[k] = (FN(lanes)){0};
    for (int64_t l = 0; l < lanes; l++) {
        const real *vg = v + (g + l) * sG;
        for (int64_t i = 0; i < I; i++)
            for (int64_t k = 0; k < OD; k++) V[i * OD + k][l] = vg[i * sI + k];
    }
}

/* The backward pass of a softmax over the O outputs of each of the I rows, C = softmax(z): r_io = C_io (gC_io -
 * sum_o' gC_io' C_io'), stored in out, or added to it when add. */
static void FN(lanes_softmax_rows_backward)(const FN(lanes) *restrict C, const FN(lanes) *restrict gC,
                                            FN(lanes) *restrict out, int64_t I, int64_t O, int add)
{
    for (int64_t i = 0; i < I; i++) {
        FN(lanes) dot = {0};
        for (int64_t o = 0; o < O; o++) dot += gC[i * O + o] * C[i * O + o];
        for (int64_t o = 0; o < O; o++) {
            FN(lanes) r = C[i * O + o] * (gC[i * O + o] - dot);
            out[i * O + o] = add ? out[i * O + o] + r : r;
        }
    }
}

/* m_step, lane-wise, output by output (the sums over the inputs in m_step's order). */
static void FN(lanes_m_step)(const FN(lanes) *restrict V, const FN(lanes) *restrict C, FN(lanes) *restrict w,
                             FN(lanes) *restrict m, FN(lanes) *restrict var, FN(lanes) *restrict lvs,
                             FN(lanes) *restrict la, const real *beta_a, const real *beta_u, real lambda,
                             real min_var, int64_t I, int64_t O, int64_t D)
{
    typedef FN(lanes) lv;
    D = FIXED_D(D);
    const lv zero = {0}, min_total = zero + (real)MIN_TOTAL;
    const real chi_d = (real)D * (real)HALF_1_LOG_2PI;
    for (int64_t o = 0; o < O; o++) {
        lv wo = zero, s = zero;
        for (int64_t i = 0; i < I; i++) wo += C[i * O + o];
        lv den = FN(lanes_max)(wo, min_total);
        for (int64_t d = 0; d < D; d++) {
            lv mo = zero, vo = zero;
            for (int64_t i = 0; i < I; i++) mo += C[i * O + o] * V[(i * O + o) * D + d];
            mo /= den;
            for (int64_t i = 0; i < I; i++) {
                lv dev = V[(i * O + o) * D + d] - mo;
                vo += C[i * O + o] * dev * dev;
            }
            vo = vo / den + min_var;
            m[o * D + d] = mo;
            var[o * D + d] = vo;
            s += FN(lanes_log)(vo);
        }
        real ba = beta_a ? beta_a[o] : (real)0, bu = beta_u ? beta_u[o] : (real)0;
        w[o] = wo;
        lvs[o] = s;
        la[o] = lambda * (ba - bu * wo - ((real)0.5 * s + chi_d) * wo);
    }
}

/* e_step, lane-wise: the couplings C (I, O) of the next iteration; base (O) and hv (O, D) are scratch. */
static void FN(lanes_e_step)(const FN(lanes) *restrict V, const FN(lanes) *restrict m, const FN(lanes) *restrict var,
                             const FN(lanes) *restrict lvs, const FN(lanes) *restrict la, FN(lanes) *restrict C,
                             FN(lanes) *restrict base, FN(lanes) *restrict hv, int64_t I, int64_t O, int64_t D)
{
    typedef FN(lanes) lv;
    D = FIXED_D(D);
    const lv zero = {0};
    const real half_log_2pi_d = (real)0.5 * (real)D * (real)LOG_2PI;
    for (int64_t o = 0; o < O; o++) base[o] = FN(lanes_log_sigmoid)(la[o]) - half_log_2pi_d - (real)0.5 * lvs[o];
    for (int64_t k = 0; k < O * D; k++) hv[k] = (real)0.5 / var[k];
    for (int64_t i = 0; i < I; i++) {
        lv *c = C + i * O, best = zero, total = zero;
        for (int64_t o = 0; o < O; o++) {
            lv quad = zero;
            for (int64_t d = 0; d < D; d++) {
                lv dev = V[(i * O + o) * D + d] - m[o * D + d];
                quad += dev * dev * hv[o * D + d];
            }
            c[o] = base[o] - quad;
            best = o == 0 ? c[o] : FN(lanes_max)(c[o], best);
        }
        for (int64_t o = 0; o < O; o++) {
            c[o] = FN(lanes_exp_floor)(c[o] - best);
            total += c[o];
        }
        lv inv_total = (real)1 / total;
        for (int64_t o = 0; o < O; o++) c[o] *= inv_total;
    }
}

static int FN(em_forward_lanes)(const FN(em_args) *a, int64_t g0, int64_t g1)
{
    typedef FN(lanes) lv;
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    lv *buffer = aligned_alloc(sizeof(lv), sizeof(lv) * (size_t)(IO * D + IO + 3 * OD + 4 * O));
    if (!buffer) return -1;
    lv *V = buffer, *C = V + IO * D, *m = C + IO, *var = m + OD, *hv = var + OD, *w = hv + OD, *lvs = w + O,
       *la = lvs + O, *base = la + O;
    for (int64_t g = g0; g < g1; g += EM_LANES) {
        int64_t lanes = g1 - g < EM_LANES ? g1 - g : EM_LANES;
        FN(lanes_gather)(a->v, a->sG, a->sI, I, OD, g, lanes, V);
        for (int64_t k = 0; k < IO; k++) C[k] = (lv){0} + (real)1 / (real)O;
        for (int t = 0; t < a->T; t++) {
            FN(lanes_m_step)(V, C, w, m, var, lvs, la, a->beta_a, a->beta_u, a->lambdas[t], a->min_var, I, O, D);
            if (t < a->T - 1) FN(lanes_e_step)(V, m, var, lvs, la, C, base, hv, I, O, D);
        }
        for (int64_t o = 0; o < O; o++) base[o] = FN(lanes_sigmoid)(la[o]);
        for (int64_t l = 0; l < lanes; l++)
            for (int64_t o = 0; o < O; o++) {
                real s = base[o][l];
                a->act[(g + l) * O + o] = s;
                for (int64_t d = 0; d < D; d++) a->out[(g + l) * OD + o * D + d] = s * m[o * D + d][l];
            }
    }
    free(buffer);
    return 0;
}

/* em_backward_groups, lane-wise (the same steps, in the same order, on EM_LANES problems at a time). */
static int FN(em_backward_lanes)(const FN(em_args) *a, int64_t g0, int64_t g1)
{
    typedef FN(lanes) lv;
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    int T = a->T;
    size_t size = (size_t)T * (IO + 2 * OD + 3 * O) + 2 * IO * D + 2 * IO + 7 * OD + 7 * O;
    lv *buffer = aligned_alloc(sizeof(lv), sizeof(lv) * size);
    if (!buffer) return -1;
    lv *Cs = buffer, *ms = Cs + T * IO, *vars = ms + T * OD, *ws = vars + T * OD, *lvss = ws + T * O;
    lv *las = lvss + T * O, *V = las + T * O, *gV = V + IO * D, *gC = gV + IO * D, *gz = gC + IO, *gm = gz + IO;
    lv *gvar = gm + OD, *glv = gvar + OD, *Q = glv + OD, *h = Q + OD, *hv = h + OD, *go = hv + OD, *gla = go + OD;
    lv *gw = gla + O, *gden = gw + O, *gln = gden + O, *gba = gln + O, *gbu = gba + O, *base = gbu + O;
    const lv zero = {0}, min_total = zero + (real)MIN_TOTAL;
    for (int64_t g = g0; g < g1; g += EM_LANES) {
        int64_t lanes = g1 - g < EM_LANES ? g1 - g : EM_LANES;
        FN(lanes_gather)(a->v, a->sG, a->sI, I, OD, g, lanes, V);
        for (int64_t k = 0; k < IO; k++) Cs[k] = zero + (real)1 / (real)O;
        for (int t = 0; t < T; t++) {
            FN(lanes_m_step)(V, Cs + t * IO, ws + t * O, ms + t * OD, vars + t * OD, lvss + t * O, las + t * O,
                             a->beta_a, a->beta_u, a->lambdas[t], a->min_var, I, O, D);
            if (t < T - 1)
                FN(lanes_e_step)(V, ms + t * OD, vars + t * OD, lvss + t * O, las + t * O, Cs + (t + 1) * IO, base,
                                 hv, I, O, D);
        }
        /* the outputs: out = sigmoid(la) m, act = sigmoid(la) */
        for (int64_t k = 0; k < OD; k++) go[k] = zero;
        for (int64_t o = 0; o < O; o++) gla[o] = zero;
        for (int64_t l = 0; l < lanes; l++) {
            for (int64_t k = 0; a->g_out && k < OD; k++) go[k][l] = a->g_out[(g + l) * OD + k];
            for (int64_t o = 0; a->g_act && o < O; o++) gla[o][l] = a->g_act[(g + l) * O + o];
        }
        {
            const lv *m = ms + (T - 1) * OD, *la = las + (T - 1) * O;
            for (int64_t o = 0; o < O; o++) {
                lv sg = FN(lanes_sigmoid)(la[o]), gs = gla[o];
                for (int64_t d = 0; d < D; d++) {
                    gs += go[o * D + d] * m[o * D + d];
                    gm[o * D + d] = go[o * D + d] * sg;
                }
                gla[o] = gs * sg * ((real)1 - sg);
            }
        }
        for (int64_t o = 0; o < O; o++) { gba[o] = zero; gbu[o] = zero; }
        for (int t = T - 1; t >= 0; t--) {
            const lv *C = Cs + t * IO, *m = ms + t * OD, *var = vars + t * OD, *w = ws + t * O, *la = las + t * O;
            const lv *lvs = lvss + t * O;
            real lambda = a->lambdas[t];
            for (int64_t k = 0; k < OD; k++) { gvar[k] = zero; glv[k] = zero; }
            if (t < T - 1) {
                /* C^{t+1} = softmax_o(z), z_io = logsigmoid(la_o) + log P_io */
                const lv *C1 = Cs + (t + 1) * IO;
                for (int64_t k = 0; k < OD; k++) {
                    gm[k] = zero;
                    hv[k] = (real)0.5 / var[k];
                    h[k] = hv[k] / var[k];
                }
                FN(lanes_softmax_rows_backward)(C1, gC, gz, I, O, 0);
                for (int64_t o = 0; o < O; o++) gln[o] = zero;
                for (int64_t i = 0; i < I; i++)
                    for (int64_t o = 0; o < O; o++) gln[o] += gz[i * O + o];
                for (int64_t o = 0; o < O; o++) {
                    gla[o] = gln[o] * FN(lanes_sigmoid)(-la[o]); /* d logsigmoid(x) / dx = sigmoid(-x) */
                    for (int64_t d = 0; d < D; d++) glv[o * D + d] = (real)-0.5 * gln[o];
                }
                /* log P_io = -1/2 sum_d dev2 / var + log_norm_o: the var part */
                for (int64_t i = 0; i < I; i++)
                    for (int64_t o = 0; o < O; o++)
                        for (int64_t d = 0; d < D; d++) {
                            lv dev = V[(i * O + o) * D + d] - m[o * D + d];
                            gvar[o * D + d] += gz[i * O + o] * dev * dev * h[o * D + d];
                        }
            }
            /* through la = lambda (beta_a - beta_u w - chi), chi = (1/2 lvs + D c) w */
            for (int64_t o = 0; o < O; o++) {
                real bu = a->beta_u ? a->beta_u[o] : (real)0;
                lv g_la = lambda * gla[o], inv_den = (real)1 / FN(lanes_max)(w[o], min_total), gd = zero;
                gba[o] += g_la;
                gbu[o] -= g_la * w[o];
                gw[o] = -g_la * bu - g_la * ((real)0.5 * lvs[o] + (real)D * (real)HALF_1_LOG_2PI);
                for (int64_t d = 0; d < D; d++) {
                    int64_t k = o * D + d;
                    lv gv = gvar[k] + (glv[k] - (real)0.5 * g_la * w[o]) / var[k];
                    Q[k] = gv * inv_den;
                    gd -= gv * (var[k] - a->min_var) * inv_den;
                }
                gden[o] = gd;
            }
            /* through dev = v - m (the M-step's variance and, but after the last, the E-step's density) */
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    lv c = C[i * O + o], gc = zero;
                    for (int64_t d = 0; d < D; d++) {
                        int64_t k = o * D + d, n = (i * O + o) * D + d;
                        lv gdev2 = c * Q[k];
                        if (t < T - 1) gdev2 -= gz[i * O + o] * hv[k]; /* the E-step's density; hv is set above */
                        lv dev = V[n] - m[k], gdev = 2 * dev * gdev2;
                        gc += Q[k] * dev * dev;
                        gV[n] = t == T - 1 ? gdev : gV[n] + gdev;
                        gm[k] -= gdev;
                    }
                    gC[i * O + o] = gc;
                }
            for (int64_t o = 0; o < O; o++) {
                lv den = FN(lanes_max)(w[o], min_total);
                for (int64_t d = 0; d < D; d++) {
                    int64_t k = o * D + d;
                    gden[o] -= gm[k] * m[k] / den;
                    gm[k] /= den; /* now the gradient of sum_i C v */
                }
                gw[o] += FN(lanes_where_ge)(w[o], (real)MIN_TOTAL, gden[o]);
            }
            /* through the mean's sum_i C v and w = sum_i C */
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    lv c = C[i * O + o], gc = gw[o];
                    for (int64_t d = 0; d < D; d++) {
                        int64_t k = o * D + d, n = (i * O + o) * D + d;
                        gc += gm[k] * V[n];
                        gV[n] += c * gm[k];
                    }
                    gC[i * O + o] += gc;
                }
        }
        for (int64_t l = 0; l < lanes; l++) {
            real *gv = a->g_v + (g + l) * a->sG;
            for (int64_t i = 0; i < I; i++)
                for (int64_t k = 0; k < OD; k++) gv[i * a->sI + k] = gV[i * OD + k][l];
            for (int64_t o = 0; o < O; o++) {
                a->g_beta_a[(g + l) * O + o] = gba[o][l];
                a->g_beta_u[(g + l) * O + o] = gbu[o][l];
            }
        }
    }
    free(buffer);
    return 0;
}

/* Through the activation logit la = lambda (beta_a - beta_u w - chi), chi = (1/2 lvs + D c) w, of one M-step
 * (lvs = sum_d log var), given gla: adds to the betas' gradients gba, gbu (O), sets gw (O), the denominator's
 * gden (O) and Q (O, D), the gradient of sum_i C dev2; glv and gvar (O, D) hold what the E-step after it gave
 * (zeros after the last). */
static void FN(em_activation_backward)(const real *restrict gla, const real *restrict w, const real *restrict var,
                                       const real *restrict lvs, const real *restrict beta_u, real lambda,
                                       real min_var, real *restrict gba, real *restrict gbu, real *restrict gw,
                                       real *restrict glv, real *restrict gvar, real *restrict Q, real *restrict gden,
                                       int64_t O, int64_t D)
{
    D = FIXED_D(D);
    for (int64_t o = 0; o < O; o++) {
        real bu = beta_u ? beta_u[o] : (real)0;
        real g_la = lambda * gla[o];
        gba[o] += g_la;
        gbu[o] -= g_la * w[o];
        real gchi = -g_la;
        gw[o] = -g_la * bu + gchi * ((real)0.5 * lvs[o] + (real)D * (real)HALF_1_LOG_2PI);
        real inv_den = (real)1 / (w[o] > (real)MIN_TOTAL ? w[o] : (real)MIN_TOTAL), gd = 0;
        for (int64_t d = 0; d < D; d++) {
            int64_t k = o * D + d;
            real gv = gvar[k] + (glv[k] + (real)0.5 * gchi * w[o]) / var[k];
            gvar[k] = gv;
            Q[k] = gv * inv_den;                           /* gradient of sum_i C dev2 */
            gd -= gv * (var[k] - min_var) * inv_den;
        }
        gden[o] = gd;
    }
}

/* Backward of the E-step's softmax C1 = softmax_o(z) (I, O): gz_io = C1_io (gC_io - sum_o' gC_io' C1_io'),
 * and gln_o = sum_i gz_io. */
static void FN(em_softmax_backward)(const real *restrict C1, const real *restrict gC, real *restrict gz,
                                    real *restrict gln, int64_t I, int64_t O)
{
    for (int64_t o = 0; o < O; o++) gln[o] = 0;
    for (int64_t i = 0; i < I; i++) {
        const real *restrict c1 = C1 + i * O, *restrict gc = gC + i * O;
        real *restrict z = gz + i * O;
        real dot = 0;
        for (int64_t o = 0; o < O; o++) dot += gc[o] * c1[o];
        for (int64_t o = 0; o < O; o++) {
            z[o] = c1[o] * (gc[o] - dot);
            gln[o] += z[o];
        }
    }
}

/* The E-step's log-density through the variance: gvar_od += sum_i gz_io (v_iod - m_od)^2 h_od, h = 1 / (2 var^2). */
static void FN(em_density_var_backward)(const real *restrict v, int64_t sv, const real *restrict gz,
                                        const real *restrict m, const real *restrict h, real *restrict gvar,
                                        int64_t I, int64_t O, int64_t D)
{
    D = FIXED_D(D);
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++) {
            real z = gz[i * O + o];
            for (int64_t d = 0; d < D; d++) {
                int64_t k = o * D + d;
                real dev = v[i * sv + o * D + d] - m[k];
                gvar[k] += z * dev * dev * h[k];
            }
        }
}

/* Through the deviations dev = v - m, which enter the M-step's variance (weight C_io Q_od) and, when gz is given,
 * the E-step's density (weight -gz_io hv_od, hv = 1 / (2 var)): gC_io = sum_d Q_od dev^2, g_dev = 2 dev (C Q - gz hv),
 * gv = g_dev (assign) or gv += g_dev, gm_od -= sum_i g_dev.  Inlined with constant flags, so that each variant's
 * loops vectorise. */
static inline __attribute__((always_inline)) void FN(em_deviation_backward)(
    const real *restrict v, int64_t sv, const real *restrict C, const real *restrict gz, const real *restrict m,
    const real *restrict Q, const real *restrict hv, real *restrict gv, real *restrict gm, real *restrict gC,
    int64_t I, int64_t O, int64_t D, int density, int assign)
{
    D = FIXED_D(D);
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++) {
            real c = C[i * O + o], z = density ? gz[i * O + o] : (real)0, gc = 0;
            for (int64_t d = 0; d < D; d++) {
                int64_t k = o * D + d, n = i * sv + o * D + d;
                real dev = v[n] - m[k];
                real gdev2 = density ? c * Q[k] - z * hv[k] : c * Q[k];
                gc += Q[k] * dev * dev;
                real gdev = 2 * dev * gdev2;
                gv[n] = assign ? gdev : gv[n] + gdev;
                gm[k] -= gdev;
            }
            gC[i * O + o] = gc;
        }
}

/* Through the M-step's mean m = sum_i C v / den, given gm already divided by den, and through w = sum_i C
 * (gradient gw): gC_io += gw_o + sum_d gm_od v_iod, gv_iod += C_io gm_od. */
static void FN(em_mean_backward)(const real *restrict v, int64_t sv, const real *restrict C, const real *restrict gw,
                                 const real *restrict gm, real *restrict gv, real *restrict gC, int64_t I, int64_t O,
                                 int64_t D)
{
    D = FIXED_D(D);
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++) {
            real c = C[i * O + o], gc = gw[o];
            for (int64_t d = 0; d < D; d++) {
                int64_t k = o * D + d, n = i * sv + o * D + d;
                gc += gm[k] * v[n];
                gv[n] += c * gm[k];
            }
            gC[i * O + o] += gc;
        }
}

static int FN(em_backward_groups)(const FN(em_args) *a, int64_t g0, int64_t g1)
{
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    int T = a->T;
    size_t size = (size_t)T * (IO + 2 * OD + 3 * O) + 2 * IO + 7 * OD + 4 * O; /* gln is also the E-step's scratch */
    real *buffer = malloc(sizeof(real) * size);
    if (!buffer) return -1;
    real *Cs = buffer, *ms = Cs + T * IO, *vars = ms + T * OD, *ws = vars + T * OD, *lvss = ws + T * O;
    real *las = lvss + T * O, *gC = las + T * O, *gz = gC + IO, *gm = gz + IO, *gvar = gm + OD, *glv = gvar + OD;
    real *Q = glv + OD, *h = Q + OD, *hv = h + OD, *gla = hv + OD, *gw = gla + O, *gden = gw + O, *gln = gden + O;
    for (int64_t g = g0; g < g1; g++) {
        const real *v = a->v + g * a->sG;
        real *gv = a->g_v + g * a->sG;
        for (int64_t k = 0; k < IO; k++) Cs[k] = (real)1 / (real)O;
        for (int t = 0; t < T; t++) {
            FN(m_step)(v, a->sI, Cs + t * IO, ws + t * O, ms + t * OD, vars + t * OD, lvss + t * O, las + t * O,
                       a->beta_a, a->beta_u, a->lambdas[t], a->min_var, I, O, D);
            if (t < T - 1)
                FN(e_step)(v, a->sI, ms + t * OD, vars + t * OD, lvss + t * O, las + t * O, Cs + (t + 1) * IO, gln, I,
                           O, D);
        }
        /* the outputs: out = sigmoid(la) m, act = sigmoid(la) */
        {
            const real *m = ms + (T - 1) * OD, *la = las + (T - 1) * O;
            for (int64_t o = 0; o < O; o++) {
                real s = FN(sigmoid)(la[o]);
                real gs = a->g_act ? a->g_act[g * O + o] : (real)0;
                for (int64_t d = 0; d < D; d++) {
                    real go = a->g_out ? a->g_out[g * OD + o * D + d] : (real)0;
                    gs += go * m[o * D + d];
                    gm[o * D + d] = go * s;
                }
                gla[o] = gs * s * ((real)1 - s);
            }
        }
        for (int64_t o = 0; o < O; o++) { a->g_beta_a[g * O + o] = 0; a->g_beta_u[g * O + o] = 0; }
        for (int t = T - 1; t >= 0; t--) {
            const real *C = Cs + t * IO, *m = ms + t * OD, *var = vars + t * OD, *w = ws + t * O, *la = las + t * O;
            real lambda = a->lambdas[t];
            for (int64_t k = 0; k < OD; k++) { gvar[k] = 0; glv[k] = 0; }
            if (t < T - 1) {
                /* C^{t+1} = softmax_o(z), z_io = logsigmoid(la_o) + log P_io */
                for (int64_t o = 0; o < O; o++) gla[o] = 0;
                for (int64_t k = 0; k < OD; k++) {
                    gm[k] = 0;
                    hv[k] = (real)0.5 / var[k];
                    h[k] = hv[k] / var[k];
                }
                FN(em_softmax_backward)(Cs + (t + 1) * IO, gC, gz, gln, I, O);
                for (int64_t o = 0; o < O; o++) {
                    gla[o] = gln[o] * FN(sigmoid)(-la[o]);  /* d logsigmoid(x) / dx = sigmoid(-x) */
                    for (int64_t d = 0; d < D; d++) glv[o * D + d] = (real)-0.5 * gln[o];
                }
                /* log P_io = -1/2 sum_d dev2 / var + log_norm_o: the var part (dev2's part is added below) */
                FN(em_density_var_backward)(v, a->sI, gz, m, h, gvar, I, O, D);
            }
            FN(em_activation_backward)(gla, w, var, lvss + t * O, a->beta_u, lambda, a->min_var, a->g_beta_a + g * O,
                                       a->g_beta_u + g * O, gw, glv, gvar, Q, gden, O, D);
            /* var = sum_i C dev2 / den + min_var, dev2 = (v - m)^2, m = sum_i C v / den; then the E-step's dev2 part
             * (the first visit writes gv, the later ones add to it) */
            if (t < T - 1)
                FN(em_deviation_backward)(v, a->sI, C, gz, m, Q, hv, gv, gm, gC, I, O, D, 1, 0);
            else
                FN(em_deviation_backward)(v, a->sI, C, NULL, m, Q, NULL, gv, gm, gC, I, O, D, 0, 1);
            for (int64_t o = 0; o < O; o++) {
                real den = w[o] > (real)MIN_TOTAL ? w[o] : (real)MIN_TOTAL;
                for (int64_t d = 0; d < D; d++) {
                    int64_t k = o * D + d;
                    gden[o] -= gm[k] * m[k] / den;
                    gm[k] /= den;                                /* now the gradient of sum_i C v */
                }
                gw[o] += w[o] >= (real)MIN_TOTAL ? gden[o] : (real)0;
            }
            FN(em_mean_backward)(v, a->sI, C, gw, gm, gv, gC, I, O, D);
        }
    }
    free(buffer);
    return 0;
}

/* ------------------------------------------------------------ simple routing, lane-wise (S = 1)
 * simple_forward_groups and simple_backward_groups for problems with their own votes (S = 1), EM_LANES problems
 * at a time, one per vector lane, as the EM kernels above: the same steps in the same order, element-wise over
 * the lanes.  Lanes past the last problem get zero votes and a full mask; their results are dropped. */

/* Gathers problems p .. p + lanes - 1: votes V (I, O, D), keep K (I) and starting logits B (I, O) of lanes. */
static void FN(lanes_simple_gather)(const FN(simple_args) *a, int64_t p, int64_t lanes, FN(lanes) *restrict V,
                                    FN(lanes) *restrict K, FN(lanes) *restrict B)
{
    int64_t I = a->I, O = a->O, OD = O * FIXED_D(a->D), IO = I * O;
    FN(lanes_gather)(a->v, I * OD, OD, I, OD, p, lanes, V);
    for (int64_t k = 0; k < IO; k++) B[k] = (FN(lanes)){0};
    for (int64_t i = 0; i < I; i++) K[i] = (FN(lanes)){0} + (real)1;
    for (int64_t l = 0; l < lanes; l++) {
        for (int64_t i = 0; a->keep && i < I; i++) K[i][l] = a->keep[(p + l) * I + i];
        for (int64_t i = 0; a->init && i < I; i++)
            for (int64_t o = 0; o < O; o++)
                B[i * O + o][l] = K[i][l] != 0 ? a->init[(p + l) * IO + i * O + o] : (real)0;
    }
}

/* coupling, lane-wise: C (I, O) from B (I, O) and keep K (I). */
static void FN(lanes_coupling)(const FN(lanes) *restrict B, const FN(lanes) *restrict K, FN(lanes) *restrict C,
                               int64_t I, int64_t O, int normalize_inputs)
{
    typedef FN(lanes) lv;
    const lv zero = {0};
    if (!normalize_inputs) {
        for (int64_t i = 0; i < I; i++) {
            const lv *b = B + i * O;
            lv *c = C + i * O, top = b[0], total = zero;
            for (int64_t o = 1; o < O; o++) top = FN(lanes_max)(b[o], top);
            for (int64_t o = 0; o < O; o++) {
                c[o] = FN(lanes_exp_floor)(b[o] - top);
                total += c[o];
            }
            lv scale = K[i] / total;
            for (int64_t o = 0; o < O; o++) c[o] *= scale;
        }
        return;
    }
    for (int64_t o = 0; o < O; o++) {
        lv top = zero, any = zero, total = zero;
        for (int64_t i = 0; i < I; i++) { /* the largest logit of the kept inputs (0 when none is kept) */
            lv b = B[i * O + o];
            for (int64_t l = 0; l < EM_LANES; l++)
                if (K[i][l] != 0) {
                    top[l] = any[l] == 0 || b[l] > top[l] ? b[l] : top[l];
                    any[l] = 1;
                }
        }
        for (int64_t i = 0; i < I; i++) {
            lv e = FN(lanes_exp_floor)(B[i * O + o] - top);
            e = FN(lanes_where_ge)(K[i], (real)0.5, e);
            C[i * O + o] = e;
            total += e;
        }
        lv scale;
        for (int64_t l = 0; l < EM_LANES; l++) scale[l] = any[l] != 0 ? (real)1 / total[l] : (real)0;
        for (int64_t i = 0; i < I; i++) C[i * O + o] *= scale;
    }
}

/* simple_outputs and agreement, lane-wise: S (O, D) = sum_i C v [/ total], out = squash(S), B += <v, out>. */
static void FN(lanes_simple_iteration)(const FN(lanes) *restrict V, const FN(lanes) *restrict C,
                                       FN(lanes) *restrict S, FN(lanes) *restrict total, FN(lanes) *restrict out,
                                       FN(lanes) *restrict B, int64_t I, int64_t O, int64_t D, int weighted_mean)
{
    typedef FN(lanes) lv;
    D = FIXED_D(D);
    const lv zero = {0}, min_total = zero + (real)MIN_TOTAL;
    for (int64_t o = 0; o < O; o++) {
        lv tot = zero, sq = zero;
        for (int64_t i = 0; i < I; i++) tot += C[i * O + o];
        total[o] = tot;
        lv den = FN(lanes_max)(tot, min_total);
        for (int64_t d = 0; d < D; d++) {
            lv s = zero;
            for (int64_t i = 0; i < I; i++) s += C[i * O + o] * V[(i * O + o) * D + d];
            if (weighted_mean) s /= den;
            S[o * D + d] = s;
            sq += s * s;
        }
        lv n = FN(lanes_sqrt)(sq + (real)NORM_EPS), f = n / ((real)1 + n * n);
        for (int64_t d = 0; d < D; d++) out[o * D + d] = S[o * D + d] * f;
    }
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++) {
            lv agreement = zero;
            for (int64_t d = 0; d < D; d++) agreement += V[(i * O + o) * D + d] * out[o * D + d];
            B[i * O + o] += agreement;
        }
}

static int FN(simple_forward_lanes)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
    typedef FN(lanes) lv;
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    lv *buffer = aligned_alloc(sizeof(lv), sizeof(lv) * (size_t)(IO * D + 2 * IO + I + 2 * OD + O));
    if (!buffer) return -1;
    lv *V = buffer, *B = V + IO * D, *C = B + IO, *K = C + IO, *S = K + I, *out = S + OD, *total = out + OD;
    for (int64_t p = g0; p < g1; p += EM_LANES) {
        int64_t lanes = g1 - p < EM_LANES ? g1 - p : EM_LANES;
        FN(lanes_simple_gather)(a, p, lanes, V, K, B);
        for (int t = 0; t < a->T; t++) {
            FN(lanes_coupling)(B, K, C, I, O, a->normalize_inputs);
            FN(lanes_simple_iteration)(V, C, S, total, out, B, I, O, D, a->weighted_mean);
        }
        for (int64_t l = 0; l < lanes; l++) {
            for (int64_t k = 0; k < OD; k++) a->out[(p + l) * OD + k] = out[k][l];
            for (int64_t k = 0; k < IO; k++) a->logits[(p + l) * IO + k] = B[k][l];
        }
    }
    free(buffer);
    return 0;
}

static int FN(simple_backward_lanes)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
    typedef FN(lanes) lv;
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    int T = a->T;
    size_t size = (size_t)T * (IO + 2 * OD + O) + 2 * IO * D + 3 * IO + I + 2 * OD + O;
    lv *buffer = aligned_alloc(sizeof(lv), sizeof(lv) * size);
    if (!buffer) return -1;
    lv *Cs = buffer, *Ss = Cs + T * IO, *totals = Ss + T * OD, *outs = totals + T * O, *V = outs + T * OD;
    lv *gV = V + IO * D, *B = gV + IO * D, *gB = B + IO, *gC = gB + IO, *K = gC + IO, *gout = K + I, *gS = gout + OD;
    lv *gtot = gS + OD;
    const lv zero = {0};
    for (int64_t p = g0; p < g1; p += EM_LANES) {
        int64_t lanes = g1 - p < EM_LANES ? g1 - p : EM_LANES;
        FN(lanes_simple_gather)(a, p, lanes, V, K, B);
        for (int t = 0; t < T; t++) {
            FN(lanes_coupling)(B, K, Cs + t * IO, I, O, a->normalize_inputs);
            FN(lanes_simple_iteration)(V, Cs + t * IO, Ss + t * OD, totals + t * O, outs + t * OD, B, I, O, D,
                                       a->weighted_mean);
        }
        for (int64_t k = 0; k < IO; k++) gB[k] = zero;
        for (int64_t k = 0; k < IO * D; k++) gV[k] = zero;
        for (int64_t l = 0; a->g_logits && l < lanes; l++)
            for (int64_t k = 0; k < IO; k++) gB[k][l] = a->g_logits[(p + l) * IO + k];
        for (int t = T - 1; t >= 0; t--) {
            const lv *C = Cs + t * IO, *St = Ss + t * OD, *out = outs + t * OD, *tot = totals + t * O;
            for (int64_t k = 0; k < OD; k++) gout[k] = zero;
            for (int64_t l = 0; t == T - 1 && a->g_out && l < lanes; l++)
                for (int64_t k = 0; k < OD; k++) gout[k][l] = a->g_out[(p + l) * OD + k];
            /* B^{t+1} = B^t + A^t, A_io = <v_io, out_o> */
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    lv ga = gB[i * O + o];
                    for (int64_t d = 0; d < D; d++) {
                        gV[(i * O + o) * D + d] += ga * out[o * D + d];
                        gout[o * D + d] += ga * V[(i * O + o) * D + d];
                    }
                }
            /* out = squash(S); then the weighted mean */
            for (int64_t o = 0; o < O; o++) {
                const lv *so = St + o * D;
                lv sq = zero, dot = zero;
                for (int64_t d = 0; d < D; d++) { sq += so[d] * so[d]; dot += gout[o * D + d] * so[d]; }
                lv n = FN(lanes_sqrt)(sq + (real)NORM_EPS), n2 = n * n, f = n / ((real)1 + n2);
                lv fprime_over_n = ((real)1 - n2) / (((real)1 + n2) * ((real)1 + n2)) / n;
                for (int64_t d = 0; d < D; d++) gS[o * D + d] = gout[o * D + d] * f + so[d] * fprime_over_n * dot;
                gtot[o] = zero;
                if (a->weighted_mean) {
                    lv den = FN(lanes_max)(tot[o], zero + (real)MIN_TOTAL), gden = zero;
                    for (int64_t d = 0; d < D; d++) { gden -= gS[o * D + d] * so[d] / den; gS[o * D + d] /= den; }
                    gtot[o] = FN(lanes_where_ge)(tot[o], (real)MIN_TOTAL, gden);
                }
            }
            /* S_raw = sum_i C_io v_io, total = sum_i C_io */
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    lv c = C[i * O + o], gc = gtot[o];
                    for (int64_t d = 0; d < D; d++) {
                        gc += gS[o * D + d] * V[(i * O + o) * D + d];
                        gV[(i * O + o) * D + d] += c * gS[o * D + d];
                    }
                    gC[i * O + o] = gc;
                }
            /* C = softmax(B^t) (times keep): the softmax backward, added to the identity path of B */
            if (!a->normalize_inputs) {
                FN(lanes_softmax_rows_backward)(C, gC, gB, I, O, 1);
            } else {
                for (int64_t o = 0; o < O; o++) {
                    lv dot = zero;
                    for (int64_t i = 0; i < I; i++) dot += gC[i * O + o] * C[i * O + o];
                    for (int64_t i = 0; i < I; i++) gB[i * O + o] += C[i * O + o] * (gC[i * O + o] - dot);
                }
            }
        }
        for (int64_t l = 0; l < lanes; l++) {
            real *gv = a->g_v + (p + l) * IO * D;
            for (int64_t k = 0; k < IO * D; k++) gv[k] += gV[k][l];
            for (int64_t i = 0; a->g_init && i < I; i++)
                for (int64_t o = 0; o < O; o++)
                    a->g_init[(p + l) * IO + i * O + o] = K[i][l] == 0 ? (real)0 : gB[i * O + o][l];
        }
    }
    free(buffer);
    return 0;
}
