// mma_pipeline.cuh - the pieces of a tensor-core (mma.sync, sm_80+) kernel that every family
// shares: the block-tile traits, the shared-memory swizzle of [rows][64-byte] operand tiles, the
// cp.async stage loop, and the sum of per-warp partial tiles of the weight-streaming kernels.
//
// Users: gemm/gemm_int8.cu and gemm/gemm_int4.cu (MmaTile, MmaWarpTile, rowk_offset,
// cp_async_pipeline, sum_warp_partials), gemm/gemm_w4a16.cu (sum_warp_partials),
// gemm/gemm_w4a16_prepacked_tc.cu (cp_async_pipeline). A family file keeps what is its own: the
// fragment loads, the operand unpacking or dequantization, and an epilogue in another column
// order.
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/core/ptx.cuh"

namespace ck {

// ---------------------------------------------------------------------------------------------
// Block tiles of [rows][kTileKBytes] operands: A (activations) and B (the [N, K] weight) both
// stored row-major with k contiguous, kTileKBytes bytes of k per pipeline stage (64 int8 k, or
// 128 packed int4 k). Warps form a kWarpsM x kWarpsN grid; each owns a (kBM / kWarpsM) x
// (kBN / kWarpsN) sub-tile of kMI x kNI m16n8 fragments. Every thread copies the same number of
// 16-byte chunks of each operand per stage (kALoads, kBLoads).
// ---------------------------------------------------------------------------------------------
constexpr int kTileKBytes = 64;   // bytes of k per row and stage: 4 chunks
constexpr int kTileChunkBytes = 16;  // one cp.async
constexpr int kTileChunksK = kTileKBytes / kTileChunkBytes;

template <int kBM_, int kBN_, int kWarpsM_, int kWarpsN_, int kStages_, int kMinBlocks_>
struct MmaTile {
    static constexpr int kBM = kBM_, kBN = kBN_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
    static constexpr int kStages = kStages_, kMinBlocks = kMinBlocks_;
    static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
    static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;
    static constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;
    static constexpr int kABytes = kBM * kTileKBytes, kBBytes = kBN * kTileKBytes;
    static constexpr int kStageBytes = kABytes + kBBytes;
    static constexpr int kSmemBytes = kStages * kStageBytes;
    static constexpr int kALoads = kABytes / kTileChunkBytes / kThreads;  // cp.async per thread
    static constexpr int kBLoads = kBBytes / kTileChunkBytes / kThreads;

    static_assert(kTileChunksK == 4, "rowk_offset's swizzle assumes 4 chunks per row and stage");
    static_assert(kWarpM % 16 == 0, "warp tiles of whole m16 fragments");
    static_assert(kNI % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
    static_assert(kABytes % (kTileChunkBytes * kThreads) == 0 &&
                      kBBytes % (kTileChunkBytes * kThreads) == 0,
                  "every thread issues the same number of cp.async");
    static_assert(kStages >= 2, "a pipeline needs two stages");
};

// Where a thread of an MmaTile block works: the block's output tile (grouped rasterization of
// blockIdx.x, group_m tile rows per group for L2 reuse), its warp's sub-tile origin (wm0, wn0)
// in the block tile, and its lane's m16n8 fragment coordinates (g, tq): accumulator registers
// 2 rh, 2 rh + 1 of fragment (mi, ni) are output row row(mi, rh), columns col(ni), col(ni) + 1.
template <class Tile> struct MmaWarpTile {
    int64_t m0, n0;
    int lane, wm0, wn0, g, tq;

    __device__ __forceinline__ MmaWarpTile(int64_t m, int64_t n, int group_m) {
        const TileOrigin tile = grouped_tile(blockIdx.x, m, n, Tile::kBM, Tile::kBN, group_m);
        m0 = tile.m0, n0 = tile.n0;
        const int tid = threadIdx.x, warp = tid / 32;
        lane = tid % 32;
        wm0 = warp / Tile::kWarpsN * Tile::kWarpM;
        wn0 = warp % Tile::kWarpsN * Tile::kWarpN;
        g = lane / 4, tq = lane % 4;
    }
    __device__ __forceinline__ int64_t row(int mi, int rh) const {
        return m0 + wm0 + mi * 16 + g + rh * 8;  // rh = 0: c0 c1 (row g); rh = 1: c2 c3 (g + 8)
    }
    __device__ __forceinline__ int64_t col(int ni) const { return n0 + wn0 + ni * 8 + tq * 2; }

    // The epilogue of fragments in natural column order: store(row, col, v0, v1) for every
    // accumulator pair of the warp, row by row.
    template <typename Acc, class Store>
    __device__ __forceinline__ void store_pairs(const Acc (&acc)[Tile::kMI][Tile::kNI][4],
                                                Store&& store) const {
#pragma unroll
        for (int mi = 0; mi < Tile::kMI; ++mi)
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                const int64_t r = row(mi, rh);
#pragma unroll
                for (int ni = 0; ni < Tile::kNI; ++ni)
                    store(r, col(ni), acc[mi][ni][2 * rh], acc[mi][ni][2 * rh + 1]);
            }
    }
};

// Launches kernel(args...) over a 1-D grid of one block per kBM x kBN output tile, with the
// tile's dynamic shared memory (opting in above 48 KB, once per device: `opted_in` is a static of
// the caller for this one kernel, see allow_dynamic_smem_once).
template <class Tile, class Kernel, class... Args>
cudaError_t launch_tiles(Kernel kernel, std::atomic<uint64_t>& opted_in, int64_t m, int64_t n,
                         cudaStream_t stream, Args... args) {
    if (tile_grid(m, n, Tile::kBM, Tile::kBN) == 0) return cudaErrorInvalidConfiguration;
    const cudaError_t e = allow_dynamic_smem_once(kernel, Tile::kSmemBytes, opted_in);
    if (e != cudaSuccess) return e;
    return launch_tile_grid(kernel, m, n, Tile::kBM, Tile::kBN, Tile::kThreads, Tile::kSmemBytes,
                            stream, args...);
}

// Whether the large tile leaves SMs idle for the whole run (fewer blocks than SMs): then a
// smaller tile's four times as many blocks spread the work wider.
template <class Large> bool short_of_one_wave(int64_t m, int64_t n) {
    return ceil_div(m, Large::kBM) * ceil_div(n, Large::kBN) < sm_count();
}

// Byte offset of chunk c of row r in a [rows][64-byte] stage tile. ldmatrix reads 8 rows at one
// chunk and two rows share a 128-byte line, so chunk c of row r goes to chunk c ^ ((r >> 1) & 3):
// rows r .. r + 7 land on 8 distinct 16-byte bank groups (4 * (r & 1) + swizzled chunk), and the
// cp.async writes of 8 consecutive chunks cover a 128-byte line once.
__device__ __forceinline__ uint32_t rowk_offset(int r, int c) {
    return uint32_t(r * kTileChunksK + (c ^ ((r >> 1) & 3))) * kTileChunkBytes;
}

// Issues this thread's cp.async of one stage of a [rows][64-byte] tile: kLoads chunks,
// idx = threadIdx.x + i * kThreads, chunk idx % 4 of tile row idx / 4, read from byte k0 of
// matrix row row0 + idx / 4 (rows of row_bytes bytes, src 16-byte aligned). Chunks of rows
// >= rows or at bytes >= row_bytes read nothing and fill zeros.
template <int kLoads, int kThreads, typename T>
__device__ __forceinline__ void load_rowk_tile(uint32_t dst, const T* src, int64_t row0,
                                               int64_t rows, int64_t k0, int64_t row_bytes) {
    static_assert(sizeof(T) == 1, "rows are byte strings (int8 or packed int4)");
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
        const int idx = int(threadIdx.x) + i * kThreads;
        const int r = idx / kTileChunksK, c = idx % kTileChunksK;
        const bool ok = row0 + r < rows && k0 + c * kTileChunkBytes < row_bytes;
        const T* p = ok ? src + (row0 + r) * row_bytes + k0 + c * kTileChunkBytes : src;
        cp_async_16_zfill(dst + rowk_offset(r, c), p, ok);
    }
}

// The fragments of one 32-byte k step (chunks c0, c0 + 1) of a stage, by ldmatrix.x4:
//   A: kMI m16 fragments of rows wm0 + 16 mi .. + 15, registers a0 a1 a2 a3 (rows 0-7 / 8-15 x
//      bytes 0-15 / 16-31 of the step).
//   B: kNI n8 fragments of rows wn0 + 8 ni .. + 7 (two per ldmatrix), registers b0 b1.
// (lane is the caller's: recomputed here, it cost the INT4 kernel's 128-register tile a spill.)
template <int kMI>
__device__ __forceinline__ void ldmatrix_a_fragments(uint32_t (&af)[kMI][4], uint32_t tile,
                                                     int wm0, int c0, int lane) {
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
        ldmatrix_x4(af[mi], tile + rowk_offset(wm0 + mi * 16 + lane % 16, c0 + lane / 16));
}
template <int kNI>
__device__ __forceinline__ void ldmatrix_b_fragments(uint32_t (&bf)[kNI][2], uint32_t tile,
                                                     int wn0, int c0, int lane) {
    static_assert(kNI % 2 == 0, "two n8 tiles per ldmatrix.x4");
#pragma unroll
    for (int nj = 0; nj < kNI; nj += 2) {
        uint32_t r[4];
        const int row = wn0 + nj * 8 + (lane / 16) * 8 + lane % 8;
        ldmatrix_x4(r, tile + rowk_offset(row, c0 + (lane / 8) % 2));
        bf[nj][0] = r[0], bf[nj][1] = r[1], bf[nj + 1][0] = r[2], bf[nj + 1][1] = r[3];
    }
}

// The cp.async stage loop of a block that walks `tiles` k tiles (chunks) through a kStages-deep
// ring of shared-memory stages: load(stage, tile) issues the copies of one k tile into a stage,
// compute(stage) consumes one. kStages - 1 tiles are in flight while one is consumed; every
// iteration commits one group (possibly empty) so that wait_group counts tiles. One
// __syncthreads per tile: it makes tile kt visible to every thread and frees the stage that
// tile kt - 1 used, which the load of tile kt + kStages - 1 then refills. A power-of-two ring
// indexes its stages by tile % kStages (a mask); any other keeps two wrapping stage counters
// (the INT8/INT4 kernels' 4-stage ring measured slower with the counters).
template <int kStages, typename Count, class Load, class Compute>
__device__ __forceinline__ void cp_async_pipeline(Count tiles, Load&& load, Compute&& compute) {
    static_assert(kStages >= 2, "a pipeline needs two stages");
    constexpr bool kMask = (kStages & (kStages - 1)) == 0;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < tiles) load(s, Count(s));
        cp_async_commit();
    }
    int read_stage = 0, write_stage = kStages - 1;
    for (Count kt = 0; kt < tiles; ++kt) {
        cp_async_wait<kStages - 2>();  // tile kt has landed (for this thread) ...
        __syncthreads();               // ... for every thread; the stage of tile kt - 1 is free
        const Count next = kt + kStages - 1;
        if (next < tiles) load(kMask ? int(next % kStages) : write_stage, next);
        cp_async_commit();
        compute(kMask ? int(kt % kStages) : read_stage);
        if constexpr (!kMask) {
            read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
            write_stage = write_stage == kStages - 1 ? 0 : write_stage + 1;
        }
    }
    cp_async_wait<0>();  // only empty groups remain; leave nothing in flight at exit
}

// The weight-streaming kernels' rows of the [n, row_bytes] weight that a lane reads: row
// n0 + 8 t + g of n8 tile t (g = lane / 4), from byte `offset` of the row; a row past n points at
// row 0 and has ok[t] = false (the kernels never load it).
template <int kTiles, typename T>
__device__ __forceinline__ void lane_weight_rows(const T* w, int64_t n0, int64_t n, int g,
                                                 int64_t row_bytes, int64_t offset,
                                                 const T* (&rows)[kTiles], bool (&ok)[kTiles]) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
        const int64_t row = n0 + 8 * t + g;
        ok[t] = row < n;
        rows[t] = w + (ok[t] ? row : 0) * row_bytes + offset;
    }
}

// The weight-streaming kernels' register pipeline: warp `warp` of kWarps walks its steps of
// kUnroll consecutive chunks (first chunks warp * kUnroll, then kWarps * kUnroll further each
// step) up to `chunks`; load(c0, step) fills a Step's registers with the loads of chunks c0 ..,
// compute(step) consumes them. The next step's loads are issued before this step's compute, so
// a warp always has a step of loads in flight (left to itself, the compiler interleaved the two;
// benchmarks/NOTES.md has the measurement).
template <int kWarps, int kUnroll, class Step, class Load, class Compute>
__device__ __forceinline__ void register_pipeline(int64_t chunks, int warp, Load&& load,
                                                  Compute&& compute) {
    constexpr int64_t kStride = int64_t(kWarps) * kUnroll;
    int64_t c0 = int64_t(warp) * kUnroll;
    Step next;
    if (c0 < chunks) load(c0, next);
    for (; c0 < chunks; c0 += kStride) {
        const Step cur = next;
        if (c0 + kStride < chunks) load(c0 + kStride, next);
        compute(cur);
    }
}

// ---------------------------------------------------------------------------------------------
// The weight-streaming (M <= 16) kernels split K over the warps of a block: each warp ends with
// partial m16n8 accumulators of the same kTiles n8 tiles. sum_warp_partials adds them through
// shared memory in warp order (a fixed order: deterministic) and hands each accumulator pair to
// store(tile, row_half, lane, sum0, sum1): registers 2 * row_half and 2 * row_half + 1 of `lane`
// (C fragment rows lane / 4 + 8 * row_half, columns 2 (lane % 4), + 1 of the tile).
// kRowHalves = 1 when only rows 0 .. 7 can exist (m <= 8). Element (tile, register, lane) of each
// warp is stored with consecutive lanes in consecutive banks.
// ---------------------------------------------------------------------------------------------
template <int kWarps, int kTiles, int kRowHalves, typename Acc> struct WarpPartials {
    Acc v[kWarps][kTiles][2 * kRowHalves][32];
};

template <int kWarps, int kTiles, int kRowHalves, typename Acc, class Store>
__device__ __forceinline__ void sum_warp_partials(WarpPartials<kWarps, kTiles, kRowHalves, Acc>& partial,
                                                  const Acc (&acc)[kTiles][4], Store&& store) {
    static_assert(kRowHalves == 1 || kRowHalves == 2, "rows 0-7, or rows 0-15");
    constexpr int kThreads = kWarps * 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int r = 0; r < 2 * kRowHalves; ++r) partial.v[warp][t][r][lane] = acc[t][r];
    __syncthreads();
    constexpr int kPairs = kTiles * kRowHalves * 32;
    for (int p = threadIdx.x; p < kPairs; p += kThreads) {
        const int t = p / (kRowHalves * 32), rh = p / 32 % kRowHalves, l = p % 32;
        Acc s0 = 0, s1 = 0;
#pragma unroll
        for (int v = 0; v < kWarps; ++v) {
            s0 += partial.v[v][t][2 * rh][l];
            s1 += partial.v[v][t][2 * rh + 1][l];
        }
        store(t, rh, l, s0, s1);
    }
}

}  // namespace ck
