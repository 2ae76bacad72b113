// Elementwise f32 kernels: one thread per element, blocks of 256 threads.
//
// Where a kernel multiplies and adds, it says so with fmaf (one rounding), so that the
// CPU references in lib.rs (f32::mul_add) match bit for bit whatever nvcc's contraction
// flags are.

#include "stepgraph/common.cuh"

// y[i] <- a * x[i] + b * y[i]
extern "C" __global__ void axpby(const float* __restrict__ x, float* __restrict__ y, unsigned n,
                                 float a, float b) {
    const unsigned i = global_index();
    if (i < n) {
        y[i] = fmaf(a, x[i], b * y[i]);
    }
}

// y[i] <- y[i] * scalars[index]: the factor is read from device memory at run time (a
// device scalar refreshed before each replay), not baked into the captured launch.
extern "C" __global__ void scale_by_scalar(const float* __restrict__ scalars, unsigned index,
                                           float* __restrict__ y, unsigned n) {
    const unsigned i = global_index();
    if (i < n) {
        y[i] *= scalars[index];
    }
}

// y[i] <- start + i * step
extern "C" __global__ void fill_affine(float* y, unsigned n, float start, float step) {
    const unsigned i = global_index();
    if (i < n) {
        y[i] = fmaf((float)i, step, start);
    }
}

// *flag <- x[index] > threshold (1 or 0), one thread: a condition decided on the device
// from the data (a loss past a bound, a value of the right sign), for a `#[when]` op.
extern "C" __global__ void flag_above(const float* __restrict__ x, unsigned index,
                                      float threshold, unsigned* flag) {
    if (global_index() == 0) {
        *flag = x[index] > threshold ? 1u : 0u;
    }
}
