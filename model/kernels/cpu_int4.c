/* INT4 weight-only linear for CPUs with AVX2 and FMA: y[B, N] = x[B, K] @ W^T (+ bias), x and y fp32,
 * W group-wise symmetric int4 (w = q * scale, q in [-8, 7], one scale per `group` input columns per output).
 * model/kernels/int4.py repacks a checkpoint's weights into the layout below and calls this through ctypes.
 *
 * Why not torch's `_weight_int4pack_mm_for_cpu` on AVX2: it takes bf16 activations (two conversions per call),
 * and its AVX2 branch dequantizes every weight again for every block of at most 4 input rows, so on a matrix
 * small enough for fp32 to stream it fast it is no faster than fp32 (benchmarks/RESULTS.md, INT4). Here each
 * weight is decoded once per block of up to ROWS input rows, straight into fp32 registers, and reused by
 * every row of the block; nothing is converted to bf16.
 *
 * Layout (built once at load): outputs in blocks of 16 (N padded with zero weights and zero scales). Block b,
 * columns k..k+7 (k a multiple of 8) are 16 int32 words, w[(b * K/8 + k/8) * 16 + j], word j holding the
 * 8 nibbles q[16b + j, k + i] (two's complement) at bits 4i: one 64-byte line per 8 columns of a block, read
 * in order. Scales, fp32: s[(b * G + g) * 16 + j] for output 16b + j, group g.
 *
 * Decoding one 8-column word of 8 outputs: shift nibble i to the top and back arithmetically (sign-extends
 * q), convert to float, multiply by the 8 outputs' scales: exactly the plain path's `q.float() * scale`, so
 * the weights are the reference's bits and only the order of the fp32 sums differs (each output is a dot
 * product over k, here in column order with FMA; the probe and the tests check the result against the
 * reference to a tolerance of the sum's scale, not bit for bit).
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int n_threads = 1;
void glm5_set_threads(int n) { n_threads = n > 0 ? n : 1; }

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define BLOCK 16 /* outputs per block: two 8-float vectors */
#define ROWS 4   /* input rows per pass over a block: 2 x ROWS accumulators + decoded weights fit 16 registers */

/* Sign-extended nibble i of each 32-bit lane, as float. */
#define NIBBLE(v, i) _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32((v), 28 - 4 * (i)), 28))

/* y[r, 16 outputs of block] for R (compile-time, 1..ROWS) rows starting at x; `out` rows of 16 floats. */
static inline __attribute__((always_inline)) void block_rows(const int R, const float *x, int64_t x_stride,
                                                             const int32_t *w, const float *s, int64_t K,
                                                             int64_t group, float *out) {
    __m256 acc[ROWS][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const int64_t G = K / group;
    for (int64_t g = 0; g < G; ++g) {
        const __m256 s0 = _mm256_loadu_ps(s + g * BLOCK), s1 = _mm256_loadu_ps(s + g * BLOCK + 8);
        for (int64_t k = g * group; k < (g + 1) * group; k += 8) {
            const int32_t *wk = w + (k / 8) * BLOCK;
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)wk);
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(wk + 8));
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                const __m256 w0 = _mm256_mul_ps(NIBBLE(v0, i), s0), w1 = _mm256_mul_ps(NIBBLE(v1, i), s1);
#pragma GCC unroll 4
                for (int r = 0; r < R; ++r) {
                    const __m256 xb = _mm256_broadcast_ss(x + r * x_stride + k + i);
                    acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(out + r * BLOCK, acc[r][0]);
        _mm256_storeu_ps(out + r * BLOCK + 8, acc[r][1]);
    }
}

static void one_block(const float *x, int64_t x_stride, int64_t rows, int64_t K, const int32_t *w, const float *s,
                      int64_t group, const float *bias, int64_t n0, int64_t N, float *y, int64_t y_stride) {
    float tmp[ROWS * BLOCK];
    const int64_t width = N - n0 < BLOCK ? N - n0 : BLOCK;
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int64_t R = rows - r0 < ROWS ? rows - r0 : ROWS;
        const float *xr = x + r0 * x_stride;
        switch (R) { /* a constant R each: the accumulators stay in registers */
        case 1: block_rows(1, xr, x_stride, w, s, K, group, tmp); break;
        case 2: block_rows(2, xr, x_stride, w, s, K, group, tmp); break;
        case 3: block_rows(3, xr, x_stride, w, s, K, group, tmp); break;
        default: block_rows(4, xr, x_stride, w, s, K, group, tmp); break;
        }
        for (int64_t r = 0; r < R; ++r) {
            float *yr = y + (r0 + r) * y_stride + n0;
            if (bias)
                for (int64_t j = 0; j < width; ++j) yr[j] = tmp[r * BLOCK + j] + bias[n0 + j];
            else
                memcpy(yr, tmp + r * BLOCK, width * sizeof(float));
        }
    }
}

/* y[rows, N] (row stride y_stride) = x[rows, K] (row stride x_stride) @ W^T + bias (may be NULL); W in the
 * layout above with N padded to a multiple of 16. K must be a multiple of group, group of 8. Returns 0, or
 * -1 for arguments it does not take. Output blocks are split between threads (as many as torch uses) when
 * the call reads enough weights to pay for waking them. */
int glm5_int4_linear(const float *x, int64_t x_stride, int64_t rows, int64_t K, const int32_t *w,
                     const float *scales, int64_t N, int64_t group, const float *bias, float *y,
                     int64_t y_stride) {
    if (rows < 1 || K < 8 || group < 8 || group % 8 || K % group || N < 1) return -1;
    const int64_t blocks = (N + BLOCK - 1) / BLOCK, G = K / group;
#pragma omp parallel for schedule(static) if (n_threads > 1 && blocks >= 2 * n_threads && N * K >= (1 << 18)) \
    num_threads(n_threads)
    for (int64_t b = 0; b < blocks; ++b)
        one_block(x, x_stride, rows, K, w + b * (K / 8) * BLOCK, scales + b * G * BLOCK, group, bias, b * BLOCK, N,
                  y, y_stride);
    return 0;
}

#else /* no AVX2 / FMA at compile time: the loader's probe sees -1 and keeps torch's kernel */

int glm5_int4_linear(const float *x, int64_t x_stride, int64_t rows, int64_t K, const int32_t *w,
                     const float *scales, int64_t N, int64_t group, const float *bias, float *y,
                     int64_t y_stride) {
    (void)x, (void)x_stride, (void)rows, (void)K, (void)w, (void)scales, (void)N, (void)group, (void)bias;
    (void)y, (void)y_stride;
    return -1;
}

#endif
