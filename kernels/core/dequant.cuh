// w4a16_fragment.cuh - what every W4A16 kernel shares: int4 -> fp16/bf16 dequantization in
// registers, the 16-bit pair types, the output store and the prepacked weight layout (see
// ck_w4a16_prepack in cuda_kernels.h).
#pragma once

#include <cstring>

#include "kernels/core/common.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"
#include "kernels/core/ptx.cuh"

namespace ck {

// Calls f with a value of the element type of dtype (fp16 or bf16; fp32 is rejected earlier).
template <typename F> cudaError_t dispatch_half_dtype(ck_dtype_t dtype, F&& f) {
    switch (dtype) {
        case CK_DTYPE_FP16: return f(__half{});
        case CK_DTYPE_BF16: return f(__nv_bfloat16{});
        default: return cudaErrorInvalidValue;
    }
}

// The bits of a 16-bit float and back.
__device__ __forceinline__ uint16_t half_bits(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint16_t half_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

// Stores columns c and c + 1 of one output row (c + 1 may be past n): one 4-byte store when
// both are inside and the pair is 4-byte aligned, else one element at a time.
template <typename T>
__device__ __forceinline__ void store_out_pair(T* out, int64_t row, int64_t c, int64_t n,
                                               float v0, float v1, bool pair_aligned) {
    T* p = out + row * n + c;
    const T h0 = from_float<T>(v0);
    if (c + 1 < n) {
        const T h1 = from_float<T>(v1);
        if (pair_aligned) {
            *reinterpret_cast<uint32_t*>(p) = uint32_t(half_bits(h0)) | uint32_t(half_bits(h1)) << 16;
            return;
        }
        p[1] = h1;
    }
    p[0] = h0;
}

// ---------------------------------------------------------------------------------------------
// int4 -> fp16/bf16 in registers. A 32-bit word holds 8 codes, k = e (e < 8) in bits 4e..4e+3.
// It becomes 4 packed pairs p[j] = (k = j, k = j + 4) (j < 4): masking two nibbles that sit in
// the low bits of each 16-bit half and OR-ing in an exponent gives the float magic + u exactly
// (fp16: 1024 + u, mantissa step 1 at 1024; bf16: 128 + u, step 1 at 128), and subtracting
// magic + zero leaves u - zero exactly (a small integer). That the pairs are (j, j + 4) rather
// than adjacent k does not matter: x is permuted the same way (see the small-M kernel).
// The codes arrive biased: unsigned u with value u - zero (symmetric codes are XOR-ed with 8,
// which maps two's complement q to u = q + 8, with zero = 8).
// The final multiply by the scale is the only rounding: (u - zero) and scale are exact in the
// dtype, and __hmul2_rn rounds their exact product once to nearest even, which is the bits of
// round_to_dtype(float(q - zero) * float(scale)) (the product is exact in float32).
// ---------------------------------------------------------------------------------------------
template <typename T> struct Pair;
template <> struct Pair<__half> {
    using V = __half2;
};
template <> struct Pair<__nv_bfloat16> {
    using V = __nv_bfloat162;
};

template <typename T> __device__ __forceinline__ typename Pair<T>::V as_pair(uint32_t v) {
    typename Pair<T>::V r;
    memcpy(&r, &v, sizeof r);
    return r;
}
template <typename V> __device__ __forceinline__ uint32_t pair_bits(V v) {
    uint32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

constexpr uint32_t kNibbleLo = 0x000f000fu;  // nibble 0 of each 16-bit half
constexpr uint32_t kNibbleHi = 0x00f000f0u;  // nibble 1 of each 16-bit half
constexpr uint32_t kSymmetricBias = 0x88888888u;  // two's complement q -> u = q + 8
constexpr uint32_t kSymmetricZero = 8;

template <typename T>
__device__ __forceinline__ void dequant_word(uint32_t q, uint32_t zero, uint32_t scale2,
                                             uint32_t (&p)[4]);

// fp16: magic 1024 (0x6400). The high nibble of a byte is handled in place: 1024 + 16u, then
// one exact fma by 1/16 and -(64 + zero) (Marlin's trick) saves a shift.
template <>
__device__ __forceinline__ void dequant_word<__half>(uint32_t q, uint32_t zero, uint32_t scale2,
                                                     uint32_t (&p)[4]) {
    constexpr uint32_t kMagic = 0x64006400u;       // 1024, 1024
    constexpr uint32_t kSixteenth = 0x2c002c00u;   // 1/16, 1/16
    const __half2 sub = as_pair<__half>((0x6400u | zero) * 0x10001u);          // 1024 + zero
    const __half2 add = as_pair<__half>((0xd400u | (zero << 4)) * 0x10001u);   // -(64 + zero)
    const __half2 mul = as_pair<__half>(kSixteenth);
    const __half2 s = as_pair<__half>(scale2);
    const uint32_t q8 = q >> 8;
    const __half2 v0 = __hsub2(as_pair<__half>(and_or(q, kNibbleLo, kMagic)), sub);          // k 0, 4
    const __half2 v1 = __hfma2(as_pair<__half>(and_or(q, kNibbleHi, kMagic)), mul, add);     // k 1, 5
    const __half2 v2 = __hsub2(as_pair<__half>(and_or(q8, kNibbleLo, kMagic)), sub);         // k 2, 6
    const __half2 v3 = __hfma2(as_pair<__half>(and_or(q8, kNibbleHi, kMagic)), mul, add);    // k 3, 7
    p[0] = pair_bits(__hmul2_rn(v0, s));
    p[1] = pair_bits(__hmul2_rn(v1, s));
    p[2] = pair_bits(__hmul2_rn(v2, s));
    p[3] = pair_bits(__hmul2_rn(v3, s));
}

// bf16: magic 128 (0x4300). bf16 has 7 mantissa bits, so 16u does not fit below the exponent:
// every nibble is shifted down to bits 0..3 of its half first.
template <>
__device__ __forceinline__ void dequant_word<__nv_bfloat16>(uint32_t q, uint32_t zero,
                                                            uint32_t scale2, uint32_t (&p)[4]) {
    constexpr uint32_t kMagic = 0x43004300u;  // 128, 128
    const __nv_bfloat162 sub = as_pair<__nv_bfloat16>((0x4300u | zero) * 0x10001u);  // 128 + zero
    const __nv_bfloat162 s = as_pair<__nv_bfloat16>(scale2);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // pair j: k = j, j + 4
        const __nv_bfloat162 v =
            __hsub2(as_pair<__nv_bfloat16>(and_or(q >> (4 * j), kNibbleLo, kMagic)), sub);
        p[j] = pair_bits(__hmul2_rn(v, s));
    }
}

// What the weight-streaming (M <= 16) kernels take from a call, as a kernel argument.
struct StreamOperands {
    const void* x;
    const uint8_t* w;
    const void* scales;
    const uint8_t* zeros;
    int group_shift;  // group of k = k >> group_shift (62 when one group per row)
    int64_t groups;
    const void* bias;
    ck_activation_t activation;
    int64_t m, n, k;
    void* out;
    bool pair_aligned;  // n even and out 4-byte aligned: an output pair is one 4-byte store
};

inline StreamOperands stream_operands(const GemmW4A16Args& args) {
    StreamOperands a{};
    a.x = args.x;
    a.w = args.w;
    a.scales = args.scales;
    a.zeros = args.zeros;
    // One group per row (CK_GROUP_ROW, or a group size >= k): every k maps to group 0. Else
    // the group size is 32, 64 or 128, a divisor of the 128-k chunk.
    a.group_shift = args.groups == 1 ? 62 : args.group_size == 32 ? 5 : args.group_size == 64 ? 6 : 7;
    a.groups = args.groups;
    a.bias = args.bias;
    a.activation = args.activation;
    a.m = args.m;
    a.n = args.n;
    a.k = args.k;
    a.out = args.out;
    a.pair_aligned = args.n % 2 == 0 && is_aligned(args.out, 4);
    return a;
}

// The prepacked layout's constants and index functions are in kernels/gemm_w4a16.cuh.

}  // namespace ck
