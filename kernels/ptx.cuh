// ptx.cuh - tiny PTX wrappers shared by the kernel families (one instruction each).
#pragma once

#include "kernels/common.cuh"

namespace ck {

// The shared-memory (state space) address of a generic pointer into shared memory, as the PTX
// instructions that name shared memory take it.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ld.global.nc.L1::no_allocate.L2::256B.v4.u32: 16 bytes of a read-once stream (the weight of a
// small-M GEMM): no L1 line is spent on it, and the 256-byte L2 prefetch brings in the
// neighbouring chunks the other warps of the block are about to ask for. sm_80 and newer; below
// that (and in the host pass) it compiles to zeros and is never called.
__device__ __forceinline__ uint4 load_stream_16(const void* p) {
    uint4 v = make_uint4(0, 0, 0, 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
#endif
    return v;
}

// 32-bit word i (a compile-time constant after unrolling) of a 16-byte vector.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

}  // namespace ck
