/* Fused CPU routing kernels, one floating type per inclusion (see routing_kernels.c).
 *
 * Each routing problem is computed start to finish in a few small buffers
 * that stay in cache, forward and backward, instead of the few dozen passes
 * over the whole vote tensor that the tensor code of onmt_ext/routing.py
 * makes.  The arithmetic is exactly that of onmt_ext/routing.py (the tests
 * compare the two, values and gradients); the backward pass recomputes the
 * forward iterations of its problem and then runs them in reverse.
 *
 * Layout (row-major, contiguous):
 *   votes  v     (G, I, O, D)   shared by the S problems of group g
 *   keep         (G, S, I)      1 where the input takes part, 0 where masked (or NULL)
 *   init_logits  (G, S, I, O)   (or NULL)
 *   outputs      (G, S, O, D)
 *   logits       (G, S, I, O)
 * EM routing has S = 1 and no mask.
 */

/* ------------------------------------------------------------ simple routing */

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
            for (int64_t o = 0; o < O; o++) { c[o] = EXP(b[o] - top); total += c[o]; }
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
            real e = (keep && keep[i] == 0) ? (real)0 : EXP(B[i * O + o] - top);
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
} FN(simple_args);

static int FN(simple_forward_groups)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    real *C = malloc(sizeof(real) * (IO + OD + O));
    if (!C) return -1;
    real *S = C + IO, *total = S + OD;
    for (int64_t g = g0; g < g1; g++) {
        const real *v = a->v + g * I * OD;
        for (int64_t s = 0; s < a->S; s++) {
            int64_t p = g * a->S + s;
            const real *keep = a->keep ? a->keep + p * I : NULL;
            real *B = a->logits + p * IO, *out = a->out + p * OD;
            FN(start_logits)(a->init ? a->init + p * IO : NULL, keep, B, I, O);
            for (int t = 0; t < a->T; t++) {
                FN(coupling)(B, keep, C, I, O, a->normalize_inputs);
                FN(simple_outputs)(v, C, S, total, out, I, O, D, a->weighted_mean);
                FN(agreement)(v, out, B, I, O, D);
            }
        }
    }
    free(C);
    return 0;
}

static int FN(simple_backward_groups)(const FN(simple_args) *a, int64_t g0, int64_t g1)
{
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
        for (int64_t s = 0; s < a->S; s++) {
            int64_t p = g * a->S + s;
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
    int T;
} FN(em_args);

/* The M-step of one iteration: w, mean m, var, log var and the activation logit la (all per output). */
static void FN(m_step)(const real *v, const real *C, real *w, real *m, real *var, real *la, const real *beta_a,
                       const real *beta_u, real lambda, real min_var, int64_t I, int64_t O, int64_t D)
{
    D = FIXED_D(D);
    int64_t OD = O * D;
    for (int64_t o = 0; o < O; o++) w[o] = 0;
    for (int64_t k = 0; k < OD; k++) { m[k] = 0; var[k] = 0; }
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++) {
            real c = C[i * O + o];
            w[o] += c;
            for (int64_t d = 0; d < D; d++) m[o * D + d] += c * v[(i * O + o) * D + d];
        }
    for (int64_t o = 0; o < O; o++) {
        real den = w[o] > (real)MIN_TOTAL ? w[o] : (real)MIN_TOTAL;
        for (int64_t d = 0; d < D; d++) m[o * D + d] /= den;
    }
    for (int64_t i = 0; i < I; i++)
        for (int64_t o = 0; o < O; o++) {
            real c = C[i * O + o];
            for (int64_t d = 0; d < D; d++) {
                real dev = v[(i * O + o) * D + d] - m[o * D + d];
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
        real chi = ((real)0.5 * log_var_sum + (real)D * (real)HALF_1_LOG_2PI) * w[o];
        real ba = beta_a ? beta_a[o] : (real)0, bu = beta_u ? beta_u[o] : (real)0;
        la[o] = lambda * (ba - bu * w[o] - chi);
    }
}

/* The E-step: C (I, O) = softmax_o(logsigmoid(la_o) + log P_io) with the diagonal Gaussian density;
 * base (O) is scratch for the terms that do not depend on the input. */
static void FN(e_step)(const real *v, const real *m, const real *var, const real *la, real *C, real *base, int64_t I,
                       int64_t O, int64_t D)
{
    D = FIXED_D(D);
    for (int64_t o = 0; o < O; o++) {
        real log_var_sum = 0;
        for (int64_t d = 0; d < D; d++) log_var_sum += LOG(var[o * D + d]);
        real log_sig = la[o] < 0 ? la[o] - LOG1P(EXP(la[o])) : -LOG1P(EXP(-la[o]));
        base[o] = log_sig - (real)0.5 * ((real)D * (real)LOG_2PI + log_var_sum);
    }
    for (int64_t i = 0; i < I; i++) {
        real *c = C + i * O;
        real top = 0;
        for (int64_t o = 0; o < O; o++) {
            real quad = 0;
            for (int64_t d = 0; d < D; d++) {
                real dev = v[(i * O + o) * D + d] - m[o * D + d];
                quad += dev * dev / var[o * D + d];
            }
            c[o] = base[o] - (real)0.5 * quad;
            if (o == 0 || c[o] > top) top = c[o];
        }
        real total = 0;
        for (int64_t o = 0; o < O; o++) { c[o] = EXP(c[o] - top); total += c[o]; }
        for (int64_t o = 0; o < O; o++) c[o] /= total;
    }
}

static real FN(sigmoid)(real x) { return x >= 0 ? (real)1 / ((real)1 + EXP(-x)) : EXP(x) / ((real)1 + EXP(x)); }

static int FN(em_forward_groups)(const FN(em_args) *a, int64_t g0, int64_t g1)
{
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    real *buffer = malloc(sizeof(real) * (IO + 2 * OD + 3 * O));
    if (!buffer) return -1;
    real *C = buffer, *m = C + IO, *var = m + OD, *w = var + OD, *la = w + O, *base = la + O;
    for (int64_t g = g0; g < g1; g++) {
        const real *v = a->v + g * IO * D;
        for (int64_t k = 0; k < IO; k++) C[k] = (real)1 / (real)O;
        for (int t = 0; t < a->T; t++) {
            FN(m_step)(v, C, w, m, var, la, a->beta_a, a->beta_u, a->lambdas[t], a->min_var, I, O, D);
            if (t < a->T - 1) FN(e_step)(v, m, var, la, C, base, I, O, D);
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

static int FN(em_backward_groups)(const FN(em_args) *a, int64_t g0, int64_t g1)
{
    int64_t I = a->I, O = a->O, D = FIXED_D(a->D), IO = I * O, OD = O * D;
    int T = a->T;
    size_t size = (size_t)T * (IO + 2 * OD + 2 * O) + 2 * IO + 4 * OD + 4 * O;
    real *buffer = malloc(sizeof(real) * size);
    if (!buffer) return -1;
    real *Cs = buffer, *ms = Cs + T * IO, *vars = ms + T * OD, *ws = vars + T * OD, *las = ws + T * O;
    real *gC = las + T * O, *gz = gC + IO, *gm = gz + IO, *gvar = gm + OD, *glv = gvar + OD, *Q = glv + OD;
    real *gla = Q + OD, *gw = gla + O, *gden = gw + O, *gln = gden + O;
    const real half_log_term = (real)HALF_1_LOG_2PI;
    for (int64_t g = g0; g < g1; g++) {
        const real *v = a->v + g * IO * D;
        real *gv = a->g_v + g * IO * D;
        for (int64_t k = 0; k < IO; k++) Cs[k] = (real)1 / (real)O;
        for (int t = 0; t < T; t++) {
            FN(m_step)(v, Cs + t * IO, ws + t * O, ms + t * OD, vars + t * OD, las + t * O, a->beta_a, a->beta_u,
                       a->lambdas[t], a->min_var, I, O, D);
            if (t < T - 1) FN(e_step)(v, ms + t * OD, vars + t * OD, las + t * O, Cs + (t + 1) * IO, gln, I, O, D);
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
                const real *C1 = Cs + (t + 1) * IO;
                for (int64_t o = 0; o < O; o++) { gla[o] = 0; gln[o] = 0; }
                for (int64_t k = 0; k < OD; k++) gm[k] = 0;
                for (int64_t i = 0; i < I; i++) {
                    real dot = 0;
                    for (int64_t o = 0; o < O; o++) dot += gC[i * O + o] * C1[i * O + o];
                    for (int64_t o = 0; o < O; o++) {
                        real z = C1[i * O + o] * (gC[i * O + o] - dot);
                        gz[i * O + o] = z;
                        gln[o] += z;
                    }
                }
                for (int64_t o = 0; o < O; o++) {
                    gla[o] = gln[o] * FN(sigmoid)(-la[o]);  /* d logsigmoid(x) / dx = sigmoid(-x) */
                    for (int64_t d = 0; d < D; d++) glv[o * D + d] = (real)-0.5 * gln[o];
                }
                /* log P_io = -1/2 sum_d dev2 / var + log_norm_o: the var part (dev2's part is added below) */
                for (int64_t i = 0; i < I; i++)
                    for (int64_t o = 0; o < O; o++) {
                        real z = gz[i * O + o];
                        for (int64_t d = 0; d < D; d++) {
                            real dev = v[(i * O + o) * D + d] - m[o * D + d];
                            gvar[o * D + d] += (real)0.5 * z * dev * dev / (var[o * D + d] * var[o * D + d]);
                        }
                    }
            }
            /* la = lambda (beta_a - beta_u w - chi), chi = (1/2 sum_d log var + D c) w */
            for (int64_t o = 0; o < O; o++) {
                real bu = a->beta_u ? a->beta_u[o] : (real)0;
                real g_la = lambda * gla[o];
                a->g_beta_a[g * O + o] += g_la;
                a->g_beta_u[g * O + o] -= g_la * w[o];
                real gchi = -g_la;
                real log_var_sum = 0;
                for (int64_t d = 0; d < D; d++) log_var_sum += LOG(var[o * D + d]);
                gw[o] = -g_la * bu + gchi * ((real)0.5 * log_var_sum + (real)D * half_log_term);
                real den = w[o] > (real)MIN_TOTAL ? w[o] : (real)MIN_TOTAL;
                gden[o] = 0;
                for (int64_t d = 0; d < D; d++) {
                    int64_t k = o * D + d;
                    glv[k] += (real)0.5 * gchi * w[o];
                    gvar[k] += glv[k] / var[k];
                    Q[k] = gvar[k] / den;                       /* gradient of sum_i C dev2 */
                    gden[o] -= gvar[k] * (var[k] - a->min_var) / den;
                }
            }
            /* var = sum_i C dev2 / den + min_var, dev2 = (v - m)^2, m = sum_i C v / den; then the E-step's dev2 part */
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    real c = C[i * O + o], gc = 0;
                    real z = t < T - 1 ? gz[i * O + o] : (real)0;
                    for (int64_t d = 0; d < D; d++) {
                        int64_t k = o * D + d;
                        real dev = v[(i * O + o) * D + d] - m[k];
                        real gdev2 = c * Q[k] - (real)0.5 * z / var[k];
                        gc += Q[k] * dev * dev;
                        real gdev = 2 * dev * gdev2;
                        gv[(i * O + o) * D + d] += gdev;
                        gm[k] -= gdev;
                    }
                    gC[i * O + o] = gc;
                }
            for (int64_t o = 0; o < O; o++) {
                real den = w[o] > (real)MIN_TOTAL ? w[o] : (real)MIN_TOTAL;
                for (int64_t d = 0; d < D; d++) {
                    int64_t k = o * D + d;
                    gden[o] -= gm[k] * m[k] / den;
                    gm[k] /= den;                                /* now the gradient of sum_i C v */
                }
                gw[o] += w[o] >= (real)MIN_TOTAL ? gden[o] : (real)0;
            }
            for (int64_t i = 0; i < I; i++)
                for (int64_t o = 0; o < O; o++) {
                    real c = C[i * O + o], gc = gw[o];
                    for (int64_t d = 0; d < D; d++) {
                        int64_t k = o * D + d;
                        gc += gm[k] * v[(i * O + o) * D + d];
                        gv[(i * O + o) * D + d] += c * gm[k];
                    }
                    gC[i * O + o] += gc;
                }
        }
    }
    free(buffer);
    return 0;
}
