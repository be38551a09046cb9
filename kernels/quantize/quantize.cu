// quantize.cu - float <-> int8, float <-> FP8 and float <-> packed int4 quantization.
//
// What it computes (the exact formats are in cuda_kernels.h and tests/reference.py):
//   int8, symmetric, one scale per tensor or per row, static (given) or dynamic (absmax / 127);
//   FP8 (E4M3, E5M2), one float32 scale per tensor, row, 1 x 128 block of a row or 128 x 128
//   tile, static or dynamic (absmax / FMAX): the INT8 scheme with fp8() (fp8.cuh) in place of
//   clamp(rint());
//   packed int4, symmetric or asymmetric (uint8 zero point), one scale per group of 32, 64, 128
//   elements of a row or per whole row, always dynamic; and the matching dequantizations.
//
// Layout: row-major [rows, cols] inputs; int8 and FP8 codes [rows, cols], one byte each; int4
// codes packed two per byte along the row, [rows, (cols + 1) / 2]; scales (and zeros)
// [rows, groups], FP8's 128 x 128 scales [ceil(rows / 128), ceil(cols / 128)].
//
// Algorithm: every thread owns 8-element chunks of a row (common.cuh). Element-wise work
// (static quantization, dequantization) is one pass over a 2-D grid of chunks. Dynamic scales
// need a reduction before the encode:
//   - per group (32/64/128, and FP8's 1 x 128 blocks): a team of group/8 lanes of one warp
//     loads the group into registers, reduces with shuffles, then encodes from registers: one
//     read of x;
//   - per 128 x 128 tile (FP8): one block of threads per tile holds it in registers (8 chunks a
//     thread), reduces through shared memory, then encodes: one read of x, one launch;
//   - per row: a team (a warp, or the whole block for long rows) keeps 128 bytes of the row per
//     thread in registers, so rows up to 16384 fp16/bf16 or 8192 fp32 elements are read once;
//     longer rows are read twice (absmax pass, encode pass), the second time mostly from L2;
//   - per tensor: absmax into scales[0] with one atomicMax per block, then the encode pass: x is
//     read twice, which no single-pass scheme avoids once x is larger than the chip's storage.
//     A tensor that fits one block's row cache is one row of the per-row kernel instead: one
//     launch where the two passes take four stream operations (a decode step's activations).
//     (FP8 turns the absmax into its scale before the encode pass, which then reads scales[0]
//     as static scales are read.)
// Static FP8 scales and every dequantization look up each chunk's scale (one per chunk: a chunk
// never straddles a 128-column block), so one element-wise kernel serves all granularities.
//
// Floors: these kernels do a few operations per byte, so time is bytes / copy bandwidth:
//   bytes = elements * (sizeof(input) + sizeof(output)) + scales (+ zeros); per-tensor dynamic
//   quantization adds one more read of x.
#include "kernels/quantize/quantize.cuh"

#include "kernels/core/fp8.cuh"
#include "kernels/quantize/chunk_map.cuh"
#include "kernels/quantize/int4_params.cuh"

namespace ck {
namespace {

// Packed int4 codes (two per byte), or one byte per code (int8, FP8).
template <class Fmt>
constexpr bool kNibbleCodes =
    std::is_same<Fmt, Int4Sym>::value || std::is_same<Fmt, Int4Asym>::value;

template <class Fmt>
using code_t = typename std::conditional<std::is_same<Fmt, Int8Sym>::value, int8_t, uint8_t>::type;

// Stores a chunk of codes at column c0 of a row of codes: one byte each for int8 and FP8 (the
// int8 store keeps each code's low byte), packed for int4.
template <class Fmt, bool kVec>
__device__ __forceinline__ void store_codes(code_t<Fmt>* row_q, int64_t c0, int n,
                                            const int (&q)[kChunk]) {
    if constexpr (kNibbleCodes<Fmt>) {
        store_int4_chunk<kVec>(row_q + c0 / 2, n, q);
    } else {
        store_int8_chunk<kVec>(reinterpret_cast<int8_t*>(row_q + c0), n, q);
    }
}

// Bytes of codes in one row.
template <class Fmt> __device__ __forceinline__ int64_t code_row_bytes(int64_t cols) {
    return kNibbleCodes<Fmt> ? (cols + 1) / 2 : cols;
}

// Int8 encode with a known scale: static per tensor / per row, or per tensor from the absmax a
// previous pass left in scales[0] (kFromAbsmax).
template <typename T, bool kVec, bool kPerRow, bool kFromAbsmax>
struct Int8EncodeOp {
    static constexpr int kUnroll = 2;
    using Frag = float[kChunk];
    const T* __restrict__ x;
    const float* __restrict__ scales;
    int8_t* __restrict__ q;
    int64_t cols;
    float inv;

    __device__ void begin_row(int64_t r) {
        if (kFromAbsmax) {
            Range range;
            range.hi = scales[0];
            inv = make_params<Int8Sym, float>(range).inv;
        } else {
            inv = 1.f / scales[kPerRow ? r : 0];
        }
    }
    __device__ void load(int64_t r, int64_t c0, int n, Frag& v) const {
        load_chunk<T, kVec>(x + r * cols + c0, n, v);
    }
    __device__ void store(int64_t r, int64_t c0, int n, Frag& v) const {
        int codes[kChunk];
        encode<Int8Sym>(v, inv, 0, codes);
        store_int8_chunk<kVec>(q + r * cols + c0, n, codes);
    }
};

template <typename T, bool kVec, bool kPerRow>
struct Int8DecodeOp {
    static constexpr int kUnroll = 1;
    using Frag = int[kChunk];
    const int8_t* __restrict__ q;
    const float* __restrict__ scales;
    T* __restrict__ out;
    int64_t cols;
    float scale;

    __device__ void begin_row(int64_t r) { scale = scales[kPerRow ? r : 0]; }
    __device__ void load(int64_t r, int64_t c0, int n, Frag& codes) const {
        load_int8_chunk<kVec>(q + r * cols + c0, n, codes);
    }
    __device__ void store(int64_t r, int64_t c0, int n, Frag& codes) const {
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = float(codes[i]) * scale;
        store_chunk<T, kVec>(out + r * cols + c0, n, v);
    }
};

// Packed int4 -> float. group_shift = log2(group size), or a shift past any column index for
// one group per row, so that the group of column c0 is c0 >> group_shift.
template <typename T, bool kVec, bool kAsym>
struct Int4DecodeOp {
    static constexpr int kUnroll = 1;
    struct Frag : ScaledCodes {
        int zero;  // the group's zero point, loaded with its scale
    };
    const uint8_t* __restrict__ q;
    const T* __restrict__ scales;
    const uint8_t* __restrict__ zeros;
    T* __restrict__ out;
    int64_t cols, groups;
    int group_shift;

    __device__ void begin_row(int64_t) {}
    __device__ void load(int64_t r, int64_t c0, int n, Frag& f) const {
        const int64_t g = r * groups + (c0 >> group_shift);
        f.scale = to_float(scales[g]);
        f.zero = kAsym ? zeros[g] : 0;
        load_int4_chunk<kVec, !kAsym>(q + r * ((cols + 1) / 2) + c0 / 2, n, f.codes);
    }
    __device__ void store(int64_t r, int64_t c0, int n, Frag& f) const {
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = float(f.codes[i] - f.zero) * f.scale;
        store_chunk<T, kVec>(out + r * cols + c0, n, v);
    }
};

// Where a chunk's FP8 scale is: scales[(r >> row_shift) * per_row + (c0 >> col_shift)], a shift
// of kOneScale meaning one scale along that dimension. Per tensor (one long row) {kOneScale,
// kOneScale, 0}, per row {0, kOneScale, 1}, 1 x 128 {0, 7, blocks}, 128 x 128 {7, 7, blocks}.
constexpr int kOneScale = 62;  // past any row or column index
constexpr int kFp8BlockShift = 7;
static_assert(int64_t(1) << kFp8BlockShift == kFp8Block, "FP8 blocks of 128");
static_assert(kFp8Block % kChunk == 0, "a chunk never straddles two FP8 blocks");

struct ScaleIndex {
    int row_shift, col_shift;
    int64_t per_row;
    __device__ int64_t operator()(int64_t r, int64_t c0) const {
        return (r >> row_shift) * per_row + (c0 >> col_shift);
    }
};

ScaleIndex fp8_scale_index(int64_t rows, int64_t cols, ck_granularity_t granularity) {
    const int64_t per_row = fp8_scale_grid(rows, cols, granularity).cols;
    switch (granularity) {
        case CK_PER_ROW: return {0, kOneScale, 1};
        case CK_PER_BLOCK_1X128: return {0, kFp8BlockShift, per_row};
        case CK_PER_BLOCK_128X128: return {kFp8BlockShift, kFp8BlockShift, per_row};
        default: return {kOneScale, kOneScale, 0};
    }
}

// FP8 encode with known scales (static ones, or the per-tensor scale a previous pass wrote):
// each chunk loads its scale with its values.
template <typename T, class Fmt, bool kVec>
struct Fp8EncodeOp {
    static constexpr int kUnroll = 2;
    struct Frag {
        float v[kChunk];
        float scale;
    };
    const T* __restrict__ x;
    const float* __restrict__ scales;
    uint8_t* __restrict__ q;
    int64_t cols;
    ScaleIndex index;

    __device__ void begin_row(int64_t) {}
    __device__ void load(int64_t r, int64_t c0, int n, Frag& f) const {
        f.scale = scales[index(r, c0)];
        load_chunk<T, kVec>(x + r * cols + c0, n, f.v);
    }
    __device__ void store(int64_t r, int64_t c0, int n, Frag& f) const {
        int codes[kChunk];
        encode<Fmt>(f.v, 1.f / f.scale, 0, codes);
        store_codes<Fmt, kVec>(q + r * cols, c0, n, codes);
    }
};

template <typename T, class Fmt, bool kVec>
struct Fp8DecodeOp {
    static constexpr int kUnroll = 1;
    using Frag = ScaledCodes;
    const uint8_t* __restrict__ q;
    const float* __restrict__ scales;
    T* __restrict__ out;
    int64_t cols;
    ScaleIndex index;

    __device__ void begin_row(int64_t) {}
    __device__ void load(int64_t r, int64_t c0, int n, Frag& f) const {
        f.scale = scales[index(r, c0)];
        load_int8_chunk<kVec>(reinterpret_cast<const int8_t*>(q + r * cols + c0), n, f.codes);
    }
    __device__ void store(int64_t r, int64_t c0, int n, Frag& f) const {
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; i += 2) {
            const float2 pair = fp8x2_value<Fmt::kFormat>((f.codes[i] & 0xFF) |
                                                          (f.codes[i + 1] & 0xFF) << 8);
            v[i] = pair.x * f.scale;
            v[i + 1] = pair.y * f.scale;
        }
        store_chunk<T, kVec>(out + r * cols + c0, n, v);
    }
};

// ---------------------------------------------------------------------------------------------
// Per-tensor absmax: each block reduces its chunks, then one atomicMax on the float's bits into
// *absmax (zeroed before the launch). Non-negative floats order like their bit patterns.
// ---------------------------------------------------------------------------------------------
template <typename T, bool kVec>
__global__ void __launch_bounds__(kBlockThreads)
absmax_kernel(const T* __restrict__ x, int64_t n_elems, float* __restrict__ absmax) {
    __shared__ float smem[kBlockThreads / 32];
    Range r;
    const int64_t chunks = ceil_div(n_elems, kChunk);
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks;
         c += int64_t(gridDim.x) * blockDim.x) {
        float v[kChunk];
        load_chunk<T, kVec>(x + c * kChunk, chunk_count(n_elems, c * kChunk), v);
        accumulate<Int8Sym>(r, v);
    }
    const float m = block_reduce<kBlockThreads>(r.hi, smem, MaxOp{});
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(absmax), __float_as_uint(m));
}

// Turns the absmax left in scales[0] into the scale (absmax / 127 for int8, absmax / FMAX for
// FP8; zero -> 1).
template <class Fmt> __global__ void absmax_to_scale_kernel(float* scales) {
    Range r;
    r.hi = scales[0];
    scales[0] = make_params<Fmt, float>(r).stored;
}

// ---------------------------------------------------------------------------------------------
// Dynamic per-group quantization (groups of kTeam * 8 elements): a team of kTeam lanes holds one
// group in registers. As in map_chunks_kernel, each thread takes kGroupUnroll chunks per step, all
// loaded before the first reduction. Block widths are multiples of kTeam and the loops stride by
// whole blocks, so a group never straddles two steps; trip counts are block-uniform, so every
// lane reaches the shuffles.
// ---------------------------------------------------------------------------------------------
constexpr int kGroupUnroll = 4;  // chunks per thread per step (78% vs 76% of copy BW at 1)

// ScaleT: T for int4, float for FP8.
template <typename T, class Fmt, typename ScaleT, int kTeam, bool kVec>
__global__ void __launch_bounds__(kBlockThreads)
group_quantize_kernel(const T* __restrict__ x, code_t<Fmt>* __restrict__ q,
                      ScaleT* __restrict__ scales, uint8_t* __restrict__ zeros, int64_t rows,
                      int64_t cols) {
    const int64_t chunks = ceil_div(cols, kChunk);
    const int64_t groups = ceil_div(chunks, kTeam);
    const int64_t row_bytes = code_row_bytes<Fmt>(cols);
    const int64_t step = int64_t(gridDim.x) * blockDim.x * kGroupUnroll;
    for (int64_t rb = blockIdx.y * int64_t(blockDim.y); rb < rows; rb += int64_t(gridDim.y) * blockDim.y) {
        const int64_t r = rb + threadIdx.y;
        for (int64_t cb = blockIdx.x * int64_t(blockDim.x) * kGroupUnroll + threadIdx.x; cb - threadIdx.x < chunks; cb += step) {
            float v[kGroupUnroll][kChunk];
            int n[kGroupUnroll];
#pragma unroll
            for (int u = 0; u < kGroupUnroll; ++u) {
                const int64_t c0 = (cb + u * int64_t(blockDim.x)) * kChunk;
                n[u] = r < rows ? chunk_count(cols, c0) : 0;
                if (n[u] > 0) load_chunk<T, kVec>(x + r * cols + c0, n[u], v[u]);
            }
#pragma unroll
            for (int u = 0; u < kGroupUnroll; ++u) {
                const int64_t c = cb + u * int64_t(blockDim.x);
                Range range;
                if (n[u] > 0) accumulate<Fmt>(range, v[u]);
                range.hi = team_reduce<kTeam>(range.hi, MaxOp{});
                if constexpr (Fmt::kAsym) range.lo = team_reduce<kTeam>(range.lo, MinOp{});
                if (n[u] <= 0) continue;
                const QParams<ScaleT> p = make_params<Fmt, ScaleT>(range);
                int codes[kChunk];
                encode<Fmt>(v[u], p.inv, p.zero, codes);
                store_codes<Fmt, kVec>(q + r * row_bytes, c * kChunk, n[u], codes);
                if (threadIdx.x % kTeam == 0) {
                    scales[r * groups + c / kTeam] = p.stored;
                    if constexpr (Fmt::kAsym) zeros[r * groups + c / kTeam] = uint8_t(p.zero);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dynamic per-row quantization: a team of kTeam threads (a warp, or the whole 1-D block) per
// row. Chunks c = lane + i * kTeam, i < row_cache<T>, stay in registers, in their storage type,
// when the row fits; longer rows take a reduction pass and an encode pass (the second mostly
// from L2). The cache is 128 bytes per thread so that several blocks fit on a multiprocessor:
// with one block per SM (floats, 64 of them) rows were processed one after another and the
// kernel was latency-bound at half the copy bandwidth.
// ScaleT is float for int8 and T for int4.
// ---------------------------------------------------------------------------------------------
constexpr int kRowCacheBytes = 128;
template <typename T> constexpr int row_cache() { return kRowCacheBytes / int(sizeof(Chunk<T>)); }

// A warp team reduces with shuffles, a whole-block team through shared memory.
template <int kTeam, class Op>
__device__ __forceinline__ float row_team_reduce(float v, float* smem, Op op) {
    if constexpr (kTeam == 32) return team_reduce<32>(v, op);
    else return block_reduce<kTeam>(v, smem, op);
}

constexpr int kRowMinBlocks = 4;  // per SM: 64 registers per thread at most

template <typename T, class Fmt, typename ScaleT, int kTeam, bool kVec>
__global__ void __launch_bounds__(kBlockThreads, kRowMinBlocks)
row_quantize_kernel(const T* __restrict__ x, code_t<Fmt>* __restrict__ q,
                    ScaleT* __restrict__ scales, uint8_t* __restrict__ zeros, int64_t rows,
                    int64_t cols) {
    static_assert(kTeam == 32 || kTeam == kBlockThreads, "a warp or the whole block per row");
    constexpr int kCache = row_cache<T>();
    __shared__ float smem[kBlockThreads / 32];
    const int lane = threadIdx.x;
    const int64_t chunks = ceil_div(cols, kChunk);
    const int64_t row_bytes = code_row_bytes<Fmt>(cols);
    const bool cached = chunks <= int64_t(kTeam) * kCache;
    // Teams (blockDim.y of them per block) walk rows; the row loop is block-uniform.
    for (int64_t rb = blockIdx.x * int64_t(blockDim.y); rb < rows; rb += int64_t(gridDim.x) * blockDim.y) {
        const int64_t r = rb + threadIdx.y;
        const bool row_ok = r < rows;
        const T* xr = x + r * cols;
        Chunk<T> cache[kCache];
        Range range;
        float v[kChunk];
        if (cached) {
#pragma unroll
            for (int i = 0; i < kCache; ++i) {
                const int64_t c0 = (lane + int64_t(i) * kTeam) * kChunk;
                const int n = row_ok ? chunk_count(cols, c0) : 0;
                if (n > 0) load_raw_chunk<T, kVec>(xr + c0, n, cache[i]);
            }
#pragma unroll
            for (int i = 0; i < kCache; ++i) {
                const int64_t c0 = (lane + int64_t(i) * kTeam) * kChunk;
                if (!row_ok || chunk_count(cols, c0) == 0) continue;
                chunk_to_float(cache[i], v);
                accumulate<Fmt>(range, v);
            }
        } else {
            for (int64_t c = lane; row_ok && c < chunks; c += kTeam) {
                load_chunk<T, kVec>(xr + c * kChunk, chunk_count(cols, c * kChunk), v);
                accumulate<Fmt>(range, v);
            }
        }
        range.hi = row_team_reduce<kTeam>(range.hi, smem, MaxOp{});
        if constexpr (Fmt::kAsym) range.lo = row_team_reduce<kTeam>(range.lo, smem, MinOp{});
        if (!row_ok) continue;
        const QParams<ScaleT> p = make_params<Fmt, ScaleT>(range);
        code_t<Fmt>* qr = q + r * row_bytes;
        int codes[kChunk];
        if (cached) {
#pragma unroll
            for (int i = 0; i < kCache; ++i) {
                const int64_t c0 = (lane + int64_t(i) * kTeam) * kChunk;
                const int n = chunk_count(cols, c0);
                if (n == 0) continue;
                chunk_to_float(cache[i], v);
                encode<Fmt>(v, p.inv, p.zero, codes);
                store_codes<Fmt, kVec>(qr, c0, n, codes);
            }
        } else {
            for (int64_t c = lane; c < chunks; c += kTeam) {
                const int64_t c0 = c * kChunk;
                const int n = chunk_count(cols, c0);
                load_chunk<T, kVec>(xr + c0, n, v);
                encode<Fmt>(v, p.inv, p.zero, codes);
                store_codes<Fmt, kVec>(qr, c0, n, codes);
            }
        }
        if (lane == 0) {
            scales[r] = p.stored;
            if constexpr (Fmt::kAsym) zeros[r] = uint8_t(p.zero);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dynamic FP8 per 128 x 128 tile: one block of threads per tile (grid-stride over the tiles).
// The 16 chunks of a tile row go to 16 consecutive threads (coalesced), the 16 such groups of a
// block take every 16th row: kTilePasses chunks per thread, kept in registers in their storage
// type (64 registers for fp32) between the reduction and the encode, so x is read once.
// ---------------------------------------------------------------------------------------------
constexpr int kTileChunkCols = int(kFp8Block / kChunk);           // 16 chunks per tile row
constexpr int kTileRowsPerPass = kBlockThreads / kTileChunkCols;  // 16 rows at a time
constexpr int kTilePasses = int(kFp8Block / kTileRowsPerPass);    // 8 chunks per thread
static_assert(kTilePasses * kTileRowsPerPass == kFp8Block, "the block covers the tile's rows");

template <typename T, class Fmt, bool kVec>
__global__ void __launch_bounds__(kBlockThreads)
tile_quantize_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scales,
                     int64_t rows, int64_t cols) {
    __shared__ float smem[kBlockThreads / 32];
    const int64_t tile_cols = ceil_div(cols, kFp8Block);
    const int64_t tiles = ceil_div(rows, kFp8Block) * tile_cols;
    const int lane_col = threadIdx.x % kTileChunkCols, lane_row = threadIdx.x / kTileChunkCols;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // block-uniform
        const int64_t r0 = t / tile_cols * kFp8Block + lane_row;
        const int64_t c0 = t % tile_cols * kFp8Block + lane_col * kChunk;
        Chunk<T> cache[kTilePasses];
        int n[kTilePasses];
#pragma unroll
        for (int i = 0; i < kTilePasses; ++i) {
            const int64_t r = r0 + int64_t(i) * kTileRowsPerPass;
            n[i] = r < rows ? chunk_count(cols, c0) : 0;
            if (n[i] > 0) load_raw_chunk<T, kVec>(x + r * cols + c0, n[i], cache[i]);
        }
        Range range;
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kTilePasses; ++i) {
            if (n[i] == 0) continue;
            chunk_to_float(cache[i], v);
            accumulate<Fmt>(range, v);
        }
        range.hi = block_reduce<kBlockThreads>(range.hi, smem, MaxOp{});
        const QParams<float> p = make_params<Fmt, float>(range);
        int codes[kChunk];
#pragma unroll
        for (int i = 0; i < kTilePasses; ++i) {
            if (n[i] == 0) continue;
            chunk_to_float(cache[i], v);
            encode<Fmt>(v, p.inv, 0, codes);
            const int64_t r = r0 + int64_t(i) * kTileRowsPerPass;
            store_codes<Fmt, kVec>(q + r * cols, c0, n[i], codes);
        }
        if (threadIdx.x == 0) scales[t] = p.stored;
    }
}

// ---------------------------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------------------------
// Blocks for grid-stride kernels that should not exceed one wave by much (reductions).
int64_t resident_blocks() { return int64_t(std::max(sm_count(), 1)) * (2048 / kBlockThreads); }

// max |x| over the n elements of x (NaN ignored) into *absmax: zeroed, then one atomicMax per
// block of absmax_kernel.
template <typename T, bool kVec>
cudaError_t launch_tensor_absmax(const T* x, int64_t n, float* absmax, cudaStream_t stream) {
    const cudaError_t err = cudaMemsetAsync(absmax, 0, sizeof(float), stream);
    if (err != cudaSuccess) return err;
    const int64_t blocks = std::min(ceil_div(ceil_div(n, kChunk), kBlockThreads), resident_blocks());
    absmax_kernel<T, kVec><<<unsigned(blocks), kBlockThreads, 0, stream>>>(x, n, absmax);
    return cudaGetLastError();
}

// Per-row launch of row_quantize_kernel: a warp per row for short rows, a block for long ones.
template <typename T, class Fmt, typename ScaleT, bool kVec>
void launch_row_quantize(const T* x, code_t<Fmt>* q, ScaleT* scales, uint8_t* zeros, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
    const int64_t chunks = ceil_div(cols, kChunk);
    const int64_t max_blocks = 4 * resident_blocks();
    if (chunks <= 32 * row_cache<T>()) {
        constexpr int kRowsPerBlock = kBlockThreads / 32;
        const int64_t blocks = std::min(ceil_div(rows, kRowsPerBlock), max_blocks);
        row_quantize_kernel<T, Fmt, ScaleT, 32, kVec>
            <<<unsigned(blocks), dim3(32, kRowsPerBlock), 0, stream>>>(x, q, scales, zeros, rows, cols);
    } else {
        const int64_t blocks = std::min(rows, max_blocks);
        row_quantize_kernel<T, Fmt, ScaleT, kBlockThreads, kVec>
            <<<unsigned(blocks), dim3(kBlockThreads, 1), 0, stream>>>(x, q, scales, zeros, rows, cols);
    }
}

// Dynamic per-group launch of group_quantize_kernel (teams of kTeam lanes).
template <typename T, class Fmt, typename ScaleT, int kTeam, bool kVec>
void launch_group_quantize(const T* x, code_t<Fmt>* q, ScaleT* scales, uint8_t* zeros,
                           int64_t rows, int64_t cols, cudaStream_t stream) {
    const RowLaunch l = row_launch(rows, ceil_div(ceil_div(cols, kChunk), kGroupUnroll), kTeam);
    group_quantize_kernel<T, Fmt, ScaleT, kTeam, kVec>
        <<<l.grid, l.block, 0, stream>>>(x, q, scales, zeros, rows, cols);
}

// A dynamic per-tensor quantization of n values small enough for one block's registers (a
// decode step's activations): the per-row kernel on that one row is one launch, where the
// absmax pass takes four stream operations.
template <typename T> bool tensor_fits_one_block(int64_t n) {
    return ceil_div(n, kChunk) <= int64_t(kBlockThreads) * row_cache<T>();
}

template <typename T, bool kVec>
cudaError_t launch_int8_quantize(const T* x, int64_t rows, int64_t cols, ck_granularity_t granularity,
                                 ck_scale_mode_t mode, float* scales, int8_t* q, cudaStream_t stream) {
    if (granularity == CK_PER_ROW) {
        if (mode == CK_SCALE_DYNAMIC)
            launch_row_quantize<T, Int8Sym, float, kVec>(x, q, scales, nullptr, rows, cols, stream);
        else
            launch_map(Int8EncodeOp<T, kVec, true, false>{x, scales, q, cols}, rows, cols, stream);
        return cudaGetLastError();
    }
    // Per tensor: the rows do not matter, so the tensor is one long row.
    const int64_t n = rows * cols;
    if (mode == CK_SCALE_DYNAMIC) {
        if (tensor_fits_one_block<T>(n)) {
            launch_row_quantize<T, Int8Sym, float, kVec>(x, q, scales, nullptr, 1, n, stream);
            return cudaGetLastError();
        }
        const cudaError_t err = launch_tensor_absmax<T, kVec>(x, n, scales, stream);
        if (err != cudaSuccess) return err;
        launch_map(Int8EncodeOp<T, kVec, false, true>{x, scales, q, n}, 1, n, stream);
        absmax_to_scale_kernel<Int8Sym><<<1, 1, 0, stream>>>(scales);
    } else {
        launch_map(Int8EncodeOp<T, kVec, false, false>{x, scales, q, n}, 1, n, stream);
    }
    return cudaGetLastError();
}

// FP8. Per tensor, the caller passes the tensor as one long row (rows = 1).
template <typename T, class Fmt, bool kVec>
cudaError_t launch_fp8_quantize(const T* x, int64_t rows, int64_t cols,
                                ck_granularity_t granularity, ck_scale_mode_t mode,
                                float* scales, uint8_t* q, cudaStream_t stream) {
    const auto encode_known = [&] {
        const ScaleIndex index = fp8_scale_index(rows, cols, granularity);
        launch_map(Fp8EncodeOp<T, Fmt, kVec>{x, scales, q, cols, index}, rows, cols, stream);
        return cudaGetLastError();
    };
    if (mode == CK_SCALE_STATIC) return encode_known();
    switch (granularity) {
        case CK_PER_ROW:
            launch_row_quantize<T, Fmt, float, kVec>(x, q, scales, nullptr, rows, cols, stream);
            break;
        case CK_PER_BLOCK_1X128:
            launch_group_quantize<T, Fmt, float, int(kFp8Block / kChunk), kVec>(
                x, q, scales, nullptr, rows, cols, stream);
            break;
        case CK_PER_BLOCK_128X128: {
            const int64_t tiles = ceil_div(rows, kFp8Block) * ceil_div(cols, kFp8Block);
            const int64_t blocks = std::min(tiles, 4 * resident_blocks());
            tile_quantize_kernel<T, Fmt, kVec>
                <<<unsigned(blocks), kBlockThreads, 0, stream>>>(x, q, scales, rows, cols);
            break;
        }
        default: {  // per tensor
            if (tensor_fits_one_block<T>(cols)) {
                launch_row_quantize<T, Fmt, float, kVec>(x, q, scales, nullptr, 1, cols, stream);
                break;
            }
            const cudaError_t err = launch_tensor_absmax<T, kVec>(x, cols, scales, stream);
            if (err != cudaSuccess) return err;
            absmax_to_scale_kernel<Fmt><<<1, 1, 0, stream>>>(scales);
            return encode_known();
        }
    }
    return cudaGetLastError();
}

template <typename T, bool kVec, class Fmt>
void launch_int4_quantize(const T* x, int64_t rows, int64_t cols, int64_t group_size,
                          uint8_t* q, T* scales, uint8_t* zeros, cudaStream_t stream) {
    auto groups = [&](auto team) {
        constexpr int kTeam = decltype(team)::value;
        launch_group_quantize<T, Fmt, T, kTeam, kVec>(x, q, scales, zeros, rows, cols, stream);
    };
    switch (group_size) {
        case 32: groups(std::integral_constant<int, 32 / kChunk>{}); break;
        case 64: groups(std::integral_constant<int, 64 / kChunk>{}); break;
        case 128: groups(std::integral_constant<int, 128 / kChunk>{}); break;
        default: launch_row_quantize<T, Fmt, T, kVec>(x, q, scales, zeros, rows, cols, stream); break;
    }
}


}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points for cuda_kernels.cu (arguments already validated)
// ---------------------------------------------------------------------------------------------
cudaError_t quantize_int8(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                          ck_granularity_t granularity, ck_scale_mode_t mode, float* scales,
                          int8_t* q, cudaStream_t stream) {
    return dispatch_float_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const int64_t vec_cols = granularity == CK_PER_TENSOR ? rows * cols : cols;
        return with_bool(vector_ok(vec_cols, x, 16, q, 8), [&](auto vec) {
            return launch_int8_quantize<T, vec>(static_cast<const T*>(x), rows, cols, granularity,
                                                mode, scales, q, stream);
        });
    });
}

cudaError_t dequantize_int8(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                            ck_granularity_t granularity, void* out, ck_dtype_t dtype,
                            cudaStream_t stream) {
    // Per tensor: the rows do not matter, so the tensor is one long row.
    const bool per_row = granularity == CK_PER_ROW;
    const int64_t r = per_row ? rows : 1, c = per_row ? cols : rows * cols;
    return dispatch_float_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(vector_ok(c, q, 8, out, 16), [&](auto vec) {
            return with_bool(per_row, [&](auto row) {
                launch_map(Int8DecodeOp<T, vec, row>{q, scales, static_cast<T*>(out), c}, r, c, stream);
                return cudaGetLastError();
            });
        });
    });
}

cudaError_t quantize_fp8(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                         ck_fp8_format_t format, ck_granularity_t granularity,
                         ck_scale_mode_t mode, float* scales, uint8_t* q, cudaStream_t stream) {
    // Per tensor: the rows do not matter, so the tensor is one long row.
    const bool tensor = granularity == CK_PER_TENSOR;
    const int64_t r = tensor ? 1 : rows, c = tensor ? rows * cols : cols;
    return dispatch_fp8_format(format, [&](auto fmt) {
        using Fmt = decltype(fmt);
        return dispatch_float_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            return with_bool(vector_ok(c, x, 16, q, 8), [&](auto vec) {
                return launch_fp8_quantize<T, Fmt, vec>(static_cast<const T*>(x), r, c,
                                                        granularity, mode, scales, q, stream);
            });
        });
    });
}

cudaError_t dequantize_fp8(const uint8_t* q, ck_fp8_format_t format, const float* scales,
                           int64_t rows, int64_t cols, ck_granularity_t granularity, void* out,
                           ck_dtype_t dtype, cudaStream_t stream) {
    const bool tensor = granularity == CK_PER_TENSOR;
    const int64_t r = tensor ? 1 : rows, c = tensor ? rows * cols : cols;
    const ScaleIndex index = fp8_scale_index(r, c, granularity);
    return dispatch_fp8_format(format, [&](auto fmt) {
        using Fmt = decltype(fmt);
        return dispatch_float_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            return with_bool(vector_ok(c, q, 8, out, 16), [&](auto vec) {
                launch_map(Fp8DecodeOp<T, Fmt, vec>{q, scales, static_cast<T*>(out), c, index},
                           r, c, stream);
                return cudaGetLastError();
            });
        });
    });
}

cudaError_t quantize_int4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                          int64_t group_size, ck_int4_mode_t mode, uint8_t* q, void* scales,
                          uint8_t* zeros, cudaStream_t stream) {
    return dispatch_float_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* xt = static_cast<const T*>(x);
        T* st = static_cast<T*>(scales);
        return with_bool(vector_ok(cols, x, 16, q, 4), [&](auto vec) {
            if (mode == CK_INT4_ASYMMETRIC)
                launch_int4_quantize<T, vec, Int4Asym>(xt, rows, cols, group_size, q, st, zeros, stream);
            else
                launch_int4_quantize<T, vec, Int4Sym>(xt, rows, cols, group_size, q, st, zeros, stream);
            return cudaGetLastError();
        });
    });
}

cudaError_t dequantize_int4(const uint8_t* q, const void* scales, const uint8_t* zeros,
                            int64_t rows, int64_t cols, int64_t group_size, ck_int4_mode_t mode,
                            void* out, ck_dtype_t dtype, cudaStream_t stream) {
    const int64_t groups = int4_groups_per_row(cols, group_size);
    // One group per row: a shift past any column index puts every column in group 0.
    const int shift = group_size == CK_GROUP_ROW ? 62 : __builtin_ctzll(uint64_t(group_size));
    return dispatch_float_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* st = static_cast<const T*>(scales);
        return with_bool(vector_ok(cols, q, 4, out, 16), [&](auto vec) {
            return with_bool(mode == CK_INT4_ASYMMETRIC, [&](auto asym) {
                launch_map(Int4DecodeOp<T, vec, asym>{q, st, zeros, static_cast<T*>(out), cols, groups, shift},
                           rows, cols, stream);
                return cudaGetLastError();
            });
        });
    });
}

cudaError_t tensor_absmax(const void* x, ck_dtype_t dtype, int64_t n, float* absmax,
                          cudaStream_t stream) {
    return dispatch_float_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(n % kChunk == 0 && is_aligned(x, 16), [&](auto vec) {
            return launch_tensor_absmax<T, vec>(static_cast<const T*>(x), n, absmax, stream);
        });
    });
}

int64_t int4_groups_per_row(int64_t cols, int64_t group_size) {
    if (cols < 1) return 0;
    if (group_size == CK_GROUP_ROW) return 1;
    if (group_size != 32 && group_size != 64 && group_size != 128) return 0;
    return cols / group_size + (cols % group_size != 0);  // no overflow near INT64_MAX
}

}  // namespace ck
