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
// tiles in flight while one computes). A paged cache's page ids of the split are read into
// shared memory once, by all threads together, before the first copies (PageWindow). Per slice,
// as the prefill kernel (attention_fwd.cu): S = Q K^T (m16n8k16, float32 sums), x = S
// scale log2(e), masked beyond the split and the causal position, online softmax (exp2), P
// rounded to the dtype, acc += P V. A split writes its normalized float32 O_s and lse_s to the
// workspace, and the combine kernel merges the splits (tests/reference.py attention_combine); a
// call of one split writes O and lse directly.
//
// A quantized cache (FP8 E4M3 or int8 codes with per-head or per-token scales) streams its codes
// (and per-token scales) through the same pipeline, half the bytes, and the warps convert them
// (exactly) in their registers as the mma operands: key codes with D permuted alike in Q and K
// so that a thread's B fragment is 4 consecutive codes (qk_codes), value codes loaded by
// ldmatrix.trans as pairs and regrouped into the fragments of even and odd output columns
// (pv_codes). The keys' scales multiply S, the values' scales P before its rounding.
//
// Floor: the K and V bytes of the sequences (tests/reference.py attention_decode_kv_bytes) at
// the copy bandwidth; the flops (4 D Hq Sq_new per key) are far below the tensor cores' rate.
#include "kernels/attention/attention_decode.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/core/fp8.cuh"

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
// in flight alone. (Tiles of codes are half the bytes; 4 and 8 stages of them measured 3-5%
// slower than 3 and 5.)
constexpr int kStages = 3, kDeepStages = 5;
// Page ids a CTA stages in shared memory (1 KB): a split of at most 256 pages has all of its ids
// there (every split at the benchmark shapes: 32768 keys over 16 splits are 128 pages of 16
// keys each); a longer one reads the block table for every tile.
constexpr int kStagedPages = 256;
static_assert(kBlockN % (16 * kWarps) == 0, "each of 4 key slices holds whole k16 steps of P V");

// The cache's elements: the dtype's values (C = T), or 8-bit codes converted to the dtype in
// shared memory (C = E4M3: FP8 E4M3 bytes; C = int8_t), times per-head or per-row scales.
struct E4M3 {};
template <typename T, class C> constexpr bool kCodes = !std::is_same<T, C>::value;

// Shared memory: Q [kRows][D], then kStages stages. A stage of dtype values holds K [kBlockN][D]
// and V [kBlockN][D]; the 16-byte chunk c of row r sits at chunk c ^ (r % 8) (rows are 128 or
// 256 bytes: without the swizzle the 8 rows an ldmatrix reads would share banks). A stage of
// codes (kCodesT) holds the K and the V codes [kBlockN][D] bytes, the 16-byte chunk c of row r at
// c ^ ((r / (128 / D)) % (D / 16)) (the 8 rows that one load of a fragment reads meet no bank
// twice), and the tile's key and value scales [kBlockN] float32 each (per-token scales); the
// warps convert the codes in their registers (qk_codes, pv_codes). After the key loop the
// stages hold the warps' softmax states for the merge.
template <int kD, int kWarpsM, int kStagesT, bool kCodesT = false> struct Smem {
    static constexpr int kStages = kStagesT;
    static constexpr int kRows = 16 * kWarpsM;
    static constexpr int kChunks = kD / kChunkElems;
    static constexpr int kRowBytes = kD * 2;
    static constexpr int kQBytes = kRows * kRowBytes;
    static constexpr int kTileBytes = kBlockN * kRowBytes;
    static constexpr int kCodeTileBytes = kBlockN * kD;
    static constexpr int kScaleBytes = kBlockN * 4;
    static constexpr int kStageBytes =
        kCodesT ? 2 * (kCodeTileBytes + kScaleBytes) : 2 * kTileBytes;
    // A paged cache's page ids of the split, staged once (PageWindow).
    static constexpr int kPageBytes = kStagedPages * 4;
    static constexpr int kBytes = kQBytes + kStages * kStageBytes + kPageBytes;
    // The merge: every warp's acc [16][D], m [16] and l [16], float32.
    static constexpr int kMergeBytes = kWarps * 16 * (kD + 2) * 4;
    static_assert(kMergeBytes <= kStages * kStageBytes, "the merge reuses the K/V stages");
    static_assert(kChunks % 8 == 0, "the XOR swizzle permutes chunks in groups of 8");
    static_assert(kBlockN * kChunks % kThreads == 0, "every thread copies as many K/V chunks");

    __device__ static uint32_t offset(int row, int chunk) {
        return row * kRowBytes + ((chunk ^ (row % 8)) << 4);
    }
    __device__ static uint32_t stage(uint32_t base, int s) {
        return base + kQBytes + s * kStageBytes;
    }
    static constexpr int kPageOffset = kQBytes + kStages * kStageBytes;
    // A stage of dtype values: K, V.
    __device__ static uint32_t k_tile(uint32_t base, int s) { return stage(base, s); }
    __device__ static uint32_t v_tile(uint32_t base, int s) { return stage(base, s) + kTileBytes; }
    // A stage of codes: K codes, V codes (both swizzled: code_offset), K scales, V scales.
    __device__ static uint32_t code_offset(int row, int chunk) {
        return row * kD + ((chunk ^ (row / (128 / kD) % (kD / 16))) << 4);
    }
    __device__ static uint32_t k_codes(uint32_t base, int s) { return stage(base, s); }
    __device__ static uint32_t v_codes(uint32_t base, int s) {
        return stage(base, s) + kCodeTileBytes;
    }
    __device__ static uint32_t k_scales(uint32_t base, int s) {
        return stage(base, s) + 2 * kCodeTileBytes;
    }
    __device__ static uint32_t v_scales(uint32_t base, int s) {
        return k_scales(base, s) + kScaleBytes;
    }
};

// A paged cache's page id of block `block` of sequence b, clamped into [0, num_pages): a page
// id outside it (a broken caller promise) gives unspecified values, but no read leaves the pages.
__device__ __forceinline__ int page_id(const DecodeArgs& a, int b, int block) {
    const int page = __ldg(a.block_table + int64_t(b) * a.max_blocks + block);
    return min(max(page, 0), a.num_pages - 1);
}

// The page ids of a split's blocks, read from the block table once into shared memory by the
// CTA's threads together (up to kStagedPages of them): a tile's copies then wait for a shared
// load rather than for a block-table load each (a 64-key tile has 4 pages of 16 keys, and the
// prologue's tiles waited for theirs one tile after the other). A split of more pages than that
// reads the table for every tile, as a cache without the window would.
struct PageWindow {
    const int* ids;  // the staged ids (generic pointer); nullptr: a contiguous cache
    int first;       // the split's first block
    bool staged;     // every block of the split is staged

    // Stages the ids of the blocks holding key positions lo .. hi - 1 (all threads call it; a
    // paged cache's window is ready after the caller's next __syncthreads).
    __device__ PageWindow(const DecodeArgs& a, int b, int lo, int hi, int* slots)
        : ids(a.block_table ? slots : nullptr), first(0), staged(false) {
        if (!ids || hi <= lo) return;
        first = lo >> a.page_shift;
        const int count = ((hi - 1) >> a.page_shift) - first + 1;
        staged = count <= kStagedPages;
        for (int i = threadIdx.x; i < min(count, kStagedPages); i += blockDim.x)
            slots[i] = page_id(a, b, first + i);
    }
};

// The cache row (position row of Hkv heads, times Hkv, plus the head) of key position `pos` on
// page `page` (paged) or of sequence b (contiguous). Paged: page (Hkv << page_shift) + (pos %
// page_size) Hkv + h, where the page's stride and the row within it fit 32 bits (page_size <=
// 2^16 and Hkv < 2^16 keep both below 2^32), so one wide multiply-add makes the row. It runs for
// every row of every tile, where a contiguous row only advances by a constant: the 64-bit
// shift, add and multiply it replaces were most of a paged cache's extra instructions in the
// codes' issue-bound loop (benchmarks/NOTES.md).
static_assert(kDecodeMaxPageSize <= (int64_t(1) << 16) && kDecodeMaxHeads < (int64_t(1) << 16),
              "a page's rows and a row within a page fit 32 bits");
__device__ __forceinline__ int64_t paged_row(const DecodeArgs& a, int h, int page, int pos) {
    const uint32_t heads = uint32_t(a.num_heads_kv);
    const uint32_t page_rows = heads << a.page_shift;
    const uint32_t in_page = uint32_t(pos & ((1 << a.page_shift) - 1)) * heads + uint32_t(h);
    return int64_t(uint64_t(uint32_t(page)) * page_rows + in_page);
}
__device__ __forceinline__ int64_t contiguous_row(const DecodeArgs& a, int b, int h, int pos) {
    return (int64_t(b) * a.max_seqlen_k + pos) * a.num_heads_kv + h;
}

// Copies the K and V rows of key positions n0 .. n0 + kBlockN - 1 into a stage; positions at or
// past `end` are zero-filled and read nothing (neither the cache nor the block table): a masked
// key's p is 0, and 0 * V must stay 0 whatever the cache holds there (NaN too). A cache of
// codes copies the codes and, with per-token scales, the rows' scales (thread i < kBlockN the
// key scale of key i, the next kBlockN threads the value scales). row(pos): the cache row of
// position pos (< end).
template <typename T, class C, class S, class Row>
__device__ __forceinline__ void copy_kv(const DecodeArgs& a, uint32_t base, int stage, int n0,
                                        int end, Row&& row) {
    constexpr int kD = S::kChunks * kChunkElems;
    constexpr int kElemBytes = kCodes<T, C> ? 1 : 2;
    constexpr int kRowChunks = kD * kElemBytes / 16;  // 16-byte chunks of a cache row
    const char* k = static_cast<const char*>(a.k);
    const char* v = static_cast<const char*>(a.v);
#pragma unroll
    for (int it = 0; it < kBlockN * kRowChunks / kThreads; ++it) {
        const int i = it * kThreads + threadIdx.x;
        const int r = i / kRowChunks, c = i % kRowChunks;
        const int pos = n0 + r;
        const bool ok = pos < end;
        const int64_t at = ok ? row(pos) * (kD * kElemBytes) + c * 16 : 0;
        if constexpr (kCodes<T, C>) {
            cp_async_16_zfill(S::k_codes(base, stage) + S::code_offset(r, c), k + at, ok);
            cp_async_16_zfill(S::v_codes(base, stage) + S::code_offset(r, c), v + at, ok);
        } else {
            cp_async_16_zfill(S::k_tile(base, stage) + S::offset(r, c), k + at, ok);
            cp_async_16_zfill(S::v_tile(base, stage) + S::offset(r, c), v + at, ok);
        }
    }
    if constexpr (kCodes<T, C>) {
        static_assert(kThreads == 2 * kBlockN, "a thread per key scale and per value scale");
        if (a.per_token) {
            const int r = threadIdx.x % kBlockN;
            const bool is_v = threadIdx.x >= kBlockN;
            const int pos = n0 + r;
            const bool ok = pos < end;
            const float* scales = (is_v ? a.v_scale : a.k_scale) + (ok ? row(pos) : 0);
            cp_async_ca_zfill<4>((is_v ? S::v_scales(base, stage) : S::k_scales(base, stage)) +
                                     r * 4, scales, ok);
        }
    }
}

// copy_kv for sequence b, kv head h, with the cache's row function (one uniform branch).
template <typename T, class C, class S>
__device__ __forceinline__ void load_kv(const DecodeArgs& a, const PageWindow& pages,
                                        uint32_t base, int stage, int b, int h, int n0, int end) {
    if (!pages.ids) {
        copy_kv<T, C, S>(a, base, stage, n0, end,
                         [&](int pos) { return contiguous_row(a, b, h, pos); });
    } else if (pages.staged) {
        copy_kv<T, C, S>(a, base, stage, n0, end, [&](int pos) {
            return paged_row(a, h, pages.ids[(pos >> a.page_shift) - pages.first], pos);
        });
    } else {
        copy_kv<T, C, S>(a, base, stage, n0, end, [&](int pos) {
            return paged_row(a, h, page_id(a, b, pos >> a.page_shift), pos);
        });
    }
}

// Four codes (the first in bits 0-7) -> their values as the dtype, exact (every E4M3 value and
// every int8 code is an fp16 and a bf16 value), in two packed pairs: lo the first two.
//   E4M3 -> fp16: cvt.rn.f16x2.e4m3x2 (sm_89+; cuda_fp8.h computes the same bits before).
//   E4M3 -> bf16: the code's bits S.EEEE.MMM placed as a bf16's S.0000EEEE.MMM0000 (the same
//     value times 2^-120, subnormals included), then times 2^120 (exact). A NaN code (0x7F,
//     0xFF: written only for NaN inputs) becomes +-480 here.
//   int8 -> fp16: 1024 + (code + 128) is the fp16 with the byte as its low mantissa bits (PRMT
//     with 0x64), minus 1152.
//   int8 -> bf16: the same through float32 (2^23 + (code + 128), minus 2^23 + 128), then packed.
template <typename T, class C>
__device__ __forceinline__ void code_quad(uint32_t w, uint32_t& lo, uint32_t& hi) {
    if constexpr (std::is_same<C, E4M3>::value && std::is_same<T, __half>::value) {
        const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w), __NV_E4M3);
        const __half2_raw b =
            __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
        lo = uint32_t(a.x) | uint32_t(a.y) << 16;
        hi = uint32_t(b.x) | uint32_t(b.y) << 16;
    } else if constexpr (std::is_same<C, E4M3>::value) {
        const __nv_bfloat162 two_120 = __halves2bfloat162(__ushort_as_bfloat16(0x7B80),
                                                          __ushort_as_bfloat16(0x7B80));
        uint32_t pair[2] = {__byte_perm(w, 0, 0x1404), __byte_perm(w, 0, 0x3424)};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t bits = (pair[i] & 0x80008000u) | (pair[i] >> 4 & 0x07F007F0u);
            const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
                                             two_120);
            pair[i] = *reinterpret_cast<const uint32_t*>(&v);
        }
        lo = pair[0], hi = pair[1];
    } else if constexpr (std::is_same<T, __half>::value) {
        const uint32_t biased = w ^ 0x80808080u;
        const __half2 bias = __float2half2_rn(1152.f);
        const uint32_t a = __byte_perm(biased, 0x64646464u, 0x5150);
        const uint32_t b = __byte_perm(biased, 0x64646464u, 0x5352);
        const __half2 x = __hsub2(*reinterpret_cast<const __half2*>(&a), bias);
        const __half2 y = __hsub2(*reinterpret_cast<const __half2*>(&b), bias);
        lo = *reinterpret_cast<const uint32_t*>(&x);
        hi = *reinterpret_cast<const uint32_t*>(&y);
    } else {
        const uint32_t biased = w ^ 0x80808080u;
        float f[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            f[i] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440 + i)) - 8388736.f;
        lo = pack2<T>(f[0], f[1]);
        hi = pack2<T>(f[2], f[3]);
    }
}

// acc += P V on value codes, converted in the registers. ldmatrix.trans moves 16-bit elements:
// on the codes read as [keys][D / 2] pairs, thread (g, t) of an 8 x 8 block gets the pairs
// (d 2g, 2g + 1) of keys 2t and 2t + 1 (bytes: key 2t's d 2g, 2g + 1, then key 2t + 1's); the
// bytes of even d and those of odd d, regrouped (PRMT), are the B fragments of two n8 tiles,
// of the columns d = 2n and d = 2n + 1. So for the 32 d of block dq (16-byte chunks 2 dq and
// 2 dq + 1 of the rows) the four n8 tiles 4 dq .. 4 dq + 3 of acc hold the columns
// d = 32 dq + 16 h + 2 n + e (tile 4 dq + 2 h + e, column n): store_row_codes writes them back
// in order.
template <typename T, class C, class S, int kNT, int kDT>
__device__ __forceinline__ void pv_codes(float (&acc)[kDT][4], const float (&s)[kNT][4],
                                         uint32_t codes, int key0, int lane) {
    static_assert(kNT % 2 == 0 && kDT % 4 == 0, "16 keys and 32 d a step");
#pragma unroll
    for (int kk = 0; kk < kNT / 2; ++kk) {
        uint32_t a[4];
        p_fragment<T>(a, s, kk);
#pragma unroll
        for (int dq = 0; dq < kDT / 4; ++dq) {
            uint32_t r[4], even[4], odd[4];
            ldmatrix_x4_trans(r, codes + S::code_offset(key0 + kk * 16 + ((lane / 8) % 2) * 8 +
                                                            lane % 8,
                                                        2 * dq + lane / 16));
#pragma unroll
            for (int q = 0; q < 4; ++q)
                code_quad<T, C>(__byte_perm(r[q], 0, 0x3120), even[q], odd[q]);
            mma_16x8x16<T>(acc[4 * dq], a[0], a[1], a[2], a[3], even[0], even[1]);
            mma_16x8x16<T>(acc[4 * dq + 1], a[0], a[1], a[2], a[3], odd[0], odd[1]);
            mma_16x8x16<T>(acc[4 * dq + 2], a[0], a[1], a[2], a[3], even[2], even[3]);
            mma_16x8x16<T>(acc[4 * dq + 3], a[0], a[1], a[2], a[3], odd[2], odd[3]);
        }
    }
}

// store_row for pv_codes's columns: row r of the thread, O = acc / sum (0 where the row saw no
// key), d = 32 dq + 16 h + 4 t + 0 .. 3 from tiles 4 dq + 2 h (even d) and 4 dq + 2 h + 1 (odd).
template <typename Out, int kDT>
__device__ __forceinline__ void store_row_codes(Out* o, const float (&acc)[kDT][4], int r,
                                                float sum, int t) {
    const auto div = [&](float x) { return sum > 0.f ? x / sum : 0.f; };
#pragma unroll
    for (int i = 0; i < kDT; i += 2) {  // i = 4 dq + 2 h: its even tile, then the odd one
        Out* at = o + 8 * i + 4 * t;  // 32 dq + 16 h = 8 i
        store2(at, div(acc[i][2 * r]), div(acc[i + 1][2 * r]));
        store2(at + 2, div(acc[i][2 * r + 1]), div(acc[i + 1][2 * r + 1]));
    }
}

// Q K^T on key codes, converted in the registers. Q . K sums over D in any order, so D is
// permuted alike in both operands: in k16 step ks, thread t's slots 2t, 2t + 1, 2t + 8, 2t + 9
// hold d = t D / 4 + 4 ks + 0 .. 3, four consecutive codes of a key row (one 32-bit word of
// the D / 4 bytes the thread loads), and its Q fragments the same d (load_q_permuted).
// The warp's Q rows row0 .. row0 + 15 as mma A fragments in that order.
template <class S, int kKS>
__device__ __forceinline__ void load_q_permuted(uint32_t (&qf)[kKS][4], const uint4* smem,
                                                uint32_t base, int row0, int lane) {
    const char* at = reinterpret_cast<const char*>(smem) - base;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
        const int d0 = t * (kKS * 4) + 4 * ks;  // D / 4 = 4 kKS values per thread
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g and g + 8
            const uint2 v = *reinterpret_cast<const uint2*>(
                at + base + S::offset(row0 + g + 8 * h, d0 / kChunkElems) + (d0 % kChunkElems) * 2);
            qf[ks][h] = v.x;      // d0, d0 + 1: slots 2t, 2t + 1
            qf[ks][2 + h] = v.y;  // d0 + 2, d0 + 3: slots 2t + 8, 2t + 9
        }
    }
}

// S = Q K^T over the keys key0 .. key0 + 8 kNT - 1 of the stage's key codes (generic pointer
// `codes`): key row key0 + 8 i + g is the B fragment's column g of n8 tile i.
template <typename T, class C, class S, int kKS, int kNT>
__device__ __forceinline__ void qk_codes(float (&s)[kNT][4], const uint32_t (&qf)[kKS][4],
                                         const char* codes, int key0, int lane) {
    constexpr int kD = kKS * 16;
    constexpr int kLoads = kD / 4 / 16;  // 16-byte loads of the thread's D / 4 codes of a row
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
        s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
        const int row = key0 + 8 * i + g;
        uint4 w[kLoads];
#pragma unroll
        for (int l = 0; l < kLoads; ++l)
            w[l] = *reinterpret_cast<const uint4*>(codes + S::code_offset(row, t * kLoads + l));
#pragma unroll
        for (int ks = 0; ks < kKS; ++ks) {
            uint32_t b0, b1;
            code_quad<T, C>(word(w[ks / 4], ks % 4), b0, b1);
            mma_16x8x16<T>(s[i], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b0, b1);
        }
    }
}

// S (or P) of the thread's keys times the keys' scales: column 8 i + 2 t (+ 1) of the warp's
// slice (at key0 of the tile) from the stage's scales [kBlockN].
template <int kNT>
__device__ __forceinline__ void scale_columns(float (&s)[kNT][4], const float* scales, int key0,
                                              int t) {
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
        const float2 f = *reinterpret_cast<const float2*>(scales + key0 + i * 8 + 2 * t);
        s[i][0] *= f.x, s[i][1] *= f.y, s[i][2] *= f.x, s[i][3] *= f.y;
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
template <typename T, class C, int kD, int kWarpsM, int kStagesT>
__global__ void __launch_bounds__(kThreads, 1) decode_split_kernel(const DecodeArgs a) {
    if constexpr (!kHasSm80) __trap();
    using S = Smem<kD, kWarpsM, kStagesT, kCodes<T, C>>;
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
    const PageWindow pages(a, b, lo, hi,
                           reinterpret_cast<int*>(reinterpret_cast<char*>(smem) + S::kPageOffset));
    // The first kStages - 1 tiles. A paged cache's loop is not unrolled: one copy of load_kv's
    // two paged row functions (unrolled with the contiguous one, their code cost a short call
    // 1.5 us: B = 1 at 4096 keys).
    auto prologue_tile = [&](int s) {
        if (s < tiles) load_kv<T, C, S>(a, pages, base, s, b, hkv, lo + s * kBlockN, hi);
        cp_async_commit();
    };
    if (!pages.ids) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) prologue_tile(s);
    } else {
        __syncthreads();  // the staged page ids
#pragma unroll 1
        for (int s = 0; s < kStages - 1; ++s) prologue_tile(s);
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / kWarpsN, wn = warp % kWarpsN;
    // Per-head scales: the key's joins the softmax scale, the value's multiplies every p.
    float scale_log2 = a.scale * kLog2e, v_head_scale = 1.f;
    if (kCodes<T, C> && !a.per_token) {
        scale_log2 *= __ldg(a.k_scale + hkv);
        v_head_scale = __ldg(a.v_scale + hkv);
    }

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
        if (j + kStages - 1 < tiles)
            load_kv<T, C, S>(a, pages, base, (j + kStages - 1) % kStages, b, hkv,
                             lo + (j + kStages - 1) * kBlockN, hi);
        cp_async_commit();
        if (j == 0) {
            if constexpr (kCodes<T, C>)
                load_q_permuted<S>(qf, smem, base, wm * 16, lane);
            else
                load_q_fragments<S>(qf, base, wm * 16, lane);
        }
        const int stage = j % kStages;
        const int key0 = wn * kSlice;  // the warp's slice of the tile
        const char* generic = reinterpret_cast<const char*>(smem) - base;  // (codes' loads)
        const float* k_scales = reinterpret_cast<const float*>(generic + S::k_scales(base, stage));
        const float* v_scales = reinterpret_cast<const float*>(generic + S::v_scales(base, stage));

        // Over the slice: S = Q K^T (times the keys' scales); x in base 2, masked beyond the
        // split and the row's causal position; P (times the values' scales); acc += P V.
        float s[kNT][4];
        if constexpr (kCodes<T, C>) {
            qk_codes<T, C, S>(s, qf, generic + S::k_codes(base, stage), key0, lane);
            if (a.per_token) scale_columns(s, k_scales, key0, t);
        } else {
            qk_tile<T, S>(s, qf, S::k_tile(base, stage), key0, lane);
        }
        const int n0 = lo + j * kBlockN + key0;
        float tile_max[2];
        mask_tile(s, tile_max, scale_log2, [&](int i, int e) {
            const int key = n0 + i * 8 + 2 * t + (e & 1);
            return key < hi && key <= last_key[e / 2];
        });
        online_softmax(s, tile_max, m, l, acc);
        if constexpr (kCodes<T, C>) {
            if (a.per_token) {
                scale_columns(s, v_scales, key0, t);
            } else {
#pragma unroll
                for (int i = 0; i < kNT; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[i][e] *= v_head_scale;
            }
            pv_codes<T, C, S>(acc, s, S::v_codes(base, stage), key0, lane);
        } else {
            pv_tile<T, S>(acc, s, S::v_tile(base, stage), key0, lane);
        }
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
        const auto store = [&](auto* o) {
            if constexpr (kCodes<T, C>)
                store_row_codes(o, acc, r, sum, t);
            else
                store_row(o + 2 * t, acc, r, sum);
        };
        if (a.splits == 1) {
            store(static_cast<T*>(a.out) + q_row * kD);
            if (a.lse && t == 0) a.lse[q_row] = lse;
        } else {
            const int64_t p_row = int64_t(split) * a.batch * a.seqlen_q * a.num_heads_q + q_row;
            store(a.partial_o + p_row * kD);
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

template <typename T, class C, int kD, int kWarpsM, int kStagesT>
cudaError_t launch_split_stages(const DecodeArgs& a, dim3 grid, cudaStream_t stream) {
    const auto kernel = decode_split_kernel<T, C, kD, kWarpsM, kStagesT>;
    constexpr int kSmemBytes = Smem<kD, kWarpsM, kStagesT, kCodes<T, C>>::kBytes;
    static std::atomic<uint64_t> smem_done{0};
    const cudaError_t e = allow_dynamic_smem_once(kernel, kSmemBytes, smem_done);
    if (e != cudaSuccess) return e;
    return launch_dependent(kernel, grid, dim3(kThreads), kSmemBytes, stream, a);
}

// The deeper pipeline where the grid has at most one CTA per SM and the GPU gives a block its
// shared memory (up to 176 KB: not before the H100). The depth does not change what a warp
// computes, nor in which order: the same bits.
template <typename T, class C, int kD, int kWarpsM>
cudaError_t launch_split(const DecodeArgs& a, int64_t row_groups, cudaStream_t stream) {
    const dim3 grid(unsigned(a.splits * row_groups), unsigned(a.num_heads_kv), unsigned(a.batch));
    const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
    const bool deep = ctas <= sm_count() &&
                      Smem<kD, kWarpsM, kDeepStages, kCodes<T, C>>::kBytes <= max_smem_optin();
    return deep ? launch_split_stages<T, C, kD, kWarpsM, kDeepStages>(a, grid, stream)
                : launch_split_stages<T, C, kD, kWarpsM, kStages>(a, grid, stream);
}

template <typename T, class C, int kD>
cudaError_t launch(const DecodeArgs& a, cudaStream_t stream) {
    const int64_t rows = int64_t(a.num_heads_q / a.num_heads_kv) * a.seqlen_q;
    const int64_t row_groups = decode_row_groups(rows);
    cudaError_t e;
    switch (decode_warps_m(rows)) {
        case 1: e = launch_split<T, C, kD, 1>(a, row_groups, stream); break;
        case 2: e = launch_split<T, C, kD, 2>(a, row_groups, stream); break;
        default: e = launch_split<T, C, kD, 4>(a, row_groups, stream); break;
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
        const auto with_cache = [&](auto code) {
            using C = decltype(code);
            return a.head_dim == 64 ? launch<T, C, 64>(a, stream) : launch<T, C, 128>(a, stream);
        };
        switch (a.kv_format) {
            case CK_KV_FP8_E4M3: return with_cache(E4M3{});
            case CK_KV_INT8: return with_cache(int8_t{});
            default: return with_cache(T{});
        }
    });
}

}  // namespace ck
