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
template <typename T, bool k1632, bool kAsym>
__global__ void __launch_bounds__(kRefThreads) sparse_reference_kernel(const SparseGemmArgs a) {
    const T* __restrict__ scales = static_cast<const T*>(a.scales);
    reference_tile<T>(static_cast<const T*>(a.x), a.m, a.n, a.k, a.epilogue<T>(),
                      [&](int64_t row, int64_t k0, int ld_word, float (&wv)[kRefLoadK]) {
        const int64_t kk = k0 + ld_word * kRefLoadK;
        const int64_t gi = row * a.groups + kk / a.group_size;
        sparse_dense8<T, k1632, kAsym>(a.codes + row * (a.k / 4),
                                       a.meta + row * (a.k / kSparseWordK), kk,
                                       to_float(scales[gi]), kAsym ? a.zeros[gi] : 0, wv);
    });
}

// ---------------------------------------------------------------------------------------------
// Stream (mma.sp)
// ---------------------------------------------------------------------------------------------
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerBlock = 16;           // rows of x: two n8 B fragments
constexpr int kSteps = kSparsePackK / 32;   // mma.sp k32 steps per chunk
static_assert(kSteps == 4, "a chunk is two 64-k halves of two steps each");

// One tile's weight data of one chunk for one lane.
struct ChunkData {
    uint4 codes;
    uint2 meta;
};

template <typename T, bool kAsym, int kTiles, int kFrags>
__global__ void __launch_bounds__(kThreads) sparse_stream_kernel(const SparseGemmArgs a) {
    if constexpr (!kHasSm80) {
        __trap();  // never launched below sm_80
    } else {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        const int64_t chunks = a.k / kSparsePackK;
        const int64_t tiles = sparse_prepacked_rows(a.n) / kSparsePackRows;
        const int64_t tile0 = int64_t(blockIdx.x) * kTiles;
        const int64_t m0 = int64_t(blockIdx.y) * kRowsPerBlock;
        const uint4* codes = reinterpret_cast<const uint4*>(a.codes);
        const uint2* meta = reinterpret_cast<const uint2*>(a.codes + tiles * kSparsePackRows * a.k / 4);
        const uint32_t* scale_pairs = static_cast<const uint32_t*>(a.scales);
        const uint16_t* zero_pairs = reinterpret_cast<const uint16_t*>(a.zeros);
        const T* x = static_cast<const T*>(a.x);

        const auto load = [&](int64_t c, ChunkData (&d)[kTiles]) {
#pragma unroll
            for (int i = 0; i < kTiles; ++i) {
                if (tile0 + i < tiles) {
                    const int64_t v = ((tile0 + i) * chunks + c) * 32 + lane;
                    d[i].codes = load_stream_16(codes + v);
                    d[i].meta = __ldg(meta + v);
                } else {
                    d[i].codes = make_uint4(0, 0, 0, 0);
                    d[i].meta = make_uint2(kSparse24FirstTwo, kSparse24FirstTwo);
                }
            }
        };

        float acc[kTiles][kFrags][4] = {};
        ChunkData cur[kTiles], next[kTiles];
        if (warp < chunks) load(warp, cur);
        for (int64_t c = warp; c < chunks; c += kWarps) {
            if (c + kWarps < chunks) load(c + kWarps, next);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t group = (c * kSparsePackK + 64 * h) / a.group_size;
                uint32_t pg[kTiles][4], pg8[kTiles][4];  // dequantized pairs, rows g and g + 8
#pragma unroll
                for (int i = 0; i < kTiles; ++i) {
                    const int64_t gi = ((tile0 + i) * a.groups + group) * 8 + g;
                    const bool real = tile0 + i < tiles;
                    const uint32_t s2 = real ? __ldg(scale_pairs + gi) : 0u;
                    const uint32_t z2 = kAsym && real ? __ldg(zero_pairs + gi) : 0x0808u;
                    using D = Dequant<Int4Zp, T>;
                    const typename D::Block bg{kAsym ? z2 & 0xFFu : kSymmetricZero,
                                               (s2 & 0xFFFFu) * 0x10001u};
                    const typename D::Block bg8{kAsym ? z2 >> 8 : kSymmetricZero,
                                                (s2 >> 16) * 0x10001u};
                    D::word(word(cur[i].codes, 2 * h), bg, pg[i]);
                    D::word(word(cur[i].codes, 2 * h + 1), bg8, pg8[i]);
                }
#pragma unroll
                for (int ss = 0; ss < 2; ++ss) {
                    const int64_t k = c * kSparsePackK + (2 * h + ss) * 32;
                    uint32_t b[kFrags][4];
#pragma unroll
                    for (int f = 0; f < kFrags; ++f) {
                        const int64_t row = m0 + 8 * f + g;
                        const T* xr = x + row * a.k + k + 2 * t;
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            b[f][j] = row < a.m ? __ldg(reinterpret_cast<const uint32_t*>(xr + 8 * j))
                                                : 0u;
                    }
#pragma unroll
                    for (int i = 0; i < kTiles; ++i) {
                        const uint32_t av[4] = {pg[i][2 * ss], pg8[i][2 * ss], pg[i][2 * ss + 1],
                                                pg8[i][2 * ss + 1]};
                        const uint32_t e = h == 0 ? cur[i].meta.x : cur[i].meta.y;
#pragma unroll
                        for (int f = 0; f < kFrags; ++f) {
                            if (ss == 0) mma_sp_16x8x32<T, 0>(acc[i][f], av, b[f], e);
                            else mma_sp_16x8x32<T, 1>(acc[i][f], av, b[f], e);
                        }
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < kTiles; ++i) cur[i] = next[i];
        }

        // The warps' partial tiles, added in warp order.
        constexpr int kRegs = kTiles * kFrags * 4;
        __shared__ float partial[kWarps][kRegs][32];
#pragma unroll
        for (int i = 0; i < kTiles; ++i)
#pragma unroll
            for (int f = 0; f < kFrags; ++f)
#pragma unroll
                for (int r = 0; r < 4; ++r) partial[warp][(i * kFrags + f) * 4 + r][lane] = acc[i][f][r];
        __syncthreads();
        const FloatEpilogue<T> ep = a.epilogue<T>();
        for (int item = threadIdx.x; item < kRegs * 32; item += kThreads) {
            const int q = item / 32, l = item % 32;
            const int i = q / (kFrags * 4), f = q / 4 % kFrags, r = q % 4;
            const int64_t n = (tile0 + i) * kSparsePackRows + l / 4 + 8 * (r / 2);
            const int64_t m = m0 + 8 * f + 2 * (l % 4) + r % 2;
            if (n >= a.n || m >= a.m) continue;
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) sum += partial[w][q][l];
            ep.store(m, n, ep.add_bias(n, sum));
        }
    }
}

template <typename T, bool kAsym, int kTiles, int kFrags>
cudaError_t launch_stream(const SparseGemmArgs& a, int64_t tiles, int64_t row_blocks,
                          cudaStream_t stream) {
    const dim3 grid(unsigned(ceil_div(tiles, kTiles)), unsigned(row_blocks));
    sparse_stream_kernel<T, kAsym, kTiles, kFrags><<<grid, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace

cudaError_t gemm_sparse_w4a16_reference(const SparseGemmArgs& args, cudaStream_t stream) {
    if (args.prepacked) return cudaErrorNotSupported;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.k1632, [&](auto k1632) {
            return with_bool(args.zeros != nullptr, [&](auto asym) {
                return launch_tile_grid(sparse_reference_kernel<T, k1632, asym>, args.m, args.n,
                                        kRefBM, kRefBN, kRefThreads, 0, stream, args);
            });
        });
    });
}

cudaError_t gemm_sparse_w4a16_stream(const SparseGemmArgs& args, cudaStream_t stream) {
    const int64_t tiles = sparse_prepacked_rows(args.n) / kSparsePackRows;
    const int64_t row_blocks = ceil_div(args.m, kRowsPerBlock);
    if (!args.prepacked || args.k1632 || compute_capability() < 80 || row_blocks > kMaxGridY ||
        tiles > INT32_MAX)
        return cudaErrorNotSupported;
    // Four tiles per block (fewer loads of x per weight byte) while that still gives every SM
    // two blocks; fewer tiles for small n.
    const int64_t sms = std::max(sm_count(), 1);
    const int tiles_per_block = ceil_div(tiles, 4) * row_blocks >= 2 * sms   ? 4
                                : ceil_div(tiles, 2) * row_blocks >= sms ? 2
                                                                          : 1;
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym) {
            return with_bool(args.m > 8 || row_blocks > 1, [&](auto two) {
                constexpr int kFrags = decltype(two)::value ? 2 : 1;
                switch (tiles_per_block) {
                    case 4: return launch_stream<T, asym, 4, kFrags>(args, tiles, row_blocks, stream);
                    case 2: return launch_stream<T, asym, 2, kFrags>(args, tiles, row_blocks, stream);
                    default: return launch_stream<T, asym, 1, kFrags>(args, tiles, row_blocks, stream);
                }
            });
        });
    });
}

}  // namespace ck
