// gemm_w4a16_prepacked_wgmma_sm90.cu - the W4A16 GEMM on Hopper tensor cores: wgmma with the
// dequantized weight in registers, x by TMA, warp-specialized (the "wgmma" variant of
// ck_gemm_w4a16_prepacked, which "auto" picks for M > 16 on compute capability 9.0).
//
// What it computes (the same value as the tc kernel, gemm_w4a16_prepacked_tc.cu):
//   w'[n][k] = round_to_dtype(float(q - zero) * float(scale[n][group(k)]))
//   out[m][n] = round_to_dtype(act(sum_k float(x[m][k]) * float(w'[n][k]) + float(bias[n])))
// fp16 or bf16 operands, float32 accumulators (the sum in an order of its own), w' rounded
// exactly as ck_dequantize_int4 rounds it (dequant_int4_pair, core/dequant.cuh), one rounding
// of the output in the shared float epilogue's way (FloatEpilogue, core/epilogue.cuh).
//
// Layout: x [M, K] dtype row-major (16-byte aligned, K % 32 == 0); the weight prepacked
// (w4a16_prepacked.cuh: 512-byte tiles of 8 rows x 128 k, scales and zeros [N8 / 8][groups][8],
// 16-byte aligned); bias [N] dtype or nullptr; out [M, N] dtype (element aligned; rows and columns
// outside [M, N) never written).
//
// Algorithm. The wgmma computes out^T, as the mma.sync kernels do: A (64 x 16, M of the
// instruction) is the dequantized weight, from registers; B (16 x kBM, N of the instruction) is
// x^T, whose K-major form "N rows of K contiguous values" is exactly x's row-major rows, read
// from shared memory through a descriptor. One CTA per kBM x 128 output tile (kBM = 64, 128 or
// 256 x rows, WgmmaTile, by 128 weight rows, no persistence), or a cluster of 2, 4 or 8 CTAs
// that split its K and sum their partial tiles in distributed shared memory where the tiles
// alone would leave SMs idle (WgmmaPlan); K in 128-k chunks (one prepacked tile column) through
// a kStages-deep ring of shared-memory stages, each guarded by a "full" and an "empty"
// mbarrier; 384 threads:
//   - warpgroup 2, the producer, gives most of its registers to the consumers (setmaxnreg);
//     its warp 8's lane 0 issues per stage two TMA copies of x (kBM rows x 64 k each: one
//     128-byte swizzle row per x row) and one 3-D TMA copy of the block's 16 weight tiles
//     (8 KB), all completing their bytes on the stage's full barrier. Scales and zero points
//     are not staged (the zeros' global rows are 8 * groups bytes apart, which TMA's 16-byte
//     stride rule cannot describe): each consumer lane reads its few from global memory one
//     chunk ahead (ScaleReader), so shared memory holds only what TMA writes. With kBM = 64,
//     two CTAs share an SM (WgmmaTile::kBlocksPerSm).
//   - warps 0-3 and 4-7, two consumer warpgroups: warpgroup c owns weight rows 64 c .. 64 c + 63
//     of the tile and all kBM x rows: per stage 8 wgmma m64n{kBM}k16, their kBM / 2 accumulators
//     per thread in registers. Before each wgmma, each thread dequantizes its four A registers
//     from the stage's weight tiles (one pair of codes per 32-bit word, see "A fragments"), once
//     the wgmma that last read those registers (the same step of the previous chunk) is done:
//     seven wgmmas stay queued while the eighth is dequantized. At the end bias, activation and
//     one rounding go straight from the registers to global memory.
//   - TMA zero-fills x rows past M and k past K and weight tiles past N8; the scale reader
//     gives 0 for the scales (zeros) of groups past the last and of tiles past N8: partial tiles
//     need no masking in the main loop (a zero-filled code dequantizes to (0 - 0) * 0 = 0).
//
// Floors: bytes = M*K*2 + N*K/2 + N*groups*(2 [+1 with zeros]) + M*N*2; flops = 2*M*N*K. H100
// SXM dense fp16/bf16 peak ~989 TFLOP/s: (K, N) = (4096, 14336), M = 4096 -> 481 GFLOP ->
// 486 us; the weight (29.4 MB) -> 9.8 us at 3.0 TB/s: large M is compute-bound, the reason for
// wgmma (mma.sync reaches ~2/3 of the peak). M = 64: 7.5 GFLOP -> 7.6 us at the peak, the same
// weight 9.8 us: both floors meet; what bounds the 64-row block is the dequantization (the same
// instructions per chunk as the 128-row block's for a quarter of the multiply-adds of the
// 256-row one) and, for short K shares, the block's fixed cost (start, pipeline fill, the
// cluster's sum and the epilogue; benchmarks/NOTES.md).
//
// The Hopper primitives (mbarrier, TMA, wgmma) are in kernels/core/ptx_sm90.cuh, the tensor
// maps in kernels/core/tma.cuh. Kernel bodies exist in the sm_90a pass only (CK_SM90A_DEVICE);
// the host never launches the empty ones of other targets (gemm_w4a16_wgmma_available()).
#include <atomic>

#include "kernels/core/cluster_split.cuh"
#include "kernels/core/dequant.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/core/ptx_sm90.cuh"
#include "kernels/core/tma.cuh"
#include "kernels/gemm/gemm_block4.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"

namespace ck {
namespace {

// ---------------------------------------------------------------------------------------------
// Tile shapes. ([[maybe_unused]]: the kernel body, their only user, exists in the sm_90a pass.)
// ---------------------------------------------------------------------------------------------
constexpr int kConsumers = 2;                         // consumer warpgroups
constexpr int kWarpgroupThreads = 128;
constexpr int kProducerWarp = 4 * kConsumers;         // warp 8, after the consumers: each
                                                      // warpgroup starts at a warp index % 4 == 0
// A whole producer warpgroup (its warp 8, lane 0, issues the copies), so that setmaxnreg can
// move registers from it to the consumers: ptxas sizes a wgmma kernel's register file in whole
// warpgroups (168 per thread for 3), and the 256-row tile's 128 accumulators per thread need more.
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;  // 384
constexpr int kWgmmaM = 64, kWgmmaK = 16;
constexpr int kBN = kConsumers * kWgmmaM;             // 128 weight rows (output columns)
constexpr int kChunkK = kPackK;                       // 128 k per stage: one prepacked tile column
constexpr int kSteps = kChunkK / kWgmmaK;             // 8 wgmma per stage and warpgroup
constexpr int kSwizzleBytes = 128;                    // TMA / wgmma 128-byte swizzle rows
constexpr int kSwizzleK = kSwizzleBytes / 2;          // 64 16-bit x values per swizzle row
constexpr int kXBoxes = kChunkK / kSwizzleK;          // 2 x boxes per stage
constexpr int kTiles = kBN / kPackRows;               // 16 weight tiles per stage
constexpr int kTileRows128 = kPackTileBytes / kSwizzleBytes;  // 4 swizzle rows per weight tile
constexpr int kWStageBytes = kTiles * kPackTileBytes;  // 8 KB
constexpr int kGroupUnits = kPackK / 32;              // 4: groups a chunk can touch (size 32)
[[maybe_unused]] constexpr int kFullArrivals = 1;                        // the producer's expect_tx
[[maybe_unused]] constexpr int kEmptyArrivals = 4 * kConsumers;        // one per consumer warp
[[maybe_unused]] constexpr int kGroupM = 8;                            // tile rows per rasterization group
// Named barrier: both consumer warpgroups are done with the ring (a split block's partials).
[[maybe_unused]] constexpr int kRingFreeBarrier = 1;

// The block's x rows (output rows, the wgmma's N): 64 for m <= 64, 128, or 256 where that still
// fills the GPU (one A fragment, dequantized once, then feeds twice the multiply-adds), and the
// stages that fit: 4 of 24 KB, 4 of 40 KB (3 chunks in flight while one is multiplied) or 3 of
// 72 KB.
// The 64-row block does a quarter of the 256-row block's multiply-adds per dequantized weight:
// its time goes to the dequantization (ncu: 0.41 instructions issued per scheduler and cycle at
// 2 warps per scheduler). So it runs 2 blocks per SM (80 registers per thread, the consumers
// raised to 104), which needs its A fragments live for 1 wgmma in flight (2 sets) rather than 7
// (8 sets): its tensor cores are far from busy either way (4096x14336, M = 64: 33.8 -> 28.1 us).
template <int kRows> struct WgmmaTile {
    static constexpr int kBM = kRows;
    static constexpr int kStages = kRows == 256 ? 3 : 4;
    static constexpr int kBlocksPerSm = kRows == 64 ? 2 : 1;
    // wgmmas left queued while the next step is dequantized, and the A fragment sets that needs.
    [[maybe_unused]] static constexpr int kInFlight = kRows == 64 ? 1 : kSteps - 1;
    [[maybe_unused]] static constexpr int kFragments = kInFlight + 1;
    // setmaxnreg: what ptxas gives each thread at kBlocksPerSm blocks of kThreads (168 or 80),
    // less the producer warpgroup's kProducerRegisters (40 or 32), to the consumers (232 or 104).
    static constexpr int kProducerRegisters = SplitRegisters<kBlocksPerSm>::kProducer;
    static constexpr int kConsumerRegisters = SplitRegisters<kBlocksPerSm>::kConsumer;
    static_assert(kSteps % kFragments == 0, "step q uses set q % kFragments in every chunk");
    static constexpr int kXBoxBytes = kBM * kSwizzleBytes;       // 8, 16 or 32 KB
    static constexpr int kXStageBytes = kXBoxes * kXBoxBytes;    // 16, 32 or 64 KB
    static constexpr int kTxBytes = kXStageBytes + kWStageBytes;  // TMA bytes per stage
    // The 1024 bytes of slack align the tiles to the 128-byte swizzle's period; the barriers last.
    static constexpr int kRingBytes = kStages * (kXStageBytes + kWStageBytes);
    static constexpr int kSmemBytes = 1024 + kRingBytes + 2 * kStages * 8;
    // A split block's float32 partial tile (kBM x 128) reuses the ring once its chunks are done.
    static constexpr int kPartialBytes = kBM * kBN * 4;
    static_assert(kRows == 64 || kRows == 128 || kRows == 256, "wgmma m64n64, m64n128, m64n256");
    static_assert(kPartialBytes <= kRingBytes, "the partial tile fits the ring");
    static_assert(kXBoxBytes % 1024 == 0, "swizzled tiles keep the 1024-byte alignment");
    static_assert(kTxBytes < (1 << 20), "an mbarrier's transaction count holds a stage's bytes");
    static_assert(kSmemBytes * kBlocksPerSm <= 227 * 1024, "kBlocksPerSm CTAs per SM");
};
using WgmmaShort = WgmmaTile<kWgmmaShortRows>;
using WgmmaNarrow = WgmmaTile<kWgmmaNarrowRows>;
using WgmmaWide = WgmmaTile<kWgmmaWideRows>;
static_assert(WgmmaShort::kConsumerRegisters == 104 && WgmmaShort::kProducerRegisters == 32 &&
                  WgmmaNarrow::kConsumerRegisters == 232 && WgmmaNarrow::kProducerRegisters == 40 &&
                  WgmmaWide::kConsumerRegisters == 232 && WgmmaWide::kProducerRegisters == 40,
              "the register split the comments and ptxas notes give");

static_assert(kThreads == kSplitThreads && kProducerWarp % 4 == 0,
              "two consumer warpgroups, then the producer's (cluster_split.cuh)");
static_assert(kWgmmaM == 4 * 2 * kPackRows, "a consumer warp owns two weight tiles (16 rows)");
static_assert(kSteps == 2 * (kPackK / kPackSliceK), "two wgmma k16 steps per 32-k lane slice");
static_assert(kGroupUnits == kPackK / kPackSliceK, "ChunkScales holds one entry per 32-k slice");
static_assert(kWStageBytes % 1024 == 0, "swizzled tiles keep the 1024-byte alignment");
static_assert(kTileRows128 == 4 && kTiles == 16, "the weight map's box is 128 x 4 x 16 bytes");

// ---------------------------------------------------------------------------------------------
// Shared memory, and why.
//
// x stage: two boxes [128 x rows][64 k] (128-byte rows), written by TMA with the 128-byte
//   swizzle and read by wgmma through descriptors with the same swizzle (the layout of the INT8
//   kernel, gemm_int8_sm90.cu: K-major, 8-row groups 1024 bytes apart). wgmma k16 step q of the
//   chunk reads k 16 q .. 16 q + 15: box q / 4, bytes 32 (q % 4) of every row; stepping inside
//   a swizzled row is a start-address offset, the hardware applies the XOR to the final address.
//
// weight stage: the block's 16 prepacked tiles (16 x 512 bytes), each tile seen as 4 rows of 128
//   bytes: the 3-D tensor map (128 bytes, 4 rows per chunk and tile, tiles) with the 128-byte
//   swizzle. Logical byte (4 g + s) * 16 of tile T (row g, k slice s, w4a16_prepacked.cuh) is in
//   row R = 4 T + g / 2 at 16-byte unit u = 4 (g % 2) + s; TMA stores unit u of row R at unit
//   u ^ (R % 8) (the swizzle XORs address bits 4-6 with bits 7-9; the stage is 1024-aligned).
//   Why: a warp reads one 16-byte vector per lane and tile, the same slice s for all of its 8
//   rows g (the 4 lanes of a quad share it: a broadcast). Unswizzled, units 4 (g % 2) + s fall on
//   2 bank groups: 4-way conflicts. Swizzled, with T even (4 T % 8 = 0; T odd adds 4 to R % 8):
//   unit = (4 (g % 2) + s) ^ (g / 2) [^ 4]: bit 2 is g % 2 (flipped for odd T), bits 0-1 are
//   s ^ (g / 2): 8 distinct bank groups, conflict-free.
//
// Scales and zero points are not staged: each consumer lane reads the few it needs (rows g of
// its two tiles, the chunk's group units) from global memory, one chunk ahead (ChunkScales).
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// A fragments: the derivation.
//
// wgmma m64nNk16's A fragment (ptx_sm90.cuh, wgmma_m64nk16_rs): warp w, lane (g, t) holds
//   a[0] = A[16w + g][2t, 2t + 1], a[1] = A[16w + g + 8][2t, 2t + 1], a[2] and a[3] the same at
//   k 2t + 8, 2t + 9 (lower k in the low half). A's rows are the weight rows (the instruction's M):
//   warp w of warpgroup c owns tile rows 64 c + 16 w + g, i.e. rows g of the stage's weight tiles
//   T0 = 8 c + 2 w (even) and T1 = T0 + 1.
// B's k order is fixed by memory: a k16 step covers 16 consecutive k of x (two runs of 8: k 0-7
//   and 8-15 of the step), so A must follow k's natural order too (the tc kernel's k permutation
//   is not available: it permutes x in registers, and here the tensor cores read x themselves).
// The prepacked word i of slice s (lane 4 g + s's vector in the layout) holds k 32 s + 8 i ..
//   + 7 of row g: nibble e holds k 2e (e < 4) or 2 (e - 4) + 1 (e >= 4). So k 8 i + 2t and
//   8 i + 2t + 1 of the slice are nibbles t and t + 4, the pair dequant_int4_pair takes from
//   q >> 4t: low half k 2t, high half k 2t + 1, exactly a register's order.
// Step q = 2 s + h of the chunk (k 16 q .. 16 q + 15 = slice s, words 2h and 2h + 1):
//   a[0] = pair t of word 2h     of (T0, row g, slice s)      k 16q + 2t, + 1       row g
//   a[1] = pair t of word 2h     of (T1, row g, slice s)      k 16q + 2t, + 1       row g + 8
//   a[2] = pair t of word 2h + 1 of (T0, row g, slice s)      k 16q + 8 + 2t, + 1   row g
//   a[3] = pair t of word 2h + 1 of (T1, row g, slice s)      k 16q + 8 + 2t, + 1   row g + 8
// A lane thus reads the whole 16-byte vector of its row and slice in both tiles (one ld.shared
// .v4 each per two steps) and uses a quarter of it: the four lanes of a quad read the same vector
// and take pairs t = 0..3. The scale (zero) of a step is that of row g of T0 (T1) in group unit
// s >> slice_shift of the chunk (16 k of a step never straddle a group: groups are >= 32 k).
//
// Accumulators (out^T): warp w, lane (g, t) holds, for each 8-column block j of the 128 x rows,
//   acc[4j], acc[4j + 1] = out^T[weight row 64c + 16w + g][x rows 8j + 2t, 2t + 1] and acc[4j + 2],
//   acc[4j + 3] the same for weight row + 8: the tc kernel's c0 .. c3 (out rows 2t, 2t + 1 of
//   output columns g and g + 8), stored the same way (one shuffle makes pairs of columns).
// ---------------------------------------------------------------------------------------------

// The group layout of a call, from the one encoding (group_shift): step groups per 128-k chunk (4,
// 2, 1 for groups of 32, 64, 128; 0 when a row is one group), and slice s's unit
// s >> slice_shift.
struct WgmmaGroups {
    int step, slice_shift;
};
inline WgmmaGroups wgmma_groups(int group_shift) {
    if (group_shift > 7) return {0, 2};  // one group per row: every chunk reads group 0
    return {kPackK >> group_shift, group_shift - 5};
}

// Byte offset, in a weight stage, of the 16-byte vector (tile T, row g, slice s), swizzled as TMA
// wrote it (see the layout comment).
[[maybe_unused]] __host__ __device__ constexpr int weight_vector_offset(int tile, int g, int s) {
    const int row = kTileRows128 * tile + g / 2;
    return row * kSwizzleBytes + 16 * ((4 * (g % 2) + s) ^ (row % 8));
}

// The scale units (and zero points) a consumer lane uses in one 128-k chunk, per 32-k slice s
// (the unit s >> slice_shift of the chunk's groups): rows g of its tiles T0 and T1 = T0 + 1.
// Units of 16 bits or less (INT4's scale in the dtype, MXFP4's E8M0 byte, NVFP4's two E4M3
// bytes): scale[s] = T0's | T1's << 16; 32-bit units (NF4's float32 absmax): scale[s] = T0's,
// scale_t1[s] = T1's. zero[s] = T0's | T1's << 16, each zero point as INT4's subtrahend magic +
// zero (int4_pair_sub's half). 0 past the last tile or group (magic alone for zero points; the
// zero-filled codes there dequantize to 0 either way: every format's unit 0 is a finite
// scale). Indexed by constants only, inside the wgmma stage, so that they stay in registers and
// no select sits between wgmmas; what a format does not use is never computed.
struct ChunkScales {
    uint32_t scale[kGroupUnits];
    uint32_t scale_t1[kGroupUnits];
    uint32_t zero[kGroupUnits];
};

// What one lane reads for a chunk: the units (and zero points) of rows g of T0 and T1 in its
// quad's slice t, as loaded, so that nothing waits on the loads until the next chunk begins.
struct RawScales {
    uint32_t s0, s1, z0, z1;
};

// Where a consumer lane reads them: straight from global memory, lane t of a quad the slice t
// (the quad's four lanes share row g and need all four slices), one chunk ahead of their use;
// gather() hands each lane the quad's four (shuffles), so that no shared memory hand-off is
// needed and a chunk costs a lane 2 loads (4 with zero points). Packed at once instead of a
// chunk later, the loads stalled the 64-row tile's warps ~20% of its loop (ncu); the 128- and
// 256-row tiles measured 0-12% faster with the gather too (QKV and MoE at T >= 512). The units
// are Dequant<Format, T>::Unit's: 1, 2 or 4 bytes, at the INT4 scales' places (gemm_block4.cuh).
template <class Format, typename T, bool kAsym> struct ScaleReader {
    using Unit = typename Dequant<Format, T>::Unit;
    static constexpr bool kWideUnit = sizeof(Unit) == 4;
    static_assert(sizeof(Unit) <= 2 || (kWideUnit && !kAsym), "zero points come with 16-bit units");
    const Unit* scale_row[2];  // &scales[T][group 0][g]; nullptr past the last tile
    const uint8_t* zero_row[2];
    int64_t groups;
    int step, unit;  // unit: the lane's slice's group unit in a chunk (t >> slice_shift)

    // t0: the lane's first tile among the weight's tiles8; expert_tile0: where the weight's
    // tiles start among those the scales hold (an expert's, grouped; 0 otherwise).
    __device__ ScaleReader(const GemmW4A16Args& args, const WgmmaGroups& grp, int64_t t0,
                           int64_t expert_tile0, int g, int t)
        : groups(args.groups), step(grp.step), unit(t >> grp.slice_shift) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const bool ok = t0 + i < args.tiles8;
            const int64_t first = ((expert_tile0 + t0 + i) * args.groups) * kPackRows + g;
            scale_row[i] = ok ? static_cast<const Unit*>(args.scales) + first : nullptr;
            zero_row[i] = ok && kAsym ? args.zeros + first : nullptr;
        }
    }

    __device__ __forceinline__ void load(int kc, RawScales& r) const {
        const int64_t group = int64_t(kc) * step + unit;
        const int64_t at = group * kPackRows;
        const bool in = group < groups;
        // A tile's zero points exist where its scales do: one predicate per tile for both.
        const bool in0 = in && scale_row[0], in1 = in && scale_row[1];
        r.s0 = in0 ? __ldg(scale_row[0] + at) : 0u;
        r.s1 = in1 ? __ldg(scale_row[1] + at) : 0u;
        if constexpr (kAsym) {
            r.z0 = in0 ? __ldg(zero_row[0] + at) : 0u;
            r.z1 = in1 ? __ldg(zero_row[1] + at) : 0u;
        }
    }

    // The chunk's ChunkScales from the quad's four lanes (the whole warp calls it).
    __device__ __forceinline__ ChunkScales gather(const RawScales& r) const {
        ChunkScales out;
        const int quad = int(threadIdx.x % 32) & ~3;
        if constexpr (kWideUnit) {
#pragma unroll
            for (int s = 0; s < kGroupUnits; ++s) {
                out.scale[s] = __shfl_sync(~0u, r.s0, quad | s);
                out.scale_t1[s] = __shfl_sync(~0u, r.s1, quad | s);
            }
            return out;
        }
        const uint32_t scales = r.s0 | (r.s1 << 16);
#pragma unroll
        for (int s = 0; s < kGroupUnits; ++s) out.scale[s] = __shfl_sync(~0u, scales, quad | s);
        if constexpr (kAsym) {
            // magic + zero of T0 and T1 (a zero point is below 16: it fills the low byte alone),
            // made once here rather than per slice after the shuffles.
            const uint32_t zeros = (r.z0 | (r.z1 << 16)) | int4_pair_sub<T>(0);
#pragma unroll
            for (int s = 0; s < kGroupUnits; ++s) out.zero[s] = __shfl_sync(~0u, zeros, quad | s);
        }
        return out;
    }
};

// INT4's operands of slice s for rows g of tiles T0 ([0]) and T1 ([1]): the scale in both
// halves, and the subtrahend magic + zero point in both halves (int4_pair_sub), each one PRMT
// per slice (for both steps of the slice and both words of each) rather than the shifts, masks
// and multiplies of a Block per pair. Symmetric weights: the constant of zero point 8.
struct Int4Slice {
    uint32_t scale2[2], sub2[2];
};
template <typename T, bool kAsym>
__device__ __forceinline__ Int4Slice int4_slice(const ChunkScales& cur, int s) {
    Int4Slice r;
    r.scale2[0] = __byte_perm(cur.scale[s], 0u, 0x1010);  // T0's 16 bits twice
    r.scale2[1] = __byte_perm(cur.scale[s], 0u, 0x3232);  // T1's
    if constexpr (kAsym) {
        r.sub2[0] = __byte_perm(cur.zero[s], 0u, 0x1010);
        r.sub2[1] = __byte_perm(cur.zero[s], 0u, 0x3232);
    } else {
        r.sub2[0] = r.sub2[1] = int4_pair_sub<T>(kSymmetricZero);
    }
    return r;
}

// The Blocks (Dequant<Format, T>::Block) of a block format's step h of slice s for rows g of
// tiles T0 (b[0]) and T1 (b[1]), from the step's words 2h and 2h + 1 (NVFP4: the 16-k block of
// the unit's low byte for h = 0, high for h = 1; the others' blocks span the slice). table: the
// format's shared-memory table, if any.
template <class Format, typename T>
__device__ __forceinline__ void step_blocks(const ChunkScales& cur, int s, int h,
                                            const float* table,
                                            typename Dequant<Format, T>::Block (&b)[2]) {
    using D = Dequant<Format, T>;
    constexpr bool kWideUnit = sizeof(typename D::Unit) == 4;
    b[0] = D::block(kWideUnit ? cur.scale[s] : cur.scale[s] & 0xffffu, 2 * h, table);
    b[1] = D::block(kWideUnit ? cur.scale_t1[s] : cur.scale[s] >> 16, 2 * h, table);
}

// Whether a format has Dequant's fast path (MXFP4: a half2 multiply per pair where every block
// of a warp's chunk has a scale up to 2, dequant.cuh).
template <class Format, typename T> constexpr bool fast_path_format() {
    if constexpr (std::is_same_v<Format, Int4Zp>) return false;
    else return Dequant<Format, T>::kFastPath;
}

// The fast path's blocks of step h of slice s, as step_blocks.
template <class Format, typename T>
__device__ __forceinline__ void step_fast_blocks(const ChunkScales& cur, int s, int h,
                                                 const float* table,
                                                 typename Dequant<Format, T>::FastBlock (&b)[2]) {
    using D = Dequant<Format, T>;
    b[0] = D::fast_block(cur.scale[s] & 0xffffu, 2 * h, table);
    b[1] = D::fast_block(cur.scale[s] >> 16, 2 * h, table);
}

// kSplit: blocks_per_tile (2, 4 or 8) blocks share each output tile, one cluster of that many
// consecutive blocks (only plain and fused Q/K/V calls split; without kSplit none of the
// cluster's code is compiled in). Each takes split_chunks of K; at the end the cluster sums
// their float32 partial tiles (cluster_split_sum), and block r stores the 8-row blocks j with
// j % split == r.
template <class Tile, typename T, class Format, bool kAsym, int kMode, bool kSplit>
__global__ void __launch_bounds__(kThreads, Tile::kBlocksPerSm)
gemm_w4a16_wgmma_kernel(const __grid_constant__ CUtensorMap map_x,
                        const __grid_constant__ CUtensorMap map_w, const GemmW4A16Args args,
                        const WgmmaGroups grp, const MoeRows mr, const int blocks_per_tile) {
#ifdef CK_SM90A_DEVICE
    const int split = kSplit ? blocks_per_tile : 1;
    constexpr int kBM = Tile::kBM, kStages = Tile::kStages;
    constexpr int kXBoxBytes = Tile::kXBoxBytes, kXStageBytes = Tile::kXStageBytes;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    // Dynamic shared memory is only guaranteed 16-byte aligned: round up to the swizzle period,
    // as an offset into smem_raw, so that the compiler still knows every pointer below is shared
    // (ld.shared rather than generic loads).
    uint8_t* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    uint8_t* x_stages = smem;                                  // [kStages][2][kBM][128 B]
    uint8_t* w_stages = x_stages + kStages * kXStageBytes;     // [kStages][16 tiles][512 B]
    uint64_t* full = reinterpret_cast<uint64_t*>(w_stages + kStages * kWStageBytes);
    uint64_t* empty = full + kStages;

    // Launched as a programmatic dependent of the stream's previous kernel (launch_wgmma): the
    // block may be resident before that kernel ends, and waits for it here, before its first
    // global access (x, the expert blocks of a grouped call). The next kernel may launch at once:
    // it waits for this grid's end in turn.
    wait_for_prior_grid();
    allow_dependent_launch();

    const int rank = split > 1 ? int(cluster_ctarank()) : 0;
    // Block `rank` sums and stores the 8-row blocks j with j % split == rank; split is a power of
    // two (a modulo by a run-time value would cost each of the epilogue's kBM / 8 blocks a
    // division: ~10% of the 256-row tile's time in the MoE layer at T = 4096).
    const int owner_mask = split - 1;
    const TileOrigin tile = grouped_tile(blockIdx.x / split, args.m, args.n, kBM, kBN, kGroupM);
    const int64_t m0 = tile.m0, n0 = tile.n0;
    // Expert-grouped (kMode kMoeSwiGLU / kMoeWeighted): the tile row is a block of kBM sorted
    // rows, all of one expert, whose weight tiles follow the previous experts' (tiles8 each).
    int64_t expert_tile0 = 0;
    if constexpr (grouped_rows(kMode)) {
        const int expert = mr.block_expert[m0 / kBM];
        if (expert < 0) return;  // past the rows in use: the whole block leaves
        expert_tile0 = expert * args.tiles8;
    }
    // The launcher checks that chunks fits an int.
    const ChunkRange kr = split_chunks(int(args.chunks), split, rank);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // A block format's table (NF4's values, NVFP4's block scales), filled before the barrier
    // below, which every thread passes before any word is dequantized.
    using D = Dequant<Format, T>;
    constexpr bool kInt4 = std::is_same_v<Format, Int4Zp>;
    const float* table = nullptr;
    if constexpr (D::kTableFloats > 0) {
        __shared__ float values[D::kTableFloats];
        D::fill_table(values, args.global_scale);
        table = values;
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], kFullArrivals);
            mbar_init(&empty[s], kEmptyArrivals);
        }
        fence_mbarrier_init();       // the inits are visible to the other threads ...
        fence_proxy_async_shared();  // ... and to the TMA that completes on the barriers
    }
    __syncthreads();

    if (warp >= kProducerWarp) {
        // ---- Producer: warp 8's lane 0 issues every copy; the warpgroup's registers go to the
        // consumers first. Every thread stays for the cluster's two barriers (split blocks). ----
        setmaxnreg_dec<Tile::kProducerRegisters>();
        if (warp == kProducerWarp && lane == 0) {
            prefetch_tensor_map(&map_x);
            prefetch_tensor_map(&map_w);
            const int64_t tile0 = expert_tile0 + n0 / kPackRows;  // the block's first weight tile
            int stage = 0;
            uint32_t round = 0;
            for (int kc = kr.begin; kc < kr.end; ++kc) {
                mbar_wait(&empty[stage], (round & 1) ^ 1);  // the first round finds it free
                mbar_arrive_expect_tx(&full[stage], Tile::kTxBytes);
                uint8_t* xs = x_stages + stage * kXStageBytes;
#pragma unroll
                for (int b = 0; b < kXBoxes; ++b)
                    tma_load_2d(xs + b * kXBoxBytes, &map_x, &full[stage],
                                kc * kChunkK + b * kSwizzleK, int(m0));
                tma_load_3d(w_stages + stage * kWStageBytes, &map_w, &full[stage], 0,
                            kTileRows128 * kc, int(tile0));
                if (++stage == kStages) {
                    stage = 0;
                    ++round;
                }
            }
        }
        if (split > 1) cluster_split_producer_wait();
        return;
    }

    // ---- Consumers: warpgroup c, warp w of it, lane (g, t) ----
    setmaxnreg_inc<Tile::kConsumerRegisters>();
    const int c = warp / 4, w = warp % 4;
    const int g = lane / 4, t = lane % 4;
    const int tile_a = 8 * c + 2 * w;  // T0; T1 = T0 + 1 (see "A fragments")
    const uint32_t shift = 4 * t;      // pair t of a word: nibbles t and t + 4
    const ScaleReader<Format, T, kAsym> reader(args, grp, n0 / kPackRows + tile_a, expert_tile0,
                                               g, t);
    RawScales next = {};
    if (kr.begin < kr.end) reader.load(kr.begin, next);

    float acc[kBM / 2];  // 64 x kBM float32 over the warpgroup
#pragma unroll
    for (int i = 0; i < kBM / 2; ++i) acc[i] = 0.f;

    // Step q's A fragment, set q % kFragments, the same registers in every chunk and live from
    // its wgmma until the wait that retires it (wgmma_fence_operands): a wgmma reads them after
    // it issues.
    constexpr int kFragments = Tile::kFragments;
    uint32_t a[kFragments][4] = {};

    int stage = 0;
    uint32_t round = 0;
    int prev_stage = -1;
    for (int kc = kr.begin; kc < kr.end; ++kc) {
        mbar_wait(&full[stage], round & 1);
        const uint64_t x_desc = wgmma_descriptor(x_stages + stage * kXStageBytes);
        const uint8_t* ws = w_stages + stage * kWStageBytes;
        const ChunkScales cur = reader.gather(next);
        if (kc + 1 < kr.end) reader.load(kc + 1, next);  // in flight during this chunk
        // A format with a fast path takes it for the chunk where every block of the warp's rows
        // allows it (a warp vote: the branch is uniform, as the wgmmas after it need).
        bool fast = false;
        if constexpr (fast_path_format<Format, T>()) {
            bool ok = true;
#pragma unroll
            for (int s = 0; s < kGroupUnits; ++s)
                ok = ok && D::fast_ok(cur.scale[s] & 0xffffu, table) &&
                     D::fast_ok(cur.scale[s] >> 16, table);
            fast = __all_sync(~0u, ok);
        }
        wgmma_fence_operands(acc);
#pragma unroll
        for (int s = 0; s < kPackK / kPackSliceK; ++s) {
            const uint4 v0 = *reinterpret_cast<const uint4*>(ws + weight_vector_offset(tile_a, g, s));
            const uint4 v1 = *reinterpret_cast<const uint4*>(ws + weight_vector_offset(tile_a + 1, g, s));
            Int4Slice zp{};
            if constexpr (kInt4) zp = int4_slice<T, kAsym>(cur, s);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int q = 2 * s + h;
                // At most kInFlight wgmmas stay in flight (one group per step): the step
                // kFragments before this one, the last reader of a[f], is done. The tensor cores
                // keep the others queued while this one is dequantized, never drained to zero as
                // a wait for all of them at each chunk would.
                const int f = q % kFragments;
                wgmma_wait<Tile::kInFlight>();
                wgmma_fence_operands(a[f]);
                if constexpr (fast_path_format<Format, T>()) {
                    if (fast) {
                        typename D::FastBlock fb[2];
                        step_fast_blocks<Format, T>(cur, s, h, table, fb);
                        a[f][0] = D::fast_pair(word(v0, 2 * h) >> shift, fb[0]);
                        a[f][1] = D::fast_pair(word(v1, 2 * h) >> shift, fb[1]);
                        a[f][2] = D::fast_pair(word(v0, 2 * h + 1) >> shift, fb[0]);
                        a[f][3] = D::fast_pair(word(v1, 2 * h + 1) >> shift, fb[1]);
                    }
                }
                if constexpr (kInt4) {
                    a[f][0] = dequant_int4_pair_sub<T>(word(v0, 2 * h) >> shift, zp.sub2[0],
                                                       zp.scale2[0]);
                    a[f][1] = dequant_int4_pair_sub<T>(word(v1, 2 * h) >> shift, zp.sub2[1],
                                                       zp.scale2[1]);
                    a[f][2] = dequant_int4_pair_sub<T>(word(v0, 2 * h + 1) >> shift, zp.sub2[0],
                                                       zp.scale2[0]);
                    a[f][3] = dequant_int4_pair_sub<T>(word(v1, 2 * h + 1) >> shift, zp.sub2[1],
                                                       zp.scale2[1]);
                } else if (!fast) {
                    typename D::Block b[2];  // rows g of T0 and T1
                    step_blocks<Format, T>(cur, s, h, table, b);
                    a[f][0] = D::pair(word(v0, 2 * h) >> shift, b[0]);
                    a[f][1] = D::pair(word(v1, 2 * h) >> shift, b[1]);
                    a[f][2] = D::pair(word(v0, 2 * h + 1) >> shift, b[0]);
                    a[f][3] = D::pair(word(v1, 2 * h + 1) >> shift, b[1]);
                }
                // The A registers were just written: fence them before the wgmma reads them.
                wgmma_fence();
                wgmma_m64nk16_rs<T, kBM>(
                    acc, a[f],
                    wgmma_descriptor_advance(x_desc, (q / 4) * kXBoxBytes + (q % 4) * (kWgmmaK * 2)),
                    1);
                wgmma_commit();
            }
        }
        wgmma_fence_operands(acc);
        // The last step's wait retired the previous chunk's last wgmma: its stage may be refilled.
        if (prev_stage >= 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[prev_stage]);
        }
        prev_stage = stage;
        if (++stage == kStages) {
            stage = 0;
            ++round;
        }
    }
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
#pragma unroll
    // The fragments stay live until every wgmma is done.
    for (int f = 0; f < kFragments; ++f) wgmma_fence_operands(a[f]);

    // ---- Split blocks: the cluster sums its partial tiles in the ring, once both warpgroups'
    // wgmmas are done reading it. ----
    if (split > 1) {
        named_barrier_sync<kConsumers * kWarpgroupThreads>(kRingFreeBarrier);
        cluster_split_sum(acc, smem, threadIdx.x, rank, split, m0, args.m);
    }

    // ---- Epilogue (as the tc kernel's). Lane (g, t) holds out[rows 2t, 2t + 1] of column g
    // (acc[4j], acc[4j + 1]) and column g + 8 (acc[4j + 2], acc[4j + 3]) of each 8-row block j:
    // store_w4a16_fragment's layout. A split block stores the blocks j it summed. ----
    const auto ep = args.epilogue_of<T, kMode>();
    const bool odd = g & 1;
    const int64_t col = n0 + c * kWgmmaM + w * 2 * kPackRows + (g & ~1);  // the pairs' first
    float bv[4];  // the bias of columns col, col + 1, col + 8, col + 9
#pragma unroll
    for (int i = 0; i < 4; ++i)
        bv[i] = !grouped_rows(kMode) ? ep.bias_at(col + (i & 1) + 8 * (i >> 1)) : 0.f;
    const typename decltype(ep)::Column cols[2] = {ep.column(col), ep.column(col + 8)};
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
        if ((j & owner_mask) != rank) continue;
        const int64_t row = m0 + 8 * j + 2 * t + (odd ? 1 : 0);
        store_w4a16_fragment<T, kMode>(ep, args.out, args.m, args.n, mr, row, col, g, odd,
                                       acc + 4 * j, bv, cols);
    }
#endif  // CK_SM90A_DEVICE
}

// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------
// One block per kBM x 128 output tile, or one cluster of `split` blocks (each a share of K).
template <class Tile, typename T, class Format, bool kAsym, int kMode>
cudaError_t launch_wgmma(const GemmW4A16Args& a, const CUtensorMap& map_x,
                         const CUtensorMap& map_w, const MoeRows& rows, int split,
                         cudaStream_t stream) {
    constexpr bool kCanSplit = !grouped_rows(kMode);
    if (!split_allowed(split, kCanSplit ? kMaxSplit : 1)) return cudaErrorInvalidValue;
    const int64_t blocks = output_tiles(a.m, a.n, Tile::kBM, kBN) * split;
    if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
    auto kernel = split > 1 ? gemm_w4a16_wgmma_kernel<Tile, T, Format, kAsym, kMode, kCanSplit>
                            : gemm_w4a16_wgmma_kernel<Tile, T, Format, kAsym, kMode, false>;
    static std::atomic<uint64_t> opted_in_whole{0}, opted_in_split{0};
    const cudaError_t e = allow_dynamic_smem_once(kernel, Tile::kSmemBytes,
                                                  split > 1 ? opted_in_split : opted_in_whole);
    if (e != cudaSuccess) return e;
    const ClusterLaunch launch(blocks, split, Tile::kSmemBytes, stream, /*dependent=*/true);
    return cudaLaunchKernelEx(&launch.config, kernel, map_x, map_w, a, wgmma_groups(a.group_shift),
                              rows, split);
}

// The tensor maps of a call: x [m rows][k] 16-bit values, boxes of box_rows (the tile's kBM)
// rows x 64 k (one 128-byte swizzle row each); the prepacked weight as bytes, (128 bytes, 4 rows
// per tile and chunk along a tile row's chunks, `tiles` tiles) with strides 128 and chunks * 512,
// a box one chunk of 16 tiles. tiles: the weight's tiles8, or all experts' (grouped).
cudaError_t make_wgmma_maps(const GemmW4A16Args& args, int box_rows, int64_t tiles,
                            CUtensorMap* map_x, CUtensorMap* map_w) {
    if (args.m > INT32_MAX || args.k > INT32_MAX || tiles > INT32_MAX ||
        args.chunks > INT32_MAX / kTileRows128)
        return cudaErrorNotSupported;
    const cudaError_t err = make_tensor_map_2d(map_x, CU_TENSOR_MAP_DATA_TYPE_UINT16, args.x,
                                               args.m, args.k, args.k * 2, box_rows, kSwizzleK,
                                               CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
    const int64_t dims[3] = {kSwizzleBytes, kTileRows128 * args.chunks, tiles};
    const int64_t strides[2] = {kSwizzleBytes, args.chunks * kPackTileBytes};
    const int box[3] = {kSwizzleBytes, kTileRows128, kTiles};
    return make_tensor_map_3d(map_w, CU_TENSOR_MAP_DATA_TYPE_UINT8, args.w, dims, strides, box,
                              CU_TENSOR_MAP_SWIZZLE_128B);
}

// Whether blocks of 256 x rows beat blocks of 128 on an m x n output: each SM runs
// ceil(blocks / SMs) blocks in turn, a wide one taking wide_cost times as long per row (one
// dequantized A fragment feeds twice the multiply-adds); ties stay narrow.
constexpr double kWideRowCost = 0.85;  // INT4: 0.69-0.78 measured on the H100 (benchmarks/NOTES.md)
// The block formats' dequantization costs more per weight, so the wide block's halving of it
// per row is worth more: 0.70-0.75 measured on the H200 (8192 x 10240, 512 rows; INT4 0.87).
constexpr double kBlock4WideRowCost = 0.72;
template <class Format> constexpr double wide_row_cost() {
    return std::is_same_v<Format, Int4Zp> ? kWideRowCost : kBlock4WideRowCost;
}
bool wgmma_wide_pays(int64_t m, int64_t n, double wide_cost) {
    return busiest_sm_rows(m, n, WgmmaWide::kBM, kBN) * wide_cost <
           busiest_sm_rows(m, n, WgmmaNarrow::kBM, kBN);
}

// How many blocks of `split`-block clusters of Tile's kernel the GPU runs at once (cached).
template <class Tile> int tile_cluster_blocks(int split) {
    static ClusterOccupancyCache cache;
    return cluster_blocks(gemm_w4a16_wgmma_kernel<Tile, __half, Int4Zp, false, kMoeDense, true>,
                          Tile::kSmemBytes, split, cache);
}

// The plan of a call: the block's x rows (64 for m <= 64; above, 128 or 256 by
// wgmma_wide_pays) and the blocks that share each output tile's K: the largest split of 2, 4 or
// 8 whose blocks all run at once and still get kMinSplitChunks chunks each (a split block pays
// its pipeline's fill and the sum in distributed shared memory), else 1.
// CK_GEMM_W4A16_WGMMA_ROWS (64, 128, 256) and CK_GEMM_W4A16_WGMMA_SPLIT (1, 2, 4, 8) decide
// instead.
struct WgmmaPlan {
    int rows, split;
};
constexpr int kMinSplitChunks = 4;

template <class Tile> int wgmma_split(int64_t m, int64_t n, int64_t chunks) {
    return plan_split("CK_GEMM_W4A16_WGMMA_SPLIT", output_tiles(m, n, Tile::kBM, kBN), chunks,
                      kMinSplitChunks,
                      tile_cluster_blocks<Tile>);
}

WgmmaPlan plan_wgmma(int64_t m, int64_t n, int64_t chunks, double wide_cost) {
    int rows = forced_plan_value("CK_GEMM_W4A16_WGMMA_ROWS", {64, 128, 256});
    if (rows == 0)
        rows = m <= kWgmmaShortRows ? kWgmmaShortRows
               : wgmma_wide_pays(m, n, wide_cost) ? kWgmmaWideRows : kWgmmaNarrowRows;
    const int split = rows == kWgmmaShortRows    ? wgmma_split<WgmmaShort>(m, n, chunks)
                      : rows == kWgmmaNarrowRows ? wgmma_split<WgmmaNarrow>(m, n, chunks)
                                                 : wgmma_split<WgmmaWide>(m, n, chunks);
    return {rows, split};
}

}  // namespace

bool gemm_w4a16_wgmma_available() { return tma_wgmma_built_and_runnable(); }

// ---------------------------------------------------------------------------------------------
// Launcher (arguments validated by cuda_kernels.cu; the variant's predicate also asks m, k and
// tiles8 below 2^31, which TMA's 32-bit coordinates need, and checked again here).
// ptxas (CUDA 13.0, sm_90a, 384 threads: 168 registers, the consumers raised to 232 by
// setmaxnreg; the 64-row tile at 2 blocks per SM: 80, the consumers raised to 104, which its
// asymmetric kernels need: at 96 they spilled 16 bytes): no spills, no wgmma serialization for
// any tile (C7512, "insufficient register
// resources", and spills while the 256-row tile had 288 threads and no setmaxnreg; C7514 until
// the accumulators were fenced around each stage, wgmma_fence_operands; C7513 while the scales'
// slice-to-group selects sat between the wgmmas: ChunkScales keeps them per slice).
// ---------------------------------------------------------------------------------------------
namespace {

// A plain or fused Q/K/V call on a weight of one format: the plan, the maps, the launch.
template <class Format, bool kAsym>
cudaError_t run_wgmma(const GemmW4A16Args& args, cudaStream_t stream) {
    const WgmmaPlan plan = plan_wgmma(args.m, args.n, args.chunks, wide_row_cost<Format>());
    CUtensorMap map_x, map_w;
    const cudaError_t err = make_wgmma_maps(args, plan.rows, args.tiles8, &map_x, &map_w);
    if (err != cudaSuccess) return err;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.qkv.q != nullptr, [&](auto qkv_tag) {
            constexpr int kMode = decltype(qkv_tag)::value ? kQkvRows : kMoeDense;
            const MoeRows none{};
            switch (plan.rows) {
            case kWgmmaShortRows:
                return launch_wgmma<WgmmaShort, T, Format, kAsym, kMode>(args, map_x, map_w, none,
                                                                         plan.split, stream);
            case kWgmmaWideRows:
                return launch_wgmma<WgmmaWide, T, Format, kAsym, kMode>(args, map_x, map_w, none,
                                                                        plan.split, stream);
            default:
                return launch_wgmma<WgmmaNarrow, T, Format, kAsym, kMode>(args, map_x, map_w,
                                                                          none, plan.split,
                                                                          stream);
            }
        });
    });
}

}  // namespace

cudaError_t gemm_w4a16_prepacked_wgmma(const GemmW4A16Args& args, cudaStream_t stream) {
    if (args.m < 1 || !args.prepacked || !gemm_w4a16_wgmma_available())
        return cudaErrorNotSupported;
    return args.zeros ? run_wgmma<Int4Zp, true>(args, stream)
                      : run_wgmma<Int4Zp, false>(args, stream);
}

// Block 4-bit weights (gemm_block4.cuh): the same kernel with the format's Dequant, its scale
// units where the INT4 scales sit, no zero points.
cudaError_t gemm_block4_prepacked_wgmma(const GemmW4A16Args& args, ck_block4_format_t format,
                                        cudaStream_t stream) {
    if (args.m < 1 || !args.prepacked || args.zeros || !gemm_w4a16_wgmma_available())
        return cudaErrorNotSupported;
    switch (format) {
        case CK_BLOCK4_NF4: return run_wgmma<Nf4, false>(args, stream);
        case CK_BLOCK4_MXFP4: return run_wgmma<Mxfp4, false>(args, stream);
        case CK_BLOCK4_NVFP4: return run_wgmma<Nvfp4, false>(args, stream);
        default: return cudaErrorInvalidValue;  // the entry point rejects these earlier
    }
}

// Expert-grouped: x holds the sorted rows themselves (row_blocks * block_rows of them; the
// caller gathers the tokens' rows for kMoeSwiGLU), the weight map spans every expert's tiles,
// and each block finds its expert in rows.block_expert.
cudaError_t gemm_w4a16_prepacked_wgmma_grouped(const GemmW4A16Args& args, MoeMode mode,
                                               const MoeRows& rows, int block_rows,
                                               int64_t row_blocks, int64_t experts,
                                               cudaStream_t stream) {
    if (!args.prepacked || !gemm_w4a16_wgmma_available() || !grouped_rows(mode))
        return cudaErrorNotSupported;
    const bool wide = block_rows == kWgmmaWideRows;
    if ((!wide && block_rows != kWgmmaNarrowRows) || row_blocks < 1 || experts < 1 ||
        args.tiles8 > INT32_MAX / experts)
        return cudaErrorInvalidValue;
    GemmW4A16Args a = args;
    a.m = row_blocks * block_rows;
    CUtensorMap map_x, map_w;
    const cudaError_t err = make_wgmma_maps(a, block_rows, a.tiles8 * experts, &map_x, &map_w);
    if (err != cudaSuccess) return err;
    return dispatch_half_dtype(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(a.zeros != nullptr, [&](auto asym_tag) {
            constexpr bool kAsym = decltype(asym_tag)::value;
            return with_bool(wide, [&](auto wide_tag) {
                using Tile = std::conditional_t<decltype(wide_tag)::value, WgmmaWide, WgmmaNarrow>;
                return mode == kMoeSwiGLU
                           ? launch_wgmma<Tile, T, Int4Zp, kAsym, kMoeSwiGLU>(a, map_x, map_w,
                                                                             rows, 1, stream)
                           : launch_wgmma<Tile, T, Int4Zp, kAsym, kMoeWeighted>(a, map_x, map_w,
                                                                               rows, 1, stream);
            });
        });
    });
}

}  // namespace ck
