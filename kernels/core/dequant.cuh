// dequant.cuh - weight dequantization in registers, as a per-format trait: what every kernel
// that multiplies 16-bit activations by a quantized weight (INT4, NF4, MXFP4, NVFP4)
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

// The magic number of the INT4 conversions below (1024 as fp16, 128 as bf16), and magic + zero
// in both 16-bit halves: what the conversions subtract (1024 + zero for fp16, 128 + zero for
// bf16).
template <typename T>
constexpr uint32_t kInt4Magic = std::is_same_v<T, __half> ? 0x6400u : 0x4300u;
// (A zero point of 0 .. 16 shares no bit with the magic, nor 16 zero with dequant_int4_word's
// 0xd400, so the sums are the ORs they replace: one multiply-add per constant and group.)
template <typename T> __host__ __device__ constexpr uint32_t int4_pair_sub(uint32_t zero) {
    return zero * 0x10001u + kInt4Magic<T> * 0x10001u;
}

template <typename T>
__device__ __forceinline__ void dequant_int4_word(uint32_t q, uint32_t zero, uint32_t scale2,
                                                  uint32_t (&p)[4]);

// fp16: magic 1024 (0x6400). The high nibble of a byte is handled in place: 1024 + 16u, then
// one exact fma by 1/16 and -(64 + zero) (Marlin's trick) saves a shift.
template <>
__device__ __forceinline__ void dequant_int4_word<__half>(uint32_t q, uint32_t zero, uint32_t scale2,
                                                          uint32_t (&p)[4]) {
    constexpr uint32_t kMagic = kInt4Magic<__half> * 0x10001u;  // 1024, 1024
    constexpr uint32_t kSixteenth = 0x2c002c00u;               // 1/16, 1/16
    const __half2 sub = as_pair<__half>(int4_pair_sub<__half>(zero));          // 1024 + zero
    const __half2 add = as_pair<__half>(zero * 0x100010u + 0xd400d400u);      // -(64 + zero)
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
    constexpr uint32_t kMagic = kInt4Magic<__nv_bfloat16> * 0x10001u;  // 128, 128
    const __nv_bfloat162 sub = as_pair<__nv_bfloat16>(int4_pair_sub<__nv_bfloat16>(zero));
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
// The _sub form takes the subtrahend magic + zero (int4_pair_sub) already made, so that a kernel
// makes it once per group rather than once per pair.
template <typename T>
__device__ __forceinline__ uint32_t dequant_int4_pair_sub(uint32_t q, uint32_t sub2,
                                                          uint32_t scale2) {
    static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
    // magic + u: u sits in the mantissa's lowest bits, exactly; (magic + u) - (magic + zero) is
    // exact too.
    const typename Pair<T>::V v =
        __hsub2(as_pair<T>(and_or(q, kNibbleLo, kInt4Magic<T> * 0x10001u)), as_pair<T>(sub2));
    return pair_bits(__hmul2_rn(v, as_pair<T>(scale2)));
}

template <typename T>
__device__ __forceinline__ uint32_t dequant_int4_pair(uint32_t q, uint32_t zero, uint32_t scale2) {
    return dequant_int4_pair_sub<T>(q, int4_pair_sub<T>(zero), scale2);
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
    using Unit = uint16_t;  // the stored scale: bits of T
    static constexpr int kTableFloats = 0;  // no table (the block formats' interface, below)
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

// ---------------------------------------------------------------------------------------------
// Block 4-bit formats (ck_gemm_block4_prepacked): NF4, MXFP4, NVFP4, their codes in the prepacked
// INT4 layout and their block scales in their own encoding (cuda_kernels.h). Each dequantizes
// exactly as ck_dequantize_<format> does for the activation dtype T:
//   w' = round_to_T(float32(value(code) * block_scale))
// with value and block_scale the float32s of kernels/quantize/block4.cu (tests/reference.py's
// dequantize_<format>): the product is one float32 multiply (no fused add: nothing to contract),
// then one conversion to T (cvt.rn, overflow to inf, subnormals kept). So w' has the bits that
// ck_dequantize_<format> writes, for every scale, and nothing about the dtype's range needs a
// special case: an MXFP4 scale beyond fp16's range (E8M0 > 142) gives +-inf in fp16 as the
// dequantizer writes it. Two roundings where the reference has two (NF4's table value times a
// float32 absmax, NVFP4's e4m3 / g times an E2M1 value are not exact in float32): a single
// multiply in T would round differently now and then, which is why the product is float32.
//
// The interface beside Dequant<Int4Zp, T>'s: a stored scale unit (Unit, the 1-, 2- or 4-byte
// value of one row and one 32-k slice's scale group), a per-kernel table in shared memory
// (kTableFloats floats, filled once by fill_table before any word is dequantized), block()
// (the Block of word i, i < 4, of a lane's 32-k slice from the slice's unit), word(), which
// has Dequant<Int4Zp, T>::word's contract: word q (nibble e = prepacked_nibble_k(e) of its
// 8 k) -> pairs p[j] = (nibble j, nibble j + 4) packed as T, and pair(), word()'s p[0] alone
// (Dequant<Int4Zp, T>::pair's contract: the wgmma kernel takes one pair per word).
//
// A format with kFastPath (MXFP4, NVFP4) also has a fast path for the streaming and wgmma
// kernels (gemm_w4a16_prepacked_stream.cu, gemm_w4a16_prepacked_wgmma_sm90.cu): fast_word() (and
// fast_pair(), its p[0]) writes the bits word() writes, for less work per code, on the blocks
// fast_ok() accepts; fast_block() is its Block. The streaming kernel takes it for two tiles'
// words, the wgmma kernel for a 128-k chunk, when every lane's blocks are accepted (a warp vote,
// so the branch is uniform, as mma.sync and wgmma need) and word() (pair()) otherwise. word()
// stays the plain statement of the rounding (the reference kernel's path); fast_word says why
// its bits are the same. (An earlier NVFP4 shortcut, scale * 2^126 folded into the table for
// |scale| < 4 with a per-block vote, measured slower on the H100 at M = 16: its accepting test
// depended on each block's scale. The fast path below depends on the global scale only.)
// ---------------------------------------------------------------------------------------------
struct Nf4 {};
struct Mxfp4 {};
struct Nvfp4 {};

// bitsandbytes' NF4 code values (float32, hexadecimal: exactly tests/reference.py's NF4_TABLE
// and kernels/quantize/block4.cu's kNf4Table).
constexpr int kNf4Values = 16;
__host__ __device__ constexpr float nf4_value(int code) {
    constexpr float kValues[kNf4Values] = {
        -0x1.000000p+0f, -0x1.647362p-1f, -0x1.0cd660p-1f, -0x1.946540p-2f,
        -0x1.23449ap-2f, -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0.0f,
        0x1.45f5fep-4f,  0x1.4995c6p-3f,  0x1.f809bap-3f,  0x1.5a0674p-2f,
        0x1.c34970p-2f,  0x1.200f56p-1f,  0x1.722766p-1f,  0x1.000000p+0f};
    return kValues[code];
}

// Shift left by kShift bits (right for a negative kShift): the nibble moves below are
// compile-time shifts.
template <int kShift> __device__ __forceinline__ uint32_t shift_bits(uint32_t v) {
    if constexpr (kShift >= 0) return v << kShift;
    else return v >> -kShift;
}

// The E2M1 code in nibble kNibble of q (bits 4 kNibble .. + 3: sign, 2 exponent bits, 1
// mantissa bit) as a float32, exactly. Its magnitude bits placed at float32 bits 24 .. 22 (the
// exponent's two low bits and the mantissa's top bit) make the float32 value * 2^-126 for every
// code: exponent field E = e >= 1 gives 2^(E - 127) (1 + m / 2), E = 0 the subnormal m 2^-127,
// against E2M1's 2^(e - 1) (1 + m / 2) and m / 2. One exact multiply by 2^126 (a normal result,
// subnormal input kept: no -ftz) then gives the value, and the sign bit rides along.
template <int kNibble> __device__ __forceinline__ float e2m1_float(uint32_t q) {
    static_assert(kNibble >= 0 && kNibble < 8, "a 32-bit word holds 8 codes");
    const uint32_t mag = shift_bits<22 - 4 * kNibble>(q) & 0x01c00000u;
    const uint32_t sign = shift_bits<28 - 4 * kNibble>(q) & 0x80000000u;
    return __uint_as_float(mag | sign) * 0x1p126f;
}

// Two float32 values rounded to T (to nearest even) and packed: lo in the low 16 bits.
template <typename T> __device__ __forceinline__ uint32_t pack_rounded(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack_rounded<__half>(float lo, float hi) {
    return pair_bits(__floats2half2_rn(lo, hi));
}
template <> __device__ __forceinline__ uint32_t pack_rounded<__nv_bfloat16>(float lo, float hi) {
    return pair_bits(__floats2bfloat162_rn(lo, hi));
}

// Pair 0 of an E2M1 word (nibbles 0 and 4): both codes times the block's float32 scale, then
// rounded (dequant_e2m1_word's p[0]; the wgmma kernel takes one pair per word).
template <typename T>
__device__ __forceinline__ uint32_t dequant_e2m1_pair(uint32_t q, float scale) {
    return pack_rounded<T>(e2m1_float<0>(q) * scale, e2m1_float<4>(q) * scale);
}

// The word of an E2M1 format: every code times the block's float32 scale, then rounded.
template <typename T>
__device__ __forceinline__ void dequant_e2m1_word(uint32_t q, float scale, uint32_t (&p)[4]) {
    p[0] = dequant_e2m1_pair<T>(q, scale);
    p[1] = pack_rounded<T>(e2m1_float<1>(q) * scale, e2m1_float<5>(q) * scale);
    p[2] = pack_rounded<T>(e2m1_float<2>(q) * scale, e2m1_float<6>(q) * scale);
    p[3] = pack_rounded<T>(e2m1_float<3>(q) * scale, e2m1_float<7>(q) * scale);
}

// The sign bits of pair j (nibbles j and j + 4: bits 4j + 3 and 4j + 19) moved to bits 15 and
// 31, the sign bits of the packed pair (the caller masks them with kPairSigns): one shift for
// both nibbles.
constexpr uint32_t kPairSigns = 0x80008000u;
template <int kPair> __device__ __forceinline__ uint32_t e2m1_pair_signs(uint32_t q) {
    static_assert(kPair >= 0 && kPair < 4, "pairs (j, j + 4), j < 4");
    return shift_bits<12 - 4 * kPair>(q);
}

// E2M1 magnitudes straight in T: the three magnitude bits (2 exponent, 1 mantissa) placed as
// the lowest two exponent bits and the top mantissa bit of T make |value| * 2^-kExp for every
// code, as in e2m1_float (field e >= 1: 2^(e - bias) (1 + m / 2) = 2^(e - 1) (1 + m / 2) 2^-kExp;
// e = 0: the subnormal m / 2 * 2^(1 - bias) = m / 2 * 2^-kExp). fp16 (bias 15, 10 mantissa
// bits): bits 11 .. 9, 2^-14; bf16 (bias 127, 7 mantissa bits): bits 8 .. 6, 2^-126.
template <typename T> struct E2m1InT;
template <> struct E2m1InT<__half> {
    static constexpr int kLowBit = 9, kExp = 14;
};
template <> struct E2m1InT<__nv_bfloat16> {
    static constexpr int kLowBit = 6, kExp = 126;
};

// Pair j's two magnitudes (nibbles j and j + 4) as packed T, |value| * 2^-kExp: one shift and
// one mask.
template <typename T, int kPair> __device__ __forceinline__ uint32_t e2m1_pair_magnitudes(uint32_t q) {
    constexpr int kLow = E2m1InT<T>::kLowBit;
    return shift_bits<kLow - 4 * kPair>(q) & (0x7u << kLow) * 0x10001u;
}

// NF4: codes index bitsandbytes' 16 values; the unit is the block's float32 absmax (blocks of
// 32, 64 or 128 along K, one unit per block). The values sit in shared memory: 16 words in 16
// banks, so a warp's lookups never conflict (equal codes broadcast).
template <typename T> struct Dequant<Nf4, T> {
    using Unit = uint32_t;  // float32 bits of absmax
    static constexpr int kTableFloats = kNf4Values;
    struct Block {
        float scale;
        const float* table;  // nf4_value(0 .. 15), in shared memory
    };
    __device__ __forceinline__ static void fill_table(float* table, const float*) {
#pragma unroll
        for (int c = 0; c < kNf4Values; ++c)
            if (int(threadIdx.x) == c) table[c] = nf4_value(c);
    }
    __device__ __forceinline__ static Block block(uint32_t unit, int, const float* table) {
        return {__uint_as_float(unit), table};
    }
    // The table value times the float32 absmax, one rounding to T. No exact shortcut in T fits
    // NF4: its values are not symmetric (no sign trick) and neither they nor their products
    // with an arbitrary absmax are exact in T (two roundings).
    static constexpr bool kFastPath = false;
    // The codes' byte offsets in the table (code * 4) for all 8 nibbles from two shifts and two
    // masks: even nibble 2i's offset in byte i of `even`, odd nibble 2i + 1's in byte i of
    // `odd`; then one byte extraction per code (12 integer instructions per word, where a shift
    // and a mask per code take 16).
    __device__ __forceinline__ static void word(uint32_t q, const Block& b, uint32_t (&p)[4]) {
        const uint32_t even = (q << 2) & 0x3c3c3c3cu;
        const uint32_t odd = (q >> 2) & 0x3c3c3c3cu;
        p[0] = pack_rounded<T>(at<0>(even, b.table) * b.scale, at<2>(even, b.table) * b.scale);
        p[1] = pack_rounded<T>(at<0>(odd, b.table) * b.scale, at<2>(odd, b.table) * b.scale);
        p[2] = pack_rounded<T>(at<1>(even, b.table) * b.scale, at<3>(even, b.table) * b.scale);
        p[3] = pack_rounded<T>(at<1>(odd, b.table) * b.scale, at<3>(odd, b.table) * b.scale);
    }
    // Pair 0 of q (nibbles 0 and 4), as word() computes it: shift q by 4j for pair j (the
    // wgmma kernel's A fragment, as Dequant<Int4Zp, T>::pair). One shift and one mask per
    // code here: two codes do not pay for word()'s shared shifts.
    __device__ __forceinline__ static uint32_t pair(uint32_t q, const Block& b) {
        return pack_rounded<T>(value<0>(q, b.table) * b.scale, value<4>(q, b.table) * b.scale);
    }
    __device__ __forceinline__ static float load(const float* table, uint32_t offset) {
        return *reinterpret_cast<const float*>(reinterpret_cast<const char*>(table) + offset);
    }
    // The value whose byte offset is byte kByte of offsets (the other bytes zeroed: one PRMT).
    template <int kByte>
    __device__ __forceinline__ static float at(uint32_t offsets, const float* table) {
        return load(table, __byte_perm(offsets, 0u, 0x4440u | kByte));
    }
    // The value of nibble kNibble's code: its byte offset (code * 4, bits 2 .. 5) straight
    // from the word.
    template <int kNibble>
    __device__ __forceinline__ static float value(uint32_t q, const float* table) {
        return load(table, shift_bits<2 - 4 * kNibble>(q) & 0x3cu);
    }
};

// MXFP4: E2M1 codes; the unit is the 32-k block's E8M0 byte, 2^(s - 127) (0 is the float32
// subnormal 2^-127, 0xFF NaN), decoded in registers.
template <typename T> struct Dequant<Mxfp4, T> {
    using Unit = uint8_t;
    static constexpr int kTableFloats = 0;
    struct Block {
        float scale;
    };
    __device__ __forceinline__ static void fill_table(float*, const float*) {}
    __device__ __forceinline__ static Block block(uint32_t unit, int, const float*) {
        const uint32_t bits = unit == 0 ? 0x00400000u : unit == 0xffu ? 0x7fc00000u : unit << 23;
        return {__uint_as_float(bits)};
    }
    __device__ __forceinline__ static void word(uint32_t q, const Block& b, uint32_t (&p)[4]) {
        dequant_e2m1_word<T>(q, b.scale, p);
    }
    __device__ __forceinline__ static uint32_t pair(uint32_t q, const Block& b) {
        return dequant_e2m1_pair<T>(q, b.scale);
    }

    // The fast path, for scales up to 2 (s <= 128; past that, and NaN, word()): one T multiply
    // per pair. The scale is a power of two, so value * scale is exact in float32 and word()
    // rounds once, to T. Here |value| * 2^-kExp (E2m1InT, exact in T) times scale2 = the scale
    // times 2^kExp rounded to T, one rounding to nearest by __hmul2_rn (subnormals kept):
    //  - bf16: 2^(s - 1) is a normal bf16 for 0 <= s <= 128, so the product is the real
    //    value * scale, rounded once: word()'s bits;
    //  - fp16: 2^(s - 113) is an fp16 (normal or subnormal) for 89 <= s <= 128: the same. For
    //    s <= 88 it rounds to 0, and the product is +0; word()'s product is then below
    //    6 * 2^-39, under half the smallest fp16 subnormal (2^-25), and rounds to +-0 too.
    // No product reaches the overflow (|value| * scale <= 12). The sign: IEEE multiplication
    // gives the XOR of the operands' signs and round to nearest is symmetric, so the code's
    // sign bit XORed into the rounded magnitude gives the signed product's bits (products of a
    // non-negative scale: -0 codes give -0, as word()'s -0 * scale).
    static constexpr bool kFastPath = true;
    static constexpr uint32_t kMaxFastUnit = 127 + 1;  // 2^1
    struct FastBlock {
        uint32_t scale2;  // 2^(s - 127 + kExp) rounded to T, in both halves
    };
    __device__ __forceinline__ static bool fast_ok(uint32_t unit, const float*) {
        return unit <= kMaxFastUnit;
    }
    __device__ __forceinline__ static FastBlock fast_block(uint32_t unit, int, const float*) {
        // Exponent field s + kExp (>= 14, <= 254 for s <= 128): a normal float32, exactly.
        const float scaled = __uint_as_float((unit + E2m1InT<T>::kExp) << 23);
        return {pack_rounded<T>(scaled, scaled)};
    }
    // fast_word()'s p[0] alone (pair()'s contract).
    __device__ __forceinline__ static uint32_t fast_pair(uint32_t q, const FastBlock& b) {
        return and_xor(e2m1_pair_signs<0>(q), kPairSigns,
                       pair_bits(__hmul2_rn(as_pair<T>(e2m1_pair_magnitudes<T, 0>(q)),
                                            as_pair<T>(b.scale2))));
    }
    __device__ __forceinline__ static void fast_word(uint32_t q, const FastBlock& b, uint32_t (&p)[4]) {
        const typename Pair<T>::V s = as_pair<T>(b.scale2);
        p[0] = fast_pair(q, b);
        p[1] = and_xor(e2m1_pair_signs<1>(q), kPairSigns,
                       pair_bits(__hmul2_rn(as_pair<T>(e2m1_pair_magnitudes<T, 1>(q)), s)));
        p[2] = and_xor(e2m1_pair_signs<2>(q), kPairSigns,
                       pair_bits(__hmul2_rn(as_pair<T>(e2m1_pair_magnitudes<T, 2>(q)), s)));
        p[3] = and_xor(e2m1_pair_signs<3>(q), kPairSigns,
                       pair_bits(__hmul2_rn(as_pair<T>(e2m1_pair_magnitudes<T, 3>(q)), s)));
    }
};

// FP8 E4M3 ('fn': bias 7, no infinity, S.1111.111 NaN) as a float32: block4.cu's e4m3_value.
__device__ __forceinline__ float e4m3_float(uint32_t bits) {
    if ((bits & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u);
    const uint32_t biased = (bits >> 3) & 0xfu, mantissa = bits & 7u;
    const float mag = biased == 0 ? float(mantissa) * 0x1p-9f
                                  : __uint_as_float((biased + 127 - 7) << 23 | mantissa << 20);
    return bits & 0x80u ? -mag : mag;
}

// Pair j's two E2M1 codes (nibbles j and j + 4) as packed fp16, each exactly its value * 2^-14
// with its sign: E2m1InT<__half>'s magnitudes and the sign bits in place (four integer
// instructions for two codes, none of them a multiply).
template <int kPair> __device__ __forceinline__ uint32_t e2m1_pair_fp16_scaled(uint32_t q) {
    return e2m1_pair_magnitudes<__half, kPair>(q) | (e2m1_pair_signs<kPair>(q) & kPairSigns);
}

// NVFP4: E2M1 codes in blocks of 16; the unit holds a 32-k slice's two E4M3 bytes (block 2j in
// the low byte: words 0, 1 of the slice; 2j + 1 in the high byte: words 2, 3). The block scale
// s = e4m3 / g (float32, an IEEE division per block in ck_dequantize_nvfp4) takes one of 256
// values for the tensor's global scale g: the table holds all of them, computed once per
// thread block, so a word costs one shared load instead of a division; and after them the
// same 256 scales times 2^14, the fast path's.
//
// The fast path: one float32 multiply per code, without word()'s exponent fix-up. A pair of
// codes becomes fp16 value * 2^-14 (e2m1_pair_fp16_scaled: exact, subnormal for the codes
// 0 and +-0.5), converted exactly to float32 (cvt.f32.f16, two per pair), times s * 2^14
// from the table. Both operands are exact, so the product is the real value * s rounded once
// to float32: word()'s product, bit for bit (overflow to +-inf, subnormal results and the
// sign of zero included: IEEE multiplication; NaN scales give NaN in both). The one
// condition is that s * 2^14 is exact, i.e. finite: |s| <= 448 / |g| for every E4M3 byte
// (division rounds monotonically), so fast_ok checks the largest, 448 / g * 2^14, once per
// tensor (a g below ~2^-105, or NaN, takes word() everywhere; g = 0 too, whose scales are
// +-inf and NaN). Per pair of codes: 4 integer instructions, 2 conversions, 2 multiplies and
// the rounding to T, where word() spends about 4 integer instructions and 2 multiplies per
// code (SASS of the streaming kernel, benchmarks/NOTES.md).
template <typename T> struct Dequant<Nvfp4, T> {
    using Unit = uint16_t;
    static constexpr int kScales = 256;              // one per E4M3 byte
    static constexpr int kTableFloats = 2 * kScales;  // s, then s * 2^14
    static constexpr uint32_t kLargestE4m3 = 0x7e;   // 448
    static constexpr bool kFastPath = true;
    struct Block {
        float scale;
    };
    struct FastBlock {
        float scale14;  // the block's scale times 2^14
    };
    __device__ __forceinline__ static void fill_table(float* table, const float* global_scale) {
        const float g = *global_scale;
        for (int b = threadIdx.x; b < kScales; b += blockDim.x) {
            const float s = e4m3_float(b) / g;
            table[b] = s;
            table[kScales + b] = s * 0x1p14f;
        }
    }
    __device__ __forceinline__ static uint32_t scale_byte(uint32_t unit, int i) {
        return (unit >> (i < 2 ? 0 : 8)) & 0xffu;
    }
    __device__ __forceinline__ static Block block(uint32_t unit, int i, const float* table) {
        return {table[scale_byte(unit, i)]};
    }
    __device__ __forceinline__ static void word(uint32_t q, const Block& b, uint32_t (&p)[4]) {
        dequant_e2m1_word<T>(q, b.scale, p);
    }
    __device__ __forceinline__ static uint32_t pair(uint32_t q, const Block& b) {
        return dequant_e2m1_pair<T>(q, b.scale);
    }

    // The tensor's global scale, not the unit, decides (see above): false for NaN.
    __device__ __forceinline__ static bool fast_ok(uint32_t, const float* table) {
        return fabsf(table[kScales + kLargestE4m3]) < __int_as_float(0x7f800000);
    }
    __device__ __forceinline__ static FastBlock fast_block(uint32_t unit, int i,
                                                           const float* table) {
        return {table[kScales + scale_byte(unit, i)]};
    }
    template <int kPair>
    __device__ __forceinline__ static uint32_t fast_pair_of(uint32_t q, const FastBlock& b) {
        const float2 v = __half22float2(as_pair<__half>(e2m1_pair_fp16_scaled<kPair>(q)));
        return pack_rounded<T>(v.x * b.scale14, v.y * b.scale14);
    }
    // fast_word()'s p[0] alone (pair()'s contract).
    __device__ __forceinline__ static uint32_t fast_pair(uint32_t q, const FastBlock& b) {
        return fast_pair_of<0>(q, b);
    }
    __device__ __forceinline__ static void fast_word(uint32_t q, const FastBlock& b,
                                                     uint32_t (&p)[4]) {
        p[0] = fast_pair_of<0>(q, b);
        p[1] = fast_pair_of<1>(q, b);
        p[2] = fast_pair_of<2>(q, b);
        p[3] = fast_pair_of<3>(q, b);
    }
};

}  // namespace ck
