// block4.cu - block 4-bit quantization: NF4 (bitsandbytes), MXFP4 (OCP Microscaling) and NVFP4
// (NVIDIA's two-level FP4), to and from fp32 / fp16 / bf16.
//
// What it computes: the formats of cuda_kernels.h ("Block 4-bit formats"), bit for bit as
// tests/reference.py defines them: every operation a float32 IEEE operation in the reference's
// order (no fused multiply-add: none of the expressions below adds a product; divisions are
// IEEE, nvcc's default -prec-div=true), rounding half to even.
//
// Layout: row-major x [rows, cols]; codes packed two per byte along the row,
// [rows, (cols + 1) / 2] (NF4: element 2i in the high nibble; MXFP4, NVFP4: in the low one);
// scales [rows, ceil(cols / block)], the last block of a row possibly partial.
//
// Algorithm: the unit of work is the 8-element chunk of common.cuh. Quantization needs each
// block's absmax before its codes, so a team of min(block / 8, 32) lanes of one warp owns a
// block: each lane loads its chunks (kPer of them, kTeam chunks apart so that the team's loads
// are coalesced), the team reduces with shuffles, then each lane encodes its chunks from
// registers: x is read once. Blocks of more than 1024 elements (NF4's 2048 and 4096) would
// need more registers than the kernel should take; their lanes load their chunks twice (the
// second time from L1/L2). Dequantization is element-wise (chunk_map.cuh): the chunk's codes
// and its block's scale in one load, the values in one store.
// NVFP4 with a computed global scale first reduces the whole tensor (quantize.cu's
// tensor_absmax) and turns the absmax into 2688 / amax on the device, then quantizes: x is read
// twice.
//
// Floors: a few operations per byte, so time is bytes / copy bandwidth: elements *
// (sizeof(input) + 1/2) + the scales for quantization, elements * (1/2 + sizeof(output)) +
// the scales for dequantization (+ one more read of x for NVFP4's computed global scale).
#include "kernels/quantize/block4.cuh"

#include "kernels/core/fp8.cuh"
#include "kernels/quantize/chunk_map.cuh"
#include "kernels/quantize/quantize.cuh"

namespace ck {
namespace {

// ---------------------------------------------------------------------------------------------
// Minifloat codecs, bit-exact to tests/reference.py (e2m1_*, e4m3_*, e8m0_*)
// ---------------------------------------------------------------------------------------------
// A power of two 2^k as a float32, for a normal exponent k (-126 <= k <= 127): exact.
__device__ __forceinline__ float pow2(int k) { return __uint_as_float(uint32_t(k + 127) << 23); }

// E2M1 (FP4: S.EE.M, exponent bias 1, no infinity or NaN): round to nearest, ties to even,
// saturating at 6. The magnitude code is the number of midpoints between neighbouring values
// that |x| passes; a tie goes to the even code, so an even-indexed midpoint (0.25, 1.25, 2.5, 5,
// whose lower neighbour has the even code) is passed only when exceeded. The sign is x's sign
// bit (-0.0 and negatives that round to 0 give 8); NaN gives 0.
__device__ __forceinline__ int e2m1_encode(float x) {
    const float mag = fabsf(x);
    const int code = (mag > 0.25f) + (mag >= 0.75f) + (mag > 1.25f) + (mag >= 1.75f) +
                     (mag > 2.5f) + (mag >= 3.5f) + (mag > 5.0f);
    return isnan(x) ? 0 : code | int(__float_as_uint(x) >> 31) << 3;
}

// The value of an E2M1 code: 0 and 0.5 (subnormal), else 2^(E - 1) * (1 + M / 2), built as
// float32 bits (no table: a lookup with a different index in every lane would serialize).
__device__ __forceinline__ float e2m1_value(int code) {
    const uint32_t m = code & 7;
    const uint32_t mag = m < 2 ? m * 0x3F000000u : ((m >> 1) + 126) << 23 | (m & 1) << 22;
    return __uint_as_float(mag | uint32_t(code & 8) << 28);
}

// FP8 E4M3 ('fn': bias 7, no infinity, S.1111.111 NaN) scales are encoded by fp8.cuh's
// fp8_encode<CK_FP8_E4M3>: ties to even, past 448 (and +-inf) saturating to 448, NaN 0x7F.
constexpr uint32_t kE4M3Nan = kFp8Nan;

__device__ __forceinline__ float e4m3_value(uint32_t bits) {
    if ((bits & 0x7F) == kE4M3Nan) return __uint_as_float(0x7FC00000u);
    const uint32_t biased = (bits >> 3) & 0xF, mantissa = bits & 7;
    const float mag = biased == 0 ? float(mantissa) * 0x1p-9f
                                  : __uint_as_float((biased + 127 - 7) << 23 | mantissa << 20);
    return bits & 0x80 ? -mag : mag;
}

constexpr uint32_t kE8M0Nan = 0xFF;
constexpr int kE8M0Bias = 127, kE8M0MinExp = -127;

// E8M0: 2^(bits - 127); 0x00 is the float32 subnormal 2^-127, 0xFF NaN.
__device__ __forceinline__ float e8m0_value(uint32_t bits) {
    if (bits == kE8M0Nan) return __uint_as_float(0x7FC00000u);
    return bits == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(bits << 23);
}

// ---------------------------------------------------------------------------------------------
// NF4: bitsandbytes' table and the float32 thresholds of its decision tree (dQuantizeNF4),
// written as hexadecimal literals: exactly reference.py's NF4_TABLE and NF4_THRESHOLDS.
// ---------------------------------------------------------------------------------------------
constexpr int kNf4Codes = 16;
__constant__ float kNf4Thresholds[kNf4Codes - 1] = {
    -0x1.b239b2p-1f, -0x1.38a4e0p-1f, -0x1.d70900p-2f, -0x1.5bd4ecp-2f, -0x1.e079d8p-3f,
    -0x1.1a7178p-3f, -0x1.74f0e2p-5f, 0x1.45f5fep-5f,  0x1.ec90c6p-4f,  0x1.a0cfc0p-3f,
    0x1.2b05a8p-2f,  0x1.8ea7f2p-2f,  0x1.00da06p-1f,  0x1.491b5ep-1f,  0x1.b913b2p-1f};
// In global memory, read through L1 (__ldg): a warp's 8 x 32 lookups fall in one 64-byte line,
// where constant memory would serialize the different indices.
__device__ const float kNf4Table[kNf4Codes] = {
    -0x1.000000p+0f, -0x1.647362p-1f, -0x1.0cd660p-1f, -0x1.946540p-2f,
    -0x1.23449ap-2f, -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0.0f,
    0x1.45f5fep-4f,  0x1.4995c6p-3f,  0x1.f809bap-3f,  0x1.5a0674p-2f,
    0x1.c34970p-2f,  0x1.200f56p-1f,  0x1.722766p-1f,  0x1.000000p+0f};

// The number of thresholds below y: bitsandbytes' binary decision tree, one `y > t` per level,
// gives exactly this count (NaN passes none: code 0).
__device__ __forceinline__ int nf4_encode(float y) {
    int code = 0;
#pragma unroll
    for (int i = 0; i < kNf4Codes - 1; ++i) code += y > kNf4Thresholds[i];
    return code;
}

// ---------------------------------------------------------------------------------------------
// The formats. Each says how a block's statistics become its stored scale and its encoding
// parameters, how an element is encoded, and how a code and a stored scale decode.
// ---------------------------------------------------------------------------------------------
// What a team gathers of its block: max |x| with NaN ignored (fmaxf returns the non-NaN
// operand), and whether any element is NaN or infinite (MXFP4's NaN blocks).
struct BlockStats {
    float amax = 0.f;
    float nonfinite = 0.f;  // 1 when some element is not finite (a float for team_reduce)
};

struct Nf4 {
    using Scale = float;
    static constexpr bool kHighFirst = true;  // element 2i in the high nibble (bitsandbytes)
    static constexpr bool kNonFinite = false;
    static constexpr bool kGlobal = false;
    struct Params {
        float inv;
    };
    // absmax as it is; inv = 1 / absmax (inf for a zero block, whose codes become 0: 0 * inf
    // is NaN, as in bitsandbytes).
    __device__ static Params params(const BlockStats& s, float, Scale& stored) {
        stored = s.amax;
        return {1.f / s.amax};
    }
    __device__ static int encode(float x, const Params& p) { return nf4_encode(x * p.inv); }
    __device__ static float block_scale(Scale s, float) { return s; }
    __device__ static float value(int code) { return __ldg(&kNf4Table[code]); }
};

constexpr int kE2M1Emax = 2;  // the exponent of E2M1's largest value, 6 = 1.5 * 2^2

// Shared by MXFP4 and NVFP4: E2M1 codes, element 2i in the low nibble.
struct Fp4Codes {
    static constexpr bool kHighFirst = false;
    __device__ static float value(int code) { return e2m1_value(code); }
};

struct Mxfp4 : Fp4Codes {
    using Scale = uint8_t;
    static constexpr bool kNonFinite = true;
    static constexpr bool kGlobal = false;
    struct Params {
        float inv;  // 2^-shared_exp
        bool nan_block;
    };
    // shared_exp = floor(log2 amax) - 2, clamped to E8M0's [-127, 127] (a zero block, and
    // amax below 2^-125, subnormals included, get -127); a block holding NaN or +-inf gets the
    // NaN scale and codes 0.
    __device__ static Params params(const BlockStats& s, float, Scale& stored) {
        if (s.nonfinite != 0.f) {
            stored = Scale(kE8M0Nan);
            return {1.f, true};
        }
        const int biased = int(__float_as_uint(s.amax) >> 23);  // amax >= 0 and finite
        const int shared = biased == 0 ? kE8M0MinExp : max(biased - 127 - kE2M1Emax, kE8M0MinExp);
        stored = Scale(shared + kE8M0Bias);
        return {pow2(-shared), false};  // -shared in [-125, 127]: a normal float32
    }
    __device__ static int encode(float x, const Params& p) {
        return p.nan_block ? 0 : e2m1_encode(x * p.inv);
    }
    __device__ static float block_scale(Scale s, float) { return e8m0_value(s); }
};

constexpr float kE2M1Max = 6.f;
constexpr float kNvfp4ScaleRange = kE4M3Max * kE2M1Max;  // 2688: g = 2688 / amax
constexpr float kSixth = 0x1.555556p-3f;                  // float32(1 / 6), as the kernels
                                                          // of TensorRT-LLM multiply

struct Nvfp4 : Fp4Codes {
    using Scale = uint8_t;
    static constexpr bool kNonFinite = false;
    static constexpr bool kGlobal = true;
    struct Params {
        float out;  // the factor from x to E2M1's range
    };
    // scale = e4m3(g * (amax * 1/6)); out = 1 / (e4m3_value * (1 / g)), 0 for a zero scale.
    __device__ static Params params(const BlockStats& s, float g, Scale& stored) {
        const uint32_t bits = fp8_encode<CK_FP8_E4M3>(g * (s.amax * kSixth));
        stored = Scale(bits);
        const float scale = e4m3_value(bits);
        return {scale == 0.f ? 0.f : 1.f / (scale * (1.f / g))};
    }
    __device__ static int encode(float x, const Params& p) { return e2m1_encode(x * p.out); }
    __device__ static float block_scale(Scale s, float g) { return e4m3_value(s) / g; }
};

static_assert(kNvfp4ScaleRange == 2688.f, "448 * 6, exactly");

template <class Fmt>
__device__ __forceinline__ void accumulate(BlockStats& s, const float (&v)[kChunk]) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
        s.amax = fmaxf(s.amax, fabsf(v[i]));
        if constexpr (Fmt::kNonFinite) s.nonfinite = isfinite(v[i]) ? s.nonfinite : 1.f;
    }
}

// Stores 8 codes at p (the chunk's first byte) in the format's nibble order. The high-first
// order (NF4) is the low-first one of each pair swapped; its pair count rounds n up to even,
// so that an odd row's last byte takes the code of the padding element (what bitsandbytes
// writes there). Low-first formats leave that nibble 0 (store_int4_chunk).
template <class Fmt, bool kVec>
__device__ __forceinline__ void store_codes(uint8_t* p, int n, const int (&codes)[kChunk]) {
    if constexpr (Fmt::kHighFirst) {
        int swapped[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; i += 2) {
            swapped[i] = codes[i + 1];
            swapped[i + 1] = codes[i];
        }
        store_int4_chunk<kVec>(p, min(n + (n & 1), kChunk), swapped);
    } else {
        store_int4_chunk<kVec>(p, n, codes);
    }
}

// ---------------------------------------------------------------------------------------------
// Quantization: a team of kTeam lanes per block of kTeam * kPer * 8 elements. The launch is
// row_launch's 2-D grid over (rows, blocks * kTeam lanes) with block widths that are multiples
// of kTeam; both loops stride by whole thread blocks, so their trip counts are block-uniform
// and every lane reaches the shuffles.
// ---------------------------------------------------------------------------------------------
constexpr int kMaxCachedChunks = 4;  // per lane: 32 floats held between the reduction and encode

template <int kBlock> struct TeamShape {
    static constexpr int kChunks = kBlock / kChunk;
    static constexpr int kTeam = kChunks < 32 ? kChunks : 32;
    static constexpr int kPer = kChunks / kTeam;
    static_assert(kBlock % kChunk == 0 && kTeam * kPer * kChunk == kBlock,
                  "a block is a whole number of chunks per lane");
};

template <class Fmt, typename T, int kTeam, int kPer, bool kVec>
__global__ void __launch_bounds__(kBlockThreads)
block4_quantize_kernel(const T* __restrict__ x, uint8_t* __restrict__ packed,
                       typename Fmt::Scale* __restrict__ scales,
                       const float* __restrict__ global_scale, int64_t rows, int64_t cols) {
    constexpr int64_t kBlock = int64_t(kTeam) * kPer * kChunk;
    constexpr bool kCached = kPer <= kMaxCachedChunks;
    const float g = Fmt::kGlobal ? *global_scale : 1.f;
    const int64_t blocks = ceil_div(cols, kBlock);
    const int64_t lanes = blocks * kTeam;
    const int64_t row_bytes = (cols + 1) / 2;
    const int lane = threadIdx.x % kTeam;
    for (int64_t rb = blockIdx.y * int64_t(blockDim.y); rb < rows; rb += int64_t(gridDim.y) * blockDim.y) {
        const int64_t r = rb + threadIdx.y;
        for (int64_t tb = blockIdx.x * int64_t(blockDim.x); tb < lanes; tb += int64_t(gridDim.x) * blockDim.x) {
            const int64_t b = (tb + threadIdx.x) / kTeam;  // this team's block
            const bool ok = r < rows && b < blocks;
            // Column of chunk i of this lane (chunk_count says how many of its elements lie
            // in the row).
            auto column = [&](int i) { return b * kBlock + (int64_t(i) * kTeam + lane) * kChunk; };
            float v[kCached ? kPer : 1][kChunk];
            BlockStats stats;
#pragma unroll
            for (int i = 0; i < kPer; ++i) {
                const int n = ok ? chunk_count(cols, column(i)) : 0;
                float(&vi)[kChunk] = v[kCached ? i : 0];
                if (n > 0) {
                    load_chunk<T, kVec>(x + r * cols + column(i), n, vi);
                    accumulate<Fmt>(stats, vi);
                }
            }
            stats.amax = team_reduce<kTeam>(stats.amax, MaxOp{});
            if constexpr (Fmt::kNonFinite) stats.nonfinite = team_reduce<kTeam>(stats.nonfinite, MaxOp{});
            if (!ok) continue;
            typename Fmt::Scale stored;
            const typename Fmt::Params p = Fmt::params(stats, g, stored);
            if (lane == 0) scales[r * blocks + b] = stored;
#pragma unroll
            for (int i = 0; i < kPer; ++i) {
                const int n = chunk_count(cols, column(i));
                if (n <= 0) continue;
                float(&vi)[kChunk] = v[kCached ? i : 0];
                if (!kCached) load_chunk<T, kVec>(x + r * cols + column(i), n, vi);
                int codes[kChunk];
#pragma unroll
                for (int k = 0; k < kChunk; ++k) codes[k] = Fmt::encode(vi[k], p);
                store_codes<Fmt, kVec>(packed + r * row_bytes + column(i) / 2, n, codes);
            }
        }
    }
}

template <class Fmt, int kBlock>
cudaError_t launch_quantize(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                            uint8_t* packed, typename Fmt::Scale* scales,
                            const float* global_scale, cudaStream_t stream) {
    using Shape = TeamShape<kBlock>;
    return dispatch_float_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(vector_ok(cols, x, 16, packed, 4), [&](auto vec) {
            const RowLaunch l = row_launch(rows, ceil_div(cols, kBlock) * Shape::kTeam, Shape::kTeam);
            block4_quantize_kernel<Fmt, T, Shape::kTeam, Shape::kPer, vec>
                <<<l.grid, l.block, 0, stream>>>(static_cast<const T*>(x), packed, scales,
                                                 global_scale, rows, cols);
            return cudaGetLastError();
        });
    });
}

// NVFP4's computed global scale: the absmax that tensor_absmax left in *g becomes 2688 / amax,
// or 1 where that is not a positive finite number (amax 0 or inf, or a quotient that overflows).
__global__ void nvfp4_global_scale_kernel(float* g) {
    const float scale = kNvfp4ScaleRange / *g;
    *g = isfinite(scale) && scale > 0.f ? scale : 1.f;
}

// ---------------------------------------------------------------------------------------------
// Dequantization: element-wise over chunks (chunk_map.cuh). A chunk (8 elements, starting at a
// multiple of 8) lies in one block: blocks are multiples of 8, so block_shift = log2(block)
// finds it.
// ---------------------------------------------------------------------------------------------
template <class Fmt, typename T, bool kVec>
struct Block4DecodeOp {
    static constexpr int kUnroll = 1;
    using Frag = ScaledCodes;
    const uint8_t* __restrict__ packed;
    const typename Fmt::Scale* __restrict__ scales;
    const float* __restrict__ global_scale;
    T* __restrict__ out;
    int64_t cols, blocks;
    int block_shift;
    float g;

    __device__ void begin_row(int64_t) { g = Fmt::kGlobal ? *global_scale : 1.f; }
    __device__ void load(int64_t r, int64_t c0, int n, Frag& f) const {
        f.scale = Fmt::block_scale(scales[r * blocks + (c0 >> block_shift)], g);
        int nibbles[kChunk];
        load_int4_chunk<kVec, false>(packed + r * ((cols + 1) / 2) + c0 / 2, n, nibbles);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) f.codes[i] = nibbles[Fmt::kHighFirst ? i ^ 1 : i];
    }
    __device__ void store(int64_t r, int64_t c0, int n, Frag& f) const {
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = Fmt::value(f.codes[i]) * f.scale;
        store_chunk<T, kVec>(out + r * cols + c0, n, v);
    }
};

template <class Fmt>
cudaError_t launch_dequantize(const uint8_t* packed, const typename Fmt::Scale* scales,
                              const float* global_scale, int64_t rows, int64_t cols, int64_t block,
                              void* out, ck_dtype_t dtype, cudaStream_t stream) {
    const int64_t blocks = ceil_div(cols, block);
    const int shift = __builtin_ctzll(uint64_t(block));
    return dispatch_float_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(vector_ok(cols, packed, 4, out, 16), [&](auto vec) {
            launch_map(Block4DecodeOp<Fmt, T, vec>{packed, scales, global_scale, static_cast<T*>(out),
                                                   cols, blocks, shift},
                       rows, cols, stream);
            return cudaGetLastError();
        });
    });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points for cuda_kernels.cu (arguments already validated)
// ---------------------------------------------------------------------------------------------
cudaError_t quantize_nf4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                         int64_t blocksize, uint8_t* packed, float* absmax, cudaStream_t stream) {
    auto launch = [&](auto block) {
        return launch_quantize<Nf4, decltype(block)::value>(x, dtype, rows, cols, packed, absmax,
                                                            nullptr, stream);
    };
    switch (blocksize) {
        case 32: return launch(std::integral_constant<int, 32>{});
        case 64: return launch(std::integral_constant<int, 64>{});
        case 128: return launch(std::integral_constant<int, 128>{});
        case 256: return launch(std::integral_constant<int, 256>{});
        case 512: return launch(std::integral_constant<int, 512>{});
        case 1024: return launch(std::integral_constant<int, 1024>{});
        case 2048: return launch(std::integral_constant<int, 2048>{});
        case 4096: return launch(std::integral_constant<int, 4096>{});
        default: return cudaErrorInvalidValue;  // the entry point rejects these earlier
    }
}

cudaError_t dequantize_nf4(const uint8_t* packed, const float* absmax, int64_t rows, int64_t cols,
                           int64_t blocksize, void* out, ck_dtype_t dtype, cudaStream_t stream) {
    return launch_dequantize<Nf4>(packed, absmax, nullptr, rows, cols, blocksize, out, dtype, stream);
}

cudaError_t quantize_mxfp4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                           uint8_t* packed, uint8_t* scales, cudaStream_t stream) {
    return launch_quantize<Mxfp4, kMxfp4Block>(x, dtype, rows, cols, packed, scales, nullptr,
                                               stream);
}

cudaError_t dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                             int64_t cols, void* out, ck_dtype_t dtype, cudaStream_t stream) {
    return launch_dequantize<Mxfp4>(packed, scales, nullptr, rows, cols, kMxfp4Block, out, dtype,
                                    stream);
}

cudaError_t quantize_nvfp4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                           bool dynamic, float* global_scale, uint8_t* packed, uint8_t* scales,
                           cudaStream_t stream) {
    if (dynamic) {
        const cudaError_t err = tensor_absmax(x, dtype, rows * cols, global_scale, stream);
        if (err != cudaSuccess) return err;
        nvfp4_global_scale_kernel<<<1, 1, 0, stream>>>(global_scale);
    }
    return launch_quantize<Nvfp4, kNvfp4Block>(x, dtype, rows, cols, packed, scales,
                                               global_scale, stream);
}

cudaError_t dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales,
                             const float* global_scale, int64_t rows, int64_t cols, void* out,
                             ck_dtype_t dtype, cudaStream_t stream) {
    return launch_dequantize<Nvfp4>(packed, scales, global_scale, rows, cols, kNvfp4Block, out,
                                    dtype, stream);
}

}  // namespace ck
