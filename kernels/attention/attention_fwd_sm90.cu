// attention_fwd_sm90.cu - prefill attention (ck_attention_forward) on Hopper: the "wgmma"
// variant, FlashAttention-3's structure (TMA loads, wgmma, a producer warpgroup and two consumer
// warpgroups). It computes what attention_fwd.cu computes (O = softmax(scale q k^T, masked) v
// per query head, and lse), with the same online softmax steps (attention_tile.cuh), on tiles
// twice as large.
//
// Layout: attention.cuh's (q, out [total_q, Hq, D]; k, v [total_k, Hkv, D]; lse [total_q, Hq]).
// Each of q, k and v is read through a 2-D tensor map over [tokens, heads * D], one box being
// 128 tokens x 64 values of one head (a 128-byte row per token, the 128-byte swizzle).
//
// Algorithm. Work items of (128 query rows, query head, sequence); one persistent CTA per SM
// takes one item per round, in a snake order (snake_item; WorkItem numbers them), 384 threads:
//   - warpgroup 2, the producer, hands most of its registers to the consumers (setmaxnreg); its
//     warp 8's lane 0 loads an item's Q tile (once the previous item's last S = Q K^T is done),
//     then each K and V tile of 128 keys into a kStages-deep ring that runs on across items, K
//     and V with barriers of their own (the consumers multiply by K while V still lands), every
//     buffer and stage guarded by a "full" and an "empty" mbarrier. The next item's loads thus
//     overlap the current one's last tiles and stores. (A second Q buffer, loading the next
//     item's Q earlier, measured no faster on the benchmark shapes.)
//   - warpgroups 0 and 1, the consumers, own query rows 64 c .. 64 c + 63 of the tile. Per key
//     tile: S = Q K^T (D / 16 wgmma m64n128k16, both operands K-major in shared memory, 64
//     float32 per thread), the mask where the tile crosses the causal diagonal or the sequence's
//     end, the online softmax (attention_tile.cuh: the S accumulators are mma.sync C fragments,
//     n8 tile i in registers 4 i .. 4 i + 3), P rounded to the dtype in registers as the A
//     operand of O += P V (8 wgmma m64nDk16 over the tile's 128 keys, V read N-major: its rows
//     [key][d] are the transposed B). At the end O = acc / l, through an O tile in shared
//     memory to whole 16-byte chunks of global memory, and lse.
//   - TMA zero-fills rows past the tensors' ends. Key rows past a packed sequence's end but
//     inside k belong to the next sequence: S masks them to -inf (whatever K holds there), and
//     the last tile's V rows there are zeroed in shared memory before P V reads them, so that a
//     non-finite value of another sequence never reaches this one (0 x inf would be NaN).
//   - Within a consumer warpgroup, S of tile j and P V of tile j - 1 are in flight together: the
//     softmax of tile j overlaps the tensor cores' P V (FlashAttention-3's intra-warpgroup
//     pipelining); the other consumer warpgroup's wgmmas fill the gaps that remain.
//   - Items run heaviest first when causal (the last query blocks see the most keys), across
//     every head and sequence: the query block varies slowest. Without the mask it varies
//     fastest: the items at work together share their K and V in the L2.
//
// Floors: 4 D Hq (allowed query-key pairs) flops at the dense fp16/bf16 peak (~989 TFLOP/s on
// the H100 SXM): 1 x 32 heads x 2048^2 / 2 pairs x 128 x 4 = 34.4 GFLOP causal -> 35 us.
//
// The Hopper primitives are in kernels/core/ptx_sm90.cuh and tma.cuh. Kernel bodies exist in the
// sm_90a pass only (CK_SM90A_DEVICE); the host never launches the empty ones of other targets
// (attention_wgmma_serves()).
#include <atomic>

#include "kernels/attention/attention.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/core/ptx_sm90.cuh"
#include "kernels/core/tma.cuh"

namespace ck {
namespace {

using namespace attention;

constexpr int kConsumers = 2;  // consumer warpgroups
constexpr int kWarpgroupThreads = 128;
[[maybe_unused]] constexpr int kProducerWarp = 4 * kConsumers;  // the warpgroup after them
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;  // 384
// ptxas sizes the register file in whole warpgroups (168 per thread for 3); the producer gives
// its share to the consumers, which hold S, O and P (64 + 64 + 32 registers at D = 128).
[[maybe_unused]] constexpr int kProducerRegisters = 24;
[[maybe_unused]] constexpr int kConsumerRegisters = 240;  // (168 * 384 - 24 * 128) / 256
constexpr int kWgmmaM = 64;
constexpr int kBlockM = kConsumers * kWgmmaM;  // 128 query rows per CTA
constexpr int kBlockN = 128;                   // keys per tile (S is m64n128 per warpgroup)
constexpr int kSwizzleBytes = 128;             // TMA / wgmma 128-byte swizzle rows
constexpr int kBoxValues = kSwizzleBytes / 2;  // 64 16-bit values per swizzle row
constexpr int kBoxBytes = kBlockN * kSwizzleBytes;  // a box: 128 tokens x 64 values, 16 KB
[[maybe_unused]] constexpr int kConsumerWarps = 4 * kConsumers;  // empty-barrier arrivals
[[maybe_unused]] constexpr int kZeroBarrier = 1;  // named barrier of the consumers' V zeroing
[[maybe_unused]] constexpr int kTurnBarrier = 2;  // + c: consumer warpgroup c's turn to issue
[[maybe_unused]] constexpr int kStoreBarrier = 4;  // + c: warpgroup c's O tile in shared memory
static_assert(kBlockM == kBlockN, "Q and K/V tiles share the box shape (128 tokens)");
static_assert(kProducerRegisters * kWarpgroupThreads +
                      kConsumerRegisters * kConsumers * kWarpgroupThreads <=
                  168 * kThreads,
              "setmaxnreg moves registers, never adds");

// Shared memory: the Q tile, then kStages K tiles and kStages V tiles, each D / 64 boxes of
// [128 tokens][128 bytes] written by TMA with the 128-byte swizzle (1024-byte aligned), the O
// tile of the epilogue ([128 rows][D], its own layout: see the epilogue), then the barriers.
// For S = Q K^T both tiles are K-major (a token's D values along its rows): wgmma k16 step s
// reads values 16 s .. 16 s + 15, box s / 4 at byte 32 (s % 4) of every row; warpgroup c's 64
// Q rows start 64 c rows into each box. For O += P V the V tile is the N-major B operand:
// k16 step kk reads tokens 16 kk .. 16 kk + 15 (rows, 2048 bytes further per step), 8-row groups
// 1024 bytes apart, the two boxes of D = 128 one box apart (the descriptor's leading offset).
template <int kD> struct Sm90Smem {
    static constexpr int kBoxes = kD / kBoxValues;
    static constexpr int kTileBytes = kBoxes * kBoxBytes;  // Q, or one K or V tile
    static constexpr int kStages = kD == 64 ? 4 : 2;
    static constexpr int kBarriers = 2 + 4 * kStages;  // q full/empty, k/v full, k/v empty
    // Q, the K and V stages, and the O tile of the epilogue (128 rows x D, as Q).
    static constexpr int kBytes = 1024 + (2 + 2 * kStages) * kTileBytes + 8 * kBarriers;
    static_assert(kD % kBoxValues == 0, "D = 64 or 128: whole boxes");
    static_assert(kBytes <= 227 * 1024, "one CTA per SM");
};

// One work item: 128 query rows of one query head of one sequence. Items are numbered with the
// query block slowest when causal, the last query blocks (the most keys) first, across every
// head and sequence; otherwise with the query block fastest, so that the CTAs at work together
// share their K and V in the L2.
struct WorkItem {
    int b, h, hkv;
    int64_t q0;      // the first query row, within the sequence
    Span sq, sk;
    int64_t rows;    // query rows of the item (1 .. 128; 0: past the sequence, nothing to do)
    int64_t diagonal;  // Sk - Sq: query i sees key j iff j <= i + diagonal (causal)
    int64_t key_end;   // the keys any of its rows sees: 0 .. key_end - 1
    int tiles;         // key tiles
};

template <bool kCausal>
__device__ __forceinline__ WorkItem work_item(const AttentionArgs& a, int64_t index,
                                              int64_t q_blocks) {
    WorkItem w;
    int64_t q_block;
    if constexpr (kCausal) {
        w.h = int(index % a.num_heads_q);
        const int64_t rest = index / a.num_heads_q;
        w.b = int(rest % a.batch);
        q_block = q_blocks - 1 - rest / a.batch;
    } else {
        q_block = index % q_blocks;
        const int64_t rest = index / q_blocks;
        w.h = int(rest % a.num_heads_q);
        w.b = int(rest / a.num_heads_q);
    }
    w.hkv = w.h / (a.num_heads_q / a.num_heads_kv);
    w.q0 = q_block * kBlockM;
    w.sq = sequence_span(a.cu_seqlens_q, w.b, a.total_q);
    w.sk = sequence_span(a.cu_seqlens_k, w.b, a.total_k);
    w.rows = max(int64_t(0), min(int64_t(kBlockM), w.sq.len - w.q0));
    w.diagonal = w.sk.len - w.sq.len;
    w.key_end = kCausal ? min(w.sk.len, max(int64_t(0), w.q0 + w.rows + w.diagonal)) : w.sk.len;
    w.tiles = w.rows > 0 ? int(ceil_div(w.key_end, kBlockN)) : 0;
    return w;
}

// The item a CTA takes in its round r: r G + i in even rounds, r G + G - 1 - i in odd ones (G =
// gridDim.x CTAs, i = blockIdx.x). Causal items come heaviest first, so that the snake pairs a
// CTA's heavier items with lighter ones: on the benchmark shapes the busiest CTA gets within 1%
// of the mean number of key tiles (round-robin: up to 21% above it).
[[maybe_unused]] __device__ __forceinline__ int64_t snake_item(int64_t round) {
    const int64_t i = (round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    return round * gridDim.x + i;
}

template <typename T, int kD, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1)
attention_fwd_wgmma_kernel(const __grid_constant__ CUtensorMap map_q,
                           const __grid_constant__ CUtensorMap map_k,
                           const __grid_constant__ CUtensorMap map_v, const AttentionArgs a,
                           const int64_t items) {
#ifdef CK_SM90A_DEVICE
    using L = Sm90Smem<kD>;
    constexpr int kStages = L::kStages;
    constexpr int kNT = kBlockN / 8;  // n8 tiles of S
    constexpr int kDT = kD / 8;       // n8 tiles of O
    constexpr int kKS = kD / 16;      // k16 steps of Q K^T
    constexpr int kPS = kBlockN / 16;  // k16 steps of P V
    const int64_t q_blocks = ceil_div(a.max_seqlen_q, int64_t(kBlockM));

    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    uint8_t* q_tile = smem;
    uint8_t* k_tiles = q_tile + L::kTileBytes;
    uint8_t* v_tiles = k_tiles + kStages * L::kTileBytes;
    uint8_t* o_tile = v_tiles + kStages * L::kTileBytes;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(o_tile + L::kTileBytes);
    uint64_t* q_empty = q_full + 1;
    uint64_t* k_full = q_empty + 1;
    uint64_t* v_full = k_full + kStages;
    uint64_t* k_empty = v_full + kStages;
    uint64_t* v_empty = k_empty + kStages;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        mbar_init(q_full, 1);
        mbar_init(q_empty, kConsumerWarps);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&k_full[s], 1);
            mbar_init(&v_full[s], 1);
            mbar_init(&k_empty[s], kConsumerWarps);
            mbar_init(&v_empty[s], kConsumerWarps);
        }
        fence_mbarrier_init();
        fence_proxy_async_shared();
    }
    __syncthreads();

    if (warp >= kProducerWarp) {
        // ---- Producer: warp 8's lane 0 issues every copy, item after item; K and V tiles go
        // round the ring of stages across items (slot: the tiles loaded so far) ----
        setmaxnreg_dec<kProducerRegisters>();
        if (warp != kProducerWarp || lane != 0) return;
        prefetch_tensor_map(&map_q);
        prefetch_tensor_map(&map_k);
        prefetch_tensor_map(&map_v);
        uint32_t q_loads = 0;
        int64_t slot = 0;
        for (int64_t round = 0; round * gridDim.x < items; ++round) {
            const int64_t index = snake_item(round);
            if (index >= items) continue;
            const WorkItem wi = work_item<kCausal>(a, index, q_blocks);
            if (wi.tiles == 0) continue;  // nothing to load: the consumers write O = 0 alone
            mbar_wait(q_empty, (q_loads++ & 1) ^ 1);  // the previous item's S are all done
            mbar_arrive_expect_tx(q_full, L::kTileBytes);
#pragma unroll
            for (int c = 0; c < L::kBoxes; ++c)
                tma_load_2d(q_tile + c * kBoxBytes, &map_q, q_full, wi.h * kD + c * kBoxValues,
                            int(wi.sq.start + wi.q0));
            for (int j = 0; j < wi.tiles; ++j, ++slot) {
                const int stage = int(slot % kStages);
                const uint32_t parity = uint32_t(slot / kStages & 1) ^ 1;  // first round: free
                const int y = int(wi.sk.start + int64_t(j) * kBlockN);
                // The K (then V) tile of keys y .. y + 127 into its stage, once that is free.
                auto load = [&](uint8_t* tiles, const CUtensorMap* map, uint64_t* full,
                                uint64_t* empty) {
                    mbar_wait(&empty[stage], parity);
                    mbar_arrive_expect_tx(&full[stage], L::kTileBytes);
#pragma unroll
                    for (int c = 0; c < L::kBoxes; ++c)
                        tma_load_2d(tiles + stage * L::kTileBytes + c * kBoxBytes, map,
                                    &full[stage], wi.hkv * kD + c * kBoxValues, y);
                };
                load(k_tiles, &map_k, k_full, k_empty);
                load(v_tiles, &map_v, v_full, v_empty);
            }
        }
        return;
    }

    // ---- Consumers: warpgroup c, warp w of it, lane (g, t) ----
    setmaxnreg_inc<kConsumerRegisters>();
    const int c = warp / 4, w = warp % 4;
    const int g = lane / 4, t = lane % 4;
    const float scale_log2 = a.scale * kLog2e;
    constexpr int kPairThreads = kConsumers * kWarpgroupThreads;
    static_assert(kConsumers == 2, "two warpgroups take turns");

    float o[kD / 2];  // O accumulators, n8 tile i in o[4 i .. 4 i + 3]
    auto& acc = reinterpret_cast<float(&)[kDT][4]>(o);
    float s_flat[kBlockN / 2];  // S of one tile, then its P = 2^(x - m) in float32
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s_flat[i] = 0.f;
    auto& s = reinterpret_cast<float(&)[kNT][4]>(s_flat);
    uint32_t p[kPS][4];  // P of the previous tile, rounded: the A operand of its P V
    uint32_t q_loads = 0;
    const uint64_t q_desc = wgmma_descriptor(q_tile + c * kWgmmaM * kSwizzleBytes);
    int64_t slot0 = 0;   // the ring slot of the item's first tile
    // The two consumer warpgroups take turns to issue their wgmmas (FlashAttention-3's
    // "ping-pong"): while one runs its softmax, the tensor cores serve the other. Turn k of
    // warpgroup 0 follows turn k - 1 of warpgroup 1 (warpgroup 1 gives it a free first turn),
    // turn k of warpgroup 1 follows turn k of warpgroup 0, across items (both take tiles + 1 turns
    // per item): a warpgroup that finishes an item starts the next one's wgmmas as soon as the
    // other has issued its last, not after its stores. Warpgroup 0 takes one turn more at the end,
    // which consumes warpgroup 1's last arrival.
    bool took_turns = false;
    auto begin_turn = [&] {
        if (!took_turns && c == 1) named_barrier_arrive<kPairThreads>(kTurnBarrier);
        took_turns = true;
        named_barrier_sync<kPairThreads>(kTurnBarrier + c);
    };
    auto end_turn = [&] { named_barrier_arrive<kPairThreads>(kTurnBarrier + (1 - c)); };

    for (int64_t round = 0; round * gridDim.x < items; ++round) {
        const int64_t index = snake_item(round);
        if (index >= items) continue;
        const WorkItem wi = work_item<kCausal>(a, index, q_blocks);
        if (wi.rows == 0) continue;  // past its sequence's queries (items cover the longest)
        const int tiles = wi.tiles;
        const int64_t wg_row0 = wi.q0 + c * kWgmmaM;  // the warpgroup's first query row
        const int64_t row0 = wg_row0 + w * 16 + g;    // the thread's rows: row0 and row0 + 8
        // The last tile's V rows past the sequence hold the next sequence's keys (see above).
        const bool foreign_tail = wi.sk.start + wi.sk.len < a.total_k && wi.key_end == wi.sk.len;

#pragma unroll
        for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
        float m[2] = {-INFINITY, -INFINITY};  // running row max of x (base-2 units)
        float l[2] = {0.f, 0.f};              // this thread's part of the row sum

        // Issues S = Q K^T of tile j (one commit group).
        auto issue_qk = [&](int j) {
            const int64_t slot = slot0 + j;
            const int stage = int(slot % kStages);
            mbar_wait(&k_full[stage], uint32_t(slot / kStages & 1));
            const uint64_t k_desc = wgmma_descriptor(k_tiles + stage * L::kTileBytes);
            wgmma_fence_operands(s_flat);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < kKS; ++ks) {
                const uint32_t at = (ks / 4) * kBoxBytes + (ks % 4) * 32;
                wgmma_m64n128k16_ss<T>(s_flat, wgmma_descriptor_advance(q_desc, at),
                                       wgmma_descriptor_advance(k_desc, at), ks > 0);
            }
            wgmma_commit();
        };
        // Issues O += P V of tile j (one commit group), P the previous softmax's.
        auto issue_pv = [&](int j) {
            const int64_t slot = slot0 + j;
            const int stage = int(slot % kStages);
            uint8_t* vt = v_tiles + stage * L::kTileBytes;
            mbar_wait(&v_full[stage], uint32_t(slot / kStages & 1));
            const uint64_t v_desc =
                wgmma_descriptor(vt, WgmmaSwizzle::k128B, 8 * kSwizzleBytes, kBoxBytes);
            wgmma_fence_operands(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kPS; ++kk)
                wgmma_m64nk16_rs<T, kD, true>(
                    o, p[kk], wgmma_descriptor_advance(v_desc, kk * 16 * kSwizzleBytes), 1);
            wgmma_commit();
        };
        // The last tile's V rows past the sequence's end, where they hold the next sequence's
        // keys: zeroed by both consumer warpgroups before either multiplies by them.
        auto zero_foreign_tail = [&] {
            const int j = tiles - 1;
            const int64_t n0 = int64_t(j) * kBlockN;
            if (!foreign_tail || n0 + kBlockN <= wi.sk.len) return;
            const int64_t slot = slot0 + j;
            const int stage = int(slot % kStages);
            uint8_t* vt = v_tiles + stage * L::kTileBytes;
            mbar_wait(&v_full[stage], uint32_t(slot / kStages & 1));
            const int valid = int(wi.sk.len - n0);  // rows valid .. 127 of every box
            const int chunks = (kBlockN - valid) * (kSwizzleBytes / 16);
            for (int i = threadIdx.x; i < L::kBoxes * chunks; i += kPairThreads) {
                const int box = i / chunks, r = i % chunks;
                *reinterpret_cast<uint4*>(vt + box * kBoxBytes + valid * kSwizzleBytes + r * 16) =
                    make_uint4(0, 0, 0, 0);
            }
            fence_proxy_async_shared();  // the zeros, visible to the wgmmas that read the tile
            named_barrier_sync<kPairThreads>(kZeroBarrier);
        };
        // One arrival per consumer warp on an empty barrier, once the wgmmas reading it retired.
        auto release = [&](uint64_t* bar) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bar);
        };
        auto release_stage = [&](uint64_t* empty, int j) {
            release(&empty[(slot0 + j) % kStages]);
        };
        // The mask (only on tiles that cross the causal diagonal or the sequence's end) and the
        // softmax step of tile j: s becomes P, m and l move on, alpha rescales O.
        auto softmax = [&](int j, float (&alpha)[2]) {
            const int64_t n0 = int64_t(j) * kBlockN;
            float tile_max[2];
            const bool edge = n0 + kBlockN > wi.sk.len ||
                              (kCausal && n0 + kBlockN - 1 > wg_row0 + wi.diagonal);
            if (edge) {
                // In 32 bits (tokens < 2^31): the key's offset in the tile against the tile's
                // key count and the thread's two last visible keys, relative to n0.
                const int len = int(min(wi.sk.len - n0, int64_t(kBlockN)));
                const int64_t last = row0 + wi.diagonal - n0;  // row0's last visible key
                const int last0 = int(max(min(last, int64_t(kBlockN)), int64_t(-1)));
                const int last1 = int(max(min(last + 8, int64_t(kBlockN)), int64_t(-1)));
                mask_tile(s, tile_max, scale_log2, [&](int i, int e) {
                    const int key = i * 8 + 2 * t + (e & 1);
                    return key < len && (!kCausal || key <= (e < 2 ? last0 : last1));
                });
            } else {
                mask_tile(s, tile_max, scale_log2, [](int, int) { return true; });
            }
            softmax_step(s, tile_max, m, l, alpha);
        };
        auto round_p = [&] {
#pragma unroll
            for (int kk = 0; kk < kPS; ++kk) p_fragment<T>(p[kk], s, kk);
        };

        // The pipeline within a warpgroup: S of tile j and P V of tile j - 1 are issued
        // together; the softmax of tile j waits for S alone, while P V still runs on the tensor
        // cores; O is rescaled (and P replaced) once P V has retired. Q is released (the
        // producer loads the next item's) once the item's last S is done.
        if (tiles > 0) {
            mbar_wait(q_full, q_loads++ & 1);
            float alpha[2];
            begin_turn();
            issue_qk(0);
            end_turn();
            wgmma_wait<0>();
            wgmma_fence_operands(s_flat);
            release_stage(k_empty, 0);
            if (tiles == 1) release(q_empty);
            softmax(0, alpha);  // O is 0: nothing to rescale
            round_p();
            for (int j = 1; j < tiles; ++j) {
                begin_turn();
                issue_qk(j);
                issue_pv(j - 1);
                end_turn();
                wgmma_wait<1>();  // S of tile j (the older group) is done
                wgmma_fence_operands(s_flat);
                release_stage(k_empty, j);
                if (j == tiles - 1) release(q_empty);
                softmax(j, alpha);
                wgmma_wait<0>();  // P V of tile j - 1 is done: O and P are free
                wgmma_fence_operands(o);
#pragma unroll
                for (int kk = 0; kk < kPS; ++kk) wgmma_fence_operands(p[kk]);
                release_stage(v_empty, j - 1);
                rescale_rows(acc, alpha);
                round_p();
            }
            zero_foreign_tail();
            begin_turn();
            issue_pv(tiles - 1);
            end_turn();
            wgmma_wait<0>();
            wgmma_fence_operands(o);
#pragma unroll
            for (int kk = 0; kk < kPS; ++kk) wgmma_fence_operands(p[kk]);
            release_stage(v_empty, tiles - 1);
            slot0 += tiles;
        }

        // O = acc x (1 / l); rows without keys (l = 0, m = -inf) write O = 0, lse = -inf. The
        // warpgroup's 64 rows go through its half of the O tile in shared memory (16-byte chunk
        // j of row r at chunk j ^ (r % 8): the fragments' 4-byte writes and the rows' 16-byte
        // reads are free of bank conflicts), then to global memory in whole 16-byte chunks, a
        // row's chunks from consecutive threads: a fragment stored straight from the registers
        // is 4 bytes per thread and row, half of each 32-byte sector a warp's store touches.
        constexpr int kChunks = kD / 8;  // 16-byte chunks of a row
        uint8_t* o_half = o_tile + c * kWgmmaM * (kD * 2);
        named_barrier_sync<kWarpgroupThreads>(kStoreBarrier + c);  // the last item's reads done
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = w * 16 + g + 8 * r;  // within the warpgroup's rows
            const float sum = quad_sum(l[r]);
            const float inv = sum > 0.f ? __frcp_rn(sum) : 0.f;
#pragma unroll
            for (int i = 0; i < kDT; ++i)
                *reinterpret_cast<uint32_t*>(o_half + row * (kD * 2) + ((i ^ (row % 8)) << 4) +
                                             4 * t) =
                    pack2<T>(acc[i][2 * r] * inv, acc[i][2 * r + 1] * inv);
            if (a.lse && t == 0 && c * kWgmmaM + row < wi.rows)
                a.lse[(wi.sq.start + wi.q0 + c * kWgmmaM + row) * a.num_heads_q + wi.h] =
                    row_lse(m[r], sum);
        }
        named_barrier_sync<kWarpgroupThreads>(kStoreBarrier + c);  // the tile is written
        const int64_t q_stride = int64_t(a.num_heads_q) * kD;
        T* out = static_cast<T*>(a.out) + (wi.sq.start + wi.q0 + c * kWgmmaM) * q_stride +
                 int64_t(wi.h) * kD;
        const int wg_rows = int(min(int64_t(kWgmmaM), wi.rows - c * kWgmmaM));
        const int tid = threadIdx.x % kWarpgroupThreads;
#pragma unroll
        for (int it = 0; it < kWgmmaM * kChunks / kWarpgroupThreads; ++it) {
            const int i = it * kWarpgroupThreads + tid;
            const int row = i / kChunks, j = i % kChunks;
            if (row < wg_rows)
                *reinterpret_cast<uint4*>(out + row * q_stride + j * 8) =
                    *reinterpret_cast<const uint4*>(o_half + row * (kD * 2) +
                                                    ((j ^ (row % 8)) << 4));
        }
    }
    if (took_turns && c == 0) begin_turn();  // the last arrival of warpgroup 1
#endif  // CK_SM90A_DEVICE
}

// The tensor map of q, k or v: [tokens][heads * D] 16-bit values, boxes of 128 tokens x 64
// values.
cudaError_t make_head_map(CUtensorMap* map, const void* base, int64_t tokens, int heads, int d) {
    const int64_t row = int64_t(heads) * d;
    return make_tensor_map_2d(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, base, tokens, row, row * 2,
                              kBlockN, kBoxValues, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The work items: (query block, query head, sequence).
int64_t work_items(const AttentionArgs& a) {
    return ceil_div(a.max_seqlen_q, int64_t(kBlockM)) * a.num_heads_q * a.batch;
}

template <typename T, int kD, bool kCausal>
cudaError_t launch_wgmma(const AttentionArgs& a, cudaStream_t stream) {
    CUtensorMap map_q, map_k, map_v;
    cudaError_t e = make_head_map(&map_q, a.q, a.total_q, a.num_heads_q, kD);
    if (e == cudaSuccess) e = make_head_map(&map_k, a.k, a.total_k, a.num_heads_kv, kD);
    if (e == cudaSuccess) e = make_head_map(&map_v, a.v, a.total_k, a.num_heads_kv, kD);
    if (e != cudaSuccess) return e;
    const auto kernel = attention_fwd_wgmma_kernel<T, kD, kCausal>;
    constexpr int kSmemBytes = Sm90Smem<kD>::kBytes;
    static std::atomic<uint64_t> smem_done{0};
    e = allow_dynamic_smem_once(kernel, kSmemBytes, smem_done);
    if (e != cudaSuccess) return e;
    // Persistent: one CTA per SM (at most one fits), each taking its items in turn (snake_item),
    // so that an item's loads overlap the previous item's last tiles and stores.
    const int64_t items = work_items(a);
    const int64_t blocks = std::min<int64_t>(items, std::max(sm_count(), 1));
    kernel<<<unsigned(blocks), kThreads, kSmemBytes, stream>>>(map_q, map_k, map_v, a, items);
    return cudaGetLastError();
}

}  // namespace

bool attention_wgmma_serves(const AttentionArgs& a) {
    return a.total_k >= 1 && tma_wgmma_built_and_runnable();
}

cudaError_t attention_forward_wgmma(const AttentionArgs& a, cudaStream_t stream) {
    if (!attention_wgmma_serves(a)) return cudaErrorNotSupported;
    return dispatch_attention(a, [&](auto tag, auto d, auto causal) {
        return launch_wgmma<decltype(tag), d.value, causal.value>(a, stream);
    });
}

}  // namespace ck
