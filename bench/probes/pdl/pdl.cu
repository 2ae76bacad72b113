// Probe: what programmatic dependent launch (PDL) saves per edge of a chain of kernels
// inside a CUDA graph captured from streams, on this GPU. Variants of one chain of K
// dependent kernels (each reads the previous one's output):
//   plain: ordinary launches (full dependency edges);
//   pdl:   cudaLaunchKernelEx with programmaticStreamSerialization, each kernel
//          calling griddepcontrol.launch_dependents, then griddepcontrol.wait before
//          touching memory;
//   cross: the chain alternates between two streams through events (a join every
//          kernel), plain and pdl.
// Sizes: a full-GPU memory-bound kernel (16 MB in, 16 MB out), a 132-block kernel of
// 0.5 MB, and a one-block kernel. Each result is checked against the host.
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
  std::exit(1); } } while (0)

template <bool PDL>
__global__ void step(float* __restrict__ out, const float* __restrict__ in, int n, float a) {
  if (PDL) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i] * a + 1.0f;
}

struct Case { const char* name; int n; int blocks; };

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main() {
  const int K = 48, REPS = 300, WARM = 20;
  Case cases[] = {{"full 16MB", 16384 * 256, 132 * 8}, {"132 blocks 0.5MB", 16384 * 8, 132},
                  {"one block", 256, 1}};
  cudaStream_t s0, s1;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> evs(K);
  for (auto& e : evs) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  int bad = 0;
  for (const Case& c : cases) {
    float *a, *b;
    CK(cudaMalloc(&a, c.n * sizeof(float)));
    CK(cudaMalloc(&b, c.n * sizeof(float)));
    std::vector<float> h(c.n);
    srand(7);
    for (auto& x : h) x = (float)rand() / RAND_MAX - 0.5f;
    float res[4];
    for (int variant = 0; variant < 4; ++variant) {
      bool pdl = variant & 1, cross = variant & 2;
      CK(cudaMemcpy(a, h.data(), c.n * sizeof(float), cudaMemcpyHostToDevice));
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
      for (int k = 0; k < K; ++k) {
        cudaStream_t s = (cross && (k & 1)) ? s1 : s0;
        if (cross && k > 0) {
          cudaStream_t prev = (k & 1) ? s0 : s1;
          CK(cudaEventRecord(evs[k], prev));
          CK(cudaStreamWaitEvent(s, evs[k], 0));
        }
        float* out = (k & 1) ? a : b;
        const float* in = (k & 1) ? b : a;
        float mul = (k % 3 == 0) ? 0.5f : -0.75f;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(c.blocks);
        cfg.blockDim = dim3(256);
        cfg.stream = s;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = pdl ? 1 : 0;
        if (pdl) CK(cudaLaunchKernelEx(&cfg, step<true>, out, in, c.n, mul));
        else CK(cudaLaunchKernelEx(&cfg, step<false>, out, in, c.n, mul));
      }
      if (cross && (K - 1) & 1) {  // join s1 back into s0
        CK(cudaEventRecord(evs[0], s1));
        CK(cudaStreamWaitEvent(s0, evs[0], 0));
      }
      CK(cudaStreamEndCapture(s0, &g));
      size_t nedges = 0;
      CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &nedges));
      cudaGraphExec_t ge;
      CK(cudaGraphInstantiate(&ge, g, 0));
      // correctness: one launch from the initial data
      CK(cudaGraphLaunch(ge, s0));
      CK(cudaStreamSynchronize(s0));
      std::vector<float> dev(c.n);
      const float* fin = ((K - 1) & 1) ? a : b;
      CK(cudaMemcpy(dev.data(), fin, c.n * sizeof(float), cudaMemcpyDeviceToHost));
      std::vector<float> ref = h;
      for (int k = 0; k < K; ++k) {
        float mul = (k % 3 == 0) ? 0.5f : -0.75f;
        for (auto& x : ref) x = x * mul + 1.0f;
      }
      double err = 0;
      for (int i = 0; i < c.n; ++i) err = std::max(err, (double)std::fabs(dev[i] - ref[i]));
      if (err > 1e-5) ++bad;
      std::vector<float> ts;
      for (int r = 0; r < WARM + REPS; ++r) {
        CK(cudaEventRecord(t0, s0));
        CK(cudaGraphLaunch(ge, s0));
        CK(cudaEventRecord(t1, s0));
        CK(cudaEventSynchronize(t1));
        float ms;
        CK(cudaEventElapsedTime(&ms, t0, t1));
        if (r >= WARM) ts.push_back(ms);
      }
      res[variant] = median(ts);
      std::printf("%-18s %-5s %-6s edges %3zu  median %.4f ms  %.3f us/kernel  max err %.2e%s\n", c.name,
                  cross ? "cross" : "one", pdl ? "pdl" : "plain", nedges, res[variant],
                  1000 * res[variant] / K, err, err > 1e-5 ? "  WRONG" : "");
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    std::printf("%-18s saved per edge: one stream %.3f us, cross %.3f us\n", c.name,
                1000 * (res[0] - res[1]) / K, 1000 * (res[2] - res[3]) / K);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  std::printf(bad ? "SOME WRONG\n" : "ALL CORRECT\n");
  return bad ? 1 : 0;
}
