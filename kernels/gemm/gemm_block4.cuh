// gemm_block4.cuh - launchers of the weight-only GEMM on block 4-bit weights (NF4, MXFP4, NVFP4:
// ck_block4_prepack, ck_gemm_block4_prepacked), called by the entry points after they validated
// every argument. The codes use the prepacked INT4 layout (w4a16_prepacked.cuh); the scales are
// the format's own values, one unit per (row, scale group of G = max(block, 32) k), laid out as
// the INT4 scales ([ceil(n / 8)][k / G][8] units): NF4 float32 absmax (G = blocksize), MXFP4
// one E8M0 byte (G = 32), NVFP4 two E4M3 bytes (G = 32: blocks 2j and 2j + 1, 2j in the low byte).
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"

namespace ck {

constexpr int64_t kBlock4UnitGroupMin = 32;  // k per unit at least: one lane's 32-k slice

// Bytes of one scale unit of the format (0 for a value that is not a format).
inline int64_t block4_unit_bytes(ck_block4_format_t format) {
    switch (format) {
        case CK_BLOCK4_NF4: return 4;
        case CK_BLOCK4_MXFP4: return 1;
        case CK_BLOCK4_NVFP4: return 2;
        default: return 0;
    }
}

// k per scale unit: NF4's blocksize, 32 for the E2M1 formats.
inline int64_t block4_unit_group(ck_block4_format_t format, int64_t blocksize) {
    return format == CK_BLOCK4_NF4 ? blocksize : kBlock4UnitGroupMin;
}

// ck_block4_prepack: native [n, k] storage (codes [n, k / 2], scales [n, k / blocksize]) ->
// the prepacked codes (w4a16_prepacked_bytes) and scale units.
struct Block4PrepackArgs {
    ck_block4_format_t format;
    const uint8_t* packed;  // [n, k / 2], the format's nibble order
    const void* scales;     // [n, k / blocksize]: float32 (NF4) or uint8
    int64_t n, k, blocksize;
    uint8_t* w_out;
    void* scales_out;       // ceil(n / 8) * 8 * (k / G) units
    RopePairs rope;         // the fused Q/K/V weight's rotary pairs (ck_qkv_prepack), or none
};
cudaError_t block4_prepack(const Block4PrepackArgs& args, cudaStream_t stream);

// One GEMM call: GemmW4A16Args with w, scales the prepacked codes and units, zeros nullptr,
// group_size = G and groups = k / G (derive() then gives the unit's group shift), global_scale
// NVFP4's (nullptr otherwise), prepacked true.
struct GemmBlock4Args {
    GemmW4A16Args gemm;
    ck_block4_format_t format;
};

// stream: m <= 16, sm_80+ (cudaErrorNotSupported otherwise): the weight-streaming kernel of
// gemm_w4a16_prepacked_stream.cu with the format's Dequant. wgmma: any m on compute capability
// 9.0 with the sm_90a build (gemm_w4a16_wgmma_available(); cudaErrorNotSupported otherwise): the
// Hopper kernel of gemm_w4a16_prepacked_wgmma_sm90.cu with the format's Dequant. reference: any
// m, any GPU.
cudaError_t gemm_block4_prepacked_stream(const GemmW4A16Args& args, ck_block4_format_t format,
                                         cudaStream_t stream);
cudaError_t gemm_block4_prepacked_wgmma(const GemmW4A16Args& args, ck_block4_format_t format,
                                        cudaStream_t stream);
cudaError_t gemm_block4_stream(const GemmBlock4Args& args, cudaStream_t stream);
cudaError_t gemm_block4_wgmma(const GemmBlock4Args& args, cudaStream_t stream);
cudaError_t gemm_block4_reference(const GemmBlock4Args& args, cudaStream_t stream);

}  // namespace ck
