// gemm_w4a16.cu - weight-only INT4 linear layer (W4A16): fp16/bf16 activations times a packed
// int4 weight that is dequantized in registers, float32 accumulation, fused bias + activation.
//
// What it computes (the same operations as ck_dequantize_int4 followed by a float GEMM):
//   w'[n][k] = round_to_dtype(float(q - zero) * float(scale[n][k / group_size]))
//   out[m][n] = round_to_dtype(act(sum_k float(x[m][k]) * float(w'[n][k]) + float(bias[n])))
// q is the 4-bit code: two's complement [-8, 7] with zero = 0 (symmetric, zeros == nullptr) or
// unsigned [0, 15] with zero = zeros[n][g] (asymmetric). The sum runs in float32 in any order.
//
// Layout: x [M, K] dtype row-major; w [N, K / 2] bytes, element 2i of a row in the low nibble
// of byte i; scales [N, groups] dtype; zeros [N, groups] uint8; bias [N] dtype; out [M, N] dtype.
// The entry point guarantees K % 32 == 0 (every weight row is a whole number of 16-byte vectors
// and every 32-k run of a row lies in one group), x and w 16-byte aligned, group_size 32, 64,
// 128 or K (CK_GROUP_ROW, resolved by the caller: groups = 1).
//
// Variants (cuda_kernels.cu picks one):
//   reference  any m, any GPU: 64x64 output tiles, 256 threads with 4x4 micro-tiles; each K step
//              of 32 stages x as float and the dequantized weight (rounded to dtype, then widened)
//              in shared memory, float FMAs. Simple, and the baseline the fast path is tested
//              against. Serves M > 16 for now.
//   small_m    sm_80+, m <= 16 (decode): streams the packed weight once, straight from global
//              memory into mma.sync m16n8k16 fragments (f16/bf16 in, f32 accumulators), the
//              int4 -> dtype conversion done with integer masks and a magic exponent; warps of a
//              block split K and add their partial tiles through shared memory.
//
// Floors: bytes = M*K*2 + N*K/2 + N*groups*(2 [+1 with zeros]) + M*N*2 (+ bias); flops = 2*M*N*K.
//   For M <= 16 the weight dominates: time >= N*K/2 / copy bandwidth (H100 ~3.0 TB/s:
//   N=28672 K=8192 -> 117 MB -> ~39 us at full copy speed).
#include "kernels/core/dequant.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/core/mma_pipeline.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"
#include "kernels/gemm/w4a16_reference.cuh"
#include "kernels/sparse/sparse_int4.cuh"

namespace ck {
namespace {

// The sm_80 kernel body compiles for every target; below sm_80 (and in the host pass) the PTX
// wrappers are empty and the kernel traps at entry.
constexpr bool kHasSm80 = CK_SM80;


// ---------------------------------------------------------------------------------------------
// Reference kernel: w4a16_reference.cuh's tiling; a loader dequantizes its 8 codes to dtype.
// ---------------------------------------------------------------------------------------------
// The 8 codes of row r at k .. k + 7 (k a multiple of 8) as signed values q - zero, and their
// scale, in either layout. Interchange: one 4-byte word of the row, codes signed (symmetric) or
// unsigned with zeros[r][g]. Prepacked: the word of the row's 16-byte slice vector, nibbles
// permuted (prepacked_nibble_k), codes always unsigned (zero point 8 when symmetric).
template <typename T, bool kAsym, bool kPrepacked>
__device__ __forceinline__ float load_weight_8(const uint8_t* __restrict__ w,
                                               const T* __restrict__ scales,
                                               const uint8_t* __restrict__ zeros, int64_t r,
                                               int64_t kk, int64_t group_size, int64_t groups,
                                               int64_t k, int (&v)[kRefLoadK]) {
    const int64_t grp = kk / group_size;
    if constexpr (kPrepacked) {
        const int64_t gi = prepacked_group_index(r, grp, groups);
        const int zero = kAsym ? zeros[gi] : int(kSymmetricZero);
        const uint32_t word = *reinterpret_cast<const uint32_t*>(
            w + prepacked_vector_offset(r, kk & ~int64_t(kPackSliceK - 1), prepacked_chunks(k)) +
            (kk % kPackSliceK) / 2);
#pragma unroll
        for (int e = 0; e < kRefLoadK; ++e) v[prepacked_nibble_k(e)] = int((word >> (4 * e)) & 0xF) - zero;
        return to_float(scales[gi]);
    } else {
        const int64_t gi = r * groups + grp;
        const int zero = kAsym ? zeros[gi] : 0;
        load_int4_chunk<true, !kAsym>(w + r * (k / 2) + kk / 2, kRefLoadK, v);
#pragma unroll
        for (int e = 0; e < kRefLoadK; ++e) v[e] -= zero;
        return to_float(scales[gi]);
    }
}

template <typename T, bool kAsym, bool kPrepacked, int kMode = kMoeDense>
__global__ void __launch_bounds__(kRefThreads) gemm_w4a16_reference_kernel(const GemmW4A16Args args) {
    const T* __restrict__ scales = static_cast<const T*>(args.scales);
    reference_tile<T>(args.x_as<T>(), args.m, args.n, args.k, args.epilogue_of<T, kMode>(),
                      [&](int64_t row, int64_t k0, int ld_word, float (&wv)[kRefLoadK]) {
        int v[kRefLoadK];  // q - zero
        const float s = load_weight_8<T, kAsym, kPrepacked>(
            args.w, scales, args.zeros, row, k0 + ld_word * kRefLoadK, args.group_size,
            args.groups, args.k, v);
#pragma unroll
        for (int i = 0; i < kRefLoadK; ++i)
            wv[i] = to_float(from_float<T>(float(v[i]) * s));  // w' rounded to dtype
    });
}

// ---------------------------------------------------------------------------------------------
// Small-M kernel (m <= 16): a weight-streaming GEMV/GEMM on tensor cores.
//
// A block owns kTiles n8 tiles (8 * kTiles consecutive output columns = weight rows); its kWarps
// warps split K into chunks of kChunkK = 128: warp w takes chunks (w * U + u) + i * kWarps * U
// (U = kUnroll consecutive chunks per step).
// Per chunk and n8 tile, lane l (g = l / 4, t = l % 4) loads 16 bytes of weight row
// n0 + 8 tile + g: the 32 codes of k = kk + 32 t .. + 31, all in one group (group sizes are
// multiples of 32), so with them one scale (and zero). Dequantized (Dequant<Int4Zp>, core/dequant.cuh), word i of
// the vector (k = 8i .. 8i + 7 of those 32) becomes pairs P[4i + j] = (k 8i + j, 8i + j + 4).
// mma s (s < 8, k16 each) takes b0 = P[2s], b1 = P[2s + 1]. The lane also loads x rows g and
// g + 8 at the same 32 k (4 x 16 bytes a row; zeros for rows >= m, which are never read) and
// builds A pairs the same way with one byte permute each (x word 4i + 0 / 2 low halves for
// j = 0, ...): a0 = X_g[2s], a1 = X_{g+8}[2s], a2 = X_g[2s + 1], a3 = X_{g+8}[2s + 1].
// Since the sum over k may run in any order as long as A and B agree, this is exact: both
// operands see mma-k {2t, 2t+1} as the physical pair 2s and {2t+8, 2t+9} as pair 2s + 1 of
// lane-column t, a bijection onto the 128 k of the chunk that depends on t only.
// No shared memory on the way in: each weight byte is loaded once, by one lane, and the next
// step's loads are in flight during the current step's MMAs (register double-buffering).
// x is read by every block, from L1/L2; one x load serves kTiles weight rows. kHi = false
// (m <= 8) drops rows g + 8 altogether: half the x registers and loads.
// At the end the warps add their partial accumulators through shared memory (a fixed order:
// deterministic) and the block stores its [m, 8 * kTiles] slice: bias, activation, rounding.
// ---------------------------------------------------------------------------------------------
constexpr int kChunkK = 128;          // k per chunk: 4 lanes x 32 codes
constexpr int kLaneK = 32;            // k per lane and chunk: one 16-byte weight vector
constexpr int kSmallMaxM = 16;        // rows of the mma fragment
constexpr int kXVectors = kLaneK * 2 / 16;  // 16-byte x loads per row, lane and chunk
static_assert(kLaneK % 8 == 0 && kChunkK == 4 * kLaneK, "4 lanes of 32 k per chunk");

template <typename T, int kTiles, int kUnroll, int kWarps, bool kHi, bool kAsym>
__global__ void __launch_bounds__(kWarps * 32)
gemm_w4a16_small_m_kernel(const GemmW4A16Args args) {
    if constexpr (!kHasSm80) __trap();  // never launched below sm_80 (see kHasSm80)
    // Rows 8 .. 15 of the partials are kept even when only rows 0 .. 7 exist (!kHi): the
    // accumulators of both halves stay live and ptxas allocates as it did when this kernel had
    // its own sum (4 tiles x 2 chunks: 230 registers; keeping rows 0 .. 7 only gave 200, and
    // that build ran slower at M = 1 on 8192 x 28672).
    __shared__ WarpPartials<kWarps, kTiles, 2, float> partial;

    const T* __restrict__ x = args.x_as<T>();
    const uint16_t* __restrict__ scales = static_cast<const uint16_t*>(args.scales);
    const int64_t m = args.m, n = args.n, k = args.k;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, tq = lane % 4;
    const int64_t n0 = int64_t(blockIdx.x) * 8 * kTiles;

    // This lane's weight rows (one per n8 tile), at its 32-k column; rows past n read nothing.
    const uint8_t* wrow[kTiles];
    int64_t grow[kTiles];  // first scale (zero) of the row
    bool wok[kTiles];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
        const int64_t row = n0 + 8 * t + g;
        wok[t] = row < n;
        const int64_t r = wok[t] ? row : 0;
        wrow[t] = args.w + r * (k / 2) + tq * (kLaneK / 2);
        grow[t] = r * args.groups;
    }
    const bool x_lo = g < m, x_hi = kHi && g + 8 < m;
    const T* xrow_lo = x + (x_lo ? g : 0) * k + tq * kLaneK;
    const T* xrow_hi = x + (x_hi ? g + 8 : 0) * k + tq * kLaneK;

    // One chunk's registers: per tile the 16-byte weight vector and its scale bits | zero << 16;
    // the x vectors of rows g (lo) and g + 8 (hi).
    struct Chunk128 {
        uint4 w[kTiles];
        uint32_t sz[kTiles];
        uint4 lo[kXVectors];
        uint4 hi[kHi ? kXVectors : 1];
    };
    struct Step {
        Chunk128 c[kUnroll];
    };
    const int64_t chunks = ceil_div(k, kChunkK);
    auto load_step = [&](int64_t c0, Step& s) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t kk = (c0 + u) * kChunkK;     // + 32 tq is in the row pointers
            const int64_t kl = kk + tq * kLaneK;       // this lane's first k
            const bool kok = kl < k;                   // the K tail (and chunks past it)
            const int64_t grp = kl >> args.group_shift;
            Chunk128& c = s.c[u];
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
                const bool ok = kok && wok[t];
                c.w[t] = ok ? load_stream_16(wrow[t] + kk / 2) : make_uint4(0, 0, 0, 0);
                uint32_t sz = 0;  // a zero scale turns the (unloaded) codes into zeros
                if (ok) {
                    const uint32_t zero = kAsym ? uint32_t(__ldg(args.zeros + grow[t] + grp)) : kSymmetricZero;
                    sz = uint32_t(__ldg(scales + grow[t] + grp)) | zero << 16;
                }
                c.sz[t] = sz;
            }
#pragma unroll
            for (int v = 0; v < kXVectors; ++v) {
                c.lo[v] = kok && x_lo ? __ldg(reinterpret_cast<const uint4*>(xrow_lo + kk) + v)
                                      : make_uint4(0, 0, 0, 0);
                if constexpr (kHi)
                    c.hi[v] = kok && x_hi ? __ldg(reinterpret_cast<const uint4*>(xrow_hi + kk) + v)
                                          : make_uint4(0, 0, 0, 0);
            }
        }
    };

    // x vector v holds k 8v .. 8v + 7 as words (8v, 8v+1) (8v+2, 8v+3) (8v+4, 8v+5) (8v+6, 8v+7);
    // pairs (8v + j, 8v + j + 4) for j = 0..3 take the low / high halves of words 0 and 2 (j = 0,
    // 1) and of words 1 and 3 (j = 2, 3): the order the dequantizer gives the weight.
    auto x_pairs = [](const uint4 (&xv)[kXVectors], uint32_t (&a)[2 * kXVectors * 2]) {
#pragma unroll
        for (int v = 0; v < kXVectors; ++v) {
            a[4 * v + 0] = __byte_perm(xv[v].x, xv[v].z, 0x5410);
            a[4 * v + 1] = __byte_perm(xv[v].x, xv[v].z, 0x7632);
            a[4 * v + 2] = __byte_perm(xv[v].y, xv[v].w, 0x5410);
            a[4 * v + 3] = __byte_perm(xv[v].y, xv[v].w, 0x7632);
        }
    };
    constexpr int kPairs = kLaneK / 2;  // 16 pairs of k per lane and chunk
    static_assert(2 * kXVectors * 2 == kPairs, "4 pairs per x vector");

    float acc[kTiles][4] = {};
    auto compute_step = [&](const Step& s) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const Chunk128& c = s.c[u];
            uint32_t a_lo[kPairs], a_hi[kPairs];
            x_pairs(c.lo, a_lo);
            if constexpr (kHi) {
                x_pairs(c.hi, a_hi);
            } else {
#pragma unroll
                for (int p = 0; p < kPairs; ++p) a_hi[p] = 0;
            }
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
                const uint32_t scale2 = __byte_perm(c.sz[t], 0, 0x1010);  // scale in both halves
                const uint32_t zero = c.sz[t] >> 16;
                const uint32_t bias = kAsym ? 0u : kSymmetricBias;
                uint32_t b[kPairs];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    uint32_t p4[4];
                    Dequant<Int4Zp, T>::word(word(c.w[t], i) ^ bias, {zero, scale2}, p4);
#pragma unroll
                    for (int j = 0; j < 4; ++j) b[4 * i + j] = p4[j];
                }
#pragma unroll
                for (int s16 = 0; s16 < kPairs / 2; ++s16)
                    mma_16x8x16<T>(acc[t], a_lo[2 * s16], a_hi[2 * s16], a_lo[2 * s16 + 1],
                                   a_hi[2 * s16 + 1], b[2 * s16], b[2 * s16 + 1]);
            }
        }
    };

    // Software pipeline in registers: the next step's loads are issued before this step's
    // dequantization and MMAs.
    register_pipeline<kWarps, kUnroll, Step>(chunks, warp, load_step, compute_step);

    // Sum the warps' partial tiles; one thread per accumulator pair (c0 c1 or c2 c3) stores.
    const FloatEpilogue<T> ep = args.epilogue<T>();
    sum_warp_partials(partial, acc, [&](int t, int rh, int l, float s0, float s1) {
        const int64_t row = l / 4 + 8 * rh;
        const int64_t col = n0 + 8 * t + 2 * (l % 4);
        if (row >= m || col >= n) return;
        ep.store_pair(row, col, ep.add_bias(col, s0), col + 1 < n ? ep.add_bias(col + 1, s1) : s1);
    });
}

// A small-M configuration: kTiles n8 tiles per block, kUnroll chunks per warp and step,
// kWarps warps splitting K.
template <int kTiles_, int kUnroll_, int kWarps_> struct SmallMConfig {
    static constexpr int kTiles = kTiles_, kUnroll = kUnroll_, kWarps = kWarps_;
    static constexpr int kCols = 8 * kTiles;
};

template <class Cfg, typename T, bool kHi, bool kAsym>
cudaError_t launch_small_m(const GemmW4A16Args& a, cudaStream_t stream) {
    const int64_t blocks = ceil_div(a.n, Cfg::kCols);
    if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
    gemm_w4a16_small_m_kernel<T, Cfg::kTiles, Cfg::kUnroll, Cfg::kWarps, kHi, kAsym>
        <<<unsigned(blocks), Cfg::kWarps * 32, 0, stream>>>(a);
    return cudaGetLastError();
}

// Configurations, widest first; the launcher takes the first whose grid gives every SM at least
// kMinBlocksPerSm blocks, else the last. Wider blocks read x fewer times per weight byte
// (x traffic from L2 per weight byte = m / (2 * kTiles) with kHi, which matters at m = 16);
// narrower ones keep enough warps streaming when N is small. Each keeps 64-128 bytes of the
// weight in flight per lane: kTiles * kUnroll * 16. ptxas (CUDA 13, sm_90, no spills): LoWide
// 119-124 registers, LoNarrow 153-164, HiWide 224-230, HiMid 160-162, HiNarrow 144-146; so 4
// blocks of 4 warps per SM for LoWide, 3 for LoNarrow, 2 (or 1 of 8) for the wide Hi ones.
// Both Lo shapes were chosen by timing at M = 1 (benchmarks/NOTES.md): LoNarrow with 4 warps
// (every block resident) beat 8, and LoWide with one chunk per step (4 blocks per SM) beat two
// (2 blocks per SM): more resident warps hide more latency than deeper per-lane loads.
using SmallLoWide = SmallMConfig<4, 1, 4>;    // m <= 8: 32 columns, 64 B per lane in flight
using SmallLoNarrow = SmallMConfig<2, 2, 4>;  // m <= 8: 16 columns, 4 warps on K
using SmallHiWide = SmallMConfig<8, 1, 4>;    // m > 8: 64 columns, 128 B per lane
using SmallHiMid = SmallMConfig<4, 1, 4>;     // m > 8: 32 columns
using SmallHiNarrow = SmallMConfig<2, 1, 8>;  // m > 8: 16 columns, 8 warps on K
constexpr int64_t kMinBlocksPerSm = 2;

// ---------------------------------------------------------------------------------------------
// Prepack (ck_w4a16_prepack): interchange -> prepacked layout (gemm/w4a16_prepacked.cuh).
// prepack_codes (also the block formats' codes): one thread per 16-byte output vector (a row's
// 32-k slice) reads the slice's 16 bytes from the source row (when inside the matrix) and
// permutes each word's nibbles; the INT4 prepack makes the codes unsigned (flip) and pads rows
// and slices at k >= K with code 8. A second kernel, one thread per
// prepacked scale, copies scales (0 for padding rows) and zeros (8 for padding rows).
// Run once per weight: simple beats fast here.
// ---------------------------------------------------------------------------------------------
// The interchange row that prepacked row `row` takes: itself, or with interleave = n / 2 (the
// MoE gate+up weight) tile 2i = rows 8i .. 8i + 7 of the first half, tile 2i + 1 the same rows
// of the second half, or the fused Q/K/V weight's rotary pairs.
__device__ __forceinline__ int64_t prepack_source_row(int64_t row, int64_t interleave,
                                                      const RopePairs& rope) {
    if (interleave == 0) return rope.source(row);
    const int64_t tile = row / kPackRows;
    return (tile % 2) * interleave + (tile / 2) * kPackRows + row % kPackRows;
}

// Word of 8 codes -> prepacked word (nibble e holds k prepacked_nibble_k(e)). The source holds
// k in nibble k, or (kHighFirst) in nibble k ^ 1: element 2i in the high nibble of byte i.
template <bool kHighFirst> __device__ __forceinline__ uint32_t prepack_word(uint32_t w) {
    uint32_t r = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int k = prepacked_nibble_k(e);
        r |= ((w >> (4 * (kHighFirst ? k ^ 1 : k))) & 0xFu) << (4 * e);
    }
    return r;
}

// The dense codes of row `row`'s 32-k slice k0 of a sparse source (SparseSource).
__device__ __forceinline__ uint4 sparse_source_slice(const PrepackCodesArgs& a, int64_t row,
                                                     int64_t k0) {
    const SparseSource& s = a.sparse;
    const uint32_t meta = s.meta[row * (a.k / kSparseWordK) + k0 / kSparseWordK];
    const uint2 codes = *reinterpret_cast<const uint2*>(a.w + row * (a.k / 4) + k0 / 4);
    const uint32_t fill = s.zeros ? s.zeros[row * (a.k / s.group_size) + k0 / s.group_size] : 0u;
    return s.k1632 ? sparse_dense_codes<true>(meta, codes, fill)
                   : sparse_dense_codes<false>(meta, codes, fill);
}

template <bool kHighFirst>
__global__ void __launch_bounds__(kPrepackThreads) prepack_codes_kernel(const PrepackCodesArgs a) {
    const int64_t chunks = prepacked_chunks(a.k);
    const int64_t slices = chunks * (kPackK / kPackSliceK);
    const int64_t vectors = prepacked_rows(a.n) * slices;
    for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
         v += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = v / slices, k0 = v % slices * kPackSliceK;
        uint4 out = make_uint4(a.pad, a.pad, a.pad, a.pad);
        if (row < a.n && k0 < a.k) {  // k % 32 == 0: a slice is all inside or all padding
            const int64_t src = prepack_source_row(row, a.interleave, a.rope);
            const uint4 in = a.sparse.meta
                                 ? sparse_source_slice(a, src, k0)
                                 : *reinterpret_cast<const uint4*>(a.w + src * (a.k / 2) + k0 / 2);
            out = make_uint4(prepack_word<kHighFirst>(in.x ^ a.flip),
                             prepack_word<kHighFirst>(in.y ^ a.flip),
                             prepack_word<kHighFirst>(in.z ^ a.flip),
                             prepack_word<kHighFirst>(in.w ^ a.flip));
        }
        *reinterpret_cast<uint4*>(a.w_out + prepacked_vector_offset(row, k0, chunks)) = out;
    }
}

template <typename T>
__global__ void __launch_bounds__(kPrepackThreads)
w4a16_prepack_groups_kernel(const T* __restrict__ scales, const uint8_t* __restrict__ zeros,
                            int64_t n, int64_t groups, int64_t interleave, RopePairs rope,
                            T* __restrict__ scales_out, uint8_t* __restrict__ zeros_out) {
    const int64_t count = prepacked_rows(n) * groups;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = i / groups, g = i % groups;
        const int64_t dst = prepacked_group_index(row, g, groups);
        const int64_t src = prepack_source_row(row, interleave, rope) * groups + g;
        scales_out[dst] = row < n ? scales[src] : from_float<T>(0.f);
        if (zeros_out) zeros_out[dst] = row < n ? zeros[src] : uint8_t(kSymmetricZero);
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers (arguments validated by cuda_kernels.cu)
// ---------------------------------------------------------------------------------------------
cudaError_t gemm_w4a16_reference(const GemmW4A16Args& args, cudaStream_t stream) {
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym) {
            if (args.qkv.q)  // the fused projection reads a prepacked weight
                return launch_tile_grid(
                    gemm_w4a16_reference_kernel<T, decltype(asym)::value, true, kQkvRows>,
                    args.m, args.n, kRefBM, kRefBN, kRefThreads, 0, stream, args);
            return with_bool(args.prepacked, [&](auto prepacked) {
                return launch_tile_grid(
                    gemm_w4a16_reference_kernel<T, decltype(asym)::value, decltype(prepacked)::value>,
                    args.m, args.n, kRefBM, kRefBN, kRefThreads, 0, stream, args);
            });
        });
    });
}

cudaError_t gemm_w4a16_small_m(const GemmW4A16Args& args, cudaStream_t stream) {
    if (args.m < 1 || args.m > kSmallMaxM || compute_capability() < 80) return cudaErrorNotSupported;
    const int64_t min_blocks = kMinBlocksPerSm * std::max(sm_count(), 1);
    const auto fits = [&](int64_t cols) { return ceil_div(args.n, cols) >= min_blocks; };
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(args.zeros != nullptr, [&](auto asym) {
            constexpr bool kAsym = decltype(asym)::value;
            if (args.m <= 8) {
                if (fits(SmallLoWide::kCols)) return launch_small_m<SmallLoWide, T, false, kAsym>(args, stream);
                return launch_small_m<SmallLoNarrow, T, false, kAsym>(args, stream);
            }
            if (fits(SmallHiWide::kCols)) return launch_small_m<SmallHiWide, T, true, kAsym>(args, stream);
            if (fits(SmallHiMid::kCols)) return launch_small_m<SmallHiMid, T, true, kAsym>(args, stream);
            return launch_small_m<SmallHiNarrow, T, true, kAsym>(args, stream);
        });
    });
}

cudaError_t prepack_codes(const PrepackCodesArgs& args, cudaStream_t stream) {
    const int64_t vectors = prepacked_rows(args.n) * prepacked_chunks(args.k) * (kPackK / kPackSliceK);
    if (args.high_first)
        prepack_codes_kernel<true><<<prepack_blocks(vectors), kPrepackThreads, 0, stream>>>(args);
    else
        prepack_codes_kernel<false><<<prepack_blocks(vectors), kPrepackThreads, 0, stream>>>(args);
    return cudaGetLastError();
}

cudaError_t w4a16_prepack(const W4A16PrepackArgs& args, cudaStream_t stream) {
    const uint32_t code8 = 0x88888888u;  // code 8 everywhere: the padding; the symmetric flip
    const cudaError_t err = prepack_codes(
        {args.w, args.n, args.k, args.interleave, args.zeros == nullptr ? code8 : 0u, code8,
         /*high_first=*/false, args.w_out, args.rope, args.sparse},
        stream);
    if (err != cudaSuccess) return err;
    const unsigned blocks = prepack_blocks(prepacked_rows(args.n) * args.groups);
    return dispatch_half_dtype(args.dtype, [&](auto tag) {
        using T = decltype(tag);
        w4a16_prepack_groups_kernel<T><<<blocks, kPrepackThreads, 0, stream>>>(
            static_cast<const T*>(args.scales), args.zeros, args.n, args.groups, args.interleave,
            args.rope, static_cast<T*>(args.scales_out), args.zeros_out);
        return cudaGetLastError();
    });
}

}  // namespace ck
