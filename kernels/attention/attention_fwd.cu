// attention_fwd.cu - prefill attention (ck_attention_forward), FlashAttention-2's forward on
// mma.sync (sm_80+): O = softmax(scale q k^T, masked) v per query head, and lse.
//
// Layout: q, out [total_q, Hq, D]; k, v [total_k, Hkv, D] (fp16 or bf16, contiguous); lse
// [total_q, Hq] float32; sequences packed along the token axis by int32 cu_seqlens read here.
//
// Algorithm: one block of 4 warps per (64 query rows, query head, sequence); each warp owns 16
// rows. The block's Q tile is copied to shared memory once and kept in registers as mma A
// fragments; K and V stream through shared memory in tiles of 64 keys, double-buffered with
// cp.async (tile j + 1 loads while tile j computes). Per tile: S = Q K^T (m16n8k16, float32
// sums), x = S scale log2(e) (base 2, so that exp is one ex2), masked to -inf beyond the
// sequence and above the causal diagonal; the running row max m and row sum l update the
// online softmax (acc and l rescaled by 2^(m_old - m_new)); P = 2^(x - m) rounded to the dtype
// is the A operand of acc += P V. At the end O = acc / l and lse = (m + log2(l)) ln(2).
// Key tiles that are wholly above the causal diagonal of the block's last row are skipped.
//
// Floors: 4 D Hq (allowed query-key pairs) flops (tests/reference.py attention_flops) on the
// tensor cores; this first version is written to be correct, not yet fast (one warp row tile,
// no warp specialization, the mask applied on every tile).
#include "kernels/attention/attention.cuh"
#include "kernels/attention/attention_tile.cuh"

namespace ck {
namespace {

using namespace attention;

// mma.sync, ldmatrix and cp.async exist from sm_80; the file is built for sm_75 too, where the
// wrappers are empty and the kernel traps at entry (the entry point never launches it there).
constexpr bool kHasSm80 = CK_SM80;

// Tiles: 64 query rows (4 warps x one m16 tile) by 64 keys. 64 keys keep S and P in 32
// registers per thread beside D=128's 64 accumulators and 32 Q fragment registers.
constexpr int kBlockM = 64;
constexpr int kBlockN = 64;
constexpr int kWarps = kBlockM / 16;
constexpr int kThreads = kWarps * 32;
static_assert(kBlockN % 16 == 0, "P V takes keys 16 at a time (the mma's k); K fragments load "
                                 "two n8 tiles per ldmatrix.x4");

// Shared memory of one block: Q [kBlockM][D], then K and V [kBlockN][D] twice each (the two
// cp.async stages). Rows are D * 2 = 128 or 256 bytes, so the 8 rows one ldmatrix reads at the
// same column would fall in the same banks: the 16-byte chunk c of row r is stored at chunk
// c ^ (r % 8), which spreads any 8 consecutive rows over all 32 banks.
template <int kD> struct Smem {
    static constexpr int kChunks = kD / kChunkElems;  // 16-byte chunks per row
    static constexpr int kRowBytes = kD * 2;
    static constexpr int kQBytes = kBlockM * kRowBytes;
    static constexpr int kTileBytes = kBlockN * kRowBytes;
    static constexpr int kBytes = kQBytes + 4 * kTileBytes;
    static_assert(kChunks % 8 == 0, "the XOR swizzle permutes chunks in groups of 8");
    static_assert(kD % 16 == 0 && kD / 8 % 2 == 0, "V fragments: two n8 tiles per ldmatrix");

    __device__ static uint32_t offset(int row, int chunk) {
        return row * kRowBytes + ((chunk ^ (row % 8)) << 4);
    }
    __device__ static uint32_t k_tile(uint32_t base, int stage) {
        return base + kQBytes + stage * kTileBytes;
    }
    __device__ static uint32_t v_tile(uint32_t base, int stage) {
        return base + kQBytes + (2 + stage) * kTileBytes;
    }
};

// Copies kRows rows of D values (row r at src + r * stride) into a swizzled tile; rows at or
// past `valid` are zero-filled and read nothing (the ends of sequences). src stays a valid
// address for the rows that read nothing: cp.async with 0 source bytes does not dereference it.
template <int kD, int kRows, typename T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* src, int64_t stride,
                                          int64_t valid) {
    using S = Smem<kD>;
    static_assert(kRows * S::kChunks % kThreads == 0, "every thread copies as many chunks");
#pragma unroll
    for (int it = 0; it < kRows * S::kChunks / kThreads; ++it) {
        const int i = it * kThreads + threadIdx.x;
        const int r = i / S::kChunks, c = i % S::kChunks;
        const bool ok = r < valid;
        cp_async_16_zfill(tile + S::offset(r, c), ok ? src + r * stride + c * kChunkElems : src,
                          ok);
    }
}

// Fragment layout: attention_tile.cuh's (each thread owns two query rows of its warp's 16).
template <typename T, int kD, bool kCausal>
__global__ void __launch_bounds__(kThreads) attention_fwd_kernel(const AttentionArgs a) {
    if constexpr (!kHasSm80) __trap();  // never launched below sm_80 (see kHasSm80)
    using S = Smem<kD>;
    constexpr int kNT = kBlockN / 8;  // n8 tiles of S
    constexpr int kDT = kD / 8;       // n8 tiles of O
    constexpr int kKS = kD / 16;      // k16 steps of Q K^T

    const int b = blockIdx.z, h = blockIdx.y;
    const int64_t q0 = int64_t(blockIdx.x) * kBlockM;
    const Span sq = sequence_span(a.cu_seqlens_q, b, a.total_q);
    const Span sk = sequence_span(a.cu_seqlens_k, b, a.total_k);
    if (q0 >= sq.len) return;  // a block past its sequence's queries (the grid covers the longest)

    const int hkv = h / (a.num_heads_q / a.num_heads_kv);
    const int64_t q_stride = int64_t(a.num_heads_q) * kD, kv_stride = int64_t(a.num_heads_kv) * kD;
    const T* q = static_cast<const T*>(a.q) + (sq.start + q0) * q_stride + int64_t(h) * kD;
    const T* k = static_cast<const T*>(a.k) + sk.start * kv_stride + int64_t(hkv) * kD;
    const T* v = static_cast<const T*>(a.v) + sk.start * kv_stride + int64_t(hkv) * kD;

    // Query i sees key j iff j < Sk and (causal) j <= i + Sk - Sq. The block's last row bounds
    // the keys any of its rows sees: later key tiles are skipped whole.
    const int64_t rows = min(int64_t(kBlockM), sq.len - q0);
    const int64_t diagonal = sk.len - sq.len;
    const int64_t key_end =
        kCausal ? min(sk.len, max(int64_t(0), q0 + rows + diagonal)) : sk.len;
    const int tiles = int(ceil_div(key_end, kBlockN));

    extern __shared__ uint4 smem[];
    const uint32_t base = shared_address(smem);
    load_tile<kD, kBlockM>(base, q, q_stride, rows);
    if (tiles > 0) {
        load_tile<kD, kBlockN>(S::k_tile(base, 0), k, kv_stride, sk.len);
        load_tile<kD, kBlockN>(S::v_tile(base, 0), v, kv_stride, sk.len);
    }
    cp_async_commit();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t row0 = q0 + warp * 16 + g;  // the thread's rows: row0 and row0 + 8
    const float scale_log2 = a.scale * kLog2e;

    uint32_t qf[kKS][4];
    float acc[kDT][4];
#pragma unroll
    for (int i = 0; i < kDT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};  // running row max of x (base-2 units)
    float l[2] = {0.f, 0.f};              // this thread's part of the row sum (quad-summed last)

    for (int j = 0; j < tiles; ++j) {
        // Tile j has landed for every thread, and every warp is done with tile j - 1's stage,
        // which tile j + 1 now overwrites.
        cp_async_wait<0>();
        __syncthreads();
        if (j + 1 < tiles) {
            const int64_t n1 = int64_t(j + 1) * kBlockN;
            load_tile<kD, kBlockN>(S::k_tile(base, (j + 1) % 2), k + n1 * kv_stride, kv_stride,
                                   sk.len - n1);
            load_tile<kD, kBlockN>(S::v_tile(base, (j + 1) % 2), v + n1 * kv_stride, kv_stride,
                                   sk.len - n1);
        }
        cp_async_commit();
        if (j == 0) load_q_fragments<S>(qf, base, warp * 16, lane);
        const uint32_t kt = S::k_tile(base, j % 2), vt = S::v_tile(base, j % 2);

        float s[kNT][4];
        qk_tile<T, S>(s, qf, kt, 0, lane);
        // x in base 2, masked beyond the sequence and above the causal diagonal; P; acc += P V.
        const int64_t n0 = int64_t(j) * kBlockN;
        float tile_max[2];
        mask_tile(s, tile_max, scale_log2, [&](int i, int e) {
            const int64_t key = n0 + i * 8 + 2 * t + (e & 1);
            const int64_t row = row0 + (e / 2) * 8;
            return key < sk.len && (!kCausal || key <= row + diagonal);
        });
        online_softmax(s, tile_max, m, l, acc);
        pv_tile<T, S>(acc, s, vt, 0, lane);
    }
    cp_async_wait<0>();  // no copy may still target shared memory when the block exits

    // O = acc x (1 / l) (store_row_scaled); rows without keys (l = 0,
    // m = -inf) write O = 0 and lse = -inf.
    T* out = static_cast<T*>(a.out) + (sq.start + q0) * q_stride + int64_t(h) * kD;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t row = warp * 16 + g + 8 * r;  // within the block
        const float sum = quad_sum(l[r]);
        if (row >= rows) continue;
        store_row_scaled(out + row * q_stride + 2 * t, acc, r, sum);
        if (a.lse && t == 0) a.lse[(sq.start + q0 + row) * a.num_heads_q + h] = row_lse(m[r], sum);
    }
}

template <typename T, int kD, bool kCausal>
cudaError_t launch(const AttentionArgs& a, cudaStream_t stream) {
    const auto kernel = attention_fwd_kernel<T, kD, kCausal>;
    constexpr int kSmemBytes = Smem<kD>::kBytes;
    static std::atomic<uint64_t> smem_done{0};
    const cudaError_t e = allow_dynamic_smem_once(kernel, kSmemBytes, smem_done);
    if (e != cudaSuccess) return e;
    const dim3 grid(unsigned(ceil_div(a.max_seqlen_q, kBlockM)), unsigned(a.num_heads_q),
                    unsigned(a.batch));
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace

cudaError_t attention_forward(const AttentionArgs& a, cudaStream_t stream) {
    return dispatch_attention(a, [&](auto tag, auto d, auto causal) {
        return launch<decltype(tag), d.value, causal.value>(a, stream);
    });
}

}  // namespace ck
