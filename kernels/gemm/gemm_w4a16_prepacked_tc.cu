// gemm_w4a16_tc.cu - the tensor-core W4A16 GEMM on the prepacked weight (the M > 16 path of
// ck_gemm_w4a16_prepacked; it serves any M >= 1).
//
// What it computes (the same bits as ck_dequantize_int4 followed by a float GEMM):
//   w'[n][k] = round_to_dtype(float(q - zero) * float(scale[n][group(k)]))
//   out[m][n] = round_to_dtype(act(sum_k float(x[m][k]) * float(w'[n][k]) + float(bias[n])))
// with mma.sync m16n8k16 (fp16 or bf16 in, float32 accumulators): the sum runs in float32 in
// an order of its own, w' is rounded exactly as ck_dequantize_int4 rounds it (Dequant<Int4Zp>, core/dequant.cuh).
//
// Layout: x [M, K] dtype row-major (16-byte aligned, K % 32 == 0); bias [N] dtype or nullptr;
// out [M, N] dtype (2-byte aligned only; rows and columns outside [M, N) are never written).
// The weight is prepacked (gemm/w4a16_prepacked.cuh): 512-byte tiles of 8 rows x 128 k, tile
// (i, c) at (i * chunks + c) * 512; lane l = 4g + s of a warp owns the 16 bytes at l * 16: row
// g, k slice 32s .. 32s + 31, as four words, and the INT4 dequantizer (Dequant<Int4Zp>) turns word i into the pairs that
// match x's 32-bit words 4i .. 4i + 3 of the same slice. Rows are padded to a multiple of 8 and
// k to a multiple of 128 with codes equal to the zero point; scales (zeros) are
// [ceil(N / 8)][groups][8], 16 (8) contiguous bytes per tile and group, scale 0 on padding rows.
// Codes are unsigned: zeros == nullptr means symmetric with zero point 8.
//
// Algorithm: block tiles kBM x kBN (x rows x output columns), K in chunks of 128 (one
// prepacked tile column per pipeline stage). A kStages-deep cp.async ring holds per stage the
// x tile [kBM][128] (XOR-swizzled), the block's kBN / 8 weight tiles (512 bytes each, vectors
// permuted) and their scales (+ zeros); one __syncthreads per stage. The mma computes out^T
// (weight as A, x as B, see "Operand roles"). Each warp owns 64 x rows x 64 columns (8 x 4
// fragments, 128 accumulators) and the chunk's four 32-bit weight words, or a half or a quarter
// of them when kWarpsK warps split the chunk; it dequantizes each word once (Dequant<Int4Zp>: 4
// packed pairs) and feeds it to its 8 x fragments: 8 mma per dequantized word. K-split warps
// add their partial tiles through shared memory at the end; then bias, activation, one
// rounding, store (rows and columns outside [M, N) never written).
//
// Floors: bytes = M*K*2 + N*K/2 + N*groups*(2 [+1 with zeros]) + M*N*2; flops = 2*M*N*K.
//   H100 SXM: ~3.0 TB/s copy bandwidth; mma.sync f16/bf16 reaches ~660 TFLOP/s of the 989 dense
//   peak (benchmarks/NOTES.md; only wgmma gets near the peak). (K, N) = (4096, 14336): the weight is
//   29.4 MB -> 9.8 us; M = 128 -> 15.0 GFLOP -> 22.8 us at 660; M = 1024 -> 120 GFLOP ->
//   182 us at 660 (122 us at 989). cuBLAS on the dequantized fp16 weight reads 4x the weight
//   bytes: for M <= ~128 it is bandwidth-bound (39 us here) while this kernel is not.
#include <atomic>

#include "kernels/core/dequant.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/core/mma_pipeline.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"

namespace ck {
namespace {

// The sm_80 kernel body compiles for every target; below sm_80 (and in the host pass) the PTX
// wrappers are empty and the kernel traps at entry.
constexpr bool kHasSm80 = CK_SM80;


// ---------------------------------------------------------------------------------------------
// Shared-memory layout of one stage, and why.
//
// x tile: [kBM rows][128 k] of 16-bit values = 256 bytes (16 units of 16 bytes) per row. The
//   mma B fragment of word step w (below) wants, in lane (g, t) (g = lane / 4, t = lane % 4),
//   the 16 bytes of row g of an 8-row x fragment at k 32t + 8w .. + 7, i.e. unit 4t + w: one
//   ld.shared.v4 gives b0 b1 of two k16 steps, each pair already in aligned registers
//   (ldmatrix cannot: it spreads a 16-byte row over 4 lanes). Unit u of row r is stored at
//   unit u ^ key(r), key(r) = 4 (r & 1) + (r & 2) (x_swizzle_key). Why conflict-free: a v4 load
//   is served in 4 phases of 8 lanes, lanes 8p .. 8p + 7 = (g in {2p, 2p + 1}, t = 0..3), and a
//   row is 256 bytes, so only the unit's bank group (unit mod 8) matters. Lanes read unit
//   4t + (i ^ t) at word step i (the word order below): for one g the low three bits
//   ((t & 1) << 2 | (i ^ t)) take 4 distinct values (the low two bits alone do), and the keys
//   of rows 2p and 2p + 1 differ in bit 2 only, which maps those 4 values onto the other 4:
//   8 distinct bank groups. Writes: thread 2r + h copies the logical units 2s + h of row r
//   (s < 8; 8 consecutive threads = rows 4q .. 4q + 3, both halves); their bank groups
//   (2s ^ key(r)) + h differ in h (bit 0) and key(r) (bits 1, 2: 0, 4, 2, 6): 8 distinct.
// weight: the block's kBN / 8 tiles, 512 bytes each. A warp reads one 32-bit word (word step w)
//   per lane and n8 tile: lane l = 4g + t's 16-byte unit is stored at 4g + (t ^ (g >> 1))
//   and the lane reads word i ^ t of it: bank = 16 (g & 1) + 4 (t ^ (g >> 1)) + (i ^ t),
//   which determines (g, t) (t from the low two bits, g >> 1 from the next two, g & 1 from
//   bit 4): 32 distinct banks. (Without the permutation, four lanes share each
//   16-byte bank group and a 32-bit load would be a 4-way conflict; a whole-vector load would
//   cost 4 registers per n8 tile and chunk instead of 1 per word.) Writes: a thread copies
//   kWLoads consecutive vectors of one tile; 8 consecutive threads cover 8 vectors of one
//   tile with distinct rows g or slices t, which the permutation sends to 8 bank groups.
// scales: [kBN / 8 tiles][4 groups][8 rows] dtype (16 bytes per group, as in global memory);
//   lane (g, t) of tile i reads the scale of row g in the group of its k slice t: unit
//   t >> slice_shift (group size 32: t; 64: t / 2; 128 or one per row: 0). Zeros likewise,
//   [tiles][4][8] bytes.
//
// Word order: the four words of a lane's slice (k 8w .. 8w + 7 each) are visited in the order
// w = i ^ t, i = 0..3. That is exact: the order of the sum over k is free as long as A and B
// agree, and both operands of lane column t take word i ^ t of slice t, so the mma-k -> k
// bijection depends on t only (what the mma requires: all lanes with the same t feed the same
// mma k, in A for every row and in B for every column). With XOR, step i's shared-memory
// offsets are step 0's XOR an immediate (x unit 4t + (i ^ t) = (5t) ^ i).
// Operand roles: the mma computes out^T. A (16 x 16) is the dequantized weight of two n8
// tiles (rows 0-7: tile 2f, rows 8-15: tile 2f + 1), B (16 x 8) is 8 rows of x. So an A quad is
// made of fresh dequantized pairs and a B pair is half of an ld.shared.v4 result: no
// register moves (x as A would need its rows g and g + 8 interleaved: 4 moves per mma).
// Word step: p = the dequantized word w of tile 2f and p' (tile 2f + 1) hold the pairs
// (k 8w + 2j, + 1), j < 4 = x's words 4w + j of the lane's slice; the x load gives
// X_g[4w .. 4w + 3]. Two k16 mma steps:
//   a0 a1 a2 a3 = p[0], p'[0], p[1], p'[1];  b0 b1 = X_g[4w], X_g[4w + 1]
//   a0 a1 a2 a3 = p[2], p'[2], p[3], p'[3];  b0 b1 = X_g[4w + 2], X_g[4w + 3]
// The accumulators come out transposed: c0 c1 = out[x rows 2t, 2t + 1][column g of tile 2f],
// c2 c3 = the same for tile 2f + 1. One shuffle with the neighbour lane (g ^ 1) per two values
// makes pairs of adjacent columns for the stores (even g: row 2t, odd g: row 2t + 1).
// ---------------------------------------------------------------------------------------------
constexpr int kUnitBytes = 16;                     // one cp.async.cg, one ld.shared.v4
constexpr int kXRowBytes = kPackK * 2;             // 256: a row of a 128-k chunk of x
constexpr int kXUnits = kXRowBytes / kUnitBytes;   // 16
constexpr int kXUnitElems = kUnitBytes / 2;        // 8 x values per unit
constexpr int kWordK = 8;                          // k per 32-bit weight word
constexpr int kWords = kPackSliceK / kWordK;       // 4 words per lane slice and chunk
constexpr int kGroupUnits = kPackK / 32;           // 4: groups a chunk can touch (size 32)
constexpr int kScaleUnitBytes = kPackRows * 2;     // 16: a tile's 8 scales of one group
constexpr int kZeroUnitBytes = kPackRows;          // 8
constexpr int kMmaM = 16, kMmaN = 8;              // m: weight rows (2 tiles), n: x rows
constexpr int kFragBytes = 32 * 16;                // one float4 per lane: an m16n8 accumulator
constexpr int kGroupM = 8;                         // tile rows per rasterization group
static_assert(kPackRows == kMmaN, "an n8 tile is a prepacked tile");
static_assert(kXUnits == 16 && kWords == 4, "the swizzles above assume 16 x units and 4 words");

// A block configuration: kBM x kBN outputs, warps in a kWarpsM x kWarpsN grid of 64 x 64 warp
// tiles, each grid cell kWarpsK warps deep (they split the 4 words of every chunk).
template <int kBM_, int kBN_, int kWarpsM_, int kWarpsN_, int kWarpsK_, int kStages_,
          int kMinBlocks_>
struct TcTile {
    static constexpr int kBM = kBM_, kBN = kBN_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
    static constexpr int kWarpsK = kWarpsK_, kStages = kStages_, kMinBlocks = kMinBlocks_;
    static constexpr int kWarps = kWarpsM * kWarpsN * kWarpsK;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;
    static constexpr int kFX = kWarpM / kMmaN;   // x fragments (mma n8) per warp
    static constexpr int kFW = kWarpN / kMmaM;   // weight fragments (mma m16: 2 tiles) per warp
    static constexpr int kSteps = kWords / kWarpsK;                   // word steps per chunk
    static constexpr int kTiles = kBN / kPackRows;                    // n8 tiles per block
    static constexpr int kXBytes = kBM * kXRowBytes;
    static constexpr int kWBytes = kTiles * kPackTileBytes;
    static constexpr int kScaleBytes = kTiles * kGroupUnits * kScaleUnitBytes;
    static constexpr int kZeroBytes = kTiles * kGroupUnits * kZeroUnitBytes;
    static constexpr int kXThreadsPerRow = kThreads / kBM;
    static constexpr int kXLoads = kXBytes / kUnitBytes / kThreads;  // cp.async per thread
    static constexpr int kWLoads = kWBytes / kUnitBytes / kThreads;
    static constexpr int kGroupSlots = kTiles * kGroupUnits;         // one thread each
    // K-split partial tiles: each warp owns kFX / kWarpsK of its x fragments and receives them
    // from the kWarpsK - 1 others.
    static constexpr int kReduceBytes = kWarpsM * kWarpsN * kFX * (kWarpsK - 1) * kFW * kFragBytes;

    static constexpr int stage_bytes(bool asym) {
        return kXBytes + kWBytes + kScaleBytes + (asym ? kZeroBytes : 0);
    }
    static constexpr int smem_bytes(bool asym) {
        return kStages * stage_bytes(asym) > kReduceBytes ? kStages * stage_bytes(asym) : kReduceBytes;
    }


    static_assert(kWarpM % kMmaN == 0 && kWarpN % kMmaM == 0, "whole fragments per warp");
    static_assert(kWords % kWarpsK == 0, "the K-split warps share the 4 words of a chunk");
    static_assert(kFX % kWarpsK == 0, "each K-split warp stores the same number of x fragments");
    static_assert(kXBytes % (kUnitBytes * kThreads) == 0 && kWBytes % (kUnitBytes * kThreads) == 0,
                  "every thread issues the same number of cp.async");
    static_assert((kXThreadsPerRow == 2 || kXThreadsPerRow == 4) && kThreads == kXThreadsPerRow * kBM &&
                      kXLoads * kXThreadsPerRow == kXUnits,
                  "x loader: two or four threads per row, each every other (fourth) unit of it");
    static_assert(kWLoads == 2 || kWLoads == 4 || kWLoads == 8,
                  "weight loader: a thread copies vectors 0..kWLoads-1 (XOR-placed) of one or two rows");
    static_assert(kGroupSlots <= kThreads, "one scale (zero) copy per thread at most");
    static_assert(kStages >= 3, "one barrier per stage needs a stage being read, one being "
                                "written and one landing");
    static_assert(stage_bytes(true) % 128 == 0, "stages keep the 128-byte alignment");
};

// The configurations (ptxas figures in the launcher's comment). All use 64 x 64 warp tiles:
// 128 accumulator registers (~230-250 in all), so one block of 8 warps (or two of 4) per SM.
// The dequantization cost per mma falls with the warp's x extent (64 rows: 8 mma per
// dequantized word) and the x shared-memory traffic with its column extent (64 bytes of x
// per mma); 64 x 64 balances the two.
//   Large: 128 x 256, 8 warps 2 x 4, 3 stages (150 KB, 153 KB with zeros; 2 chunks ahead are
//   ~3 us of MMAs, far more than the memory latency).
using TcLarge = TcTile<128, 256, 2, 4, 1, 3, 1>;
//   Mid: 128 x 128, 8 warps 2 x 2, two K-split warps each, 3 stages (123 / 125 KB): twice
//   the blocks of Large, for grids whose last wave Large leaves mostly empty.
using TcMid = TcTile<128, 128, 2, 2, 2, 3, 1>;
//   Small: 64 x 64, 4 warps splitting each chunk by word, 4 stages (82 / 83 KB, two blocks per
//   SM): M <= ~256 with few column tiles, where the bigger tiles leave most SMs idle.
using TcSmall = TcTile<64, 64, 1, 1, 4, 4, 2>;
//   Wide: 64 x 256, 8 warps 1 x 4, two K-split warps each, 5 stages (170 / 175 KB): x read once
//   per 256 columns (Small reads it once per 64): M <= ~256 on wide N.
using TcWide = TcTile<64, 256, 1, 4, 2, 5, 1>;

// The x swizzle: unit u of x row r is stored at unit u ^ x_swizzle_key(r) (see the layout
// comment; the key depends on r % 4, and rows 8f + g of an x fragment keep g's key).
__host__ __device__ constexpr int x_swizzle_key(int r) { return ((r & 1) << 2) | (r & 2); }

// Where lane l = 4g + t's 16-byte vector of a weight tile is stored in shared memory.
__host__ __device__ constexpr int weight_unit(int l) { return 4 * (l / 4) + ((l % 4) ^ (l / 8)); }

// The group layout of a call as the kernel reads it, from the one encoding (group_shift; the
// launcher derives it once, a kernel argument beside the call's):
// group_step groups per 128-k chunk (4, 2, 1 for groups of 32, 64, 128; 0 when a row is one
// group), group_units scale units a chunk uses (at least 1), and lane slice t's unit
// t >> slice_shift.
struct TcGroups {
    int step, units, slice_shift;
};
inline TcGroups tc_groups(int group_shift) {
    if (group_shift > 7) return {0, 1, 2};  // one group per row: every chunk reads group 0
    return {kPackK >> group_shift, kPackK >> group_shift, group_shift - 5};
}

template <class Tile, typename T, bool kAsym, int kMoe>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
gemm_w4a16_tc_kernel(const GemmW4A16Args args, const TcGroups grp, const MoeRows mr) {
    if constexpr (!kHasSm80) __trap();  // never launched below sm_80 (see kHasSm80)
    constexpr int kBM = Tile::kBM, kBN = Tile::kBN, kStages = Tile::kStages;
    constexpr int kFX = Tile::kFX, kFW = Tile::kFW, kWarpsK = Tile::kWarpsK;
    constexpr int kStageBytes = Tile::stage_bytes(kAsym);
    constexpr int kWOffset = Tile::kXBytes;                      // within a stage
    constexpr int kSOffset = kWOffset + Tile::kWBytes;
    constexpr int kZOffset = kSOffset + Tile::kScaleBytes;
    extern __shared__ __align__(128) uint8_t smem[];

    const int64_t m = args.m, n = args.n, k = args.k;
    const int chunks = int(args.chunks);  // the launcher checks it fits
    const int64_t tiles8 = args.tiles8;
    const int groups = int(args.groups);

    // Grouped rasterization: consecutive blocks sweep kGroupM tile rows of one tile column, so
    // that the weight tiles (and x rows) they share are still in L2. Expert-grouped (kMoe):
    // blockIdx.y is the block of sorted rows (its expert's weight), blockIdx.x the tile column.
    int64_t m0, n0;
    const uint8_t* w_src = args.w;  // expert 0's weight, or the block's expert's
    const uint16_t* scales = static_cast<const uint16_t*>(args.scales);
    const uint8_t* z_src = args.zeros;
    if constexpr (!grouped_rows(kMoe)) {
        const TileOrigin tile = grouped_tile(blockIdx.x, m, n, kBM, kBN, kGroupM);
        m0 = tile.m0, n0 = tile.n0;
    } else {
        const int expert = mr.block_expert[blockIdx.y];
        if (expert < 0) return;  // past the used rows: the whole block leaves
        m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
        w_src += expert * mr.w_expert_bytes;
        scales += expert * mr.s_expert_values;
        if constexpr (kAsym) z_src += expert * mr.s_expert_values;
    }
    const int64_t tile0 = n0 / kPackRows;  // first weight tile of the block

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int warp_k = warp % kWarpsK, warp_mn = warp / kWarpsK;
    const int wm = warp_mn / Tile::kWarpsN, wn = warp_mn % Tile::kWarpsN;

    const uint32_t smem_base = shared_address(smem);

    // ---- Loader roles (fixed per thread; see the layout comment) ----
    // x: row x_row (clamped to m - 1: every address stays inside x; the copy of a row past m
    // reads nothing), logical units P s + x_half (P = kXThreadsPerRow, s < 16 / P): global
    // offsets 16 P s bytes, immediates. They land at unit (P s + x_half) ^ key(row) =
    // P s ^ (x_half ^ key(row)): byte x_dst ^ 16 P s within the stage.
    constexpr int kXTpr = Tile::kXThreadsPerRow;
    const int x_row = tid / kXTpr, x_half = tid % kXTpr;
    bool x_row_ok = m0 + x_row < m;
    int64_t x_index = min(m0 + x_row, m - 1);
    if constexpr (grouped_rows(kMoe)) {  // the row's pair: its token's x row, or its sorted row
        const int64_t pair = mr.sorted_ids[m0 + x_row];
        x_row_ok = pair < mr.pairs;
        x_index = !x_row_ok ? 0 : kMoe == kMoeSwiGLU ? pair / mr.x_div : m0 + x_row;
    }
    const T* x_thread = static_cast<const T*>(args.x) + x_index * k + x_half * kXUnitElems;
    const uint32_t x_dst = uint32_t(x_row * kXRowBytes + ((x_half ^ x_swizzle_key(x_row)) * kUnitBytes));
    const int full_chunks = int(k / kPackK);  // chunks with all 128 k inside

    // weight: tile w_tile of the block (clamped to the last tile that exists), units
    // w_unit .. w_unit + kWLoads - 1 of it: consecutive 16-byte vectors of one tile.
    constexpr int kWThreadsPerTile = kPackTileBytes / kUnitBytes / Tile::kWLoads;
    const int w_tile = tid / kWThreadsPerTile, w_unit = tid % kWThreadsPerTile * Tile::kWLoads;
    const bool w_ok = tile0 + w_tile < tiles8;
    const uint8_t* w_thread = w_src + (min(tile0 + w_tile, tiles8 - 1) * chunks * kPackTileBytes +
                                        w_unit * kUnitBytes);
    const uint32_t w_dst = uint32_t(kWOffset + w_tile * kPackTileBytes + weight_unit(w_unit) * kUnitBytes);

    // scales (zeros): slot tid = (tile tid / 4, group unit tid % 4) of the chunk; tile clamped.
    const int s_tile = tid / kGroupUnits, s_unit = tid % kGroupUnits;
    const bool s_active = tid < Tile::kGroupSlots && s_unit < grp.units;
    const bool s_tile_ok = tile0 + s_tile < tiles8;
    const int64_t s_first = (min(tile0 + s_tile, tiles8 - 1) * groups + s_unit) * kPackRows;

    // Issues the copies of chunk kc into stage s. Destinations are XOR-ed within a stage (whose
    // offset is a multiple of 256) and then added to the shared base.
    auto load_stage = [&](int s, int kc) {
        const uint32_t st = uint32_t(s * kStageBytes);
        const T* xs = x_thread + int64_t(kc) * kPackK;
        const uint32_t xd = st + x_dst;  // logical unit P u + x_half lands at xd ^ 16 P u
        if (kc < full_chunks) {
#pragma unroll
            for (int u = 0; u < Tile::kXLoads; ++u)
                cp_async_16_zfill(smem_base + (xd ^ (u * kXTpr * kUnitBytes)), xs + kXTpr * u * kXUnitElems,
                                  x_row_ok);
        } else {
            // The K tail (K % 128 != 0): units at k >= K load zeros, from the chunk's start.
#pragma unroll
            for (int u = 0; u < Tile::kXLoads; ++u) {
                const bool ok = x_row_ok && int64_t(kc) * kPackK + (kXTpr * u + x_half) * kXUnitElems < k;
                cp_async_16_zfill(smem_base + (xd ^ (u * kXTpr * kUnitBytes)),
                                  ok ? xs + kXTpr * u * kXUnitElems : xs, ok);
            }
        }
        const uint8_t* ws = w_thread + int64_t(kc) * kPackTileBytes;
        const uint32_t wd = st + w_dst;  // vector w_unit + j (slice j) lands at wd ^ 16j
#pragma unroll
        for (int j = 0; j < Tile::kWLoads; ++j)
            cp_async_16_zfill(smem_base + (wd ^ (j * kUnitBytes)), ws + j * kUnitBytes, w_ok);
        if (s_active) {
            // Groups past the last (the K tail of group sizes 32 and 64) load as scale 0.
            const bool ok = s_tile_ok && kc * grp.step + s_unit < groups;
            const int64_t idx = s_first + int64_t(kc) * grp.step * kPackRows;
            cp_async_16_zfill(smem_base + st + kSOffset + tid * kScaleUnitBytes,
                              ok ? static_cast<const void*>(scales + idx) : scales, ok);
            if constexpr (kAsym)
                cp_async_ca_zfill<8>(smem_base + st + kZOffset + tid * kZeroUnitBytes,
                                 ok ? static_cast<const void*>(z_src + idx) : z_src, ok);
        }
    };

    // ---- Fragment roles ----
    // Word step i of this warp is step i * kWarpsK + warp_k of the chunk (the two terms have
    // disjoint bits, so + is ^) and visits word w = step ^ t of the lane's slice: x unit
    // 4t + w = (5t ^ step) of row g of each x fragment (swizzled: ^ key(g)), and word w of
    // the lane's weight vector. Offsets: x_base ^ 16 step, w_base ^ 4 step.
    const uint32_t x_base = uint32_t((wm * Tile::kWarpM + g) * kXRowBytes +
                                     ((5 * t) ^ x_swizzle_key(g) ^ warp_k) * kUnitBytes);
    const uint32_t w_base = uint32_t(kWOffset + wn * Tile::kWarpN / kPackRows * kPackTileBytes +
                                     weight_unit(lane) * kUnitBytes + 4 * (t ^ warp_k));
    // The scale (zero) of row g of each of the warp's tiles, in the group of slice t.
    constexpr int kWarpTiles = Tile::kWarpN / kPackRows;
    const int group_unit = t >> grp.slice_shift;
    const uint32_t s_off = uint32_t(kSOffset + (wn * kWarpTiles * kGroupUnits + group_unit) * kScaleUnitBytes + 2 * g);
    const uint32_t z_off = uint32_t(kZOffset + (wn * kWarpTiles * kGroupUnits + group_unit) * kZeroUnitBytes + g);

    float acc[kFW][kFX][4] = {};  // [weight fragment][x fragment]: out^T, see "Operand roles"

    // The MMAs of the stage at byte offset st: this warp's word steps.
    auto compute_stage = [&](uint32_t st) {
        const uint8_t* sp = smem + st;
        uint32_t scale2[kWarpTiles], zero[kWarpTiles];
#pragma unroll
        for (int i = 0; i < kWarpTiles; ++i) {
            const uint32_t s = *reinterpret_cast<const uint16_t*>(sp + s_off + i * kGroupUnits * kScaleUnitBytes);
            scale2[i] = s * 0x10001u;  // the scale in both halves
            zero[i] = kAsym ? uint32_t(sp[z_off + i * kGroupUnits * kZeroUnitBytes]) : kSymmetricZero;
        }
#pragma unroll
        for (int i = 0; i < Tile::kSteps; ++i) {
            const uint32_t x_off = x_base ^ uint32_t(i * kWarpsK * kUnitBytes);
            const uint32_t w_off = w_base ^ uint32_t(i * kWarpsK * 4);
            uint4 xv[kFX];  // X_g[4w .. 4w + 3] of each x fragment
#pragma unroll
            for (int fx = 0; fx < kFX; ++fx)
                xv[fx] = *reinterpret_cast<const uint4*>(sp + x_off + fx * kMmaN * kXRowBytes);
#pragma unroll
            for (int fw = 0; fw < kFW; ++fw) {
                const uint32_t q0 = *reinterpret_cast<const uint32_t*>(sp + w_off + 2 * fw * kPackTileBytes);
                const uint32_t q1 = *reinterpret_cast<const uint32_t*>(sp + w_off + (2 * fw + 1) * kPackTileBytes);
                uint32_t p0[4], p1[4];
                Dequant<Int4Zp, T>::word(q0, {zero[2 * fw], scale2[2 * fw]}, p0);
                Dequant<Int4Zp, T>::word(q1, {zero[2 * fw + 1], scale2[2 * fw + 1]}, p1);
#pragma unroll
                for (int fx = 0; fx < kFX; ++fx) {
                    mma_16x8x16<T>(acc[fw][fx], p0[0], p1[0], p0[1], p1[1], xv[fx].x, xv[fx].y);
                    mma_16x8x16<T>(acc[fw][fx], p0[2], p1[2], p0[3], p1[3], xv[fx].z, xv[fx].w);
                }
            }
        }
    };

    cp_async_pipeline<kStages>(chunks, load_stage,
                               [&](int stage) { compute_stage(uint32_t(stage * kStageBytes)); });

    // ---- K-split: warp_k owns the x fragments fx with fx % kWarpsK == warp_k and receives
    // them from the other kWarpsK - 1 warps of its grid cell (slot r: the sender's rank among
    // them). A fixed order of additions: deterministic. A float4 per lane: conflict-free. ----
    if constexpr (kWarpsK > 1) {
        __syncthreads();  // every warp is done with the pipeline's shared memory
        constexpr int kCellBytes = kFX * (kWarpsK - 1) * kFW * kFragBytes;
        const uint32_t cell = uint32_t(warp_mn * kCellBytes);
        auto slot = [&](int fx, int r, int fw) {
            return cell + uint32_t(((fx * (kWarpsK - 1) + r) * kFW + fw) * kFragBytes + lane * 16);
        };
#pragma unroll
        for (int fx = 0; fx < kFX; ++fx) {
            const int owner = fx % kWarpsK;
            if (owner == warp_k) continue;
            const int r = warp_k < owner ? warp_k : warp_k - 1;
#pragma unroll
            for (int fw = 0; fw < kFW; ++fw)
                *reinterpret_cast<float4*>(smem + slot(fx, r, fw)) =
                    make_float4(acc[fw][fx][0], acc[fw][fx][1], acc[fw][fx][2], acc[fw][fx][3]);
        }
        __syncthreads();
#pragma unroll
        for (int fx = 0; fx < kFX; ++fx) {
            if (fx % kWarpsK != warp_k) continue;
#pragma unroll
            for (int r = 0; r < kWarpsK - 1; ++r)
#pragma unroll
                for (int fw = 0; fw < kFW; ++fw) {
                    const float4 v = *reinterpret_cast<const float4*>(smem + slot(fx, r, fw));
                    acc[fw][fx][0] += v.x;
                    acc[fw][fx][1] += v.y;
                    acc[fw][fx][2] += v.z;
                    acc[fw][fx][3] += v.w;
                }
        }
    }

    // ---- Epilogue. Lane (g, t) holds out[rows 2t, 2t + 1][column g] of tiles 2fw (c0 c1) and
    // 2fw + 1 (c2 c3): store_w4a16_fragment's layout. ----
    const auto ep = args.epilogue_of<T, kMoe>();
    const bool odd = g & 1;
#pragma unroll
    for (int fw = 0; fw < kFW; ++fw) {
        const int64_t col = n0 + wn * Tile::kWarpN + fw * kMmaM + (g & ~1);  // the pairs' first
        float bv[4];  // the bias of columns col, col + 1, col + 8, col + 9
#pragma unroll
        for (int c = 0; c < 4; ++c) bv[c] = !grouped_rows(kMoe) ? ep.bias_at(col + (c & 1) + 8 * (c >> 1)) : 0.f;
        const typename decltype(ep)::Column cols[2] = {ep.column(col), ep.column(col + 8)};
#pragma unroll
        for (int fx = 0; fx < kFX; ++fx) {
            if (fx % kWarpsK != warp_k) continue;  // warp-uniform: the shuffles see every lane
            const int64_t row = m0 + wm * Tile::kWarpM + fx * kMmaN + 2 * t + (odd ? 1 : 0);
            store_w4a16_fragment<T, kMoe>(ep, args.out, m, n, mr, row, col, g, odd, acc[fw][fx],
                                          bv, cols);
        }
    }
}
// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------
// Dense: a 1-D grid of the output tiles. Grouped (kMoe): tile columns x row_blocks.
template <class Tile, typename T, bool kAsym, int kMoe = kMoeDense>
cudaError_t launch_tc(const GemmW4A16Args& a, cudaStream_t stream, const MoeRows& rows = {},
                      int64_t row_blocks = 0) {
    const int64_t col_blocks = ceil_div(a.n, Tile::kBN);
    const int64_t blocks = !grouped_rows(kMoe) ? ceil_div(a.m, Tile::kBM) * col_blocks : col_blocks;
    if (!grid_fits(blocks) || (grouped_rows(kMoe) && (row_blocks < 1 || row_blocks > 65535)))
        return cudaErrorInvalidConfiguration;
    auto kernel = gemm_w4a16_tc_kernel<Tile, T, kAsym, kMoe>;
    constexpr int kSmem = Tile::smem_bytes(kAsym);
    static std::atomic<uint64_t> opted_in{0};
    const cudaError_t e = allow_dynamic_smem_once(kernel, kSmem, opted_in);
    if (e != cudaSuccess) return e;
    const dim3 grid(unsigned(blocks), !grouped_rows(kMoe) ? 1u : unsigned(row_blocks));
    kernel<<<grid, Tile::kThreads, kSmem, stream>>>(a, tc_groups(a.group_shift), rows);
    return cudaGetLastError();
}

// Relative throughput of one SM running each configuration (output elements per unit time,
// Large = 1): estimates, to be tuned on a GPU. Mid pays for the K-split reduction and twice the
// x traffic per weight byte; Small for four warps per block, a barrier per 64 MMAs per warp and
// four times the x traffic.
constexpr double kLargeRate = 1.0, kMidRate = 0.95, kSmallRate = 0.8;
constexpr double kWideRate = 0.9;

// A block's fixed cost (pipeline fill, K-split reduction, epilogue), in chunks.
constexpr double kFillChunks = 2.0;

// Predicted time of a configuration, in units of one SM's time for one element and chunk: the
// busiest SM runs ceil(blocks / SMs) blocks (co-resident blocks share its throughput), each
// chunks long plus its fixed cost.
template <class Tile> double tc_cost(int64_t m, int64_t n, int64_t chunks, int64_t sms, double rate) {
    const int64_t blocks = ceil_div(m, Tile::kBM) * ceil_div(n, Tile::kBN);
    return double(ceil_div(blocks, sms)) * double(Tile::kBM) * double(Tile::kBN) *
           (double(chunks) + kFillChunks) / rate;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launcher (arguments validated by cuda_kernels.cu)
//
// Configuration choice: the cheapest by tc_cost among those whose shared memory the device
// allows (Small always fits: 83 KB). E.g. (K, N) = (4096, 4096): M = 64..256 Small, M = 1024
// Large (128 blocks);
// N = 14336: M = 64 Small, M = 128 Mid (112 blocks), M = 256 Large, M = 1024 Mid (896 blocks,
// 6.8 waves, where Large's 448 make 3.4); (8192, 28672): M = 64 Wide (112 blocks), M >= 128
// Large. ptxas (CUDA 13, no spills): 228-254 registers for every configuration. Main loop on
// sm_90 (full chunks), non-mma instructions per mma: fp16 Large 2.9, Mid 3.3, Small 4.0; bf16
// 3.1 / 3.5 / 4.2; most of it is the dequantization (8 mma per word). The rates are estimates;
// the picks were checked on the GPU for the benchmark's (K, N) shapes (benchmarks/NOTES.md).
// ---------------------------------------------------------------------------------------------
cudaError_t gemm_w4a16_prepacked_tc(const GemmW4A16Args& args, cudaStream_t stream) {
    if (args.m < 1 || !args.prepacked || compute_capability() < 80) return cudaErrorNotSupported;
    // Chunk and group indices are 32-bit in the kernel: K < 2^38.
    if (prepacked_chunks(args.k) > INT32_MAX / kGroupUnits) return cudaErrorInvalidValue;
    const int chunks = int(args.chunks);

    const int64_t sms = std::max(sm_count(), 1);
    const int smem_limit = max_smem_optin();
    const bool asym = args.zeros != nullptr;
    enum class Pick { kLarge, kMid, kSmall, kWide } pick = Pick::kSmall;
    double best = -1;
    auto consider = [&](auto tile_tag, Pick p, double rate) {
        using Tile = decltype(tile_tag);
        if (Tile::smem_bytes(asym) > smem_limit) return;
        const double c = tc_cost<Tile>(args.m, args.n, chunks, sms, rate);
        // Ties go to Large (listed last).
        if (best < 0 || c < best || (p == Pick::kLarge && c <= best)) best = c, pick = p;
    };
    consider(TcSmall{}, Pick::kSmall, kSmallRate);  // always fits (83 KB)
    consider(TcMid{}, Pick::kMid, kMidRate);
    consider(TcWide{}, Pick::kWide, kWideRate);
    consider(TcLarge{}, Pick::kLarge, kLargeRate);
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(asym, [&](auto asym_tag) {
            constexpr bool kAsym = decltype(asym_tag)::value;
            return with_bool(args.qkv.q != nullptr, [&](auto qkv_tag) {
                constexpr int kMode = decltype(qkv_tag)::value ? kQkvRows : kMoeDense;
                switch (pick) {
                    case Pick::kLarge: return launch_tc<TcLarge, T, kAsym, kMode>(args, stream);
                    case Pick::kMid: return launch_tc<TcMid, T, kAsym, kMode>(args, stream);
                    case Pick::kWide: return launch_tc<TcWide, T, kAsym, kMode>(args, stream);
                    default: return launch_tc<TcSmall, T, kAsym, kMode>(args, stream);
                }
            });
        });
    });
}

int gemm_w4a16_tc_grouped_rows(int64_t rows_per_expert) {
    return rows_per_expert <= 64 ? TcWide::kBM : TcLarge::kBM;
}

cudaError_t gemm_w4a16_prepacked_tc_grouped(const GemmW4A16Args& args, MoeMode mode,
                                            const MoeRows& rows, int block_rows,
                                            int64_t row_blocks, cudaStream_t stream) {
    if (compute_capability() < 80) return cudaErrorNotSupported;
    if (prepacked_chunks(args.k) > INT32_MAX / kGroupUnits) return cudaErrorInvalidValue;
    const bool asym = args.zeros != nullptr;
    const bool wide = block_rows == TcWide::kBM;
    if (!wide && block_rows != TcLarge::kBM) return cudaErrorInvalidValue;
    if ((wide ? TcWide::smem_bytes(asym) : TcLarge::smem_bytes(asym)) > max_smem_optin())
        return cudaErrorNotSupported;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(asym, [&](auto asym_tag) {
            constexpr bool kAsym = decltype(asym_tag)::value;
            if (mode == kMoeSwiGLU)
                return wide ? launch_tc<TcWide, T, kAsym, kMoeSwiGLU>(args, stream, rows, row_blocks)
                            : launch_tc<TcLarge, T, kAsym, kMoeSwiGLU>(args, stream, rows, row_blocks);
            return wide ? launch_tc<TcWide, T, kAsym, kMoeWeighted>(args, stream, rows, row_blocks)
                        : launch_tc<TcLarge, T, kAsym, kMoeWeighted>(args, stream, rows, row_blocks);
        });
    });
}

}  // namespace ck
