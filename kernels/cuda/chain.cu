// The fork_join example's workload: a long chain of dependent multiply-adds per element,
// so that one launch of a small grid keeps a few SMs busy for a while and several such
// launches on different streams visibly run side by side.

// x[i] <- x[i] * a + b, `iters` times, for every i < n (grid-stride loop: the wrapper
// launches a fixed 16 x 256 grid whatever n is).
//
// Each step is one fused multiply-add, written as fmaf so that it does not depend on
// nvcc's contraction flags; f32::mul_add on the CPU rounds the same way, so
// chain_step_reference matches bit for bit.
//
// Callers pick |a| < 1 so values stay bounded for any iters: they approach the fixed
// point b / (1 - a) (a = 0.999, b = 0.001: the fixed point is 1).
extern "C" __global__ void chain_step(float* x, unsigned n, unsigned iters, float a, float b) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        for (unsigned k = 0; k < iters; ++k) {
            v = fmaf(v, a, b);
        }
        x[i] = v;
    }
}
