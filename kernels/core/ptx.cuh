// ptx.cuh - tiny PTX wrappers shared by the kernel families (one instruction each).
#pragma once

#include "kernels/core/common.cuh"

// Tensor-core mma.sync (int8, fp16, bf16), cp.async and ldmatrix exist from sm_80. Files that
// use them are built for sm_75 too, where their kernels are never launched: below sm_80 (and in
// the host pass) these wrappers are empty, and kernels that need them trap at entry.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CK_SM80 1
#else
#define CK_SM80 0
#endif

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
#if CK_SM80
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
#endif
    return v;
}

// The same for 8 bytes (ld...v2.u32): a W4A8 lane's 16 packed codes.
__device__ __forceinline__ uint2 load_stream_8(const void* p) {
    uint2 v = make_uint2(0, 0);
#if CK_SM80
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];\n"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
#endif
    return v;
}

// prefetch.global.L2: brings the line holding p into L2 and nothing into the SM. Safe before
// wait_for_prior_grid() even where the kernel before writes that line: L2 is where every SM's
// writes meet, so a load after the wait sees them either way.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if CK_SM80
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}

// cp.async.cg.shared.global (16 bytes, L2 only).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
#if CK_SM80
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#endif
}

// cp.async.cg.shared.global (16 bytes, L2 only): src_bytes = 0 reads nothing from global memory
// and fills the 16 shared bytes with zeros, which is how out-of-range rows and the K tail load.
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, bool valid) {
#if CK_SM80
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
#endif
}

// cp.async.ca.shared.global (kBytes = 4, 8 or 16, through L1): reads the first src_bytes
// (0 ... kBytes) of src and fills the rest of the kBytes shared bytes with zeros (0 reads
// nothing). For data that other blocks of the SM read again (the activations, scales and zero
// points of a GEMM); 4 and 8 bytes exist only in the .ca form.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca_fill(uint32_t dst, const void* src, int src_bytes) {
    static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if CK_SM80
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(kBytes), "r"(src_bytes)
                 : "memory");
#endif
}

// The same, all kBytes or nothing: valid = false fills the shared bytes with zeros.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca_zfill(uint32_t dst, const void* src, bool valid) {
    cp_async_ca_fill<kBytes>(dst, src, valid ? kBytes : 0);
}

// createpolicy.fractional.L2::evict_first.b64: a cache policy that marks every line it touches
// as first to go (for a weight that is read exactly once, so that what is read again stays).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t policy = 0;
#if CK_SM80
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
    return policy;
}

// createpolicy.fractional.L2::evict_normal.b64: the default policy, as a value (for a kernel
// that picks its weight's policy at run time).
__device__ __forceinline__ uint64_t l2_evict_normal_policy() {
    uint64_t policy = 0;
#if CK_SM80
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
#endif
    return policy;
}

// cp.async.cg.shared.global.L2::cache_hint (16 bytes, L2 only, with a cache policy).
__device__ __forceinline__ void cp_async_16_hint(uint32_t dst, const void* src, uint64_t policy) {
#if CK_SM80
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "l"(policy)
                 : "memory");
#endif
}

// cp.async.commit_group
__device__ __forceinline__ void cp_async_commit() {
#if CK_SM80
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// cp.async.wait_group: at most kPending of this thread's groups are still in flight.
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
#if CK_SM80
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices (8 rows of 16 bytes each);
// lane i gives the address of row i % 8 of matrix i / 8; register j receives matrix j, row
// lane / 4, bytes 4 * (lane % 4) .. +3.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if CK_SM80
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: as ldmatrix_x4, each 8x8 matrix transposed:
// register j receives matrix j, column lane / 4, rows 2 * (lane % 4) and 2 * (lane % 4) + 1 (an
// mma B fragment read from a row-major [k][n] tile, such as attention's V [keys][D]).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if CK_SM80
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32: c += a (16x32, row) * b (32x8, col).
// Fragments (g = lane / 4, t = lane % 4), four int8 per register, lowest k in the lowest byte:
//   a0: A[g][4t..4t+3]   a1: A[g+8][4t..]   a2: A[g][16+4t..]   a3: A[g+8][16+4t..]
//   b0: B[4t..4t+3][g]   b1: B[16+4t..][g]
//   c0, c1: C[g][2t], C[g][2t+1]            c2, c3: C[g+8][2t], C[g+8][2t+1]
__device__ __forceinline__ void mma_s8_16x8x32(int32_t (&c)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if CK_SM80
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32: the same fragments as mma_s8_16x8x32,
// FP8 E4M3 bytes, float32 c (sm_89 and newer; below, nothing). As with wgmma, the tensor cores
// add the 32 products to c with fewer bits than float32 keeps.
__device__ __forceinline__ void mma_e4m3_16x8x32(float (&c)[4], uint32_t a0, uint32_t a1,
                                                 uint32_t a2, uint32_t a3, uint32_t b0,
                                                 uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: c += a (16x16) * b (16x8).
// Fragments (g = lane / 4, t = lane % 4), two 16-bit values per register, lower k in the low half:
//   a0: A[g][2t..2t+1]   a1: A[g+8][2t..]   a2: A[g][2t+8..2t+9]   a3: A[g+8][2t+8..]
//   b0: B[2t..2t+1][g]   b1: B[2t+8..2t+9][g]
//   c0, c1: C[g][2t], C[g][2t+1]            c2, c3: C[g+8][2t], C[g+8][2t+1]
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
#if CK_SM80
    if constexpr (std::is_same_v<T, __half>) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
#endif
}

// mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{f16,bf16}.{f16,bf16}.f32:
// c += a (16x32, 2:4 sparse along k, held compressed as 16x16) * b (32x8). A's registers are
// those of mma_16x8x16 over the compressed columns (column 2j, 2j + 1 = the two kept values of
// the block of 4 k at 4j); e holds the kept positions (idx0 | idx1 << 2, idx0 < idx1, per block,
// lowest block in the lowest nibble), kSelector (0 or 1) names the lanes of each quad that give
// it: lanes 4g + 2 kSelector (blocks 0-3, k 0 .. 15) and 4g + 2 kSelector + 1 (blocks 4-7), row g
// in bits 0..15 and row g + 8 in bits 16..31; the other lanes' e is not read.
//   b0: B[2t..2t+1][g]  b1: B[2t+8..][g]  b2: B[2t+16..][g]  b3: B[2t+24..][g]
//   c as mma_16x8x16.
template <typename T, int kSelector>
__device__ __forceinline__ void mma_sp_16x8x32(float (&c)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[4], uint32_t e) {
    static_assert(kSelector == 0 || kSelector == 1, "m16n8k32 takes selector 0 or 1");
#if CK_SM80
    if constexpr (std::is_same_v<T, __half>) {
        asm("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, %13;\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]),
              "r"(b[3]), "r"(e), "n"(kSelector));
    } else {
        asm("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, %13;\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]),
              "r"(b[3]), "r"(e), "n"(kSelector));
    }
#endif
}

// lop3.b32: the three-input bitwise function whose truth table is kLut (its value on the
// operands a = 0xF0, b = 0xCC, c = 0xAA), in one instruction. Written out in C, a function with
// two immediates (a mask and a magic exponent, say) takes two: a LOP3 holds only one.
template <uint32_t kLut>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(kLut));
    return d;
#else
    uint32_t d = 0;   // the table, minterm by minterm
    for (int i = 0; i < 8; ++i)
        if (kLut >> i & 1) d |= (i & 4 ? a : ~a) & (i & 2 ? b : ~b) & (i & 1 ? c : ~c);
    return d;
#endif
}

// (a & b) | c: table 0xF0 & 0xCC | 0xAA = 0xEA.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
    return lop3<0xEA>(a, b, c);
}

// (a & b) ^ c: table 0xF0 & 0xCC ^ 0xAA = 0x6A.
__device__ __forceinline__ uint32_t and_xor(uint32_t a, uint32_t b, uint32_t c) {
    return lop3<0x6A>(a, b, c);
}

// prmt.b32 in its default mode, selector nibble by nibble: bits 0-2 pick a byte of {b, a}
// (a's bytes 0-3, b's 4-7) and bit 3, when set, replicates that byte's sign bit instead (0x00
// or 0xFF). (__byte_perm documents the first half only.)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__CUDA_ARCH__)
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
    return d;
#else
    uint32_t d = 0;
    const uint64_t bytes = uint64_t(b) << 32 | a;
    for (int i = 0; i < 4; ++i) {
        const uint32_t nibble = selector >> 4 * i & 0xF;
        uint32_t byte = uint32_t(bytes >> 8 * (nibble & 7)) & 0xFF;
        if (nibble & 8) byte = byte & 0x80 ? 0xFF : 0x00;
        d |= byte << 8 * i;
    }
    return d;
#endif
}

// 32-bit word i (a compile-time constant after unrolling) of a 16-byte vector.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Programmatic dependent launch (sm_90 and newer; elsewhere, and in the host pass, nothing): a
// kernel launched with launch_dependent (common.cuh) may start while the kernel before it in the
// stream still runs. It must call wait_for_prior_grid() before it touches anything that kernel
// writes: griddepcontrol.wait returns once that grid has completed and its writes are visible.
// The kernel before it may call allow_dependent_launch() once its remaining work is short, so that
// the dependent grid's launch overlaps it (without the call, the launch waits for its end).
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace ck
