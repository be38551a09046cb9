// fp8.cuh - FP8 (OCP 8-bit floating point, E4M3 'fn' and E5M2) conversions, shared by the FP8
// quantizers (kernels/quantize/quantize.cu) and NVFP4's E4M3 block scales (block4.cu). Nothing
// here is exported.
//
// Both directions go through cuda_fp8.h: on compute capability 8.9 and newer its conversions are
// single PTX instructions (cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32, cvt.rn.f16x2.{e4m3x2,e5m2x2});
// on older GPUs cuda_fp8.h computes the same bits in software. (Checked on an H100 over all 2^32
// float32 inputs of both formats: the instruction and cuda_fp8.h's software path, as compute_80
// PTX builds it, agree on every byte, and for E4M3 so does the hand-written encoder NVFP4 used
// before; tests/test_fp8_reference.py checks tests/reference.py's fp8_encode against brute-force
// rounding.)
#pragma once

#include <cuda_fp8.h>

#include "kernels/core/common.cuh"

namespace ck {

// The edge of FP8's scale blocks (CK_PER_BLOCK_1X128, CK_PER_BLOCK_128X128): the quantizers'
// blocks and the FP8 GEMM's k-blocks.
constexpr int64_t kFp8Block = 128;

constexpr float kE4M3Max = 448.f;     // S.1111.110
constexpr float kE5M2Max = 57344.f;   // S.11110.11
constexpr uint32_t kFp8Nan = 0x7F;    // what the encoders write for every NaN, of either sign

// The quantization format of one FP8 flavour, in the shape of the integer formats of
// int4_params.cuh (kMax: the largest code value, so that make_params gives amax / kMax), plus
// the smallest scale it keeps: make_params turns a subnormal scale into 1, as it does a zero
// one, so that 1 / scale stays finite (an infinite reciprocal would make 0 * inf = NaN of the
// zeros of a scope whose amax is below kMax * 2^-126).
template <ck_fp8_format_t F> struct Fp8 {
    static constexpr ck_fp8_format_t kFormat = F;
    static constexpr int kMax = F == CK_FP8_E4M3 ? 448 : 57344;
    static constexpr int kMin = -kMax;
    static constexpr bool kAsym = false;
    static constexpr float kMinScale = 0x1p-126f;  // FLT_MIN, the smallest normal float32
};
static_assert(float(Fp8<CK_FP8_E4M3>::kMax) == kE4M3Max &&
                  float(Fp8<CK_FP8_E5M2>::kMax) == kE5M2Max,
              "the formats' largest finite values");

template <class Fmt> struct is_fp8 : std::false_type {};
template <ck_fp8_format_t F> struct is_fp8<Fp8<F>> : std::true_type {};

// Calls f(Fp8<CK_FP8_E4M3>{}) or f(Fp8<CK_FP8_E5M2>{}) (the entry points validated the format).
template <typename F> cudaError_t dispatch_fp8_format(ck_fp8_format_t format, F&& f) {
    return format == CK_FP8_E5M2 ? f(Fp8<CK_FP8_E5M2>{}) : f(Fp8<CK_FP8_E4M3>{});
}

template <ck_fp8_format_t F>
constexpr __nv_fp8_interpretation_t kFp8Interpretation = F == CK_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3;

// Two float32 values -> two FP8 bytes (lo in bits 0-7, hi in bits 8-15): round to nearest, ties
// to even; a finite value past the format's largest and +-inf saturate to +-max (E4M3 0x7E /
// 0xFE, E5M2 0x7B / 0xFB: cvt's .satfinite); every NaN gives 0x7F; -0.0, and a negative value
// that rounds to zero, give 0x80. (cvt.rn.satfinite.e4m3x2.f32 takes hi first.)
template <ck_fp8_format_t F> __device__ __forceinline__ uint32_t fp8x2_encode(float lo, float hi) {
    return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, kFp8Interpretation<F>);
}

template <ck_fp8_format_t F> __device__ __forceinline__ uint32_t fp8_encode(float x) {
    return fp8x2_encode<F>(x, 0.f) & 0xFF;
}

// Two FP8 bytes (the first in bits 0-7) -> their values, exact (through fp16, which holds every
// FP8 value): NaN codes give NaN, E5M2's 0x7C / 0xFC give +-inf.
template <ck_fp8_format_t F> __device__ __forceinline__ float2 fp8x2_value(uint32_t pair) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), kFp8Interpretation<F>);
    return __half22float2(__half2(h));
}

}  // namespace ck
