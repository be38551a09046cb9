// gemm_int8_sm90.cu - INT8 GEMM on Hopper tensor cores: wgmma fed by TMA, warp-specialized.
//
//   out[M, N] = epilogue(A[M, K] x B[N, K]^T), int8 operands, int32 accumulators
//
// Layout: A and B row-major with K contiguous (B is the [N, K] nn.Linear weight), which is the
// K-major layout int8 wgmma requires for both operands (it cannot transpose 8-bit matrices; the
// [K, N] layout runs on the mma.sync kernel of gemm_int8.cu instead).
//
// Algorithm (one persistent CTA per SM, looping over output tiles):
//   - warpgroup 0 is the producer: one thread issues TMA bulk-tensor copies of a BM x 128-byte A
//     tile and a BN x 128-byte B tile per stage into a kStages-deep ring of shared-memory
//     buffers, each guarded by a "full" mbarrier (TMA completes its transaction bytes) and an
//     "empty" mbarrier (the consumers release it). TMA zero-fills rows beyond M or N and
//     columns beyond K, so partial tiles need no masking in the main loop.
//   - warpgroups 1..kConsumers each own 64 rows of the tile: per stage, 4 wgmma m64nBNk32 (K =
//     128 bytes), their accumulators in registers; then the shared epilogue (epilogue.cuh)
//     scales, biases and stores straight from the registers, dropping rows/columns outside
//     the matrix. While they store, the producer already fills the stages of the next tile.
//   - The 128-byte swizzle (TMA writes it, the wgmma descriptors read it) spreads each 8-row
//     group of a tile over all 32 banks, so neither side has bank conflicts.
//
// Floors at M = N = K = 4096: 2 M N K = 137 G int8 ops; H100 SXM dense int8 peak ~1979 TOPS
// -> 69 us (cuBLASLt reaches 1270 TOPS, 108 us); bytes ~100 MB (int32 out) -> 33 us. Large-M
// shapes are compute-bound; the tile shapes below trade tile count against the per-tile
// shared-memory traffic of wgmma.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <mutex>

#include "kernels/core/epilogue.cuh"
#include "kernels/core/ptx.cuh"
#include "kernels/gemm/gemm_int8.cuh"

// The sm_90a pass defines __CUDA_ARCH_FEAT_SM90_ALL; every other target compiles empty bodies
// (the host never launches them: gemm_int8_sm90_available() checks the device).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CK_SM90A_DEVICE 1
#endif

namespace ck {
namespace {

constexpr int kWarpgroupThreads = 128;
constexpr int kBlockK = 128;              // bytes of K per stage: one 128-byte swizzle row
constexpr int kWgmmaK = 32;               // K of one int8 wgmma
[[maybe_unused]] constexpr int kSwizzleRows = 8;           // the 128-byte swizzle repeats every 8 rows (1024 B)
constexpr int kSmemBudget = 220 * 1024;   // of the 227 KB a block may have: stages + barriers
constexpr int kMaxStages = 8;
[[maybe_unused]] constexpr int kProducerRegisters = 40;    // setmaxnreg: the producer needs few registers ...
[[maybe_unused]] constexpr int kConsumerRegisters = 232;   // ... so the consumers can hold their accumulators

static_assert(kBlockK % kWgmmaK == 0, "a stage holds whole wgmma K steps");

// ---------------------------------------------------------------------------------------------
// PTX wrappers, one instruction each.
// ---------------------------------------------------------------------------------------------
#ifdef CK_SM90A_DEVICE
// mbarrier.init: the barrier completes a phase after `count` arrivals (plus awaited tx bytes).
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count));
}

// mbarrier.arrive.expect_tx: arrive and announce `bytes` that asynchronous copies will complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
                 "r"(bytes)
                 : "memory");
}

// mbarrier.arrive: one plain arrival.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// mbarrier.try_wait.parity in a loop: returns once the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(shared_address(bar)),
        "r"(parity)
        : "memory");
}

// fence.proxy.async: makes the barrier initialization visible to the TMA (async proxy).
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
}

// cp.async.bulk.tensor.2d: TMA copy of the box at (x = k, y = row) into shared memory,
// completing its bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];" ::"r"(shared_address(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(x), "r"(y)
        : "memory");
}

// prefetch.tensormap: pulls the tensor map (a kernel parameter) into the cache early.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// wgmma.fence: orders earlier register accesses before the next wgmma reads its accumulators.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

// wgmma.commit_group: closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// wgmma.wait_group: waits until at most `kPending` committed groups are still running.
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// bar.sync id, 128: a barrier among the 128 threads of one warpgroup (ids 1, 2, ...; 0 is
// __syncthreads).
__device__ __forceinline__ void warpgroup_barrier(int id) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(kWarpgroupThreads) : "memory");
}

// setmaxnreg: moves registers between warpgroups (dec in the producer, inc in the consumers).
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// The wgmma shared-memory matrix descriptor of a K-major tile written by TMA with the 128-byte
// swizzle: start address, leading-dimension offset (unused for this layout: 1), stride offset
// = 1024 bytes between 8-row groups, swizzle mode 1 (128 B) in bits 62-63. Addresses are in
// 16-byte units. Stepping K by 32 bytes inside the swizzle row just advances the start address:
// the hardware applies the XOR pattern to the final address, as TMA did when writing.
__device__ __forceinline__ uint64_t smem_descriptor(const void* tile) {
    constexpr uint64_t kLeading = 1;
    constexpr uint64_t kStride = (kSwizzleRows * kBlockK) >> 4;
    constexpr uint64_t kSwizzle128B = 1;
    return uint64_t((shared_address(tile) & 0x3FFFF) >> 4) | (kLeading << 16) | (kStride << 32) |
           (kSwizzle128B << 62);
}

// wgmma.mma_async m64n128k32 s32 += s8 x s8, A and B from shared memory (descriptors);
// d holds the warpgroup's 64 x 128 int32 accumulators (64 per thread). accumulate = 0
// overwrites d instead of adding to it.
__device__ __forceinline__ void wgmma_m64n128k32_s8(int32_t (&d)[64], uint64_t desc_a,
                                                 uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// wgmma.mma_async m64n256k32 s32 += s8 x s8, A and B from shared memory (descriptors);
// d holds the warpgroup's 64 x 256 int32 accumulators (128 per thread). accumulate = 0
// overwrites d instead of adding to it.
__device__ __forceinline__ void wgmma_m64n256k32_s8(int32_t (&d)[128], uint64_t desc_a,
                                                 uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
          "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
          "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
          "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
          "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
          "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
          "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
          "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
          "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}


template <int kN> struct Wgmma;
template <> struct Wgmma<128> {
    static __device__ __forceinline__ void run(int32_t (&d)[64], uint64_t a, uint64_t b, int acc) {
        wgmma_m64n128k32_s8(d, a, b, acc);
    }
};
template <> struct Wgmma<256> {
    static __device__ __forceinline__ void run(int32_t (&d)[128], uint64_t a, uint64_t b, int acc) {
        wgmma_m64n256k32_s8(d, a, b, acc);
    }
};
#endif  // CK_SM90A_DEVICE

// ---------------------------------------------------------------------------------------------
// 16-bit outputs. In the accumulator layout a quad of lanes (t = lane % 4) holds columns 2t, 2t+1
// of each 8-column block: stored as they are, a quad writes 16 bytes per row, half a 32-byte
// sector, and the other half comes from another instruction. For two neighbouring blocks (16
// columns, 32 bytes) two xor-shuffles give lane t columns 4t..4t+3 instead, so each quad stores
// one whole sector per row with 8-byte stores. Spans that reach past n, or rows that are not
// 8-byte aligned, go pair by pair.
// ---------------------------------------------------------------------------------------------
#ifdef CK_SM90A_DEVICE
template <int kBlockN, typename OutT, class Columns>
__device__ __forceinline__ void store_16bit_tile(const Epilogue<OutT>& ep, const int32_t* acc,
                                                 int64_t row, int64_t n0, int t, float row_scale0,
                                                 float row_scale1, Columns&& columns) {
    const bool rows_aligned = ep.n % 4 == 0 && reinterpret_cast<uintptr_t>(ep.out) % 8 == 0;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; j += 2) {
        const int64_t span = n0 + 8 * j;  // 16 columns: blocks j and j + 1
        const auto cols0 = columns(span + 2 * t), cols1 = columns(span + 8 + 2 * t);
        if (rows_aligned && span + 16 <= ep.n) {  // uniform across the warp
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float rs = h ? row_scale1 : row_scale0;
                const int i0 = 4 * j + 2 * h, i1 = 4 * (j + 1) + 2 * h;
                // x0 = columns 2t, 2t+1 of the span; x1 = columns 8 + 2t, 9 + 2t.
                uint32_t x0 = Epilogue<OutT>::pack_two(ep.convert(acc[i0], rs, cols0.scale0, cols0.bias0),
                                                       ep.convert(acc[i0 + 1], rs, cols0.scale1, cols0.bias1));
                uint32_t x1 = Epilogue<OutT>::pack_two(ep.convert(acc[i1], rs, cols1.scale0, cols1.bias0),
                                                       ep.convert(acc[i1 + 1], rs, cols1.scale1, cols1.bias1));
                // Lanes t and t^2 swap halves, then t and t^1: lane t ends with 4t..4t+3.
                uint32_t send = (t & 2) ? x0 : x1;
                uint32_t got = __shfl_xor_sync(0xffffffffu, send, 2);
                if (t & 2) x0 = got; else x1 = got;
                send = (t & 1) ? x0 : x1;
                got = __shfl_xor_sync(0xffffffffu, send, 1);
                if (t & 1) x0 = got; else x1 = got;
                const int64_t r = row + 8 * h;
                if (r < ep.m)
                    *reinterpret_cast<uint2*>(ep.out + r * ep.n + span + 4 * t) = make_uint2(x0, x1);
            }
        } else {
            ep.store_pair(row, span + 2 * t, acc[4 * j], acc[4 * j + 1], row_scale0, cols0);
            ep.store_pair(row + 8, span + 2 * t, acc[4 * j + 2], acc[4 * j + 3], row_scale1, cols0);
            ep.store_pair(row, span + 8 + 2 * t, acc[4 * j + 4], acc[4 * j + 5], row_scale0, cols1);
            ep.store_pair(row + 8, span + 8 + 2 * t, acc[4 * j + 6], acc[4 * j + 7], row_scale1, cols1);
        }
    }
}
#endif

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------
template <int kConsumers, int kBlockN> struct Sm90Config {
    static constexpr int kBlockM = 64 * kConsumers;
    static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
    static constexpr int kBytesA = kBlockM * kBlockK;
    static constexpr int kBytesB = kBlockN * kBlockK;
    static constexpr int kStageBytes = kBytesA + kBytesB;
    static constexpr int kStages = std::min(kMaxStages, (kSmemBudget - 1024) / kStageBytes);
    // Per consumer, two tiles' column parameters (scale_b and bias of kBlockN columns), so that
    // one tile's can be written while the other's are read.
    static constexpr int kColumnTableBytes = kConsumers * 2 * 2 * kBlockN * int(sizeof(float));
    // + 1024: the tiles must start 1024-byte aligned (the swizzle pattern's period); barriers
    // and the column tables go after the tiles.
    static constexpr int kSmemBytes =
        1024 + kStages * kStageBytes + 2 * kStages * 8 + kColumnTableBytes;
    static_assert(kStages >= 3, "a pipeline needs at least three stages");
    static_assert(kBytesA % 1024 == 0 && kBytesB % 1024 == 0, "tiles stay 1024-byte aligned");
};

struct TileGrid {
    int tiles_m, tiles_n;
    int k_blocks;
};

template <typename OutT, int kConsumers, int kBlockN>
__global__ void __launch_bounds__(Sm90Config<kConsumers, kBlockN>::kThreads, 1)
    gemm_int8_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                           const __grid_constant__ CUtensorMap map_b, TileGrid grid,
                           Epilogue<OutT> epilogue) {
#ifdef CK_SM90A_DEVICE
    using Config = Sm90Config<kConsumers, kBlockN>;
    constexpr int kStages = Config::kStages;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    // Dynamic shared memory is only guaranteed 16-byte aligned: round up to the swizzle period.
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                               ~uintptr_t(1023));
    uint8_t* tiles_a = smem;                              // [kStages][kBlockM][128]
    uint8_t* tiles_b = smem + kStages * Config::kBytesA;  // [kStages][kBlockN][128]
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * Config::kStageBytes);
    uint64_t* empty = full + kStages;
    float* column_tables = reinterpret_cast<float*>(empty + kStages);

    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int lane_in_group = threadIdx.x % kWarpgroupThreads;
    if (threadIdx.x == 0) {
        prefetch_tensor_map(&map_a);
        prefetch_tensor_map(&map_b);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], 1);                    // the producer's expect_tx arrival
            mbar_init(&empty[s], kConsumers * 4);      // one arrival per consumer warp
        }
        fence_barrier_init();
    }
    __syncthreads();

    const int tiles = grid.tiles_m * grid.tiles_n;
    if (warpgroup == 0) {
        // Producer. One thread issues every copy; the others only give their registers away.
        setmaxnreg_dec<kProducerRegisters>();
        if (lane_in_group == 0) {
            int stage = 0;
            uint32_t round = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % grid.tiles_m) * Config::kBlockM;
                const int n0 = (tile / grid.tiles_m) * kBlockN;
                for (int kb = 0; kb < grid.k_blocks; ++kb) {
                    mbar_wait(&empty[stage], (round & 1) ^ 1);  // the first round finds it free
                    mbar_arrive_expect_tx(&full[stage], Config::kStageBytes);
                    tma_load_2d(tiles_a + stage * Config::kBytesA, &map_a, &full[stage],
                                kb * kBlockK, m0);
                    tma_load_2d(tiles_b + stage * Config::kBytesB, &map_b, &full[stage],
                                kb * kBlockK, n0);
                    if (++stage == kStages) {
                        stage = 0;
                        ++round;
                    }
                }
            }
        }
    } else {
        // Consumers: warpgroup c owns rows [64 (c - 1), 64 c) of every tile.
        setmaxnreg_inc<kConsumerRegisters>();
        const int consumer = warpgroup - 1;
        const int warp = lane_in_group / 32;
        const int lane = lane_in_group % 32;
        int32_t acc[kBlockN / 2];  // 64 x kBlockN int32 over the 128 threads
        // The epilogue's scales and bias are loaded when a tile starts, into registers, so that
        // their latency hides behind the main loop; at its end they go through shared memory to
        // the threads that store each column.
        constexpr bool kScaled = !std::is_same_v<OutT, int32_t>;
        constexpr int kColumnsPerThread = kBlockN / kWarpgroupThreads;
        float next_scale[kColumnsPerThread], next_bias[kColumnsPerThread];
        int stage = 0;
        uint32_t round = 0;
        int parity = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, parity ^= 1) {
            const int m0 = (tile % grid.tiles_m) * Config::kBlockM;
            const int n0 = (tile / grid.tiles_m) * kBlockN;
            // Accumulator i of the n8 block j sits at row (warp * 16 + lane / 4), +8 for the
            // second pair, column 8 j + 2 (lane % 4): the mma C-fragment layout.
            const int64_t row = int64_t(m0) + consumer * 64 + warp * 16 + lane / 4;
            const int64_t col = int64_t(n0) + 2 * (lane % 4);
            float row_scale0 = 0.f, row_scale1 = 0.f;
            if constexpr (kScaled) {
                row_scale0 = epilogue.rows(row);
                row_scale1 = epilogue.rows(row + 8);
#pragma unroll
                for (int i = 0; i < kColumnsPerThread; ++i) {
                    const int64_t c = int64_t(n0) + lane_in_group + i * kWarpgroupThreads;
                    next_scale[i] = c < epilogue.n ? epilogue.col_scale(c) : 0.f;
                    next_bias[i] = c < epilogue.n && epilogue.bias ? to_float(__ldg(epilogue.bias + c)) : 0.f;
                }
            }

            int prev_stage = -1;
            for (int kb = 0; kb < grid.k_blocks; ++kb) {
                mbar_wait(&full[stage], round & 1);
                const uint8_t* a = tiles_a + stage * Config::kBytesA + consumer * 64 * kBlockK;
                const uint8_t* b = tiles_b + stage * Config::kBytesB;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < kBlockK / kWgmmaK; ++ks)
                    Wgmma<kBlockN>::run(acc, smem_descriptor(a + ks * kWgmmaK),
                                        smem_descriptor(b + ks * kWgmmaK), kb > 0 || ks > 0);
                wgmma_commit();
                // Keep one stage's wgmmas in flight; the previous stage's are done now, so its
                // buffers can be refilled.
                wgmma_wait<1>();
                if (prev_stage >= 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
                prev_stage = stage;
                if (++stage == kStages) {
                    stage = 0;
                    ++round;
                }
            }
            wgmma_wait<0>();
            if (lane == 0) mbar_arrive(&empty[prev_stage]);

            // Epilogue. Each thread's two rows share every column: the column parameters are
            // looked up once per pair of columns.
            float* table = column_tables + (consumer * 2 + parity) * 2 * kBlockN;
            if constexpr (kScaled) {
#pragma unroll
                for (int i = 0; i < kColumnsPerThread; ++i) {
                    table[lane_in_group + i * kWarpgroupThreads] = next_scale[i];
                    table[kBlockN + lane_in_group + i * kWarpgroupThreads] = next_bias[i];
                }
                // The table of the other parity is still being read by slower threads of this
                // warpgroup; this one was last read two tiles ago, before the last barrier.
                warpgroup_barrier(1 + consumer);
            }
            auto columns = [&](int64_t c) {
                const int local = int(c - n0);
                return typename Epilogue<OutT>::Columns{table[local], table[local + 1],
                                                        table[kBlockN + local],
                                                        table[kBlockN + local + 1]};
            };
            if constexpr (sizeof(OutT) == 2) {
                store_16bit_tile<kBlockN>(epilogue, acc, row, int64_t(n0), lane % 4, row_scale0,
                                          row_scale1, columns);
            } else {
#pragma unroll
                for (int j = 0; j < kBlockN / 8; ++j) {
                    typename Epilogue<OutT>::Columns cols{};
                    if constexpr (kScaled) cols = columns(col + 8 * j);
                    epilogue.store_pair(row, col + 8 * j, acc[4 * j], acc[4 * j + 1], row_scale0, cols);
                    epilogue.store_pair(row + 8, col + 8 * j, acc[4 * j + 2], acc[4 * j + 3],
                                        row_scale1, cols);
                }
            }
        }
    }
#endif  // CK_SM90A_DEVICE
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            p = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// A 2-D TMA map over a row-major int8 [rows, k] matrix, boxes of box_rows x 128 bytes, 128-byte
// swizzle, zero fill out of bounds.
cudaError_t make_tensor_map(CUtensorMap* map, const int8_t* base, int64_t rows, int64_t k,
                            int box_rows) {
    const auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(k)};  // bytes between rows
    const cuuint32_t box[2] = {cuuint32_t(kBlockK), cuuint32_t(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<int8_t*>(base), dims,
                              strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename OutT, int kConsumers, int kBlockN>
cudaError_t launch_sm90(const IntGemmArgs& args, cudaStream_t stream) {
    using Config = Sm90Config<kConsumers, kBlockN>;
    CUtensorMap map_a, map_b;
    cudaError_t err = make_tensor_map(&map_a, args.a_as<int8_t>(), args.m, args.k, Config::kBlockM);
    if (err != cudaSuccess) return err;
    err = make_tensor_map(&map_b, args.b_as<int8_t>(), args.n, args.k, kBlockN);
    if (err != cudaSuccess) return err;

    const Epilogue<OutT> ep = make_epilogue<OutT>(args);

    TileGrid grid{int(ceil_div(args.m, Config::kBlockM)), int(ceil_div(args.n, kBlockN)),
                  int(ceil_div(args.k, kBlockK))};
    const int64_t tiles = int64_t(grid.tiles_m) * grid.tiles_n;
    const int blocks = int(std::min<int64_t>(tiles, std::max(sm_count(), 1)));
    auto kernel = gemm_int8_wgmma_kernel<OutT, kConsumers, kBlockN>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSmemBytes);
    if (err != cudaSuccess) return err;
    kernel<<<blocks, Config::kThreads, Config::kSmemBytes, stream>>>(map_a, map_b, grid, ep);
    return cudaGetLastError();
}

// The tile shape: the one with the least estimated time, counting whole waves of persistent
// CTAs and a per-tile cost that favours the larger tiles (less shared-memory traffic per MAC).
template <typename OutT> cudaError_t dispatch_tiles(const IntGemmArgs& args, cudaStream_t stream) {
    struct Choice {
        int consumers, block_n;
        double efficiency;  // relative throughput of one tile shape's main loop
    };
    constexpr Choice kChoices[] = {{2, 256, 1.0}, {2, 128, 0.9}, {1, 256, 0.85}, {1, 128, 0.75}};
    const int sms = std::max(sm_count(), 1);
    int best = 0;
    double best_cost = 0;
    for (int i = 0; i < int(sizeof kChoices / sizeof kChoices[0]); ++i) {
        const int64_t bm = 64 * kChoices[i].consumers, bn = kChoices[i].block_n;
        const int64_t tiles = ceil_div(args.m, bm) * ceil_div(args.n, bn);
        const double cost = double(ceil_div(tiles, sms)) * double(bm * bn) / kChoices[i].efficiency;
        if (i == 0 || cost < best_cost) {
            best = i;
            best_cost = cost;
        }
    }
    switch (best) {
        case 0: return launch_sm90<OutT, 2, 256>(args, stream);
        case 1: return launch_sm90<OutT, 2, 128>(args, stream);
        case 2: return launch_sm90<OutT, 1, 256>(args, stream);
        default: return launch_sm90<OutT, 1, 128>(args, stream);
    }
}

}  // namespace

bool gemm_int8_sm90_available() {
#ifdef CK_BUILD_SM90A
    return compute_capability() == 90 && tensor_map_encoder() != nullptr;
#else
    return false;
#endif
}

cudaError_t gemm_int8_sm90(const IntGemmArgs& args, cudaStream_t stream) {
    if (args.b_layout != CK_LAYOUT_NK || !gemm_int8_sm90_available()) return cudaErrorNotSupported;
    switch (args.out_dtype) {
        case CK_DTYPE_INT32: return dispatch_tiles<int32_t>(args, stream);
        case CK_DTYPE_FP32: return dispatch_tiles<float>(args, stream);
        case CK_DTYPE_FP16: return dispatch_tiles<__half>(args, stream);
        case CK_DTYPE_BF16: return dispatch_tiles<__nv_bfloat16>(args, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace ck
