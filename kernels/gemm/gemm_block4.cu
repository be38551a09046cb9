// gemm_block4.cu - weight-only GEMM on block 4-bit weights (NF4, MXFP4, NVFP4): the prepack
// from the formats' native storage and the reference kernel (any M, any GPU). The fast paths are
// the INT4 kernels instantiated with the format's Dequant (core/dequant.cuh): for M <= 16 the
// weight-streaming kernel of gemm_w4a16_prepacked_stream.cu, on Hopper the wgmma kernel of
// gemm_w4a16_prepacked_wgmma_sm90.cu for any M.
//
// What it computes (cuda_kernels.h, ck_gemm_block4_prepacked; tests/reference.py,
// gemm_block4_f64):
//   w'[n][k]  = round_to_dtype(float32(value(code[n][k]) * block_scale[n][k / block]))
//               -- the bits ck_dequantize_<format> writes for dtype
//   out[m][n] = round_to_dtype(act(sum_k float(x[m][k]) * float(w'[n][k]) + float(bias[n])))
// in float32, the sum in any order.
//
// Layout (gemm_block4.cuh): codes in the prepacked INT4 tiles (w4a16_prepacked.cuh), the raw
// 4-bit code of the format in each nibble (NF4 0 .. 15, E2M1 sign-magnitude); scale units
// [ceil(n / 8)][k / G][8]. Padding: rows >= n hold a zero code (NF4 7, E2M1 0) and a zero unit,
// k >= K (to the 128 of a tile) a zero code: they dequantize to +-0.
//
// The prepack is a permutation of bytes (the codes by gemm_w4a16.cu's prepack_codes, one thread
// per 16-byte vector of 32 codes; the scales here, one thread per unit): a few operations per
// byte, bytes / copy bandwidth. The reference kernel is
// gemm_w4a16.cu's: 64x64 output tiles, the dequantized weight (rounded to dtype) and x staged as
// float in shared memory, float FMAs; simple and obviously right, for M > 16 before Hopper
// (no mma.sync kernel serves the block formats yet) and as the tests' reference.
#include "kernels/core/dequant.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/gemm/gemm_block4.cuh"
#include "kernels/gemm/w4a16_reference.cuh"

namespace ck {
namespace {

// ---------------------------------------------------------------------------------------------
// Prepack
// ---------------------------------------------------------------------------------------------
// The zero code of a format's padding: NF4's value 0.0 is code 7; E2M1's +0 is code 0.
constexpr uint32_t kNf4ZeroWord = 0x77777777u, kE2m1ZeroWord = 0u;

// Units: NF4 the float32 absmax of block j; MXFP4 the E8M0 byte of block j; NVFP4 the E4M3 bytes
// of blocks 2j (low byte) and 2j + 1. Padding rows get 0.
template <typename Unit, int kPerUnit>
__global__ void block4_prepack_scales_kernel(const Unit* __restrict__ in_units, const uint8_t* __restrict__ in_bytes,
                                             int64_t n, int64_t units, RopePairs rope,
                                             Unit* __restrict__ out) {
    const int64_t total = prepacked_rows(n) * units;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = i / units, j = i % units;
        Unit u = 0;
        if (row < n) {
            const int64_t src = rope.source(row);
            if constexpr (kPerUnit == 1) {
                u = in_units[src * units + j];
            } else {  // two E4M3 bytes per unit
                const uint8_t* p = in_bytes + (src * units + j) * 2;
                u = Unit(p[0] | p[1] << 8);
            }
        }
        out[prepacked_group_index(row, j, units)] = u;
    }
}

// ---------------------------------------------------------------------------------------------
// Reference kernel (w4a16_reference.cuh's tiling, as gemm_w4a16.cu's): a loader's word of 8
// codes is dequantized by Dequant<Format, T> into 4 pairs of T, widened to float.
// ---------------------------------------------------------------------------------------------
static_assert(kRefBK == kPackSliceK, "a step is one 32-k slice: one scale unit per row");

template <class Format, typename T, int kMode = kMoeDense>
__global__ void __launch_bounds__(kRefThreads) gemm_block4_reference_kernel(const GemmW4A16Args args) {
    using D = Dequant<Format, T>;
    using Unit = typename D::Unit;
    __shared__ float table[D::kTableFloats > 0 ? D::kTableFloats : 1];
    D::fill_table(table, args.global_scale);
    __syncthreads();

    const Unit* __restrict__ units = static_cast<const Unit*>(args.scales);
    const int64_t chunks = args.chunks;
    reference_tile<T>(args.x_as<T>(), args.m, args.n, args.k, args.epilogue_of<T, kMode>(),
                      [&](int64_t row, int64_t k0, int ld_word, float (&wv)[kRefLoadK]) {
        const uint32_t q = *reinterpret_cast<const uint32_t*>(
            args.w + prepacked_vector_offset(row, k0, chunks) + ld_word * 4);
        const Unit unit = units[prepacked_group_index(row, k0 / args.group_size, args.groups)];
        uint32_t p[4];  // pair j: k 2j, 2j + 1 of the word
        D::word(q, D::block(unit, ld_word, table), p);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const typename Pair<T>::V v = as_pair<T>(p[j]);
            wv[2 * j] = to_float(v.x);
            wv[2 * j + 1] = to_float(v.y);
        }
    });
}

template <class Format>
cudaError_t launch_reference(const GemmW4A16Args& a, cudaStream_t stream) {
    const int64_t blocks = ceil_div(a.m, kRefBM) * ceil_div(a.n, kRefBN);
    if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
    return dispatch_half_dtype(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (a.qkv.q)
            gemm_block4_reference_kernel<Format, T, kQkvRows><<<unsigned(blocks), kRefThreads, 0, stream>>>(a);
        else
            gemm_block4_reference_kernel<Format, T><<<unsigned(blocks), kRefThreads, 0, stream>>>(a);
        return cudaGetLastError();
    });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers (arguments validated by cuda_kernels.cu)
// ---------------------------------------------------------------------------------------------
cudaError_t block4_prepack(const Block4PrepackArgs& a, cudaStream_t stream) {
    const bool nf4 = a.format == CK_BLOCK4_NF4;  // bitsandbytes: element 2i in the high nibble
    const cudaError_t err = prepack_codes(
        {a.packed, a.n, a.k, /*interleave=*/0, /*flip=*/0u, nf4 ? kNf4ZeroWord : kE2m1ZeroWord,
         /*high_first=*/nf4, a.w_out, a.rope},
        stream);
    if (err != cudaSuccess) return err;

    const int64_t units = a.k / block4_unit_group(a.format, a.blocksize);
    const unsigned blocks = prepack_blocks(prepacked_rows(a.n) * units);
    switch (a.format) {
        case CK_BLOCK4_NF4:
            block4_prepack_scales_kernel<uint32_t, 1><<<blocks, kPrepackThreads, 0, stream>>>(
                static_cast<const uint32_t*>(a.scales), nullptr, a.n, units, a.rope,
                static_cast<uint32_t*>(a.scales_out));
            break;
        case CK_BLOCK4_MXFP4:
            block4_prepack_scales_kernel<uint8_t, 1><<<blocks, kPrepackThreads, 0, stream>>>(
                static_cast<const uint8_t*>(a.scales), nullptr, a.n, units, a.rope,
                static_cast<uint8_t*>(a.scales_out));
            break;
        case CK_BLOCK4_NVFP4:
            block4_prepack_scales_kernel<uint16_t, 2><<<blocks, kPrepackThreads, 0, stream>>>(
                nullptr, static_cast<const uint8_t*>(a.scales), a.n, units, a.rope,
                static_cast<uint16_t*>(a.scales_out));
            break;
        default: return cudaErrorInvalidValue;  // the entry point rejects these earlier
    }
    return cudaGetLastError();
}

cudaError_t gemm_block4_stream(const GemmBlock4Args& args, cudaStream_t stream) {
    return gemm_block4_prepacked_stream(args.gemm, args.format, stream);
}

cudaError_t gemm_block4_wgmma(const GemmBlock4Args& args, cudaStream_t stream) {
    return gemm_block4_prepacked_wgmma(args.gemm, args.format, stream);
}

cudaError_t gemm_block4_reference(const GemmBlock4Args& args, cudaStream_t stream) {
    switch (args.format) {
        case CK_BLOCK4_NF4: return launch_reference<Nf4>(args.gemm, stream);
        case CK_BLOCK4_MXFP4: return launch_reference<Mxfp4>(args.gemm, stream);
        case CK_BLOCK4_NVFP4: return launch_reference<Nvfp4>(args.gemm, stream);
        default: return cudaErrorInvalidValue;  // the entry point rejects these earlier
    }
}

}  // namespace ck
