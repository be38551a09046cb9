// moe.cu - the Mixture-of-Experts layer's own kernels: routing (softmax then top-k), the
// grouping of (token, expert) pairs by expert, and the combine over each token's k experts.
// The expert GEMMs are the prepacked W4A16 streaming kernel in its grouped mode
// (gemm/gemm_w4a16_prepacked_stream.cu); cuda_kernels.cu runs the pieces in order.
//
// Floors (Mixtral, T = 4096, k = 2, H = 4096): routing reads T * E logits and writes 2 T k
// values (~0.2 MB); grouping reads T k ids and writes ~T k + E * 15 rows (~0.1 MB, one block:
// a few microseconds); combine reads T k H fp32 and writes T H dtype (134 + 34 MB: ~56 us at
// 3 TB/s). The expert GEMMs' weight bytes dominate every T.
#include "kernels/moe/moe.cuh"

#include "kernels/quantize/quantize.cuh"

namespace ck {
namespace {

// ---------------------------------------------------------------------------------------------
// Routing: one warp per token. Lane l holds logits l, l + 32, ... (up to 32 each: E <= 1024).
// p = exp(v - max) / sum (float32, expf); then k rounds of a warp arg-max over the experts not
// yet chosen (larger p first, the lower index on ties), so ids come out in descending order.
// ---------------------------------------------------------------------------------------------
constexpr int kRouteWarps = 4;
constexpr int kRoutePerLane = int(kMoeMaxExperts / 32);

template <typename T>
__global__ void __launch_bounds__(kRouteWarps * 32)
moe_route_kernel(const T* __restrict__ logits, int64_t first, int64_t tokens, int experts,
                 int top_k, bool renormalize, int32_t* __restrict__ ids,
                 float* __restrict__ weights) {
    const int lane = threadIdx.x % 32;
    const int64_t t = first + int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
    if (t >= tokens) return;  // warp-uniform
    const T* row = logits + t * experts;

    float v[kRoutePerLane];
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < kRoutePerLane; ++r) {
        const int e = lane + 32 * r;
        v[r] = e < experts ? to_float(row[e]) : -INFINITY;
        mx = fmaxf(mx, v[r]);
    }
    mx = team_reduce<32>(mx, [](float a, float b) { return fmaxf(a, b); });
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < kRoutePerLane; ++r) {
        v[r] = lane + 32 * r < experts ? expf(v[r] - mx) : -1.f;  // chosen / absent: below any p
        sum += v[r] > 0.f ? v[r] : 0.f;
    }
    sum = team_reduce<32>(sum, [](float a, float b) { return a + b; });
    const float inv = 1.f / sum;

    float chosen = 0.f;  // lane j keeps pick j's probability
    int chosen_id = 0;
    for (int j = 0; j < top_k; ++j) {
        float best = -2.f;
        int best_e = INT32_MAX;
#pragma unroll
        for (int r = 0; r < kRoutePerLane; ++r)
            if (v[r] > best) best = v[r], best_e = lane + 32 * r;  // ascending e: first max wins
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, off);
            const int oe = __shfl_xor_sync(0xffffffffu, best_e, off);
            if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
        }
        if (lane == j) chosen = best * inv, chosen_id = best_e;
        if (best_e % 32 == lane) {
#pragma unroll
            for (int r = 0; r < kRoutePerLane; ++r)
                if (lane + 32 * r == best_e) v[r] = -1.f;
        }
    }
    if (renormalize) {
        float total = 0.f;  // in pick order, the same sum in every lane
        for (int j = 0; j < top_k; ++j) total += __shfl_sync(0xffffffffu, chosen, j);
        chosen /= total;
    }
    if (lane < top_k) {
        ids[t * top_k + lane] = chosen_id;
        weights[t * top_k + lane] = chosen;
    }
}

// ---------------------------------------------------------------------------------------------
// Grouping: one block. Counts per expert (shared atomics), rows per expert padded to
// block_rows, an exclusive scan of those, then every pair takes the next row of its expert.
// The order of an expert's pairs among its rows depends on timing; nothing else does: every
// row of a GEMM block is computed alone, and the combine adds a token's pairs in pair order.
// ---------------------------------------------------------------------------------------------
constexpr int kAlignThreads = 1024;
static_assert(kAlignThreads >= kMoeMaxExperts, "one thread per expert in the scan");

__global__ void __launch_bounds__(kAlignThreads)
moe_align_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts, int block_rows,
                 int64_t max_rows, int64_t max_blocks, int32_t* __restrict__ sorted_ids,
                 int32_t* __restrict__ block_expert) {
    __shared__ int count[kMoeMaxExperts];
    __shared__ int start[kMoeMaxExperts];
    __shared__ int warp_sums[kAlignThreads / 32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (tid < experts) count[tid] = 0;
    const int32_t pad = int32_t(pairs);
    for (int64_t r = tid; r < max_rows; r += kAlignThreads) sorted_ids[r] = pad;
    __syncthreads();
    for (int64_t p = tid; p < pairs; p += kAlignThreads) {
        const int e = ids[p];
        if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
    }
    __syncthreads();

    // Exclusive scan of the padded row counts (one thread per expert).
    const int padded = tid < experts ? (count[tid] + block_rows - 1) / block_rows * block_rows : 0;
    int inclusive = padded;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const int o = __shfl_up_sync(0xffffffffu, inclusive, off);
        if (lane >= off) inclusive += o;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int before = 0;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    const int first = before + inclusive - padded;
    if (tid < experts) {
        start[tid] = first;
        for (int b = first / block_rows; b < (first + padded) / block_rows; ++b) block_expert[b] = tid;
    }
    int used = 0;  // rows in use: the scan's total
    for (int w = 0; w < kAlignThreads / 32; ++w) used += warp_sums[w];
    for (int64_t b = used / block_rows + tid; b < max_blocks; b += kAlignThreads) block_expert[b] = -1;
    __syncthreads();  // the padding fill above is done before the pairs land

    for (int64_t p = tid; p < pairs; p += kAlignThreads) {
        const int e = ids[p];
        if (e >= 0 && e < experts) sorted_ids[atomicAdd(&start[e], 1)] = int32_t(p);
    }
}

// Mixed blocks (MoePlan::wide_rows): the same steps, with per expert a count of 256-row blocks
// and one of 128-row blocks (0 or 1), scanned together as the two halves of a 64-bit value.
// An expert's pairs fill its 256-row blocks first, then its 128-row block.
__global__ void __launch_bounds__(kAlignThreads)
moe_align_mixed_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts,
                       int64_t wide_rows, int64_t narrow_blocks, int32_t* __restrict__ sorted_ids,
                       int32_t* __restrict__ block_expert) {
    constexpr int kWide = kWgmmaWideRows, kNarrow = kWgmmaNarrowRows;
    __shared__ int count[kMoeMaxExperts];
    __shared__ int64_t wide_start[kMoeMaxExperts], wide_end[kMoeMaxExperts];
    __shared__ int64_t narrow_start[kMoeMaxExperts];
    __shared__ unsigned long long warp_sums[kAlignThreads / 32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int64_t wide_blocks = wide_rows / kWide;
    if (tid < experts) count[tid] = 0;
    const int32_t pad = int32_t(pairs);
    for (int64_t r = tid; r < wide_rows + narrow_blocks * kNarrow; r += kAlignThreads)
        sorted_ids[r] = pad;
    __syncthreads();
    for (int64_t p = tid; p < pairs; p += kAlignThreads) {
        const int e = ids[p];
        if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
    }
    __syncthreads();

    unsigned long long mine = 0;  // 256-row blocks << 32 | 128-row blocks
    if (tid < experts) {
        const int n = count[tid], rest = n % kWide;
        mine = (static_cast<unsigned long long>(n / kWide + (rest > kNarrow)) << 32) |
               (rest > 0 && rest <= kNarrow ? 1u : 0u);
    }
    unsigned long long inclusive = mine;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const unsigned long long o = __shfl_up_sync(0xffffffffu, inclusive, off);
        if (lane >= off) inclusive += o;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    unsigned long long before = 0, total = 0;
    for (int w = 0; w < kAlignThreads / 32; ++w) {
        if (w < warp) before += warp_sums[w];
        total += warp_sums[w];
    }
    const unsigned long long first = before + inclusive - mine;
    const int64_t wide_first = int64_t(first >> 32), narrow_first = int64_t(first & 0xffffffffu);
    if (tid < experts) {
        const int64_t wide = int64_t(mine >> 32);
        for (int64_t b = wide_first; b < wide_first + wide; ++b) block_expert[b] = tid;
        if (mine & 1u) block_expert[wide_blocks + narrow_first] = tid;
        wide_start[tid] = wide_first * kWide;
        wide_end[tid] = (wide_first + wide) * kWide;
        narrow_start[tid] = wide_rows + narrow_first * kNarrow;
    }
    for (int64_t b = int64_t(total >> 32) + tid; b < wide_blocks; b += kAlignThreads)
        block_expert[b] = -1;
    for (int64_t b = int64_t(total & 0xffffffffu) + tid; b < narrow_blocks; b += kAlignThreads)
        block_expert[wide_blocks + b] = -1;
    __syncthreads();  // the padding fill and the starts are in place before the pairs land

    for (int64_t p = tid; p < pairs; p += kAlignThreads) {
        const int e = ids[p];
        if (e < 0 || e >= experts) continue;
        const int64_t row = atomicAdd(reinterpret_cast<unsigned long long*>(&wide_start[e]), 1ull);
        sorted_ids[row < wide_end[e] ? row : narrow_start[e] + (row - wide_end[e])] = int32_t(p);
    }
}

// ---------------------------------------------------------------------------------------------
// Combine: one thread per 4 consecutive outputs of a token (hidden % 32 == 0): the sum over
// j = 0 .. k-1 of the pairs whose id is valid, in that order, rounded once.
// ---------------------------------------------------------------------------------------------
constexpr int kCombineThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
moe_combine_kernel(const float* __restrict__ pair_out, const int32_t* __restrict__ ids,
                   int64_t tokens, int64_t hidden, int experts, int top_k, T* __restrict__ out) {
    const int64_t quads = hidden / 4;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens * quads;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = i / quads, c = i % quads * 4;
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < top_k; ++j) {
            const int64_t p = t * top_k + j;
            const int e = ids[p];
            if (e < 0 || e >= experts) continue;
            const float4 v = *reinterpret_cast<const float4*>(pair_out + p * hidden + c);
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        T* o = out + t * hidden + c;
        FloatEpilogue<T>::store_two(o, from_float<T>(s.x), from_float<T>(s.y));
        FloatEpilogue<T>::store_two(o + 2, from_float<T>(s.z), from_float<T>(s.w));
    }
}

// ---------------------------------------------------------------------------------------------
// Gather (the Hopper path): rows[r, :] = x[sorted_ids[r] / top_k, :] for the rows that hold a
// pair, 0 on padding rows; 16-byte vectors (hidden % 32 == 0, x and rows 16-byte aligned).
// ---------------------------------------------------------------------------------------------
constexpr int kGatherThreads = 256;

__global__ void __launch_bounds__(kGatherThreads)
moe_gather_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ sorted_ids,
                  int64_t rows, int64_t pairs, int top_k, int64_t row_vectors,
                  uint4* __restrict__ out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * row_vectors;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = i / row_vectors, v = i % row_vectors;
        const int64_t pair = sorted_ids[r];
        out[i] = pair < pairs ? x[pair / top_k * row_vectors + v] : make_uint4(0, 0, 0, 0);
    }
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// The grid of the MoE layer's grid-stride loops over `items` threads' work.
unsigned grid_stride_blocks(int64_t items, int threads) {
    return unsigned(std::min<int64_t>(ceil_div(items, threads), 8 * std::max(sm_count(), 1)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers (arguments validated by cuda_kernels.cu)
// ---------------------------------------------------------------------------------------------
cudaError_t moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
    // One launch per 2^31 - 1 blocks of tokens (a grid holds no more): one for any real batch.
    constexpr int64_t kLaunchTokens = int64_t(INT32_MAX) * kRouteWarps;
    return dispatch_float_dtype(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        for (int64_t first = 0; first < a.tokens; first += kLaunchTokens) {
            const int64_t blocks = ceil_div(std::min(kLaunchTokens, a.tokens - first), kRouteWarps);
            moe_route_kernel<T><<<unsigned(blocks), kRouteWarps * 32, 0, stream>>>(
                static_cast<const T*>(a.logits), first, a.tokens, int(a.experts), int(a.top_k),
                a.renormalize, a.ids, a.weights);
            if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
        }
        return cudaSuccess;
    });
}

MoePlan moe_plan(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k,
                 ck_dtype_t dtype) {
    MoePlan p{};
    p.tokens = tokens, p.hidden = hidden, p.inter = inter, p.experts = experts, p.top_k = top_k;
    p.pairs = tokens * top_k;
    p.dtype = dtype;
    // The most rows and blocks of any path: 16-row blocks have the most rows' worth of blocks
    // for few pairs, 256-row blocks or mixed blocks (up to 255 rows more) the most rows.
    const int64_t blocks16 = p.max_blocks(kMoeBlockRows);
    const int64_t max_rows = std::max({p.max_blocks(kMoeMaxBlockRows) * kMoeMaxBlockRows,
                                       p.mixed_rows(), blocks16 * kMoeBlockRows});
    const int64_t max_blocks = std::max(blocks16, p.mixed_blocks());
    size_t at = 0;
    auto take = [&](size_t bytes) {
        const size_t here = at;
        at += align256(bytes);
        return here;
    };
    p.ids = take(size_t(p.pairs) * 4);
    p.weights = take(size_t(p.pairs) * 4);
    p.sorted_ids = take(size_t(max_rows) * 4);
    p.block_expert = take(size_t(max_blocks) * 4);
    p.inter_rows = take(size_t(max_rows) * size_t(inter) * 2);
    p.pair_out = take(std::max(size_t(p.pairs) * 4, size_t(max_rows) * 2) * size_t(hidden));
    p.bytes = at;
    return p;
}

cudaError_t moe_align(const MoeAlignArgs& a, cudaStream_t stream) {
    moe_align_kernel<<<1, kAlignThreads, 0, stream>>>(a.ids, a.pairs, int(a.experts), a.block_rows,
                                                      a.max_rows, a.max_blocks, a.sorted_ids,
                                                      a.block_expert);
    return cudaGetLastError();
}

cudaError_t moe_align_mixed(const MoePlan& p, const int32_t* ids, int32_t* sorted_ids,
                            int32_t* block_expert, cudaStream_t stream) {
    moe_align_mixed_kernel<<<1, kAlignThreads, 0, stream>>>(
        ids, p.pairs, int(p.experts), p.wide_rows(), p.active_experts(), sorted_ids, block_expert);
    return cudaGetLastError();
}

cudaError_t moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
    const unsigned blocks = grid_stride_blocks(a.tokens * (a.hidden / 4), kCombineThreads);
    return dispatch_half_dtype(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        moe_combine_kernel<T><<<blocks, kCombineThreads, 0, stream>>>(
            a.pair_out, a.ids, a.tokens, a.hidden, int(a.experts), int(a.top_k), static_cast<T*>(a.out));
        return cudaGetLastError();
    });
}

namespace {

// One projection's grouped GEMM operands: expert 0's prepacked weight [n, k].
GemmW4A16Args projection(const MoeExperts& a, const void* x, const uint8_t* w, const void* scales,
                         const uint8_t* zeros, int64_t n, int64_t k, void* out, MoeRows& rows) {
    GemmW4A16Args g{};
    g.x = x;
    g.dtype = a.plan.dtype;
    g.w = w;
    g.scales = scales;
    g.zeros = zeros;
    g.group_size = a.group_size == CK_GROUP_ROW ? k : a.group_size;
    g.groups = int4_groups_per_row(k, a.group_size);
    g.activation = CK_ACTIVATION_NONE;
    g.m = kMoeBlockRows, g.n = n, g.k = k;
    g.out = out;
    g.prepacked = true;
    g.derive();
    rows.w_expert_bytes = prepacked_rows(n) * prepacked_chunks(k) * (kPackK / 2);  // as ck_w4a16_prepacked_bytes
    rows.s_expert_values = prepacked_rows(n) * g.groups;
    return g;
}

// Groups the pairs in blocks of block_rows, then gate+up, down and combine; gemm(args, mode,
// rows, row_blocks) runs one projection.
template <class Gemm>
cudaError_t run_experts(const MoeExperts& a, int block_rows, Gemm&& gemm, cudaStream_t stream) {
    const MoePlan& p = a.plan;
    MoeRows rows{};
    rows.sorted_ids = reinterpret_cast<int32_t*>(a.workspace + p.sorted_ids);
    rows.block_expert = reinterpret_cast<int32_t*>(a.workspace + p.block_expert);
    rows.pairs = p.pairs;
    const int64_t blocks = p.max_blocks(block_rows);
    const MoeAlignArgs align{a.ids, p.pairs, p.experts, block_rows, blocks * block_rows, blocks,
                             const_cast<int32_t*>(rows.sorted_ids),
                             const_cast<int32_t*>(rows.block_expert)};
    cudaError_t e = moe_align(align, stream);
    if (e != cudaSuccess) return e;

    void* inter = a.workspace + p.inter_rows;
    float* pair_out = reinterpret_cast<float*>(a.workspace + p.pair_out);
    MoeRows up_rows = rows;
    up_rows.x_div = int32_t(p.top_k);
    const GemmW4A16Args up = projection(a, a.x, a.w13, a.w13_scales, a.w13_zeros, 2 * p.inter,
                                        p.hidden, inter, up_rows);
    e = gemm(up, kMoeSwiGLU, up_rows, blocks);
    if (e != cudaSuccess) return e;
    MoeRows down_rows = rows;
    down_rows.pair_weights = a.weights;
    down_rows.pair_out = pair_out;
    const GemmW4A16Args down = projection(a, inter, a.w2, a.w2_scales, a.w2_zeros, p.hidden, p.inter,
                                          nullptr, down_rows);
    e = gemm(down, kMoeWeighted, down_rows, blocks);
    if (e != cudaSuccess) return e;
    const MoeCombineArgs combine{pair_out, a.ids, p.tokens, p.hidden, p.experts, p.top_k, p.dtype,
                                 a.out};
    return moe_combine(combine, stream);
}

}  // namespace

namespace {

// The tokens' rows of the first `rows` sorted rows, gathered in sorted order into x_rows.
cudaError_t gather_rows(const MoeExperts& a, const int32_t* sorted_ids, int64_t rows, void* x_rows,
                        cudaStream_t stream) {
    const MoePlan& p = a.plan;
    const int64_t row_vectors = p.hidden * 2 / 16;
    moe_gather_kernel<<<grid_stride_blocks(rows * row_vectors, kGatherThreads), kGatherThreads, 0,
                        stream>>>(static_cast<const uint4*>(a.x), sorted_ids, rows, p.pairs,
                                  int(p.top_k), row_vectors, static_cast<uint4*>(x_rows));
    return cudaGetLastError();
}

// Up to 128 rows per expert: blocks of 128 rows. Beyond, mixed blocks: 256-row blocks cost about
// 0.75 of 128-row blocks per row (one dequantized A fragment feeds twice the multiply-adds:
// 0.69-0.78 on the dense layers, benchmarks/NOTES.md), and an expert's last 1 ... 128 rows take
// a 128-row block, so that no expert pads more than 127 rows (256-row blocks alone: up to 255,
// half the experts a second block at 256 rows each on average).
cudaError_t experts_wgmma_narrow(const MoeExperts& a, void* x_rows, cudaStream_t stream) {
    const MoePlan& p = a.plan;
    return run_experts(a, kWgmmaNarrowRows, [&](GemmW4A16Args g, MoeMode mode,
                                                const MoeRows& rows, int64_t blocks) {
        if (mode == kMoeSwiGLU) {
            const cudaError_t e = gather_rows(a, rows.sorted_ids, blocks * kWgmmaNarrowRows,
                                              x_rows, stream);
            if (e != cudaSuccess) return e;
            g.x = x_rows;
        }
        return gemm_w4a16_prepacked_wgmma_grouped(g, mode, rows, kWgmmaNarrowRows, blocks,
                                                  p.experts, stream);
    }, stream);
}

cudaError_t experts_wgmma_mixed(const MoeExperts& a, void* x_rows, cudaStream_t stream) {
    const MoePlan& p = a.plan;
    int32_t* sorted_ids = reinterpret_cast<int32_t*>(a.workspace + p.sorted_ids);
    int32_t* block_expert = reinterpret_cast<int32_t*>(a.workspace + p.block_expert);
    cudaError_t e = moe_align_mixed(p, a.ids, sorted_ids, block_expert, stream);
    if (e == cudaSuccess) e = gather_rows(a, sorted_ids, p.mixed_rows(), x_rows, stream);
    if (e != cudaSuccess) return e;

    // The two regions of sorted rows: 256-row blocks from row 0, 128-row blocks from wide_rows().
    struct Region {
        int block_rows;
        int64_t first_row, first_block, blocks;
    };
    const int64_t wide_blocks = p.wide_rows() / kWgmmaWideRows;
    const Region regions[2] = {{kWgmmaWideRows, 0, 0, wide_blocks},
                               {kWgmmaNarrowRows, p.wide_rows(), wide_blocks, p.active_experts()}};
    uint8_t* inter = a.workspace + p.inter_rows;
    float* pair_out = reinterpret_cast<float*>(a.workspace + p.pair_out);
    for (const MoeMode mode : {kMoeSwiGLU, kMoeWeighted}) {
        for (const Region& r : regions) {
            MoeRows rows{};
            rows.sorted_ids = sorted_ids + r.first_row;
            rows.block_expert = block_expert + r.first_block;
            rows.pairs = p.pairs;
            uint8_t* inter_r = inter + r.first_row * p.inter * 2;
            GemmW4A16Args g;
            if (mode == kMoeSwiGLU) {
                g = projection(a, static_cast<uint8_t*>(x_rows) + r.first_row * p.hidden * 2, a.w13,
                               a.w13_scales, a.w13_zeros, 2 * p.inter, p.hidden, inter_r, rows);
            } else {
                rows.pair_weights = a.weights;
                rows.pair_out = pair_out;
                g = projection(a, inter_r, a.w2, a.w2_scales, a.w2_zeros, p.hidden, p.inter,
                               nullptr, rows);
            }
            e = gemm_w4a16_prepacked_wgmma_grouped(g, mode, rows, r.block_rows, r.blocks,
                                                   p.experts, stream);
            if (e != cudaSuccess) return e;
        }
    }
    const MoeCombineArgs combine{pair_out, a.ids, p.tokens, p.hidden, p.experts, p.top_k, p.dtype,
                                 a.out};
    return moe_combine(combine, stream);
}

}  // namespace

cudaError_t moe_experts_wgmma(const MoeExperts& a, cudaStream_t stream) {
    // pair_out is free until the down GEMM: the gate+up GEMM reads the gathered rows from there.
    void* x_rows = a.workspace + a.plan.pair_out;
    return a.plan.rows_per_expert() > kWgmmaNarrowRows ? experts_wgmma_mixed(a, x_rows, stream)
                                                       : experts_wgmma_narrow(a, x_rows, stream);
}

cudaError_t moe_experts_stream(const MoeExperts& a, cudaStream_t stream) {
    return run_experts(a, kMoeBlockRows, [&](const GemmW4A16Args& g, MoeMode mode, const MoeRows& rows,
                                             int64_t blocks) {
        return gemm_w4a16_prepacked_stream_grouped(g, mode, rows, blocks, a.plan.active_experts(), stream);
    }, stream);
}

cudaError_t moe_experts_tc(const MoeExperts& a, cudaStream_t stream) {
    const int block_rows = gemm_w4a16_tc_grouped_rows(a.plan.rows_per_expert());
    return run_experts(a, block_rows, [&](const GemmW4A16Args& g, MoeMode mode, const MoeRows& rows,
                                          int64_t blocks) {
        return gemm_w4a16_prepacked_tc_grouped(g, mode, rows, block_rows, blocks, stream);
    }, stream);
}

}  // namespace ck
