// dequant.cuh - weight dequantization in registers, as a per-format trait: what every kernel
// that multiplies 16-bit activations by a quantized weight (W4A16 today; NF4, MXFP4, NVFP4 next)
// shares. A format is a tag type; Dequant<Format, T> turns one 32-bit word of eight 4-bit codes
// (k = e in bits 4e .. 4e + 3) into four packed pairs p[j] = (k j, k j + 4) of T, given the
// parameters of the word's block (Dequant<Format, T>::Block: its scale, and zero point where the
// format has one). Pairs (j, j + 4) rather than adjacent k: the kernels order x the same way
// (see the prepacked layout, gemm/w4a16_prepacked.cuh). A new format is one more tag and one
// more specialization here; the kernels' loads of the codes and block parameters stay theirs.
#pragma once

#include <cstring>

#include "kernels/core/common.cuh"
#include "kernels/core/ptx.cuh"

namespace ck {

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
__device__ __forceinline__ void dequant_int4_word(uint32_t q, uint32_t zero, uint32_t scale2,
                                                  uint32_t (&p)[4]);

// fp16: magic 1024 (0x6400). The high nibble of a byte is handled in place: 1024 + 16u, then
// one exact fma by 1/16 and -(64 + zero) (Marlin's trick) saves a shift.
template <>
__device__ __forceinline__ void dequant_int4_word<__half>(uint32_t q, uint32_t zero, uint32_t scale2,
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
__device__ __forceinline__ void dequant_int4_word<__nv_bfloat16>(uint32_t q, uint32_t zero,
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

// One pair alone: nibbles 0 and 4 of q (bits 0..3 and 16..19) -> (w of nibble 0, w of nibble 4)
// packed as T, the bits of pair 0 of dequant_int4_word<T> (the same exact u - zero, the same one
// rounding by the scale). Callers shift q right by 4j for pair j: for a kernel that needs one
// pair of a word rather than all four (the wgmma kernel, whose A fragment takes k 2t, 2t + 1).
template <typename T>
__device__ __forceinline__ uint32_t dequant_int4_pair(uint32_t q, uint32_t zero, uint32_t scale2) {
    static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
    // 1024 + u (fp16) or 128 + u (bf16): u sits in the mantissa's lowest bits, exactly.
    constexpr uint32_t kMagic = std::is_same_v<T, __half> ? 0x6400u : 0x4300u;
    const typename Pair<T>::V sub = as_pair<T>((kMagic | zero) * 0x10001u);  // magic + zero
    const typename Pair<T>::V v = __hsub2(as_pair<T>(and_or(q, kNibbleLo, kMagic * 0x10001u)), sub);
    return pair_bits(__hmul2_rn(v, as_pair<T>(scale2)));
}

// ---------------------------------------------------------------------------------------------
// The formats.
// ---------------------------------------------------------------------------------------------
// Int4Zp: unsigned 4-bit codes u with a zero point per group, w = (u - zero) * scale. Symmetric
// INT4 (two's complement q, w = q * scale) is this format with u = q ^ 8 = q + 8 and zero 8
// (kSymmetricBias, kSymmetricZero): the prepacked layout stores it so, and the interchange
// kernels flip the codes as they load them.
struct Int4Zp {};

template <class Format, typename T> struct Dequant;

template <typename T> struct Dequant<Int4Zp, T> {
    struct Block {
        uint32_t zero;    // the group's zero point, 0 .. 15
        uint32_t scale2;  // the group's scale (bits of T) in both 16-bit halves
    };
    __device__ __forceinline__ static void word(uint32_t q, const Block& b, uint32_t (&p)[4]) {
        dequant_int4_word<T>(q, b.zero, b.scale2, p);
    }
    // Pair 0 of q (nibbles 0 and 4), as word() computes it: shift q by 4j for pair j.
    __device__ __forceinline__ static uint32_t pair(uint32_t q, const Block& b) {
        return dequant_int4_pair<T>(q, b.zero, b.scale2);
    }
};

}  // namespace ck
