// ptx_sm90.cuh - tiny PTX wrappers for Hopper (sm_90a) kernels, one instruction each: mbarriers,
// TMA bulk-tensor copies, wgmma and its shared-memory descriptors, named barriers, setmaxnreg.
// The sm_80 wrappers (mma.sync, cp.async, ldmatrix) are in ptx.cuh; the host side of TMA (tensor
// maps) is in tma.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap

#include "kernels/core/ptx.cuh"

// wgmma and setmaxnreg need the architecture-specific sm_90a target (TMA and the mbarrier
// transaction counts sm_90); all of these wrappers exist only in the sm_90a device pass, which
// defines __CUDA_ARCH_FEAT_SM90_ALL. Every other pass (the host, the other targets of a fat
// binary) sees none of them: kernels that use them put their bodies under #ifdef CK_SM90A_DEVICE
// and compile to empty ones there, which the host never launches (their launchers check the
// device first).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CK_SM90A_DEVICE 1
#endif

namespace ck {

// The layout-type field of a wgmma shared-memory matrix descriptor (bits 62-63): the swizzle the
// tile was written with, which must be the one its TMA tensor map used.
enum class WgmmaSwizzle : uint64_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

#ifdef CK_SM90A_DEVICE
// ---------------------------------------------------------------------------------------------
// mbarrier: a shared-memory barrier that counts thread arrivals and asynchronous transaction
// bytes; a phase completes when both reach their expected counts, and the next phase begins.
// ---------------------------------------------------------------------------------------------

// mbarrier.init.shared::cta.b64: the barrier completes a phase after `count` arrivals (plus the
// transaction bytes announced for that phase).
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count));
}

// mbarrier.arrive.expect_tx.shared::cta.b64: arrive, and announce `bytes` that asynchronous
// copies (TMA) will complete on this barrier in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(shared_address(bar)), "r"(bytes)
                 : "memory");
}

// mbarrier.arrive.shared::cta.b64: one plain arrival (release: this thread's earlier shared
// memory accesses are done before a waiter sees the phase complete).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64 in a loop: returns once the phase with this parity
// (0 for even phases, 1 for odd) has completed; what the arrivals and the copies wrote is then
// visible to this thread (acquire).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(shared_address(bar)),
        "r"(parity)
        : "memory");
}

// fence.mbarrier_init.release.cluster: the mbarrier.inits this thread did before it are visible
// to every thread of the cluster that synchronizes with it afterwards.
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// fence.proxy.async.shared::cta: this thread's earlier shared-memory writes through generic
// addresses (barrier initialization, data) are visible to the asynchronous proxy, that is to the
// TMA copies and wgmmas issued after it.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A ring of kStages shared-memory stages between one TMA producer and consumer warps: stage s
// is filled when full[s] completes (one producer arrival with its transaction bytes) and free
// again when empty[s] completes (empty_arrivals: one per consumer warp). Thread 0 initializes
// the barriers; the caller then synchronizes the block before any thread uses them.
template <int kStages>
__device__ __forceinline__ void init_stage_ring(uint64_t* full, uint64_t* empty,
                                                int empty_arrivals) {
    if (threadIdx.x != 0) return;
    for (int s = 0; s < kStages; ++s) {
        mbar_init(&full[s], 1);
        mbar_init(&empty[s], empty_arrivals);
    }
    fence_mbarrier_init();       // the inits are visible to the other threads ...
    fence_proxy_async_shared();  // ... and to the TMA that completes on the barriers
}

// The producer's place in such a ring: acquire() waits until its stage is free (the first round
// finds every stage free) and announces `bytes` of TMA on the stage's full barrier; the copies
// follow, then next().
template <int kStages> struct ProducerCursor {
    int stage = 0;
    uint32_t round = 0;
    __device__ __forceinline__ void acquire(uint64_t* full, uint64_t* empty, uint32_t bytes) {
        mbar_wait(&empty[stage], (round & 1) ^ 1);
        mbar_arrive_expect_tx(&full[stage], bytes);
    }
    __device__ __forceinline__ void next() {
        if (++stage == kStages) {
            stage = 0;
            ++round;
        }
    }
};

// A consumer warp's place in such a ring: the stage it reads (full[stage], parity()), and the
// stage it read before, which next() gives back to the producer (the warp's arrival on its empty
// barrier) once the caller has retired every wgmma that read it.
template <int kStages> struct StageCursor {
    int stage = 0, previous = -1;
    uint32_t round = 0;
    __device__ __forceinline__ uint32_t parity() const { return round & 1; }
    __device__ __forceinline__ void next(uint64_t* empty, int lane) {
        if (previous >= 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[previous]);
        }
        previous = stage;
        if (++stage == kStages) {
            stage = 0;
            ++round;
        }
    }
};

// ---------------------------------------------------------------------------------------------
// TMA
// ---------------------------------------------------------------------------------------------

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes: TMA copy of the
// box at (x = column, y = row) of the tensor map's matrix into shared memory at dst (laid out and
// swizzled as the map says), completing its bytes on `bar`. Out-of-bounds elements are filled
// (zeros, with the maps of tma.cuh).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];" ::"r"(shared_address(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(x), "r"(y)
        : "memory");
}

// cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes: the same for a 3-D
// tensor map, the box at (x, y, z) (x the innermost coordinate).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int x, int y, int z) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(shared_address(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(x), "r"(y), "r"(z)
        : "memory");
}

// prefetch.tensormap: pulls a tensor map (a __grid_constant__ kernel parameter) into the cache
// before its first copy needs it.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Warpgroup synchronization and register allocation
// ---------------------------------------------------------------------------------------------

// bar.sync id, kThreads: waits until kThreads threads (whole warps, e.g. the 128 of one
// warpgroup) have arrived at barrier `id`, and orders their memory accesses around it like
// __syncthreads does for the block. Ids 1 to 15 are free; 0 is __syncthreads.
template <int kThreads> __device__ __forceinline__ void named_barrier_sync(int id) {
    static_assert(kThreads > 0 && kThreads % 32 == 0, "bar.sync counts whole warps");
    asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(kThreads) : "memory");
}

// bar.arrive id, kThreads: counts this warp's threads toward barrier `id` (as named_barrier_sync
// with the same kThreads does) without waiting: a signal to the warps that sync on it.
template <int kThreads> __device__ __forceinline__ void named_barrier_arrive(int id) {
    static_assert(kThreads > 0 && kThreads % 32 == 0, "bar.arrive counts whole warps");
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(kThreads) : "memory");
}

// setmaxnreg.dec.sync.aligned.u32: lowers this warpgroup's per-thread register limit to kRegs,
// returning the rest to the pool (a producer warpgroup that needs few).
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, step 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// setmaxnreg.inc.sync.aligned.u32: raises this warpgroup's per-thread register limit to kRegs
// from the pool, waiting until the registers are free (consumers that hold the accumulators).
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, step 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---------------------------------------------------------------------------------------------
// Thread block clusters: the CTAs of a cluster run at once on one GPC and may read each other's
// shared memory (distributed shared memory).
// ---------------------------------------------------------------------------------------------

// %cluster_ctarank: this CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

// barrier.cluster.arrive.release + barrier.cluster.wait.acquire: waits until every thread of the
// cluster has arrived; the shared-memory writes before it (in any CTA of the cluster) are
// visible to the reads after it. The non-.aligned forms: threads of a warp may arrive at
// different times.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// mapa + ld.shared::cluster.v4.f32: the 16 bytes at this CTA's shared address `local` as they
// are in CTA `rank` of the cluster (the same offset in its shared memory).
__device__ __forceinline__ float4 ld_shared_cluster_f4(uint32_t local, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
    return v;
}
// The sum of the float4 at this CTA's shared address `local` over CTAs 0 .. ranks - 1 of the
// cluster (each one's at the same offset), added in rank order: a K split's partial sums, the
// same bits whichever CTA adds them.
__device__ __forceinline__ float4 cluster_sum_f4(uint32_t local, int ranks) {
    float4 sum = ld_shared_cluster_f4(local, 0);
    for (int r = 1; r < ranks; ++r) {
        const float4 p = ld_shared_cluster_f4(local, uint32_t(r));
        sum.x += p.x, sum.y += p.y, sum.z += p.z, sum.w += p.w;
    }
    return sum;
}

// ---------------------------------------------------------------------------------------------
// wgmma: one warpgroup (128 threads) multiplies a 64 x N x K tile asynchronously; A and B come
// from shared memory through descriptors, the accumulators live in the threads' registers.
// ---------------------------------------------------------------------------------------------

// wgmma.fence.sync.aligned: orders this warpgroup's earlier register accesses (to accumulators
// and A fragments) before the wgmmas that follow read them.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// An empty asm that "modifies" each accumulator: the compiler may not move their reads, writes
// or copies across it. Placed around a stage's wgmmas, it keeps register copies of accumulators
// that are in flight out of the wgmma pipeline (which ptxas would otherwise serialize, C7514).
template <int kN> __device__ __forceinline__ void wgmma_fence_operands(float (&d)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for A fragments in registers. ptxas treats a wgmma's register operands as read when
// the instruction issues, while the tensor cores read them later: fenced here after the
// wgmma_wait that retires their wgmma, they stay allocated (live) until then, so that no other
// value (a temporary, the next fragment) is written into them while they are still to be read.
template <int kN> __device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// wgmma.commit_group.sync.aligned: closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// wgmma.wait_group.sync.aligned: waits until at most kPending committed groups are still
// running; the accumulators of the others may then be read and their shared memory reused.
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// The wgmma shared-memory matrix descriptor of a tile: start address (bits 0-13), leading-
// dimension byte offset (16-29), stride byte offset (32-45), all in 16-byte units, and the
// swizzle (62-63). The defaults describe a K-major tile written by TMA with the 128-byte swizzle:
// rows of 128 bytes, 1024 bytes (8 rows, the swizzle's period) between 8-row groups, and a leading
// offset the hardware ignores for that layout (1 by convention). The tile must then start
// 1024-byte aligned; stepping K inside the 128-byte row just advances the start address, as the
// hardware applies the XOR pattern to the final address, like TMA did when writing.
// An N-major B tile (wgmma_m64nk16_rs's kTransB) written the same way holds rows of 64 16-bit n
// values, one row per k: stride_bytes is then the distance between 8-k groups (1024, the rows'
// period) and leading_bytes the distance between consecutive blocks of 64 n (another box).
__device__ __forceinline__ uint64_t wgmma_descriptor(const void* tile,
                                                     WgmmaSwizzle swizzle = WgmmaSwizzle::k128B,
                                                     uint32_t stride_bytes = 1024,
                                                     uint32_t leading_bytes = 16) {
    return uint64_t((shared_address(tile) & 0x3FFFF) >> 4) |
           (uint64_t((leading_bytes >> 4) & 0x3FFF) << 16) |
           (uint64_t((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(swizzle) << 62);
}

// The descriptor of the tile `bytes` further on (bytes a multiple of 16): its start address
// field plus bytes / 16, with no carry out of the field (shared addresses stay below 2^18).
__device__ __forceinline__ uint64_t wgmma_descriptor_advance(uint64_t desc, uint32_t bytes) {
    return desc + (bytes >> 4);
}

// The accumulator operands of a wgmma, written once for every shape. CK_WGMMA_ACC_n(X, c) expands
// X(c, i) for i = 1 .. n - 1: operand 0 opens each list, so that every later one brings its own
// comma, and c is the accumulators' constraint ("+r" for s32, "+f" for f32). The numbers are
// pasted together from their digits (CK_WGMMA_DECADE(X, c, 4) is X(c, 40) ... X(c, 49)): they
// appear in the instruction text ("%40") as well as in the operand list (d[40]).
#define CK_WGMMA_DECADE(X, c, t)                                                                  \
    X(c, t##0) X(c, t##1) X(c, t##2) X(c, t##3) X(c, t##4) X(c, t##5) X(c, t##6) X(c, t##7)       \
    X(c, t##8) X(c, t##9)
#define CK_WGMMA_ACC_32(X, c)                                                                     \
    X(c, 1) X(c, 2) X(c, 3) X(c, 4) X(c, 5) X(c, 6) X(c, 7) X(c, 8) X(c, 9)                       \
    CK_WGMMA_DECADE(X, c, 1) CK_WGMMA_DECADE(X, c, 2) X(c, 30) X(c, 31)
#define CK_WGMMA_ACC_64(X, c)                                                                     \
    CK_WGMMA_ACC_32(X, c) X(c, 32) X(c, 33) X(c, 34) X(c, 35) X(c, 36) X(c, 37) X(c, 38)          \
    X(c, 39) CK_WGMMA_DECADE(X, c, 4) CK_WGMMA_DECADE(X, c, 5) X(c, 60) X(c, 61) X(c, 62) X(c, 63)
#define CK_WGMMA_ACC_128(X, c)                                                                    \
    CK_WGMMA_ACC_64(X, c) X(c, 64) X(c, 65) X(c, 66) X(c, 67) X(c, 68) X(c, 69)                   \
    CK_WGMMA_DECADE(X, c, 7) CK_WGMMA_DECADE(X, c, 8) CK_WGMMA_DECADE(X, c, 9)                    \
    CK_WGMMA_DECADE(X, c, 10) CK_WGMMA_DECADE(X, c, 11)                                           \
    X(c, 120) X(c, 121) X(c, 122) X(c, 123) X(c, 124) X(c, 125) X(c, 126) X(c, 127)
#define CK_WGMMA_NAME(c, i) ", %" #i
#define CK_WGMMA_OPERAND(c, i) , c(d[i])

// wgmma.mma_async.sync.aligned.<kind> with both matrices in shared memory, as one asm statement
// over the names in scope: the accumulator array d (operands %0 .. %(n-1), listed by acc =
// CK_WGMMA_ACC_n with constraint c), then desc_a, desc_b and accumulate, whose operand numbers
// n, n+1, n+2 are given as strings. accumulate = 0 overwrites d instead of adding to it (the
// scale-d predicate). immediates: what follows scale-d for the 16-bit types (", 1, 1, 0, 0": scale
// and transpose of A and B); ", 1, 1" for FP8 (scales only); empty for the integer ones.
#define CK_WGMMA_SS(kind, acc, c, n_desc_a, n_desc_b, n_accumulate, immediates)                   \
    asm volatile("{\n.reg .pred p;\n"                                                             \
                 "setp.ne.b32 p, %" n_accumulate ", 0;\n"                                         \
                 "wgmma.mma_async.sync.aligned." kind " {%0" acc(CK_WGMMA_NAME, c) "}, "          \
                 "%" n_desc_a ", %" n_desc_b ", p" immediates ";\n}\n"                            \
                 : c(d[0]) acc(CK_WGMMA_OPERAND, c)                                               \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8: d (the warpgroup's 64 x 128 int32
// accumulators, 64 per thread: warp w holds rows 16 w .. 16 w + 15, each 8-column block in the
// mma.sync C-fragment layout) += A (64 x 32 int8, desc_a) x B^T (128 x 32 int8, desc_b), both
// K-major in shared memory; accumulate = 0 overwrites d instead.
__device__ __forceinline__ void wgmma_m64n128k32_s8(int32_t (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b, int accumulate) {
    CK_WGMMA_SS("m64n128k32.s32.s8.s8", CK_WGMMA_ACC_64, "+r", "64", "65", "66", "");
}

// wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8: the same with N = 256 (128 accumulators
// per thread).
__device__ __forceinline__ void wgmma_m64n256k32_s8(int32_t (&d)[128], uint64_t desc_a,
                                                    uint64_t desc_b, int accumulate) {
    CK_WGMMA_SS("m64n256k32.s32.s8.s8", CK_WGMMA_ACC_128, "+r", "128", "129", "130", "");
}

// wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3: FP8 E4M3 operands (32 bytes of K, as
// s8), float32 accumulators in the same layout; A and B K-major (FP8 has no transpose), scale-a
// and scale-b +1. The tensor cores add a step's 32 products to d with fewer bits than float32
// keeps: callers that need float32 sums add d into their own accumulators every few steps.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b, int accumulate) {
    CK_WGMMA_SS("m64n128k32.f32.e4m3.e4m3", CK_WGMMA_ACC_64, "+f", "64", "65", "66", ", 1, 1");
}

// wgmma.mma_async.sync.aligned.m64n128k16.f32.{f16,bf16}.{f16,bf16} with both matrices in shared
// memory: d (64 x 128 float32 accumulators, 64 per thread, in the layout of wgmma_m64n128k32_s8)
// += A (64 x 16, desc_a) x B^T (B: 128 x 16, desc_b), both K-major; accumulate = 0 overwrites d.
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b, int accumulate) {
    static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                  "16-bit float operands");
    if constexpr (std::is_same_v<T, __half>) {
        CK_WGMMA_SS("m64n128k16.f32.f16.f16", CK_WGMMA_ACC_64, "+f", "64", "65", "66",
                    ", 1, 1, 0, 0");
    } else {
        CK_WGMMA_SS("m64n128k16.f32.bf16.bf16", CK_WGMMA_ACC_64, "+f", "64", "65", "66",
                    ", 1, 1, 0, 0");
    }
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} with A from registers, N =
// 64, 128 or 256: d (64 x N float32 accumulators, N / 2 per thread, in the layout of
// wgmma_m64n128k32_s8) += A (64 x 16, a[0..3]) x B (16 x N, desc_b). B is K-major in shared
// memory (N rows of 16 k, kTransB false) or N-major (16 rows of N, kTransB true: the "transposed"
// B of a row-major [k][n] tile, as attention's V [keys][d]). A's fragment is the mma.sync
// m16n8k16 A fragment of each warp's 16 rows: warp w of the warpgroup holds rows 16 w .. 16 w +
// 15; with g = lane / 4, t = lane % 4 (lower k in the low half of a register):
//   a[0]: A[16w + g][2t, 2t + 1]        a[1]: A[16w + g + 8][2t, 2t + 1]
//   a[2]: A[16w + g][2t + 8, 2t + 9]    a[3]: A[16w + g + 8][2t + 8, 2t + 9]
// The registers of a are read asynchronously: they must not change until a wgmma_wait covers
// this wgmma, and a wgmma_fence must separate their writes from it. accumulate = 0 overwrites d.
// The operand numbers after the accumulators (a, desc_b, accumulate, the transpose immediate)
// are given as strings.
#define CK_WGMMA_RS(kind, acc, n_a0, n_a1, n_a2, n_a3, n_desc, n_accumulate, n_trans)             \
    asm volatile("{\n.reg .pred p;\n"                                                             \
                 "setp.ne.b32 p, %" n_accumulate ", 0;\n"                                         \
                 "wgmma.mma_async.sync.aligned." kind " {%0" acc(CK_WGMMA_NAME, "+f") "}, "       \
                 "{%" n_a0 ", %" n_a1 ", %" n_a2 ", %" n_a3 "}, %" n_desc ", p, 1, 1, %" n_trans  \
                 ";\n}\n"                                                                         \
                 : "+f"(d[0]) acc(CK_WGMMA_OPERAND, "+f")                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate),     \
                   "n"(int(kTransB)))

template <typename T, int kN, bool kTransB = false>
__device__ __forceinline__ void wgmma_m64nk16_rs(float (&d)[kN / 2], const uint32_t (&a)[4],
                                                 uint64_t desc_b, int accumulate) {
    static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                  "16-bit float operands");
    static_assert(kN == 64 || kN == 128 || kN == 256, "N = 64, 128 or 256");
    constexpr bool kHalf = std::is_same_v<T, __half>;
    if constexpr (kN == 64 && kHalf) {
        CK_WGMMA_RS("m64n64k16.f32.f16.f16", CK_WGMMA_ACC_32, "32", "33", "34", "35", "36", "37",
                    "38");
    } else if constexpr (kN == 64) {
        CK_WGMMA_RS("m64n64k16.f32.bf16.bf16", CK_WGMMA_ACC_32, "32", "33", "34", "35", "36",
                    "37", "38");
    } else if constexpr (kN == 128 && kHalf) {
        CK_WGMMA_RS("m64n128k16.f32.f16.f16", CK_WGMMA_ACC_64, "64", "65", "66", "67", "68", "69",
                    "70");
    } else if constexpr (kN == 128) {
        CK_WGMMA_RS("m64n128k16.f32.bf16.bf16", CK_WGMMA_ACC_64, "64", "65", "66", "67", "68",
                    "69", "70");
    } else if constexpr (kHalf) {
        CK_WGMMA_RS("m64n256k16.f32.f16.f16", CK_WGMMA_ACC_128, "128", "129", "130", "131", "132",
                    "133", "134");
    } else {
        CK_WGMMA_RS("m64n256k16.f32.bf16.bf16", CK_WGMMA_ACC_128, "128", "129", "130", "131",
                    "132", "133", "134");
    }
}

// wgmma.mma_async.sp.sync.aligned.m64nNk32.f32.{f16,bf16}.{f16,bf16}: A (64 x 32) 2:4 sparse,
// its kept values from registers, N = 64, 128 or 256: d (wgmma_m64nk16_rs's layout) += A x B
// (32 x N, desc_b, K-major). a is the compressed A (64 x 16, two kept values of every 4 k) in
// wgmma_m64nk16_rs's fragment layout, which is also mma.sp m16n8k32's A fragment per warp:
// a[0], a[2] row g's kept pairs of blocks t and t + 4 (k 4t .. 4t + 3 and 16 + 4t .. 19 + 4t),
// a[1], a[3] row g + 8's. meta holds the positions (idx0 | idx1 << 2, idx0 < idx1, per block of
// 4 k) as mma.sp m16n8k32's metadata: lanes 2 kSel and 2 kSel + 1 of each quad give it (the
// sparsity selector kSel, 0 or 1; the other lanes' values are not read), lane t % 2 == 0 blocks
// 0-3 and t % 2 == 1 blocks 4-7, row g in bits 0-15 and row g + 8 in bits 16-31. The registers
// of a and meta are read asynchronously, as wgmma_m64nk16_rs's; with several of these queued
// and the next A written meanwhile, ptxas (CUDA 13.0) reused a queued one's A registers and the
// results were wrong now and then (gemm_sparse_w4a16_wgmma_sm90.cu retires each before writing
// the next). accumulate = 0 overwrites d.
#define CK_WGMMA_SP_RS(kind, acc, n_a0, n_a1, n_a2, n_a3, n_desc, n_meta, n_sel, n_accumulate)    \
    asm volatile("{\n.reg .pred p;\n"                                                             \
                 "setp.ne.b32 p, %" n_accumulate ", 0;\n"                                         \
                 "wgmma.mma_async.sp.sync.aligned." kind " {%0" acc(CK_WGMMA_NAME, "+f") "}, "    \
                 "{%" n_a0 ", %" n_a1 ", %" n_a2 ", %" n_a3 "}, %" n_desc ", %" n_meta ", %" n_sel \
                 ", p, 1, 1, 0;\n}\n"                                                             \
                 : "+f"(d[0]) acc(CK_WGMMA_OPERAND, "+f")                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(meta),            \
                   "n"(kSel), "r"(accumulate))

template <typename T, int kN, int kSel>
__device__ __forceinline__ void wgmma_sp_m64nk32_rs(float (&d)[kN / 2], const uint32_t (&a)[4],
                                                    uint64_t desc_b, uint32_t meta,
                                                    int accumulate) {
    static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                  "16-bit float operands");
    static_assert(kN == 64 || kN == 128 || kN == 256, "N = 64, 128 or 256");
    static_assert(kSel == 0 || kSel == 1, "sparsity selector 0 or 1");
    constexpr bool kHalf = std::is_same_v<T, __half>;
    if constexpr (kN == 64 && kHalf) {
        CK_WGMMA_SP_RS("m64n64k32.f32.f16.f16", CK_WGMMA_ACC_32, "32", "33", "34", "35", "36",
                       "37", "38", "39");
    } else if constexpr (kN == 64) {
        CK_WGMMA_SP_RS("m64n64k32.f32.bf16.bf16", CK_WGMMA_ACC_32, "32", "33", "34", "35", "36",
                       "37", "38", "39");
    } else if constexpr (kN == 128 && kHalf) {
        CK_WGMMA_SP_RS("m64n128k32.f32.f16.f16", CK_WGMMA_ACC_64, "64", "65", "66", "67", "68",
                       "69", "70", "71");
    } else if constexpr (kN == 128) {
        CK_WGMMA_SP_RS("m64n128k32.f32.bf16.bf16", CK_WGMMA_ACC_64, "64", "65", "66", "67", "68",
                       "69", "70", "71");
    } else if constexpr (kHalf) {
        CK_WGMMA_SP_RS("m64n256k32.f32.f16.f16", CK_WGMMA_ACC_128, "128", "129", "130", "131",
                       "132", "133", "134", "135");
    } else {
        CK_WGMMA_SP_RS("m64n256k32.f32.bf16.bf16", CK_WGMMA_ACC_128, "128", "129", "130", "131",
                       "132", "133", "134", "135");
    }
}
#undef CK_WGMMA_SP_RS

// wgmma.mma_async.sync.aligned.m64n{64,128}k32.f32.e4m3.e4m3 with A from registers: d (64 x kN
// float32 accumulators, kN / 2 per thread, the layout of wgmma_m64n128k32_s8) += A (64 x 32 E4M3)
// x B (32 x kN, desc_b: kN K-major rows of 32 bytes). A's fragment is the mma.sync m16n8k32
// 8-bit A fragment of each warp's 16 rows, one byte per value, lower k in the lower byte:
//   a[0]: A[16w + g][4t .. 4t + 3]         a[1]: A[16w + g + 8][4t .. 4t + 3]
//   a[2]: A[16w + g][16 + 4t .. 19 + 4t]   a[3]: A[16w + g + 8][16 + 4t .. 19 + 4t]
// FP8 has no transpose immediates; scale-a and scale-b are +1. accumulate = 0 overwrites d. The
// registers of a are read asynchronously, as wgmma_m64nk16_rs's.
#define CK_WGMMA_RS_E4M3(kind, acc, n_a0, n_a1, n_a2, n_a3, n_desc, n_accumulate)                \
    asm volatile("{\n.reg .pred p;\n"                                                             \
                 "setp.ne.b32 p, %" n_accumulate ", 0;\n"                                         \
                 "wgmma.mma_async.sync.aligned." kind " {%0" acc(CK_WGMMA_NAME, "+f") "}, "       \
                 "{%" n_a0 ", %" n_a1 ", %" n_a2 ", %" n_a3 "}, %" n_desc ", p, 1, 1;\n}\n"       \
                 : "+f"(d[0]) acc(CK_WGMMA_OPERAND, "+f")                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
template <int kN>
__device__ __forceinline__ void wgmma_m64nk32_e4m3_rs(float (&d)[kN / 2], const uint32_t (&a)[4],
                                                      uint64_t desc_b, int accumulate) {
    static_assert(kN == 64 || kN == 128, "N = 64 or 128");
    if constexpr (kN == 64) {
        CK_WGMMA_RS_E4M3("m64n64k32.f32.e4m3.e4m3", CK_WGMMA_ACC_32, "32", "33", "34", "35", "36",
                         "37");
    } else {
        CK_WGMMA_RS_E4M3("m64n128k32.f32.e4m3.e4m3", CK_WGMMA_ACC_64, "64", "65", "66", "67",
                         "68", "69");
    }
}
#undef CK_WGMMA_RS_E4M3
#endif  // CK_SM90A_DEVICE

}  // namespace ck
