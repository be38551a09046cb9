// chunk_map.cuh - the element-wise walker that the quantization families share (quantize.cu,
// block4.cu): a 2-D grid of 8-element chunks (common.cuh) and one small op per job, plus the
// launchers' choice of the vectorized path. Nothing here is exported.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

// Elements of the chunk starting at column c0 that lie inside the row (0 past its end).
__device__ __forceinline__ int chunk_count(int64_t cols, int64_t c0) {
    return c0 >= cols ? 0 : cols - c0 < kChunk ? int(cols - c0) : kChunk;
}

// The vectorized path: whole chunks (cols % 8 == 0) and both base pointers aligned to their
// chunk's access size (a 16-byte chunk of elements, 4 or 8 bytes of codes).
inline bool vector_ok(int64_t cols, const void* a, size_t a_align, const void* b, size_t b_align) {
    return cols % kChunk == 0 && is_aligned(a, a_align) && is_aligned(b, b_align);
}

// ---------------------------------------------------------------------------------------------
// Element-wise kernels: one generic walker over the 2-D chunk grid and one small op per job.
// Each thread takes Op::kUnroll chunks per step (blockDim.x chunks apart, so warps stay
// coalesced) and issues all their loads before storing any result. Encoders gain from 2 chunks
// in flight, decoders lose (benchmarks/NOTES.md), so each op says.
// An Op has: kUnroll; Frag, what load() leaves for store(); begin_row(r); load(r, c0, n, frag);
// store(r, c0, n, frag), for the n (1..8) elements of the chunk at column c0 of row r.
// ---------------------------------------------------------------------------------------------
// The Frag of the decoders of block-scaled codes: a chunk's integer codes with their block's
// scale, loaded together so that one memory round trip brings everything the chunk needs.
struct ScaledCodes {
    int codes[kChunk];
    float scale;
};

template <class Op>
__global__ void __launch_bounds__(kBlockThreads) map_chunks_kernel(Op op, int64_t rows, int64_t cols) {
    constexpr int kUnroll = Op::kUnroll;
    const int64_t chunks = ceil_div(cols, kChunk);
    const int64_t step = int64_t(gridDim.x) * blockDim.x * kUnroll;
    for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < rows;
         r += int64_t(gridDim.y) * blockDim.y) {
        op.begin_row(r);
        for (int64_t cb = blockIdx.x * int64_t(blockDim.x) * kUnroll + threadIdx.x; cb < chunks; cb += step) {
            typename Op::Frag frag[kUnroll];
            int n[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                n[u] = chunk_count(cols, (cb + u * int64_t(blockDim.x)) * kChunk);
                if (n[u] > 0) op.load(r, (cb + u * int64_t(blockDim.x)) * kChunk, n[u], frag[u]);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                if (n[u] > 0) op.store(r, (cb + u * int64_t(blockDim.x)) * kChunk, n[u], frag[u]);
        }
    }
}

template <class Op>
void launch_map(const Op& op, int64_t rows, int64_t cols, cudaStream_t stream) {
    const RowLaunch l = row_launch(rows, ceil_div(ceil_div(cols, kChunk), Op::kUnroll));
    map_chunks_kernel<Op><<<l.grid, l.block, 0, stream>>>(op, rows, cols);
}

}  // namespace ck
