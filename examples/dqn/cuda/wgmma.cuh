// Hopper (sm_90a) warpgroup matrix instructions for the DQN step's kernels: TF32 wgmma
// m64n64k8 with A from shared memory (SS) or from registers (RS), B from shared memory, the
// 128-byte swizzled K-major layout they read, their descriptors, the fences that order
// shared memory and registers around them, and TF32 operands by one add. Everything here
// was checked on the H200 by the probe in bench/probes/wgmma (its NOTES.md has the layouts,
// the descriptor bits and the fence rules with their sources), from which these are copied
// (the probe is a standalone harness and keeps its own copy).
//
// Only the sm_90a compilation sees these (__CUDA_ARCH_FEAT_SM90_ALL): the compute_90 PTX
// that the build also embeds for newer GPUs has no wgmma, and the host side takes the
// mma.sync kernel there (kernels.rs: Kernels::has_wgmma, IqnFusedKernel).
#pragma once

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DQN_HAS_WGMMA 1

// Byte offset of element (r, k) of a K-major operand of `rows` rows (M or N, a multiple of
// 8) with the 128-byte swizzle, 4-byte elements, K a multiple of 32: K-blocks of 32 elements
// are dense [rows][128 B] arrays, one after the other; inside each 1024-byte atom (8 rows,
// which must start 1024-byte aligned) the 16-byte chunk c of row r sits at c ^ (r % 8).
__device__ __forceinline__ uint32_t sw128_off(uint32_t r, uint32_t k, uint32_t rows) {
    return (k / 32) * rows * 128 + r * 128 + ((((k % 32) / 4) ^ (r % 8)) * 16) + (k % 4) * 4;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared-memory matrix descriptor: start address >> 4 (bits 0-13), leading byte offset 16
// (unused by swizzled K-major layouts), stride byte offset 1024 (8 rows x 128 B, bits
// 32-45), base offset 0 (atoms are 1024-aligned), swizzle mode 1 = 128 B (bits 62-63). A
// K-step of 8 elements moves the start by 32 bytes inside the row; the hardware applies the
// XOR to the absolute address, which is why the atoms must be aligned.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
    uint64_t d = 0;
    d |= (uint64_t)((saddr & 0x3FFFFu) >> 4);
    d |= (uint64_t)(16u >> 4) << 16;
    d |= (uint64_t)(1024u >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

// Orders this thread's generic-proxy shared-memory writes before later wgmma (async-proxy)
// reads of them: each writer runs it, then a barrier orders it with the issuing warpgroup.
// The other direction (reusing a buffer that a wgmma read) needs only wgmma.wait_group and
// a barrier: a wgmma's completion implies the proxy fence.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Before the first wgmma of a batch, and between register writes (accumulators) and a
// wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Compiler-only fences on the accumulators (CUTLASS's warpgroup_fence_operand): the
// compiler must not move their reads or writes into the asynchronous window.
template <int N>
__device__ __forceinline__ void reg_fence_all(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        asm volatile("" : "+f"(d[i])::"memory");
    }
}
template <int N>
__device__ __forceinline__ void reg_fence_all(uint32_t (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        asm volatile("" : "+r"(d[i])::"memory");
    }
}
// x as a TF32 operand of wgmma, rounded to nearest (ties away) as cvt.rna.tf32.f32 rounds
// it, in one integer add instead of cvt's three instructions: the tensor cores read the top
// 19 bits of a 32-bit operand and ignore the low 13 (measured on the H200 by the probe of
// bench/probes/wgmma, its INFO line: raw fp32 operands give the truncated products), so
// adding half a TF32 ulp first turns that truncation into rounding; a carry out of the
// mantissa moves to the next binade, as rounding does. For finite x below the largest float;
// the low bits it leaves are not zero, so it is only for operands a wgmma reads.
__device__ __forceinline__ uint32_t tf32_operand(float x) {
    return __float_as_uint(x) + 0x1000u;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t x, uint32_t y, uint32_t z,
                                             uint32_t w) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(x), "r"(y), "r"(z),
                 "r"(w)
                 : "memory");
}

// d (+)= A B^T for one m64n64k8 TF32 step, A [64 x 8] and B [64 x 8] K-major: A from shared
// memory through its descriptor (SS) or from four registers per thread (RS: register j of
// thread t is A[16 w + g + 8 (j & 1)][q + 4 (j >> 1)]); scale_d = 0 ignores d's old value.
// Accumulator register i of thread t of the warpgroup (warp w = t / 32, g = lane / 4,
// q = lane % 4) is element
//   row = 16 w + g + 8 ((i >> 1) & 1),   col = 8 (i >> 2) + 2 q + (i & 1).
// (Generated by bench/probes/wgmma/gen_wrappers.py.)
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}


#endif  // __CUDA_ARCH_FEAT_SM90_ALL
