// Fused CPU kernels that need torch's own vector math (model/cpu_kernels.py builds and loads this).
//
// SiLU and softmax call exp, and torch's CPU exp is its Vectorized<float>::exp (SLEEF's expf, u10 accuracy)
// on whole vectors and std::exp on the scalar remainder. These kernels are written with torch's Vectorized
// types and its functional helpers (ATen/cpu/vec, headers shipped with torch), compiled for the same CPU
// capability torch dispatches to, and linked against libtorch_cpu for SLEEF: so each element goes through the
// very operations torch's own kernels apply to it, in the same order, and the results are the same bits (the
// loader checks that before using a kernel). What they save is passes over memory: one instead of two or
// three, and no fresh output tensor.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using at::vec::Vectorized;
using Vec = Vectorized<float>;

static int n_threads = 1;

extern "C" {

// Threads for row-parallel kernels: torch's own OpenMP runtime and thread count (see cpu_kernels.c).
void glm5_set_threads(int n) { n_threads = n > 0 ? n : 1; }

// BLAS sgemm, Fortran interface with 32-bit ints: the MKL inside libtorch_cpu on x86-64 builds, the very
// routine torch's CPU matmul calls for fp32. Weak: a torch without it leaves it null, and the MoE kernel
// declines (returns -1) instead of the library failing to load.
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));

// x[r] = silu(x[r]) * u[r] (* w[r]), in place on x; rows of n floats, `x_stride` / `u_stride` apart. One
// thread: which values take the vector exp depends on where torch would split the work between threads.
// torch: F.silu(x, inplace=True), then x.mul_(u) (.mul_(w[:, None])). torch's SiLU kernel handles a row
// two vectors at a time as x / (1 + exp(-x)), and the remainder one float at a time with std::exp.
void glm5_silu_mul(float* x, int64_t x_stride, const float* u, int64_t u_stride, const float* w, int64_t rows,
                   int64_t n) {
    const Vec one(1.0f);
    constexpr int64_t V = Vec::size();
    for (int64_t r = 0; r < rows; ++r) {
        float* xr = x + r * x_stride;
        const float* ur = u + r * u_stride;
        int64_t i = 0;
        for (; i + 2 * V <= n; i += 2 * V) {
            Vec a = Vec::loadu(xr + i), b = Vec::loadu(xr + i + V);
            a = (a / (one + a.neg().exp())) * Vec::loadu(ur + i);
            b = (b / (one + b.neg().exp())) * Vec::loadu(ur + i + V);
            if (w != nullptr) {
                a = a * Vec(w[r]);
                b = b * Vec(w[r]);
            }
            a.store(xr + i);
            b.store(xr + i + V);
        }
        for (; i < n; ++i) {
            float v = xr[i];
            v = v / (1.0f + std::exp(-v));
            v = v * ur[i];
            xr[i] = w != nullptr ? v * w[r] : v;
        }
    }
}

// One row of the masked softmax, in place: torch's x.add_(bias).softmax(-1) on that row. torch's CPU kernel takes
// the row's max, writes exp(x - max), sums that, and multiplies by 1 / sum, each with its vector helpers.
static inline void softmax_bias_row(float* row, const float* bias, int64_t s) {
    using at::vec::map;
    using at::vec::map2;
    using at::vec::reduce_all;
    map2([](Vec a, Vec m) { return a + m; }, row, row, bias, s);
    const float mx = reduce_all<float>([](Vec& a, Vec& c) { return at::vec::maximum(a, c); }, row, s);
    map([mx](Vec a) { return (a - Vec(mx)).exp(); }, row, row, s);
    float sum = reduce_all<float>([](Vec a, Vec c) { return a + c; }, row, s);
    sum = 1 / sum;
    map([sum](Vec a) { return a * Vec(sum); }, row, row, s);
}

// Softmax over each row of x [batches, t, s] (rows contiguous) after adding the [t, s] mask `bias` (0 or
// -inf), in place.
void glm5_softmax_bias(float* x, const float* bias, int64_t batches, int64_t t, int64_t s) {
    const int64_t rows = batches * t;
#pragma omp parallel for if (rows * s >= 32768 && n_threads > 1) num_threads(n_threads)
    for (int64_t r = 0; r < rows; ++r) softmax_bias_row(x + r * s, bias + (r % t) * s, s);
}

// Attention of one block of t queries over s keys, head by head, so that a head's [t, s] scores stay in cache
// between the three steps (all heads' scores at once are H times that, through memory):
//   S = q_h @ k_h^T         one sgemm: q_h [t, d] rows q_ps apart, k_h [s, d] rows k_ps apart
//   S = softmax(S + bias)   row by row, bias [t, s]
//   out_h = S @ v_h         one sgemm: v_h [s, dv] rows v_ps apart, out_h [t, dv] rows o_ps apart
// Head h's q, k, v and out start h * q_hs, k_hs, v_hs, o_hs floats in. torch (MLA.attend_expanded): two bmm
// calls over the heads and the softmax kernel in between; a bmm runs one sgemm per head with these very
// arguments, so every value goes through the same operations. scratch: t * s floats. Returns 0, or -1 without
// a BLAS sgemm.
int glm5_attend_heads(const float* q, int64_t q_ps, int64_t q_hs, const float* k, int64_t k_ps, int64_t k_hs,
                      const float* v, int64_t v_ps, int64_t v_hs, const float* bias, float* out, int64_t o_ps,
                      int64_t o_hs, int64_t H, int64_t t, int64_t s, int64_t d, int64_t dv, float* scratch) {
    if (sgemm_ == nullptr) return -1;
    const float one = 1.0f, zero = 0.0f;
    const int ti = (int)t, si = (int)s, di = (int)d, dvi = (int)dv;
    const int kps = (int)k_ps, qps = (int)q_ps, vps = (int)v_ps, ops = (int)o_ps;
    for (int64_t h = 0; h < H; ++h) {
        // Column-major S^T [s, t] = k_h [s, d] (its rows read as columns: "T") times q_h^T [d, t].
        sgemm_("T", "N", &si, &ti, &di, &one, k + h * k_hs, &kps, q + h * q_hs, &qps, &zero, scratch, &si);
#pragma omp parallel for if (t * s >= 32768 && n_threads > 1) num_threads(n_threads)
        for (int64_t r = 0; r < t; ++r) softmax_bias_row(scratch + r * s, bias + r * s, s);
        // Column-major out_h^T [dv, t] = v_h^T [dv, s] times S^T [s, t].
        sgemm_("N", "N", &dvi, &ti, &si, &one, v + h * v_hs, &vps, scratch, &si, &zero, out + h * o_hs, &ops);
    }
    return 0;
}

// The DSA indexer's scores of T queries against S keys, a block of queries at a time so that a block's
// per-head logits stay in cache:
//   L = q_blk @ k^T         one sgemm: q [T * I, d] (query t's head i at row t * I + i, rows q_ld apart),
//                           k [S, d] (rows k_ld apart) -> L [rows, S]
//   L = relu(L)
//   out[t] = w[t] @ L_t     one sgemm per query: w [T, I] (contiguous), L_t its [I, S] rows -> out [T, S]
// torch (Indexer.scores): one bmm over every (query, head) row, relu_, and a batched [1, I] @ [I, S] product per
// query. The blocks are >= `block_rows` rows (64 and more: torch's BLAS gives each row of a product the same
// bits whatever the number of rows, from 32 rows up, which the loader checks), a short tail merged into the
// block before it; each query's product is the sgemm its batched product runs. scratch: (2 * block_rows + I) * S
// floats at most. Returns 0, or -1 without a BLAS sgemm.
int glm5_index_scores(const float* q, int64_t q_ld, const float* k, int64_t k_ld, const float* w, float* out,
                      int64_t T, int64_t I, int64_t S, int64_t d, int64_t block_rows, float* scratch) {
    if (sgemm_ == nullptr) return -1;
    const float one = 1.0f, zero = 0.0f;
    const int si = (int)S, di = (int)d, ii = (int)I, kld = (int)k_ld, qld = (int)q_ld, onei = 1;
    int64_t per = (block_rows + I - 1) / I;  // queries per block
    if (per < 1) per = 1;
    for (int64_t t0 = 0; t0 < T;) {
        int64_t nt = T - t0 < 2 * per ? T - t0 : per;  // a tail shorter than a block joins this one
        const int rows = (int)(nt * I);
        sgemm_("T", "N", &si, &rows, &di, &one, k, &kld, q + t0 * I * q_ld, &qld, &zero, scratch, &si);
        const Vec zv(0.0f);
        constexpr int64_t V = Vec::size();
        const int64_t n = (int64_t)rows * S;
        int64_t j = 0;
        for (; j + V <= n; j += V) at::vec::clamp_min(Vec::loadu(scratch + j), zv).store(scratch + j);
        for (; j < n; ++j) scratch[j] = scratch[j] < 0.0f ? 0.0f : scratch[j];
        for (int64_t t = 0; t < nt; ++t)
            sgemm_("N", "N", &si, &onei, &ii, &one, scratch + t * I * S, &si, w + (t0 + t) * I, &ii, &zero,
                   out + (t0 + t) * S, &si);
        t0 += nt;
    }
    return 0;
}

// One expert over its m pairs: rows x[tok[i]] gathered into A [m, D], H = A @ gate_up_e [m, 2I], the SwiGLU with
// the routing weights in place on H's first half (row by row), Y = that @ down_e [m, D] (rows D apart).
// Row-major C = A @ B is column-major C^T = B^T A^T: B^T is B's row-major storage, as torch calls sgemm.
static void run_expert(const float* x, int64_t ldx, const int64_t* tok, const float* wp, int64_t m,
                       const float* gate_up_e, const float* down_e, int64_t D, int64_t I, float* A, float* H,
                       float* Y) {
    const float one = 1.0f, zero = 0.0f;
    const int n1 = (int)(2 * I), k1 = (int)D, n2 = (int)D, k2 = (int)I, mi = (int)m;
    for (int64_t i = 0; i < m; ++i) std::memcpy(A + i * D, x + tok[i] * ldx, D * sizeof(float));
    sgemm_("N", "N", &n1, &mi, &k1, &one, gate_up_e, &n1, A, &k1, &zero, H, &n1);
    glm5_silu_mul(H, 2 * I, H + I, 2 * I, wp, m, I);
    sgemm_("N", "N", &n2, &mi, &k2, &one, down_e, &n2, H, &n1, &zero, Y, &n2);
}

// o[lo:hi] += y[lo:hi] (each value one add: vector or scalar, the same result).
static inline void add_into(float* o, const float* y, int64_t lo, int64_t hi) {
    constexpr int64_t V = Vec::size();
    int64_t d = lo;
    for (; d + V <= hi; d += V) (Vec::loadu(o + d) + Vec::loadu(y + d)).store(o + d);
    for (; d < hi; ++d) o[d] += y[d];
}

// The routed experts of one MoE layer, in one call. The (token, expert) pairs come sorted by expert: pair p
// is token[p] with routing weight w[p], and expert e owns the next counts[e] pairs. For each expert, in order:
//   A = x[token[p..]]                  gathered rows [m, D], into buf
//   H = A @ gate_up[e]                 [m, 2I], gate | up (the stack is input-major: [E, D, 2I])
//   G = silu(H[:, :I]) * H[:, I:] * w  in place on H's first half, row by row
//   Y = G @ down[e]                    [m, D] (down [E, I, D])
//   out[token[p]] += Y[p]              in pair order
// torch (MoE.routed_stacked): index_select, a grouped GEMM, the SwiGLU above, a grouped GEMM, index_add_. Each
// step is the same operation on the same values: the grouped GEMM runs one sgemm per expert with these very
// arguments, and index_add_ adds the rows in pair order. What this saves is the [pairs, D] / [pairs, 2I] /
// [pairs, D] intermediates in memory (one expert's rows stay in cache) and torch's per-expert dispatch.
// buf: rows * (2 * D + 2 * I) floats, rows >= every counts[e] (an expert is never split: one sgemm each, as
// torch); with ways > 1, ways * rows * (D + 2 * I) + pairs * D. Returns 0, or -1 without a BLAS sgemm.
//
// ways > 1: the experts are split between that many threads, each expert's two sgemm calls on its thread alone
// (BLAS runs sequentially inside a parallel region; its results do not depend on its thread count, which the
// loader checks), every pair's output into a [pairs, D] buffer; then the scatter-add in pair order, split between
// the threads by columns (each output value still gets its adds in pair order). Torch's path, on several
// threads, runs the experts one after the other, each small GEMM split between the threads.
static int moe_experts_parallel(const float* x, int64_t ldx, const int64_t* token, const float* w,
                                const int64_t* counts, int64_t E, const float* gate_up, const float* down,
                                int64_t D, int64_t I, float* out, int64_t ldo, float* buf, int64_t rows,
                                int64_t ways) {
    std::vector<int64_t> first(E + 1, 0);
    for (int64_t e = 0; e < E; ++e) first[e + 1] = first[e] + counts[e];
    const int64_t pairs = first[E];
    float* Y = buf + ways * rows * (D + 2 * I);  // [pairs, D]
#pragma omp parallel num_threads(ways)
    {
        float* A = buf + omp_get_thread_num() * rows * (D + 2 * I);  // [rows, D], then H [rows, 2I]
#pragma omp for schedule(dynamic, 1)
        for (int64_t e = 0; e < E; ++e) {
            const int64_t p = first[e];
            if (counts[e])
                run_expert(x, ldx, token + p, w + p, counts[e], gate_up + e * D * 2 * I, down + e * I * D, D, I, A,
                           A + rows * D, Y + p * D);
        }
    }
    const int64_t cols = 4 * Vec::size();
#pragma omp parallel for num_threads(ways)
    for (int64_t c = 0; c < D; c += cols)
        for (int64_t p = 0; p < pairs; ++p) add_into(out + token[p] * ldo, Y + p * D, c, c + cols < D ? c + cols : D);
    return 0;
}

int glm5_moe_experts(const float* x, int64_t ldx, const int64_t* token, const float* w, const int64_t* counts,
                     int64_t E, const float* gate_up, const float* down, int64_t D, int64_t I, float* out,
                     int64_t ldo, float* buf, int64_t rows, int64_t ways) {
    if (sgemm_ == nullptr) return -1;
    if (ways > 1)
        return moe_experts_parallel(x, ldx, token, w, counts, E, gate_up, down, D, I, out, ldo, buf, rows, ways);
    float* A = buf;               // [rows, D]
    float* H = A + rows * D;      // [rows, 2I]
    float* Y = H + rows * 2 * I;  // [rows, D]
    for (int64_t e = 0, p = 0; e < E; p += counts[e], ++e) {
        const int64_t m = counts[e];
        if (m == 0) continue;
        run_expert(x, ldx, token + p, w + p, m, gate_up + e * D * 2 * I, down + e * I * D, D, I, A, H, Y);
        for (int64_t i = 0; i < m; ++i) add_into(out + token[p + i] * ldo, Y + i * D, 0, D);  // in pair order
    }
    return 0;
}

}  // extern "C"
