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
// -> 69 us; bytes ~100 MB (int32 out) -> 33 us. Large-M shapes are compute-bound; the tile
// shapes below trade tile count against the per-tile shared-memory traffic of wgmma.
//
// INT4 x INT4 (ck_gemm_int4, ck_gemm_int4_scaled) runs the same kernel (kInt4) on packed
// operands, two codes a byte (element 2i in the low nibble): TMA copies each tile's 64 bytes of K
// per row (128 codes) into a staging ring, unswizzled, and they are unpacked into the int8 stage
// that the wgmmas read, 128-byte swizzled as TMA would have written it: A's rows by warps 1-3 of
// the producer warpgroup, B's by the consumers, each its share of the next k-block while its
// wgmmas of this one run. A code c becomes the int8 16 c (its nibble moved to the byte's high
// half: two logic operations and two byte permutes per 8 codes), so the int32 sums are 256 times
// the product's, exactly, while 256 * 64 * K < 2^31 (K <= kInt4SM90MaxK); the epilogue shifts
// them back first.
//
// FP8 E4M3 x E4M3 (ck_gemm_fp8_scaled) runs it too, on float32 accumulators: the tiles, TMA
// and pipeline of INT8 (FP8 is K-major only too, 32 bytes of K per wgmma). The tensor cores sum
// FP8 products with fewer bits than float32 (and each wgmma adds its 32 products into d so),
// so every k-block's 4 wgmmas start from zero in a second accumulator set, which is then added
// into the float32 sums (the promotion DeepSeek-V3 and CUTLASS use): on the H100 the results
// have the errors of cuBLASLt's default FP8 GEMM (without fast accumulation) on the same data,
// up to 2^-10 of sum |a b| on same-signed operands, where sums kept on the tensor cores over
// all of K are off by up to 2^-3 (benchmarks/NOTES.md). The two sets need 128-wide tiles (64 +
// 64 registers a thread); each k-block's sums are waited for before the next starts, while the
// other consumer warpgroup's wgmmas keep the tensor cores busy (two alternating sets, one
// k-block's wgmmas running while the previous one's sums were added, measured 10-25% slower).
// With block scales (Operand::kFp8BlockScaled: its own instance, so that the plain FP8 loop
// keeps its code) the k-block's sums are scaled as they are added (fma), the scales of the
// thread's two rows and the tile's 128 columns loaded one k-block ahead.
//
// What bounds INT4 (H100, ncu; benchmarks/NOTES.md): the unpacking. Per 48 KB int8 stage it moves
// 72 KB through shared memory (TMA's 24 KB in, 24 KB read and 48 KB written) beside the wgmmas'
// 80 KB, and its loads wait long beside the wgmmas' operand reads: each thread loads all its
// units of a tile before unpacking any (one unit per step left the loop waiting on every load;
// 4096^3: 194 -> 166 us), and the consumers' share took B off the three warps (8192x28672,
// M = 4096: 2040 -> 1713 us). It runs at 0.54-0.90x cuBLASLt int8 at M >= 256, against
// 0.36-0.61x for the mma.sync kernel. wgmma's register A for the 128-row operand (its codes
// unpacked by the consumers, only B's through shared memory) measured 2-5% faster at M = 4096
// and up to 13% slower at M <= 256 with one register set (benchmarks/NOTES.md): not taken.
//
// The Hopper primitives (mbarrier, TMA, wgmma, setmaxnreg) are in kernels/core/ptx_sm90.cuh, the
// tensor maps in kernels/core/tma.cuh.
#include "kernels/core/epilogue.cuh"
#include "kernels/core/ptx_sm90.cuh"
#include "kernels/core/tma.cuh"
#include "kernels/gemm/gemm_int4.cuh"
#include "kernels/gemm/gemm_int8.cuh"

// Kernel bodies are compiled in the sm_90a pass only (CK_SM90A_DEVICE, ptx_sm90.cuh); every
// other target gets empty ones, which the host never launches: gemm_int8_sm90_available()
// checks the device.

namespace ck {
namespace {

constexpr int kWarpgroupThreads = 128;
constexpr int kBlockK = 128;              // bytes of K per stage: one 128-byte swizzle row
constexpr int kWgmmaK = 32;               // K of one int8 wgmma
constexpr int kSmemBudget = 220 * 1024;   // of the 227 KB a block may have: stages + barriers
constexpr int kMaxStages = 8;
// setmaxnreg: the producer needs few registers, so the consumers can hold their accumulators;
// INT4's unpacking warps hold a tile's loads (at 40 registers one unit at a time spilled), which
// 216 per consumer leaves them (the 128 accumulators of a 256-wide tile and the consumers' own
// unpacking still fit).
template <bool kInt4> constexpr int kProducerRegisters = kInt4 ? 72 : 40;
template <bool kInt4> constexpr int kConsumerRegisters = kInt4 ? 216 : 232;

// INT4: packed bytes of K per row and stage, the int8 stages (three: 2-5% faster than two), the
// producer's warps that unpack A. The staging ring takes the rest of the budget (3 to 8 stages)
// and hides TMA's latency.
constexpr int kPackedK = kBlockK / 2;
constexpr int kInt4Stages = 3;
constexpr int kUnpackWarps = 3;  // warps 1-3 of the producer warpgroup
[[maybe_unused]] constexpr uint32_t kUnpackThreads = 32 * kUnpackWarps;
[[maybe_unused]] constexpr uint32_t kPackedUnitBytes = 16;  // one step: 32 codes -> 32 int8

static_assert(kBlockK % kWgmmaK == 0, "a stage holds whole wgmma K steps");
static_assert(kBlockK == 128, "tiles are 128-byte swizzled K-major rows: TMA's SWIZZLE_128B box "
                              "and wgmma_descriptor()'s default layout");

// ---------------------------------------------------------------------------------------------
// The wgmma (ptx_sm90.cuh) of one 32-byte K step for a tile kBlockN wide.
// ---------------------------------------------------------------------------------------------
// The operands: int8 (INT8 and, unpacked, INT4) with exact int32 sums, or FP8 E4M3 with float32
// sums. FP8 tiles are 128 wide: its k-block sums take a second set of accumulators (below).
enum class Operand { kInt8, kInt4, kFp8, kFp8BlockScaled };
template <Operand kOp>
constexpr bool kIsFp8 = kOp == Operand::kFp8 || kOp == Operand::kFp8BlockScaled;
template <Operand kOp> using Accumulator = std::conditional_t<kIsFp8<kOp>, float, int32_t>;

#ifdef CK_SM90A_DEVICE
template <int kN, Operand kOp> struct Wgmma {
    static __device__ __forceinline__ void run(int32_t (&d)[kN / 2], uint64_t a, uint64_t b,
                                               int acc) {
        static_assert(kN == 128 || kN == 256, "tiles 128 or 256 wide");
        if constexpr (kN == 128) wgmma_m64n128k32_s8(d, a, b, acc);
        else wgmma_m64n256k32_s8(d, a, b, acc);
    }
};
template <> struct Wgmma<128, Operand::kFp8> {
    static __device__ __forceinline__ void run(float (&d)[64], uint64_t a, uint64_t b, int acc) {
        wgmma_m64n128k32_e4m3(d, a, b, acc);
    }
};
template <> struct Wgmma<128, Operand::kFp8BlockScaled> : Wgmma<128, Operand::kFp8> {};
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
template <int kBlockN, typename OutT, typename Acc, class Columns>
__device__ __forceinline__ void store_16bit_tile(const Epilogue<OutT>& ep, const Acc* acc,
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
template <int kConsumers, int kBlockN, bool kInt4 = false> struct Sm90Config {
    static constexpr int kBlockM = 64 * kConsumers;
    static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
    static constexpr int kBytesA = kBlockM * kBlockK;
    static constexpr int kBytesB = kBlockN * kBlockK;
    static constexpr int kStageBytes = kBytesA + kBytesB;
    // INT4's staging ring: per stage the packed A tile [kBlockM][64], then B's [kBlockN][64].
    static constexpr int kPackedA = kBlockM * kPackedK;
    static constexpr int kPackedStage = (kBlockM + kBlockN) * kPackedK;
    static constexpr int kStages =
        kInt4 ? kInt4Stages : std::min(kMaxStages, (kSmemBudget - 1024) / kStageBytes);
    static constexpr int kStagingStages =
        kInt4 ? std::min(kMaxStages, (kSmemBudget - 1024 - kStages * kStageBytes) / kPackedStage)
              : 0;
    static constexpr int kStagingBytes = kStagingStages * kPackedStage;
    static constexpr int kStagingBarriers = 2 * kStagingStages;
    // Per consumer, two tiles' column parameters (scale_b and bias of kBlockN columns), so that
    // one tile's can be written while the other's are read.
    static constexpr int kColumnTableBytes = kConsumers * 2 * 2 * kBlockN * int(sizeof(float));
    // + 1024: the tiles must start 1024-byte aligned (the swizzle pattern's period); barriers
    // and the column tables go after the tiles.
    static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kStagingBytes +
                                      (2 * kStages + kStagingBarriers) * 8 + kColumnTableBytes;
    static_assert(kStages >= 3, "a pipeline needs at least three stages");
    static_assert(!kInt4 || kStagingStages >= 3, "the staging ring hides TMA's latency");
    static_assert(kBytesA % 1024 == 0 && kBytesB % 1024 == 0, "tiles stay 1024-byte aligned");
    static_assert(kPackedA % 128 == 0 && kPackedStage % 128 == 0, "TMA writes 128-byte aligned");
};

// Eight INT4 codes (a packed word, code 2i in the low nibble of byte i) as eight int8 bytes 16
// code, in order: codes 0-3 in lo, 4-7 in hi. A code's nibble in the high half of a byte is the
// byte 16 code in two's complement, so no sign extension is needed.
[[maybe_unused]] __device__ __forceinline__ void unpack_int4_word_x16(uint32_t w, uint32_t& lo,
                                                                      uint32_t& hi) {
    const uint32_t even = (w << 4) & 0xf0f0f0f0u;  // codes 0, 2, 4, 6
    const uint32_t odd = w & 0xf0f0f0f0u;          // codes 1, 3, 5, 7
    lo = __byte_perm(even, odd, 0x5140);
    hi = __byte_perm(even, odd, 0x7362);
}

// Unpacks kRows staged packed rows (64 bytes each, at src) into int8 rows of an int8 stage (128
// bytes each, at dst, 128-byte swizzled as TMA writes them), thread u of kTeam taking the 16-byte
// units u, u + kTeam, ... (unit i: bytes 16 (i % 4) of packed row i / 4). Unit i's 32 codes
// become chunks 2 c and 2 c + 1 (c = i % 4) of its int8 row, which the swizzle puts at
// chunk ^ (row % 8); a thread's rows advance by kTeam / 4, a multiple of 8, so both offsets are
// its constants. Every load first, then the unpacking: shared-memory loads wait long beside the
// wgmmas' operand reads (ncu: their latency, not the arithmetic, bounded a loop of one unit per
// step).
template <uint32_t kTeam, uint32_t kRows>
[[maybe_unused]] __device__ __forceinline__ void unpack_rows(const uint8_t* src, uint8_t* dst,
                                                             uint32_t u) {
    constexpr uint32_t kRowStep = kTeam / 4;
    constexpr uint32_t kSteps = (kRows + kRowStep - 1) / kRowStep;
    static_assert(kTeam % 32 == 0 && kRowStep % 8 == 0, "a thread's rows keep their swizzle phase");
    const uint32_t row0 = u / 4, chunk = u % 4;
    const uint32_t lo_at = ((2 * chunk) ^ (row0 % 8)) * 16;
    const uint32_t hi_at = ((2 * chunk + 1) ^ (row0 % 8)) * 16;
    src += u * kPackedUnitBytes;
    dst += row0 * kBlockK;
    uint4 v[kSteps];
#pragma unroll
    for (uint32_t i = 0; i < kSteps; ++i)
        if (kRows % kRowStep == 0 || row0 + i * kRowStep < kRows)
            v[i] = *reinterpret_cast<const uint4*>(src + i * kTeam * kPackedUnitBytes);
#pragma unroll
    for (uint32_t i = 0; i < kSteps; ++i) {
        if (kRows % kRowStep != 0 && row0 + i * kRowStep >= kRows) break;
        uint4 lo, hi;
        unpack_int4_word_x16(v[i].x, lo.x, lo.y);
        unpack_int4_word_x16(v[i].y, lo.z, lo.w);
        unpack_int4_word_x16(v[i].z, hi.x, hi.y);
        unpack_int4_word_x16(v[i].w, hi.z, hi.w);
        uint8_t* row = dst + i * kRowStep * kBlockK;
        *reinterpret_cast<uint4*>(row + lo_at) = lo;
        *reinterpret_cast<uint4*>(row + hi_at) = hi;
    }
}

// An FP8 block-scaled k-block's scales for a consumer thread's two accumulator rows (row and
// row + 8) and its tile's 128 columns: scale(true) = a[row] b, scale(false) = a[row + 8] b.
// Rows past m get 0; k-blocks past the last load nothing. Empty without block scales.
#ifdef CK_SM90A_DEVICE
template <bool kBlockScaled> struct BlockScaleRows {};
template <> struct BlockScaleRows<true> {
    float a0 = 0.f, a1 = 0.f, b = 0.f;
    __device__ __forceinline__ void load(const BlockScales& s, int64_t row, int64_t m, int n0,
                                         int kb, int k_blocks) {
        if (kb >= k_blocks) return;
        a0 = row < m ? s.a_at(row, kb) : 0.f;
        a1 = row + 8 < m ? s.a_at(row + 8, kb) : 0.f;
        b = s.b_at(n0, kb);
    }
    __device__ __forceinline__ float scale(bool first) const {
        return __fmul_rn(first ? a0 : a1, b);
    }
};
#endif  // CK_SM90A_DEVICE

struct TileGrid {
    int tiles_m, tiles_n;
    int k_blocks;
};

template <typename OutT, int kConsumers, int kBlockN, Operand kOp>
__global__ void
__launch_bounds__(Sm90Config<kConsumers, kBlockN, kOp == Operand::kInt4>::kThreads, 1)
    gemm_int8_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                           const __grid_constant__ CUtensorMap map_b, TileGrid grid,
                           BlockScales scales, Epilogue<OutT> epilogue) {
#ifdef CK_SM90A_DEVICE
    constexpr bool kInt4 = kOp == Operand::kInt4, kFp8 = kIsFp8<kOp>;
    constexpr bool kBlockScaled = kOp == Operand::kFp8BlockScaled;
    static_assert(!kFp8 || kBlockN == 128, "FP8 holds two accumulator sets: 128-wide tiles");
    static_assert(kFp8 || !kBlockScaled, "block scales are FP8's");
    using Acc = Accumulator<kOp>;
    using Config = Sm90Config<kConsumers, kBlockN, kInt4>;
    constexpr int kStages = Config::kStages;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    // Dynamic shared memory is only guaranteed 16-byte aligned: round up to the swizzle period,
    // as an offset into smem_raw, so that the compiler still knows every pointer below is shared
    // (the unpacking warps' ld.shared / st.shared rather than generic accesses).
    uint8_t* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    uint8_t* tiles_a = smem;                              // [kStages][kBlockM][128]
    uint8_t* tiles_b = smem + kStages * Config::kBytesA;  // [kStages][kBlockN][128]
    uint8_t* staging = smem + kStages * Config::kStageBytes;  // INT4: [staging stages][packed]
    uint64_t* full = reinterpret_cast<uint64_t*>(staging + Config::kStagingBytes);
    uint64_t* empty = full + kStages;
    uint64_t* staged = empty + kStages;                   // INT4: a staging stage has landed ...
    uint64_t* unstaged = staged + Config::kStagingStages;  // ... and is unpacked
    float* column_tables = reinterpret_cast<float*>(full + 2 * kStages + Config::kStagingBarriers);
    // Launched as a programmatic dependent of the stream's previous kernel (launch_dependent):
    // the block may be resident before that kernel ends, and waits for it here, before any
    // global access. The next kernel may launch at once: it waits for this grid's end in turn.
    wait_for_prior_grid();
    allow_dependent_launch();

    // INT4: the warps that unpack (and arrive on full and unstaged) per stage.
    [[maybe_unused]] constexpr int kUnpackers = kUnpackWarps + 4 * kConsumers;
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int lane_in_group = threadIdx.x % kWarpgroupThreads;
    if (threadIdx.x == 0) {
        prefetch_tensor_map(&map_a);
        prefetch_tensor_map(&map_b);
        for (int s = 0; s < kStages; ++s) {
            // The producer's expect_tx arrival (INT8), or one per warp that unpacks (INT4).
            mbar_init(&full[s], kInt4 ? kUnpackers : 1);
            mbar_init(&empty[s], kConsumers * 4);      // one arrival per consumer warp
        }
        if constexpr (kInt4) {
            for (int s = 0; s < Config::kStagingStages; ++s) {
                mbar_init(&staged[s], 1);              // the TMA thread's expect_tx arrival
                mbar_init(&unstaged[s], kUnpackers);
            }
        }
        fence_mbarrier_init();       // the inits are visible to the other threads ...
        fence_proxy_async_shared();  // ... and to the TMA that completes on the barriers
    }
    __syncthreads();

    const int tiles = grid.tiles_m * grid.tiles_n;
    // INT4: the unpacking is shared. Warps 1-3 of the producer warpgroup unpack each stage's A
    // tile, the consumers its B tile: a consumer unpacks its share of the next k-block while its
    // wgmmas of this one run (stage j of the CTA's sequence: the block's j / k_blocks-th tile,
    // k-block j % k_blocks).
    [[maybe_unused]] const int sequence =
        blockIdx.x < tiles ? ((tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1) * grid.k_blocks
                           : 0;
    // One team's share of k-block j: kRows staged rows at `offset` of its staging slot, unpacked
    // (thread u of kTeam) into the int8 stage's tile at `tiles_x` (`tile_bytes` per stage), once
    // TMA has staged them and every consumer is done with the k-block that stage held; then the
    // warp's arrivals on full and unstaged.
    [[maybe_unused]] auto unpack_share = [&](int j, auto team, auto rows, int offset,
                                             uint8_t* tiles_x, int tile_bytes, uint32_t u) {
        constexpr int kSlots = kInt4 ? Config::kStagingStages : 1;  // (INT8: never called)
        const int at = j % kStages, slot = j % kSlots;
        mbar_wait(&staged[slot], uint32_t(j / kSlots) & 1);
        mbar_wait(&empty[at], (uint32_t(j / kStages) & 1) ^ 1);  // the first round finds it free
        unpack_rows<decltype(team)::value, decltype(rows)::value>(
            staging + slot * Config::kPackedStage + offset, tiles_x + at * tile_bytes, u);
        fence_proxy_async_shared();  // the int8 stage is for the wgmmas (the async proxy) to read
        __syncwarp();
        if (threadIdx.x % 32 == 0) {
            mbar_arrive(&full[at]);
            mbar_arrive(&unstaged[slot]);
        }
    };
    if (warpgroup == 0) {
        // Producer. One thread issues every copy; the others only give their registers away
        // (INT8), or warps 1-3 unpack the staged A tiles (INT4).
        setmaxnreg_dec<kProducerRegisters<kInt4>>();
        // The copying thread's loop over the CTA's k-blocks: into ring slot `slot` of `ring`
        // once its free barrier says so, `bytes` expected on its filled barrier, A's box to
        // dst_a(slot) and B's to dst_b(slot) at byte k_bytes * kb of their rows.
        auto copy_ring = [&](uint64_t* free, uint64_t* filled, int ring, int bytes, int k_bytes,
                             auto dst_a, auto dst_b) {
            int slot = 0;
            uint32_t round = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % grid.tiles_m) * Config::kBlockM;
                const int n0 = (tile / grid.tiles_m) * kBlockN;
                for (int kb = 0; kb < grid.k_blocks; ++kb) {
                    mbar_wait(&free[slot], (round & 1) ^ 1);  // the first round finds it free
                    mbar_arrive_expect_tx(&filled[slot], bytes);
                    tma_load_2d(dst_a(slot), &map_a, &filled[slot], kb * k_bytes, m0);
                    tma_load_2d(dst_b(slot), &map_b, &filled[slot], kb * k_bytes, n0);
                    if (++slot == ring) {
                        slot = 0;
                        ++round;
                    }
                }
            }
        };
        if constexpr (kInt4) {
            if (lane_in_group == 0) {
                auto packed = [&](int s) { return staging + s * Config::kPackedStage; };
                copy_ring(unstaged, staged, Config::kStagingStages, Config::kPackedStage, kPackedK,
                          packed, [&](int s) { return packed(s) + Config::kPackedA; });
            } else if (lane_in_group >= 32) {
                // Unpack the A tiles: thread u (0 .. 95) of warps 1-3.
                for (int j = 0; j < sequence; ++j)
                    unpack_share(j, std::integral_constant<uint32_t, kUnpackThreads>{},
                                 std::integral_constant<uint32_t, Config::kBlockM>{}, 0, tiles_a,
                                 Config::kBytesA, lane_in_group - 32);
            }
        } else if (lane_in_group == 0) {
            copy_ring(empty, full, kStages, Config::kStageBytes, kBlockK,
                      [&](int s) { return tiles_a + s * Config::kBytesA; },
                      [&](int s) { return tiles_b + s * Config::kBytesB; });
        }
    } else {
        // Consumers: warpgroup c owns rows [64 (c - 1), 64 c) of every tile.
        setmaxnreg_inc<kConsumerRegisters<kInt4>>();
        const int consumer = warpgroup - 1;
        const int warp = lane_in_group / 32;
        const int lane = lane_in_group % 32;
        Acc acc[kBlockN / 2];  // 64 x kBlockN sums over the 128 threads
        // FP8: each k-block's sums (4 wgmmas, 128 k) are taken in `block` and added to acc in
        // float32: the tensor cores' own sums keep fewer bits, and a long K would lose them.
        [[maybe_unused]] float block[kFp8 ? kBlockN / 2 : 1];
        // The epilogue's scales and bias are loaded when a tile starts, into registers, so that
        // their latency hides behind the main loop; at its end they go through shared memory to
        // the threads that store each column.
        constexpr bool kScaled = !std::is_same_v<OutT, int32_t>;
        constexpr int kColumnsPerThread = kBlockN / kWarpgroupThreads;
        float next_scale[kColumnsPerThread], next_bias[kColumnsPerThread];
        int stage = 0;
        uint32_t round = 0;
        int parity = 0;
        // INT4: this consumer's share of k-block j's B tile (see `sequence`).
        [[maybe_unused]] auto unpack_b = [&](int j) {
            unpack_share(j, std::integral_constant<uint32_t, kConsumers * kWarpgroupThreads>{},
                         std::integral_constant<uint32_t, kBlockN>{}, Config::kPackedA, tiles_b,
                         Config::kBytesB, consumer * kWarpgroupThreads + lane_in_group);
        };
        [[maybe_unused]] int unpacked = 0;  // k-blocks whose B share this thread has unpacked
        if constexpr (kInt4) {
            if (sequence > 0) unpack_b(unpacked++);
        }
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
            // FP8 block scales of the thread's two rows and the tile's columns, loaded one
            // k-block ahead (their latency hides behind a k-block's wgmmas). (Other instances
            // hold none of this: the plain FP8 loop keeps its own code.)
            [[maybe_unused]] BlockScaleRows<kBlockScaled> next{};
            if constexpr (kFp8) {
#pragma unroll
                for (int i = 0; i < kBlockN / 2; ++i) acc[i] = 0.f;
            }
            if constexpr (kBlockScaled) next.load(scales, row, epilogue.m, n0, 0, grid.k_blocks);
            for (int kb = 0; kb < grid.k_blocks; ++kb) {
                mbar_wait(&full[stage], round & 1);
                const uint8_t* a = tiles_a + stage * Config::kBytesA + consumer * 64 * kBlockK;
                const uint8_t* b = tiles_b + stage * Config::kBytesB;
                [[maybe_unused]] BlockScaleRows<kBlockScaled> cur{};
                if constexpr (kBlockScaled) {
                    cur = next;
                    next.load(scales, row, epilogue.m, n0, kb + 1, grid.k_blocks);
                }
                wgmma_fence();
                if constexpr (kFp8) {
#pragma unroll
                    for (int ks = 0; ks < kBlockK / kWgmmaK; ++ks)
                        Wgmma<kBlockN, kOp>::run(block, wgmma_descriptor(a + ks * kWgmmaK),
                                                 wgmma_descriptor(b + ks * kWgmmaK), ks > 0);
                    wgmma_commit();
                    if constexpr (kBlockScaled) wgmma_fence_operands(block);
                    // The block's sums are needed now: the stage is free once they are done
                    // (the other consumer's wgmmas keep the tensor cores busy meanwhile).
                    wgmma_wait<0>();
                    if constexpr (kBlockScaled) wgmma_fence_operands(block);
                    if (lane == 0) mbar_arrive(&empty[stage]);
                    if constexpr (kBlockScaled) {
                        // Accumulator i: row `row` for i % 4 < 2, row + 8 otherwise.
#pragma unroll
                        for (int i = 0; i < kBlockN / 2; ++i)
                            acc[i] = __fmaf_rn(block[i], cur.scale(i % 4 < 2), acc[i]);
                    } else {
#pragma unroll
                        for (int i = 0; i < kBlockN / 2; ++i) acc[i] += block[i];
                    }
                } else {
#pragma unroll
                    for (int ks = 0; ks < kBlockK / kWgmmaK; ++ks)
                        Wgmma<kBlockN, kOp>::run(acc, wgmma_descriptor(a + ks * kWgmmaK),
                                                 wgmma_descriptor(b + ks * kWgmmaK),
                                                 kb > 0 || ks > 0);
                    wgmma_commit();
                    // INT4: the next k-block's share while these wgmmas run.
                    if constexpr (kInt4) {
                        if (unpacked < sequence) unpack_b(unpacked++);
                    }
                    // Keep one stage's wgmmas in flight; the previous stage's are done now, so
                    // its buffers can be refilled.
                    wgmma_wait<1>();
                    if (prev_stage >= 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
                    prev_stage = stage;
                }
                if (++stage == kStages) {
                    stage = 0;
                    ++round;
                }
            }
            if constexpr (!kFp8) {
                wgmma_wait<0>();
                if (lane == 0) mbar_arrive(&empty[prev_stage]);
            }
            if constexpr (kInt4) {
                // The sums of 16 a x 16 b: exact multiples of 256 (kInt4SM90MaxK keeps them in
                // range).
#pragma unroll
                for (int i = 0; i < kBlockN / 2; ++i) acc[i] >>= 8;
            }

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
                named_barrier_sync<kWarpgroupThreads>(1 + consumer);
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
// A 2-D TMA map over a row-major int8 [rows, k] operand: boxes of box_rows x kBlockK bytes with
// the 128-byte swizzle that the wgmma descriptors expect, zero fill out of bounds.
cudaError_t make_operand_map(CUtensorMap* map, const int8_t* base, int64_t rows, int64_t k,
                             int box_rows) {
    return make_tensor_map_2d(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, rows, k, k, box_rows,
                              kBlockK, CU_TENSOR_MAP_SWIZZLE_128B);
}

// INT4: a packed [rows, k / 2] operand, boxes of box_rows x kPackedK bytes, unswizzled (the
// unpacking warps read it; they write the int8 stage swizzled), zero fill out of bounds (code 0).
cudaError_t make_packed_operand_map(CUtensorMap* map, const void* base, int64_t rows, int64_t k,
                                    int box_rows) {
    return make_tensor_map_2d(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, rows, k / 2, k / 2,
                              box_rows, kPackedK, CU_TENSOR_MAP_SWIZZLE_NONE);
}

template <typename OutT, int kConsumers, int kBlockN, Operand kOp>
cudaError_t launch_sm90(const IntGemmArgs& args, cudaStream_t stream) {
    constexpr bool kInt4 = kOp == Operand::kInt4;
    using Config = Sm90Config<kConsumers, kBlockN, kInt4>;
    CUtensorMap map_a, map_b;
    cudaError_t err =
        kInt4 ? make_packed_operand_map(&map_a, args.a, args.m, args.k, Config::kBlockM)
              : make_operand_map(&map_a, args.a_as<int8_t>(), args.m, args.k, Config::kBlockM);
    if (err != cudaSuccess) return err;
    err = kInt4 ? make_packed_operand_map(&map_b, args.b, args.n, args.k, kBlockN)
                : make_operand_map(&map_b, args.b_as<int8_t>(), args.n, args.k, kBlockN);
    if (err != cudaSuccess) return err;

    const Epilogue<OutT> ep = make_epilogue<OutT>(args);

    TileGrid grid{int(ceil_div(args.m, Config::kBlockM)), int(ceil_div(args.n, kBlockN)),
                  int(ceil_div(args.k, kBlockK))};
    const int64_t tiles = int64_t(grid.tiles_m) * grid.tiles_n;
    const int blocks = int(std::min<int64_t>(tiles, std::max(sm_count(), 1)));
    auto kernel = gemm_int8_wgmma_kernel<OutT, kConsumers, kBlockN, kOp>;
    static std::atomic<uint64_t> opted_in{0};  // per device, for this one kernel
    err = allow_dynamic_smem_once(kernel, Config::kSmemBytes, opted_in);
    if (err != cudaSuccess) return err;
    return launch_dependent(kernel, dim3(unsigned(blocks)), dim3(Config::kThreads),
                            Config::kSmemBytes, stream, map_a, map_b, grid, block_scales(args), ep);
}

// The tile shape: the one with the least estimated time, counting whole waves of persistent
// CTAs and a per-tile cost that favours the larger tiles (less shared-memory traffic per MAC).
template <typename OutT, Operand kOp>
cudaError_t dispatch_tiles(const IntGemmArgs& args, cudaStream_t stream) {
    struct Choice {
        int consumers, block_n;
        double efficiency;  // relative throughput of one tile shape's main loop
    };
    constexpr Choice kChoices[] = {{2, 256, 1.0}, {2, 128, 0.9}, {1, 256, 0.85}, {1, 128, 0.75}};
    const int sms = std::max(sm_count(), 1);
    int best = -1;
    double best_cost = 0;
    for (int i = 0; i < int(sizeof kChoices / sizeof kChoices[0]); ++i) {
        if (kIsFp8<kOp> && kChoices[i].block_n != 128) continue;
        const int64_t bm = 64 * kChoices[i].consumers, bn = kChoices[i].block_n;
        const int64_t tiles = ceil_div(args.m, bm) * ceil_div(args.n, bn);
        const double cost = double(ceil_div(tiles, sms)) * double(bm * bn) / kChoices[i].efficiency;
        if (best < 0 || cost < best_cost) {
            best = i;
            best_cost = cost;
        }
    }
    if constexpr (kIsFp8<kOp>) {
        return best == 1 ? launch_sm90<OutT, 2, 128, kOp>(args, stream)
                         : launch_sm90<OutT, 1, 128, kOp>(args, stream);
    } else {
        switch (best) {
            case 0: return launch_sm90<OutT, 2, 256, kOp>(args, stream);
            case 1: return launch_sm90<OutT, 2, 128, kOp>(args, stream);
            case 2: return launch_sm90<OutT, 1, 256, kOp>(args, stream);
            default: return launch_sm90<OutT, 1, 128, kOp>(args, stream);
        }
    }
}

}  // namespace

bool gemm_int8_sm90_available() { return tma_wgmma_built_and_runnable(); }

namespace {

template <Operand kOp> cudaError_t dispatch_out(const IntGemmArgs& args, cudaStream_t stream) {
    switch (args.out_dtype) {
        case CK_DTYPE_INT32:
            if constexpr (kIsFp8<kOp>) return cudaErrorInvalidValue;
            else return dispatch_tiles<int32_t, kOp>(args, stream);
        case CK_DTYPE_FP32: return dispatch_tiles<float, kOp>(args, stream);
        case CK_DTYPE_FP16: return dispatch_tiles<__half, kOp>(args, stream);
        case CK_DTYPE_BF16: return dispatch_tiles<__nv_bfloat16, kOp>(args, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

cudaError_t gemm_int8_sm90(const IntGemmArgs& args, cudaStream_t stream) {
    if (args.b_layout != CK_LAYOUT_NK || !gemm_int8_sm90_available()) return cudaErrorNotSupported;
    return dispatch_out<Operand::kInt8>(args, stream);
}

cudaError_t gemm_int4_sm90(const IntGemmArgs& args, cudaStream_t stream) {
    if (args.b_layout != CK_LAYOUT_NK || args.k > kInt4SM90MaxK || !gemm_int8_sm90_available())
        return cudaErrorNotSupported;
    return dispatch_out<Operand::kInt4>(args, stream);
}

cudaError_t gemm_fp8_sm90(const IntGemmArgs& args, cudaStream_t stream) {
    if (args.b_layout != CK_LAYOUT_NK || !gemm_int8_sm90_available()) return cudaErrorNotSupported;
    return args.block_scaled() ? dispatch_out<Operand::kFp8BlockScaled>(args, stream)
                               : dispatch_out<Operand::kFp8>(args, stream);
}

}  // namespace ck
