// benchmarks/bench.cuh - the benchmark harness every kernel family uses (header-only, one program).
//
// What it gives a family (see bench.cu for the registry and bench_quantize for a full example):
//   CK_BENCH_CHECK(call)       checks a cudaError_t, a ck_status_t or a cublasStatus_t; on failure
//                              prints file:line, the call and the reason (for ck_ calls
//                              ck_last_error_message()) and exits with status 1.
//   DeviceBuffer               an owning cudaMalloc'd buffer (move-only).
//   fill_uniform / fill_random_bytes
//                              device-side, hash-based random initialization (never zeros).
//   Bench::rotation_copies     how many copies of a problem's buffers to rotate through so that the
//                              rotated working set is >= kRotationL2Multiple x L2 (every call then
//                              reads DRAM, not L2).
//   Bench::time                warm-up, then reps each timed with its own CUDA event pair; median,
//                              min, max. The launch callback gets the iteration index (rotate
//                              buffers with `i % copies`) and must enqueue on bench.stream().
//   Bench::run                 filter -> time -> record a Row (bytes, flops, time, GB/s, % of the
//                              measured D2D copy bandwidth, optional baseline and ratio, note).
//   Bench::add_table           an extra small table for a family (e.g. dynamic / static ratios).
//   Bench::write_results       <out>/<gpu>.json and <out>/<gpu>.md (per-family sections).
//
// Roofline: at start-up the harness measures device-to-device cudaMemcpyAsync bandwidth once
// (kCopyBytes, counting bytes read + written, median of runs). A row's `bytes` is the minimum DRAM
// traffic of one call (everything read once + everything written once), so "% copy" says how close
// the kernel gets to what the memory system demonstrably sustains.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_kernels.h"

// ------------------------------------------------------------------------------------------------
// Constants
// ------------------------------------------------------------------------------------------------
constexpr int kExitFailure = 1;   // a CUDA / ck_ / cuBLAS call failed, or bad command-line options
constexpr int kExitNoDevice = 2;  // no CUDA device: distinct so that scripts can tell "skipped"

// The memory-bound targets are stated at >= 64M elements (8192 x 8192).
constexpr int64_t kDefaultSize = int64_t(64) << 20;
constexpr int64_t kQuickSize = int64_t(4) << 20;  // 2048 x 2048: a smoke test, not a measurement

constexpr int kDefaultWarmup = 10;
constexpr int kDefaultReps = 100;
constexpr int kQuickWarmup = 2;
constexpr int kQuickReps = 10;

// Copy roofline: >= 1 GiB so that L2 (50 MB on H100) plays no part; counted as read + written.
constexpr int64_t kCopyBytes = int64_t(1) << 30;
constexpr int64_t kMinCopyBytes = int64_t(256) << 20;  // fallback on GPUs with little free memory
constexpr int kCopyWarmup = 3;
constexpr int kCopyReps = 20;

// Rotate inputs until the working set is this many times L2: with LRU-like replacement, 2-3x is
// enough for a buffer touched again only after that much other traffic to have left L2.
constexpr double kRotationL2Multiple = 3.0;
constexpr int kMaxRotationCopies = 64;
// Never let rotation copies take more than this fraction of the free device memory.
constexpr double kMaxRotationMemoryFraction = 0.7;

constexpr double kBytesPerGB = 1e9;   // GB/s are decimal, like the vendor's and DESIGN.md's
constexpr double kBytesPerMB = 1e6;
constexpr double kBytesPerMiB = double(1 << 20);  // capacities (L2, memory) are binary
constexpr double kBytesPerGiB = double(1 << 30);
constexpr double kOpsPerTera = 1e12;

// ------------------------------------------------------------------------------------------------
// Error checks: one overload per status type, one macro for all of them.
// ------------------------------------------------------------------------------------------------
inline void bench_check(cudaError_t err, const char* expr, const char* file, int line) {
    if (err == cudaSuccess) return;
    std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, expr, cudaGetErrorName(err),
                 cudaGetErrorString(err));
    std::exit(kExitFailure);
}

inline void bench_check(ck_status_t status, const char* expr, const char* file, int line) {
    if (status == CK_STATUS_SUCCESS) return;
    std::fprintf(stderr, "%s:%d: %s failed: %s: %s\n", file, line, expr, ck_status_string(status),
                 ck_last_error_message());
    std::exit(kExitFailure);
}

inline void bench_check(cublasStatus_t status, const char* expr, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, expr,
                 cublasGetStatusName(status), cublasGetStatusString(status));
    std::exit(kExitFailure);
}

#define CK_BENCH_CHECK(call) bench_check((call), #call, __FILE__, __LINE__)

// ------------------------------------------------------------------------------------------------
// Small helpers: dtypes, formatting, shapes
// ------------------------------------------------------------------------------------------------
inline size_t dtype_size(ck_dtype_t dtype) {
    switch (dtype) {
        case CK_DTYPE_FP32: return 4;
        case CK_DTYPE_FP16: return 2;
        case CK_DTYPE_BF16: return 2;
        case CK_DTYPE_INT8: return 1;
        case CK_DTYPE_INT32: return 4;
        case CK_DTYPE_UINT8: return 1;
    }
    return 0;
}

inline const char* dtype_name(ck_dtype_t dtype) {
    switch (dtype) {
        case CK_DTYPE_FP32: return "fp32";
        case CK_DTYPE_FP16: return "fp16";
        case CK_DTYPE_BF16: return "bf16";
        case CK_DTYPE_INT8: return "int8";
        case CK_DTYPE_INT32: return "int32";
        case CK_DTYPE_UINT8: return "uint8";
    }
    return "?";
}

inline std::string format(const char* fmt, double value) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), fmt, value);
    return buf;
}

inline std::string shape_string(int64_t rows, int64_t cols) {
    return std::to_string(rows) + "x" + std::to_string(cols);
}

// "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3": lower case, runs of anything else -> '-'.
inline std::string sanitize_name(const std::string& name) {
    std::string out;
    for (unsigned char c : name) {
        if (std::isalnum(c)) {
            out += char(std::tolower(c));
        } else if (!out.empty() && out.back() != '-') {
            out += '-';
        }
    }
    while (!out.empty() && out.back() == '-') out.pop_back();
    return out.empty() ? "unknown-gpu" : out;
}

inline std::string cuda_version_string(int version) {  // 12080 -> "12.8"
    return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

inline std::string library_version_string(int version) {  // CK_VERSION encoding -> "0.1.0"
    return std::to_string(version / 10000) + "." + std::to_string((version / 100) % 100) + "." +
           std::to_string(version % 100);
}

inline std::string utc_now() {
    std::time_t now = std::time(nullptr);
    std::tm tm_utc{};
    gmtime_r(&now, &tm_utc);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm_utc);
    return buf;
}

// ------------------------------------------------------------------------------------------------
// Device memory and random initialization
// ------------------------------------------------------------------------------------------------
// An owning device allocation. Move-only; freed on destruction.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes_ > 0) CK_BENCH_CHECK(cudaMalloc(&ptr_, bytes_));
    }
    ~DeviceBuffer() {
        if (ptr_) cudaFree(ptr_);
    }
    DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
        std::swap(ptr_, other.ptr_);
        std::swap(bytes_, other.bytes_);
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    template <typename T = void>
    T* as() const { return static_cast<T*>(ptr_); }
    size_t bytes() const { return bytes_; }

  private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// The baselines' 16-byte fp16 vectors (8 halves): pair i (elements 2i, 2i + 1) as floats, and
// a vector from 4 float pairs, each rounded to nearest even (what the library's outputs do).
__device__ __forceinline__ float2 half8_pair(const uint4& v, int i) {
    return __half22float2(reinterpret_cast<const __half2*>(&v)[i]);
}
template <class Pair> __device__ __forceinline__ uint4 pack_half8(Pair&& pair) {
    uint4 packed;
    __half2* o = reinterpret_cast<__half2*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 v = pair(i);
        o[i] = __floats2half2_rn(v.x, v.y);
    }
    return packed;
}

namespace bench_detail {

constexpr int kFillThreads = 256;
constexpr int kFillMaxBlocks = 4096;  // grid-stride beyond this: enough to fill any GPU

// splitmix64's finalizer: a good 64-bit mix, so hash(seed, i) looks independent across i.
// Host code draws the same values (host-side inputs such as the MoE router logits).
__host__ __device__ inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

// Uniform in [0, 1) from the top 24 bits (a float's mantissa holds exactly 24).
__host__ __device__ inline float uniform01(uint64_t seed, int64_t i) {
    uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    return float(h >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__device__ inline T convert_from_float(float v) {
    if constexpr (std::is_same_v<T, float>) {
        return v;
    } else if constexpr (std::is_same_v<T, __half>) {
        return __float2half_rn(v);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __float2bfloat16_rn(v);
    } else {  // integer types: round to nearest; the caller's [lo, hi] is in range of T
        return T(lrintf(v));
    }
}

template <typename T>
__global__ void fill_uniform_kernel(T* out, int64_t n, uint64_t seed, float lo, float hi) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = convert_from_float<T>(lo + (hi - lo) * uniform01(seed, i));
    }
}

template <typename T>
void launch_fill_uniform(void* out, int64_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream) {
    const int64_t blocks = std::min<int64_t>((n + kFillThreads - 1) / kFillThreads, kFillMaxBlocks);
    fill_uniform_kernel<T><<<int(std::max<int64_t>(blocks, 1)), kFillThreads, 0, stream>>>(
        static_cast<T*>(out), n, seed, lo, hi);
    CK_BENCH_CHECK(cudaGetLastError());
}

}  // namespace bench_detail

// Fills n elements of `dtype` with values uniform in [lo, hi] (integers: rounded to nearest).
// Deterministic for a given seed; use a different seed per buffer so that copies differ.
inline void fill_uniform(void* out, ck_dtype_t dtype, int64_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream) {
    using namespace bench_detail;
    switch (dtype) {
        case CK_DTYPE_FP32: launch_fill_uniform<float>(out, n, seed, lo, hi, stream); return;
        case CK_DTYPE_FP16: launch_fill_uniform<__half>(out, n, seed, lo, hi, stream); return;
        case CK_DTYPE_BF16: launch_fill_uniform<__nv_bfloat16>(out, n, seed, lo, hi, stream); return;
        case CK_DTYPE_INT8: launch_fill_uniform<int8_t>(out, n, seed, lo, hi, stream); return;
        case CK_DTYPE_INT32: launch_fill_uniform<int32_t>(out, n, seed, lo, hi, stream); return;
        case CK_DTYPE_UINT8: launch_fill_uniform<uint8_t>(out, n, seed, lo, hi, stream); return;
    }
    std::fprintf(stderr, "fill_uniform: unknown dtype %d\n", int(dtype));
    std::exit(kExitFailure);
}

// Fills `bytes` bytes with uniform random bytes (e.g. packed INT4 codes: any byte is valid).
inline void fill_random_bytes(void* out, int64_t bytes, uint64_t seed, cudaStream_t stream) {
    // 255.49 so that lrintf maps [0, 255.49] onto all 256 values with (nearly) equal weight.
    fill_uniform(out, CK_DTYPE_UINT8, bytes, seed, -0.49f, 255.49f, stream);
}

// Copies an fp16 or bf16 buffer to the host as float (exact), after the stream's work.
inline std::vector<float> download_as_float(const DeviceBuffer& buf, ck_dtype_t dtype,
                                            cudaStream_t stream) {
    std::vector<uint16_t> bits(buf.bytes() / sizeof(uint16_t));
    CK_BENCH_CHECK(cudaMemcpyAsync(bits.data(), buf.as(), buf.bytes(), cudaMemcpyDeviceToHost,
                                   stream));
    CK_BENCH_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> values(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
        if (dtype == CK_DTYPE_BF16) {
            const uint32_t w = uint32_t(bits[i]) << 16;
            std::memcpy(&values[i], &w, sizeof(float));
        } else {
            values[i] = __half2float(__half_raw{bits[i]});
        }
    }
    return values;
}

// ||a - ref|| / ||ref|| in float64 (||a - ref|| when ref is all zeros; nan when a has non-finite
// values): how far a baseline's output is from another's, for a row's note.
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& ref) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double r = double(ref[i]);
        const double d = double(a[i]) - r;
        diff += d * d;
        norm += r * r;
    }
    return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// ------------------------------------------------------------------------------------------------
// Timing
// ------------------------------------------------------------------------------------------------
struct TimingConfig {
    int warmup = kDefaultWarmup;  // untimed launches first: clocks ramp up, caches and TLBs settle
    int reps = kDefaultReps;      // timed samples; the median is reported
    int batch = 1;                // launches per event pair (raise it for kernels of a few us)
};

struct Timing {
    double median_us = 0;
    double min_us = 0;
    double max_us = 0;
    int reps = 0;
};

// Enqueues one call on the bench stream. `iteration` counts every call (warm-up included), so
// `iteration % copies` rotates through buffer copies.
using Launch = std::function<void(int iteration)>;

// Warm-up, then `reps` samples each bracketed by its own event pair, all enqueued back to back and
// synchronized once at the end (no host round trip between samples).
inline Timing time_launches(const Launch& launch, const TimingConfig& config, cudaStream_t stream) {
    const int reps = std::max(config.reps, 1);
    const int batch = std::max(config.batch, 1);
    int iteration = 0;
    for (int i = 0; i < config.warmup; ++i) launch(iteration++);
    CK_BENCH_CHECK(cudaGetLastError());

    std::vector<cudaEvent_t> starts(reps), stops(reps);
    for (int i = 0; i < reps; ++i) {
        CK_BENCH_CHECK(cudaEventCreate(&starts[i]));
        CK_BENCH_CHECK(cudaEventCreate(&stops[i]));
    }
    for (int i = 0; i < reps; ++i) {
        CK_BENCH_CHECK(cudaEventRecord(starts[i], stream));
        for (int b = 0; b < batch; ++b) launch(iteration++);
        CK_BENCH_CHECK(cudaEventRecord(stops[i], stream));
    }
    CK_BENCH_CHECK(cudaGetLastError());
    CK_BENCH_CHECK(cudaStreamSynchronize(stream));

    std::vector<double> samples_us(reps);
    for (int i = 0; i < reps; ++i) {
        float ms = 0;
        CK_BENCH_CHECK(cudaEventElapsedTime(&ms, starts[i], stops[i]));
        samples_us[i] = double(ms) * 1e3 / batch;
        CK_BENCH_CHECK(cudaEventDestroy(starts[i]));
        CK_BENCH_CHECK(cudaEventDestroy(stops[i]));
    }
    std::sort(samples_us.begin(), samples_us.end());
    Timing t;
    t.reps = reps;
    t.min_us = samples_us.front();
    t.max_us = samples_us.back();
    t.median_us = (reps % 2 == 1) ? samples_us[reps / 2]
                                  : 0.5 * (samples_us[reps / 2 - 1] + samples_us[reps / 2]);
    return t;
}

// Copies needed so that `copies * bytes_per_call >= kRotationL2Multiple * L2`: a byte is touched
// again only after that much other traffic, so it has left L2 and every call reads DRAM.
inline int rotation_copies_for_l2(double bytes_per_call, int64_t l2_bytes) {
    if (bytes_per_call <= 0) return 1;
    const double copies = std::ceil(kRotationL2Multiple * double(l2_bytes) / bytes_per_call);
    return int(std::clamp(copies, 1.0, double(kMaxRotationCopies)));
}

// ------------------------------------------------------------------------------------------------
// Device description (the results' header)
// ------------------------------------------------------------------------------------------------
struct DeviceInfo {
    int ordinal = 0;
    std::string name;
    int sm_count = 0;
    int cc_major = 0;
    int cc_minor = 0;
    int64_t l2_bytes = 0;
    int64_t memory_bytes = 0;
    int driver_version = 0;   // CUDA driver API version, cudaDriverGetVersion (e.g. 13000)
    int runtime_version = 0;  // cudaRuntimeGetVersion
    std::string kernel_module;  // NVIDIA kernel module version (e.g. "580.65.06"), if readable
};

// The kernel module version from /proc/driver/nvidia/version ("... Kernel Module  580.65.06 ...");
// the runtime API has no call for it and linking NVML for one string is not worth it.
inline std::string read_kernel_module_version() {
    std::ifstream file("/proc/driver/nvidia/version");
    std::string line;
    if (!file || !std::getline(file, line)) return "";
    std::istringstream words(line.substr(std::min(line.find("Module"), line.size())));
    for (std::string word; words >> word;) {
        if (!word.empty() && std::isdigit((unsigned char)word[0]) &&
            word.find('.') != std::string::npos) {
            return word;
        }
    }
    return "";
}

inline DeviceInfo query_device(int ordinal) {
    DeviceInfo info;
    info.ordinal = ordinal;
    cudaDeviceProp prop{};
    CK_BENCH_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    info.name = prop.name;
    info.memory_bytes = int64_t(prop.totalGlobalMem);
    int value = 0;
    CK_BENCH_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, ordinal));
    info.sm_count = value;
    CK_BENCH_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrL2CacheSize, ordinal));
    info.l2_bytes = value;
    CK_BENCH_CHECK(cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, ordinal));
    CK_BENCH_CHECK(cudaDeviceGetAttribute(&info.cc_minor, cudaDevAttrComputeCapabilityMinor, ordinal));
    CK_BENCH_CHECK(cudaDriverGetVersion(&info.driver_version));
    CK_BENCH_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
    info.kernel_module = read_kernel_module_version();
    return info;
}

// ------------------------------------------------------------------------------------------------
// Options (parsed in bench.cu)
// ------------------------------------------------------------------------------------------------
struct Options {
    std::string out_dir = "benchmarks/results";
    std::vector<std::string> filters;  // a row runs if its key contains any of them (none: all);
                                       // a filter ending in '$' must end the key
    bool quick = false;                // fewer reps, smaller sizes: a smoke test
    bool sample = false;               // --sample: kSampleFilters' rows, measured as usual
    int64_t size = kDefaultSize;       // elements of the memory-bound problems
    int warmup = kDefaultWarmup;
    int reps = kDefaultReps;
    int batch = 1;                     // calls per event pair (--batch)
    std::string command_line;          // recorded in the results' header

    TimingConfig timing() const {
        TimingConfig config;
        config.warmup = warmup;
        config.reps = reps;
        config.batch = batch;
        return config;
    }
};

// ------------------------------------------------------------------------------------------------
// Results
// ------------------------------------------------------------------------------------------------
// What a family says about one row before it is timed.
struct RowSpec {
    std::string family;   // "quantize"
    std::string kernel;   // "quantize_int8 per-row dynamic"
    std::string dtype;    // "fp16"
    std::string shape;    // "8192x8192", "M=16 K=4096 N=14336"
    double bytes = 0;     // minimum DRAM traffic of one call: everything read + written once
    double flops = 0;     // arithmetic of one call (2*M*N*K for a GEMM); 0 for memory-bound rows
    std::string ops_unit = "TFLOP/s";  // "TOPS" for integer math
    int copies = 1;       // buffer copies rotated through (recorded, for the reader)
    std::string note;

    // What --filter matches: "family/kernel/dtype/shape".
    std::string key() const { return family + "/" + kernel + "/" + dtype + "/" + shape; }
};

// A row's identity (what --filter matches); the caller adds its floors and the rest.
inline RowSpec row_spec(std::string family, std::string kernel, std::string dtype,
                        std::string shape) {
    RowSpec spec;
    spec.family = std::move(family);
    spec.kernel = std::move(kernel);
    spec.dtype = std::move(dtype);
    spec.shape = std::move(shape);
    return spec;
}

struct Row : RowSpec {
    Timing time;
    std::string baseline_name;  // e.g. "cuBLAS fp16"; empty: no baseline
    double baseline_us = 0;

    double seconds() const { return time.median_us * 1e-6; }
    double gbps() const { return time.median_us > 0 ? bytes / seconds() / kBytesPerGB : 0; }
    double tera_ops() const { return time.median_us > 0 ? flops / seconds() / kOpsPerTera : 0; }
    bool has_baseline() const { return !baseline_name.empty() && baseline_us > 0; }
    // Baseline time / our time: > 1 means faster than the baseline.
    double ratio() const { return has_baseline() ? baseline_us / time.median_us : 0; }
};

// A small free-form table a family adds beside its rows (e.g. dynamic / static time ratios).
struct ExtraTable {
    std::string family;
    std::string title;
    std::vector<std::string> headers;
    std::vector<std::vector<std::string>> cells;
};

namespace bench_detail {

// A column is right-aligned when every non-empty cell looks numeric: a number, optionally followed
// by "x", "%" or a space and a unit ("1.84x", "1270.0 TOPS"), but not a shape like "8192x8192".
inline bool looks_numeric(const std::string& s) {
    if (s.empty()) return false;
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    if (end == s.c_str()) return false;
    const std::string rest = end;
    return rest.empty() || rest == "x" || rest == "%" || rest[0] == ' ';
}

inline std::vector<bool> right_aligned_columns(const std::vector<std::string>& headers,
                                               const std::vector<std::vector<std::string>>& cells) {
    std::vector<bool> right(headers.size(), true);
    for (size_t c = 0; c < headers.size(); ++c) {
        bool any = false;
        for (const auto& row : cells) {
            if (c < row.size() && !row[c].empty()) {
                any = true;
                if (!looks_numeric(row[c])) right[c] = false;
            }
        }
        if (!any) right[c] = false;
    }
    return right;
}

inline std::string render_text(const std::vector<std::string>& headers,
                               const std::vector<std::vector<std::string>>& cells) {
    const auto right = right_aligned_columns(headers, cells);
    std::vector<size_t> width(headers.size());
    for (size_t c = 0; c < headers.size(); ++c) width[c] = headers[c].size();
    for (const auto& row : cells)
        for (size_t c = 0; c < row.size() && c < width.size(); ++c)
            width[c] = std::max(width[c], row[c].size());

    auto line = [&](const std::vector<std::string>& row) {
        std::string out;
        for (size_t c = 0; c < headers.size(); ++c) {
            const std::string cell = c < row.size() ? row[c] : "";
            const std::string pad(width[c] - cell.size(), ' ');
            out += (c ? "  " : "") + (right[c] ? pad + cell : cell + pad);
        }
        while (!out.empty() && out.back() == ' ') out.pop_back();
        return out + "\n";
    };
    std::string out = line(headers);
    size_t total = 0;
    for (size_t w : width) total += w + 2;
    out += std::string(total > 2 ? total - 2 : 0, '-') + "\n";
    for (const auto& row : cells) out += line(row);
    return out;
}

inline std::string markdown_cell(const std::string& s) {
    std::string out;
    for (char c : s) out += (c == '|') ? std::string("\\|") : std::string(1, c);
    return out;
}

inline std::string render_markdown(const std::vector<std::string>& headers,
                                   const std::vector<std::vector<std::string>>& cells) {
    const auto right = right_aligned_columns(headers, cells);
    std::string out = "|";
    for (const auto& h : headers) out += " " + markdown_cell(h) + " |";
    out += "\n|";
    for (size_t c = 0; c < headers.size(); ++c) out += right[c] ? "---:|" : "---|";
    out += "\n";
    for (const auto& row : cells) {
        out += "|";
        for (size_t c = 0; c < headers.size(); ++c)
            out += " " + markdown_cell(c < row.size() ? row[c] : "") + " |";
        out += "\n";
    }
    return out;
}

inline std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                    out += buf;
                } else {
                    out += char(c);
                }
        }
    }
    return out + "\"";
}

inline std::string json_number(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    return buf;
}

}  // namespace bench_detail

// ------------------------------------------------------------------------------------------------
// Sequences that may be captured: a failing call is recorded instead of exiting, so that a
// sequence cuBLAS cannot capture falls back to direct launches (time_sequence, below).
// ------------------------------------------------------------------------------------------------
class StepStatus {
  public:
    bool ok() const { return message_.empty(); }
    const std::string& message() const { return message_; }

    void check(cudaError_t err, const char* expr) {
        if (err != cudaSuccess && ok()) message_ = std::string(expr) + ": " + cudaGetErrorName(err);
    }
    void check(cublasStatus_t status, const char* expr) {
        if (status != CUBLAS_STATUS_SUCCESS && ok())
            message_ = std::string(expr) + ": " + cublasGetStatusName(status);
    }
    void check(ck_status_t status, const char* expr) {
        if (status != CK_STATUS_SUCCESS && ok())
            message_ = std::string(expr) + ": " + ck_status_string(status) + ": " +
                       ck_last_error_message();
    }

    // Outside capture a failure is fatal, as CK_BENCH_CHECK.
    void require(const char* what) const {
        if (ok()) return;
        std::fprintf(stderr, "ck_bench: %s failed: %s\n", what, message_.c_str());
        std::exit(kExitFailure);
    }

  private:
    std::string message_;
};

#define CK_BENCH_STEP(status, call) (status).check((call), #call)

// Enqueues one call of a row's sequence on rotation copy `copy`.
using Sequence = std::function<void(StepStatus&, int copy)>;

// One instantiated CUDA graph (one call of a sequence). Move-only.
class Graph {
  public:
    Graph() = default;
    ~Graph() {
        if (exec_) cudaGraphExecDestroy(exec_);
    }
    Graph(Graph&& other) noexcept { std::swap(exec_, other.exec_); }
    Graph& operator=(Graph&& other) noexcept {
        std::swap(exec_, other.exec_);
        return *this;
    }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;

    // Captures sequence(copy) on `stream`; an empty optional (and the reason in *why) when the
    // capture or the instantiation fails. The failure leaves no error pending.
    static std::optional<Graph> capture(cudaStream_t stream, const Sequence& sequence, int copy,
                                        std::string* why) {
        // ThreadLocal: this thread must not make unsafe calls (cudaMalloc) during the capture;
        // cuBLAS has its workspace set beforehand (Context) for that reason.
        cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
        if (err != cudaSuccess) {
            *why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorName(err);
            cudaGetLastError();
            return std::nullopt;
        }
        StepStatus status;
        sequence(status, copy);
        cudaGraph_t graph = nullptr;
        err = cudaStreamEndCapture(stream, &graph);
        if (!status.ok() || err != cudaSuccess) {
            *why = !status.ok() ? status.message()
                                : std::string("cudaStreamEndCapture: ") + cudaGetErrorName(err);
            if (graph) cudaGraphDestroy(graph);
            cudaGetLastError();
            return std::nullopt;
        }
        Graph g;
        err = cudaGraphInstantiate(&g.exec_, graph, 0);
        cudaGraphDestroy(graph);
        if (err != cudaSuccess) {
            *why = std::string("cudaGraphInstantiate: ") + cudaGetErrorName(err);
            g.exec_ = nullptr;
            cudaGetLastError();
            return std::nullopt;
        }
        return g;
    }

    void launch(cudaStream_t stream) const { CK_BENCH_CHECK(cudaGraphLaunch(exec_, stream)); }

  private:
    cudaGraphExec_t exec_ = nullptr;
};

// ------------------------------------------------------------------------------------------------
// Bench: the device, the stream, the copy roofline and the rows of one run of the program.
// ------------------------------------------------------------------------------------------------
class Bench {
  public:
    Bench(const Options& options, int ordinal) : options_(options) {
        CK_BENCH_CHECK(cudaSetDevice(ordinal));
        device_ = query_device(ordinal);
        // A non-blocking stream: nothing on the legacy default stream serializes with our timing.
        CK_BENCH_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        measure_copy_bandwidth();
    }
    ~Bench() {
        if (cublas_) cublasDestroy(cublas_);
        if (stream_) cudaStreamDestroy(stream_);
    }
    Bench(const Bench&) = delete;
    Bench& operator=(const Bench&) = delete;

    const Options& options() const { return options_; }
    const DeviceInfo& device() const { return device_; }
    cudaStream_t stream() const { return stream_; }
    double copy_gbps() const { return copy_gbps_; }

    // A cuBLAS handle bound to stream(), created on first use (for baselines).
    cublasHandle_t cublas() {
        if (!cublas_) {
            CK_BENCH_CHECK(cublasCreate(&cublas_));
            CK_BENCH_CHECK(cublasSetStream(cublas_, stream_));
        }
        return cublas_;
    }

    // Whether --filter selects this row (check before allocating or timing anything for it).
    bool wants(const RowSpec& spec) const {
        if (options_.filters.empty()) return true;
        const std::string key = spec.key();
        for (const auto& f : options_.filters) {
            const bool anchored = !f.empty() && f.back() == '$';
            const std::string text = anchored ? f.substr(0, f.size() - 1) : f;
            if (anchored ? key.size() >= text.size() &&
                               key.compare(key.size() - text.size(), text.size(), text) == 0
                         : key.find(text) != std::string::npos)
                return true;
        }
        return false;
    }

    // Copies of a problem's buffers to rotate through (see rotation_copies_for_l2), limited so that
    // they fit in device memory: `bytes_per_copy` is what one copy allocates.
    int rotation_copies(double bytes_per_call, double bytes_per_copy) const {
        int copies = rotation_copies_for_l2(bytes_per_call, device_.l2_bytes);
        size_t free_bytes = 0, total_bytes = 0;
        CK_BENCH_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        const double budget = kMaxRotationMemoryFraction * double(free_bytes);
        const int fit = bytes_per_copy > 0 ? int(std::max(1.0, budget / bytes_per_copy)) : copies;
        if (fit < copies) {
            std::fprintf(stderr,
                         "ck_bench: warning: only %d of %d rotation copies fit in memory; "
                         "small problems may be partly L2-resident\n", fit, copies);
            copies = fit;
        }
        return copies;
    }

    Timing time(const Launch& launch) const { return time(launch, options_.timing()); }
    Timing time(const Launch& launch, const TimingConfig& config) const {
        return time_launches(launch, config, stream_);
    }

    // Filter, time and record one row. Returns nullptr when the filter skips it; the pointer stays
    // valid for the whole run (to add a baseline or a note later).
    Row* run(const RowSpec& spec, const Launch& launch) {
        return run(spec, launch, options_.timing());
    }
    Row* run(const RowSpec& spec, const Launch& launch, const TimingConfig& config) {
        if (!wants(spec)) return nullptr;
        return &record(spec, time(launch, config));
    }

    // Records a row timed elsewhere (e.g. by time_sequence), with run()'s progress line.
    Row& record(const RowSpec& spec, const Timing& timing) {
        Row row;
        static_cast<RowSpec&>(row) = spec;
        row.time = timing;
        std::fprintf(stderr, "  %-60s %10.1f us  %7.0f GB/s\n", spec.key().c_str(),
                     row.time.median_us, row.gbps());
        return add(std::move(row));
    }

    // Records a row timed elsewhere.
    Row& add(Row row) {
        note_family(row.family);
        rows_.push_back(std::move(row));
        return rows_.back();
    }

    static void set_baseline(Row& row, const std::string& name, const Timing& baseline) {
        row.baseline_name = name;
        row.baseline_us = baseline.median_us;
    }

    static void append_note(Row& row, const std::string& text) {
        row.note += (row.note.empty() ? "" : "; ") + text;
    }

    void add_table(ExtraTable table) {
        note_family(table.family);
        tables_.push_back(std::move(table));
    }

    // Percentage of the measured copy bandwidth reached by moving `bytes` in `us` microseconds.
    double percent_of_copy(double bytes, double us) const {
        return us > 0 && copy_gbps_ > 0 ? 100.0 * bytes / (us * 1e-6) / kBytesPerGB / copy_gbps_ : 0;
    }

    // One-paragraph description of the device and the roofline (stdout header, markdown header).
    std::string header_lines(const std::string& prefix) const {
        std::ostringstream s;
        s << prefix << "GPU: " << device_.name << " (" << device_.sm_count << " SMs, sm_"
          << device_.cc_major << device_.cc_minor << ", L2 "
          << format("%.0f", double(device_.l2_bytes) / kBytesPerMiB) << " MiB, memory "
          << format("%.1f", double(device_.memory_bytes) / kBytesPerGiB) << " GiB)\n";
        s << prefix << "Driver: CUDA " << cuda_version_string(device_.driver_version);
        if (!device_.kernel_module.empty()) s << " (kernel module " << device_.kernel_module << ")";
        s << ", runtime: CUDA " << cuda_version_string(device_.runtime_version) << "\n";
        s << prefix << "Library: libcuda_kernels " << library_version_string(ck_version());
        if (ck_version() != CK_VERSION)
            s << " (built against header " << library_version_string(CK_VERSION) << ")";
        s << "\n";
        s << prefix << "D2D copy bandwidth: " << format("%.0f", copy_gbps_) << " GB/s (read + written, "
          << "cudaMemcpyAsync of " << format("%.0f", double(copy_bytes_) / kBytesPerMiB)
          << " MiB, median of " << copy_time_.reps << " runs: " << format("%.1f", copy_time_.median_us)
          << " us)\n";
        return s.str();
    }

    // Prints one family's rows and extra tables to stdout.
    void print_family(const std::string& family) const {
        const auto cells = row_cells(family);
        if (!cells.empty()) {
            std::printf("\n== %s\n%s", family.c_str(),
                        bench_detail::render_text(row_headers(family), cells).c_str());
        }
        for (const auto& t : tables_) {
            if (t.family != family) continue;
            std::printf("\n%s\n%s", t.title.c_str(),
                        bench_detail::render_text(t.headers, t.cells).c_str());
        }
        std::fflush(stdout);
    }

    // Writes <out>/<gpu>.json and <out>/<gpu>.md (with a "-quick" suffix in --quick mode and
    // "-sample" in --sample mode, so that neither overwrites the full sweep's results). Returns
    // the path without extension.
    std::string write_results() const {
        std::filesystem::create_directories(options_.out_dir);
        std::string base = options_.out_dir + "/" + sanitize_name(device_.name);
        if (options_.quick) base += "-quick";
        if (options_.sample) base += "-sample";
        write_file(base + ".json", json());
        write_file(base + ".md", markdown());
        return base;
    }

  private:
    void measure_copy_bandwidth() {
        size_t free_bytes = 0, total_bytes = 0;
        CK_BENCH_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        copy_bytes_ = kCopyBytes;
        // Source + destination must fit, with room to spare for the driver.
        while (copy_bytes_ > kMinCopyBytes && double(2 * copy_bytes_) > 0.8 * double(free_bytes))
            copy_bytes_ /= 2;
        DeviceBuffer src(copy_bytes_), dst(copy_bytes_);
        fill_random_bytes(src.as(), copy_bytes_, /*seed=*/1, stream_);
        TimingConfig config;
        config.warmup = options_.quick ? 1 : kCopyWarmup;
        config.reps = options_.quick ? std::min(kCopyReps, kQuickReps) : kCopyReps;
        copy_time_ = time(
            [&](int) {
                CK_BENCH_CHECK(cudaMemcpyAsync(dst.as(), src.as(), copy_bytes_,
                                               cudaMemcpyDeviceToDevice, stream_));
            },
            config);
        copy_gbps_ = 2.0 * double(copy_bytes_) / (copy_time_.median_us * 1e-6) / kBytesPerGB;
    }

    void note_family(const std::string& family) {
        if (std::find(families_.begin(), families_.end(), family) == families_.end())
            families_.push_back(family);
    }

    bool family_has(const std::string& family, double Row::*field) const {
        for (const auto& r : rows_)
            if (r.family == family && r.*field > 0) return true;
        return false;
    }
    bool family_has_baseline(const std::string& family) const {
        for (const auto& r : rows_)
            if (r.family == family && r.has_baseline()) return true;
        return false;
    }

    // Columns shown for a family: FLOP and baseline columns only where some row has them.
    std::vector<std::string> row_headers(const std::string& family) const {
        std::vector<std::string> h = {"kernel", "dtype", "shape", "MB", "median us", "min us",
                                      "max us", "GB/s", "% copy"};
        if (family_has(family, &Row::flops)) h.push_back("T(FL)OP/s");
        if (family_has_baseline(family)) {
            h.push_back("baseline");
            h.push_back("baseline us");
            h.push_back("speedup");
        }
        h.push_back("note");
        return h;
    }

    std::vector<std::vector<std::string>> row_cells(const std::string& family) const {
        const bool flops = family_has(family, &Row::flops);
        const bool baseline = family_has_baseline(family);
        std::vector<std::vector<std::string>> cells;
        for (const auto& r : rows_) {
            if (r.family != family) continue;
            std::vector<std::string> c = {
                r.kernel, r.dtype, r.shape,
                format("%.1f", r.bytes / kBytesPerMB),
                format("%.1f", r.time.median_us),
                format("%.1f", r.time.min_us),
                format("%.1f", r.time.max_us),
                r.bytes > 0 ? format("%.0f", r.gbps()) : "",
                r.bytes > 0 ? format("%.1f", percent_of_copy(r.bytes, r.time.median_us)) : ""};
            if (flops) c.push_back(r.flops > 0 ? format("%.1f", r.tera_ops()) + " " + r.ops_unit : "");
            if (baseline) {
                c.push_back(r.baseline_name);
                c.push_back(r.has_baseline() ? format("%.1f", r.baseline_us) : "");
                c.push_back(r.has_baseline() ? format("%.2fx", r.ratio()) : "");
            }
            c.push_back(r.note);
            cells.push_back(std::move(c));
        }
        return cells;
    }

    std::string markdown() const {
        std::ostringstream s;
        s << "# libcuda_kernels benchmark: " << device_.name << "\n\n";
        s << header_lines("- ");
        s << "- Date: " << utc_now() << "\n";
        s << "- Command: `" << options_.command_line << "`\n";
        s << "- Timing: CUDA events, " << options_.warmup << " warm-up runs, then the median (min, max) "
          << "of " << options_.reps << " runs each timed with its own event pair"
          << (options_.batch > 1 ? " around " + std::to_string(options_.batch) +
                                       " calls launched back to back (time per call)"
                                 : std::string())
          << "; inputs rotated "
          << "across copies so that the working set is >= " << format("%.0f", kRotationL2Multiple)
          << "x L2" << (options_.quick ? "; **--quick: a smoke test, not a measurement**" : "")
          << "\n";
        s << "- MB: minimum DRAM traffic of one call (inputs read once + outputs written once); "
          << "GB/s = MB / median time; % copy = GB/s / the D2D copy bandwidth above; "
          << "speedup = baseline time / kernel time\n";
        for (const auto& family : families_) {
            s << "\n## " << family << "\n";
            const auto cells = row_cells(family);
            if (!cells.empty())
                s << "\n" << bench_detail::render_markdown(row_headers(family), cells);
            for (const auto& t : tables_) {
                if (t.family != family) continue;
                s << "\n### " << t.title << "\n\n" << bench_detail::render_markdown(t.headers, t.cells);
            }
        }
        return s.str();
    }

    std::string json() const {
        using bench_detail::json_number;
        using bench_detail::json_string;
        std::ostringstream s;
        s << "{\n";
        s << "  \"gpu\": {\"name\": " << json_string(device_.name)
          << ", \"sm_count\": " << device_.sm_count
          << ", \"compute_capability\": " << json_string(std::to_string(device_.cc_major) + "." +
                                                         std::to_string(device_.cc_minor))
          << ", \"l2_bytes\": " << device_.l2_bytes << ", \"memory_bytes\": " << device_.memory_bytes
          << ", \"driver_cuda_version\": " << json_string(cuda_version_string(device_.driver_version))
          << ", \"kernel_module_version\": " << json_string(device_.kernel_module)
          << ", \"runtime_cuda_version\": " << json_string(cuda_version_string(device_.runtime_version))
          << "},\n";
        s << "  \"library_version\": " << json_string(library_version_string(ck_version())) << ",\n";
        s << "  \"date_utc\": " << json_string(utc_now()) << ",\n";
        s << "  \"command\": " << json_string(options_.command_line) << ",\n";
        s << "  \"quick\": " << (options_.quick ? "true" : "false") << ",\n";
        s << "  \"sample\": " << (options_.sample ? "true" : "false") << ",\n";
        s << "  \"filters\": [";
        for (size_t i = 0; i < options_.filters.size(); ++i)
            s << (i ? ", " : "") << json_string(options_.filters[i]);
        s << "],\n";
        s << "  \"timing\": {\"warmup\": " << options_.warmup << ", \"reps\": " << options_.reps
          << ", \"statistic\": \"median\", \"l2_rotation_multiple\": "
          << json_number(kRotationL2Multiple) << "},\n";
        s << "  \"copy_bandwidth\": {\"gbps\": " << json_number(copy_gbps_)
          << ", \"bytes_copied\": " << copy_bytes_
          << ", \"median_us\": " << json_number(copy_time_.median_us) << "},\n";
        s << "  \"families\": [";
        for (size_t f = 0; f < families_.size(); ++f) {
            s << (f ? "," : "") << "\n    {\"name\": " << json_string(families_[f]) << ", \"rows\": [";
            bool first = true;
            for (const auto& r : rows_) {
                if (r.family != families_[f]) continue;
                s << (first ? "" : ",") << "\n      " << row_json(r);
                first = false;
            }
            s << "\n    ], \"tables\": [";
            first = true;
            for (const auto& t : tables_) {
                if (t.family != families_[f]) continue;
                s << (first ? "" : ",") << "\n      " << table_json(t);
                first = false;
            }
            s << "\n    ]}";
        }
        s << "\n  ]\n}\n";
        return s.str();
    }

    std::string row_json(const Row& r) const {
        using bench_detail::json_number;
        using bench_detail::json_string;
        std::ostringstream s;
        s << "{\"family\": " << json_string(r.family) << ", \"kernel\": " << json_string(r.kernel)
          << ", \"dtype\": " << json_string(r.dtype) << ", \"shape\": " << json_string(r.shape)
          << ", \"bytes\": " << json_number(r.bytes) << ", \"flops\": " << json_number(r.flops)
          << ", \"time_us\": {\"median\": " << json_number(r.time.median_us)
          << ", \"min\": " << json_number(r.time.min_us) << ", \"max\": " << json_number(r.time.max_us)
          << "}, \"reps\": " << r.time.reps << ", \"copies\": " << r.copies
          << ", \"gbps\": " << json_number(r.gbps())
          << ", \"percent_of_copy_bw\": " << json_number(percent_of_copy(r.bytes, r.time.median_us))
          << ", \"tera_ops\": " << json_number(r.tera_ops()) << ", \"ops_unit\": " << json_string(r.ops_unit);
        if (r.has_baseline()) {
            s << ", \"baseline\": {\"name\": " << json_string(r.baseline_name)
              << ", \"time_us\": " << json_number(r.baseline_us) << "}, \"speedup\": "
              << json_number(r.ratio());
        } else {
            s << ", \"baseline\": null, \"speedup\": null";
        }
        s << ", \"note\": " << json_string(r.note) << "}";
        return s.str();
    }

    static std::string table_json(const ExtraTable& t) {
        using bench_detail::json_string;
        std::ostringstream s;
        s << "{\"title\": " << json_string(t.title) << ", \"headers\": [";
        for (size_t i = 0; i < t.headers.size(); ++i) s << (i ? ", " : "") << json_string(t.headers[i]);
        s << "], \"rows\": [";
        for (size_t r = 0; r < t.cells.size(); ++r) {
            s << (r ? ", " : "") << "[";
            for (size_t c = 0; c < t.cells[r].size(); ++c)
                s << (c ? ", " : "") << json_string(t.cells[r][c]);
            s << "]";
        }
        s << "]}";
        return s.str();
    }

    static void write_file(const std::string& path, const std::string& text) {
        std::ofstream file(path);
        file << text;
        if (!file) {
            std::fprintf(stderr, "ck_bench: cannot write %s\n", path.c_str());
            std::exit(kExitFailure);
        }
    }

    Options options_;
    DeviceInfo device_;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    double copy_gbps_ = 0;
    int64_t copy_bytes_ = 0;
    Timing copy_time_;
    std::deque<Row> rows_;  // a deque: Row* handed out by run() stay valid as rows are added
    std::vector<ExtraTable> tables_;
    std::vector<std::string> families_;  // in order of first appearance
};

// "CK_GEMM_W4A16_KERNEL=tc" when the variable forces a kernel variant; empty when unset or "auto".
inline std::string kernel_override(const char* variable) {
    const char* value = std::getenv(variable);
    if (!value || !*value || std::string(value) == "auto") return "";
    return std::string(variable) + "=" + value;
}

inline void kernel_override_note(Row& row, const char* variable) {
    const std::string forced = kernel_override(variable);
    if (!forced.empty()) Bench::append_note(row, "variant forced by " + forced);
}

// Times a sequence as the rows of families with many launches per call do: runs it once directly
// (fatal if it fails: callers check its output), captures one graph per rotation copy and times
// their replays, so that host launch gaps stay out of the comparison; falls back to direct
// launches when a capture fails. *how says which, for the row's note; `what` names the problem
// in messages.
inline Timing time_sequence(Bench& bench, const Sequence& sequence, int copies,
                            const std::string& what, std::string* how,
                            const TimingConfig* config = nullptr) {
    cudaStream_t st = bench.stream();
    const TimingConfig timing = config ? *config : bench.options().timing();
    StepStatus direct;
    sequence(direct, 0);
    direct.require(what.c_str());
    CK_BENCH_CHECK(cudaStreamSynchronize(st));

    std::vector<Graph> graphs;
    std::string why;
    for (int c = 0; c < copies; ++c) {
        std::optional<Graph> g = Graph::capture(st, sequence, c, &why);
        if (!g) break;
        graphs.push_back(std::move(*g));
    }
    if (int(graphs.size()) == copies) {
        *how = "CUDA graph per call";
        return bench.time([&](int i) { graphs[size_t(i % copies)].launch(st); }, timing);
    }
    *how = "direct launches (graph capture failed: " + why + ")";
    std::fprintf(stderr, "  %s: %s\n", what.c_str(), how->c_str());
    return bench.time(
        [&](int i) {
            StepStatus s;
            sequence(s, i % copies);
            s.require(what.c_str());
        },
        timing);
}
