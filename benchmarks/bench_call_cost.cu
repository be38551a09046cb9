// benchmarks/bench_call_cost.cu - what one call costs the host: the CUDA runtime calls an entry
// point makes (a kernel launch, cudaGetDevice, cudaGetLastError, cudaFuncSetAttribute, getenv
// of a CK_*_KERNEL override) and three entry points at one decode step, M=1 on a 4096 x 4096
// weight (ck_quantize_int8 of an fp16 row, per-row dynamic; ck_gemm_int8_scaled, per-row scales,
// fp16 out; ck_gemm_w4a16_prepacked, fp16, INT4 group 128), with their override unset and set.
//
//   make build/bench_call_cost && build/bench_call_cost [--calls 20000] [--batch 200]
//
// A row issues --calls calls in batches of --batch: each batch is timed with std::chrono from
// its first call until its last returns, and the device is synchronized after it, outside the
// timed part, so that the launch queue never fills (a full queue makes the host wait for the
// GPU, and the time would be the kernel's). "host us" is the median over batches of the time
// per call, "min us" the fastest batch's. The difference between an entry point's row and the
// empty kernel's is what the entry point adds to a launch: its checks, the variant choice and
// the runtime calls around the launch. The buffers hold zeros (the time of a launch does not
// depend on the data) and are allocated once.
//
// Exit status: 0, 1 when a call fails, 2 without a CUDA device. Nothing is written to disk.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_kernels.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitNoDevice = 2;
constexpr int64_t kM = 1, kN = 4096, kK = 4096, kGroup = 128;
constexpr int kWarmupCalls = 100;

void check_cuda(cudaError_t err, const char* call) {
    if (err == cudaSuccess) return;
    std::fprintf(stderr, "bench_call_cost: %s failed: %s\n", call, cudaGetErrorString(err));
    std::exit(kExitFailure);
}

void check_ck(ck_status_t status, const char* call) {
    if (status == CK_STATUS_SUCCESS) return;
    std::fprintf(stderr, "bench_call_cost: %s failed: %s (%s)\n", call, ck_status_string(status),
                 ck_last_error_message());
    std::exit(kExitFailure);
}

#define CHECK_CUDA(call) check_cuda((call), #call)

__global__ void empty_kernel() {}

// An argument as large as the GEMM launchers' (a struct of pointers, sizes and flags).
struct WideArgument {
    char bytes[256];
};
__global__ void empty_kernel_wide(WideArgument) {}

// A zeroed device buffer, freed at exit (the process ends right after the table).
void* zeroed(size_t bytes) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemset(p, 0, bytes));
    return p;
}

struct Timing {
    double median_us, min_us;
};

// Host time per call of `call`, issued in batches (see the file's comment).
Timing time_calls(const std::function<void()>& call, int calls, int batch) {
    for (int i = 0; i < kWarmupCalls; ++i) call();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> per_call;
    for (int done = 0; done < calls; done += batch) {
        const int n = std::min(batch, calls - done);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) call();
        const auto t1 = std::chrono::steady_clock::now();
        CHECK_CUDA(cudaDeviceSynchronize());
        per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
    }
    std::sort(per_call.begin(), per_call.end());
    return {per_call[per_call.size() / 2], per_call.front()};
}

struct Row {
    std::string name;
    const char* forced_env;  // an override set to "small_m" while the row runs, or nullptr
    std::function<void()> call;
};

int int_option(int argc, char** argv, const char* name, int fallback) {
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], name)) return std::max(1, std::atoi(argv[i + 1]));
    return fallback;
}

}  // namespace

int main(int argc, char** argv) {
    const int calls = int_option(argc, argv, "--calls", 20000);
    const int batch = int_option(argc, argv, "--batch", 200);

    int devices = 0;
    const ck_status_t status = ck_device_count(&devices);
    if (status == CK_STATUS_NO_DEVICE || (status == CK_STATUS_SUCCESS && devices == 0)) {
        std::fprintf(stderr, "bench_call_cost: no CUDA device found; it measures launches on an "
                             "NVIDIA GPU\n");
        return kExitNoDevice;
    }
    check_ck(status, "ck_device_count");
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

    cudaStream_t own_stream = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&own_stream, cudaStreamNonBlocking));
    const cudaStream_t stream = 0;  // the legacy default stream, as ck.raw's calls in Python

    // ck_quantize_int8: x fp16 [1, K] -> q int8 [1, K], one float32 scale.
    void* x16 = zeroed(kM * kK * 2);
    auto* q8 = static_cast<int8_t*>(zeroed(kM * kK));
    auto* q_scales = static_cast<float*>(zeroed(kM * sizeof(float)));
    // ck_gemm_int8_scaled: a int8 [1, K], b int8 [N, K], per-row scales, fp16 out [1, N].
    auto* a8 = static_cast<int8_t*>(zeroed(kM * kK));
    auto* b8 = static_cast<int8_t*>(zeroed(kN * kK));
    auto* scale_a = static_cast<float*>(zeroed(kM * sizeof(float)));
    auto* scale_b = static_cast<float*>(zeroed(kN * sizeof(float)));
    void* out16 = zeroed(kM * kN * 2);
    // ck_gemm_w4a16_prepacked: a prepacked symmetric INT4 weight (zeros: any bytes will do).
    auto* w4 = static_cast<uint8_t*>(zeroed(size_t(ck_w4a16_prepacked_bytes(kN, kK))));
    void* w4_scales = zeroed(size_t(ck_w4a16_prepacked_groups(kN, kK, kGroup)) * 2);

    auto quantize_int8 = [&] {
        check_ck(ck_quantize_int8(x16, CK_DTYPE_FP16, kM, kK, CK_PER_ROW, CK_SCALE_DYNAMIC,
                                  q_scales, q8, stream),
                 "ck_quantize_int8");
    };
    auto gemm_int8_scaled = [&] {
        check_ck(ck_gemm_int8_scaled(a8, b8, CK_LAYOUT_NK, kM, kN, kK, scale_a, CK_PER_ROW,
                                     scale_b, CK_PER_ROW, nullptr, CK_ACTIVATION_NONE, out16,
                                     CK_DTYPE_FP16, stream),
                 "ck_gemm_int8_scaled");
    };
    auto gemm_w4a16 = [&] {
        check_ck(ck_gemm_w4a16_prepacked(x16, CK_DTYPE_FP16, w4, w4_scales, nullptr, kGroup,
                                         CK_INT4_SYMMETRIC, nullptr, CK_ACTIVATION_NONE, kM, kN,
                                         kK, out16, stream),
                 "ck_gemm_w4a16_prepacked");
    };
    volatile int sink = 0;  // keeps the compiler from dropping the pure calls
    const WideArgument wide{};
    // With forced_env the family's override forces the variant that serves the call anyway.
    const std::vector<Row> rows = {
        {"cudaGetDevice", nullptr, [&] { int d; cudaGetDevice(&d); sink = sink + d; }},
        {"cudaGetLastError", nullptr, [&] { sink = sink + int(cudaGetLastError()); }},
        {"cudaDeviceGetAttribute (SM count)", nullptr, [&] {
             int v;
             cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0);
             sink = sink + v; }},
        {"cudaFuncSetAttribute (dynamic smem)", nullptr, [&] {
             sink = sink + int(cudaFuncSetAttribute(
                 empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024)); }},
        {"getenv (CK_GEMM_W4A16_KERNEL unset)", nullptr,
         [&] { sink = sink + (getenv("CK_GEMM_W4A16_KERNEL") != nullptr); }},
        {"getenv (CK_GEMM_W4A16_KERNEL set)", "CK_GEMM_W4A16_KERNEL",
         [&] { sink = sink + (getenv("CK_GEMM_W4A16_KERNEL") != nullptr); }},
        {"ck_version (a call into the library)", nullptr, [&] { sink = sink + ck_version(); }},
        {"empty kernel, stream 0", nullptr, [&] { empty_kernel<<<1, 32, 0, stream>>>(); }},
        {"empty kernel, own stream", nullptr,
         [&] { empty_kernel<<<1, 32, 0, own_stream>>>(); }},
        {"empty kernel, 256-byte argument, stream 0", nullptr,
         [&] { empty_kernel_wide<<<1, 32, 0, stream>>>(wide); }},
        {"ck_quantize_int8 (M=1, K=4096, fp16, per-row)", nullptr, quantize_int8},
        {"ck_gemm_int8_scaled (M=1, 4096 x 4096)", nullptr, gemm_int8_scaled},
        {"ck_gemm_int8_scaled, CK_GEMM_INT8_KERNEL=small_m", "CK_GEMM_INT8_KERNEL",
         gemm_int8_scaled},
        {"ck_gemm_w4a16_prepacked (M=1, 4096 x 4096, g128)", nullptr, gemm_w4a16},
        {"ck_gemm_w4a16_prepacked, CK_GEMM_W4A16_KERNEL=small_m", "CK_GEMM_W4A16_KERNEL",
         gemm_w4a16},
    };

    std::printf("bench_call_cost: %s, %d calls per row in batches of %d (host time per call)\n\n",
                prop.name, calls, batch);
    std::printf("%-56s %9s %9s\n", "call", "host us", "min us");
    for (const Row& row : rows) {
        unsetenv("CK_GEMM_W4A16_KERNEL");
        unsetenv("CK_GEMM_INT8_KERNEL");
        if (row.forced_env) setenv(row.forced_env, "small_m", 1);
        const Timing t = time_calls(row.call, calls, batch);
        std::printf("%-56s %9.3f %9.3f\n", row.name.c_str(), t.median_us, t.min_us);
    }
    CHECK_CUDA(cudaGetLastError());
    return 0;
}
