// gemm_w4a16_stream.cu - the weight-streaming W4A16 GEMM for M <= 16 (decode) on the prepacked
// weight layout: fp16/bf16 x times a prepacked int4 weight dequantized in registers, float32
// accumulation on mma.sync m16n8k16, fused bias + activation, one rounding to dtype.
//
// What it computes (exactly what gemm_w4a16_small_m computes on the interchange layout):
//   w'[n][k] = round_to_dtype(float(u - zero) * float(scale[n][k >> group_shift]))
//   out[m][n] = round_to_dtype(act(sum_k float(x[m][k]) * float(w'[n][k]) + float(bias[n])))
// u is the unsigned 4-bit code (symmetric codes are stored biased by 8, with zero point 8).
// Rows and columns outside [m, n) are never written.
//
// Layout (ck_w4a16_prepack, gemm/w4a16_prepacked.cuh): the weight is 512-byte tiles of
// 8 rows x 128 k, tile (i, c) at (i * chunks + c) * 512; lane l = 4g + s of a warp reads the
// 16 bytes at l * 16 (row g, k slice 32s .. 32s + 31 of the chunk). Rows are padded to a multiple
// of 8 and k to a multiple of 128 with the zero point, so every chunk < prepacked_chunks(k) of
// every tile < ceil(n / 8) can be read without guards. Scales [ceil(n / 8)][groups][8] dtype,
// zeros the same shape uint8 (nullptr: symmetric, zero point 8). x [m, k], out [m, n] row-major.
//
// Algorithm. A block owns kTiles n8 tiles (a "tile group", 8 * kTiles output columns) at a time
// and walks the tile groups blockIdx.x, blockIdx.x + gridDim.x, ... (one or two blocks per SM:
// stream_blocks_per_sm); its warps split K, warp w taking chunks w, w + warps, ... Each warp owns a
// ring of `stages` (kStages, kGroupedStages) stages in shared memory. Per step (one chunk of
// all kTiles tiles) every lane cp.async's its 16-byte weight vector of each tile (cp.async.cg)
// and its 64 bytes of x row g (and g + 8) at the same 32 k
// (cp.async.ca: every tile group of every block reads x again; m = 1: one vector of row 0 on
// each of lanes 0..15), and a few lanes copy each tile's scales and zero points of the chunk
// (ScalePieces, cp.async.ca) for every lane to read. So the main loop needs only
// cp.async.wait_group and a __syncwarp per step: no __syncthreads, and the weight bytes in
// flight are the ring's, not registers (gemm_w4a16_small_m holds one step in registers: ~225
// registers, 8 warps per SM, too few bytes in flight). The ring runs on across tile groups; at the
// end of each group the warps add their partial accumulators through shared memory in a fixed order
// (deterministic) and store the group's [m, 8 * kTiles] slice: bias, activation, one rounding.
//
// Fragments. the INT4 dequantizer (Dequant<Int4Zp>) turns word i of a lane's vector into pairs p[j] = (k 8i + 2j,
// 8i + 2j + 1) of its slice: exactly x's 32-bit words 4i + j of the same slice (two 16-bit values
// per word, lower k in the low half). The mma runs transposed, out^T[n][m] = w'[n][k] x^T[k][m]:
// A (16 x k16) is a pair of tiles (A rows g and g + 8 = row g of tiles 2q and 2q + 1), B (k16 x 8)
// is 8 rows of x as columns. For word i and h = 0, 1: a0, a1 = p[2h] of tiles 2q, 2q + 1,
// a2, a3 = p[2h + 1] of the same; b0, b1 = x words 4i + 2h, 4i + 2h + 1 of row g. Per the
// m16n8k16 fragment layout (ptx.cuh), lane column t = s then sees mma-k {2t, 2t + 1} as physical
// k 32t + 8i + 4h + {0, 1} and mma-k {2t + 8, 2t + 9} as 32t + 8i + 4h + {2, 3} in both A and B;
// that map depends on t, i and h only, and over them it is a bijection onto the chunk's 128 k,
// so the sum is the same sum over k. Why transposed: the dequantized pairs land straight in A
// registers and (b0, b1) is an aligned half of one 16-byte shared load of x, so no operand needs
// a register move (with x as A, rows g and g + 8 of x interleave word by word in the A registers:
// ~6 moves per weight vector in SASS), and for m <= 8 one mma serves two tiles (half the mma).
// C: c0, c1 = (row g of tile 2q; x rows 2t, 2t + 1), c2, c3 = (row g of tile 2q + 1; the same).
//
// Floors: bytes = weight N8 * K128 / 2 + scales N8 * groups * 2 (+ zeros N8 * groups) + x M*K*2
// + out M*N*2 (+ bias N*2); time >= bytes / copy bandwidth (H100 SXM ~3.0 TB/s): N=28672
// K=8192 g128 M=1: 117.4 + 3.7 (+1.8) MB -> ~40 us; N=4096 K=4096: 8.4 + 0.26 MB -> ~2.9 us.
// flops = 2*M*N*K (negligible: ~1% of the tensor cores at M=16).
#include <atomic>

#include "kernels/core/dequant.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/gemm/gemm_block4.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"

namespace ck {
namespace {

// The sm_80 kernel body compiles for every target; below sm_80 (and in the host pass) the PTX
// wrappers are empty and the kernel traps at entry.
constexpr bool kHasSm80 = CK_SM80;

// ---------------------------------------------------------------------------------------------
// Shape of the pipeline.
// ---------------------------------------------------------------------------------------------
constexpr int kStreamMaxM = 16;       // two n8 B fragments of x rows
// Ring stages per warp: two steps in flight while one is consumed. An H100 sweep of 3 ... 8
// stages (M = 1 and 16 on the layer shapes of DESIGN.md and 4096 x 6144, one or two blocks per
// SM) found the fewest the fastest or within noise on every shape: at M = 1, 4 stages took up to
// 8% longer and the up to 8 stages that fit up to 14% longer; at M = 16 the smaller rings leave
// room for 6 warps instead of 4 (up to 17% faster). The count reaches the kernel as an argument:
// compiled in as a constant, the same 3 stages made the M = 1 main loop up to 28% slower at
// K = 8192 and 14336 (8192 x 28672: 56.6 us against 44.1).
constexpr int kStages = 3;
// A grouped (MoE) call's row blocks share the SMs between experts: there the 3-stage rings took
// 2-4% longer than the deeper ones that fit (Mixtral, T = 1 and 16), so it keeps 5.
constexpr int kGroupedStages = 5;
constexpr int kMaxStages = 8;  // what cp_async_wait_pending covers: 0 .. kMaxStages - 2 pending
static_assert(kStages >= 3 && kGroupedStages <= kMaxStages, "two steps in flight, a known wait");

// Blocks per SM: two for one x row, whose rings and registers are small (16 warps hide the
// dequantization's latencies better than 8: 4096 x 14336 at M = 1 took 14.7 us against 18.8 with
// one block on the H100); one for more rows (M = 16, two 4-warp blocks: up to 22% slower).
__host__ __device__ constexpr int stream_blocks_per_sm(int x_rows) { return x_rows == 1 ? 2 : 1; }

constexpr int kMaxWarps = 8;          // warps of a block (the launcher may take fewer)
constexpr int kXVectors = kPackSliceK * 2 / 16;  // 16-byte x vectors per row, lane and chunk
constexpr int kLanes = 32;
constexpr int kXRowBytes = (kPackK / kPackSliceK) * 16;  // one x vector of a row's 4 slices
static_assert(kPackK == 4 * kPackSliceK, "the 4 lanes of a row cover one 128-k chunk");
static_assert(kXVectors == 4 && kPackSliceK / 8 == kXVectors,
              "x vector i holds the k of weight word i (8 k, 4 pairs)");
static_assert(kPackTileBytes == kLanes * 16, "a tile is one 16-byte vector per lane");

// One stage of a warp's ring: what the warp copies for one chunk of kTiles tiles. The weight is
// [tile][lane][16] and x [vector][row][slice][16], so a warp's 16-byte cp.async and its 16-byte
// shared loads touch 8 consecutive 16-byte vectors per quarter warp: no bank conflicts. x rows:
// kXRows = 1 (m = 1: only row 0 is copied, one vector by each of lanes 0..15), 8 (m <= 8: rows
// g, zeros for g >= m) or 16 (rows g and g + 8). Scales and zeros: each tile's units of the
// chunk's scale groups, [tile][group][row] as the prepacked layout holds them (a chunk spans 1
// to kChunkGroups groups: stage_scale_bytes per tile for the most), copied in a few pieces by
// the warp and read back one 4-byte word (zeros: one byte) per lane and tile.
struct StageLayout {
    int w, x_lo, x_hi, scale, zero, bytes;
};
constexpr int kChunkGroups = kPackK / kPackSliceK;  // scale groups per chunk at most (groups of 32)
__host__ __device__ constexpr int stage_lo_rows(int x_rows) { return x_rows < 8 ? x_rows : 8; }
// A tile's scale units (unit_bytes each) or zero points (1 byte each) in a stage.
__host__ __device__ constexpr int stage_scale_bytes(int unit_bytes) {
    return kChunkGroups * kPackRows * unit_bytes;
}
__host__ __device__ constexpr StageLayout stage_layout(int tiles, int x_rows, bool asym,
                                                       int unit_bytes) {
    const int w_bytes = tiles * kPackTileBytes;
    const int x_bytes = kXVectors * stage_lo_rows(x_rows) * kXRowBytes;
    StageLayout l{};
    l.w = 0;
    l.x_lo = l.w + w_bytes;
    l.x_hi = l.x_lo + x_bytes;
    l.scale = l.x_hi + (x_rows == 16 ? x_bytes : 0);
    l.zero = l.scale + tiles * stage_scale_bytes(unit_bytes);
    l.bytes = l.zero + (asym ? tiles * stage_scale_bytes(1) : 0);
    return l;
}
constexpr int kInt4UnitBytes = 2;  // an INT4 weight's scale: one fp16/bf16 value

// Floats of the cross-warp reduction buffer: per warp, tile pair, x half (rows 0-7, 8-15),
// accumulator register and lane.
__host__ __device__ constexpr int partial_floats(int warps, int tiles, int x_rows) {
    return warps * tiles * (x_rows == 16 ? 4 : 2) * kLanes;
}

// cp.async.wait_group with a run-time count (the stage count is a kernel argument, see kStages):
// one uniform branch per step.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
    static_assert(kMaxStages - 2 == 6, "one case per possible count");
    switch (pending) {
        case 6: cp_async_wait<6>(); break;
        case 5: cp_async_wait<5>(); break;
        case 4: cp_async_wait<4>(); break;
        case 3: cp_async_wait<3>(); break;
        case 2: cp_async_wait<2>(); break;
        case 1: cp_async_wait<1>(); break;
        default: cp_async_wait<0>(); break;
    }
}

// The pieces in which a warp copies its tiles' scale units (or zero points) of one chunk: a
// tile's units of the chunk's groups are contiguous in the prepacked layout ([tile][group][row]),
// so they come as kPiece-byte copies, one per lane, piece j of tile t on lane c = t * pieces + j
// (+ 32 per further copy): one or two cp.async per warp and step where one 4-byte copy per lane
// and tile took ~20 shared-memory wavefronts each (ncu, H100). A piece is one group's 8 units
// or 16 bytes of them, so it starts on a group: 16-byte aligned for units of 2 or 4 bytes in a
// 16-byte aligned array, 8-byte aligned for 1-byte units.
template <int kTiles, int kGroupBytes> struct ScalePieces {
    static constexpr int kPiece = kGroupBytes < 16 ? kGroupBytes : 16;
    static constexpr int kTileBytes = stage_scale_bytes(kGroupBytes / kPackRows);
    static constexpr int kCopies = (kTiles * kTileBytes / kPiece + kLanes - 1) / kLanes;
    static_assert(kGroupBytes % kPiece == 0, "a group is whole pieces");

    int tile[kCopies];   // the piece's tile (kTiles: no piece on this lane)
    int start[kCopies];  // its byte offset in the tile's units of the chunk

    // chunk_groups: groups per chunk (1, 2 or 4).
    __device__ __forceinline__ ScalePieces(int lane, int chunk_groups) {
        const int per_tile = chunk_groups * kGroupBytes / kPiece;  // a power of two
#pragma unroll
        for (int i = 0; i < kCopies; ++i) {
            const int c = lane + i * kLanes;
            tile[i] = c / per_tile < kTiles ? c / per_tile : kTiles;
            start[i] = c % per_tile * kPiece;
        }
    }
    // Copies this lane's pieces of tiles < tiles_here into the stage's region: base is the
    // chunk's first unit of tile 0, tile_stride the bytes from a tile's units to the next
    // tile's, avail the bytes of the chunk's groups that exist (groups past the weight's last
    // are zeros; so is everything when avail is 0).
    __device__ __forceinline__ void copy(uint32_t region, const uint8_t* base, int64_t tile_stride,
                                         int tiles_here, int avail, const void* any_valid) const {
#pragma unroll
        for (int i = 0; i < kCopies; ++i) {
            if (tile[i] < tiles_here) {
                const int bytes = min(max(avail - start[i], 0), kPiece);
                const uint8_t* src = base + tile[i] * tile_stride + start[i];
                cp_async_ca_fill<kPiece>(region + tile[i] * kTileBytes + start[i],
                                         bytes > 0 ? src : any_valid, bytes);
            }
        }
    }
};

// Format: the weight's code format (core/dequant.cuh). Int4Zp is the INT4 kernel of the file
// comment; a block format (Nf4, Mxfp4, Nvfp4: ck_gemm_block4_prepacked) reads its scale units
// (Dequant<Format, T>::Unit, 1, 2 or 4 bytes) where Int4Zp reads its 2-byte scales, one
// 4-byte word per lane and tile holding the lane's unit, and its table (kTableFloats) sits in
// shared memory after the reduction buffer.
template <typename T, int kTiles, int kXRows, bool kAsym, int kMoe, class Format = Int4Zp>
__global__ void __launch_bounds__(kMaxWarps * kLanes, stream_blocks_per_sm(kXRows))
gemm_w4a16_stream_kernel(const GemmW4A16Args a, const int stages, const int64_t tile_groups,
                         const MoeRows mr) {
    if constexpr (!kHasSm80) __trap();  // never launched below sm_80 (see kHasSm80)
    static_assert(!grouped_rows(kMoe) || kXRows == kMoeBlockRows, "a grouped block is 16 rows");
    constexpr bool kInt4 = std::is_same_v<Format, Int4Zp>;
    using Unit = typename Dequant<Format, T>::Unit;
    static_assert(kInt4 || (!grouped_rows(kMoe) && !kAsym), "block formats: dense, no zero points");
    static_assert(4 % sizeof(Unit) == 0, "a row's unit lies in one 4-byte word of its group's");
    constexpr bool kHi = kXRows == 16;              // x rows 8 .. 15 exist
    constexpr int kLoRows = stage_lo_rows(kXRows);  // x rows copied for rows 0 .. 7
    constexpr int kHalves = kHi ? 2 : 1;            // n8 B fragments of x: rows 0-7, 8-15
    constexpr bool kOneRow = kXRows == 1;           // x row 0 alone: lane 4v + s copies vector v
    constexpr int kPairs = kTiles / 2;              // tile pairs: one m16 A fragment each
    constexpr StageLayout kL = stage_layout(kTiles, kXRows, kAsym, int(sizeof(Unit)));
    constexpr int kVecElems = 16 / int(sizeof(T));  // x elements per 16-byte vector
    using ScaleCopy = ScalePieces<kTiles, kPackRows * int(sizeof(Unit))>;
    using ZeroCopy = ScalePieces<kTiles, kPackRows>;
    static_assert(kXRows == 1 || kXRows == 8 || kXRows == 16, "x row classes");
    static_assert(!kHi || kLoRows == 8, "rows 8 .. 15 sit beside rows 0 .. 7");
    static_assert(kTiles % 2 == 0, "tiles go to the mma in pairs (A rows g and g + 8)");
    static_assert(kL.x_lo % 16 == 0 && kL.x_hi % 16 == 0 && kL.scale % 16 == 0 &&
                      kL.zero % 16 == 0 && kL.bytes % 16 == 0,
                  "16-byte aligned regions");

    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
    const int warps = blockDim.x / kLanes;

    // Launched as a programmatic dependent of the stream's previous kernel (launch_stream): the
    // block may start while that kernel ends. Before waiting for it, the weight bytes of the
    // first steps of the ring (below) are prefetched into L2 (a dense call's: a grouped call
    // reads its expert from memory first), so that the stream starts while the kernel before
    // ends; past the wait, every global access. The next kernel may launch at once: it waits
    // for this grid's end in turn.
    if constexpr (!grouped_rows(kMoe)) {
        const int64_t tile0 = int64_t(blockIdx.x) * kTiles;
        if (warp < a.chunks && tile0 < a.tiles8) {
            const int tiles_first = int(std::min<int64_t>(kTiles, a.tiles8 - tile0));
            const int steps = int(std::min<int64_t>(stages - 1, (a.chunks - 1 - warp) / warps + 1));
            const uint8_t* p = a.w + (tile0 * a.chunks + warp) * kPackTileBytes + lane * 16;
            if (lane % 8 == 0)  // one lane per 128-byte line
                for (int j = 0; j < steps; ++j)
                    for (int t = 0; t < tiles_first; ++t)
                        prefetch_l2(p + (t * a.chunks + int64_t(j) * warps) * kPackTileBytes);
        }
    }
    wait_for_prior_grid();
    allow_dependent_launch();
    const int g = lane / 4, s = lane % 4;  // fragment row / column of the lane; s = k slice
    const int ring_bytes = stages * kL.bytes;
    const uint8_t* ring = smem + warp * ring_bytes;
    float* partial = reinterpret_cast<float*>(smem + warps * ring_bytes);

    const T* __restrict__ x = static_cast<const T*>(a.x);
    const uint8_t* w_base = a.w;
    const Unit* __restrict__ scales = static_cast<const Unit*>(a.scales);
    const uint8_t* z_base = a.zeros;
    // The block's rows: x rows g (lo) and g + 8 (hi) of the fragment, and whether they exist.
    // Grouped: rows r0 + g, r0 + 8 + g of the sorted pairs, on expert block_expert[blockIdx.y].
    int64_t r0 = 0, x_lo_index = g, x_hi_index = g + 8;
    bool lo_exists = g < a.m, hi_exists = g + 8 < a.m;
    if constexpr (grouped_rows(kMoe)) {
        const int expert = mr.block_expert[blockIdx.y];
        if (expert < 0) return;  // past the used rows: the whole block leaves
        w_base += expert * mr.w_expert_bytes;
        scales += expert * mr.s_expert_values;
        if constexpr (kAsym) z_base += expert * mr.s_expert_values;
        r0 = int64_t(blockIdx.y) * kMoeBlockRows;
        const int64_t p_lo = mr.sorted_ids[r0 + g], p_hi = mr.sorted_ids[r0 + 8 + g];
        lo_exists = p_lo < mr.pairs;
        hi_exists = p_hi < mr.pairs;
        x_lo_index = kMoe == kMoeSwiGLU ? p_lo / mr.x_div : r0 + g;
        x_hi_index = kMoe == kMoeSwiGLU ? p_hi / mr.x_div : r0 + 8 + g;
    }
    const int64_t m = a.m, k = a.k, chunks = a.chunks;
    const int64_t tiles = a.tiles8;  // tile_groups = ceil(tiles / kTiles), from the launcher
    const int group_shift = a.group_shift;
    const int64_t k_slices = k / kPackSliceK;
    // Chunks of this warp in every tile group (0 when K has fewer chunks than the block warps:
    // the warp then only joins the reductions, with zero partials).
    const int n_steps = warp < chunks ? int((chunks - 1 - warp) / warps) + 1 : 0;

    // ------------------------------------------------------------------ issue side (producer)
    const int64_t w_tile_stride = chunks * kPackTileBytes;  // bytes from tile i to tile i + 1
    const int64_t s_tile_stride = a.groups * kPackRows;     // values from tile i to tile i + 1
    const int64_t w_step = int64_t(warps) * kPackTileBytes;
    // Scale groups: a chunk's first is chunk * kPackK >> group_shift, and it spans chunk_groups
    // (one for groups of 128 k and for one group per row: group_shift >= 32).
    const int chunk_groups = group_shift >= 7 ? 1 : kPackK >> group_shift;
    const int64_t g_step = group_shift >= 32 ? 0 : int64_t(warps) * kPackK >> group_shift;
    const int64_t s_step = g_step * kPackRows;
    const int64_t x_step = int64_t(warps) * kPackK;
    // Lanes that copy x row g (kOneRow: vector g of row 0), and whether it exists (else zeros).
    const bool lo_loader = kOneRow ? g < kXVectors : g < kLoRows;
    const bool lo_ok = lo_loader && (kOneRow || lo_exists);
    const bool hi_ok = kHi && hi_exists;
    const T* x_lo_row = x + (lo_ok && !kOneRow ? x_lo_index : 0) * k + s * kPackSliceK +
                        (kOneRow ? g * kVecElems : 0);
    const T* x_hi_row = x + (hi_ok ? x_hi_index : 0) * k + s * kPackSliceK;
    // This lane's destinations in stage 0 of the ring (a stage offset is added per step).
    const uint32_t ring_smem = shared_address(ring);
    const uint32_t w_dst = ring_smem + kL.w + lane * 16;
    const uint32_t lo_dst = ring_smem + kL.x_lo + g * kXRowBytes + s * 16;
    const uint32_t hi_dst = ring_smem + kL.x_hi + g * kXRowBytes + s * 16;
    const ScaleCopy scale_copy(lane, chunk_groups);
    [[maybe_unused]] const ZeroCopy zero_copy(lane, kAsym ? chunk_groups : 1);

    // The step to issue next: tile group ig, its step is; and this lane's sources for it.
    int64_t ig = blockIdx.x;
    int is = 0, tiles_here = 0;
    int64_t slice = 0;  // this lane's k slice (of 32)
    int64_t grp = 0;    // the chunk's first scale group
    const uint8_t* wp = nullptr;
    const Unit* sp = nullptr;     // the chunk's first scale unit of the group's first tile
    const uint8_t* zp = nullptr;  // ... and zero point
    const T* xlp = nullptr;
    const T* xhp = nullptr;
    auto start_group = [&]() {
        const int64_t tile0 = ig * kTiles;
        tiles_here = int(std::min<int64_t>(kTiles, tiles - tile0));
        wp = w_base + (tile0 * chunks + warp) * kPackTileBytes + lane * 16;
        slice = int64_t(warp) * (kPackK / kPackSliceK) + s;
        grp = group_shift >= 32 ? 0 : int64_t(warp) * kPackK >> group_shift;
        const int64_t idx = (tile0 * a.groups + grp) * kPackRows;
        sp = scales + idx;
        if constexpr (kAsym) zp = z_base + idx;
        xlp = x_lo_row + int64_t(warp) * kPackK;
        xhp = x_hi_row + int64_t(warp) * kPackK;
    };
    if (n_steps > 0 && ig < tile_groups) start_group();

    // The copies of one step into the stage at byte offset off. kPartial (the grid's last tile
    // group, when ceil(n / 8) is not a multiple of kTiles): tiles past the weight copy nothing;
    // their stale stage bytes only reach output columns >= n, which are never stored.
    auto copy_step = [&](auto partial_tag, uint32_t off) {
        constexpr bool kPartial = decltype(partial_tag)::value;
        const bool kok = slice < k_slices;  // lanes past K (the last chunk): zeros
        // No L2 cache-hint policy on the weight (evict_first): with one, CUDA 13.0's ptxas gave
        // the main loop of some instances an LDGSTS whose descriptor register nothing wrote (an
        // illegal instruction at run time, m = 1), the policy made before the loop or per step.
#pragma unroll
        for (int t = 0; t < kTiles; ++t)
            if (!kPartial || t < tiles_here)
                cp_async_16(w_dst + off + t * kPackTileBytes, wp + t * w_tile_stride);
        if (lo_loader) {
            const T* src = kok ? xlp : x;
            if constexpr (kOneRow) {
                cp_async_ca_zfill<16>(lo_dst + off, src, kok);
            } else {
#pragma unroll
                for (int v = 0; v < kXVectors; ++v)
                    cp_async_ca_zfill<16>(lo_dst + off + v * kLoRows * kXRowBytes,
                                         src + v * kVecElems, kok && lo_ok);
            }
        }
        if constexpr (kHi) {
            const T* src = kok ? xhp : x;
#pragma unroll
            for (int v = 0; v < kXVectors; ++v)
                cp_async_ca_zfill<16>(hi_dst + off + v * kLoRows * kXRowBytes, src + v * kVecElems,
                                     kok && hi_ok);
        }
        // The chunk's scale groups past the weight's last (K's last chunk) read nothing: their
        // units are zeros, and so are the products of the k they cover (x = 0 there too).
        const int have = int(std::min<int64_t>(chunk_groups, a.groups - grp));
        const int n_tiles = kPartial ? tiles_here : kTiles;
        scale_copy.copy(ring_smem + off + kL.scale, reinterpret_cast<const uint8_t*>(sp),
                        s_tile_stride * int64_t(sizeof(Unit)), n_tiles,
                        have * kPackRows * int(sizeof(Unit)), scales);
        if constexpr (kAsym)
            zero_copy.copy(ring_smem + off + kL.zero, zp, s_tile_stride, n_tiles, have * kPackRows,
                           z_base);
    };

    // Issues the next step (nothing past the block's last one) and commits a group either way,
    // so that commit group i is always step i.
    auto issue = [&](uint32_t off) {
        if (n_steps > 0 && ig < tile_groups) {
            if (tiles_here == kTiles) copy_step(std::false_type{}, off);
            else copy_step(std::true_type{}, off);
            if (++is == n_steps) {
                is = 0;
                ig += gridDim.x;
                if (ig < tile_groups) start_group();
            } else {
                wp += w_step;
                sp += s_step;
                if constexpr (kAsym) zp += s_step;
                grp += g_step;
                slice += int64_t(warps) * (kPackK / kPackSliceK);
                xlp += x_step;
                if constexpr (kHi) xhp += x_step;
            }
        }
        cp_async_commit();
    };

    // ---------------------------------------------------------------- compute side (consumer)
    // The transposed mma of the file comment; with x rows 8 .. 15 (kHi) a second mma per step
    // takes them as B. Lanes g >= kLoRows (m = 1: x rows past m, which only feed C columns that
    // are never stored) read nothing and give zeros: no lane reads what another lane copied.
    const bool lo_reads = g < kLoRows;
    const int lo_row = lo_reads ? g : 0;
    const uint32_t scale_sel = g & 1 ? 0x3232u : 0x1010u;  // our half of the scale word, twice
    // Our scale group of the chunk (slice s of its four) and in it our row's unit: the stage
    // offsets of the 4-byte word holding it and of our zero point, in tile 0's units.
    const int my_group = group_shift >= 7 ? 0 : s >> (group_shift - 5);
    const int scale_word = kL.scale + ((my_group * kPackRows + g) * int(sizeof(Unit)) & ~3);
    [[maybe_unused]] const int zero_byte = kL.zero + my_group * kPackRows + g;
    // Block formats: our unit of the scale word, and the format's table.
    [[maybe_unused]] const int unit_shift = 8 * ((g * int(sizeof(Unit))) & 3);
    constexpr uint32_t kUnitMask = sizeof(Unit) == 4 ? 0xffffffffu : (1u << (8 * sizeof(Unit))) - 1;
    [[maybe_unused]] float* const fmt_table = partial + partial_floats(warps, kTiles, kXRows);
    auto compute = [&](const uint8_t* st, float (&acc)[kPairs][kHalves][4]) {
        uint4 xl[kXVectors], xh[kXVectors];
#pragma unroll
        for (int v = 0; v < kXVectors; ++v) {
            xl[v] = lo_reads ? *reinterpret_cast<const uint4*>(st + kL.x_lo + (v * kLoRows + lo_row) * kXRowBytes + s * 16)
                             : make_uint4(0, 0, 0, 0);
            if constexpr (kHi)
                xh[v] = *reinterpret_cast<const uint4*>(st + kL.x_hi + (v * kLoRows + g) * kXRowBytes + s * 16);
        }
        // Tile t's scale word and zero point (its units at t * kTileBytes).
        auto scale_word_of = [&](int t) {
            return *reinterpret_cast<const uint32_t*>(st + scale_word + t * ScaleCopy::kTileBytes);
        };
        // acc[q] += x times tiles 2q and 2q + 1: weight word i of each (<-> x vector i),
        // dequantized by dequant(i, p0, p1) into the mma's B pairs.
        auto mma_tile_pair = [&](int q, auto&& dequant) {
#pragma unroll
            for (int i = 0; i < kXVectors; ++i) {
                uint32_t p0[4], p1[4];
                dequant(i, p0, p1);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    mma_16x8x16<T>(acc[q][0], p0[2 * h], p1[2 * h], p0[2 * h + 1], p1[2 * h + 1],
                                   word(xl[i], 2 * h), word(xl[i], 2 * h + 1));
                    if constexpr (kHi)
                        mma_16x8x16<T>(acc[q][1], p0[2 * h], p1[2 * h], p0[2 * h + 1],
                                       p1[2 * h + 1], word(xh[i], 2 * h), word(xh[i], 2 * h + 1));
                }
            }
        };
#pragma unroll
        for (int q = 0; q < kPairs; ++q) {
          if constexpr (kInt4) {
            uint4 wv[2];
            uint32_t scale2[2], zero[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int t = 2 * q + e;
                wv[e] = *reinterpret_cast<const uint4*>(st + kL.w + t * kPackTileBytes + lane * 16);
                scale2[e] = __byte_perm(scale_word_of(t), 0, scale_sel);
                zero[e] = kSymmetricZero;
                if constexpr (kAsym) zero[e] = st[zero_byte + t * ZeroCopy::kTileBytes];
            }
            mma_tile_pair(q, [&](int i, uint32_t (&p0)[4], uint32_t (&p1)[4]) {
                Dequant<Int4Zp, T>::word(word(wv[0], i), {zero[0], scale2[0]}, p0);
                Dequant<Int4Zp, T>::word(word(wv[1], i), {zero[1], scale2[1]}, p1);
            });
          } else {
            // A block format: the same mma on the pairs of Dequant<Format, T>, from the unit of
            // each tile's scale word (word i of the slice may have its own block: NVFP4). A
            // format's fast path (kFastPath) when every lane's two blocks allow it: a vote, so
            // that the branch is uniform (mma.sync needs the whole warp); word() otherwise (the
            // same bits).
            using D = Dequant<Format, T>;
            uint4 wv[2];
            uint32_t unit[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int t = 2 * q + e;
                wv[e] = *reinterpret_cast<const uint4*>(st + kL.w + t * kPackTileBytes + lane * 16);
                unit[e] = (scale_word_of(t) >> unit_shift) & kUnitMask;
            }
            auto plain = [&]() {
                mma_tile_pair(q, [&](int i, uint32_t (&p0)[4], uint32_t (&p1)[4]) {
                    D::word(word(wv[0], i), D::block(unit[0], i, fmt_table), p0);
                    D::word(word(wv[1], i), D::block(unit[1], i, fmt_table), p1);
                });
            };
            if constexpr (D::kFastPath) {
                if (__all_sync(0xffffffffu, D::fast_ok(unit[0], fmt_table) && D::fast_ok(unit[1], fmt_table))) {
                    mma_tile_pair(q, [&](int i, uint32_t (&p0)[4], uint32_t (&p1)[4]) {
                        D::fast_word(word(wv[0], i), D::fast_block(unit[0], i, fmt_table), p0);
                        D::fast_word(word(wv[1], i), D::fast_block(unit[1], i, fmt_table), p1);
                    });
                } else {
                    plain();
                }
            } else {
                plain();
            }
          }
        }
    };

    // A block format's table: filled once, before any warp dequantizes (the ring's copies do
    // not touch it).
    if constexpr (!kInt4) {
        Dequant<Format, T>::fill_table(fmt_table, a.global_scale);
        __syncthreads();
    }

    // ------------------------------------------------------------------------------ main loop
    // Stage i of the ring holds step i mod stages. At step i: wait for this lane's copies of
    // step i, meet the warp's other lanes (whose copies this lane reads: x at m = 1, the scales
    // and zeros; and who have all read step i - 1's stage), refill the stage that step i - 1
    // used, then consume step i. So stages - 1 steps stay in flight while one is dequantized.
    for (int j = 0; j < stages - 1; ++j) issue(j * kL.bytes);
    int read_off = 0, write_off = (stages - 1) * kL.bytes;
    const auto ep = a.epilogue_of<T, kMoe>();
    constexpr int kRows = 8 * kHalves;                 // output rows a block may store
    constexpr int kColPairs = kPackRows / 2;           // column pairs per tile
    constexpr int kOutPairs = kTiles * kRows * kColPairs;

    for (int64_t group = blockIdx.x; group < tile_groups; group += gridDim.x) {
        float acc[kPairs][kHalves][4] = {};
        for (int step = 0; step < n_steps; ++step) {
            cp_async_wait_pending(stages - 2);
            __syncwarp();  // the lanes' copies of step i seen by all; step i - 1 read by all
            issue(write_off);
            write_off = write_off + kL.bytes == ring_bytes ? 0 : write_off + kL.bytes;
            compute(ring + read_off, acc);
            read_off = read_off + kL.bytes == ring_bytes ? 0 : read_off + kL.bytes;
        }

        // Sum the warps' partial tiles: element (q, half, r, lane) of each warp, consecutive
        // lanes in consecutive banks. The first barrier keeps this group's writes behind the
        // previous group's reads; the copies in flight keep streaming meanwhile.
        __syncthreads();
#pragma unroll
        for (int q = 0; q < kPairs; ++q)
#pragma unroll
            for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    partial[(((warp * kPairs + q) * kHalves + hf) * 4 + r) * kLanes + lane] = acc[q][hf][r];
        __syncthreads();
        // One thread per output pair (row, columns c, c + 1 of tile t): consecutive threads store
        // consecutive pairs of a row. Column 8t + j of x row r sits in lane 4j + (r % 8) / 2,
        // register (r % 2) + 2 (t % 2), of tile pair t / 2 and half r / 8.
        const int64_t n0 = group * kTiles * kPackRows;
        auto sum_pair = [&](int t, int row, int cp, float& s0, float& s1) {
            const int r8 = row % 8, reg = r8 % 2 + 2 * (t % 2);
            const int base = ((t / 2) * kHalves + row / 8) * 4 + reg;
            const int l0 = 4 * (2 * cp) + r8 / 2, l1 = l0 + 4;
            s0 = 0.f, s1 = 0.f;
            for (int v = 0; v < warps; ++v) {
                const float* pv = partial + ((v * kPairs * kHalves * 4) + base) * kLanes;
                s0 += pv[l0];
                s1 += pv[l1];
            }
        };
        if constexpr (kMoe == kMoeSwiGLU) {
            // Gate tile t = 2u and up tile 2u + 1 hold the same 8 columns of the activation.
            T* h = static_cast<T*>(a.out);
            const int64_t h_cols = a.n / 2;
            for (int p = threadIdx.x; p < kOutPairs / 2; p += blockDim.x) {
                const int cp = p % kColPairs, row = p / kColPairs % kRows, u = p / (kColPairs * kRows);
                const int64_t col = n0 / 2 + kPackRows * u + 2 * cp;
                if (col >= h_cols || mr.sorted_ids[r0 + row] >= mr.pairs) continue;
                float g0, g1, u0, u1;
                sum_pair(2 * u, row, cp, g0, g1);
                sum_pair(2 * u + 1, row, cp, u0, u1);
                FloatEpilogue<T>::store_two(h + (r0 + row) * h_cols + col, from_float<T>(silu(g0) * u0),
                                       from_float<T>(silu(g1) * u1));
            }
        } else if constexpr (kMoe == kMoeWeighted) {
            for (int p = threadIdx.x; p < kOutPairs; p += blockDim.x) {
                const int cp = p % kColPairs, row = p / kColPairs % kRows, t = p / (kColPairs * kRows);
                const int64_t col = n0 + kPackRows * t + 2 * cp;
                const int64_t pair = mr.sorted_ids[r0 + row];
                if (col >= a.n || pair >= mr.pairs) continue;
                float s0, s1;
                sum_pair(t, row, cp, s0, s1);
                const float wgt = mr.pair_weights[pair];
                *reinterpret_cast<float2*>(mr.pair_out + pair * a.n + col) = make_float2(wgt * s0, wgt * s1);
            }
        } else {
            for (int p = threadIdx.x; p < kOutPairs; p += blockDim.x) {
                const int cp = p % kColPairs, row = p / kColPairs % kRows, t = p / (kColPairs * kRows);
                const int64_t col = n0 + kPackRows * t + 2 * cp;
                if (row >= m || col >= a.n) continue;
                float s0, s1;
                sum_pair(t, row, cp, s0, s1);
                ep.store_pair(row, col, ep.add_bias(col, s0), col + 1 < a.n ? ep.add_bias(col + 1, s1) : s1);
            }
        }
    }
    cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight
}

// ---------------------------------------------------------------------------------------------
// Launch planning
// ---------------------------------------------------------------------------------------------

// Lets the kernel take up to `bytes` of dynamic shared memory (once per instantiation and
// device: `bytes` depends only on both).
template <typename T, int kTiles, int kXRows, bool kAsym, int kMoe, class Format = Int4Zp>
cudaError_t allow_smem(int bytes) {
    static std::atomic<uint64_t> done{0};
    return allow_dynamic_smem_once(gemm_w4a16_stream_kernel<T, kTiles, kXRows, kAsym, kMoe, Format>,
                                   bytes, done);
}

// A block shape (its warps, ring stages and shared memory bytes) and the grid.
struct StreamPlan {
    int tiles = 0;   // kTiles
    int warps = 0;
    int stages = 0;
    int smem = 0;
    int64_t grid = 0;
    double score = -1;
};

// Tile counts the launcher weighs, widest first. Wider tile groups read x fewer times per
// weight byte; narrower ones cut the last round of tile groups finer. 6 fills a round of the
// SMs where the powers of two leave a quarter of them idle or start a second round (N = 6144:
// 128 groups of 6 tiles on 132 SMs, against 96 of 8 or 192 of 4). A grouped (MoE) call keeps
// the powers of two: its 6-tile blocks measured slower (benchmarks/NOTES.md has both).
constexpr int kTileChoices[] = {8, 6, 4, 2};
constexpr int kDenseOnlyTiles = 6;

// Warps per block the launcher weighs, most first: more warps hide the dequantization's
// latencies better.
constexpr int kWarpChoices[] = {kMaxWarps, 6, 4};

// Weight of the x traffic from L2 against the weight stream in the choice: L2 serves roughly 3x
// the DRAM bandwidth, so one x byte per weight byte costs ~1/3 of a weight byte when it does not
// overlap, less when it does. 0.2 is what an H100 sweep of the tile count asked for: M = 16
// wants 8 tiles on N >= 14336 and 4 on N = 4096.
constexpr double kXTrafficCost = 0.2;

// One x row: a warp's step costs about as much for up to kOneRowStepTiles tiles on its SM as
// for that many (the copies' round trip bounds it), and their tiles' worth past that (their
// dequantization, the SM's share of the bandwidth); a tile group costs kOneRowGroupCost such
// tile-steps besides (the warps' reduction, the stores, the ring's turn to the next group).
// See plan_for.
constexpr int kOneRowStepTiles = 3;
constexpr double kOneRowGroupCost = 32;

// The plan for one tile count, or score -1 when no block shape fits the shared memory.
// Persistent blocks over tile groups (the pipeline fills once per block, not once per tile
// group), `slots` of them at most; warps: the most of kWarpChoices whose rings of `stages`
// stages and reduction buffer fit `smem_limit`. Score, higher is better:
//   - several x rows: the share of block time spent streaming, groups / (slots * rounds),
//     divided by 1 + kXTrafficCost * (x bytes read from L2 per weight byte);
//   - one x row (two blocks per SM, each bound by its copies' latency): 1 / the busiest
//     SM's time, rounds * (steps per warp and tile group * max(tiles * its blocks,
//     kOneRowStepTiles) + kOneRowGroupCost). The share above chose 2 tiles in several rounds
//     where 4 or 8 tiles in fewer rounds were faster, and 4 tiles with two blocks on half the
//     SMs where 6 tiles with one block on each were; a sweep of every tile and warp count at
//     M = 1 (benchmarks/NOTES.md) fitted this estimate.
inline StreamPlan plan_for(int tiles, int x_rows, bool asym, int unit_bytes, int64_t m,
                           int64_t n_tiles, int64_t chunks, int slots, int smem_limit, int stages,
                           int forced_warps) {
    StreamPlan p;
    p.tiles = tiles;
    p.stages = stages;
    for (int warps : kWarpChoices) {
        if (forced_warps != 0 && warps > forced_warps) continue;
        const int bytes = warps * stages * stage_layout(tiles, x_rows, asym, unit_bytes).bytes +
                          partial_floats(warps, tiles, x_rows) * int(sizeof(float));
        if (bytes <= smem_limit) {
            p.warps = warps;
            p.smem = bytes;
            break;
        }
    }
    if (p.warps == 0) return p;
    const int64_t groups = ceil_div(n_tiles, tiles);
    p.grid = std::min<int64_t>(groups, slots);
    const int64_t rounds = ceil_div(groups, slots);
    if (x_rows == 1) {
        const int64_t sm_blocks = ceil_div(p.grid, int64_t(slots / stream_blocks_per_sm(x_rows)));
        const int64_t steps = ceil_div(chunks, int64_t(p.warps));
        const int64_t step_tiles = std::max<int64_t>(tiles * sm_blocks, kOneRowStepTiles);
        p.score = 1.0 / (double(rounds) * (double(steps * step_tiles) + kOneRowGroupCost));
        return p;
    }
    const double busy = double(groups) / double(int64_t(slots) * rounds);
    // Per chunk a block reads m x rows of 128 k (2 bytes each) against tiles * 512 weight bytes.
    const double x_per_weight = double(m) * kPackK * 2 / (double(tiles) * kPackTileBytes);
    p.score = busy / (1.0 + kXTrafficCost * x_per_weight);
    return p;
}

// A launch of one plan: grid.x blocks over the tile groups, grid.y row blocks (1, or the
// grouped call's row blocks).
struct StreamLaunch {
    StreamPlan plan;
    int smem_limit;
    int64_t row_blocks;
    MoeRows rows;
};

template <typename T, int kTiles, int kXRows, bool kAsym, int kMoe, class Format = Int4Zp>
cudaError_t launch_stream(const GemmW4A16Args& a, const StreamLaunch& l, cudaStream_t stream) {
    const StreamPlan& p = l.plan;
    if (!grid_fits(p.grid) || l.row_blocks < 1 || l.row_blocks > 65535)
        return cudaErrorInvalidConfiguration;
    const cudaError_t e = allow_smem<T, kTiles, kXRows, kAsym, kMoe, Format>(l.smem_limit);
    if (e != cudaSuccess) return e;
    const dim3 grid(unsigned(p.grid), unsigned(l.row_blocks));
    return launch_dependent(gemm_w4a16_stream_kernel<T, kTiles, kXRows, kAsym, kMoe, Format>, grid,
                            dim3(p.warps * kLanes), p.smem, stream, a, p.stages,
                            ceil_div(a.tiles8, kTiles), l.rows);
}

template <typename T, int kXRows, bool kAsym, int kMoe = kMoeDense, class Format = Int4Zp>
cudaError_t launch_rows(const GemmW4A16Args& a, const StreamLaunch& l, cudaStream_t stream) {
    switch (l.plan.tiles) {
        case 8: return launch_stream<T, 8, kXRows, kAsym, kMoe, Format>(a, l, stream);
        case kDenseOnlyTiles:
            if constexpr (!grouped_rows(kMoe))
                return launch_stream<T, kDenseOnlyTiles, kXRows, kAsym, kMoe, Format>(a, l, stream);
            return cudaErrorInvalidConfiguration;
        case 4: return launch_stream<T, 4, kXRows, kAsym, kMoe, Format>(a, l, stream);
        case 2: return launch_stream<T, 2, kXRows, kAsym, kMoe, Format>(a, l, stream);
        default: return cudaErrorInvalidConfiguration;
    }
}

// The plan of the widest-scoring tile count for x_rows rows on `sms` SMs whose blocks may opt
// in to smem_limit bytes each (score -1: none fits). unit_bytes: the bytes of a scale unit;
// extra_smem: bytes a block takes beyond the plan's (a block format's table), added to the
// plan's smem. A dense call (grouped false): CK_GEMM_W4A16_STREAM_TILES (2, 4, 6, 8) forces
// the tile count and CK_GEMM_W4A16_STREAM_WARPS (4, 6, 8) caps the warps per block
// (cuda_kernels.h): the shapes weighed shrink, and the smallest (2 tiles, 4 warps) is always
// among them. A grouped call weighs the choices but kDenseOnlyTiles and reads neither.
inline StreamPlan best_plan(const GemmW4A16Args& a, int x_rows, int64_t m, int sms, int smem_limit,
                            int unit_bytes = kInt4UnitBytes, int extra_smem = 0,
                            int stages = kStages, bool grouped = false) {
    // Blocks of an SM share its shared memory, less the 1 KB the runtime reserves per block.
    constexpr int kReservedPerBlock = 1024;
    const int blocks = stream_blocks_per_sm(x_rows);
    const int per_block =
        (smem_limit + kReservedPerBlock) / blocks - kReservedPerBlock - extra_smem;
    const int forced_tiles =
        grouped ? 0 : forced_plan_value("CK_GEMM_W4A16_STREAM_TILES", {2, 4, 6, 8});
    const int forced_warps =
        grouped ? 0 : forced_plan_value("CK_GEMM_W4A16_STREAM_WARPS", {4, 6, 8});
    StreamPlan best;
    for (int tiles : kTileChoices) {
        if (forced_tiles != 0 && tiles != forced_tiles) continue;
        if (grouped && tiles == kDenseOnlyTiles) continue;
        const StreamPlan p = plan_for(tiles, x_rows, a.zeros != nullptr, unit_bytes, m, a.tiles8,
                                      a.chunks, sms * blocks, per_block, stages, forced_warps);
        if (p.score > best.score) best = p;  // ties go to the wider tile group (listed first)
    }
    best.smem += extra_smem;
    return best;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launcher (arguments validated by cuda_kernels.cu)
// ---------------------------------------------------------------------------------------------
cudaError_t gemm_w4a16_prepacked_stream(const GemmW4A16Args& args, cudaStream_t stream) {
    if (args.m < 1 || args.m > kStreamMaxM || compute_capability() < 80) return cudaErrorNotSupported;
    const int sms = std::max(sm_count(), 1);
    const int smem_limit = max_smem_optin();
    // A warp counts its steps in an int.
    if (args.chunks > INT32_MAX / (kPackK / kPackSliceK)) return cudaErrorInvalidConfiguration;

    const int x_rows = args.m == 1 ? 1 : args.m <= 8 ? 8 : 16;
    const StreamLaunch l{best_plan(args, x_rows, args.m, sms, smem_limit), smem_limit, 1, MoeRows{}};
    if (l.plan.score < 0) return cudaErrorNotSupported;  // too little shared memory for any shape

    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym_tag) {
            constexpr bool kAsym = decltype(asym_tag)::value;
            return with_bool(args.qkv.q != nullptr, [&](auto qkv_tag) {
                constexpr int kMode = decltype(qkv_tag)::value ? kQkvRows : kMoeDense;
                switch (x_rows) {
                    case 1: return launch_rows<T, 1, kAsym, kMode>(args, l, stream);
                    case 8: return launch_rows<T, 8, kAsym, kMode>(args, l, stream);
                    default: return launch_rows<T, 16, kAsym, kMode>(args, l, stream);
                }
            });
        });
    });
}

cudaError_t gemm_w4a16_prepacked_stream_grouped(const GemmW4A16Args& args, MoeMode mode,
                                                const MoeRows& rows, int64_t blocks,
                                                int64_t active_experts, cudaStream_t stream) {
    if (compute_capability() < 80) return cudaErrorNotSupported;
    if (args.chunks > INT32_MAX / (kPackK / kPackSliceK)) return cudaErrorInvalidConfiguration;
    // Each row block is one weight stream, planned as a 16-row call on its share of the SMs
    // (the blocks of experts with rows come first in the grid; the others leave at once).
    const int share = int(std::max<int64_t>(1, std::max(sm_count(), 1) / std::max<int64_t>(active_experts, 1)));
    const StreamLaunch l{best_plan(args, kMoeBlockRows, kMoeBlockRows, share, max_smem_optin(),
                                   kInt4UnitBytes, 0, kGroupedStages, true),
                         max_smem_optin(), blocks, rows};
    if (l.plan.score < 0) return cudaErrorNotSupported;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym_tag) {
            constexpr bool kAsym = decltype(asym_tag)::value;
            return mode == kMoeSwiGLU ? launch_rows<T, kMoeBlockRows, kAsym, kMoeSwiGLU>(args, l, stream)
                                      : launch_rows<T, kMoeBlockRows, kAsym, kMoeWeighted>(args, l, stream);
        });
    });
}

// The block 4-bit formats (gemm_block4.cuh): the dense INT4 launch with the format's scale units
// and its table, whose bytes come off the shared memory the plan may use.
template <class Format>
cudaError_t block4_stream(const GemmW4A16Args& args, cudaStream_t stream) {
    const int sms = std::max(sm_count(), 1);
    const int smem_limit = max_smem_optin();
    if (args.chunks > INT32_MAX / (kPackK / kPackSliceK)) return cudaErrorInvalidConfiguration;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        constexpr int kTableBytes = Dequant<Format, T>::kTableFloats * int(sizeof(float));
        const int x_rows = args.m == 1 ? 1 : args.m <= 8 ? 8 : 16;
        constexpr int kUnitBytes = int(sizeof(typename Dequant<Format, T>::Unit));
        const StreamLaunch l{best_plan(args, x_rows, args.m, sms, smem_limit, kUnitBytes,
                                       kTableBytes),
                             smem_limit, 1, MoeRows{}};
        if (l.plan.score < 0) return cudaErrorNotSupported;
        return with_bool(args.qkv.q != nullptr, [&](auto qkv_tag) {
            constexpr int kMode = decltype(qkv_tag)::value ? kQkvRows : kMoeDense;
            switch (x_rows) {
                case 1: return launch_rows<T, 1, false, kMode, Format>(args, l, stream);
                case 8: return launch_rows<T, 8, false, kMode, Format>(args, l, stream);
                default: return launch_rows<T, 16, false, kMode, Format>(args, l, stream);
            }
        });
    });
}

cudaError_t gemm_block4_prepacked_stream(const GemmW4A16Args& args, ck_block4_format_t format,
                                         cudaStream_t stream) {
    if (args.m < 1 || args.m > kStreamMaxM || compute_capability() < 80) return cudaErrorNotSupported;
    switch (format) {
        case CK_BLOCK4_NF4: return block4_stream<Nf4>(args, stream);
        case CK_BLOCK4_MXFP4: return block4_stream<Mxfp4>(args, stream);
        case CK_BLOCK4_NVFP4: return block4_stream<Nvfp4>(args, stream);
        default: return cudaErrorInvalidValue;  // the entry point rejects these earlier
    }
}

}  // namespace ck
