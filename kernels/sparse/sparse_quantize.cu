// sparse_quantize.cu - structured-sparse INT4 weights (2:4, 16:32 along K): prune, compress +
// quantize, dequantize, and the prepack of a 2:4 weight for the mma.sp GEMM.
//
// Formats: sparse_int4.cuh and cuda_kernels.h; tests/reference.py (sparse24_*, sparse1632_*) is
// the executable spec, and every kernel here matches it bit for bit.
//
// Algorithm. One thread per 32 dense k of a row (one metadata word): it reads the 32 values,
// picks the kept positions (non-zeros first, then the lowest zero positions, to half the block;
// a block with too many non-zeros keeps its first ones and counts as a violation), and for
// quantization reduces its 16 kept values' range with its group's other threads (group_size / 32
// consecutive threads, shuffles), so that the scale and zero point follow ck_quantize_int4's
// rule (int4_params.cuh) on the group's kept values. Codes go out as 8 bytes, the metadata as
// one word. Prepack: one thread per (16-row tile, 128-k chunk, lane) writes that lane's 16 bytes
// of codes and 8 bytes of metadata.
//
// Floors: one pass, bytes = n k (sizeof(in) + 3/8 + 2 * groups / k ...): these run once per
// weight, where a checkpoint is loaded, and are not tuned.
#include "kernels/quantize/int4_params.cuh"
#include "kernels/sparse/sparse_int4.cuh"

namespace ck {
namespace {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t items) {
    const int64_t per_gpu = int64_t(std::max(sm_count(), 1)) * 16;
    return unsigned(std::max<int64_t>(1, std::min(ceil_div(items, int64_t(kThreads)), per_gpu)));
}

// |w| as float, NaN below every number (the pruning key of reference.sparse_magnitude).
__device__ __forceinline__ float prune_key(float v) {
    const float a = fabsf(v);
    return a != a ? -1.f : a;
}

template <typename T>
__device__ __forceinline__ void load32(const T* p, float (&v)[kSparseWordK]) {
#pragma unroll
    for (int i = 0; i < kSparseWordK; ++i) v[i] = to_float(p[i]);
}

// ---------------------------------------------------------------------------------------------
// Prune: keep the block / 2 largest keys of every block (ties: lower k), +0 elsewhere.
// ---------------------------------------------------------------------------------------------
template <typename T, bool k1632>
__global__ void __launch_bounds__(kThreads) prune_kernel(const T* __restrict__ w,
                                                         T* __restrict__ out, int64_t words) {
    constexpr int kBlock = k1632 ? 32 : 4;
    for (int64_t item = blockIdx.x * int64_t(kThreads) + threadIdx.x; item < words;
         item += int64_t(gridDim.x) * kThreads) {
        const T* src = w + item * kSparseWordK;
        T* dst = out + item * kSparseWordK;
        float key[kSparseWordK];
#pragma unroll
        for (int i = 0; i < kSparseWordK; ++i) key[i] = prune_key(to_float(src[i]));
#pragma unroll
        for (int i = 0; i < kSparseWordK; ++i) {
            const int b0 = i / kBlock * kBlock;
            int rank = 0;  // keys before i in a stable descending sort of its block
#pragma unroll
            for (int j = 0; j < kBlock; ++j)
                rank += key[b0 + j] > key[i] || (key[b0 + j] == key[i] && b0 + j < i);
            dst[i] = rank < kBlock / 2 ? src[i] : from_float<T>(0.f);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Compress + quantize
// ---------------------------------------------------------------------------------------------
// The kept positions of one 32-k word: kept[j] (j < 16, ascending) and the word's metadata.
// Returns the number of blocks that had more than half non-zeros.
template <bool k1632>
__device__ __forceinline__ int select_kept(const float (&v)[kSparseWordK], int (&kept)[16],
                                           uint32_t& meta) {
    constexpr int kBlock = k1632 ? 32 : 4, kHalf = kBlock / 2;
    int violations = 0;
    meta = 0;
#pragma unroll
    for (int b = 0; b < kSparseWordK / kBlock; ++b) {
        uint32_t nonzero = 0;
#pragma unroll
        for (int i = 0; i < kBlock; ++i) nonzero |= uint32_t(v[b * kBlock + i] != 0.f) << i;
        const int count = __popc(nonzero);
        violations += count > kHalf;
        // Keep the first kHalf non-zeros, then the lowest zero positions up to kHalf.
        uint32_t keep = nonzero;
        for (int extra = count - kHalf; extra > 0; --extra)
            keep &= ~(1u << (31 - __clz(keep)));  // drop the highest kept non-zero
        for (int missing = kHalf - min(count, kHalf); missing > 0; --missing)
            keep |= 1u << (__ffs(~keep) - 1);     // add the lowest position not kept
        if constexpr (k1632) {
            meta = keep;
        } else {
            const uint32_t idx0 = __ffs(keep) - 1, idx1 = 31 - __clz(keep);
            meta |= (idx0 | idx1 << 2) << (4 * b);
        }
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) kept[j] = sparse_position<k1632>(meta, j);
    return violations;
}

template <typename T, bool k1632, class Fmt>
__global__ void __launch_bounds__(kThreads)
quantize_kernel(const T* __restrict__ w, SparseWeight out, int32_t* violations, int64_t words,
                int group_threads) {
    T* scales = static_cast<T*>(out.scales);
    const int64_t words_per_row = out.k / kSparseWordK;
    // A whole warp walks the items together (the group shuffles); items past `words` idle.
    for (int64_t base = blockIdx.x * int64_t(kThreads); base < words;
         base += int64_t(gridDim.x) * kThreads) {
        const int64_t item = base + threadIdx.x;
        const bool valid = item < words;
        float v[kSparseWordK] = {};
        if (valid) load32(w + item * kSparseWordK, v);
        int kept[16];
        uint32_t meta;
        const int bad = select_kept<k1632>(v, kept, meta);
        if (valid && bad && violations) atomicAdd(violations, bad);
        float kv[16];
        Range r;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            float x = 0.f;
#pragma unroll
            for (int p = 0; p < kSparseWordK; ++p) x = kept[j] == p ? v[p] : x;
            kv[j] = x;
            if constexpr (Fmt::kAsym) {
                r.lo = fminf(r.lo, x);
                r.hi = fmaxf(r.hi, x);
            } else {
                r.hi = fmaxf(r.hi, fabsf(x));
            }
        }
        for (int off = 1; off < group_threads; off *= 2) {  // the group's range (order-free)
            r.lo = fminf(r.lo, __shfl_xor_sync(0xffffffffu, r.lo, off));
            r.hi = fmaxf(r.hi, __shfl_xor_sync(0xffffffffu, r.hi, off));
        }
        if (!valid) continue;
        const QParams<T> qp = make_params<Fmt, T>(r);
        uint32_t packed[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int q = min(max(__float2int_rn(kv[j] * qp.inv) + qp.zero, Fmt::kMin), Fmt::kMax);
            packed[j / 8] |= (uint32_t(q) & 0xFu) << (4 * (j % 8));
        }
        *reinterpret_cast<uint2*>(out.codes + item * 8) = make_uint2(packed[0], packed[1]);
        out.meta[item] = meta;
        const int64_t row = item / words_per_row, word = item % words_per_row;
        if (word % group_threads == 0) {
            const int64_t g = row * (out.k / out.group_size) + word / group_threads;
            scales[g] = qp.stored;
            if constexpr (Fmt::kAsym) out.zeros[g] = uint8_t(qp.zero);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 16:32 -> 2:4: one thread per mask word.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads)
mask_to_24_kernel(const uint32_t* __restrict__ masks, uint32_t* __restrict__ meta,
                  int32_t* violations, int64_t words) {
    for (int64_t item = blockIdx.x * int64_t(kThreads) + threadIdx.x; item < words;
         item += int64_t(gridDim.x) * kThreads) {
        const uint32_t mask = masks[item];
        uint32_t word = 0;
        int bad = 0;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
            const uint32_t bits = mask >> (4 * b) & 0xFu;
            uint32_t nibble = kSparse24FirstTwo & 0xFu;  // positions 0 and 1
            if (__popc(bits) == 2)
                nibble = uint32_t(__ffs(bits) - 1) | uint32_t(31 - __clz(bits)) << 2;
            else
                ++bad;
            word |= nibble << (4 * b);
        }
        meta[item] = word;
        if (bad && violations) atomicAdd(violations, bad);
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantize: one thread per 32 dense k.
// ---------------------------------------------------------------------------------------------
template <typename T, bool k1632, bool kAsym>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(SparseWeight in, T* __restrict__ out,
                                                              int64_t words) {
    const T* scales = static_cast<const T*>(in.scales);
    const int64_t words_per_row = in.k / kSparseWordK;
    for (int64_t item = blockIdx.x * int64_t(kThreads) + threadIdx.x; item < words;
         item += int64_t(gridDim.x) * kThreads) {
        const int64_t row = item / words_per_row, k0 = item % words_per_row * kSparseWordK;
        const int64_t g = row * (in.k / in.group_size) + k0 / in.group_size;
        const float scale = to_float(scales[g]);
        const int zero = kAsym ? in.zeros[g] : 0;
        const uint8_t* codes = in.codes + row * (in.k / 4);
        const uint32_t* meta = in.meta + row * words_per_row;
#pragma unroll
        for (int h = 0; h < kSparseWordK; h += 8) {
            float wv[8];
            sparse_dense8<T, k1632, kAsym>(codes, meta, k0 + h, scale, zero, wv);
#pragma unroll
            for (int i = 0; i < 8; ++i) out[row * in.k + k0 + h + i] = from_float<T>(wv[i]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Prepack (2:4): see gemm_sparse_w4a16.cu for what the layout holds and why. One thread per
// (tile, chunk, lane).
// ---------------------------------------------------------------------------------------------
// Codes of row `row` (k/4 bytes per row), kept values v .. v + 1 of a block, as 2 nibbles, in the
// prepacked (unsigned) encoding; padding rows hold the zero code.
__device__ __forceinline__ uint32_t block_codes(const SparseWeight& in, int64_t row,
                                                int64_t value) {
    if (row >= in.n) return in.zeros ? 0u : 0x88u;  // padding rows: scale 0 makes them 0 anyway
    const uint8_t byte = in.codes[row * (in.k / 4) + value / 2];
    return in.zeros ? byte : byte ^ 0x88u;  // symmetric: two's complement q -> q + 8
}

__device__ __forceinline__ uint32_t block_meta(const SparseWeight& in, int64_t row, int64_t word) {
    return row < in.n ? in.meta[row * (in.k / kSparseWordK) + word] : kSparse24FirstTwo;
}

__global__ void __launch_bounds__(kThreads) prepack_kernel(SparsePrepackArgs a, int64_t items) {
    const SparseWeight& in = a.in;
    const int64_t chunks = in.k / kSparsePackK;
    uint4* codes_out = reinterpret_cast<uint4*>(a.w_out);
    uint2* meta_out = reinterpret_cast<uint2*>(a.w_out + sparse_prepacked_rows(in.n) * in.k / 4);
    for (int64_t item = blockIdx.x * int64_t(kThreads) + threadIdx.x; item < items;
         item += int64_t(gridDim.x) * kThreads) {
        const int lane = int(item % 32), g = lane / 4, t = lane % 4;
        const int64_t chunk = item / 32 % chunks, tile = item / 32 / chunks;
        const int64_t rows[2] = {tile * kSparsePackRows + g, tile * kSparsePackRows + g + 8};
        uint32_t words[4];
        uint32_t metas[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {        // 64-k halves of the chunk: two mma.sp k32 steps
#pragma unroll
            for (int r = 0; r < 2; ++r) {    // rows g, g + 8
                // Pairs p[j] = nibbles (j, j + 4) (Dequant<Int4Zp>): p[0] = step 0's block t,
                // p[1] = step 0's block t + 4, p[2], p[3] the same of step 1. A block's two
                // values are kept values 2b, 2b + 1 of its word: one byte.
                uint32_t w = 0;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int step = 2 * h + j / 2;
                    const int block = t + 4 * (j % 2);
                    const int64_t value = (chunk * 4 + step) * kSparseWordValues + 2 * block;
                    const uint32_t byte = block_codes(in, rows[r], value);
                    w |= (byte & 0xFu) << (4 * j) | (byte >> 4) << (4 * (j + 4));
                }
                words[2 * h + r] = w;
            }
            // Metadata of step 2h + t / 2 (selector t / 2 names lanes t = 2s, 2s + 1): lane
            // t % 2 = 0 holds blocks 0-3 (k 0 .. 15), t % 2 = 1 blocks 4-7, of row g in the low
            // 16 bits and of row g + 8 in the high 16.
            const int64_t word = chunk * 4 + 2 * h + t / 2;
            const int shift = 16 * (t % 2);
            metas[h] = (block_meta(in, rows[0], word) >> shift & 0xFFFFu) |
                       (block_meta(in, rows[1], word) >> shift) << 16;
        }
        codes_out[item] = make_uint4(words[0], words[1], words[2], words[3]);
        meta_out[item] = make_uint2(metas[0], metas[1]);
    }
}

// Scales and zeros: [tile][group][8][2], (g, r) = row tile * 16 + g + 8 r; padding scale 0 and
// zero 8.
template <typename T>
__global__ void __launch_bounds__(kThreads) prepack_scales_kernel(SparsePrepackArgs a,
                                                                  int64_t items) {
    const SparseWeight& in = a.in;
    const int64_t groups = in.k / in.group_size;
    const T* s = static_cast<const T*>(in.scales);
    T* so = static_cast<T*>(a.scales_out);
    for (int64_t item = blockIdx.x * int64_t(kThreads) + threadIdx.x; item < items;
         item += int64_t(gridDim.x) * kThreads) {
        const int slot = int(item % kSparsePackRows), g = slot / 2, r = slot % 2;
        const int64_t group = item / kSparsePackRows % groups;
        const int64_t tile = item / kSparsePackRows / groups;
        const int64_t row = tile * kSparsePackRows + g + 8 * r;
        const bool real = row < in.n;
        so[item] = real ? s[row * groups + group] : from_float<T>(0.f);
        if (a.zeros_out) a.zeros_out[item] = real ? in.zeros[row * groups + group] : 8;
    }
}

}  // namespace

cudaError_t sparse_prune(const void* w, const SparseWeight& shape, void* out, cudaStream_t stream) {
    const int64_t words = shape.n * (shape.k / kSparseWordK);
    return dispatch_float_dtype(shape.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(shape.k1632, [&](auto k1632) {
            prune_kernel<T, k1632><<<grid_for(words), kThreads, 0, stream>>>(
                static_cast<const T*>(w), static_cast<T*>(out), words);
            return cudaGetLastError();
        });
    });
}

cudaError_t sparse_quantize_int4(const void* w, const SparseWeight& out, int32_t* violations,
                                 cudaStream_t stream) {
    const int64_t words = out.n * (out.k / kSparseWordK);
    const int group_threads = int(out.group_size / kSparseWordK);
    if (violations) {
        const cudaError_t err = cudaMemsetAsync(violations, 0, sizeof(int32_t), stream);
        if (err != cudaSuccess) return err;
    }
    return dispatch_float_dtype(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(out.k1632, [&](auto k1632) {
            if (out.zeros)
                quantize_kernel<T, k1632, Int4Asym><<<grid_for(words), kThreads, 0, stream>>>(
                    static_cast<const T*>(w), out, violations, words, group_threads);
            else
                quantize_kernel<T, k1632, Int4Sym><<<grid_for(words), kThreads, 0, stream>>>(
                    static_cast<const T*>(w), out, violations, words, group_threads);
            return cudaGetLastError();
        });
    });
}

cudaError_t sparse_1632_to_24(const uint32_t* masks, int64_t n, int64_t k, uint32_t* meta,
                              int32_t* violations, cudaStream_t stream) {
    const int64_t words = n * (k / kSparseWordK);
    if (violations) {
        const cudaError_t err = cudaMemsetAsync(violations, 0, sizeof(int32_t), stream);
        if (err != cudaSuccess) return err;
    }
    mask_to_24_kernel<<<grid_for(words), kThreads, 0, stream>>>(masks, meta, violations, words);
    return cudaGetLastError();
}

cudaError_t sparse_dequantize_int4(const SparseWeight& in, void* out, cudaStream_t stream) {
    const int64_t words = in.n * (in.k / kSparseWordK);
    return dispatch_float_dtype(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_bool(in.k1632, [&](auto k1632) {
            return with_bool(in.zeros != nullptr, [&](auto asym) {
                dequantize_kernel<T, k1632, asym><<<grid_for(words), kThreads, 0, stream>>>(
                    in, static_cast<T*>(out), words);
                return cudaGetLastError();
            });
        });
    });
}

cudaError_t sparse_w4a16_prepack(const SparsePrepackArgs& args, cudaStream_t stream) {
    const int64_t tiles = sparse_prepacked_rows(args.in.n) / kSparsePackRows;
    const int64_t lanes = tiles * (args.in.k / kSparsePackK) * 32;
    prepack_kernel<<<grid_for(lanes), kThreads, 0, stream>>>(args, lanes);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t slots = tiles * (args.in.k / args.in.group_size) * kSparsePackRows;
    return dispatch_half_dtype(args.in.dtype, [&](auto tag) {
        using T = decltype(tag);
        prepack_scales_kernel<T><<<grid_for(slots), kThreads, 0, stream>>>(args, slots);
        return cudaGetLastError();
    });
}

}  // namespace ck
