// attention.cuh - prefill attention (ck_attention_forward): the launcher the entry point calls
// after it validated every argument, and the limits it validates against.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

// The grid is (query blocks, Hq, batch): gridDim.y and gridDim.z hold 65535 at most.
constexpr int64_t kAttentionMaxHeads = 65535;
constexpr int64_t kAttentionMaxBatch = 65535;
// Offsets are int32 on the device; totals stay below 2^31 so that token indices fit an int.
constexpr int64_t kAttentionMaxTokens = INT32_MAX;

// Whether the kernel has a specialization for this head dim (64 and 128).
inline bool attention_head_dim_ok(int64_t d) { return d == 64 || d == 128; }

// A validated call, defaults resolved: one sequence has batch 1 and null offsets; max_seqlen_q
// >= 1; scale the float32 softmax scale itself.
struct AttentionArgs {
    ck_dtype_t dtype;  // fp16 or bf16
    const void* q;
    const void* k;
    const void* v;
    void* out;
    float* lse;  // nullptr: not written
    int64_t total_q, total_k;
    int num_heads_q, num_heads_kv, head_dim;
    int batch;
    const int32_t* cu_seqlens_q;  // both nullptr, or both [batch + 1]
    const int32_t* cu_seqlens_k;
    int64_t max_seqlen_q;
    float scale;
    bool causal;
};
// Calls f(T{}, D, causal) with the call's element type T (__half or __nv_bfloat16), its head dim
// as std::integral_constant<int, 64 or 128> and its mask as std::bool_constant: the kernels'
// template arguments.
template <class F> cudaError_t dispatch_attention(const AttentionArgs& a, F&& f) {
    return dispatch_half_dtype(a.dtype, [&](auto tag) {
        return with_bool(a.causal, [&](auto causal) {
            return a.head_dim == 64 ? f(tag, std::integral_constant<int, 64>{}, causal)
                                    : f(tag, std::integral_constant<int, 128>{}, causal);
        });
    });
}

// The mma.sync kernel (attention_fwd.cu, compute capability 8.0+), every validated call.
cudaError_t attention_forward(const AttentionArgs& args, cudaStream_t stream);

// The Hopper kernel (attention_fwd_sm90.cu): calls with keys (total_k >= 1), on a compute
// capability 9.0 GPU with the library's sm_90a code.
bool attention_wgmma_serves(const AttentionArgs& args);
cudaError_t attention_forward_wgmma(const AttentionArgs& args, cudaStream_t stream);

}  // namespace ck
