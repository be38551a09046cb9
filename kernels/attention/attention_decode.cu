// attention_decode.cu - decode attention over a KV cache (ck_attention_decode), split-KV
// (flash-decoding) on mma.sync (sm_80+), then a combine.
//
// Computes, per sequence b, new token t (the last Sq_new positions) and query head h:
// O = softmax(scale q k^T over the keys at positions <= seqlens_k[b] - Sq_new + t) v, and lse,
// with kv head h / (Hq / Hkv); tests/reference.py attention_decode_f64 is the spec.
//
// Layout: q, out [B, Sq_new, Hq, D]; a contiguous cache k, v [B, max_seqlen_k, Hkv, D] or a
// paged one [num_pages, page_size, Hkv, D] with block_table int32 [B, max_blocks]; seqlens_k
// int32 [B], read here and clamped to [0, max_seqlen_k].
//
// Algorithm: one CTA of 4 warps per (split, row group, kv head, sequence). Its rows are the
// G = Hq / Hkv query heads x Sq_new tokens that share the kv head (row = t G + g): the whole
// group reads each K and V tile once. The rows fill 1, 2 or 4 m16 tiles (kWarpsM); the other
// warps split every 64-key tile along the keys (kWarpsN = 4 / kWarpsM slices), so that all 4
// warps compute even for one decode token, and merge their online-softmax states at the end.
// K and V tiles of 64 keys stream through shared memory in a 3-stage cp.async pipeline (two
// tiles in flight while one computes). Per slice, as the prefill kernel (attention_fwd.cu): S =
// Q K^T (m16n8k16, float32 sums), x = S scale log2(e), masked beyond the split and the causal
// position, online softmax (exp2), P rounded to the dtype, acc += P V. A split writes its
// normalized float32 O_s and lse_s to the workspace, and the combine kernel merges the splits
// (tests/reference.py attention_combine); a call of one split writes O and lse directly.
//
// Floor: the K and V bytes of the sequences (tests/reference.py attention_decode_kv_bytes) at
// the copy bandwidth; the flops (4 D Hq Sq_new per key) are far below the tensor cores' rate.
#include "kernels/attention/attention_decode.cuh"
#include "kernels/attention/attention_tile.cuh"

namespace ck {
namespace {

using namespace attention;

// mma.sync, ldmatrix and cp.async exist from sm_80; below, the kernels trap (never launched:
// the entry point refuses those GPUs).
constexpr bool kHasSm80 = CK_SM80;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockN = kDecodeBlockN;  // keys per shared-memory tile
// Tiles in shared memory: two load while one computes, where two CTAs share each SM; four
// load (five stages) where the grid has at most one CTA per SM, which then keeps as many bytes
// in flight alone.
constexpr int kStages = 3, kDeepStages = 5;
static_assert(kBlockN % (16 * kWarps) == 0, "each of 4 key slices holds whole k16 steps of P V");

// Shared memory: Q [kRows][D], then kStages x (K [kBlockN][D], V [kBlockN][D]). The 16-byte
// chunk c of row r sits at chunk c ^ (r % 8) (rows are 128 or 256 bytes: without the swizzle
// the 8 rows an ldmatrix reads would share banks). After the key loop the K/V stages hold the
// warps' softmax states for the merge.
template <int kD, int kWarpsM, int kStagesT> struct Smem {
    static constexpr int kStages = kStagesT;
    static constexpr int kRows = 16 * kWarpsM;
    static constexpr int kChunks = kD / kChunkElems;
    static constexpr int kRowBytes = kD * 2;
    static constexpr int kQBytes = kRows * kRowBytes;
    static constexpr int kTileBytes = kBlockN * kRowBytes;
    static constexpr int kStageBytes = 2 * kTileBytes;
    static constexpr int kBytes = kQBytes + kStages * kStageBytes;
    // The merge: every warp's acc [16][D], m [16] and l [16], float32.
    static constexpr int kMergeBytes = kWarps * 16 * (kD + 2) * 4;
    static_assert(kMergeBytes <= kStages * kStageBytes, "the merge reuses the K/V stages");
    static_assert(kChunks % 8 == 0, "the XOR swizzle permutes chunks in groups of 8");
    static_assert(kBlockN * kChunks % kThreads == 0, "every thread copies as many K/V chunks");

    __device__ static uint32_t offset(int row, int chunk) {
        return row * kRowBytes + ((chunk ^ (row % 8)) << 4);
    }
    __device__ static uint32_t k_tile(uint32_t base, int stage) {
        return base + kQBytes + stage * kStageBytes;
    }
    __device__ static uint32_t v_tile(uint32_t base, int stage) {
        return k_tile(base, stage) + kTileBytes;
    }
};

// Where key position `pos` (< the sequence's clamped length) of sequence b, kv head h, lies
// in the cache, in elements. A page id outside [0, num_pages) (a broken caller promise) is
// clamped into it: the values are then unspecified, but no read leaves the pages.
__device__ __forceinline__ int64_t kv_offset(const DecodeArgs& a, int b, int h, int pos) {
    int64_t row;
    if (a.block_table) {
        int page = __ldg(a.block_table + int64_t(b) * a.max_blocks + (pos >> a.page_shift));
        page = min(max(page, 0), a.num_pages - 1);
        row = (int64_t(page) << a.page_shift) + (pos & ((1 << a.page_shift) - 1));
    } else {
        row = int64_t(b) * a.max_seqlen_k + pos;
    }
    return (row * a.num_heads_kv + h) * a.head_dim;
}

// Copies the K and V rows of key positions n0 .. n0 + kBlockN - 1 into a stage; positions at or
// past `end` are zero-filled and read nothing (neither the cache nor the block table): a masked
// key's p is 0, and 0 * V must stay 0 whatever the cache holds there (NaN too).
template <typename T, class S>
__device__ __forceinline__ void load_kv(const DecodeArgs& a, uint32_t k_tile, uint32_t v_tile,
                                        int b, int h, int n0, int end) {
    const T* k = static_cast<const T*>(a.k);
    const T* v = static_cast<const T*>(a.v);
#pragma unroll
    for (int it = 0; it < kBlockN * S::kChunks / kThreads; ++it) {
        const int i = it * kThreads + threadIdx.x;
        const int r = i / S::kChunks, c = i % S::kChunks;
        const int pos = n0 + r;
        const bool ok = pos < end;
        const int64_t at = ok ? kv_offset(a, b, h, pos) + c * kChunkElems : 0;
        cp_async_16_zfill(k_tile + S::offset(r, c), k + at, ok);
        cp_async_16_zfill(v_tile + S::offset(r, c), v + at, ok);
    }
}

// The query row `row` of a CTA (row = t G + g of its kv head's group): its token and head.
struct QueryRow {
    int t, h;
};
__device__ __forceinline__ QueryRow query_row(int row, int group, int kv_head) {
    return {row / group, kv_head * group + row % group};
}

// Fragment layout: attention_tile.cuh's.
template <typename T, int kD, int kWarpsM, int kStagesT>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const DecodeArgs a) {
    if constexpr (!kHasSm80) __trap();
    using S = Smem<kD, kWarpsM, kStagesT>;
    constexpr int kStages = S::kStages;
    constexpr int kWarpsN = kWarps / kWarpsM;
    constexpr int kSlice = kBlockN / kWarpsN;  // keys of a tile that one warp computes
    constexpr int kNT = kSlice / 8;            // n8 tiles of S
    constexpr int kDT = kD / 8;                // n8 tiles of O
    constexpr int kKS = kD / 16;               // k16 steps of Q K^T

    // Launched as a dependent of the stream's previous kernel (launch_dependent): nothing of
    // global memory is touched before that kernel is done.
    wait_for_prior_grid();
    const int b = blockIdx.z, hkv = blockIdx.y;
    const int row_groups = gridDim.x / a.splits;
    const int split = blockIdx.x / row_groups, rg = blockIdx.x % row_groups;
    const int group = a.num_heads_q / a.num_heads_kv;
    const int rows = group * a.seqlen_q;  // of the kv head; this CTA: rg * kRows ..
    const int row0 = rg * S::kRows;

    // The sequence's length, clamped to the declared maximum (the header's device-side rule),
    // and this split's keys: whole blocks of kBlockN (attention_split_bounds).
    const int len = min(max(__ldg(a.seqlens_k + b), 0), a.max_seqlen_k);
    // (len <= 2^30: none of the positions below, nor a tile's end, overflows an int.)
    const int blocks = (len + kBlockN - 1) / kBlockN;
    const int per_split = (blocks + a.splits - 1) / a.splits * kBlockN;
    const int lo = min(split * per_split, len);
    const int hi = min(lo + per_split, len);
    const int tiles = (hi - lo + kBlockN - 1) / kBlockN;

    extern __shared__ uint4 smem[];
    const uint32_t base = shared_address(smem);

    // Q rows (zero past the group's rows), with the first K/V tile in one group of copies.
    {
        const T* q = static_cast<const T*>(a.q);
        for (int i = threadIdx.x; i < S::kRows * S::kChunks; i += kThreads) {
            const int r = i / S::kChunks, c = i % S::kChunks;
            const bool ok = row0 + r < rows;
            const QueryRow qr = query_row(ok ? row0 + r : 0, group, hkv);
            const int64_t at =
                ((int64_t(b) * a.seqlen_q + qr.t) * a.num_heads_q + qr.h) * kD + c * kChunkElems;
            cp_async_16_zfill(base + S::offset(r, c), q + at, ok);
        }
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < tiles)
            load_kv<T, S>(a, S::k_tile(base, s), S::v_tile(base, s), b, hkv, lo + s * kBlockN,
                          hi);
        cp_async_commit();
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / kWarpsN, wn = warp % kWarpsN;
    const float scale_log2 = a.scale * kLog2e;

    // The thread's two rows (g and g + 8 of the warp's m16 tile): the last key position each
    // sees, len - Sq_new + t (causal over the new tokens; row padding sees none).
    int last_key[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + wm * 16 + g + 8 * r;
        last_key[r] = row < rows ? len - a.seqlen_q + row / group : -1;
    }

    uint32_t qf[kKS][4];
    float acc[kDT][4];
#pragma unroll
    for (int i = 0; i < kDT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};  // running row max of x (base 2)
    float l[2] = {0.f, 0.f};              // this thread's part of the row sum

    for (int j = 0; j < tiles; ++j) {
        // Tile j has landed (at most kStages - 2 later groups in flight) for every thread, and
        // every warp is done with tile j - 1, whose stage tile j + kStages - 1 now overwrites.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (j + kStages - 1 < tiles) {
            const int stage = (j + kStages - 1) % kStages;
            load_kv<T, S>(a, S::k_tile(base, stage), S::v_tile(base, stage), b, hkv,
                          lo + (j + kStages - 1) * kBlockN, hi);
        }
        cp_async_commit();
        if (j == 0) load_q_fragments<S>(qf, base, wm * 16, lane);
        const uint32_t kt = S::k_tile(base, j % kStages), vt = S::v_tile(base, j % kStages);
        const int key0 = wn * kSlice;  // the warp's slice of the tile

        // Over the slice: S = Q K^T; x in base 2, masked beyond the split and the row's causal
        // position; P; acc += P V.
        float s[kNT][4];
        qk_tile<T, S>(s, qf, kt, key0, lane);
        const int n0 = lo + j * kBlockN + key0;
        float tile_max[2];
        mask_tile(s, tile_max, scale_log2, [&](int i, int e) {
            const int key = n0 + i * 8 + 2 * t + (e & 1);
            return key < hi && key <= last_key[e / 2];
        });
        online_softmax(s, tile_max, m, l, acc);
        pv_tile<T, S>(acc, s, vt, key0, lane);
    }
    cp_async_wait<0>();  // no copy may still target shared memory past this point
    allow_dependent_launch();  // the combine's blocks may start: what is left here is short
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = quad_sum(l[r]);

    // Merge the kWarpsN slices of each row tile: warp wn = 0 takes the others' states,
    // rescaled to the common maximum (a slice that saw no key has m = -inf and adds nothing).
    if constexpr (kWarpsN > 1) {
        __syncthreads();  // every warp is done with the K/V stages the merge reuses
        float* merge = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + S::kQBytes);
        float* mine = merge + warp * 16 * (kD + 2);  // acc [16][D], m [16], l [16]
        if (wn > 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = g + 8 * r;
#pragma unroll
                for (int i = 0; i < kDT; ++i)
                    *reinterpret_cast<float2*>(mine + row * kD + i * 8 + 2 * t) =
                        make_float2(acc[i][2 * r], acc[i][2 * r + 1]);
                if (t == 0) mine[16 * kD + row] = m[r], mine[16 * kD + 16 + row] = l[r];
            }
        }
        __syncthreads();
        if (wn == 0) {
#pragma unroll
            for (int w = 1; w < kWarpsN; ++w) {
                const float* other = merge + (warp + w) * 16 * (kD + 2);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = g + 8 * r;
                    const float m_other = other[16 * kD + row];
                    const float m_new = fmaxf(m[r], m_other);
                    const float m_ref = m_new == -INFINITY ? 0.f : m_new;
                    const float alpha = exp2f(m[r] - m_ref), beta = exp2f(m_other - m_ref);
                    m[r] = m_new;
                    l[r] = l[r] * alpha + other[16 * kD + 16 + row] * beta;
#pragma unroll
                    for (int i = 0; i < kDT; ++i) {
                        const float2 o =
                            *reinterpret_cast<const float2*>(other + row * kD + i * 8 + 2 * t);
                        acc[i][2 * r] = acc[i][2 * r] * alpha + o.x * beta;
                        acc[i][2 * r + 1] = acc[i][2 * r + 1] * alpha + o.y * beta;
                    }
                }
            }
        }
        if (wn > 0) return;
    }

    // O = acc / l; rows without keys (l = 0) get O = 0 and lse = -inf. One split: O in the
    // dtype and lse; several: float32 O_s and lse_s in the workspace.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + wm * 16 + g + 8 * r;
        if (row >= rows) continue;
        const QueryRow qr = query_row(row, group, hkv);
        const int64_t q_row = (int64_t(b) * a.seqlen_q + qr.t) * a.num_heads_q + qr.h;
        const float sum = l[r];
        const float lse = row_lse(m[r], sum);
        if (a.splits == 1) {
            store_row(static_cast<T*>(a.out) + q_row * kD + 2 * t, acc, r, sum);
            if (a.lse && t == 0) a.lse[q_row] = lse;
        } else {
            const int64_t p_row = int64_t(split) * a.batch * a.seqlen_q * a.num_heads_q + q_row;
            store_row(a.partial_o + p_row * kD + 2 * t, acc, r, sum);
            if (t == 0) a.partial_lse[p_row] = lse;
        }
    }
}

// The combine (tests/reference.py attention_combine), one CTA per (sequence, token, head):
// M = max_s lse_s, w_s = exp(lse_s - M), O = sum_s w_s O_s / sum_s w_s, lse = M + ln(sum_s w_s).
// A split with lse_s = -inf has w_s = 0 and adds nothing, whatever its O_s holds; where all do,
// O = 0 and lse = -inf. The partials sit in L2 and the work is a few flops: the time is round
// trips, so every load is issued at once. Each warp reads all the lse_s (two per lane: at most
// 64 splits) and the O_s of its splits s = warp + kCombineWarps i (a lane kD / 32 values of
// each), weighs them, and the warps' sums meet in shared memory, added in warp order. Launched as
// a dependent of the split kernel (launch_dependent): its blocks start early and wait there for
// the partials.
constexpr int kCombineWarps = 4;
constexpr int kCombinePerWarp = kDecodeMaxSplits / kCombineWarps;  // splits a warp reads at most
static_assert(kDecodeMaxSplits <= 64 && kDecodeMaxSplits % kCombineWarps == 0,
              "two splits' lse per lane; whole splits per warp");
template <typename T, int kD>
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(const DecodeArgs a) {
    constexpr int kPerLane = kD / 32;  // 2 or 4 consecutive values per lane
    static_assert(kPerLane == 2 || kPerLane == 4, "D = 64 or 128");
    using Vec = std::conditional_t<kPerLane == 4, float4, float2>;
    __shared__ Vec parts[kCombineWarps][32];

    wait_for_prior_grid();
    allow_dependent_launch();  // the next call's split kernel may launch: it waits for this one
    const int64_t total = int64_t(a.batch) * a.seqlen_q * a.num_heads_q;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t row = blockIdx.x; row < total; row += gridDim.x) {
        float lse[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int s = lane + 32 * i;
            lse[i] = s < a.splits ? a.partial_lse[s * total + row] : -INFINITY;
        }
        Vec o[kCombinePerWarp];
        const float* o_row = a.partial_o + row * kD + lane * kPerLane;
#pragma unroll
        for (int i = 0; i < kCombinePerWarp; ++i) {
            const int s = warp + kCombineWarps * i;
            if (s < a.splits) o[i] = *reinterpret_cast<const Vec*>(o_row + s * total * kD);
        }

        const float top = team_reduce<32>(fmaxf(lse[0], lse[1]), MaxOp{});
        float w[2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
            w[i] = lse[i] == -INFINITY ? 0.f : exp2f((lse[i] - top) * kLog2e);
        const float sum = team_reduce<32>(w[0] + w[1], SumOp{});
        float acc[kPerLane] = {};
#pragma unroll
        for (int i = 0; i < kCombinePerWarp; ++i) {
            const int s = warp + kCombineWarps * i;  // lane s % 32 holds w_s in w[s / 32]
            const float ws = __shfl_sync(0xffffffffu, s < 32 ? w[0] : w[1], s % 32);
            if (s >= a.splits || ws == 0.f) continue;
            const float* x = reinterpret_cast<const float*>(&o[i]);
#pragma unroll
            for (int e = 0; e < kPerLane; ++e) acc[e] = fmaf(ws, x[e], acc[e]);
        }
        parts[warp][lane] = *reinterpret_cast<const Vec*>(acc);
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int v = 1; v < kCombineWarps; ++v) {
                const float* x = reinterpret_cast<const float*>(&parts[v][lane]);
#pragma unroll
                for (int e = 0; e < kPerLane; ++e) acc[e] += x[e];
            }
            T* out = static_cast<T*>(a.out) + row * kD + lane * kPerLane;
#pragma unroll
            for (int e = 0; e < kPerLane; e += 2)
                *reinterpret_cast<uint32_t*>(out + e) =
                    pack2<T>(sum > 0.f ? acc[e] / sum : 0.f, sum > 0.f ? acc[e + 1] / sum : 0.f);
            if (a.lse && lane == 0) a.lse[row] = sum > 0.f ? top + logf(sum) : -INFINITY;
        }
        __syncthreads();  // parts is free for the next row
    }
}

template <typename T, int kD, int kWarpsM, int kStagesT>
cudaError_t launch_split_stages(const DecodeArgs& a, dim3 grid, cudaStream_t stream) {
    const auto kernel = decode_split_kernel<T, kD, kWarpsM, kStagesT>;
    constexpr int kSmemBytes = Smem<kD, kWarpsM, kStagesT>::kBytes;
    static std::atomic<uint64_t> smem_done{0};
    const cudaError_t e = allow_dynamic_smem_once(kernel, kSmemBytes, smem_done);
    if (e != cudaSuccess) return e;
    return launch_dependent(kernel, grid, dim3(kThreads), kSmemBytes, stream, a);
}

// The deeper pipeline where the grid has at most one CTA per SM and the GPU gives a block its
// shared memory (up to 176 KB: not before the H100). The depth does not change what a warp
// computes, nor in which order: the same bits.
template <typename T, int kD, int kWarpsM>
cudaError_t launch_split(const DecodeArgs& a, int64_t row_groups, cudaStream_t stream) {
    const dim3 grid(unsigned(a.splits * row_groups), unsigned(a.num_heads_kv), unsigned(a.batch));
    const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
    const bool deep = ctas <= sm_count() &&
                      Smem<kD, kWarpsM, kDeepStages>::kBytes <= max_smem_optin();
    return deep ? launch_split_stages<T, kD, kWarpsM, kDeepStages>(a, grid, stream)
                : launch_split_stages<T, kD, kWarpsM, kStages>(a, grid, stream);
}

template <typename T, int kD> cudaError_t launch(const DecodeArgs& a, cudaStream_t stream) {
    const int64_t rows = int64_t(a.num_heads_q / a.num_heads_kv) * a.seqlen_q;
    const int64_t row_groups = decode_row_groups(rows);
    cudaError_t e;
    switch (decode_warps_m(rows)) {
        case 1: e = launch_split<T, kD, 1>(a, row_groups, stream); break;
        case 2: e = launch_split<T, kD, 2>(a, row_groups, stream); break;
        default: e = launch_split<T, kD, 4>(a, row_groups, stream); break;
    }
    if (e != cudaSuccess || a.splits == 1) return e;
    const int64_t total = int64_t(a.batch) * a.seqlen_q * a.num_heads_q;
    const int64_t blocks = std::min<int64_t>(total, 1 << 20);
    return launch_dependent(decode_combine_kernel<T, kD>, dim3(unsigned(blocks)),
                            dim3(kCombineWarps * 32), 0, stream, a);
}

}  // namespace

cudaError_t attention_decode(const DecodeArgs& a, cudaStream_t stream) {
    return dispatch_half_dtype(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        return a.head_dim == 64 ? launch<T, 64>(a, stream) : launch<T, 128>(a, stream);
    });
}

}  // namespace ck
