// gemm_int4.cu - INT4 x INT4 -> INT32 matrix products with the shared epilogue (epilogue.cuh).
//
// What it computes: acc[m, n] = sum_k a[m, k] * b[n, k], exact int32 sums of products of signed
// 4-bit codes ([-8, 7], |product| <= 64, so no sum overflows below K = 2^25), then
// Epilogue<OutT>: raw int32, or act(fma(float(acc) * scale_a, scale_b, bias)) rounded once to
// fp32/fp16/bf16. The accumulators are the same integers ck_gemm_int8 computes on the unpacked
// codes and the epilogue is the same code, so the float results are bit-identical to
// ck_gemm_int8_scaled on the unpacked int8 operands. Integer addition is associative: every
// summation order (and any permutation of k applied to both operands) gives the same bits.
//
// Layout: a [M, K / 2] and b [N, K / 2] bytes, row-major (b is the nn.Linear weight [N, K]);
// element 2i of a row in the low nibble of byte i, 2i + 1 in the high nibble, two's complement.
// out [M, N] row-major. The entry points guarantee M, N >= 1, K >= 32 and K % 32 == 0 (so a row
// is a whole number of 16-byte vectors), a and b 16-byte aligned. Every 16-byte vector of a row
// (32 k) is therefore wholly inside the matrix or wholly outside; partial tiles in M, N and K are
// zero-filled on load (a zero byte is two zero codes) and dropped on store.
//
// Variants (cuda_kernels.cu picks one):
//   reference  any GPU (dp4a): 64x64 output tiles, 256 threads with 4x4 micro-tiles, 128 k
//              (64 packed bytes) per step through shared memory. Each nibble is sign-extended on
//              its own and stored in natural k order: nothing clever, the baseline of the tests.
//   mma        sm_80+: the packed tiles go through a 4-stage cp.async pipeline into shared memory
//              (half the bytes of the INT8 kernel's tiles for the same k), ldmatrix loads packed
//              fragments, and registers unpack them to int8 for mma.sync m16n8k32 s8. 128x128
//              tiles (8 warps of 64x32) or, when those make less than one wave, 64x64 (4 warps).
//              Why not the native m16n8k64 .s4 mma: Hopper runs sub-byte mma.sync far below its
//              int8 rate, while unpacking costs ~2 integer instructions per mma (see below).
//              K > 131040 (kScaledMaxK) runs the 64x64 tile with a costlier exact unpacking.
//   small_m    sm_80+, M <= 16 (decode): streams the packed weight once, straight from global
//              memory into registers (no shared-memory staging), unpacked there to int8 mma.sync
//              m16n8k32 fragments; warps split K and add their partial sums in a fixed order.
//
// Floors: bytes = (M + N) * K / 2 + M * N * sizeof(out) (+ scales and bias); ops = 2 * M * N * K.
//   For large M and N the tensor-core rate bounds it: the same int8 mma.sync rate as
//   gemm_int8.cu's mma kernel with half its shared-memory traffic.
//   For M <= 16 the N * K / 2 weight bytes bound it: N = 28672, K = 8192 is 117 MB, 39 us at the
//   H100's 3.0 TB/s copy bandwidth. Measurements: benchmarks/NOTES.md and results/.
#include "kernels/core/epilogue.cuh"
#include "kernels/core/mma_pipeline.cuh"
#include "kernels/core/ptx.cuh"
#include "kernels/gemm/gemm_int4.cuh"

namespace ck {
namespace {

// The sm_80 kernel's body compiles for every target; below sm_80 (and in the host pass) the PTX
// wrappers are empty and the kernel traps at entry, so nothing after the trap is emitted.
constexpr bool kHasSm80 = CK_SM80;

constexpr int kKPerByte = 2;        // two int4 codes per byte
constexpr int kChunkBytes = 16;     // one 16-byte vector: 32 k
constexpr int kKPerChunk = kChunkBytes * kKPerByte;

// ---------------------------------------------------------------------------------------------
// Reference kernel: 64x64 tile per 256-thread block, 64 packed bytes (128 k) of each row per
// step. A thread loads one 16-byte vector (32 k) of an A row and of a B row, sign-extends each
// nibble on its own and stores 8 words of 4 consecutive k (natural order) into word-row-major
// tiles ([k / 4][m] and [k / 4][n]), so that a thread's operands for one k group are plain word
// loads for dp4a. Thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 16 i (i < 4) and column
// pairs 32 j + 2 tx + {0, 1} (j < 2): pairs of adjacent columns, the epilogue's store unit.
// ---------------------------------------------------------------------------------------------
constexpr int kRefBM = kDp4aBM, kRefBN = kDp4aBN;
constexpr int kRefBKBytes = 64;                             // packed bytes per step and row
constexpr int kRefKWords = kRefBKBytes * kKPerByte / 4;     // 4-k words per step: 32
constexpr int kRefVectorsPerRow = kRefBKBytes / kChunkBytes;
constexpr int kRefWordsPerVector = kKPerChunk / 4;          // 8
constexpr int kRefThreads = kDp4aThreads;

static_assert(kRefBM * kRefVectorsPerRow == kRefThreads, "one A vector per thread per step");
static_assert(kRefBN * kRefVectorsPerRow == kRefThreads, "one B vector per thread per step");

// The 8 codes of a packed 32-bit word (nibble e = k e) as two words of 4 int8 each, in natural
// order: w0 = k 0..3, w1 = k 4..7 (lowest k in the lowest byte, as dp4a pairs bytes).
__device__ __forceinline__ void unpack_natural(uint32_t w, uint32_t& w0, uint32_t& w1) {
    uint32_t out[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int code = int((w >> (4 * e)) & 0xFu);
        const int value = (code ^ 8) - 8;  // two's complement nibble -> [-8, 7]
        out[e / 4] |= (uint32_t(value) & 0xFFu) << (8 * (e % 4));
    }
    w0 = out[0];
    w1 = out[1];
}

template <typename OutT>
__global__ void __launch_bounds__(kRefThreads)
gemm_int4_reference_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                           int64_t k_bytes, Epilogue<OutT> ep) {
    const int64_t m = ep.m, n = ep.n;
    const Dp4aThread th(m);
    const int64_t m0 = th.m0, n0 = th.n0;
    const int tid = threadIdx.x;

    // Loader role: row tid / 4 of each tile, vector tid % 4 of the step (words kw0 .. kw0 + 7).
    const int ld_row = tid / kRefVectorsPerRow, ld_vec = tid % kRefVectorsPerRow;
    const int kw0 = ld_vec * kRefWordsPerVector;

    dp4a_reference_block<kRefKWords, kRefBKBytes>(
        ep, th, k_bytes, [&](Dp4aTiles<kRefKWords>& tiles, int64_t kb0) {
        auto& sa = tiles.a;
        auto& sb = tiles.b;
        const int64_t kb = kb0 + ld_vec * kChunkBytes;
        uint4 va = make_uint4(0, 0, 0, 0), vb = make_uint4(0, 0, 0, 0);
        if (m0 + ld_row < m && kb < k_bytes)
            va = *reinterpret_cast<const uint4*>(a + (m0 + ld_row) * k_bytes + kb);
        if (n0 + ld_row < n && kb < k_bytes)
            vb = *reinterpret_cast<const uint4*>(b + (n0 + ld_row) * k_bytes + kb);
        __syncthreads();  // the previous step's reads of sa/sb are done
#pragma unroll
        for (int p = 0; p < 4; ++p) {  // packed word p holds k 8p .. 8p + 7 of the vector
            uint32_t lo, hi;
            unpack_natural(word(va, p), lo, hi);
            sa[kw0 + 2 * p][ld_row] = lo;
            sa[kw0 + 2 * p + 1][ld_row] = hi;
            unpack_natural(word(vb, p), lo, hi);
            sb[kw0 + 2 * p][ld_row] = lo;
            sb[kw0 + 2 * p + 1][ld_row] = hi;
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel (mma.sync m16n8k32 s8 on unpacked int4, sm_80+).
//
// Block tile kBM x kBN, kBKBytes = 64 packed bytes (128 k) of each row per pipeline stage;
// kStages shared-memory stages filled by cp.async (16 bytes a thread at a time, zero-filled
// outside the matrix), so that the loads of step kt + kStages - 1 overlap the MMAs of step kt.
// Warps form a kWarpsM x kWarpsN grid; each owns a (kBM / kWarpsM) x (kBN / kWarpsN) sub-tile:
// kMI x kNI fragments of 16 x 8.
//
// Shared layout: [rows][64 bytes] for A and B, 16-byte chunks XOR-swizzled exactly as in
// gemm_int8.cu (chunk c of row r at chunk c ^ ((r >> 1) & 3)): ldmatrix reads 8 rows at one
// chunk, two rows share a 128-byte line, and the swizzle puts those 8 rows on 8 distinct 16-byte
// bank groups; the cp.async writes of 8 consecutive chunks cover a 128-byte line once.
//
// Fragments without shuffles. ldmatrix.x4 over packed bytes gives lane (g = lane / 4,
// t = lane % 4) register j = row (g or g + 8) of matrix j, bytes 4t .. 4t + 3 of a chunk: one
// 32-bit word holding 8 consecutive k, 8t .. 8t + 7 of that chunk, low nibbles at even k and
// high nibbles at odd k. The word unpacks into two int8 words: lo = the 4 even k, hi = the 4
// odd k, each sign-extended. One A ldmatrix.x4 covers rows 0-15 x chunks c0, c0 + 1 (64 k), one
// B ldmatrix.x4 covers n rows 0-7 and 8-15 (two n8 tiles) x the same two chunks; together they
// feed two mma.sync k32 steps, h = 0 with the lo words and h = 1 with the hi words. In step h,
// mma-k q = 16 j + 4 t + i (j: register a0/a1 vs a2/a3 and b0 vs b1; i: byte in the register)
// stands for real k = kc0 + 32 j + 8 t + 2 i + h, where kc0 is chunk c0's first k. Over
// j, t, i in [0, 2) x [0, 4) x [0, 4) and h in [0, 2) that is a bijection onto the 64 k of the
// two chunks, and A and B see the same one (same ldmatrix positions, same unpacking), so the
// MMAs sum every product a[m, k] * b[n, k] exactly once: a k permutation common to both
// operands leaves the integer sum unchanged.
//
// Unpack cost (unpack_half): for K <= kScaledMaxK the codes unpack to 16 s (1 instruction for
// the high nibbles, 2 for the low ones) and the accumulators hold 256 * sum; longer rows take
// the sign-extending unpacking (3 / 4 instructions). A 64x32 warp tile unpacks 16 A and 8 B
// packed words into 48 int8 words per 32 MMAs: ~2.3 instructions per mma (scaled), against
// 3-4 for the sign-extending unpacking, which left the kernel bound by integer issue
// (benchmarks/NOTES.md). ldmatrix count per mma is half the INT8 kernel's (one packed register
// feeds two MMAs).
// ---------------------------------------------------------------------------------------------
constexpr int kBKBytes = kTileKBytes;              // packed bytes of k per stage (mma_pipeline.cuh)
constexpr int kChunksK = kBKBytes / kChunkBytes;   // 4
constexpr int kFragChunks = 2;                     // chunks one A/B ldmatrix.x4 covers per row
constexpr int kGroupM = 8;                         // tile rows per rasterization group (L2 reuse)
static_assert(kChunkBytes == kTileChunkBytes && kChunksK % kFragChunks == 0,
              "whole ldmatrix k steps per stage");

// 128x128: 8 warps of 64x32, 4 stages x 16 KB = 64 KB (two blocks per SM on sm_80/sm_90).
using Int4TileLarge = MmaTile<128, 128, 2, 4, 4, 2>;
// 64x64: 4 warps of 32x32, 4 stages x 8 KB = 32 KB; for grids the large tile leaves short of
// one wave.
using Int4TileSmall = MmaTile<64, 64, 2, 2, 4, 4>;

// Four packed codes (in the low nibble of each byte; the high nibbles are ignored) -> four
// sign-extended int8. Per byte, with x the nibble and s its two's complement value:
//   x ^ 0x88 = (s + 8) + 0x80, in [0x80, 0x8F]   (x ^ 8 = s + 8 for s in [-8, 7])
//   - 0x08   = s + 0x80,       in [0x78, 0x87]   (every byte >= 0x80 > 8: no borrow between bytes)
//   ^ 0x80   = s mod 256                         (the two's complement byte)
// Three instructions (lop3, iadd, lop3) for four values.
__device__ __forceinline__ uint32_t sign_extend_nibbles(uint32_t w) {
    const uint32_t biased = (w & 0x0F0F0F0Fu) ^ 0x88888888u;
    return (biased - 0x08080808u) ^ 0x80808080u;
}

// The even-k (h = 0: low nibbles) or odd-k (h = 1: high nibbles) codes of a packed word as
// four int8, lowest k in the lowest byte.
//   kScaled = false: the codes themselves, s (sign_extend_nibbles: 3 or 4 instructions).
//   kScaled = true:  16 s, the nibble moved to the top of its byte (in [-128, 112], an exact
//                    int8): w & 0xF0F0F0F0 for h = 1 (one lop3), (w << 4) & 0xF0F0F0F0 for h = 0
//                    (shift + lop3). Both operands scaled: every product is 256 a b and the
//                    int32 accumulator holds 256 * sum (see kScaledMaxK), shifted back at the end.
template <bool kScaled> __device__ __forceinline__ uint32_t unpack_half(uint32_t w, int h) {
    if constexpr (kScaled) return (h == 0 ? w << 4 : w) & 0xF0F0F0F0u;
    return sign_extend_nibbles(h == 0 ? w : w >> 4);
}

// The scaled unpacking is exact while 256 * |sum| fits in int32: |a b| <= 64, so
// 256 * 64 * K <= 2^31 - 1, K < 2^17. Longer rows (the header allows K up to 2^25 exact) take
// the sign-extending unpacking.
constexpr int64_t kScaledMaxK = (int64_t(INT32_MAX) / (256 * 64)) / 32 * 32;  // 131040
constexpr int kScaledShift = 8;  // acc = 2^8 * sum: an arithmetic shift recovers the sum exactly

// The sum from an accumulator: kScaled ones hold 2^8 * sum, exactly (an arithmetic shift).
template <bool kScaled> __device__ __forceinline__ int32_t unscale(int32_t acc) {
    return kScaled ? acc >> kScaledShift : acc;
}

template <class Tile, bool kScaled, typename OutT>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
gemm_int4_mma_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                     int64_t k_bytes, Epilogue<OutT> ep) {
    if constexpr (!kHasSm80) __trap();  // never launched below sm_80 (see kHasSm80)
    constexpr int kStages = Tile::kStages;
    constexpr int kMI = Tile::kMI, kNI = Tile::kNI, kThreads = Tile::kThreads;
    extern __shared__ __align__(128) uint8_t smem[];

    const int64_t m = ep.m, n = ep.n;
    const MmaWarpTile<Tile> wt(m, n, kGroupM);
    const int64_t m0 = wt.m0, n0 = wt.n0;
    const int lane = wt.lane, wm0 = wt.wm0, wn0 = wt.wn0;

    const uint32_t smem_base = shared_address(smem);
    const int k_tiles = int(ceil_div(k_bytes, kBKBytes));  // < 2^31: the entry points bound K

    // Loads k tile kt into stage s: chunk idx = threadIdx.x + i * kThreads of each operand.
    auto load_stage = [&](int s, int kt) {
        const int64_t kb0 = int64_t(kt) * kBKBytes;
        const uint32_t sa = smem_base + s * Tile::kStageBytes;
        const uint32_t sb = sa + Tile::kABytes;
        load_rowk_tile<Tile::kALoads, kThreads>(sa, a, m0, m, kb0, k_bytes);
        load_rowk_tile<Tile::kBLoads, kThreads>(sb, b, n0, n, kb0, k_bytes);
    };

    int32_t acc[kMI][kNI][4] = {};

    cp_async_pipeline<kStages>(k_tiles, load_stage, [&](int s) {
        const uint32_t sa = smem_base + s * Tile::kStageBytes;
        const uint32_t sb = sa + Tile::kABytes;
        // Not unrolled: unrolled, ptxas hoists the next step's fragment loads over these MMAs
        // and the large tile spills under its 128-register cap; the other resident warps hide
        // the ldmatrix latency instead.
#pragma unroll 1
        for (int ks = 0; ks < kChunksK / kFragChunks; ++ks) {
            const int c0 = ks * kFragChunks;  // first chunk of these 64 k
            uint32_t af[kMI][4];              // packed: 8 k per register
            ldmatrix_a_fragments(af, sa, wm0, c0, lane);
            uint32_t bf[kNI][2];
            ldmatrix_b_fragments(bf, sb, wn0, c0, lane);

#pragma unroll
            for (int h = 0; h < kKPerByte; ++h) {  // h = 0: even k (low nibbles), 1: odd k
                uint32_t bu[kNI][2];
#pragma unroll
                for (int ni = 0; ni < kNI; ++ni) {
                    bu[ni][0] = unpack_half<kScaled>(bf[ni][0], h);
                    bu[ni][1] = unpack_half<kScaled>(bf[ni][1], h);
                }
#pragma unroll
                for (int mi = 0; mi < kMI; ++mi) {
                    const uint32_t a0 = unpack_half<kScaled>(af[mi][0], h), a1 = unpack_half<kScaled>(af[mi][1], h);
                    const uint32_t a2 = unpack_half<kScaled>(af[mi][2], h), a3 = unpack_half<kScaled>(af[mi][3], h);
#pragma unroll
                    for (int ni = 0; ni < kNI; ++ni)
                        mma_s8_16x8x32(acc[mi][ni], a0, a1, a2, a3, bu[ni][0], bu[ni][1]);
                }
            }
        }
    });

    wt.store_pairs(acc, [&](int64_t row, int64_t col, int32_t acc0, int32_t acc1) {
        ep.store_pair(row, col, unscale<kScaled>(acc0), unscale<kScaled>(acc1));
    });
}

template <class Tile, bool kScaled, typename OutT>
cudaError_t launch_mma(const IntGemmArgs& g, cudaStream_t stream) {
    static std::atomic<uint64_t> opted_in{0};  // per device, for this one kernel
    return launch_tiles<Tile>(gemm_int4_mma_kernel<Tile, kScaled, OutT>, opted_in, g.m, g.n,
                              stream, g.a_as<uint8_t>(), g.b_as<uint8_t>(), g.k / kKPerByte,
                              make_epilogue<OutT>(g));
}

// ---------------------------------------------------------------------------------------------
// Small-M kernel (m <= 16, sm_80+): a weight-streaming GEMV/GEMM on tensor cores, gemm_int8.cu's
// small_m kernel on packed operands. At M <= 16 the N * K / 2 weight bytes are the whole cost
// (ops are ~1% of the tensor cores), so the kernel reads each weight byte once, straight from
// global memory into registers, and keeps enough of them in flight to run at memory bandwidth.
//
// A block owns kCols = 8 * kTiles consecutive output columns (weight rows) and its kWarps warps
// split K: warp w takes the 64-byte chunks (128 k) (w * U + u) + i * kWarps * U of each row
// (U = kUnroll consecutive chunks per step). Per chunk and n8 tile, lane l = 4 g + t loads the
// 16 packed bytes (32 k) at byte 16 t of weight row n0 + 8 tile + g, and the same 16 bytes of
// activation rows g and g + 8 (zeros for rows >= m, which are never read; for m <= 8, kHiRows =
// false drops rows g + 8 altogether: a1 = a3 = 0). The next step's weight loads are issued
// before this step's MMAs (a register double buffer), so every warp keeps one step of weight
// loads in flight. The activations (read by every block: L1/L2 hits) are double-buffered the
// same way (kBufferA) or loaded at the top of the step they feed: see the launcher for which.
//
// Fragments without shuffles or shared memory. Packed word j of a lane's vector holds k
// 32 t + 8 j + 0..7 of the chunk (low nibble = even k, high = odd). unpack_half(word, 0) gives
// its 4 even k as int8 words, unpack_half(word, 1) its 4 odd k. mma j (j < 4) of a chunk and tile
// takes a0 / a2 = the even / odd k of activation row g's word j, a1 / a3 the same of row g + 8,
// b0 / b1 = the even / odd k of the weight vector's word j. By the m16n8k32 fragment layout
// (ptx.cuh) mma-k 4 t + i then stands for real k 32 t + 8 j + 2 i in both operands and mma-k
// 16 + 4 t + i for 32 t + 8 j + 2 i + 1: a map that depends on (t, j, i) only, and over the
// 4 mma of the chunk a bijection onto its 128 k, so the MMAs sum every product exactly once.
// Unpacking is gemm_int4_mma_kernel's: 16 x code (3 instructions per packed word, the sum
// shifted back at the end) up to kScaledMaxK, sign extension beyond.
//
// At the end the warps add their partial accumulators through shared memory in a fixed order
// and the block stores its [m, kCols] slice through the shared epilogue.
// ---------------------------------------------------------------------------------------------
constexpr int kSmallMaxM = 16;                           // rows of the mma A fragment
constexpr int kSmallLoRows = 8;                          // rows g < 8: the fragment's a0 / a2
constexpr int kSmallLanesPerRow = 4;                     // lanes t = 0..3 of a fragment row
constexpr int kSmallChunkBytes = kSmallLanesPerRow * kChunkBytes;  // 64 packed bytes: 128 k
constexpr int kSmallWordsPerVector = kChunkBytes / 4;    // packed words per lane and chunk
static_assert(kSmallWordsPerVector * 8 == kKPerChunk, "a packed 32-bit word holds 8 k");

template <int kWarps_, int kTiles_, int kUnroll_, bool kBufferA_> struct SmallMConfig {
    static constexpr int kWarps = kWarps_, kTiles = kTiles_, kUnroll = kUnroll_;
    static constexpr bool kBufferA = kBufferA_;  // activations double-buffered like the weight
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kCols = 8 * kTiles;  // output columns per block
};

template <class Cfg, bool kHiRows, bool kScaled, typename OutT>
__global__ void __launch_bounds__(Cfg::kThreads)
gemm_int4_small_m_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ w,
                         int64_t k_bytes, Epilogue<OutT> ep) {
    if constexpr (!kHasSm80) __trap();  // never launched below sm_80 (see kHasSm80)
    constexpr int kWarps = Cfg::kWarps, kTiles = Cfg::kTiles, kUnroll = Cfg::kUnroll;
    constexpr bool kBufferA = Cfg::kBufferA;
    constexpr int kRowHalves = kHiRows ? 2 : 1;  // accumulator row halves that hold real rows
    __shared__ WarpPartials<kWarps, kTiles, kRowHalves, int32_t> partial;

    const int64_t m = ep.m, n = ep.n;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, tq = lane % 4;
    const int64_t n0 = int64_t(blockIdx.x) * Cfg::kCols;

    // Weight rows of this lane (one per n8 tile); rows past n are never read.
    const uint8_t* wrow[kTiles];
    bool wok[kTiles];
    lane_weight_rows(w, n0, n, g, k_bytes, kChunkBytes * tq, wrow, wok);
    const bool a_lo = g < m, a_hi = kHiRows && g + kSmallLoRows < m;
    const uint8_t* arow_lo = a + (a_lo ? g : 0) * k_bytes + kChunkBytes * tq;
    const uint8_t* arow_hi = a + (a_hi ? g + kSmallLoRows : 0) * k_bytes + kChunkBytes * tq;

    // One step = kUnroll chunks: the packed weight and activation vectors of the step's loads.
    struct Step {
        uint4 w[kUnroll][kTiles], lo[kUnroll], hi[kHiRows ? kUnroll : 1];
    };
    const int64_t chunks = ceil_div(k_bytes, kSmallChunkBytes);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    auto load_weights = [&](int64_t c0, Step& s) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t kb = (c0 + u) * kSmallChunkBytes;  // + 16 tq is in the row pointers
            const bool kok = kb + kChunkBytes * tq < k_bytes;  // the K tail (and chunks past it)
#pragma unroll
            for (int t = 0; t < kTiles; ++t)
                s.w[u][t] = kok && wok[t] ? load_stream_16(wrow[t] + kb) : zero;
        }
    };
    auto load_act = [&](int64_t c0, Step& s) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t kb = (c0 + u) * kSmallChunkBytes;
            const bool kok = kb + kChunkBytes * tq < k_bytes;
            s.lo[u] = kok && a_lo ? __ldg(reinterpret_cast<const uint4*>(arow_lo + kb)) : zero;
            if constexpr (kHiRows)
                s.hi[u] = kok && a_hi ? __ldg(reinterpret_cast<const uint4*>(arow_hi + kb)) : zero;
        }
    };

    int32_t acc[kTiles][4] = {};
    constexpr int64_t kStride = int64_t(kWarps) * kUnroll;
    int64_t c0 = int64_t(warp) * kUnroll;
    Step next;
    if (c0 < chunks) {
        load_weights(c0, next);
        if constexpr (kBufferA) load_act(c0, next);
    }
    for (; c0 < chunks; c0 += kStride) {
        Step cur = next;
        if (c0 + kStride < chunks) {
            load_weights(c0 + kStride, next);
            if constexpr (kBufferA) load_act(c0 + kStride, next);
        }
        if constexpr (!kBufferA) load_act(c0, cur);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
            for (int j = 0; j < kSmallWordsPerVector; ++j) {
                const uint32_t a0 = unpack_half<kScaled>(word(cur.lo[u], j), 0);
                const uint32_t a2 = unpack_half<kScaled>(word(cur.lo[u], j), 1);
                uint32_t a1 = 0, a3 = 0;
                if constexpr (kHiRows) {
                    a1 = unpack_half<kScaled>(word(cur.hi[u], j), 0);
                    a3 = unpack_half<kScaled>(word(cur.hi[u], j), 1);
                }
#pragma unroll
                for (int t = 0; t < kTiles; ++t)
                    mma_s8_16x8x32(acc[t], a0, a1, a2, a3,
                                   unpack_half<kScaled>(word(cur.w[u][t], j), 0),
                                   unpack_half<kScaled>(word(cur.w[u][t], j), 1));
            }
    }

    // Sum the warps' partial tiles; one thread per accumulator pair (c0 c1: row g, c2 c3:
    // row g + 8) stores; rows g + 8 only when they can exist.
    sum_warp_partials(partial, acc, [&](int t, int rh, int l, int32_t s0, int32_t s1) {
        ep.store_pair(l / 4 + kSmallLoRows * rh, n0 + 8 * t + 2 * (l % 4), unscale<kScaled>(s0),
                      unscale<kScaled>(s1));
    });
}

template <class Cfg, bool kHiRows, bool kScaled, typename OutT>
cudaError_t launch_small_m(const IntGemmArgs& g, cudaStream_t stream) {
    const int64_t blocks = ceil_div(g.n, Cfg::kCols);
    if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
    gemm_int4_small_m_kernel<Cfg, kHiRows, kScaled, OutT>
        <<<unsigned(blocks), Cfg::kThreads, 0, stream>>>(
        g.a_as<uint8_t>(), g.b_as<uint8_t>(),
        g.k / kKPerByte, make_epilogue<OutT>(g));
    return cudaGetLastError();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers (arguments validated by cuda_kernels.cu)
// ---------------------------------------------------------------------------------------------
cudaError_t gemm_int4_reference(const IntGemmArgs& args, cudaStream_t stream) {
    return dispatch_out_dtype(args.out_dtype, [&](auto tag) {
        using OutT = decltype(tag);
        return launch_tile_grid(gemm_int4_reference_kernel<OutT>, args.m, args.n, kRefBM, kRefBN,
                                kRefThreads, 0, stream, args.a_as<uint8_t>(),
                                args.b_as<uint8_t>(), args.k / kKPerByte,
                                make_epilogue<OutT>(args));
    });
}

cudaError_t gemm_int4_mma(const IntGemmArgs& args, cudaStream_t stream) {
    if (compute_capability() < 80) return cudaErrorNotSupported;
    const bool small = short_of_one_wave<Int4TileLarge>(args.m, args.n);
    // Rows longer than kScaledMaxK (far beyond any layer) take the sign-extending unpacking, on
    // the small tile only: under the large tile's 128-register cap its extra unpacking
    // registers spilled.
    if (args.k > kScaledMaxK) {
        return dispatch_out_dtype(args.out_dtype, [&](auto tag) {
            return launch_mma<Int4TileSmall, false, decltype(tag)>(args, stream);
        });
    }
    return dispatch_out_dtype(args.out_dtype, [&](auto tag) {
        using OutT = decltype(tag);
        return small ? launch_mma<Int4TileSmall, true, OutT>(args, stream)
                     : launch_mma<Int4TileLarge, true, OutT>(args, stream);
    });
}

cudaError_t gemm_int4_small_m(const IntGemmArgs& args, cudaStream_t stream) {
    if (args.m > kSmallMaxM || compute_capability() < 80) return cudaErrorNotSupported;
    const int64_t sms = std::max(sm_count(), 1);
    return dispatch_out_dtype(args.out_dtype, [&](auto tag) {
        using OutT = decltype(tag);
        return with_bool(args.m > kSmallLoRows, [&](auto hi_rows) {
            return with_bool(args.k <= kScaledMaxK, [&](auto scaled) {
                constexpr bool kHi = decltype(hi_rows)::value, kScaled = decltype(scaled)::value;
                // Chosen by a sweep of 11 (warps, tiles, unroll, kBufferA) configurations
                // (benchmarks/NOTES.md):
                // - m <= 8: 4 warps, 2 tiles, 4 chunks per step, activations double-buffered
                //   (144-152 registers on sm_90, 3 blocks per SM).
                // - m > 8 (rows g + 8 double the activation registers): the same configuration
                //   would take ~196 registers (2 blocks per SM); 4 tiles x 2 chunks with the
                //   activations loaded at the top of their step (~124 registers, 4 blocks per
                //   SM) keeps as many weight bytes in flight per warp.
                // 8 warps (more of them splitting K) when the narrow blocks would not give
                // every SM one (N = 4096 with 4 tiles: 128 blocks).
                using Narrow = std::conditional_t<kHi, SmallMConfig<4, 4, 2, false>,
                                                  SmallMConfig<4, 2, 4, true>>;
                using Wide = std::conditional_t<kHi, SmallMConfig<8, 4, 2, false>,
                                                SmallMConfig<8, 2, 4, true>>;
                const bool wide = ceil_div(args.n, Narrow::kCols) < sms;
                return wide ? launch_small_m<Wide, kHi, kScaled, OutT>(args, stream)
                            : launch_small_m<Narrow, kHi, kScaled, OutT>(args, stream);
            });
        });
    });
}

}  // namespace ck
