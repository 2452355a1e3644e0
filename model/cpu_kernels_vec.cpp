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

#include <cmath>
#include <cstdint>

using at::vec::Vectorized;
using Vec = Vectorized<float>;

static int n_threads = 1;

extern "C" {

// Threads for row-parallel kernels: torch's own OpenMP runtime and thread count (see cpu_kernels.c).
void glm5_set_threads(int n) { n_threads = n > 0 ? n : 1; }

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

// Softmax over each row of x [batches, t, s] (rows contiguous) after adding the [t, s] mask `bias` (0 or
// -inf), in place. torch: x.add_(bias).softmax(-1), whose CPU kernel takes a row's max, writes
// exp(x - max), sums that, and multiplies by 1 / sum, each with its vector helpers.
void glm5_softmax_bias(float* x, const float* bias, int64_t batches, int64_t t, int64_t s) {
    using at::vec::map;
    using at::vec::map2;
    using at::vec::reduce_all;
    const int64_t rows = batches * t;
#pragma omp parallel for if (rows * s >= 32768 && n_threads > 1) num_threads(n_threads)
    for (int64_t r = 0; r < rows; ++r) {
        float* row = x + r * s;
        map2([](Vec a, Vec m) { return a + m; }, row, row, bias + (r % t) * s, s);
        const float mx = reduce_all<float>([](Vec& a, Vec& c) { return at::vec::maximum(a, c); }, row, s);
        map([mx](Vec a) { return (a - Vec(mx)).exp(); }, row, row, s);
        float sum = reduce_all<float>([](Vec a, Vec c) { return a + c; }, row, s);
        sum = 1 / sum;
        map([sum](Vec a) { return a * Vec(sum); }, row, row, s);
    }
}

}  // extern "C"
