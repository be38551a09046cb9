// kv_cache.cuh - writing new keys and values into a KV cache (ck_kv_cache_append): copied, or
// quantized row by row to FP8 E4M3 or int8 with per-head (given) or per-token (computed) float32
// scales, for ck_attention_decode to read (cuda_kernels.h, "Quantized KV cache").
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

constexpr int64_t kKvAppendMaxTokens = INT32_MAX;

// A validated call.
struct KvAppendArgs {
    ck_dtype_t dtype;          // k, v: fp16 or bf16
    ck_kv_format_t format;
    bool per_token;            // quantized: scales per cache row (written), else per head (read)
    const void* k;             // [tokens, Hkv, D]
    const void* v;
    const int64_t* slots;      // [tokens]: the cache slot of each token; outside [0, num_slots):
                               // skipped
    void* k_cache;             // [num_slots, Hkv, D] of the format
    void* v_cache;
    float* k_scale;            // quantized: [Hkv] or [num_slots, Hkv]
    float* v_scale;
    int64_t tokens, num_slots;
    int num_heads_kv, head_dim;
};
cudaError_t kv_cache_append(const KvAppendArgs& args, cudaStream_t stream);

}  // namespace ck
