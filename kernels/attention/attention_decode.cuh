// attention_decode.cuh - decode attention over a KV cache (ck_attention_decode): the limits the
// entry point validates against, the split plan (chosen on the host from declared sizes alone,
// so that ck_attention_decode_workspace_size needs no GPU and the results do not depend on one),
// the workspace layout, and the launcher.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

// Grid: x = splits x row groups, y = Hkv, z = batch.
constexpr int64_t kDecodeMaxBatch = 65535;
constexpr int64_t kDecodeMaxHeads = 65535;
constexpr int64_t kDecodeMaxQueries = 16;   // Sq_new: new tokens per sequence
constexpr int64_t kDecodeMaxSeqlen = int64_t(1) << 30;  // positions (+ a tile) fit an int
constexpr int64_t kDecodeMaxPageSize = 65536;
constexpr int64_t kDecodeMaxSplits = 64;
// The automatic rule's most splits: on the H100, 16 splits of a single sequence (128 CTAs, one
// per SM, each a deeper pipeline) beat 32 (two per SM) at 4k and 32k keys alike, paged caches
// included (their page ids staged in shared memory), except for a quantized cache, whose
// conversion to the dtype the other CTAs hide.
constexpr int64_t kDecodeMaxAutoSplits = 16;
// The split-KV kernel deals each sequence's keys to the splits in whole blocks of this many
// keys (tests/reference.py attention_split_bounds with block_n = kDecodeBlockN).
constexpr int kDecodeBlockN = 64;

// Automatic splits (decode_num_splits): the CTAs run in waves of kDecodeWaveCtas (2 resident
// per SM x 132 SMs: the H100 the library is tuned on; a constant, not the GPU's count: see the
// header), each split at least kDecodeMinSplitKeys keys long so that the combine and the query
// load stay small beside the K and V traffic.
constexpr int64_t kDecodeWaveCtas = 264;
constexpr int64_t kDecodeMinSplitKeys = 128;
// A quantized cache's splits hold at least twice as many keys: on the H100, 32 splits of 4096
// keys measured 2-3% slower than 16, where 32 splits of 32768 keys were faster than 16
// (benchmarks/NOTES.md).
constexpr int64_t kDecodeMinSplitKeysQuantized = 256;

// Rows of a CTA: the G = Hq / Hkv query heads x Sq_new tokens of one kv head, row = t G + g, in
// m16 tiles, one per warp along M: 16, 32 or 64 rows (kWarpsM = 1, 2, 4; the 4 warps that are
// not along M split each key tile instead). More rows than 64: several row groups, each
// reading the group's K and V again (from L2 when they run together).
inline int decode_warps_m(int64_t rows) { return rows <= 16 ? 1 : rows <= 32 ? 2 : 4; }
inline int64_t decode_row_groups(int64_t rows) {
    return ceil_div(rows, 16 * int64_t(decode_warps_m(rows)));
}

// The splits of a call: `forced` (1 .. kDecodeMaxSplits) when given, else the count s in
// 1 .. min(most, ceil(max_seqlen_k / min_keys)) that minimizes the time model
// waves(s) x blocks(s), the smallest s among equals: with n = ceil(max_seqlen_k / kDecodeBlockN)
// key blocks, a split holds blocks(s) = ceil(n / s) of them, ceil(n / blocks(s)) splits hold
// any, and their CTAs take waves(s) = ceil(ctas x that / kDecodeWaveCtas) waves. most =
// kDecodeMaxAutoSplits, or kDecodeMaxSplits for a quantized cache; min_keys = kDecodeMinSplitKeys, or
// kDecodeMinSplitKeysQuantized for a quantized cache.
inline int64_t decode_num_splits(int64_t batch, int64_t heads_q, int64_t heads_kv,
                                 int64_t seqlen_q, int64_t max_seqlen_k, bool quantized,
                                 int64_t forced) {
    if (forced > 0) return forced;
    const int64_t ctas = batch * heads_kv * decode_row_groups(heads_q / heads_kv * seqlen_q);
    const int64_t blocks = ceil_div(max_seqlen_k, kDecodeBlockN);
    const int64_t min_keys = quantized ? kDecodeMinSplitKeysQuantized : kDecodeMinSplitKeys;
    const int64_t most =
        std::min(quantized ? kDecodeMaxSplits : kDecodeMaxAutoSplits,
                 ceil_div(max_seqlen_k, min_keys));
    int64_t best = 1, best_cost = INT64_MAX;
    for (int64_t s = 1; s <= most; ++s) {
        const int64_t per_split = ceil_div(blocks, s);
        const int64_t waves = ceil_div(ctas * ceil_div(blocks, per_split), kDecodeWaveCtas);
        const int64_t cost = waves * per_split;
        if (cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

inline int64_t round_up_256(int64_t bytes) { return ceil_div(bytes, 256) * 256; }

// Workspace with splits > 1: float32 O_s [splits, B, Sq, Hq, D] from byte 0, then float32 lse_s
// [splits, B, Sq, Hq] from byte round_up_256(O_s bytes); one split needs none (0 bytes).
struct DecodeWorkspace {
    int64_t lse_offset, bytes;
};
inline DecodeWorkspace decode_workspace(int64_t splits, int64_t batch, int64_t seqlen_q,
                                        int64_t heads_q, int64_t head_dim) {
    if (splits <= 1) return {0, 0};
    const int64_t rows = splits * batch * seqlen_q * heads_q;
    const int64_t o = round_up_256(rows * head_dim * 4);
    return {o, o + round_up_256(rows * 4)};
}

// A validated call, defaults resolved.
struct DecodeArgs {
    ck_dtype_t dtype;  // fp16 or bf16
    const void* q;
    const void* k;     // contiguous [B, max_seqlen_k, Hkv, D] or pages [num_pages, page, Hkv, D]
    const void* v;
    const int32_t* seqlens_k;
    const int32_t* block_table;  // nullptr: contiguous
    void* out;
    float* lse;        // nullptr: not written
    float* partial_o;  // the workspace's O_s (splits > 1)
    float* partial_lse;
    int batch, seqlen_q, num_heads_q, num_heads_kv, head_dim;
    int max_seqlen_k;
    int num_pages, page_shift, max_blocks;  // paged: page_size = 1 << page_shift
    int splits;
    float scale;
    ck_kv_format_t kv_format;  // CK_KV_DTYPE: k and v hold dtype values; else 8-bit codes
    bool per_token;            // quantized: scales per cache row, else per kv head
    const float* k_scale;      // quantized: [Hkv] or [cache rows, Hkv]
    const float* v_scale;
};
cudaError_t attention_decode(const DecodeArgs& args, cudaStream_t stream);

}  // namespace ck
