// int4_params.cuh - the integer quantization formats' ranges, the scale / zero-point rule and
// the encoder (cuda_kernels.h: "Quantization formats"), shared by the dense quantizers
// (quantize.cu, which applies the symmetric rule to FP8 too: fp8.cuh), the structured-sparse
// one (kernels/sparse/sparse_quantize.cu) and the KV cache's (kernels/attention/kv_cache.cu),
// so that all compute the same bits.
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/core/fp8.cuh"

namespace ck {

// kMinScale: a computed scale below it becomes 1, as a zero one does (0 for the integer
// formats: their subnormal scales stay; FP8's formats, fp8.cuh, set the smallest normal float).
struct Int8Sym {
    static constexpr int kMin = -127, kMax = 127;
    static constexpr bool kAsym = false;
    static constexpr float kMinScale = 0.f;
};
struct Int4Sym {
    static constexpr int kMin = -8, kMax = 7;
    static constexpr bool kAsym = false;
    static constexpr float kMinScale = 0.f;
};
struct Int4Asym {
    static constexpr int kMin = 0, kMax = 15;
    static constexpr bool kAsym = true;
    static constexpr float kMinScale = 0.f;
};

// Running statistics of a segment: the range [lo, hi] always contains 0, so for symmetric
// formats hi is the absmax of |x| and for asymmetric ones [lo, hi] is the range the format must
// cover. fminf/fmaxf return the non-NaN operand, so NaNs are ignored.
struct Range {
    float lo = 0.f, hi = 0.f;
};

// Quantization parameters of one segment: the scale as stored, its float32 reciprocal and the
// zero point. The scale is rounded to its storage type first, so that the codes are computed
// with exactly the scale a dequantizer will read back.
template <typename ScaleT>
struct QParams {
    ScaleT stored;
    float inv;
    int zero;
};

template <class Fmt, typename ScaleT>
__device__ __forceinline__ QParams<ScaleT> make_params(Range r) {
    // IEEE division (nvcc's default -prec-div=true), matching the reference bit for bit.
    const float steps = Fmt::kAsym ? float(Fmt::kMax - Fmt::kMin) : float(Fmt::kMax);
    const float span = Fmt::kAsym ? r.hi - r.lo : r.hi;
    QParams<ScaleT> p;
    p.stored = from_float<ScaleT>(span / steps);
    float scale = to_float(p.stored);
    // All-zero segment (or a scale below the storage type's range, or below kMinScale).
    if (scale == 0.f || scale < Fmt::kMinScale) {
        p.stored = from_float<ScaleT>(1.f);
        scale = 1.f;
    }
    p.inv = 1.f / scale;
    p.zero = Fmt::kAsym ? min(max(__float2int_rn(-r.lo * p.inv), Fmt::kMin), Fmt::kMax) : 0;
    return p;
}

// Segment statistics of a chunk: see Range.
template <class Fmt>
__device__ __forceinline__ void accumulate(Range& r, const float (&v)[kChunk]) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
        if constexpr (Fmt::kAsym) {
            r.lo = fminf(r.lo, v[i]);
            r.hi = fmaxf(r.hi, v[i]);
        } else {
            r.hi = fmaxf(r.hi, fabsf(v[i]));
        }
    }
}

// Integer codes: __float2int_rn rounds half to even and maps NaN to 0. FP8 codes: the bytes of
// fp8(x * inv), two at a time (fp8.cuh: ties to even, saturating, NaN 0x7F).
template <class Fmt>
__device__ __forceinline__ void encode(const float (&v)[kChunk], float inv, int zero,
                                       int (&q)[kChunk]) {
    if constexpr (is_fp8<Fmt>::value) {
#pragma unroll
        for (int i = 0; i < kChunk; i += 2) {
            const uint32_t pair = fp8x2_encode<Fmt::kFormat>(v[i] * inv, v[i + 1] * inv);
            q[i] = int(pair & 0xFF);
            q[i + 1] = int(pair >> 8 & 0xFF);
        }
    } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            q[i] = min(max(__float2int_rn(v[i] * inv) + zero, Fmt::kMin), Fmt::kMax);
    }
}

}  // namespace ck
