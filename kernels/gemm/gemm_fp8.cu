// gemm_fp8.cu - the reference FP8 GEMM (ck_gemm_fp8_scaled's "reference" variant): the kernel the
// fast ones (the small-M stream of gemm_int8.cu, the wgmma kernel of gemm_int8_sm90.cu) are
// tested against on the GPU.
//
//   acc[m, n] = sum_k float(a[m, k]) * float(b[n, k]),   a [M, K], b [N, K]: FP8 E4M3 bytes
//
// in float32, one fma per k in ascending k order (with block scales: each 128-wide k-block's
// sum so, then fma(sum, scale_a[m, kb] * scale_b[n / 128, kb], acc)); then the scaled epilogue
// (epilogue.cuh). An E4M3 x E4M3 product is exact in float32 (4 + 4 significand bits;
// |product| <= 448^2, >= 2^-18), so only the additions round. Tiles of 16 rows x 32 columns per
// 256-thread block, K in steps of 128 through shared memory, the E4M3 values decoded to float32
// once on their way in; thread (ty, tx) owns row ty and the column pair 2 tx, 2 tx + 1 (the
// epilogue's store unit). The entry point guarantees K % 16 == 0 and 16-byte aligned rows;
// partial tiles read zeros.
//
// W4A8 (ck_gemm_w4a8's "reference" variant, kW4A8): b holds packed symmetric INT4 codes
// [N, K / 2], decoded to their float values (-8 .. 7, exact) on their way in; every k-block's
// sum (from zero, fma in k order) is then scaled by its column's group scale (GroupScales):
// acc = fma(sum, scale[n, kb], acc).
#include "kernels/core/epilogue.cuh"
#include "kernels/core/fp8.cuh"
#include "kernels/gemm/gemm_int8.cuh"

namespace ck {
namespace {

constexpr int kRefRows = 16, kRefCols = 32, kRefK = int(kFp8Block), kRefThreads = 256;
static_assert(kRefRows * 16 == kRefThreads && kRefCols == 2 * 16, "thread (ty, tx): a row, a pair");
static_assert(kFp8Block % kRefCols == 0, "a tile's columns share their block scale");

// The float value of b's element (r, c): an E4M3 byte, or (W4A8) a packed INT4 code.
template <bool kW4A8>
__device__ __forceinline__ float b_value(const uint8_t* __restrict__ b, int64_t r, int64_t c,
                                         int64_t k) {
    if constexpr (kW4A8) {
        const uint32_t byte = b[r * (k / 2) + c / 2];
        return float(int32_t((c % 2 ? byte >> 4 : byte) << 28) >> 28);
    } else {
        return fp8x2_value<CK_FP8_E4M3>(b[r * k + c]).x;
    }
}

template <typename OutT, bool kW4A8>
__global__ void __launch_bounds__(kRefThreads)
gemm_fp8_reference_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b, int64_t k,
                          BlockScales scales, GroupScales group, Epilogue<OutT> ep) {
    __shared__ float sa[kRefRows][kRefK + 1];
    __shared__ float sb[kRefCols][kRefK + 1];
    const int64_t tiles_m = ceil_div(ep.m, int64_t(kRefRows));
    const int64_t m0 = int64_t(blockIdx.x) % tiles_m * kRefRows;
    const int64_t n0 = int64_t(blockIdx.x) / tiles_m * kRefCols;
    const int ty = int(threadIdx.x) / 16, tx = int(threadIdx.x) % 16;
    float acc0 = 0.f, acc1 = 0.f;
    for (int64_t k0 = 0; k0 < k; k0 += kRefK) {
        __syncthreads();  // the previous step's reads are done
        // A: 16 x 128 bytes, 8 per thread; B: 32 x 128 bytes, 16 per thread.
        for (int i = int(threadIdx.x); i < kRefRows * kRefK; i += kRefThreads) {
            const int r = i / kRefK, c = i % kRefK;
            const bool ok = m0 + r < ep.m && k0 + c < k;
            sa[r][c] = ok ? fp8x2_value<CK_FP8_E4M3>(a[(m0 + r) * k + k0 + c]).x : 0.f;
        }
        for (int i = int(threadIdx.x); i < kRefCols * kRefK; i += kRefThreads) {
            const int r = i / kRefK, c = i % kRefK;
            const bool ok = n0 + r < ep.n && k0 + c < k;
            sb[r][c] = ok ? b_value<kW4A8>(b, n0 + r, k0 + c, k) : 0.f;
        }
        __syncthreads();
        // Block scales: this k-block's sums from zero, then scaled into acc (fma). Otherwise one
        // chain of fmas over all of K.
        const bool block = kW4A8 || scales.a != nullptr;
        float sum0 = block ? 0.f : acc0, sum1 = block ? 0.f : acc1;
#pragma unroll 8
        for (int c = 0; c < kRefK; ++c) {
            sum0 = __fmaf_rn(sa[ty][c], sb[2 * tx][c], sum0);
            sum1 = __fmaf_rn(sa[ty][c], sb[2 * tx + 1][c], sum1);
        }
        if (!block) {
            acc0 = sum0, acc1 = sum1;
        } else if (kW4A8) {
            const int64_t c = n0 + 2 * tx, kb = k0 / kRefK;
            if (c < ep.n) acc0 = __fmaf_rn(sum0, group.at(c, kb), acc0);
            if (c + 1 < ep.n) acc1 = __fmaf_rn(sum1, group.at(c + 1, kb), acc1);
        } else if (m0 + ty < ep.m && n0 < ep.n) {
            const float s = scales.at(m0 + ty, n0, k0 / kRefK);
            acc0 = __fmaf_rn(sum0, s, acc0);
            acc1 = __fmaf_rn(sum1, s, acc1);
        }
    }
    ep.store_pair(m0 + ty, n0 + 2 * tx, acc0, acc1);
}

template <bool kW4A8> cudaError_t reference(const IntGemmArgs& args, cudaStream_t stream) {
    return dispatch_float_dtype(args.out_dtype, [&](auto tag) {
        using OutT = decltype(tag);
        return launch_tile_grid(gemm_fp8_reference_kernel<OutT, kW4A8>, args.m, args.n, kRefRows,
                                kRefCols, kRefThreads, 0, stream, args.a_as<uint8_t>(),
                                args.b_as<uint8_t>(), args.k, block_scales(args),
                                group_scales(args), make_epilogue<OutT>(args));
    });
}

}  // namespace

cudaError_t gemm_fp8_reference(const IntGemmArgs& args, cudaStream_t stream) {
    return reference<false>(args, stream);
}

cudaError_t gemm_w4a8_reference(const IntGemmArgs& args, cudaStream_t stream) {
    return reference<true>(args, stream);
}

}  // namespace ck
