// w4a16_reference.cuh - the tiled float32 reference GEMM that the weight-only 4-bit kernels
// share (gemm_w4a16.cu for INT4, gemm_block4.cu for NF4 / MXFP4 / NVFP4): any M, any GPU,
// simple and obviously right. The kernels differ only in how a loader thread dequantizes its 8
// weights of a step; the tiling, the float FMAs and the epilogue are this file's.
//
// 64x64 output tile per 256-thread block, K in steps of 32. Shared tiles are k-major ([k][m]
// and [k][n]) floats so that a thread's operands for one k are plain loads; the +1 pad puts the
// loaders' transposed stores (8 rows x 4 k-groups per warp) on 32 distinct banks. Thread
// (ty, tx) = (tid / 16, tid % 16) owns rows ty + 16 i and columns tx + 16 j (i, j < 4); a
// projection's epilogue (QkvEpilogue) pairs columns of lanes tx and tx ^ 1.
// Loaders: thread tid handles row tid / 4 and word tid % 4 (k 8 (tid % 4) .. + 7) of the step,
// of both x (one 16-byte load) and w (one 4-byte word of 8 codes).
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/core/epilogue.cuh"

namespace ck {

constexpr int kRefBM = 64, kRefBN = 64, kRefBK = 32;
constexpr int kRefThreads = 256;
constexpr int kRefPad = 1;
constexpr int kRefMicro = 4;  // rows and columns per thread
constexpr int kRefLoadK = 8;  // k per loader thread and step: one word

static_assert(kRefBM * kRefBK / kRefLoadK == kRefThreads, "one x vector per thread per step");
static_assert(kRefBN * kRefBK / kRefLoadK == kRefThreads, "one 8-code weight word per thread");
static_assert(kRefThreads / 16 * kRefMicro == kRefBM && 16 * kRefMicro == kRefBN,
              "the micro-tiles cover the block tile");

// The block's output tile: out = ep(x w'^T) for w' from load_weights(row, k0, word, wv), which
// writes the 8 dequantized weights (widened to float) of weight row `row` < n at k k0 + 8 word
// .. + 7 into wv. k % 32 == 0.
template <typename T, class Ep, class LoadWeights>
__device__ __forceinline__ void reference_tile(const T* __restrict__ x, int64_t m, int64_t n,
                                               int64_t k, const Ep& ep,
                                               LoadWeights&& load_weights) {
    __shared__ float sx[kRefBK][kRefBM + kRefPad];
    __shared__ float sw[kRefBK][kRefBN + kRefPad];

    const int64_t tiles_m = ceil_div(m, kRefBM);
    const int64_t m0 = blockIdx.x % tiles_m * kRefBM;
    const int64_t n0 = blockIdx.x / tiles_m * kRefBN;
    const int tid = threadIdx.x;
    const int ty = tid / 16, tx = tid % 16;
    const int ld_row = tid / 4, ld_word = tid % 4, ld_k = ld_word * kRefLoadK;
    float acc[kRefMicro][kRefMicro] = {};

    for (int64_t k0 = 0; k0 < k; k0 += kRefBK) {  // k % 32 == 0: no K tail
        float xv[kRefLoadK] = {};
        if (m0 + ld_row < m) load_chunk<T, true>(x + (m0 + ld_row) * k + k0 + ld_k, kRefLoadK, xv);
        float wv[kRefLoadK] = {};
        if (n0 + ld_row < n) load_weights(n0 + ld_row, k0, ld_word, wv);
        __syncthreads();  // the previous step's reads are done
#pragma unroll
        for (int i = 0; i < kRefLoadK; ++i) {
            sx[ld_k + i][ld_row] = xv[i];
            sw[ld_k + i][ld_row] = wv[i];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < kRefBK; ++kk) {
            float a[kRefMicro], b[kRefMicro];
#pragma unroll
            for (int i = 0; i < kRefMicro; ++i) a[i] = sx[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < kRefMicro; ++j) b[j] = sw[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < kRefMicro; ++i)
#pragma unroll
                for (int j = 0; j < kRefMicro; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    }

    if constexpr (Ep::kQkv) {  // pairs of columns c, c + 1: lanes tx, tx ^ 1
#pragma unroll
        for (int j = 0; j < kRefMicro; ++j) {
            const int64_t c = n0 + tx + 16 * j;
#pragma unroll
            for (int i = 0; i < kRefMicro; ++i) {
                const int64_t r = m0 + ty + 16 * i;
                const float next = __shfl_xor_sync(0xffffffffu, acc[i][j], 1);
                if (tx % 2 == 0 && r < m && c < n) ep.store_pair(r, c, acc[i][j], next);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < kRefMicro; ++j) {
            const int64_t c = n0 + tx + 16 * j;
            if (c >= n) continue;
            const float b = ep.bias_at(c);
#pragma unroll
            for (int i = 0; i < kRefMicro; ++i) {
                const int64_t r = m0 + ty + 16 * i;
                if (r < m) ep.store(r, c, acc[i][j] + b);
            }
        }
    }
}

}  // namespace ck
