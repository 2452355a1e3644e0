/* Fused CPU kernels for the element-wise passes of a prefill (model/cpu_kernels.py compiles and loads this).
 *
 * Each kernel computes exactly what the PyTorch code it replaces computes, operation for operation and in
 * the same order, so the results are the same bits (the loader checks that on random data before it uses a
 * kernel). What it saves is memory traffic: torch runs RMSNorm as five passes over the tensor, each writing
 * a fresh buffer; here it is one read for the sum of squares and one read-and-write for the output.
 *
 * Compiled with -ffp-contract=off (no fused multiply-add: torch rounds each product) and without
 * -ffast-math (no reassociation: the summation order below is the point).
 *
 * The sum of squares follows torch's CPU sum over a contiguous row (aten SumKernel, "cascade sum"): the row
 * is read as vectors of SUM_LANES floats; four vector accumulators take every fourth vector in turn, and
 * every `step` rounds (a power of two >= 16) each level's accumulator is added into the next of four
 * levels, so that only partial sums of similar size meet. The levels are then folded, vectors left over
 * after the last group of four go into accumulator 0, the four accumulators are folded into 0, and the
 * scalar remainder, then the lanes of accumulator 0 in order, are added to a scalar. The mean is that sum
 * divided by the row length, as torch's CPU mean is.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
#define omp_get_thread_num() 0
#endif

/* Rows are independent in every kernel, so they are split between threads: torch's own OpenMP runtime (the
 * process has loaded it; this library names the same soname), as many threads as torch uses (set by the
 * loader through glm5_set_threads), and only when a call has at least torch's grain of work (32K values). */
static int n_threads = 1;
void glm5_set_threads(int n) { n_threads = n > 0 ? n : 1; }
#define PRAGMA(x) _Pragma(#x)
#define PARALLEL_ROWS(work) PRAGMA(omp parallel for if ((work) >= 32768 && n_threads > 1) num_threads(n_threads))

#ifndef SUM_LANES
#define SUM_LANES 8
#endif
#define ILP 4
#define LEVELS 4

static int ceil_log2(int64_t x) {
    int r = 0;
    while (((int64_t)1 << r) < x) r++;
    return r;
}

/* acc[k][l] += v[k * SUM_LANES + l]^2 for the ILP vectors starting at v */
static inline void add_squares(float acc[ILP][SUM_LANES], const float *v) {
    for (int k = 0; k < ILP; ++k)
        for (int l = 0; l < SUM_LANES; ++l) {
            float e = v[k * SUM_LANES + l];
            acc[k][l] += e * e;
        }
}

static float row_sum_squares(const float *x, int64_t n) {
    const int64_t n_vec = n / SUM_LANES, n_groups = n_vec / ILP;
    float acc[LEVELS][ILP][SUM_LANES];
    memset(acc, 0, sizeof acc);
    int level_bits = ceil_log2(n_groups) / LEVELS;
    if (level_bits < 4) level_bits = 4;
    const int64_t step = (int64_t)1 << level_bits, level_mask = step - 1;

    int64_t g = 0;
    while (g + step <= n_groups) {
        for (int64_t j = 0; j < step; ++j, ++g) add_squares(acc[0], x + g * ILP * SUM_LANES);
        for (int j = 1; j < LEVELS; ++j) {
            for (int k = 0; k < ILP; ++k)
                for (int l = 0; l < SUM_LANES; ++l) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((g & (level_mask << (j * level_bits))) != 0) break;
        }
    }
    for (; g < n_groups; ++g) add_squares(acc[0], x + g * ILP * SUM_LANES);
    for (int j = 1; j < LEVELS; ++j)
        for (int k = 0; k < ILP; ++k)
            for (int l = 0; l < SUM_LANES; ++l) acc[0][k][l] += acc[j][k][l];

    for (int64_t v = n_groups * ILP; v < n_vec; ++v)
        for (int l = 0; l < SUM_LANES; ++l) {
            float e = x[v * SUM_LANES + l];
            acc[0][0][l] += e * e;
        }
    for (int k = 1; k < ILP; ++k)
        for (int l = 0; l < SUM_LANES; ++l) acc[0][0][l] += acc[0][k][l];

    float s = 0.0f;
    for (int64_t e = n_vec * SUM_LANES; e < n; ++e) s += x[e] * x[e];
    for (int l = 0; l < SUM_LANES; ++l) s += acc[0][0][l];
    return s;
}

/* out[r] = (x[r] * (1 / sqrt(mean(x[r]^2) + eps))) * w, rows of n floats; x rows `x_stride` floats apart,
 * out contiguous. torch: x * x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_(), then .mul_(w). */
void glm5_rms_norm(const float *x, int64_t x_stride, const float *w, float *out, int64_t rows, int64_t n,
                   float eps) {
    PARALLEL_ROWS(rows * n)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * x_stride;
        float *o = out + r * n;
        const float inv = 1.0f / sqrtf(row_sum_squares(xr, n) / (float)n + eps);
        for (int64_t e = 0; e < n; ++e) o[e] = (xr[e] * inv) * w[e];
    }
}

/* The residual sum and the norm of it in one pass per row: h[r] = a[r] + h[r] (written into `sum`, which may
 * be a or h), out[r] = rms_norm(h[r]). All rows contiguous. torch: h = a.add_(h); out = rms_norm(h). */
void glm5_add_rms_norm(const float *a, const float *h, float *sum, const float *w, float *out, int64_t rows,
                       int64_t n, float eps) {
    PARALLEL_ROWS(rows * n)
    for (int64_t r = 0; r < rows; ++r) {
        const float *ar = a + r * n, *hr = h + r * n;
        float *sr = sum + r * n, *o = out + r * n;
        for (int64_t e = 0; e < n; ++e) sr[e] = ar[e] + hr[e];
        const float inv = 1.0f / sqrtf(row_sum_squares(sr, n) / (float)n + eps);
        for (int64_t e = 0; e < n; ++e) o[e] = (sr[e] * inv) * w[e];
    }
}

/* Interleaved-pair RoPE with de-interleaved output (model/rope.py), for P positions of H heads:
 *   out[p, h, i]       = x[p, h, 2i] * cos[p, i] - x[p, h, 2i+1] * sin[p, i]      i < R/2
 *   out[p, h, R/2 + i] = x[p, h, 2i+1] * cos[p, i] + x[p, h, 2i] * sin[p, i]
 * and the `tail` values after the R rotated ones copied unchanged (the indexer's [rope | nope] layout).
 * x and out are strided by position and head (unit stride within a head); cos/sin are [P, R/2] contiguous.
 * torch: torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1), each product rounded on its own. */
void glm5_rope(const float *x, int64_t x_pos_stride, int64_t x_head_stride, const float *cos, const float *sin,
               float *out, int64_t out_pos_stride, int64_t out_head_stride, int64_t P, int64_t H, int64_t R,
               int64_t tail) {
    const int64_t half = R / 2;
    PARALLEL_ROWS(P * H * (R + tail))
    for (int64_t p = 0; p < P; ++p) {
        const float *c = cos + p * half, *s = sin + p * half;
        for (int64_t h = 0; h < H; ++h) {
            const float *xi = x + p * x_pos_stride + h * x_head_stride;
            float *o = out + p * out_pos_stride + h * out_head_stride;
            for (int64_t i = 0; i < half; ++i) {
                const float x1 = xi[2 * i], x2 = xi[2 * i + 1];
                const float a = x1 * c[i], b = x2 * s[i];
                const float d = x2 * c[i], e = x1 * s[i];
                o[i] = a - b;
                o[half + i] = d + e;
            }
            if (tail) memcpy(o + R, xi + R, (size_t)tail * sizeof(float));
        }
    }
}

/* The additive mask of one block of T queries over keys 0..S-1 (model/attention.py, attend_expanded):
 * out[t, s] = 0 if key s is visible to query t (s <= q_idx[t]) and, when topk is given, among its K picks
 * (topk[t, :]), else -inf. The same values as torch's full(-inf).scatter_(topk, 0).masked_fill_(future). */
void glm5_attn_bias(const int64_t *topk, int64_t K, const int64_t *q_idx, int64_t T, int64_t S, float *out) {
    PARALLEL_ROWS(T * S)
    for (int64_t t = 0; t < T; ++t) {
        float *row = out + t * S;
        const int64_t q = q_idx[t];
        if (topk == NULL) {
            for (int64_t s = 0; s < S; ++s) row[s] = s <= q ? 0.0f : -INFINITY;
            continue;
        }
        for (int64_t s = 0; s < S; ++s) row[s] = -INFINITY;
        for (int64_t k = 0; k < K; ++k) {
            const int64_t s = topk[t * K + k];
            if (s >= 0 && s < S && s <= q) row[s] = 0.0f;
        }
    }
}

/* Two per-head tensors side by side, optionally scaled (model/attention.py, attend_expanded's q and k):
 * out[p, h] = [a[p, h, :Da] | b[p, h, :Db]] (* scale when `scaled`), out contiguous [P, H, Da + Db].
 * a and b are strided by position and head (a head stride of 0 broadcasts one vector to every head).
 * torch: torch.cat([a, b], -1) (.mul_(scale)): a copy, then one rounding per value. */
void glm5_concat_heads(const float *a, int64_t a_pos_stride, int64_t a_head_stride, int64_t Da, const float *b,
                       int64_t b_pos_stride, int64_t b_head_stride, int64_t Db, float *out, int64_t P, int64_t H,
                       int scaled, float scale) {
    const int64_t D = Da + Db;
    PARALLEL_ROWS(P * H * D)
    for (int64_t p = 0; p < P; ++p)
        for (int64_t h = 0; h < H; ++h) {
            const float *ar = a + p * a_pos_stride + h * a_head_stride;
            const float *br = b + p * b_pos_stride + h * b_head_stride;
            float *o = out + (p * H + h) * D;
            if (scaled) {
                for (int64_t i = 0; i < Da; ++i) o[i] = ar[i] * scale;
                for (int64_t i = 0; i < Db; ++i) o[Da + i] = br[i] * scale;
            } else {
                memcpy(o, ar, (size_t)Da * sizeof(float));
                memcpy(o + Da, br, (size_t)Db * sizeof(float));
            }
        }
}

/* x[r, i] = (x[r, i] * u[r, i]) * w[r]: SwiGLU's product with the up projection and the routing weight
 * (model/moe.py). x and u rows `x_stride` / `u_stride` floats apart, w one float per row or NULL.
 * torch: x.mul_(u).mul_(w[:, None]), one rounding per product. */
void glm5_mul_rows(float *x, int64_t x_stride, const float *u, int64_t u_stride, const float *w, int64_t rows,
                   int64_t n) {
    PARALLEL_ROWS(rows * n)
    for (int64_t r = 0; r < rows; ++r) {
        float *xr = x + r * x_stride;
        const float *ur = u + r * u_stride;
        if (w != NULL) {
            const float wr = w[r];
            for (int64_t i = 0; i < n; ++i) xr[i] = (xr[i] * ur[i]) * wr;
        } else {
            for (int64_t i = 0; i < n; ++i) xr[i] = xr[i] * ur[i];
        }
    }
}

/* Scores as unsigned keys that order the other way round: the largest float gets the smallest key. -0.0 and
 * +0.0 get one key (they compare equal, as torch compares them). */
static inline uint32_t descending_key(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    if (b == 0x80000000u) b = 0; /* -0.0 -> +0.0 */
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u); /* ascending float order -> ascending key order */
    return ~b;
}

/* The k-th smallest of n keys (1 <= k <= n): radix select, one byte per pass from the top; after the first
 * pass only the keys in the chosen bucket are looked at (copied to cand, n entries). */
static uint32_t kth_smallest_key(const uint32_t *key, int64_t n, int64_t k, uint32_t *cand) {
    int32_t hist[256];
    memset(hist, 0, sizeof hist);
    for (int64_t i = 0; i < n; ++i) hist[key[i] >> 24]++;
    int64_t want = k;
    int b = 0;
    for (; hist[b] < want; ++b) want -= hist[b];
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i) { /* branch-free: about half the keys pass, unpredictably */
        cand[m] = key[i];
        m += (key[i] >> 24) == (uint32_t)b;
    }
    uint32_t prefix = (uint32_t)b << 24;
    for (int shift = 16; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        for (int64_t i = 0; i < m; ++i) hist[(cand[i] >> shift) & 255]++;
        b = 0;
        for (; hist[b] < want; ++b) want -= hist[b];
        int64_t m2 = 0;
        for (int64_t i = 0; i < m; ++i) {
            cand[m2] = cand[i];
            m2 += ((cand[i] >> shift) & 255) == (uint32_t)b;
        }
        m = m2;
        prefix |= (uint32_t)b << shift;
    }
    return prefix;
}

/* One row of glm5_topk_set: 1 if it is left to torch, else 0 with its indices in o. */
static int topk_row(const float *xr, int64_t n, int64_t k, int64_t *o, uint32_t *scratch) {
    int nan = 0;
    for (int64_t i = 0; i < n; ++i) {
        nan |= xr[i] != xr[i];
        scratch[i] = descending_key(xr[i]);
    }
    if (nan) {
        o[0] = -1;
        return 1;
    }
    const uint32_t kth = kth_smallest_key(scratch, n, k, scratch + n);
    int64_t above = 0, equal = 0;
    for (int64_t i = 0; i < n; ++i) {
        above += scratch[i] < kth;
        equal += scratch[i] == kth;
    }
    if (above + equal != k) {
        o[0] = -1;
        return 1;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n && m < k; ++i) { /* branch-free, into a row of k + 1 (see the caller) */
        o[m] = i;
        m += scratch[i] <= kth;
    }
    return 0;
}

/* The k largest of each row's n scores, as indices in ascending order: out[r, :k]. Exactly torch.topk's set
 * whenever that set is unique. A row where it is not (values equal to the k-th largest both inside and
 * outside the top k: torch's pick among them depends on its algorithm) or that holds a NaN is left to torch:
 * its out[r, 0] is set to -1. Returns the number of such rows. out's rows are k + 1 apart (the last entry is
 * scratch); scratch holds 2n uint32 per thread (glm5_set_threads). */
int64_t glm5_topk_set(const float *x, int64_t x_stride, int64_t rows, int64_t n, int64_t k, int64_t *out,
                      uint32_t *scratch) {
    int64_t left = 0;
#pragma omp parallel for reduction(+ : left) if (rows * n >= 32768 && n_threads > 1) num_threads(n_threads)
    for (int64_t r = 0; r < rows; ++r)
        left += topk_row(x + r * x_stride, n, k, out + r * (k + 1), scratch + 2 * n * omp_get_thread_num());
    return left;
}
