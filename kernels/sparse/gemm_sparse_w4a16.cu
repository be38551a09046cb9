// gemm_sparse_w4a16.cu - W4A16 GEMMs on structured-sparse INT4 weights (2:4, 16:32 along K):
// out[m, n] = act(x[m, k] w'[n, k]^T + bias[n]), w' the dequantized kept values (+0 where
// pruned), products and sums in float32, one rounding to dtype (fp16 / bf16).
//
// Two kernels:
//   reference: either pattern on the interchange layout (sparse_int4.cuh), any m, any GPU: the
//     tiled float32 kernel of the dense weights (w4a16_reference.cuh) with a loader that decodes
//     8 dense weights from the kept codes and their positions. Simple and obviously right.
//   stream: a prepacked 2:4 weight on sparse tensor cores (mma.sp m16n8k32, sm_80+). The mma
//     runs transposed, out^T[n][m] = w'[n][k] x^T[k][m], so that the sparse operand is A (the
//     only sparse operand mma.sp has): a warp's A is 16 weight rows by 32 dense k held as 16
//     kept values, B is 8 rows of x. A block owns kTiles 16-row tiles and 16 rows of x; its 8
//     warps split K in 128-k chunks (warp w takes chunks w, w + 8, ...), each lane loading its
//     own 16 bytes of codes and 8 bytes of metadata per tile and chunk, the next chunk's while
//     the current one multiplies; at the end the warps add their partial tiles through shared
//     memory in a fixed order (deterministic) and store the block's outputs. Every weight byte
//     is read once per 16 rows of x: a decode kernel for m <= 16 that also serves larger m.
//
// Prepacked layout (ck_sparse_w4a16_prepack, sparse_quantize.cu), rows16 = ceil(n / 16) * 16:
//   codes: [rows16 / 16][k / 128][32 lanes] 16-byte vectors. Lane (g, t) = (lane / 4, lane % 4)
//     of tile i, chunk c holds words (row g, k 0..63 of the chunk), (row g + 8, k 0..63),
//     (row g, k 64..127), (row g + 8, k 64..127); a word's nibbles (j, j + 4) are the two kept
//     values of block t (j = 0, 2) or t + 4 (j = 1, 3) of k32 step j / 2 of its 64 k: exactly
//     the pairs Dequant<Int4Zp>::word() returns and mma.sp's A registers take (a0 = row g's
//     block t, a1 = row g + 8's, a2, a3 the same of block t + 4). Codes unsigned (symmetric q is
//     stored as q + 8, zero point 8), as the dense prepacked layout.
//   metadata: after the codes, [rows16 / 16][k / 128][32 lanes] 8-byte vectors: word h (the
//     chunk's 64-k half h) is the metadata of k32 step 2h + t / 2 that mma.sp reads from this
//     lane with selector t / 2 (ptx.cuh: blocks 0-3 on lanes t = 0, 2; 4-7 on t = 1, 3; row g in
//     the low 16 bits, row g + 8 in the high). So every lane loads one vector and no shuffles.
//   scales, zeros: [rows16 / 16][groups][8][2]: (g, r) is row g + 8 r, so a lane's two rows'
//     scales are one 4-byte load (zeros 2 bytes); padding rows scale 0, zero point 8.
// Bytes per weight: 3/8 (codes 1/4, metadata 1/8) + the scales.
//
// Floors: bytes = rows16 k 3/8 + scales rows16 groups 2 (+ zeros) + x m k 2 + out m n 2:
// 8192 x 28672 (n = 28672, k = 8192) at m = 1: 88 + 3.7 MB -> ~31 us at ~3 TB/s; 4096 x 4096:
// 6.3 MB -> ~2.1 us. flops = 2 m n k (the sparse tensor cores do half the products of dense).
#include <atomic>

#include "kernels/core/dequant.cuh"
#include "kernels/core/ptx.cuh"
#include "kernels/gemm/w4a16_reference.cuh"
#include "kernels/sparse/sparse_int4.cuh"

namespace ck {
namespace {

constexpr bool kHasSm80 = CK_SM80;

// ---------------------------------------------------------------------------------------------
// Reference
// ---------------------------------------------------------------------------------------------
// Dense weights kk .. kk + 7 (kk % 8 == 0) of row `row` read from the prepacked layout (the
// file comment): the two blocks' codes from the words of lanes (g, b % 4), their positions from
// the metadata of lane (g, 2 (step % 2) + b / 4), the scale and zero point of row g + 8 r.
template <typename T, bool kAsym>
__device__ __forceinline__ void prepacked_dense8(const SparseGemmArgs& a, int64_t row, int64_t kk,
                                                 float (&w)[8]) {
    const int64_t chunks = a.k / kSparsePackK;
    const int64_t tiles = sparse_prepacked_rows(a.n) / kSparsePackRows;
    const uint8_t* meta = a.codes + tiles * kSparsePackRows * a.k / 4;
    const int64_t tile = row / kSparsePackRows;
    const int g = int(row % 8), r = int(row % kSparsePackRows / 8);
    const int kc = int(kk % kSparsePackK), h = kc / 64, ss = kc / 32 % 2;
    const int64_t lanes = (tile * chunks + kk / kSparsePackK) * 32;
    const int64_t gi = (tile * a.groups + kk / a.group_size) * 8 + g;
    const float scale = to_float(static_cast<const T*>(a.scales)[gi * 2 + r]);
    const int zero = kAsym ? a.zeros[gi * 2 + r] : int(kSymmetricZero);
#pragma unroll
    for (int bb = 0; bb < 2; ++bb) {
        const int b = kc % 32 / 4 + bb, j = 2 * ss + b / 4;
        const uint32_t q =
            reinterpret_cast<const uint32_t*>(a.codes + (lanes + g * 4 + b % 4) * 16)[2 * h + r];
        const uint32_t e =
            reinterpret_cast<const uint32_t*>(meta + (lanes + g * 4 + 2 * ss + b / 4) * 8)[h];
        const uint32_t nib = e >> (16 * r + 4 * (b % 4)) & 0xFu;
        const int u[2] = {int(q >> (4 * j) & 0xFu), int(q >> (4 * (j + 4)) & 0xFu)};
#pragma unroll
        for (int i = 0; i < 4; ++i) w[4 * bb + i] = 0.f;
        w[4 * bb + int(nib & 3u)] = to_float(from_float<T>(float(u[0] - zero) * scale));
        w[4 * bb + int(nib >> 2)] = to_float(from_float<T>(float(u[1] - zero) * scale));
    }
}

template <typename T, bool k1632, bool kAsym, bool kPrepacked>
__global__ void __launch_bounds__(kRefThreads) sparse_reference_kernel(const SparseGemmArgs a) {
    const T* __restrict__ scales = static_cast<const T*>(a.scales);
    reference_tile<T>(static_cast<const T*>(a.x), a.m, a.n, a.k, a.epilogue<T>(),
                      [&](int64_t row, int64_t k0, int ld_word, float (&wv)[kRefLoadK]) {
        const int64_t kk = k0 + ld_word * kRefLoadK;
        if constexpr (kPrepacked) {
            prepacked_dense8<T, kAsym>(a, row, kk, wv);
        } else {
            const int64_t gi = row * a.groups + kk / a.group_size;
            sparse_dense8<T, k1632, kAsym>(a.codes + row * (a.k / 4),
                                           a.meta + row * (a.k / kSparseWordK), kk,
                                           to_float(scales[gi]), kAsym ? a.zeros[gi] : 0, wv);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// x in a stage of either mma.sp kernel: rows of one 128-k chunk (kXRowBytes each) in 16-byte
// pieces, piece p of row r at p ^ (r % 8), so that ldmatrix's eight rows of one piece column
// fall in eight distinct bank groups.
// ---------------------------------------------------------------------------------------------
constexpr int kXRowBytes = kSparsePackK * 2;  // one x row of a chunk (fp16 / bf16)
constexpr int kXPieces = kXRowBytes / 16;     // its 16-byte pieces
static_assert(kXPieces == 16, "the x swizzle XORs a row's piece index with row % 8");
__device__ __forceinline__ uint32_t x_piece_at(uint32_t x_base, int r, int piece) {
    return x_base + uint32_t(r * kXRowBytes + ((piece ^ (r % 8)) * 16));
}

// Copies rows m0 .. m0 + kRows - 1 of x's chunk c to x_base (rows past m zero-filled): the
// caller's thread `first` of kStride takes pieces first, first + kStride, ...
template <int kRows, int kStride>
__device__ __forceinline__ void copy_x_chunk(uint32_t x_base, const uint8_t* x, int64_t m0,
                                             int64_t m, int64_t k, int64_t c, int first) {
#pragma unroll
    for (int p = first; p < kRows * kXPieces; p += kStride) {
        const int r = p / kXPieces, piece = p % kXPieces;
        const int64_t row = m0 + r;
        const bool valid = row < m;
        const uint8_t* src = x + ((valid ? row : 0) * k + c * kSparsePackK) * 2 + piece * 16;
        cp_async_ca_zfill<16>(x_piece_at(x_base, r, piece), src, valid);
    }
}

// ---------------------------------------------------------------------------------------------
// What both mma.sp kernels do with one 16-row weight tile and one 64-k half of a chunk: the
// lane's code vector, metadata vector, scale-pair word and (asymmetric) zero-point word from
// shared memory (the addresses of its slots; zero_high: the pair is the high half of its aligned
// word), rows g and g + 8 dequantized (Dequant<Int4Zp>::word: pairs (j, j + 4) are exactly the
// A registers, the file comment says why), and the half's two k32 steps multiplied into acc[f]
// with the B fragments b[step][f] of x (selector = step: the metadata words' lanes).
// ---------------------------------------------------------------------------------------------
template <typename T, bool kAsym, int kFrags>
__device__ __forceinline__ void tile_half_mma(uint32_t codes_at, uint32_t meta_at,
                                              uint32_t scale_at, uint32_t zero_at,
                                              bool zero_high, int h,
                                              const uint32_t (&b)[2][kFrags][4],
                                              float (&acc)[kFrags][4]) {
    uint4 q;
    uint2 e;
    uint32_t s2, z2 = 0x08080808u;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "r"(codes_at));
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(e.x), "=r"(e.y) : "r"(meta_at));
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(s2) : "r"(scale_at));
    if constexpr (kAsym) {
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(z2) : "r"(zero_at));
        if (zero_high) z2 >>= 16;
    }
    using D = Dequant<Int4Zp, T>;
    const typename D::Block bg{kAsym ? z2 & 0xFFu : kSymmetricZero, (s2 & 0xFFFFu) * 0x10001u};
    const typename D::Block bg8{kAsym ? z2 >> 8 & 0xFFu : kSymmetricZero, (s2 >> 16) * 0x10001u};
    uint32_t pg[4], pg8[4];  // dequantized pairs of rows g and g + 8
    D::word(word(q, 2 * h), bg, pg);
    D::word(word(q, 2 * h + 1), bg8, pg8);
    const uint32_t em = h == 0 ? e.x : e.y;
#pragma unroll
    for (int ss = 0; ss < 2; ++ss) {
        const uint32_t av[4] = {pg[2 * ss], pg8[2 * ss], pg[2 * ss + 1], pg8[2 * ss + 1]};
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
            if (ss == 0) mma_sp_16x8x32<T, 0>(acc[f], av, b[ss][f], em);
            else mma_sp_16x8x32<T, 1>(acc[f], av, b[ss][f], em);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Stream (mma.sp)
// ---------------------------------------------------------------------------------------------
// A block has kWarps warps (4, or 8 where few blocks cover the weight's rows): warp w takes
// chunks w, w + kWarps, ...
constexpr int kMinStages = 3;               // per warp: two chunks in flight, one consumed
constexpr int kMaxStages = 8;
constexpr int kWarpRingBytes = 12 * 1024;   // 48 or 96 KB a block: four or two blocks per SM
constexpr int kRowsPerBlock = 16;           // rows of x: two n8 B fragments
constexpr int kSteps = kSparsePackK / 32;   // mma.sp k32 steps per chunk
static_assert(kSteps == 4, "a chunk is two 64-k halves of two steps each");

// One stage of a warp's ring: what the warp copies for one chunk. Per tile, every lane's 16
// bytes of codes, 8 of metadata, the 4-byte words of its scale pairs (one per group the chunk
// touches: 2 for groups of 64) and of its zero-point pair; then kXRows rows of x (1: m = 1, the
// other rows read a zero row; 8; 16), 16-byte pieces swizzled (piece p of row r at p ^ (r % 8))
// so that ldmatrix's eight rows fall in eight distinct bank groups. Each lane reads back the
// weight bytes it copied itself; x is read by ldmatrix across lanes (after a __syncwarp).
template <int kTiles, int kXRows, bool kAsym> struct Stage {
    static constexpr int kCodes = 0;                           // [tile][lane] 16 bytes
    static constexpr int kMeta = kCodes + kTiles * 32 * 16;     // [tile][lane] 8 bytes
    static constexpr int kScales = kMeta + kTiles * 32 * 8;     // [tile][half][lane] 4 bytes
    static constexpr int kZeros = kScales + kTiles * 2 * 32 * 4;
    static constexpr int kX = kZeros + (kAsym ? kTiles * 2 * 32 * 4 : 0);
    static constexpr int kBytes = kX + kXRows * kXRowBytes;
    static_assert(kX % 16 == 0 && kBytes % 16 == 0, "16-byte copies");
};

// Stages per warp: as many as kWarpRingBytes holds (small stages, one tile of one x row, need
// many to keep enough weight bytes in flight), between kMinStages and kMaxStages.
template <int kTiles, int kXRows, bool kAsym>
constexpr int stages() {
    const int fit = kWarpRingBytes / Stage<kTiles, kXRows, kAsym>::kBytes;
    return fit < kMinStages ? kMinStages : fit > kMaxStages ? kMaxStages : fit;
}

// The warp's zero row (ldmatrix rows of x past kXRows) follows its ring.
template <int kTiles, int kXRows, bool kAsym>
constexpr int warp_smem_bytes() {
    return stages<kTiles, kXRows, kAsym>() * Stage<kTiles, kXRows, kAsym>::kBytes + kXRowBytes;
}

template <typename T, bool kAsym, int kTiles, int kXRows, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) sparse_stream_kernel(const SparseGemmArgs a) {
    if constexpr (!kHasSm80) {
        __trap();  // never launched below sm_80
    } else {
        using S = Stage<kTiles, kXRows, kAsym>;
        constexpr int kStages = stages<kTiles, kXRows, kAsym>();
        constexpr int kFrags = kXRows > 8 ? 2 : 1;
        extern __shared__ __align__(16) uint8_t smem[];
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
        const uint32_t ring = shared_address(smem) +
                              uint32_t(warp * warp_smem_bytes<kTiles, kXRows, kAsym>());
        const uint32_t zero_row = ring + kStages * S::kBytes;
        const int64_t chunks = a.k / kSparsePackK;
        const int64_t tiles = sparse_prepacked_rows(a.n) / kSparsePackRows;
        // One row block: tile groups along x. Several: the row blocks of a tile group along x,
        // so that they run together and all but the first read the group's weight from L2.
        const bool rows_fast = a.m > kRowsPerBlock;
        const int64_t tile0 = int64_t(rows_fast ? blockIdx.y : blockIdx.x) * kTiles;
        const int64_t m0 = int64_t(rows_fast ? blockIdx.x : blockIdx.y) * kRowsPerBlock;
        const uint8_t* codes = a.codes;
        const uint8_t* meta = a.codes + tiles * kSparsePackRows * a.k / 4;
        const uint8_t* scale_pairs = static_cast<const uint8_t*>(a.scales);
        const uint8_t* x = static_cast<const uint8_t*>(a.x);
        const bool g64 = a.group_size == 64;
        // A weight read once (one row block) goes first from L2; read again, it stays.
        const uint64_t policy = rows_fast ? l2_evict_normal_policy() : l2_evict_first_policy();
        // Launched as a programmatic dependent of the stream's previous kernel (launch_stream):
        // the block may start while that kernel ends and waits here before any global access.
        // (Prefetching the first chunks' codes into L2 before the wait, as the dense stream
        // kernel does, made back-to-back calls at most 5% faster still and isolated ones up to
        // 2.8 us slower on the H100: 4096 x 14336 at M = 1, 18.8 us against 16.0.)
        wait_for_prior_grid();
        allow_dependent_launch();
        for (int i = lane; i < kXRowBytes / 16; i += 32)
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(zero_row + 16 * i),
                         "r"(0));

        // The copies of chunk c into stage st. Tiles past the weight's are never read (their
        // outputs are not stored); they copy nothing.
        const auto issue = [&](int64_t c, int st) {
            const uint32_t base = ring + uint32_t(st * S::kBytes);
#pragma unroll
            for (int i = 0; i < kTiles; ++i) {
                if (tile0 + i >= tiles) break;
                const int64_t v = ((tile0 + i) * chunks + c) * 32 + lane;
                cp_async_16_hint(base + S::kCodes + (i * 32 + lane) * 16, codes + v * 16, policy);
                cp_async_ca_zfill<8>(base + S::kMeta + (i * 32 + lane) * 8, meta + v * 8, true);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (h == 1 && !g64) break;
                    const int64_t group = (c * kSparsePackK + 64 * h) / a.group_size;
                    const int64_t gi = ((tile0 + i) * a.groups + group) * 8 + g;
                    cp_async_ca_zfill<4>(base + S::kScales + ((i * 2 + h) * 32 + lane) * 4,
                                         scale_pairs + gi * 4, true);
                    if constexpr (kAsym)  // the aligned word holding the pair (2 bytes at 2 gi)
                        cp_async_ca_zfill<4>(base + S::kZeros + ((i * 2 + h) * 32 + lane) * 4,
                                             a.zeros + (gi * 2 & ~int64_t(3)), true);
                }
            }
            copy_x_chunk<kXRows, 32>(base + S::kX, x, m0, a.m, a.k, c, lane);
        };

        float acc[kTiles][kFrags][4] = {};
        // Chunks warp, warp + kWarps, ...: the i-th is chunk warp + i kWarps, in stage
        // i % kStages.
        const int64_t mine = chunks > warp ? ceil_div(chunks - warp, kWarps) : 0;
#pragma unroll
        for (int i = 0; i < kStages - 1; ++i) {
            if (i < mine) issue(warp + i * kWarps, i);
            cp_async_commit();
        }
        for (int64_t it = 0; it < mine; ++it) {
            cp_async_wait<kStages - 2>();
            __syncwarp();  // every lane's copies of this stage landed; last stage's reads done
            const int64_t ahead = it + kStages - 1;
            if (ahead < mine) issue(warp + ahead * kWarps, int(ahead % kStages));
            cp_async_commit();
            const int64_t c = warp + it * kWarps;
            const uint32_t base = ring + uint32_t((it % kStages) * S::kBytes);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t b[2][kFrags][4];   // x of this half's two steps
#pragma unroll
                for (int ss = 0; ss < 2; ++ss) {
                    const int step = 2 * h + ss;
#pragma unroll
                    for (int f = 0; f < kFrags; ++f) {
                        // Lane l addresses row l % 8 of matrix l / 8 (k 32 step + 8 (l / 8)).
                        const int r = 8 * f + lane % 8, piece = 4 * step + lane / 8;
                        const uint32_t addr = r < kXRows ? x_piece_at(base + S::kX, r, piece)
                                                         : zero_row + piece * 16;
                        ldmatrix_x4(b[ss][f], addr);
                    }
                }
#pragma unroll
                for (int i = 0; i < kTiles; ++i) {
                    const uint32_t slot = uint32_t(i * 32 + lane);
                    const uint32_t hslot = uint32_t(((i * 2 + (g64 ? h : 0)) * 32) + lane);
                    const int64_t group = (c * kSparsePackK + 64 * h) / a.group_size;
                    const int64_t gi = ((tile0 + i) * a.groups + group) * 8 + g;
                    tile_half_mma<T, kAsym, kFrags>(
                        base + S::kCodes + slot * 16, base + S::kMeta + slot * 8,
                        base + S::kScales + hslot * 4, base + S::kZeros + hslot * 4, gi & 1, h,
                        b, acc[i]);
                }
            }
        }
        cp_async_wait<0>();

        // The warps' partial tiles, added in warp order (the ring's memory is reused).
        constexpr int kRegs = kTiles * kFrags * 4;
        __syncthreads();
        float* partial = reinterpret_cast<float*>(smem);  // [warp][reg][lane]
#pragma unroll
        for (int i = 0; i < kTiles; ++i)
#pragma unroll
            for (int f = 0; f < kFrags; ++f)
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    partial[(warp * kRegs + (i * kFrags + f) * 4 + r) * 32 + lane] = acc[i][f][r];
        __syncthreads();
        const FloatEpilogue<T> ep = a.epilogue<T>();
        for (int item = threadIdx.x; item < kRegs * 32; item += kWarps * 32) {
            const int q = item / 32, l = item % 32;
            const int i = q / (kFrags * 4), f = q / 4 % kFrags, r = q % 4;
            const int64_t n = (tile0 + i) * kSparsePackRows + l / 4 + 8 * (r / 2);
            const int64_t m = m0 + 8 * f + 2 * (l % 4) + r % 2;
            if (n >= a.n || m >= a.m) continue;
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) sum += partial[(w * kRegs + q) * 32 + l];
            ep.store(m, n, ep.add_bias(n, sum));
        }
    }
}

template <typename T, bool kAsym, int kTiles, int kXRows>
cudaError_t launch_stream(const SparseGemmArgs& a, int64_t tiles, int64_t row_blocks,
                          cudaStream_t stream) {
    // Four tiles a block: four warps. Fewer tiles (few rows of weight): eight warps, so that the
    // K split keeps enough warps streaming.
    constexpr int kWarps = kTiles == 4 ? 4 : 8;
    constexpr int kSmem = kWarps * warp_smem_bytes<kTiles, kXRows, kAsym>();
    static_assert(kWarps * kTiles * (kXRows > 8 ? 2 : 1) * 4 * 32 * 4 <= kSmem,
                  "the partial tiles fit in the ring's memory");
    const auto kernel = sparse_stream_kernel<T, kAsym, kTiles, kXRows, kWarps>;
    static std::atomic<uint64_t> opted_in{0};
    const cudaError_t err = allow_dynamic_smem_once(kernel, kSmem, opted_in);
    if (err != cudaSuccess) return err;
    const int64_t groups = ceil_div(tiles, kTiles);
    const dim3 grid = row_blocks > 1 ? dim3(unsigned(row_blocks), unsigned(groups))
                                     : dim3(unsigned(groups), 1);
    return launch_dependent(kernel, grid, dim3(kWarps * 32), kSmem, stream, a);
}

// ---------------------------------------------------------------------------------------------
// Tiles (mma.sp) for larger m: a block computes 128 weight rows (8 prepacked tiles) by 64 rows
// of x over the whole K, 128 k a stage; its 8 warps are 4 (weight rows) x 2 (rows of x), each
// 32 x 32 (2 tiles x 4 n8 fragments): every dequantized A feeds 4 mma.sp, every B fragment 2.
// The whole block copies a stage (one 16-byte code vector, one 8-byte metadata vector and the
// scale words per thread, and 64 rows of x, swizzled as the stream kernel's) into a ring of
// kTileStages, __syncthreads between stages. The blocks run in bands of kTileBand weight
// groups: every row block of x for those groups, then the next band, so that the band's weight
// (kTileBand x 48 KB per 1024 k) stays in L2 while x passes once per band (with the rows of x
// fastest, x came from DRAM once per weight group).
// ---------------------------------------------------------------------------------------------
constexpr int kTileWTiles = 8;       // 16-row weight tiles of a block
constexpr int kTileXRows = 64;       // rows of x of a block
static_assert(kTileWTiles * kSparsePackRows == kSparseTileRows && kTileXRows == kSparseTileXRows,
              "sparse_tiles_grid_fits counts these blocks");
constexpr int kTileThreads = 256;
constexpr int kTileStages = 4;
constexpr int64_t kTileBand = 8;     // weight groups of a band (see above)
static_assert(kTileWTiles * 32 == kTileThreads, "one weight vector of a stage per thread");

template <bool kAsym> struct TileStage {
    static constexpr int kCodes = 0;                               // [tile][lane] 16 bytes
    static constexpr int kMeta = kCodes + kTileWTiles * 32 * 16;    // [tile][lane] 8 bytes
    static constexpr int kScales = kMeta + kTileWTiles * 32 * 8;    // [half][tile][lane] 4
    static constexpr int kZeros = kScales + 2 * kTileWTiles * 32 * 4;
    static constexpr int kX = kZeros + (kAsym ? 2 * kTileWTiles * 32 * 4 : 0);
    static constexpr int kBytes = kX + kTileXRows * kXRowBytes;
};

template <typename T, bool kAsym>
__global__ void __launch_bounds__(kTileThreads, 2) sparse_tile_kernel(const SparseGemmArgs a) {
    if constexpr (!kHasSm80) {
        __trap();  // never launched below sm_80
    } else {
        using S = TileStage<kAsym>;
        constexpr int kWarpTiles = 2, kWarpFrags = 4;
        extern __shared__ __align__(16) uint8_t smem[];
        const uint32_t ring = shared_address(smem);
        const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4;
        const int wr = warp % 4, wx = warp / 4;
        const int64_t chunks = a.k / kSparsePackK;
        const int64_t tiles = sparse_prepacked_rows(a.n) / kSparsePackRows;
        // Block -> (weight group, row block) in bands of kTileBand groups; the last band may
        // be narrower.
        const int64_t row_blocks = ceil_div(a.m, kTileXRows);
        const int64_t groups = ceil_div(tiles, kTileWTiles);
        const int64_t band = int64_t(blockIdx.x) / (kTileBand * row_blocks);
        const int64_t width = min(kTileBand, groups - band * kTileBand);
        const int64_t within = int64_t(blockIdx.x) - band * kTileBand * row_blocks;
        const int64_t tile0 = (band * kTileBand + within % width) * kTileWTiles;
        const int64_t m0 = within / width * kTileXRows;
        const uint8_t* meta = a.codes + tiles * kSparsePackRows * a.k / 4;
        const uint8_t* scale_pairs = static_cast<const uint8_t*>(a.scales);
        const uint8_t* x = static_cast<const uint8_t*>(a.x);
        const bool g64 = a.group_size == 64;

        // The copies of chunk c into stage st: thread tid's weight vector (tile tid / 32, its
        // lane), and 4 of the 64 x 16 pieces of x.
        const int my_tile = tid / 32;
        const bool tile_ok = tile0 + my_tile < tiles;
        const auto issue = [&](int64_t c, int st) {
            const uint32_t base = ring + uint32_t(st * S::kBytes);
            if (tile_ok) {
                const int64_t v = ((tile0 + my_tile) * chunks + c) * 32 + lane;
                cp_async_16_zfill(base + S::kCodes + tid * 16, a.codes + v * 16, true);
                cp_async_ca_zfill<8>(base + S::kMeta + tid * 8, meta + v * 8, true);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (h == 1 && !g64) break;
                    const int64_t group = (c * kSparsePackK + 64 * h) / a.group_size;
                    const int64_t gi = ((tile0 + my_tile) * a.groups + group) * 8 + g;
                    cp_async_ca_zfill<4>(base + S::kScales + (h * kTileThreads + tid) * 4,
                                         scale_pairs + gi * 4, true);
                    if constexpr (kAsym)
                        cp_async_ca_zfill<4>(base + S::kZeros + (h * kTileThreads + tid) * 4,
                                             a.zeros + (gi * 2 & ~int64_t(3)), true);
                }
            }
            copy_x_chunk<kTileXRows, kTileThreads>(base + S::kX, x, m0, a.m, a.k, c, tid);
        };

        float acc[kWarpTiles][kWarpFrags][4] = {};
#pragma unroll
        for (int i = 0; i < kTileStages - 1; ++i) {
            if (i < chunks) issue(i, i);
            cp_async_commit();
        }
        for (int64_t c = 0; c < chunks; ++c) {
            cp_async_wait<kTileStages - 2>();
            __syncthreads();  // the stage landed for every thread; the previous one is consumed
            const int64_t ahead = c + kTileStages - 1;
            if (ahead < chunks) issue(ahead, int(ahead % kTileStages));
            cp_async_commit();
            const uint32_t base = ring + uint32_t((c % kTileStages) * S::kBytes);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t b[2][kWarpFrags][4];
#pragma unroll
                for (int ss = 0; ss < 2; ++ss)
#pragma unroll
                    for (int f = 0; f < kWarpFrags; ++f) {
                        const int r = 32 * wx + 8 * f + lane % 8;
                        const int piece = 4 * (2 * h + ss) + lane / 8;
                        ldmatrix_x4(b[ss][f], x_piece_at(base + S::kX, r, piece));
                    }
#pragma unroll
                for (int i = 0; i < kWarpTiles; ++i) {
                    const int slot = (kWarpTiles * wr + i) * 32 + lane;
                    const int hslot = (g64 ? h : 0) * kTileThreads + slot;
                    const int64_t group = (c * kSparsePackK + 64 * h) / a.group_size;
                    const int64_t gi =
                        ((tile0 + kWarpTiles * wr + i) * a.groups + group) * 8 + g;
                    tile_half_mma<T, kAsym, kWarpFrags>(
                        base + S::kCodes + slot * 16, base + S::kMeta + slot * 8,
                        base + S::kScales + hslot * 4, base + S::kZeros + hslot * 4, gi & 1, h,
                        b, acc[i]);
                }
            }
        }
        cp_async_wait<0>();

        const FloatEpilogue<T> ep = a.epilogue<T>();
        const int t = lane % 4;
#pragma unroll
        for (int i = 0; i < kWarpTiles; ++i)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int64_t n = (tile0 + kWarpTiles * wr + i) * kSparsePackRows + g + 8 * (r / 2);
                if (n >= a.n) continue;
#pragma unroll
                for (int f = 0; f < kWarpFrags; ++f) {
                    const int64_t m = m0 + 32 * wx + 8 * f + 2 * t + r % 2;
                    if (m < a.m) ep.store(m, n, ep.add_bias(n, acc[i][f][r]));
                }
            }
    }
}

}  // namespace

cudaError_t gemm_sparse_w4a16_reference(const SparseGemmArgs& args, cudaStream_t stream) {
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym) {
            constexpr bool kAsym = decltype(asym)::value;
            if (args.prepacked)
                return launch_tile_grid(sparse_reference_kernel<T, false, kAsym, true>, args.m,
                                        args.n, kRefBM, kRefBN, kRefThreads, 0, stream, args);
            return with_bool(args.k1632, [&](auto k1632) {
                return launch_tile_grid(
                    sparse_reference_kernel<T, decltype(k1632)::value, kAsym, false>, args.m,
                    args.n, kRefBM, kRefBN, kRefThreads, 0, stream, args);
            });
        });
    });
}

cudaError_t gemm_sparse_w4a16_stream(const SparseGemmArgs& args, cudaStream_t stream) {
    const int64_t tiles = sparse_prepacked_rows(args.n) / kSparsePackRows;
    const int64_t row_blocks = ceil_div(args.m, kRowsPerBlock);
    if (!args.prepacked || args.k1632 || compute_capability() < 80 ||
        !sparse_stream_grid_fits(args.m, args.n))
        return cudaErrorNotSupported;
    // Four tiles per block (one copy of x serves four weight tiles) while that still gives
    // every SM two blocks; fewer tiles for small n.
    const int64_t sms = std::max(sm_count(), 1);
    const int tiles_per_block = ceil_div(tiles, 4) * row_blocks >= 2 * sms   ? 4
                                : ceil_div(tiles, 2) * row_blocks >= 2 * sms ? 2
                                                                              : 1;
    const int x_rows = args.m == 1 ? 1 : args.m <= 8 ? 8 : 16;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym) {
            constexpr bool kAsym = decltype(asym)::value;
            const auto with_rows = [&](auto rows) {
                constexpr int kXRows = decltype(rows)::value;
                const auto launch = [&](auto per_block) {
                    return launch_stream<T, kAsym, decltype(per_block)::value, kXRows>(
                        args, tiles, row_blocks, stream);
                };
                switch (tiles_per_block) {
                    case 4: return launch(std::integral_constant<int, 4>{});
                    case 2: return launch(std::integral_constant<int, 2>{});
                    default: return launch(std::integral_constant<int, 1>{});
                }
            };
            if (x_rows == 1) return with_rows(std::integral_constant<int, 1>{});
            if (x_rows == 8) return with_rows(std::integral_constant<int, 8>{});
            return with_rows(std::integral_constant<int, 16>{});
        });
    });
}

bool sparse_tiles_fill_gpu(int64_t m, int64_t n) {
    const int64_t blocks = ceil_div(m, kTileXRows) *
                           ceil_div(sparse_prepacked_rows(n) / kSparsePackRows, kTileWTiles);
    return 2 * blocks >= 3 * int64_t(std::max(sm_count(), 1));
}

cudaError_t gemm_sparse_w4a16_tiles(const SparseGemmArgs& args, cudaStream_t stream) {
    const int64_t row_blocks = ceil_div(args.m, kTileXRows);
    const int64_t groups = ceil_div(sparse_prepacked_rows(args.n) / kSparsePackRows, kTileWTiles);
    if (!args.prepacked || args.k1632 || compute_capability() < 80 ||
        !sparse_tiles_grid_fits(args.m, args.n))
        return cudaErrorNotSupported;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym) {
            constexpr bool kAsym = decltype(asym)::value;
            constexpr int kSmem = kTileStages * TileStage<kAsym>::kBytes;
            const auto kernel = sparse_tile_kernel<T, kAsym>;
            static std::atomic<uint64_t> opted_in{0};
            const cudaError_t err = allow_dynamic_smem_once(kernel, kSmem, opted_in);
            if (err != cudaSuccess) return err;
            kernel<<<unsigned(row_blocks * groups), kTileThreads, kSmem, stream>>>(args);
            return cudaGetLastError();
        });
    });
}

}  // namespace ck
