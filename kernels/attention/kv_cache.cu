// kv_cache.cu - ck_kv_cache_append: new keys and values into a KV cache, copied or quantized row
// by row to FP8 E4M3 or int8 (cuda_kernels.h, "Quantized KV cache"; tests/reference.py
// kv_cache_quantize is the spec, bit for bit).
//
// Layout: k, v [tokens, Hkv, D]; the cache [num_slots, Hkv, D] (a contiguous cache [batch,
// max_seqlen_k] or a paged one [num_pages, page_size], flattened to slots); per-token scales
// [num_slots, Hkv]; slots int64 [tokens].
//
// Algorithm: a team of D / 8 lanes (8 or 16) per row, a row being the key or the value of one
// token at one kv head. Each lane loads 8 values (16 bytes); with per-token scales the team
// reduces the row's absmax by shuffles and derives the scale as ck_quantize_fp8 / int8 do
// per row (int4_params.cuh: make_params), with per-head scales it reads the head's; each lane
// encodes its 8 codes (the quantizers' encode) and stores them (8 bytes), or copies its 16
// bytes for an unquantized cache; the team's first lane stores a per-token scale. Tokens whose
// slot lies outside [0, num_slots) write nothing.
//
// Floor: K and V, read as fp16/bf16 and written as 1 or 2 bytes per element (plus scales): a
// decode step appends a few hundred KB at most, so the call is a launch and one round trip.
#include "kernels/attention/kv_cache.cuh"

#include "kernels/quantize/int4_params.cuh"

namespace ck {
namespace {

constexpr int kThreads = 256;

// Quantization formats by cache format (the quantizers' types: int4_params.cuh, fp8.cuh).
template <ck_kv_format_t F> struct KvCodes;
template <> struct KvCodes<CK_KV_FP8_E4M3> { using Fmt = Fp8<CK_FP8_E4M3>; };
template <> struct KvCodes<CK_KV_INT8> { using Fmt = Int8Sym; };

template <typename T, ck_kv_format_t F, int kD>
__global__ void __launch_bounds__(kThreads) kv_append_kernel(const KvAppendArgs a) {
    constexpr int kTeam = kD / kChunk;  // lanes per row
    constexpr int kRowsPerWarp = 32 / kTeam;
    constexpr bool kQuantized = F != CK_KV_DTYPE;
    const int lane = threadIdx.x % kTeam;
    const int64_t rows = a.tokens * a.num_heads_kv * 2;  // (token, head, K or V)
    const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
    const int64_t warp = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
    // Warp-uniform trip count: every lane takes part in the team's shuffles.
    for (int64_t base = warp * kRowsPerWarp; base < rows; base += warps * kRowsPerWarp) {
        const int64_t row = base + threadIdx.x % 32 / kTeam;
        bool write = row < rows;
        const int64_t th = row / 2;  // token * Hkv + head
        const int64_t token = th / a.num_heads_kv;
        const int head = int(th % a.num_heads_kv);
        const bool is_v = row % 2;
        const int64_t slot = write ? __ldg(a.slots + token) : -1;
        write = slot >= 0 && slot < a.num_slots;
        const int64_t src = th * kD + lane * kChunk;  // element of k or v
        const int64_t dst = (slot * a.num_heads_kv + head) * kD + lane * kChunk;
        const T* in = static_cast<const T*>(is_v ? a.v : a.k) + src;
        Chunk<T> raw;
        if (write) raw = *reinterpret_cast<const Chunk<T>*>(in);
        if constexpr (!kQuantized) {
            T* out = static_cast<T*>(is_v ? a.v_cache : a.k_cache) + dst;
            if (write) *reinterpret_cast<Chunk<T>*>(out) = raw;
        } else {
            using Fmt = typename KvCodes<F>::Fmt;
            float v[kChunk];
            if (write) {
                chunk_to_float(raw, v);
            } else {
#pragma unroll
                for (int i = 0; i < kChunk; ++i) v[i] = 0.f;
            }
            float* scales = is_v ? a.v_scale : a.k_scale;
            float inv;
            if (a.per_token) {
                Range r;
                accumulate<Fmt>(r, v);
                r.hi = team_reduce<kTeam>(r.hi, MaxOp{});
                const QParams<float> p = make_params<Fmt, float>(r);
                inv = p.inv;
                if (write && lane == 0) scales[slot * a.num_heads_kv + head] = p.stored;
            } else {
                inv = write ? 1.f / __ldg(scales + head) : 0.f;
            }
            int q[kChunk];
            encode<Fmt>(v, inv, 0, q);
            if (write)
                store_int8_chunk<true>(static_cast<int8_t*>(is_v ? a.v_cache : a.k_cache) + dst,
                                       kChunk, q);
        }
    }
}

template <typename T, ck_kv_format_t F>
cudaError_t launch(const KvAppendArgs& a, cudaStream_t stream) {
    const int64_t rows = a.tokens * a.num_heads_kv * 2;
    const int64_t rows_per_block = int64_t(kThreads) * kChunk / a.head_dim;
    const int64_t blocks = std::min<int64_t>(ceil_div(rows, rows_per_block),
                                             int64_t(sm_count()) * (2048 / kThreads));
    const auto kernel =
        a.head_dim == 64 ? kv_append_kernel<T, F, 64> : kv_append_kernel<T, F, 128>;
    kernel<<<unsigned(std::max<int64_t>(blocks, 1)), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace

cudaError_t kv_cache_append(const KvAppendArgs& a, cudaStream_t stream) {
    return dispatch_half_dtype(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        switch (a.format) {
            case CK_KV_FP8_E4M3: return launch<T, CK_KV_FP8_E4M3>(a, stream);
            case CK_KV_INT8: return launch<T, CK_KV_INT8>(a, stream);
            default: return launch<T, CK_KV_DTYPE>(a, stream);
        }
    });
}

}  // namespace ck
