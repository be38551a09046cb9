// common.cuh - helpers shared by every kernel family: dtype conversions, 8-element chunk
// loads/stores, team reductions and the 2-D row launch shape. Nothing here is exported.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "cuda_kernels.h"

namespace ck {

// ---------------------------------------------------------------------------------------------
// Host-side helpers
// ---------------------------------------------------------------------------------------------
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool is_aligned(const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Number of multiprocessors of the current device (cached per device; 0 on error).
int sm_count();

// A launcher's plan forced through the environment (cuda_kernels.h names the variables; for
// tests and benchmarks): the value of `name` if it spells one of `allowed`, else 0.
int forced_plan_value(const char* name, std::initializer_list<int> allowed);

// The compute capability of the current device as major * 10 + minor (cached; 0 on error).
int compute_capability();

// Output tiles numbered along one grid dimension: 2^31 - 1 blocks at most (gridDim.y would cap
// M or N at 65535 tiles).
inline bool grid_fits(int64_t blocks) { return blocks >= 1 && blocks <= INT32_MAX; }
// The 1-D grid of one block per bm x bn tile of an [m, n] output, or 0 where that many blocks do
// not fit a grid (the launcher returns cudaErrorInvalidConfiguration).
inline unsigned tile_grid(int64_t m, int64_t n, int bm, int bn) {
    const int64_t blocks = ceil_div(m, bm) * ceil_div(n, bn);
    return grid_fits(blocks) ? unsigned(blocks) : 0u;
}
// Launches kernel(args...) over that grid, `threads` threads and smem_bytes of dynamic shared
// memory per block (the caller opted in above 48 KB), and checks the launch.
template <class Kernel, class... Args>
cudaError_t launch_tile_grid(Kernel kernel, int64_t m, int64_t n, int bm, int bn, int threads,
                             int smem_bytes, cudaStream_t stream, Args... args) {
    const unsigned blocks = tile_grid(m, n, bm, bn);
    if (blocks == 0) return cudaErrorInvalidConfiguration;
    kernel<<<blocks, threads, smem_bytes, stream>>>(args...);
    return cudaGetLastError();
}

// Launches kernel(args...) as a programmatic dependent of the stream's previous kernel where the
// GPU has that (compute capability 9.0 and newer): its blocks may start before that kernel ends,
// and the kernel must call wait_for_prior_grid() (ptx.cuh) before it touches global memory that
// kernel may read or write. Elsewhere, an ordinary launch. Allowed during graph capture (a programmatic edge).
template <class Kernel, class... Args>
cudaError_t launch_dependent(Kernel kernel, dim3 grid, dim3 block, int smem_bytes,
                             cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attribute[1] = {};
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid, config.blockDim = block;
    config.dynamicSmemBytes = size_t(smem_bytes), config.stream = stream;
    config.attrs = attribute, config.numAttrs = compute_capability() >= 90 ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, args...);
}

// The most dynamic shared memory a block may opt in to on the current device (cached per device;
// 0 on error).
int max_smem_optin();

// A kernel that wants more than the default 48 KB of dynamic shared memory must opt in; cheap, and
// allowed during graph capture.
template <class Kernel> cudaError_t allow_dynamic_smem(Kernel kernel, int bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// The same, once per device (the attribute belongs to the function on that device): `done` is
// one bit per device, a static of the caller for one kernel and size. For launches where the
// host-side call would show (microsecond kernels).
template <class Kernel>
cudaError_t allow_dynamic_smem_once(Kernel kernel, int bytes, std::atomic<uint64_t>& done) {
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
    if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
    e = allow_dynamic_smem(kernel, bytes);
    if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
    return e;
}

// Calls f(std::true_type) or f(std::false_type): turns a run-time flag into a template argument.
template <typename F> cudaError_t with_bool(bool flag, F&& f) {
    return flag ? f(std::true_type{}) : f(std::false_type{});
}

// Grouped rasterization of a 1-D grid over [tiles_m, tiles_n] output tiles: consecutive blocks
// sweep group_m tile rows of one tile column, so that the weight columns (and activation rows)
// they share are still in L2. Returns the tile's first row and column.
struct TileOrigin {
    int64_t m0, n0;
};
__device__ __forceinline__ TileOrigin grouped_tile(int64_t block, int64_t m, int64_t n, int bm,
                                                   int bn, int group_m) {
    const int64_t tiles_m = ceil_div(m, bm), tiles_n = ceil_div(n, bn);
    const int64_t per_group = int64_t(group_m) * tiles_n;
    const int64_t first_m = block / per_group * group_m;
    const int64_t group_rows = min(tiles_m - first_m, int64_t(group_m));
    const int64_t in_group = block % per_group;
    return {(first_m + in_group % group_rows) * bm, in_group / group_rows * bn};
}

// ---------------------------------------------------------------------------------------------
// Element conversions. float is the compute type of every kernel; rounding to 16-bit types is
// round-to-nearest-even, as tests/reference.py does it.
// ---------------------------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// Dispatches a ck_dtype_t (fp32, fp16, bf16) to a callable templated on the element type.
template <typename F> cudaError_t dispatch_float_dtype(ck_dtype_t dtype, F&& f) {
    switch (dtype) {
        case CK_DTYPE_FP32: return f(float{});
        case CK_DTYPE_FP16: return f(__half{});
        case CK_DTYPE_BF16: return f(__nv_bfloat16{});
        default: return cudaErrorInvalidValue;  // the entry points reject these earlier
    }
}

// The same for the 16-bit float types (fp16, bf16): the W4A16 kernels' activations and scales.
template <typename F> cudaError_t dispatch_half_dtype(ck_dtype_t dtype, F&& f) {
    switch (dtype) {
        case CK_DTYPE_FP16: return f(__half{});
        case CK_DTYPE_BF16: return f(__nv_bfloat16{});
        default: return cudaErrorInvalidValue;  // the entry points reject these earlier
    }
}

// ---------------------------------------------------------------------------------------------
// 8-element chunks: the unit of work of the element-wise and quantization kernels. A thread
// handles the 8 consecutive elements [c0, c0 + 8) of a row; `n` of them are inside the row.
// kVec (chosen by the launcher when cols % 8 == 0 and every base pointer is 16-byte aligned)
// turns each chunk into one or two 16-byte accesses; otherwise elements go one at a time with
// bounds checks, which serves any shape and any element-aligned pointer.
// ---------------------------------------------------------------------------------------------
constexpr int kChunk = 8;

template <typename T> struct alignas(16) Chunk { T v[kChunk]; };

// Loads a chunk in its storage type (half the registers of floats for 16-bit types).
template <typename T, bool kVec>
__device__ __forceinline__ void load_raw_chunk(const T* p, int n, Chunk<T>& c) {
    if constexpr (kVec) {
        c = *reinterpret_cast<const Chunk<T>*>(p);
    } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) c.v[i] = i < n ? p[i] : from_float<T>(0.f);
    }
}

template <typename T>
__device__ __forceinline__ void chunk_to_float(const Chunk<T>& c, float (&v)[kChunk]) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = to_float(c.v[i]);
}

// bfloat16 is the upper half of a float32: widen two packed values with a shift and a mask.
// (Through __bfloat162float, ptxas needed ~115 registers for a row cached in registers and
// spilled under the row kernel's 64-register cap; with plain integer operations it needs 64.)
template <>
__device__ __forceinline__ void chunk_to_float(const Chunk<__nv_bfloat16>& c, float (&v)[kChunk]) {
    uint32_t w[kChunk / 2];
    memcpy(w, &c, sizeof w);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

template <typename T, bool kVec>
__device__ __forceinline__ void load_chunk(const T* p, int n, float (&v)[kChunk]) {
    Chunk<T> c;
    load_raw_chunk<T, kVec>(p, n, c);
    chunk_to_float(c, v);
}

template <typename T, bool kVec>
__device__ __forceinline__ void store_chunk(T* p, int n, const float (&v)[kChunk]) {
    if constexpr (kVec) {
        Chunk<T> c;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) c.v[i] = from_float<T>(v[i]);
        *reinterpret_cast<Chunk<T>*>(p) = c;
    } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            if (i < n) p[i] = from_float<T>(v[i]);
    }
}

// int8 codes: 8 bytes per chunk (one 8-byte access on the vector path).
template <bool kVec>
__device__ __forceinline__ void store_int8_chunk(int8_t* p, int n, const int (&q)[kChunk]) {
    if constexpr (kVec) {
        uint2 w;
        w.x = (q[0] & 0xFF) | (q[1] & 0xFF) << 8 | (q[2] & 0xFF) << 16 | uint32_t(q[3]) << 24;
        w.y = (q[4] & 0xFF) | (q[5] & 0xFF) << 8 | (q[6] & 0xFF) << 16 | uint32_t(q[7]) << 24;
        *reinterpret_cast<uint2*>(p) = w;
    } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            if (i < n) p[i] = static_cast<int8_t>(q[i]);
    }
}

template <bool kVec>
__device__ __forceinline__ void load_int8_chunk(const int8_t* p, int n, int (&q)[kChunk]) {
    if constexpr (kVec) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = static_cast<int8_t>(w.x >> (8 * i));
            q[i + 4] = static_cast<int8_t>(w.y >> (8 * i));
        }
    } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) q[i] = i < n ? p[i] : 0;
    }
}

// Packed int4 codes: element 2i in the low nibble of byte i, 2i+1 in the high nibble; 4 bytes
// per chunk (one 4-byte access on the vector path). `p` points at the chunk's first byte.
// A missing high nibble (odd row length) is written as 0.
template <bool kVec>
__device__ __forceinline__ void store_int4_chunk(uint8_t* p, int n, const int (&q)[kChunk]) {
    uint32_t w = 0;
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
        if (kVec || i < n) w |= uint32_t(q[i] & 0xF) << (4 * i);
    if constexpr (kVec) {
        *reinterpret_cast<uint32_t*>(p) = w;
    } else {
        for (int b = 0; b < (n + 1) / 2; ++b) p[b] = static_cast<uint8_t>(w >> (8 * b));
    }
}

// Loads 8 nibbles; kSigned sign-extends them from two's complement.
template <bool kVec, bool kSigned>
__device__ __forceinline__ void load_int4_chunk(const uint8_t* p, int n, int (&q)[kChunk]) {
    uint32_t w = 0;
    if constexpr (kVec) {
        w = *reinterpret_cast<const uint32_t*>(p);
    } else {
        for (int b = 0; b < (n + 1) / 2; ++b) w |= uint32_t(p[b]) << (8 * b);
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
        const int nibble = (w >> (4 * i)) & 0xF;
        q[i] = kSigned ? (nibble ^ 8) - 8 : nibble;
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions. fminf/fmaxf return the non-NaN operand, so NaNs drop out.
// ---------------------------------------------------------------------------------------------
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinOp {
    __device__ float operator()(float a, float b) const { return fminf(a, b); }
};
struct SumOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// Over a team of kTeam consecutive lanes of one warp (kTeam a power of two <= 32). Every lane of
// the warp must call it: the mask is the full warp.
template <int kTeam, class Op> __device__ __forceinline__ float team_reduce(float v, Op op) {
    static_assert(kTeam >= 1 && kTeam <= 32 && (kTeam & (kTeam - 1)) == 0, "team within a warp");
#pragma unroll
    for (int o = kTeam / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Over a 1-D block of kThreads threads; every thread gets the result. `smem` holds kThreads / 32
// floats; the trailing barrier makes it reusable at once.
template <int kThreads, class Op>
__device__ __forceinline__ float block_reduce(float v, float* smem, Op op) {
    constexpr int kWarps = kThreads / 32;
    v = team_reduce<32>(v, op);
    if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    v = smem[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = op(v, smem[w]);
    __syncthreads();
    return v;
}

// ---------------------------------------------------------------------------------------------
// The 2-D launch shape of row-wise kernels: threadIdx.x walks the chunks of a row, threadIdx.y
// the rows. Narrow rows put several rows in one block, so every shape keeps 256 busy threads.
// Kernels loop (grid-stride) in both dimensions with block-uniform trip counts.
// ---------------------------------------------------------------------------------------------
constexpr int kBlockThreads = 256;
constexpr int64_t kMaxGridY = 65535;

struct RowLaunch {
    dim3 grid;
    dim3 block;
};

// min_team: the smallest block width (a team of threads that must share a row segment).
// max_blocks: cap on the number of blocks (0: one chunk per thread, no cap).
inline RowLaunch row_launch(int64_t rows, int64_t chunks, int min_team = 1, int64_t max_blocks = 0) {
    int bx = min_team;
    while (bx < kBlockThreads && bx < chunks) bx *= 2;
    const int by = kBlockThreads / bx;
    int64_t gx = std::min<int64_t>(ceil_div(chunks, bx), INT32_MAX);
    int64_t gy = std::min<int64_t>(ceil_div(rows, by), kMaxGridY);
    if (max_blocks > 0) {
        gy = std::min(gy, std::max<int64_t>(1, max_blocks / gx));
        gx = std::min(gx, std::max<int64_t>(1, max_blocks / gy));
    }
    return {dim3(unsigned(gx), unsigned(gy)), dim3(unsigned(bx), unsigned(by))};
}

}  // namespace ck
