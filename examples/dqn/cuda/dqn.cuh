// Shared by the DQN step's kernels (heads.cu, iqn.cu, attention.cu): the loss buffer's
// slots, the per-branch pointer structs, the loss helpers, 16-byte loads and stores and
// the TF32 tensor-core helpers. The fixed-order reductions come from stepgraph-kernels,
// whose headers stepgraph-build puts on the include path.
#pragma once

#include "stepgraph/common.cuh"
#include "stepgraph/reduce.cuh"

// Slots of the step's loss buffer: LOSS_SLOT_COUNT floats, zeroed by a memset at the start
// of the step. A kernel that computes a loss term adds the term into its slot and
// coefficient * term into LOSS_TOTAL. Mirrored by `stepgraph_dqn::kernels::LossSlot`; a unit
// test in lib.rs reads these lines and checks that the two agree.
#define LOSS_TOTAL 0
#define LOSS_TD 1
#define LOSS_IQL 2
#define LOSS_IQN 3
#define LOSS_ATTN 4
#define LOSS_CQL 5
#define LOSS_CONF 6
#define LOSS_SLOT_COUNT 8

// Per-branch arrays arrive as one pointer per branch, passed by value: each branch's
// array is its own allocation, written by that branch's op on that branch's stream, so
// the schedule can tell the branches' buffers apart. MAX_BRANCHES matches the Rust side.
#define MAX_BRANCHES 8
struct BranchIn {
    const float* p[MAX_BRANCHES];
};
struct BranchOut {
    float* p[MAX_BRANCHES];
};

// Huber loss with threshold 1 and its derivative (the clamp), NaN passing through.
__device__ __forceinline__ float huber(float x) {
    const float a = fabsf(x);
    return a <= 1.0f ? 0.5f * x * x : a - 0.5f;
}

__device__ __forceinline__ float huber_grad(float x) {
    return x < -1.0f ? -1.0f : (x > 1.0f ? 1.0f : x);
}

// The asymmetric weight of an expectile or quantile loss at fraction tau for residual u:
// |tau - 1(u < 0)|.
__device__ __forceinline__ float asymmetric_weight(float tau, float u) {
    return fabsf(tau - (u < 0.0f ? 1.0f : 0.0f));
}

// Adds one loss term l to its slot and coef * l to the total (one atomicAdd each: each
// slot has one writer per step, so its value is deterministic).
__device__ __forceinline__ void add_loss_term(float* losses, int slot, float l, float coef) {
    atomicAdd(&losses[slot], l);
    atomicAdd(&losses[LOSS_TOTAL], coef * l);
}

// 16-byte accesses. The pointers must be 16-byte aligned: the wrappers take whole
// allocations (256-byte aligned) and use these only at offsets that are multiples of 4.
__device__ __forceinline__ float4 ld4(const float* p) {
    return __ldg(reinterpret_cast<const float4*>(p));
}

// A load that is used once: evict first, so it does not push reused data out of L2.
__device__ __forceinline__ float4 ld4_stream(const float* p) {
    return __ldcs(reinterpret_cast<const float4*>(p));
}

__device__ __forceinline__ void st4(float* p, float4 v) {
    *reinterpret_cast<float4*>(p) = v;
}

__device__ __forceinline__ float4 zero4() {
    return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// One halving exchange of a reduce-scatter over lanes: the lanes with bit m of the lane
// index set keep the upper HALF of v[0 .. 2 HALF) and add their partner's copy of it, the
// others the lower half. Every lane of the warp must call it; HALF is a template parameter
// so that every index is a constant (a loop over the halves leaves v in local memory).
template <int HALF, int N>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[N], unsigned lane, unsigned m) {
    static_assert(2 * HALF <= N, "a step halves what is left of v");
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
        const float keep = upper ? v[i + HALF] : v[i];
        const float send = upper ? v[i] : v[i + HALF];
        v[i] = keep + __shfl_xor_sync(FULL_MASK, send, m);
    }
}

// Reduce-scatter of 8 values over the 8 lanes that differ in bits 4, 3 and 2: afterwards
// v[0] of lane l holds, summed over those 8 lanes, the value numbered 4 bit4(l) + 2 bit3(l)
// + bit2(l). 7 shuffles for 8 sums instead of 8 x 3.
__device__ __forceinline__ void reduce_scatter8(float (&v)[8], unsigned lane) {
    reduce_scatter_step<4>(v, lane, 16);
    reduce_scatter_step<2>(v, lane, 8);
    reduce_scatter_step<1>(v, lane, 4);
}

// ---- Tensor cores: TF32 mma.sync (the IQN head and the trunk's layer-1 gradients) ----

// x rounded to TF32 (10-bit mantissa, to nearest, ties away), as the tensor cores read it.
__device__ __forceinline__ unsigned tf32_bits(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// d += A B for one m16n8k8 TF32 tile. Fragments (PTX ISA; g = lane / 4, t = lane % 4,
// (row, column)):
//   A (16 x 8): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   B (8 x 8):  b0 (t, g), b1 (t + 4, g)
//   C (16 x 8): c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
