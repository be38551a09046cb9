// moe.cuh - the Mixture-of-Experts layer (ck_moe_*): routing, the grouping of (token, expert)
// pairs by expert, the combine, and the workspace that ties them to the expert GEMMs (the
// prepacked W4A16 kernels in their grouped mode, gemm/gemm_w4a16.cuh). Called by the entry
// points after they validated every argument.
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"

namespace ck {

constexpr int64_t kMoeMaxExperts = 1024;
constexpr int64_t kMoeMaxTopK = 32;

// Routing (ck_moe_route): logits [tokens, experts] -> ids, weights [tokens, top_k].
struct MoeRouteArgs {
    const void* logits;
    ck_dtype_t dtype;  // fp32, fp16 or bf16
    int64_t tokens, experts, top_k;
    bool renormalize;
    int32_t* ids;
    float* weights;
};
cudaError_t moe_route(const MoeRouteArgs& a, cudaStream_t stream);

// The workspace of one layer call: where each piece lives, from the sizes alone (no data).
// Rows are the expert-sorted pairs padded per expert to a multiple of the grouped GEMM's rows
// per block: at most pairs + min(experts, pairs) * (block_rows - 1), rounded up to a block. The regions
// are sized for the largest block (kMoeMaxBlockRows) so that every path fits. pair_out also
// holds, until the down GEMM writes it, the Hopper path's gathered token rows ([max rows,
// hidden] dtype, moe_experts_wgmma).
constexpr int kMoeMaxBlockRows = kWgmmaWideRows;  // the Hopper path's wide blocks: the largest
struct MoePlan {
    int64_t tokens, hidden, inter, experts, top_k, pairs;
    ck_dtype_t dtype;
    // Byte offsets into the workspace (256-byte aligned), and its size.
    size_t ids, weights, sorted_ids, block_expert, inter_rows, pair_out, bytes;

    // At most min(experts, pairs) experts have rows, each padded by block_rows - 1 at most.
    int64_t active_experts() const { return std::min(pairs, experts); }
    int64_t max_blocks(int block_rows) const {
        return ceil_div(pairs + active_experts() * (block_rows - 1), block_rows);
    }
    // The rows an expert that has any gets, on average: what picks the expert GEMMs' kernel.
    int64_t rows_per_expert() const { return ceil_div(pairs, active_experts()); }

    // The Hopper path's mixed blocks (moe_experts_wgmma from 129 rows per expert): an expert
    // with n rows takes n / 256 blocks of 256 rows, one more where the rest is over 128, else
    // one block of 128 for a rest of 1 ... 128. Its 256-row blocks pad it by at most 127 rows,
    // so they hold at most wide_rows() rows, followed by at most one 128-row block per expert.
    int64_t wide_rows() const {
        return ceil_div(pairs + active_experts() * (kWgmmaNarrowRows - 1), int64_t(kWgmmaWideRows)) *
               kWgmmaWideRows;
    }
    int64_t mixed_rows() const { return wide_rows() + active_experts() * kWgmmaNarrowRows; }
    int64_t mixed_blocks() const { return wide_rows() / kWgmmaWideRows + active_experts(); }
};
MoePlan moe_plan(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k,
                 ck_dtype_t dtype);

// The layer after routing: ids and weights [pairs] (given or routed), the weights, the output
// and the workspace. moe_experts_stream groups the pairs in blocks of 16 rows for the
// weight-streaming kernel (a few rows per expert: decode); moe_experts_tc in blocks of 64 or
// 128 for the tensor-core kernel, moe_experts_wgmma in blocks of 128 or 256 for the Hopper one. Each
// then runs gate+up (SwiGLU), down (weighted) and combine.
struct MoeExperts {
    MoePlan plan;
    int64_t group_size;  // as the caller gave it (CK_GROUP_ROW or 32, 64, 128)
    const void* x;
    const int32_t* ids;
    const float* weights;
    const uint8_t* w13;
    const void* w13_scales;
    const uint8_t* w13_zeros;
    const uint8_t* w2;
    const void* w2_scales;
    const uint8_t* w2_zeros;
    void* out;
    uint8_t* workspace;
};
cudaError_t moe_experts_stream(const MoeExperts& a, cudaStream_t stream);
cudaError_t moe_experts_tc(const MoeExperts& a, cudaStream_t stream);
// The Hopper path (gemm_w4a16_wgmma_available()): blocks of 128 rows, or from 129 rows per
// expert mixed blocks of 256 and 128 (MoePlan::wide_rows); the tokens' rows are first gathered
// in sorted order (the tensor maps read contiguous rows).
cudaError_t moe_experts_wgmma(const MoeExperts& a, cudaStream_t stream);

// Groups the pairs by expert (one block): sorted_ids[r] = pair id t * top_k + j of row r,
// `pairs` on padding rows; block_expert[b] = the expert of rows b * block_rows ..., or -1
// for blocks past the last used row. Pairs whose id is outside [0, experts) are left out.
struct MoeAlignArgs {
    const int32_t* ids;  // [pairs]
    int64_t pairs, experts;
    int block_rows;
    int64_t max_rows, max_blocks;
    int32_t* sorted_ids;
    int32_t* block_expert;
};
cudaError_t moe_align(const MoeAlignArgs& a, cudaStream_t stream);

// The same for MoePlan's mixed blocks: sorted_ids [mixed_rows()] (the 256-row blocks' rows,
// then the 128-row blocks' from row wide_rows()), block_expert [mixed_blocks()] (the 256-row
// blocks', then the 128-row blocks' from wide_rows() / 256).
cudaError_t moe_align_mixed(const MoePlan& p, const int32_t* ids, int32_t* sorted_ids,
                            int32_t* block_expert, cudaStream_t stream);

// out[t, :] = round_to_dtype(sum_j pair_out[t * top_k + j, :]) over the pairs whose id is in
// [0, experts), j in order.
struct MoeCombineArgs {
    const float* pair_out;  // [pairs, hidden]
    const int32_t* ids;     // [pairs]
    int64_t tokens, hidden, experts, top_k;
    ck_dtype_t dtype;
    void* out;              // [tokens, hidden]
};
cudaError_t moe_combine(const MoeCombineArgs& a, cudaStream_t stream);

}  // namespace ck
