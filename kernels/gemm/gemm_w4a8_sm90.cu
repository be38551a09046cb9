// gemm_w4a8_sm90.cu - W4A8 (ck_gemm_w4a8) on Hopper tensor cores: FP8 E4M3 activations times
// packed symmetric INT4 weights, the weight converted to E4M3 in registers and fed to wgmma as
// its register A operand (the "wgmma" variant; "auto" picks it for M > 16 on compute
// capability 9.0).
//
// What it computes (the header's definition, tests/reference.py gemm_w4a8):
//   acc[m, n] = sum_kb float(w_scales[n, g(kb)]) * sum_{k in kb} e4m3(a[m, k]) * q[n, k]
//   out[m, n] = act(acc[m, n] * scale_a[m or 0] + bias[n]), one rounding to out_dtype
// over the 128-wide k-blocks kb (g(kb) = kb for group 128, 0 for a row's one group); each
// k-block's sums start from zero on the tensor cores and are added into float32 accumulators
// with one fma by their scale.
//
// Layout: a [M, K] E4M3 bytes, w_packed [N, K / 2] (code 2i in the low nibble of byte i, two's
// complement), w_scales [N, groups] fp16 or bf16; out [M, N] row-major.
//
// Algorithm. The wgmma computes out^T, as the W4A16 wgmma kernel does
// (gemm_w4a16_prepacked_wgmma_sm90.cu): A (64 x 32, M of the instruction) is the weight,
// converted to E4M3 in registers; B (32 x kBM, N of the instruction) is a^T, whose K-major form
// "kBM rows of 32 contiguous bytes" is a's row-major rows, read from shared memory. So the codes
// never go through shared memory as E4M3 bytes (the earlier W4A8 kernel converted the weight's
// tile into a shared-memory operand for a = A, weight = B: this kernel is 1.06-1.83x faster at
// M >= 64, benchmarks/NOTES.md). Persistent CTAs (one per SM) take the 128-weight-row x kBM-row
// output tiles (kBM = 64 or 128) in turn, K in 128-k chunks through a kStages-deep ring that
// runs on across a CTA's tiles; 384 threads:
//   - warpgroup 2, the producer, gives most of its registers to the consumers (setmaxnreg); its
//     warp 8's lane 0 issues per stage one TMA copy of a (kBM rows x 128 bytes, the 128-byte
//     swizzle: the FP8 GEMM's operand layout) and one of the weight's codes (128 rows x 64
//     bytes, the 64-byte swizzle), both completing on the stage's "full" mbarrier.
//   - warpgroups 0 and 1, the consumers: warpgroup c owns weight rows 64 c .. 64 c + 63 of the
//     tile. Per chunk it issues 4 wgmma m64n{kBM}k32 into a second accumulator set (the first
//     with scale-d = 0), then converts the next chunk's codes into the other A fragment set while
//     they run, waits, releases the stage ("empty", one arrival per warp) and adds the chunk's
//     sums into the float32 accumulators, times each row's group scale (fma). The other
//     consumer warpgroup's wgmmas keep the tensor cores busy meanwhile. The group scales of the
//     thread's two rows are read from global memory one chunk ahead.
//   - TMA zero-fills rows past M and N and k past K: a zero code is E4M3 zero, so partial tiles
//     need no masking; scales of rows past N read nothing.
//   - Epilogue: acc * scale_a + bias, activation, one rounding, straight from the registers
//     (one shuffle per accumulator pair turns the transposed fragments into column pairs).
//
// A fragments. wgmma's 8-bit A fragment for k32 (the mma.sync m16n8k32 A fragment of each
// warp's 16 rows): warp w, lane (g, t) holds a[0] = A[16w + g][4t .. 4t + 3], a[1] = A[16w + g
// + 8][4t .. 4t + 3], a[2] and a[3] the same at k 16 + 4t .. 16 + 4t + 3 (one byte each, lower k
// in the lower byte). In the packed row, k 4t .. 4t + 3 of the k32 step s are bytes 2t, 2t + 1
// of its 16 bytes and k 16 + 4t .. + 3 bytes 8 + 2t, 9 + 2t: half t % 2 of the 32-bit words
// t / 2 and 2 + t / 2. So per row and step a lane loads those two words, one byte permute puts
// its eight codes in one word (nibble j = code j), and int4_to_e4m3_x8 (int_gemm.cuh, three byte
// permutes per four codes) gives a[0] and a[2] (or a[1] and a[3]).
//
// Shared memory: per stage the a tile [kBM][128 B] (8-row groups 1024 bytes apart, swizzled,
// read by wgmma descriptors: k32 step s starts 32 s bytes into the rows) and the code tile
// [128][64 B], whose 16-byte unit u of row r TMA stores at u ^ ((r / 2) % 4) (the 64-byte
// swizzle XORs address bits 4-5 with bits 7-8): the 8 rows g of a warp's load then meet 8
// distinct bank groups (rows are 64 bytes, so unswizzled rows g and g + 2 would share banks).
//
// Floors: flops 2 M N K at the dense FP8 peak (~1979 TFLOP/s on the H100 SXM): 4096 x 14336 x
// 4096 -> 481 GFLOP -> 243 us; the weight N K / 2 bytes at ~3.0 TB/s (29.4 MB -> 9.8 us).
// Where it stands (benchmarks/NOTES.md, "W4A8"): about half the W8A8 FP8 GEMM's speed at large
// M. Per chunk a consumer warp issues ~330 instructions (the conversion ~190, the k-block's
// 64 fmas, the wgmmas and the ring), at 0.46 issued per scheduler and cycle with 2 warps per
// scheduler: the loop is latency-bound; without the conversion the same loop ran 1.3x faster,
// without the conversion and the per-k-block promotion 1.6x.
//
// The Hopper primitives are in kernels/core/ptx_sm90.cuh, the tensor maps in tma.cuh. Kernel
// bodies exist in the sm_90a pass only (CK_SM90A_DEVICE); the host never launches the empty ones
// of other targets (gemm_w4a8_sm90 refuses without tma_wgmma_built_and_runnable()).
#include <atomic>

#include "kernels/core/cluster_split.cuh"
#include "kernels/core/ptx_sm90.cuh"
#include "kernels/core/tma.cuh"
#include "kernels/gemm/gemm_int8.cuh"

namespace ck {
namespace {

constexpr int kConsumers = 2;
constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;  // 384
[[maybe_unused]] constexpr int kProducerWarp = 4 * kConsumers;  // warp 8
constexpr int kWgmmaM = 64;
constexpr int kBN = kConsumers * kWgmmaM;  // 128 weight rows (output columns) per tile
constexpr int kChunkK = 128;               // k per stage: one k-block of scales
constexpr int kStepK = 32;                 // k per wgmma (FP8)
constexpr int kSteps = kChunkK / kStepK;   // 4
constexpr int kABytes = kChunkK;           // a row's bytes per chunk: one 128-byte swizzle row
constexpr int kWRowBytes = kChunkK / 2;    // a weight row's packed bytes per chunk: 64
constexpr int kWStageBytes = kBN * kWRowBytes;  // 8 KB
[[maybe_unused]] constexpr int kEmptyArrivals = 4 * kConsumers;  // one per consumer warp
[[maybe_unused]] constexpr int kGroupM = 8;  // tile rows per rasterization group
// One CTA per SM: 168 registers per thread at launch, the producer keeps 40, the consumers 232.
[[maybe_unused]] constexpr int kProducerRegisters = SplitRegisters<1>::kProducer;
[[maybe_unused]] constexpr int kConsumerRegisters = SplitRegisters<1>::kConsumer;
static_assert(kThreads == kSplitThreads, "two consumer warpgroups, then the producer's");
static_assert(kChunkK == kFp8Block, "a chunk is one k-block of the group scales");

template <int kRows> struct W4A8Tile {
    static constexpr int kBM = kRows;  // a rows per tile: the wgmma's N
    static constexpr int kAStageBytes = kBM * kABytes;
    static constexpr int kStageBytes = kAStageBytes + kWStageBytes;
    static constexpr int kStages = kRows == 128 ? 6 : 8;
    static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
    // A split tile's float32 partial sums (kBN x kBM), after the ring and the barriers.
    static constexpr int kPartialBytes = kBN * kBM * 4;
    static constexpr int kSplitSmemBytes = kSmemBytes + kPartialBytes;
    static_assert(kRows == 64 || kRows == 128, "wgmma m64n64k32 or m64n128k32");
    static_assert(kAStageBytes % 1024 == 0 && kStageBytes % 1024 == 0,
                  "every tile keeps the swizzles' 1024-byte alignment");
    static_assert(kSplitSmemBytes <= 227 * 1024, "one CTA per SM");
    static_assert((kStages * kStageBytes + 2 * kStages * 8) % 16 == 0, "partials 16-byte aligned");
};

// Byte offset, in a code tile, of 32-bit word i (0 .. 3) of 16-byte unit u of row r, where the
// 64-byte swizzle put it (see the layout comment).
[[maybe_unused]] __device__ __forceinline__ int code_word_offset(int row, int unit, int i) {
    return row * kWRowBytes + 16 * (unit ^ ((row >> 1) & 3)) + 4 * i;
}

// The A fragments of the thread's rows r0 (a[s][0], a[s][2]) and r0 + 8 (a[s][1], a[s][3]) for
// the chunk's 4 k32 steps s, from the stage's code tile (see "A fragments").
[[maybe_unused]] __device__ __forceinline__ void convert_chunk(const uint8_t* codes, int r0, int t,
                                                               uint32_t (&a)[kSteps][4]) {
    const uint32_t select = (t & 1) ? 0x7632u : 0x5410u;  // half t % 2 of both words
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = r0 + 8 * h;
            const uint32_t lo =
                *reinterpret_cast<const uint32_t*>(codes + code_word_offset(row, s, t >> 1));
            const uint32_t hi =
                *reinterpret_cast<const uint32_t*>(codes + code_word_offset(row, s, 2 + (t >> 1)));
            int4_to_e4m3_x8(prmt(lo, hi, select), a[s][h], a[s][2 + h]);
        }
    }
}

#ifdef CK_SM90A_DEVICE
// The group scales of one weight row per k-block: raw() loads the fp16 or bf16 bits (0 for a row
// past N), value() turns them into float32. Loaded a chunk before their use and converted only
// then: converted right after the load, the warp waits for the load (from L2, hundreds of cycles)
// before it converts the next chunk's codes.
struct RowScales {
    const uint16_t* p;  // the row's first scale, or nullptr past N
    int step;           // between k-blocks' scales: 0 for a row's one group
    bool bf16;
    __device__ __forceinline__ RowScales(const GroupScales& g, int64_t row, int64_t n)
        : p(row < n ? g.p + row * g.groups : nullptr), step(g.groups == 1 ? 0 : 1), bf16(g.bf16) {}
    __device__ __forceinline__ uint32_t raw(int kb) const { return p ? __ldg(p + kb * step) : 0u; }
    __device__ __forceinline__ float value(uint32_t bits) const {
        return bf16 ? __uint_as_float(bits << 16) : __half2float(__ushort_as_half(uint16_t(bits)));
    }
};
#endif

// Persistent: CTA i takes the tiles i, i + gridDim.x, ... (grouped_tile order); the ring's stages
// and phases run on across its tiles, so the producer loads the next tile's chunks while the
// consumers finish and store this one.
// split > 1 (4 or 8; a cluster of `split` consecutive CTAs per tile, for calls whose tiles
// leave SMs idle): rank r of the cluster takes the k-blocks [chunks r / split, chunks (r + 1) /
// split) of each of the cluster's tiles, and at the end of a tile every CTA puts its float32
// sums in its shared memory; rank r then adds the 8-row blocks j with j % split == r over the
// cluster's CTAs in rank order (distributed shared memory: the result does not depend on which
// CTA adds) and stores them. Every thread of the CTA, the producer's too, takes part in the two
// cluster barriers of each tile.
template <typename OutT, int kBM>
__global__ void __launch_bounds__(kThreads, 1)
gemm_w4a8_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                       const __grid_constant__ CUtensorMap map_w, const GroupScales scales,
                       const Epilogue<OutT> ep, const int chunks, const int64_t tiles,
                       const int split) {
#ifdef CK_SM90A_DEVICE
    using Tile = W4A8Tile<kBM>;
    constexpr int kStages = Tile::kStages;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * Tile::kStageBytes);
    uint64_t* empty = full + kStages;
    auto a_tile = [&](int stage) { return smem + stage * Tile::kStageBytes; };
    auto w_tile = [&](int stage) { return a_tile(stage) + Tile::kAStageBytes; };

    float* partials = reinterpret_cast<float*>(empty + kStages);  // split > 1: [kBM / 8][256][4]
    const int rank = split > 1 ? int(cluster_ctarank()) : 0;
    const int64_t first_tile = blockIdx.x / split, tile_step = gridDim.x / split;
    const ChunkRange kr = split_chunks(chunks, split, rank);
    const int kc_begin = kr.begin, kc_end = kr.end;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kEmptyArrivals);
        }
        fence_mbarrier_init();
        fence_proxy_async_shared();
    }
    __syncthreads();

    if (warp >= kProducerWarp) {
        // ---- Producer: warp 8's lane 0 issues every copy, tile after tile; the whole
        // warpgroup stays for the cluster barriers of split tiles ----
        setmaxnreg_dec<kProducerRegisters>();
        const bool issues = warp == kProducerWarp && lane == 0;
        if (issues) {
            prefetch_tensor_map(&map_a);
            prefetch_tensor_map(&map_w);
        }
        uint32_t it = 0;  // chunks loaded so far: stage it % kStages, round it / kStages
        for (int64_t i = first_tile; i < tiles; i += tile_step) {
            const TileOrigin tile = grouped_tile(i, ep.m, ep.n, kBM, kBN, kGroupM);
            for (int kc = kc_begin; issues && kc < kc_end; ++kc, ++it) {
                const int stage = int(it % kStages);
                mbar_wait(&empty[stage], (it / kStages & 1) ^ 1);  // the first round: free
                mbar_arrive_expect_tx(&full[stage], Tile::kStageBytes);
                tma_load_2d(a_tile(stage), &map_a, &full[stage], kc * kABytes, int(tile.m0));
                tma_load_2d(w_tile(stage), &map_w, &full[stage], kc * kWRowBytes, int(tile.n0));
            }
            if (split > 1) cluster_split_producer_wait();
        }
        return;
    }

    // ---- Consumers: warpgroup c, warp w of it, lane (g, t) ----
    setmaxnreg_inc<kConsumerRegisters>();
    const int c = warp / 4, w = warp % 4;
    const int g = lane / 4, t = lane % 4;
    const int r0 = c * kWgmmaM + 16 * w + g;  // the thread's weight rows in a tile: r0, r0 + 8
    uint32_t it = 0;  // chunks consumed so far, as the producer counts them
    for (int64_t i = first_tile; i < tiles; i += tile_step) {
        const TileOrigin tile = grouped_tile(i, ep.m, ep.n, kBM, kBN, kGroupM);
        const RowScales rs0(scales, tile.n0 + r0, ep.n), rs1(scales, tile.n0 + r0 + 8, ep.n);

        float acc[kBM / 2], sums[kBM / 2];
#pragma unroll
        for (int j = 0; j < kBM / 2; ++j) acc[j] = sums[j] = 0.f;
        uint32_t frag[2][kSteps][4];  // two chunks' A fragments: one in flight, one converted

        float s0 = 0.f, s1 = 0.f;
        if (kc_begin < kc_end) {
            s0 = rs0.value(rs0.raw(kc_begin)), s1 = rs1.value(rs1.raw(kc_begin));
            mbar_wait(&full[it % kStages], it / kStages & 1);
            convert_chunk(w_tile(int(it % kStages)), r0, t, frag[0]);
        }

        // Chunk kc (ring slot it) on fragments cur while the next chunk's are converted into nxt.
        auto chunk = [&](int kc, uint32_t(&cur)[kSteps][4], uint32_t(&nxt)[kSteps][4]) {
            const int stage = int(it % kStages);
            const uint64_t a_desc = wgmma_descriptor(a_tile(stage));
            wgmma_fence_operands(sums);
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < kSteps; ++s)
                wgmma_m64nk32_e4m3_rs<kBM>(sums, cur[s],
                                           wgmma_descriptor_advance(a_desc, s * kStepK), s > 0);
            wgmma_commit();
            uint32_t next0 = 0, next1 = 0;  // the next chunk's scales, converted after this one
            if (kc + 1 < kc_end) {
                next0 = rs0.raw(kc + 1), next1 = rs1.raw(kc + 1);
                const uint32_t following = it + 1;
                mbar_wait(&full[following % kStages], following / kStages & 1);
                convert_chunk(w_tile(int(following % kStages)), r0, t, nxt);
            }
            wgmma_wait<0>();
            wgmma_fence_operands(sums);
#pragma unroll
            for (int s = 0; s < kSteps; ++s) wgmma_fence_operands(cur[s]);
            // The stage's a tile (the wgmmas) and codes (converted a chunk ago) are read.
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[stage]);
            ++it;
#pragma unroll
            for (int j = 0; j < kBM / 2; ++j)
                acc[j] = __fmaf_rn(sums[j], (j & 2) ? s1 : s0, acc[j]);
            s0 = rs0.value(next0), s1 = rs1.value(next1);
        };
        for (int kc = kc_begin; kc < kc_end; kc += 2) {
            chunk(kc, frag[0], frag[1]);
            if (kc + 1 < kc_end) chunk(kc + 1, frag[1], frag[0]);
        }

        // ---- A split tile: the cluster adds its CTAs' sums (cluster_split_sum, in the CTA's
        // partials area; its last cluster barrier keeps the partials from being reused for the
        // next tile, or a CTA from leaving, while another reads them). ----
        const int owner_mask = split - 1;
        if (split > 1)
            cluster_split_sum(acc, reinterpret_cast<uint8_t*>(partials), threadIdx.x, rank, split,
                              tile.m0, ep.m);

        // ---- Epilogue. Lane (g, t) holds out[rows 8j + 2t, + 1] of column r0 (acc[4j], acc[4j
        // + 1]) and of column r0 + 8 (acc[4j + 2], acc[4j + 3]); lanes g and g ^ 1 (lane ^ 4)
        // swap one value of each, so that the even lane stores row 8j + 2t of columns (r0, r0 +
        // 1) and (r0 + 8, r0 + 9), the odd one row 8j + 2t + 1 of (r0 - 1, r0), (r0 + 7, r0 + 8).
        const bool odd = g & 1;
        const int64_t col = tile.n0 + (r0 & ~1);
        const typename Epilogue<OutT>::Columns cols[2] = {ep.columns(col), ep.columns(col + 8)};
#pragma unroll
        for (int j = 0; j < kBM / 8; ++j) {
            if ((j & owner_mask) != rank) continue;  // another CTA of the cluster stores it
            const int64_t row = tile.m0 + 8 * j + 2 * t + (odd ? 1 : 0);
            const float row_scale = ep.rows(row);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float mine0 = acc[4 * j + 2 * h], mine1 = acc[4 * j + 2 * h + 1];
                const float other = __shfl_xor_sync(~0u, odd ? mine0 : mine1, 4);
                ep.store_pair(row, col + 8 * h, odd ? other : mine0, odd ? mine1 : other,
                              row_scale, cols[h]);
            }
        }
    }
#endif  // CK_SM90A_DEVICE
}

// The K split of a call: 8 or 4 where that many CTAs per tile all fit on the SMs at once (the
// tiles alone leave at least three quarters of them idle) with at least kMinSplitChunks k-blocks
// each (a CTA has a fixed cost: its pipeline fill, the cluster's sums, the epilogue); 1
// otherwise. Measured on the H100: 14336 x 4096 at M = 64 (32 tiles) 67.5 -> 51.2 us with 4;
// a split of 2 (64 tiles at M = 256) 67.6 -> 76.7 us, so none is made.
constexpr int kMinSplitChunks = 4;
int plan_split(int64_t tiles, int64_t chunks) {
    const int64_t sms = std::max(sm_count(), 1);
    for (int s = 8; s >= 4; s /= 2)
        if (tiles * s <= sms && chunks >= int64_t(kMinSplitChunks) * s) return s;
    return 1;
}

template <typename OutT, int kBM>
cudaError_t launch(const IntGemmArgs& args, cudaStream_t stream) {
    using Tile = W4A8Tile<kBM>;
    if (args.m > INT32_MAX || args.n > INT32_MAX || args.k > INT32_MAX)
        return cudaErrorNotSupported;
    CUtensorMap map_a, map_w;
    cudaError_t err = make_tensor_map_2d(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, args.a, args.m,
                                         args.k, args.k, kBM, kABytes,
                                         CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
    err = make_tensor_map_2d(&map_w, CU_TENSOR_MAP_DATA_TYPE_UINT8, args.b, args.n, args.k / 2,
                             args.k / 2, kBN, kWRowBytes, CU_TENSOR_MAP_SWIZZLE_64B);
    if (err != cudaSuccess) return err;
    const int64_t tiles = output_tiles(args.m, args.n, kBM, kBN);
    const int chunks = int(ceil_div(args.k, kChunkK));
    const int split = plan_split(tiles, chunks);
    // Persistent CTAs, one per SM at most; a split call's clusters take one tile each.
    const int64_t blocks = split > 1 ? tiles * split
                                     : std::min<int64_t>(tiles, std::max(sm_count(), 1));
    if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
    auto kernel = gemm_w4a8_wgmma_kernel<OutT, kBM>;
    static std::atomic<uint64_t> opted_in{0};
    err = allow_dynamic_smem_once(kernel, Tile::kSplitSmemBytes, opted_in);
    if (err != cudaSuccess) return err;
    const ClusterLaunch launch(blocks, split,
                               split > 1 ? Tile::kSplitSmemBytes : Tile::kSmemBytes, stream);
    return cudaLaunchKernelEx(&launch.config, kernel, map_a, map_w, group_scales(args),
                              make_epilogue<OutT>(args), chunks, tiles, split);
}

// 64-row tiles where the 128-row ones leave more of the GPU idle: each SM runs ceil(tiles /
// SMs) tiles in turn, a 64-row one taking kNarrowRowCost times as long per row.
constexpr double kNarrowRowCost = 1.25;
template <typename OutT> cudaError_t dispatch_tiles(const IntGemmArgs& args, cudaStream_t stream) {
    return busiest_sm_rows(args.m, args.n, 64, kBN) * kNarrowRowCost <
                   busiest_sm_rows(args.m, args.n, 128, kBN)
               ? launch<OutT, 64>(args, stream)
               : launch<OutT, 128>(args, stream);
}

}  // namespace

cudaError_t gemm_w4a8_sm90(const IntGemmArgs& args, cudaStream_t stream) {
    if (!tma_wgmma_built_and_runnable()) return cudaErrorNotSupported;
    return dispatch_float_dtype(args.out_dtype, [&](auto out) {
        return dispatch_tiles<decltype(out)>(args, stream);
    });
}

}  // namespace ck
