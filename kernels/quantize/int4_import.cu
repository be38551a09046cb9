// int4_import.cu - importers of 4-bit checkpoint weights (GPTQ, AWQ) into the interchange
// format of ck_gemm_w4a16, and the column gather that act-order layers apply to x.
//
// What it computes (the words of cuda_kernels.h, "Importers from checkpoint formats"):
//   w_out[n][j / 2] nibble j % 2 = code(k_j, n), k_j = perm[j] (GPTQ act-order) or j;
//   scales_out[n][g] = scales[g][n]; zeros_out[n][g] = the zero point of (g, n):
//   GPTQ stored + 1 (1 .. 16), AWQ as stored (0 .. 15); perm (GPTQ with g_idx) sorts k by group.
//   permute_columns: out[r][j] = x[r][perm[j]].
//
// Layouts (row-major, int32 words read as uint32):
//   GPTQ qweight [K / 8, N]: code (k, n) in bits 4 (k % 8) .. of word [k / 8][n].
//   AWQ  qweight [K, N / 8]: code (k, n) in nibble p of word [k][n / 8], n % 8 = order[p],
//        order = (0, 2, 4, 6, 1, 3, 5, 7); qzeros [groups, N / 8] the same way (GPTQ: nibble n % 8).
//   w_out [N, K / 2] bytes: read as little-endian 32-bit words, word [n][k / 8] holds k in bits
//        4 (k % 8) .. - exactly GPTQ's word layout, so a GPTQ import without g_idx is a
//        transpose of 32-bit words, and the other two cases build such words.
//
// Algorithm: every weight kernel works on tiles through shared memory so that both the
// checkpoint rows (contiguous along n) and w_out rows (contiguous along k) move in whole 32-byte
// sectors (or 128-byte lines):
//   GPTQ   tile of 32 n x 32 words (256 k); a warp builds words along n (lane = n: 128 B of a
//          qweight row per load), stores them in a padded tile, then writes rows along k (lane =
//          word: 128 B of a w_out row). Without g_idx a word is one qweight word. With g_idx
//          each of its 8 codes is gathered from checkpoint row perm[j] (a 128-byte load for 4
//          useful bits per lane, i.e. 8x the bytes of the weight in loads); tiles are numbered
//          with k fastest, so the blocks in flight share a few n strips (16 K bytes each) and
//          the repeated rows come from L2, not DRAM.
//   AWQ    tile of 256 n (32 packed columns, lane = column: 128 B of a qweight row) x 64 k (8
//          output words, one per warp); each thread loads the 8 words of k 8w .. 8w + 7 and
//          transposes the 8 x 8 nibbles in registers (undoing the interleave), then the tile is
//          written along k, 32 B of each row.
//   perm   one block per group g scans g_idx in order; a ballot and the warps' counts give each
//          row of g its rank among the rows of g with smaller k (deterministic, no atomics);
//          rank r goes to perm[g * group_size + r]. The scan stops once the group is full.
//   scales, zeros: a 32 x 32 transpose of [groups, N] -> [N, groups], zeros decoded on the way.
//   permute_columns: many rows: a block stages a batch of whole rows in shared memory (one
//          coalesced read), gathers from there and writes coalesced rows; few rows (decode) or
//          rows wider than 48 KB: a thread per column j loads perm[j] once and copies
//          x[r][perm[j]] for several rows (reads gathered within rows that L2 holds).
// Robustness: device data is not trusted for addresses: a perm entry outside [0, K) (a g_idx
// that breaks the header's rule leaves entries unwritten) reads row 0 instead of out of bounds,
// and perm slots past a group's size are never written; permute_columns reads column 0 for a
// perm value outside [0, cols).
//
// Floors (time = bytes / copy bandwidth, H100 ~3.0 TB/s): import = 2 x K N / 2 bytes (read +
// write of the codes) + groups x N x (2 + 2 + 0.5 + 1) bytes: an 8192 x 28672 weight moves 235 MB,
// ~80 us. Act-order adds the perm pass (K x groups / 2 g_idx reads from L2, early exit) and the
// 8x L2 read traffic of the gather. permute_columns: 2 x rows x cols x sizeof(dtype) + 4 cols.
// Measurements: benchmarks/NOTES.md (act-order is a one-time conversion: its gather is left
// slower than the plain import).
#include "kernels/quantize/int4_import.cuh"

namespace ck {
namespace {

constexpr int kCodesPerWord = 8;  // 4-bit codes in a 32-bit word
constexpr int kWarp = 32;
constexpr int kImportThreads = 256;
constexpr int kImportWarps = kImportThreads / kWarp;

// The kernels' grid-stride walk over the ta x tb tiles of an [a, b] index space, a fastest:
// f(a0, b0, tile_a, tile_b) with the tile's origin and extent (the last tiles are partial).
template <class F>
__device__ __forceinline__ void for_each_tile(int64_t a, int ta, int64_t b, int tb, F&& f) {
    const int64_t a_tiles = ceil_div(a, ta);
    const int64_t tiles = a_tiles * ceil_div(b, tb);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int64_t a0 = (t % a_tiles) * ta;
        const int64_t b0 = (t / a_tiles) * tb;
        f(a0, b0, int(std::min<int64_t>(ta, a - a0)), int(std::min<int64_t>(tb, b - b0)));
    }
}

__device__ __forceinline__ uint32_t nibble(uint32_t word, int e) { return (word >> (4 * e)) & 0xFu; }

// AWQ's interleave: nibble p of a packed word holds column 8c + (0, 2, 4, 6, 1, 3, 5, 7)[p], so
// column 8c + m sits in nibble (m % 2) * 4 + m / 2.
__host__ __device__ constexpr int awq_nibble_of(int m) { return (m % 2) * 4 + m / 2; }
static_assert(awq_nibble_of(0) == 0 && awq_nibble_of(2) == 1 && awq_nibble_of(6) == 3 &&
                  awq_nibble_of(1) == 4 && awq_nibble_of(3) == 5 && awq_nibble_of(7) == 7,
              "AWQ order (0, 2, 4, 6, 1, 3, 5, 7)");

// A 32-bit word of 8 codes into w_out at byte offset `dst` (a multiple of 4 from the row start).
// w_packed only has to be byte aligned (uint8_t): the launcher picks byte stores when it is not
// 4-byte aligned.
template <bool kWordStore>
__device__ __forceinline__ void store_word(uint8_t* dst, uint32_t word) {
    if constexpr (kWordStore) {
        *reinterpret_cast<uint32_t*>(dst) = word;
    } else {
#pragma unroll
        for (int b = 0; b < 4; ++b) dst[b] = uint8_t(word >> (8 * b));
    }
}

inline unsigned tile_grid(int64_t tiles) { return unsigned(std::min<int64_t>(tiles, INT32_MAX)); }

// ---------------------------------------------------------------------------------------------
// GPTQ act-order: perm[g * group_size + r] = the r-th row k (in increasing k) with g_idx[k] == g.
// ---------------------------------------------------------------------------------------------
constexpr int kPermThreads = 512;
constexpr int kPermWarps = kPermThreads / kWarp;

__global__ void __launch_bounds__(kPermThreads)
gptq_perm_kernel(const int32_t* __restrict__ g_idx, int64_t k, int64_t group_size,
                 int32_t* __restrict__ perm) {
    __shared__ int warp_counts[kPermWarps];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int64_t g = blockIdx.x;
    const int64_t first = g * group_size;
    const int64_t slots = std::min<int64_t>(group_size, k - first);  // the last group may be short
    int64_t placed = 0;  // rows of group g before this chunk (the same in every thread)
    for (int64_t base = 0; base < k && placed < slots; base += kPermThreads) {
        const int64_t row = base + threadIdx.x;
        const bool mine = row < k && __ldg(g_idx + row) == g;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int64_t rank = placed + __popc(ballot & ((1u << lane) - 1u));
        int total = 0;
#pragma unroll
        for (int w = 0; w < kPermWarps; ++w) {
            const int c = warp_counts[w];
            if (w < warp) rank += c;
            total += c;
        }
        if (mine && rank < slots) perm[first + rank] = int32_t(row);
        placed += total;
        __syncthreads();  // warp_counts is rewritten by the next chunk
    }
}

// ---------------------------------------------------------------------------------------------
// GPTQ weight: w_out word [n][kw] = qweight[kw][n] (identity), or built from the rows perm[8 kw
// .. 8 kw + 7] (act-order).
// ---------------------------------------------------------------------------------------------
constexpr int kGptqTileN = kWarp;      // n per tile: a warp's lanes, 128 B of a qweight row
constexpr int kGptqTileWords = kWarp;  // w_out words per tile row: 256 k, 128 B of a w_out row
constexpr int kGptqTileK = kGptqTileWords * kCodesPerWord;

template <bool kActOrder, bool kWordStore>
__global__ void __launch_bounds__(kImportThreads)
gptq_weight_kernel(const uint32_t* __restrict__ qweight, const int32_t* __restrict__ perm,
                   int64_t n, int64_t k, uint8_t* __restrict__ w_out) {
    // +1: the transposed read tile[lane][r] walks a column; the pad spreads it over the banks.
    __shared__ uint32_t tile[kGptqTileWords][kGptqTileN + 1];
    __shared__ int32_t rows[kActOrder ? kGptqTileK : 1];  // checkpoint row of each k of the tile
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int64_t words = k / kCodesPerWord;  // per w_out row
    // k fastest (L2 reuse, above)
    for_each_tile(words, kGptqTileWords, n, kGptqTileN,
                  [&](int64_t w0, int64_t n0, int tile_words, int tile_n) {
        if constexpr (kActOrder) {
            for (int i = threadIdx.x; i < tile_words * kCodesPerWord; i += kImportThreads) {
                const int32_t p = __ldg(perm + w0 * kCodesPerWord + i);
                rows[i] = p >= 0 && p < k ? p : 0;  // never address outside qweight
            }
            __syncthreads();
        }
        if (lane < tile_n) {
            for (int w = warp; w < tile_words; w += kImportWarps) {
                uint32_t word;
                if constexpr (kActOrder) {
                    uint32_t src[kCodesPerWord];
#pragma unroll
                    for (int e = 0; e < kCodesPerWord; ++e) {  // all 8 loads in flight first
                        const int32_t row = rows[w * kCodesPerWord + e];
                        src[e] = __ldg(qweight + (row / kCodesPerWord) * n + n0 + lane);
                    }
                    word = 0;
#pragma unroll
                    for (int e = 0; e < kCodesPerWord; ++e)
                        word |= nibble(src[e], rows[w * kCodesPerWord + e] % kCodesPerWord) << (4 * e);
                } else {
                    word = __ldg(qweight + (w0 + w) * n + n0 + lane);
                }
                tile[w][lane] = word;
            }
        }
        __syncthreads();
        if (lane < tile_words) {
            for (int r = warp; r < tile_n; r += kImportWarps)
                store_word<kWordStore>(w_out + (n0 + r) * (k / 2) + (w0 + lane) * 4, tile[lane][r]);
        }
        __syncthreads();  // tile and rows are refilled by the next tile
    });
}

// ---------------------------------------------------------------------------------------------
// AWQ weight: an 8 x 8 nibble transpose per (k octet, packed column), through shared memory.
// ---------------------------------------------------------------------------------------------
constexpr int kAwqTileCols = kWarp;        // packed columns (256 n): 128 B of a qweight row
constexpr int kAwqTileWords = kImportWarps;  // w_out words per row: 64 k, 32 B
// Word (n = 8c + m, w) of the tile sits at m * kAwqPlane + c * kAwqColStride + w. Writes (fixed
// m and w, lane = c) hit banks 9c + const: all 32 distinct. Reads (lane = 8 rows' worth: 4
// consecutive n of one c, so m = 4i .. 4i + 3, and w = lane % 8) hit banks 8m + 9c + w: distinct
// because kAwqPlane = 8 (mod 32).
constexpr int kAwqColStride = kAwqTileWords + 1;
constexpr int kAwqPlane = kAwqTileCols * kAwqColStride + 8;
static_assert(kAwqColStride % 2 == 1 && kAwqPlane % 32 == 8, "bank-conflict-free strides");
static_assert(kAwqTileWords * 4 == 32, "a tile row of w_out is one 32-byte sector");

template <bool kWordStore>
__global__ void __launch_bounds__(kImportThreads)
awq_weight_kernel(const uint32_t* __restrict__ qweight, int64_t n, int64_t k,
                  uint8_t* __restrict__ w_out) {
    __shared__ uint32_t tile[kCodesPerWord * kAwqPlane];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int64_t cols = n / kCodesPerWord;  // packed columns of qweight
    const int64_t words = k / kCodesPerWord;
    for_each_tile(words, kAwqTileWords, cols, kAwqTileCols,
                  [&](int64_t w0, int64_t c0, int tile_words, int tile_cols) {
        // Warp w: output word w (k 8(w0 + w) .. + 7); lane: packed column c0 + lane.
        if (warp < tile_words && lane < tile_cols) {
            uint32_t src[kCodesPerWord];  // src[i]: k = 8 (w0 + warp) + i
#pragma unroll
            for (int i = 0; i < kCodesPerWord; ++i)
                src[i] = __ldg(qweight + ((w0 + warp) * kCodesPerWord + i) * cols + c0 + lane);
#pragma unroll
            for (int m = 0; m < kCodesPerWord; ++m) {  // column n = 8 (c0 + lane) + m
                uint32_t word = 0;
#pragma unroll
                for (int i = 0; i < kCodesPerWord; ++i) word |= nibble(src[i], awq_nibble_of(m)) << (4 * i);
                tile[m * kAwqPlane + lane * kAwqColStride + warp] = word;
            }
        }
        __syncthreads();
        // 8 lanes per n row (one word each), 4 rows per warp, 32 rows per block pass.
        const int w = lane % kAwqTileWords;
        const int tile_n = tile_cols * kCodesPerWord;
        if (w < tile_words) {
            for (int r = warp * (kWarp / kAwqTileWords) + lane / kAwqTileWords; r < tile_n;
                 r += kImportThreads / kAwqTileWords) {
                const uint32_t word = tile[(r % kCodesPerWord) * kAwqPlane +
                                           (r / kCodesPerWord) * kAwqColStride + w];
                store_word<kWordStore>(w_out + (c0 * kCodesPerWord + r) * (k / 2) + (w0 + w) * 4, word);
            }
        }
        __syncthreads();  // the tile is refilled by the next tile
    });
}

// ---------------------------------------------------------------------------------------------
// Scales and zeros: [groups, N] -> [N, groups] (scales moved as 16-bit patterns: fp16 and bf16
// alike, bit for bit), zeros unpacked from qzeros [groups, N / 8].
// ---------------------------------------------------------------------------------------------
constexpr int kGroupTile = kWarp;  // 32 groups x 32 n

template <bool kGptq>
__global__ void __launch_bounds__(kImportThreads)
import_groups_kernel(const uint16_t* __restrict__ scales, const uint32_t* __restrict__ qzeros,
                     int64_t n, int64_t groups, uint16_t* __restrict__ scales_out,
                     uint8_t* __restrict__ zeros_out) {
    __shared__ uint16_t s_tile[kGroupTile][kGroupTile + 1];
    __shared__ uint8_t z_tile[kGroupTile][kGroupTile + 1];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    for_each_tile(groups, kGroupTile, n, kGroupTile,
                  [&](int64_t g0, int64_t n0, int tile_g, int tile_n) {
        if (lane < tile_n) {
            const int64_t col = n0 + lane;
            const int m = int(col % kCodesPerWord);
            for (int i = warp; i < tile_g; i += kImportWarps) {
                const int64_t g = g0 + i;
                s_tile[i][lane] = __ldg(scales + g * n + col);
                const uint32_t packed = __ldg(qzeros + g * (n / kCodesPerWord) + col / kCodesPerWord);
                // GPTQ stores zero - 1 in nibble n % 8; AWQ the zero itself, interleaved.
                z_tile[i][lane] = kGptq ? uint8_t(nibble(packed, m) + 1) : uint8_t(nibble(packed, awq_nibble_of(m)));
            }
        }
        __syncthreads();
        if (lane < tile_g) {
            for (int r = warp; r < tile_n; r += kImportWarps) {
                const int64_t dst = (n0 + r) * groups + g0 + lane;
                scales_out[dst] = s_tile[lane][r];
                zeros_out[dst] = z_tile[lane][r];
            }
        }
        __syncthreads();
    });
}

template <bool kGptq>
cudaError_t launch_groups(const Int4ImportArgs& a, cudaStream_t stream) {
    const int64_t tiles = ceil_div(a.groups, kGroupTile) * ceil_div(a.n, kGroupTile);
    import_groups_kernel<kGptq><<<tile_grid(tiles), kImportThreads, 0, stream>>>(
        static_cast<const uint16_t*>(a.scales), reinterpret_cast<const uint32_t*>(a.qzeros), a.n,
        a.groups, static_cast<uint16_t*>(a.scales_out), a.zeros_out);
    return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// permute_columns
// ---------------------------------------------------------------------------------------------
// Gather path (few rows, or rows too wide to stage): a thread per column j loads perm[j] once
// and copies x[r][perm[j]] for kGatherRows rows at a time. The reads scatter over the row, a
// 32-byte sector per element (fine while the rows sit in L2, as a decode step's few rows do).
constexpr int kGatherRows = 4;

template <typename Bits>
__global__ void __launch_bounds__(kBlockThreads)
permute_gather_kernel(const Bits* __restrict__ x, int64_t rows, int64_t cols,
                      const int32_t* __restrict__ perm, Bits* __restrict__ out) {
    const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (j >= cols) return;  // no barrier below
    const int32_t p = __ldg(perm + j);
    const int64_t src = p >= 0 && p < cols ? p : 0;  // never address outside the row
    for (int64_t r0 = int64_t(blockIdx.y) * kGatherRows; r0 < rows;
         r0 += int64_t(gridDim.y) * kGatherRows) {
        Bits v[kGatherRows];
#pragma unroll
        for (int u = 0; u < kGatherRows; ++u)
            if (r0 + u < rows) v[u] = x[(r0 + u) * cols + src];
#pragma unroll
        for (int u = 0; u < kGatherRows; ++u)
            if (r0 + u < rows) out[(r0 + u) * cols + j] = v[u];
    }
}

// Staged path (many rows): a block copies a batch of whole rows (contiguous in memory) into
// shared memory with 16-byte loads where alignment allows, then gathers from shared memory and
// writes coalesced; each perm[j] read serves the whole batch. DRAM sees each byte once.
// Staging halved the gather path's time (benchmarks/NOTES.md); at one row per batch the perm[j]
// reads (from L2, 2x the row's bytes) now bound it. Staging perm too, in more shared memory (an
// opt-in above 48 KB), is the next step if prefill gathers ever matter.
constexpr int kStageBytes = 48 * 1024;  // the default dynamic shared memory limit (no opt-in)
constexpr int kStageMaxRows = 8;

template <typename Bits, bool kVec>
__global__ void __launch_bounds__(kBlockThreads)
permute_staged_kernel(const Bits* __restrict__ x, int64_t rows, int64_t cols, int batch,
                      const int32_t* __restrict__ perm, Bits* __restrict__ out) {
    extern __shared__ uint4 stage_vec[];  // uint4: 16-byte aligned
    Bits* stage = reinterpret_cast<Bits*>(stage_vec);
    for (int64_t r0 = int64_t(blockIdx.x) * batch; r0 < rows; r0 += int64_t(gridDim.x) * batch) {
        const int nr = int(std::min<int64_t>(batch, rows - r0));
        const int count = int(nr * cols);  // elements of the batch (<= kStageBytes / 2)
        if constexpr (kVec) {
            const uint4* src = reinterpret_cast<const uint4*>(x + r0 * cols);
            const int vecs = count * int(sizeof(Bits)) / 16;
#pragma unroll 4
            for (int i = threadIdx.x; i < vecs; i += kBlockThreads) stage_vec[i] = __ldg(src + i);
        } else {
#pragma unroll 4
            for (int i = threadIdx.x; i < count; i += kBlockThreads) stage[i] = x[r0 * cols + i];
        }
        __syncthreads();
        for (int j = threadIdx.x; j < cols; j += kBlockThreads) {
            const int32_t p = __ldg(perm + j);
            const int src = p >= 0 && p < cols ? p : 0;
            for (int u = 0; u < nr; ++u) out[(r0 + u) * cols + j] = stage[u * cols + src];
        }
        __syncthreads();  // the stage is refilled by the next batch
    }
}

template <typename Bits>
cudaError_t launch_permute(const Bits* x, int64_t rows, int64_t cols, const int32_t* perm,
                           Bits* out, cudaStream_t stream) {
    const int64_t row_bytes = cols * int64_t(sizeof(Bits));
    // Staging pays once every SM has rows of its own to stream; a decode step's few rows are
    // latency-bound and take the gather path's wider grid.
    if (row_bytes <= kStageBytes && rows >= 2 * int64_t(sm_count())) {
        const int batch = int(std::min<int64_t>(kStageMaxRows, kStageBytes / row_bytes));
        const int64_t blocks = std::min<int64_t>(ceil_div(rows, batch), INT32_MAX);
        const size_t smem = size_t(batch * row_bytes);
        // 16-byte loads: x aligned and every batch starting on a 16-byte boundary.
        return with_bool(is_aligned(x, 16) && row_bytes % 16 == 0, [&](auto vec) {
            permute_staged_kernel<Bits, vec><<<unsigned(blocks), kBlockThreads, smem, stream>>>(
                x, rows, cols, batch, perm, out);
            return cudaGetLastError();
        });
    }
    const dim3 grid(unsigned(ceil_div(cols, kBlockThreads)),
                    unsigned(std::min<int64_t>(ceil_div(rows, kGatherRows), kMaxGridY)));
    permute_gather_kernel<Bits><<<grid, kBlockThreads, 0, stream>>>(x, rows, cols, perm, out);
    return cudaGetLastError();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points for cuda_kernels.cu (arguments already validated)
// ---------------------------------------------------------------------------------------------
cudaError_t import_gptq(const Int4ImportArgs& a, cudaStream_t stream) {
    const bool act_order = a.g_idx != nullptr;
    if (act_order) {
        gptq_perm_kernel<<<unsigned(a.groups), kPermThreads, 0, stream>>>(a.g_idx, a.k,
                                                                         a.group_size, a.perm);
        if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    }
    const int64_t tiles = ceil_div(a.k / kCodesPerWord, kGptqTileWords) * ceil_div(a.n, kGptqTileN);
    const cudaError_t err = with_bool(act_order, [&](auto order) {
        return with_bool(is_aligned(a.w_out, 4), [&](auto word_store) {
            gptq_weight_kernel<order, word_store><<<tile_grid(tiles), kImportThreads, 0, stream>>>(
                reinterpret_cast<const uint32_t*>(a.qweight), a.perm, a.n, a.k, a.w_out);
            return cudaGetLastError();
        });
    });
    if (err != cudaSuccess) return err;
    return launch_groups<true>(a, stream);
}

cudaError_t import_awq(const Int4ImportArgs& a, cudaStream_t stream) {
    const int64_t tiles = ceil_div(a.k / kCodesPerWord, kAwqTileWords) *
                          ceil_div(a.n / kCodesPerWord, kAwqTileCols);
    const cudaError_t err = with_bool(is_aligned(a.w_out, 4), [&](auto word_store) {
        awq_weight_kernel<word_store><<<tile_grid(tiles), kImportThreads, 0, stream>>>(
            reinterpret_cast<const uint32_t*>(a.qweight), a.n, a.k, a.w_out);
        return cudaGetLastError();
    });
    if (err != cudaSuccess) return err;
    return launch_groups<false>(a, stream);
}

cudaError_t permute_columns(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                            const int32_t* perm, void* out, cudaStream_t stream) {
    return dispatch_float_dtype(dtype, [&](auto tag) {
        // Values are moved as bit patterns of their size: a copy, bit for bit.
        using Bits = typename std::conditional<sizeof(tag) == 4, uint32_t, uint16_t>::type;
        return launch_permute(static_cast<const Bits*>(x), rows, cols, perm,
                              static_cast<Bits*>(out), stream);
    });
}

}  // namespace ck
