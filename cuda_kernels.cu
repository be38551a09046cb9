// cuda_kernels.cu - the exported C entry points: validate -> pick a kernel variant -> launch ->
// map errors. Validation happens entirely on the host, before any CUDA call, so a rejected call
// launches nothing and works without a GPU. Kernels live in kernels/ and trust their arguments.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "cuda_kernels.h"
#include <cublas_api.h>

#include "kernels/core/common.cuh"
#include "kernels/gemm/gemm_int4.cuh"
#include "kernels/gemm/gemm_int8.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"
#include "kernels/quantize/int4_import.cuh"
#include "kernels/gemm/linear.cuh"
#include "kernels/quantize/quantize.cuh"

namespace {

// ---------------------------------------------------------------------------------------------
// The per-thread error state behind ck_last_error_message() / ck_last_cuda_error().
// ---------------------------------------------------------------------------------------------
thread_local std::string t_message;
thread_local int t_cuda_error = 0;

void clear_error() {
    t_message.clear();
    t_cuda_error = 0;
}

ck_status_t fail(ck_status_t status, const char* fn, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

ck_status_t fail(ck_status_t status, const char* fn, const char* fmt, ...) {
    char buf[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    t_message = std::string(fn) + ": " + buf;
    return status;
}

bool is_no_device(cudaError_t err) {
    return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
           err == cudaErrorCallRequiresNewerDriver;
}

// The one path from a cudaError_t to a status: records the CUDA error, its name and the place.
ck_status_t cuda_status(cudaError_t err, const char* fn, const char* what, const char* file, int line) {
    if (err == cudaSuccess) return CK_STATUS_SUCCESS;
    cudaGetLastError();  // clear a non-sticky error so that it is not reported twice
    const ck_status_t status = is_no_device(err) ? CK_STATUS_NO_DEVICE : CK_STATUS_CUDA_ERROR;
    fail(status, fn, "%s failed: %s (%s) at %s:%d", what, cudaGetErrorName(err),
         cudaGetErrorString(err), file, line);
    t_cuda_error = int(err);
    return status;
}

// The one path from a cublasStatus_t to a status.
ck_status_t cublas_status(cublasStatus_t st, const char* fn, const char* what, const char* file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_CUBLAS_ERROR, fn, "%s failed: %s (%s) at %s:%d", what,
                cublasGetStatusName(st), cublasGetStatusString(st), file, line);
}

#define CK_TRY(expr)                                   \
    do {                                               \
        const ck_status_t ck_try_status_ = (expr);     \
        if (ck_try_status_ != CK_STATUS_SUCCESS) return ck_try_status_; \
    } while (0)

#define CK_CUDA(fn, call) cuda_status((call), fn, #call, __FILE__, __LINE__)
#define CK_CUBLAS(fn, call) cublas_status((call), fn, #call, __FILE__, __LINE__)

const char* dtype_name(ck_dtype_t dtype) {
    switch (dtype) {
        case CK_DTYPE_FP32: return "CK_DTYPE_FP32";
        case CK_DTYPE_FP16: return "CK_DTYPE_FP16";
        case CK_DTYPE_BF16: return "CK_DTYPE_BF16";
        case CK_DTYPE_INT8: return "CK_DTYPE_INT8";
        case CK_DTYPE_INT32: return "CK_DTYPE_INT32";
        case CK_DTYPE_UINT8: return "CK_DTYPE_UINT8";
    }
    return nullptr;
}

size_t dtype_size(ck_dtype_t dtype) {
    switch (dtype) {
        case CK_DTYPE_FP32: case CK_DTYPE_INT32: return 4;
        case CK_DTYPE_FP16: case CK_DTYPE_BF16: return 2;
        case CK_DTYPE_INT8: case CK_DTYPE_UINT8: return 1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Validation: one small check per kind, each with a precise message naming the argument.
// ---------------------------------------------------------------------------------------------
class Check {
  public:
    explicit Check(const char* fn) : fn_(fn) { clear_error(); }

    ck_status_t not_null(const void* p, const char* name) const {
        if (p) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_INVALID_VALUE, fn_, "%s is NULL", name);
    }

    // A valid ck_int4_mode_t, with zero points exactly when the mode has them.
    ck_status_t int4_mode(ck_int4_mode_t mode, const void* zeros) const {
        CK_TRY(enum_value(mode, 2, "mode", "ck_int4_mode_t"));
        if (mode == CK_INT4_ASYMMETRIC) return not_null(zeros, "zeros");
        if (!zeros) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_INVALID_VALUE, fn_,
                    "zeros must be NULL for CK_INT4_SYMMETRIC (it has no zero points)");
    }

    // A floating-point element type: known enum and one of fp32/fp16/bf16.
    ck_status_t float_dtype(ck_dtype_t dtype, const char* name) const {
        if (!dtype_name(dtype))
            return fail(CK_STATUS_INVALID_VALUE, fn_, "%s=%d is not a valid ck_dtype_t", name, int(dtype));
        if (dtype == CK_DTYPE_FP32 || dtype == CK_DTYPE_FP16 || dtype == CK_DTYPE_BF16)
            return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_UNSUPPORTED, fn_,
                    "%s=%s is not supported here (use CK_DTYPE_FP32, CK_DTYPE_FP16 or CK_DTYPE_BF16)",
                    name, dtype_name(dtype));
    }

    // A 16-bit floating-point element type (the W4A16 kernels' activations and scales).
    ck_status_t half_dtype(ck_dtype_t dtype, const char* name) const {
        CK_TRY(float_dtype(dtype, name));
        if (dtype != CK_DTYPE_FP32) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_UNSUPPORTED, fn_,
                    "%s=CK_DTYPE_FP32 is not supported (use CK_DTYPE_FP16 or CK_DTYPE_BF16)", name);
    }

    ck_status_t enum_value(int value, int count, const char* name, const char* type) const {
        if (value >= 0 && value < count) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_INVALID_VALUE, fn_, "%s=%d is not a valid %s", name, value, type);
    }

    // rows, cols >= 1 and rows * cols * max_elem_bytes representable in int64_t.
    ck_status_t matrix(int64_t rows, int64_t cols, size_t max_elem_bytes) const {
        if (rows < 1) return fail(CK_STATUS_INVALID_VALUE, fn_, "rows=%lld must be >= 1", (long long)rows);
        if (cols < 1) return fail(CK_STATUS_INVALID_VALUE, fn_, "cols=%lld must be >= 1", (long long)cols);
        int64_t elems, bytes;
        if (__builtin_mul_overflow(rows, cols, &elems) ||
            __builtin_mul_overflow(elems, int64_t(max_elem_bytes), &bytes))
            return fail(CK_STATUS_INVALID_VALUE, fn_,
                        "rows=%lld x cols=%lld overflows a 64-bit byte count",
                        (long long)rows, (long long)cols);
        return CK_STATUS_SUCCESS;
    }

    ck_status_t group_size(int64_t group_size) const {
        if (group_size == 32 || group_size == 64 || group_size == 128 || group_size == CK_GROUP_ROW)
            return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_UNSUPPORTED, fn_,
                    "group_size=%lld is not supported (use 32, 64, 128 or -1 for a whole row)",
                    (long long)group_size);
    }

    // m, n, k >= 1 and every operand's byte count representable in int64_t.
    ck_status_t gemm_shape(int64_t m, int64_t n, int64_t k, size_t out_elem_bytes) const {
        if (m < 1) return fail(CK_STATUS_INVALID_VALUE, fn_, "m=%lld must be >= 1", (long long)m);
        if (n < 1) return fail(CK_STATUS_INVALID_VALUE, fn_, "n=%lld must be >= 1", (long long)n);
        if (k < 1) return fail(CK_STATUS_INVALID_VALUE, fn_, "k=%lld must be >= 1", (long long)k);
        int64_t elems, bytes;
        const int64_t pairs[3][2] = {{m, k}, {n, k}, {m, n}};
        for (const auto& p : pairs) {
            if (__builtin_mul_overflow(p[0], p[1], &elems) ||
                __builtin_mul_overflow(elems, int64_t(std::max<size_t>(out_elem_bytes, 4)), &bytes))
                return fail(CK_STATUS_INVALID_VALUE, fn_,
                            "m=%lld, n=%lld, k=%lld overflow a 64-bit byte count", (long long)m,
                            (long long)n, (long long)k);
        }
        return CK_STATUS_SUCCESS;
    }

    ck_status_t multiple_of(int64_t value, int64_t divisor, const char* name, const char* why) const {
        if (value % divisor == 0) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_UNSUPPORTED, fn_, "%s=%lld must be a multiple of %lld (%s)", name,
                    (long long)value, (long long)divisor, why);
    }

    ck_status_t aligned(const void* p, size_t bytes, const char* name, const char* what) const {
        if (ck::is_aligned(p, bytes)) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_MISALIGNED, fn_, "%s=%p is not aligned to %zu bytes (%s)", name, p,
                    bytes, what);
    }

    ck_status_t element_aligned(const void* p, ck_dtype_t dtype, const char* name) const {
        return aligned(p, dtype_size(dtype), name, dtype_name(dtype));
    }

    // Runs a launcher (which returns cudaGetLastError() after its launches) and maps the result.
    // A non-sticky error that earlier CUDA calls of this thread left pending is cleared first:
    // otherwise it would surface here and be reported as this call's failure.
    template <class Launcher> ck_status_t launch(Launcher&& launcher) const {
        cudaGetLastError();
        return cuda_status(launcher(), fn_, "kernel launch", __FILE__, __LINE__);
    }

    const char* fn() const { return fn_; }

  private:
    const char* fn_;
};

}  // namespace

namespace ck {

namespace {

// query(device, &value) for the current device, cached per device (Cache is one static array per
// query). 0 (never cached) when there is no device or the query fails; a race between threads
// only repeats the same query.
template <class Cache, class Query> int cached_device_query(Cache& cache, Query&& query) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= int(std::size(cache)))
        return 0;
    if (cache[device] == 0) {
        int value = 0;
        if (!query(device, &value)) return 0;
        cache[device] = value;
    }
    return cache[device];
}

constexpr int kMaxDevices = 64;

}  // namespace

int sm_count() {
    static int cache[kMaxDevices] = {};
    return cached_device_query(cache, [](int device, int* n) {
        return cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
    });
}

int max_smem_optin() {
    static int cache[kMaxDevices] = {};
    return cached_device_query(cache, [](int device, int* bytes) {
        return cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
               cudaSuccess;
    });
}

int compute_capability() {
    static int cache[kMaxDevices] = {};
    return cached_device_query(cache, [](int device, int* cc) {
        int major = 0, minor = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
            return false;
        *cc = major * 10 + minor;
        return true;
    });
}

}  // namespace ck

namespace {

// ---------------------------------------------------------------------------------------------
// INT8 GEMM: which kernel runs a call.
// ---------------------------------------------------------------------------------------------
enum class GemmInt8Kernel { kAuto, kReference, kMma, kSmallM, kWgmma };

constexpr int64_t kSmallMMax = 16;  // the weight-streaming kernel serves m <= 16
constexpr int kMmaMinArch = 80;     // mma.sync with int8 operands

// CK_GEMM_INT8_KERNEL forces a variant (tests and benchmarks compare them); read on every call
// so that a process can switch between calls.
ck_status_t gemm_int8_forced(const Check& check, GemmInt8Kernel* kernel) {
    const char* v = getenv("CK_GEMM_INT8_KERNEL");
    *kernel = GemmInt8Kernel::kAuto;
    if (!v || !*v || !strcmp(v, "auto")) return CK_STATUS_SUCCESS;
    if (!strcmp(v, "reference")) *kernel = GemmInt8Kernel::kReference;
    else if (!strcmp(v, "mma")) *kernel = GemmInt8Kernel::kMma;
    else if (!strcmp(v, "small_m")) *kernel = GemmInt8Kernel::kSmallM;
    else if (!strcmp(v, "wgmma")) *kernel = GemmInt8Kernel::kWgmma;
    else
        return fail(CK_STATUS_INVALID_VALUE, check.fn(),
                    "CK_GEMM_INT8_KERNEL=%s is not one of auto, reference, mma, small_m, wgmma", v);
    return CK_STATUS_SUCCESS;
}

// The variant for this call: forced by the environment, else by the shape and the GPU. Small M
// streams the weight (its bytes dominate); larger M runs tensor-core tiles, wgmma on Hopper.
ck_status_t pick_gemm_int8_kernel(const Check& check, const ck::IntGemmArgs& args,
                                  GemmInt8Kernel* kernel) {
    CK_TRY(gemm_int8_forced(check, kernel));
    const int cc = ck::compute_capability();
    const bool nk = args.b_layout == CK_LAYOUT_NK;
    const bool sm90 = nk && ck::gemm_int8_sm90_available();
    switch (*kernel) {
        case GemmInt8Kernel::kAuto:
            if (cc < kMmaMinArch) *kernel = GemmInt8Kernel::kReference;
            else if (nk && args.m <= kSmallMMax) *kernel = GemmInt8Kernel::kSmallM;
            else if (sm90) *kernel = GemmInt8Kernel::kWgmma;
            else *kernel = GemmInt8Kernel::kMma;
            return CK_STATUS_SUCCESS;
        case GemmInt8Kernel::kReference:
            return CK_STATUS_SUCCESS;
        case GemmInt8Kernel::kMma:
            if (cc >= kMmaMinArch) return CK_STATUS_SUCCESS;
            return fail(CK_STATUS_UNSUPPORTED, check.fn(),
                        "CK_GEMM_INT8_KERNEL=mma needs compute capability 8.0 or newer (this GPU: %d.%d)",
                        cc / 10, cc % 10);
        case GemmInt8Kernel::kSmallM:
            if (cc >= kMmaMinArch && nk && args.m <= kSmallMMax) return CK_STATUS_SUCCESS;
            return fail(CK_STATUS_UNSUPPORTED, check.fn(),
                        "CK_GEMM_INT8_KERNEL=small_m needs m <= %lld, CK_LAYOUT_NK and compute "
                        "capability 8.0 or newer (m=%lld, layout=%d, GPU %d.%d)",
                        (long long)kSmallMMax, (long long)args.m, int(args.b_layout), cc / 10, cc % 10);
        case GemmInt8Kernel::kWgmma:
            if (sm90) return CK_STATUS_SUCCESS;
            return fail(CK_STATUS_UNSUPPORTED, check.fn(),
                        "CK_GEMM_INT8_KERNEL=wgmma needs CK_LAYOUT_NK, a compute capability 9.0 GPU "
                        "and a build with sm_90a (layout=%d, GPU %d.%d)",
                        int(args.b_layout), cc / 10, cc % 10);
    }
    return fail(CK_STATUS_INTERNAL_ERROR, check.fn(), "unknown GEMM kernel %d", int(*kernel));
}

// Shape and pointer rules shared by both INT8 GEMM entry points (see cuda_kernels.h).
ck_status_t check_gemm_int8_operands(const Check& check, const int8_t* a, const int8_t* b,
                                     ck_layout_t b_layout, int64_t m, int64_t n, int64_t k,
                                     const void* out, ck_dtype_t out_dtype) {
    CK_TRY(check.not_null(a, "a"));
    CK_TRY(check.not_null(b, "b"));
    CK_TRY(check.not_null(out, out_dtype == CK_DTYPE_INT32 ? "c" : "out"));
    CK_TRY(check.enum_value(b_layout, 2, "b_layout", "ck_layout_t"));
    CK_TRY(check.gemm_shape(m, n, k, dtype_size(out_dtype)));
    CK_TRY(check.multiple_of(k, 16, "k", "rows of a and b are read in 16-byte vectors"));
    if (b_layout == CK_LAYOUT_KN)
        CK_TRY(check.multiple_of(n, 16, "n", "rows of a [K, N] b are read in 16-byte vectors"));
    CK_TRY(check.aligned(a, 16, "a", "16-byte vector loads"));
    CK_TRY(check.aligned(b, 16, "b", "16-byte vector loads"));
    return check.element_aligned(out, out_dtype, out_dtype == CK_DTYPE_INT32 ? "c" : "out");
}

// The operands of an INT8 or INT4 GEMM call (validated by check_gemm_int8_operands or
// check_gemm_int4_operands); the epilogue's fields stay empty (int32 output) for the caller.
ck::IntGemmArgs int_gemm_operands(const void* a, const void* b, ck_layout_t b_layout,
                                  int64_t m, int64_t n, int64_t k, void* out,
                                  ck_dtype_t out_dtype) {
    ck::IntGemmArgs args{};
    args.a = a;
    args.b = b;
    args.b_layout = b_layout;
    args.m = m;
    args.n = n;
    args.k = k;
    args.activation = CK_ACTIVATION_NONE;
    args.out = out;
    args.out_dtype = out_dtype;
    return args;
}

// The scaled epilogue's arguments, shared by the INT8 and INT4 scaled GEMMs: checked before the
// operands (enum values) and after them (pointer alignment), in the order the messages promise.
ck_status_t check_gemm_scaled_epilogue(const Check& check, const float* scale_a,
                                       ck_granularity_t a_granularity, const float* scale_b,
                                       ck_granularity_t b_granularity,
                                       ck_activation_t activation, ck_dtype_t out_dtype) {
    CK_TRY(check.not_null(scale_a, "scale_a"));
    CK_TRY(check.not_null(scale_b, "scale_b"));
    CK_TRY(check.float_dtype(out_dtype, "out_dtype"));
    CK_TRY(check.enum_value(a_granularity, 2, "a_granularity", "ck_granularity_t"));
    CK_TRY(check.enum_value(b_granularity, 2, "b_granularity", "ck_granularity_t"));
    return check.enum_value(activation, 2, "activation", "ck_activation_t");
}

ck_status_t check_gemm_scaled_pointers(const Check& check, const float* scale_a,
                                       const float* scale_b, const void* bias, ck_dtype_t out_dtype) {
    CK_TRY(check.element_aligned(scale_a, CK_DTYPE_FP32, "scale_a"));
    CK_TRY(check.element_aligned(scale_b, CK_DTYPE_FP32, "scale_b"));
    if (bias) CK_TRY(check.element_aligned(bias, out_dtype, "bias"));
    return CK_STATUS_SUCCESS;
}

void set_gemm_epilogue(ck::IntGemmArgs& args, const float* scale_a,
                       ck_granularity_t a_granularity, const float* scale_b,
                       ck_granularity_t b_granularity, const void* bias,
                       ck_activation_t activation) {
    args.scale_a = scale_a;
    args.scale_a_per_row = a_granularity == CK_PER_ROW;
    args.scale_b = scale_b;
    args.scale_b_per_col = b_granularity == CK_PER_ROW;
    args.bias = bias;
    args.activation = activation;
}

ck_status_t run_gemm_int8(const Check& check, const ck::IntGemmArgs& args, cudaStream_t stream) {
    GemmInt8Kernel kernel;
    CK_TRY(pick_gemm_int8_kernel(check, args, &kernel));
    return check.launch([&] {
        switch (kernel) {
            case GemmInt8Kernel::kReference: return ck::gemm_int8_reference(args, stream);
            case GemmInt8Kernel::kMma: return ck::gemm_int8_mma(args, stream);
            case GemmInt8Kernel::kSmallM: return ck::gemm_int8_small_m(args, stream);
            case GemmInt8Kernel::kWgmma: return ck::gemm_int8_sm90(args, stream);
            case GemmInt8Kernel::kAuto: break;
        }
        return cudaErrorInvalidValue;
    });
}

// ---------------------------------------------------------------------------------------------
// W4A16 GEMM: which kernel runs a call. CK_GEMM_W4A16_KERNEL = auto, reference, small_m (M <= 16)
// or tc (prepacked weights only).
// ---------------------------------------------------------------------------------------------
enum class GemmW4A16Kernel { kReference, kSmallM, kTc };

ck_status_t pick_gemm_w4a16_kernel(const Check& check, const ck::GemmW4A16Args& args,
                                   GemmW4A16Kernel* kernel) {
    const char* v = getenv("CK_GEMM_W4A16_KERNEL");
    const int cc = ck::compute_capability();
    const bool sm80 = cc >= kMmaMinArch;
    const bool small_m_fits = sm80 && args.m <= kSmallMMax;
    if (!v || !*v || !strcmp(v, "auto")) {
        *kernel = small_m_fits ? GemmW4A16Kernel::kSmallM
                  : sm80 && args.prepacked ? GemmW4A16Kernel::kTc
                                           : GemmW4A16Kernel::kReference;
        return CK_STATUS_SUCCESS;
    }
    if (!strcmp(v, "reference")) {
        *kernel = GemmW4A16Kernel::kReference;
        return CK_STATUS_SUCCESS;
    }
    if (!strcmp(v, "small_m")) {
        *kernel = GemmW4A16Kernel::kSmallM;
        if (small_m_fits) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_UNSUPPORTED, check.fn(),
                    "CK_GEMM_W4A16_KERNEL=small_m needs m <= %lld and compute capability 8.0 or "
                    "newer (m=%lld, GPU %d.%d)",
                    (long long)kSmallMMax, (long long)args.m, cc / 10, cc % 10);
    }
    if (!strcmp(v, "tc")) {
        *kernel = GemmW4A16Kernel::kTc;
        if (sm80 && args.prepacked) return CK_STATUS_SUCCESS;
        return fail(CK_STATUS_UNSUPPORTED, check.fn(),
                    "CK_GEMM_W4A16_KERNEL=tc needs a prepacked weight (ck_gemm_w4a16_prepacked) and "
                    "compute capability 8.0 or newer (GPU %d.%d)", cc / 10, cc % 10);
    }
    return fail(CK_STATUS_INVALID_VALUE, check.fn(),
                "CK_GEMM_W4A16_KERNEL=%s is not one of auto, reference, small_m, tc", v);
}

ck_status_t run_gemm_w4a16(const Check& check, const ck::GemmW4A16Args& args, cudaStream_t stream) {
    GemmW4A16Kernel kernel = GemmW4A16Kernel::kReference;
    CK_TRY(pick_gemm_w4a16_kernel(check, args, &kernel));
    return check.launch([&] {
        switch (kernel) {
            case GemmW4A16Kernel::kReference: return ck::gemm_w4a16_reference(args, stream);
            case GemmW4A16Kernel::kSmallM:
                return args.prepacked ? ck::gemm_w4a16_prepacked_stream(args, stream)
                                      : ck::gemm_w4a16_small_m(args, stream);
            case GemmW4A16Kernel::kTc: return ck::gemm_w4a16_prepacked_tc(args, stream);
        }
        return cudaErrorInvalidValue;
    });
}

// What both W4A16 GEMM entry points require of their operands (see cuda_kernels.h); a prepacked
// weight's scales and zeros must also be 16-byte aligned (the kernels copy them with cp.async).
ck_status_t check_gemm_w4a16_operands(const Check& check, const void* x, ck_dtype_t dtype,
                                      const uint8_t* w, const void* scales, const uint8_t* zeros,
                                      int64_t group_size, ck_int4_mode_t mode, const void* bias,
                                      ck_activation_t activation, int64_t m, int64_t n, int64_t k,
                                      const void* out, bool prepacked) {
    const char* w_name = prepacked ? "w_prepacked" : "w_packed";
    const char* s_name = prepacked ? "scales_prepacked" : "scales";
    CK_TRY(check.not_null(x, "x"));
    CK_TRY(check.not_null(w, w_name));
    CK_TRY(check.not_null(scales, s_name));
    CK_TRY(check.not_null(out, "out"));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.half_dtype(dtype, "dtype"));
    CK_TRY(check.enum_value(activation, 2, "activation", "ck_activation_t"));
    CK_TRY(check.gemm_shape(m, n, k, dtype_size(dtype)));
    CK_TRY(check.multiple_of(k, 32, "k", "a lane dequantizes 32 weights of a row from 16 bytes"));
    CK_TRY(check.group_size(group_size));
    CK_TRY(check.aligned(x, 16, "x", "16-byte vector loads"));
    CK_TRY(check.aligned(w, 16, w_name, "16-byte vector loads"));
    if (prepacked) {
        CK_TRY(check.aligned(scales, 16, s_name, "16-byte asynchronous copies"));
        if (zeros) CK_TRY(check.aligned(zeros, 16, "zeros_prepacked", "16-byte asynchronous copies"));
    } else {
        CK_TRY(check.element_aligned(scales, dtype, s_name));
    }
    if (bias) CK_TRY(check.element_aligned(bias, dtype, "bias"));
    return check.element_aligned(out, dtype, "out");
}

// A group size as the INT4 kernels take it (CK_GROUP_ROW resolved to k) and the groups per row.
struct Int4Groups {
    int64_t size, count;
};
Int4Groups int4_groups(int64_t k, int64_t group_size) {
    return {group_size == CK_GROUP_ROW ? k : group_size, ck::int4_groups_per_row(k, group_size)};
}

ck::GemmW4A16Args gemm_w4a16_operands(const void* x, ck_dtype_t dtype, const uint8_t* w,
                                      const void* scales, const uint8_t* zeros, int64_t group_size,
                                      const void* bias, ck_activation_t activation, int64_t m,
                                      int64_t n, int64_t k, void* out, bool prepacked) {
    ck::GemmW4A16Args args{};
    args.x = x;
    args.dtype = dtype;
    args.w = w;
    args.scales = scales;
    args.zeros = zeros;
    const Int4Groups groups = int4_groups(k, group_size);
    args.group_size = groups.size;
    args.groups = groups.count;
    args.bias = bias;
    args.activation = activation;
    args.m = m;
    args.n = n;
    args.k = k;
    args.out = out;
    args.prepacked = prepacked;
    return args;
}

// ---------------------------------------------------------------------------------------------
// INT4 x INT4 GEMM: which kernel runs a call (CK_GEMM_INT4_KERNEL = auto, reference, mma).
// ---------------------------------------------------------------------------------------------
ck_status_t run_gemm_int4(const Check& check, const ck::IntGemmArgs& args, cudaStream_t stream) {
    const char* v = getenv("CK_GEMM_INT4_KERNEL");
    const int cc = ck::compute_capability();
    const bool sm80 = cc >= kMmaMinArch;
    const bool small_m_fits = sm80 && args.m <= kSmallMMax;
    enum class Variant { kReference, kMma, kSmallM } variant =
        small_m_fits ? Variant::kSmallM : sm80 ? Variant::kMma : Variant::kReference;
    if (v && *v && strcmp(v, "auto")) {
        if (!strcmp(v, "reference")) {
            variant = Variant::kReference;
        } else if (!strcmp(v, "mma")) {
            variant = Variant::kMma;
            if (!sm80)
                return fail(CK_STATUS_UNSUPPORTED, check.fn(),
                            "CK_GEMM_INT4_KERNEL=mma needs compute capability 8.0 or newer (this "
                            "GPU: %d.%d)", cc / 10, cc % 10);
        } else if (!strcmp(v, "small_m")) {
            variant = Variant::kSmallM;
            if (!small_m_fits)
                return fail(CK_STATUS_UNSUPPORTED, check.fn(),
                            "CK_GEMM_INT4_KERNEL=small_m needs m <= %lld and compute capability "
                            "8.0 or newer (m=%lld, GPU %d.%d)",
                            (long long)kSmallMMax, (long long)args.m, cc / 10, cc % 10);
        } else {
            return fail(CK_STATUS_INVALID_VALUE, check.fn(),
                        "CK_GEMM_INT4_KERNEL=%s is not one of auto, reference, mma, small_m", v);
        }
    }
    return check.launch([&] {
        switch (variant) {
            case Variant::kSmallM: return ck::gemm_int4_small_m(args, stream);
            case Variant::kMma: return ck::gemm_int4_mma(args, stream);
            case Variant::kReference: break;
        }
        return ck::gemm_int4_reference(args, stream);
    });
}

// Shape and pointer rules shared by both INT4 x INT4 entry points (see cuda_kernels.h).
ck_status_t check_gemm_int4_operands(const Check& check, const uint8_t* a, const uint8_t* b,
                                     int64_t m, int64_t n, int64_t k, const void* out,
                                     ck_dtype_t out_dtype) {
    CK_TRY(check.not_null(a, "a"));
    CK_TRY(check.not_null(b, "b"));
    CK_TRY(check.not_null(out, out_dtype == CK_DTYPE_INT32 ? "c" : "out"));
    CK_TRY(check.gemm_shape(m, n, k, dtype_size(out_dtype)));
    CK_TRY(check.multiple_of(k, 32, "k", "packed rows are read in 16-byte vectors"));
    CK_TRY(check.aligned(a, 16, "a", "16-byte vector loads"));
    CK_TRY(check.aligned(b, 16, "b", "16-byte vector loads"));
    return check.element_aligned(out, out_dtype, out_dtype == CK_DTYPE_INT32 ? "c" : "out");
}

// ---------------------------------------------------------------------------------------------
// Importers: the rules both checkpoint formats share (see cuda_kernels.h).
// ---------------------------------------------------------------------------------------------
ck_status_t check_import(const Check& check, const int32_t* qweight, const int32_t* qzeros,
                         const void* scales, ck_dtype_t dtype, int64_t n, int64_t k,
                         int64_t group_size, const uint8_t* w_packed, const void* scales_out,
                         const uint8_t* zeros_out) {
    CK_TRY(check.not_null(qweight, "qweight"));
    CK_TRY(check.not_null(qzeros, "qzeros"));
    CK_TRY(check.not_null(scales, "scales"));
    CK_TRY(check.not_null(w_packed, "w_packed"));
    CK_TRY(check.not_null(scales_out, "scales_out"));
    CK_TRY(check.not_null(zeros_out, "zeros_out"));
    CK_TRY(check.half_dtype(dtype, "dtype"));
    CK_TRY(check.gemm_shape(1, n, k, 4));
    CK_TRY(check.multiple_of(n, 8, "n", "eight codes or zeros per int32 along N"));
    CK_TRY(check.multiple_of(k, 32, "k", "ck_gemm_w4a16 reads 32 codes of a row at a time"));
    CK_TRY(check.group_size(group_size));
    CK_TRY(check.element_aligned(qweight, CK_DTYPE_INT32, "qweight"));
    CK_TRY(check.element_aligned(qzeros, CK_DTYPE_INT32, "qzeros"));
    CK_TRY(check.element_aligned(scales, dtype, "scales"));
    return check.element_aligned(scales_out, dtype, "scales_out");
}

ck::Int4ImportArgs import_operands(const int32_t* qweight, const int32_t* qzeros,
                                   const void* scales, ck_dtype_t dtype, int64_t n, int64_t k,
                                   int64_t group_size, uint8_t* w_packed, void* scales_out,
                                   uint8_t* zeros_out) {
    ck::Int4ImportArgs args{};
    args.qweight = qweight;
    args.qzeros = qzeros;
    args.scales = scales;
    args.dtype = dtype;
    args.n = n;
    args.k = k;
    const Int4Groups groups = int4_groups(k, group_size);
    args.group_size = groups.size;
    args.groups = groups.count;
    args.w_out = w_packed;
    args.scales_out = scales_out;
    args.zeros_out = zeros_out;
    return args;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Exported functions
// ---------------------------------------------------------------------------------------------
extern "C" {

int ck_version(void) { return CK_VERSION; }

const char* ck_status_string(ck_status_t status) {
    switch (status) {
        case CK_STATUS_SUCCESS: return "CK_STATUS_SUCCESS";
        case CK_STATUS_INVALID_VALUE: return "CK_STATUS_INVALID_VALUE";
        case CK_STATUS_MISALIGNED: return "CK_STATUS_MISALIGNED";
        case CK_STATUS_UNSUPPORTED: return "CK_STATUS_UNSUPPORTED";
        case CK_STATUS_NO_DEVICE: return "CK_STATUS_NO_DEVICE";
        case CK_STATUS_CUDA_ERROR: return "CK_STATUS_CUDA_ERROR";
        case CK_STATUS_CUBLAS_ERROR: return "CK_STATUS_CUBLAS_ERROR";
        case CK_STATUS_INTERNAL_ERROR: return "CK_STATUS_INTERNAL_ERROR";
    }
    return "CK_STATUS_UNKNOWN";
}

const char* ck_last_error_message(void) { return t_message.c_str(); }

int ck_last_cuda_error(void) { return t_cuda_error; }

ck_status_t ck_device_count(int* count) {
    static const char* fn = "ck_device_count";
    const Check check(fn);
    CK_TRY(check.not_null(count, "count"));
    *count = 0;
    int n = 0;
    CK_TRY(CK_CUDA(fn, cudaGetDeviceCount(&n)));
    if (n == 0) return fail(CK_STATUS_NO_DEVICE, fn, "no CUDA device is visible");
    *count = n;
    return CK_STATUS_SUCCESS;
}

ck_status_t ck_quantize_int8(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                             ck_granularity_t granularity, ck_scale_mode_t scale_mode,
                             float* scales, int8_t* q, ck_stream_t stream) {
    const Check check("ck_quantize_int8");
    CK_TRY(check.not_null(x, "x"));
    CK_TRY(check.not_null(scales, "scales"));
    CK_TRY(check.not_null(q, "q"));
    CK_TRY(check.float_dtype(x_dtype, "x_dtype"));
    CK_TRY(check.enum_value(granularity, 2, "granularity", "ck_granularity_t"));
    CK_TRY(check.enum_value(scale_mode, 2, "scale_mode", "ck_scale_mode_t"));
    CK_TRY(check.matrix(rows, cols, dtype_size(x_dtype)));
    CK_TRY(check.element_aligned(x, x_dtype, "x"));
    CK_TRY(check.element_aligned(scales, CK_DTYPE_FP32, "scales"));
    return check.launch([&] {
        return ck::quantize_int8(x, x_dtype, rows, cols, granularity, scale_mode, scales, q, stream);
    });
}

ck_status_t ck_dequantize_int8(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                               ck_granularity_t granularity, void* out, ck_dtype_t out_dtype,
                               ck_stream_t stream) {
    const Check check("ck_dequantize_int8");
    CK_TRY(check.not_null(q, "q"));
    CK_TRY(check.not_null(scales, "scales"));
    CK_TRY(check.not_null(out, "out"));
    CK_TRY(check.float_dtype(out_dtype, "out_dtype"));
    CK_TRY(check.enum_value(granularity, 2, "granularity", "ck_granularity_t"));
    CK_TRY(check.matrix(rows, cols, dtype_size(out_dtype)));
    CK_TRY(check.element_aligned(scales, CK_DTYPE_FP32, "scales"));
    CK_TRY(check.element_aligned(out, out_dtype, "out"));
    return check.launch([&] {
        return ck::dequantize_int8(q, scales, rows, cols, granularity, out, out_dtype, stream);
    });
}

int64_t ck_int4_groups_per_row(int64_t cols, int64_t group_size) {
    return ck::int4_groups_per_row(cols, group_size);
}

ck_status_t ck_quantize_int4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                             int64_t group_size, ck_int4_mode_t mode, uint8_t* q_packed,
                             void* scales, uint8_t* zeros, ck_stream_t stream) {
    const Check check("ck_quantize_int4");
    CK_TRY(check.not_null(x, "x"));
    CK_TRY(check.not_null(q_packed, "q_packed"));
    CK_TRY(check.not_null(scales, "scales"));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.float_dtype(x_dtype, "x_dtype"));
    CK_TRY(check.matrix(rows, cols, dtype_size(x_dtype)));
    CK_TRY(check.group_size(group_size));
    CK_TRY(check.element_aligned(x, x_dtype, "x"));
    CK_TRY(check.element_aligned(scales, x_dtype, "scales"));
    return check.launch([&] {
        return ck::quantize_int4(x, x_dtype, rows, cols, group_size, mode, q_packed, scales, zeros,
                                 stream);
    });
}

ck_status_t ck_dequantize_int4(const uint8_t* q_packed, const void* scales, const uint8_t* zeros,
                               int64_t rows, int64_t cols, int64_t group_size, ck_int4_mode_t mode,
                               void* out, ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_dequantize_int4");
    CK_TRY(check.not_null(q_packed, "q_packed"));
    CK_TRY(check.not_null(scales, "scales"));
    CK_TRY(check.not_null(out, "out"));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.float_dtype(out_dtype, "out_dtype"));
    CK_TRY(check.matrix(rows, cols, dtype_size(out_dtype)));
    CK_TRY(check.group_size(group_size));
    CK_TRY(check.element_aligned(scales, out_dtype, "scales"));
    CK_TRY(check.element_aligned(out, out_dtype, "out"));
    return check.launch([&] {
        return ck::dequantize_int4(q_packed, scales, zeros, rows, cols, group_size, mode, out,
                                   out_dtype, stream);
    });
}

ck_status_t ck_gemm_int8(const int8_t* a, const int8_t* b, ck_layout_t b_layout, int64_t m, int64_t n,
                         int64_t k, int32_t* c, ck_stream_t stream) {
    const Check check("ck_gemm_int8");
    CK_TRY(check_gemm_int8_operands(check, a, b, b_layout, m, n, k, c, CK_DTYPE_INT32));
    return run_gemm_int8(check, int_gemm_operands(a, b, b_layout, m, n, k, c, CK_DTYPE_INT32),
                         stream);
}

ck_status_t ck_gemm_int8_scaled(const int8_t* a, const int8_t* b, ck_layout_t b_layout, int64_t m,
                                int64_t n, int64_t k, const float* scale_a,
                                ck_granularity_t a_granularity, const float* scale_b,
                                ck_granularity_t b_granularity, const void* bias,
                                ck_activation_t activation, void* out, ck_dtype_t out_dtype,
                                ck_stream_t stream) {
    const Check check("ck_gemm_int8_scaled");
    CK_TRY(check_gemm_scaled_epilogue(check, scale_a, a_granularity, scale_b, b_granularity,
                                      activation, out_dtype));
    CK_TRY(check_gemm_int8_operands(check, a, b, b_layout, m, n, k, out, out_dtype));
    CK_TRY(check_gemm_scaled_pointers(check, scale_a, scale_b, bias, out_dtype));
    ck::IntGemmArgs args = int_gemm_operands(a, b, b_layout, m, n, k, out, out_dtype);
    set_gemm_epilogue(args, scale_a, a_granularity, scale_b, b_granularity, bias, activation);
    return run_gemm_int8(check, args, stream);
}

ck_status_t ck_linear(const void* x, const void* w, const void* bias, ck_dtype_t dtype, int64_t m,
                      int64_t n, int64_t k, ck_activation_t activation, void* out,
                      ck_stream_t stream) {
    static const char* fn = "ck_linear";
    const Check check(fn);
    CK_TRY(check.not_null(x, "x"));
    CK_TRY(check.not_null(w, "w"));
    CK_TRY(check.not_null(out, "out"));
    CK_TRY(check.float_dtype(dtype, "dtype"));
    CK_TRY(check.enum_value(activation, 2, "activation", "ck_activation_t"));
    CK_TRY(check.gemm_shape(m, n, k, dtype_size(dtype)));
    const int64_t per_vector = 16 / int64_t(dtype_size(dtype));
    CK_TRY(check.multiple_of(k, per_vector, "k", "rows of x and w must start 16-byte aligned"));
    CK_TRY(check.multiple_of(n, per_vector, "n", "rows of out must start 16-byte aligned"));
    CK_TRY(check.aligned(x, 16, "x", "cuBLASLt's vectorized kernels"));
    CK_TRY(check.aligned(w, 16, "w", "cuBLASLt's vectorized kernels"));
    if (bias) CK_TRY(check.aligned(bias, 16, "bias", "cuBLASLt's vectorized kernels"));
    CK_TRY(check.aligned(out, 16, "out", "cuBLASLt's vectorized kernels"));
    int devices = 0;  // cuBLASLt would report a missing device as a generic failure
    CK_TRY(CK_CUDA(fn, cudaGetDeviceCount(&devices)));
    if (devices == 0) return fail(CK_STATUS_NO_DEVICE, fn, "no CUDA device is visible");
    cudaGetLastError();
    return CK_CUBLAS(fn, ck::linear(x, w, bias, dtype, m, n, k, activation, out, stream));
}

ck_status_t ck_gemm_w4a16(const void* x, ck_dtype_t dtype, const uint8_t* w_packed,
                          const void* scales, const uint8_t* zeros, int64_t group_size,
                          ck_int4_mode_t mode, const void* bias, ck_activation_t activation,
                          int64_t m, int64_t n, int64_t k, void* out, ck_stream_t stream) {
    const Check check("ck_gemm_w4a16");
    CK_TRY(check_gemm_w4a16_operands(check, x, dtype, w_packed, scales, zeros, group_size, mode,
                                     bias, activation, m, n, k, out, false));
    return run_gemm_w4a16(check,
                          gemm_w4a16_operands(x, dtype, w_packed, scales, zeros, group_size, bias,
                                              activation, m, n, k, out, false),
                          stream);
}

int64_t ck_w4a16_prepacked_bytes(int64_t n, int64_t k) {
    if (n < 1 || k < 32 || k % 32 || n > (int64_t(1) << 40) || k > (int64_t(1) << 40)) return 0;
    int64_t bytes;
    if (__builtin_mul_overflow(ck::prepacked_rows(n), ck::prepacked_chunks(k) * ck::kPackK / 2, &bytes))
        return 0;
    return bytes;
}

int64_t ck_w4a16_prepacked_groups(int64_t n, int64_t k, int64_t group_size) {
    const int64_t groups = ck::int4_groups_per_row(k, group_size);
    if (groups == 0 || ck_w4a16_prepacked_bytes(n, k) == 0) return 0;
    int64_t values;
    if (__builtin_mul_overflow(ck::prepacked_rows(n), groups, &values)) return 0;
    return values;
}

ck_status_t ck_w4a16_prepack(const uint8_t* w_packed, const void* scales, const uint8_t* zeros,
                             ck_dtype_t dtype, int64_t n, int64_t k, int64_t group_size,
                             ck_int4_mode_t mode, uint8_t* w_prepacked, void* scales_prepacked,
                             uint8_t* zeros_prepacked, ck_stream_t stream) {
    const Check check("ck_w4a16_prepack");
    CK_TRY(check.not_null(w_packed, "w_packed"));
    CK_TRY(check.not_null(scales, "scales"));
    CK_TRY(check.not_null(w_prepacked, "w_prepacked"));
    CK_TRY(check.not_null(scales_prepacked, "scales_prepacked"));
    CK_TRY(check.int4_mode(mode, zeros));
    if (mode == CK_INT4_ASYMMETRIC) CK_TRY(check.not_null(zeros_prepacked, "zeros_prepacked"));
    else if (zeros_prepacked)
        return fail(CK_STATUS_INVALID_VALUE, check.fn(),
                    "zeros_prepacked must be NULL for CK_INT4_SYMMETRIC (it has no zero points)");
    CK_TRY(check.half_dtype(dtype, "dtype"));
    CK_TRY(check.gemm_shape(1, n, k, 2));
    CK_TRY(check.multiple_of(k, 32, "k", "a lane dequantizes 32 weights of a row from 16 bytes"));
    CK_TRY(check.group_size(group_size));
    if (ck_w4a16_prepacked_bytes(n, k) == 0)
        return fail(CK_STATUS_INVALID_VALUE, check.fn(), "n=%lld, k=%lld overflow a 64-bit byte count",
                    (long long)n, (long long)k);
    CK_TRY(check.aligned(w_packed, 16, "w_packed", "16-byte vector loads"));
    CK_TRY(check.element_aligned(scales, dtype, "scales"));
    CK_TRY(check.aligned(w_prepacked, 16, "w_prepacked", "16-byte vector stores"));
    CK_TRY(check.aligned(scales_prepacked, 16, "scales_prepacked", "the GEMM's 16-byte copies"));
    if (zeros_prepacked) CK_TRY(check.aligned(zeros_prepacked, 16, "zeros_prepacked", "the GEMM's 16-byte copies"));
    ck::W4A16PrepackArgs args{};
    args.w = w_packed;
    args.scales = scales;
    args.zeros = zeros;
    args.dtype = dtype;
    args.n = n;
    args.k = k;
    const Int4Groups groups = int4_groups(k, group_size);
    args.group_size = groups.size;
    args.groups = groups.count;
    args.w_out = w_prepacked;
    args.scales_out = scales_prepacked;
    args.zeros_out = zeros_prepacked;
    return check.launch([&] { return ck::w4a16_prepack(args, stream); });
}

ck_status_t ck_gemm_w4a16_prepacked(const void* x, ck_dtype_t dtype, const uint8_t* w_prepacked,
                                    const void* scales_prepacked, const uint8_t* zeros_prepacked,
                                    int64_t group_size, ck_int4_mode_t mode, const void* bias,
                                    ck_activation_t activation, int64_t m, int64_t n, int64_t k,
                                    void* out, ck_stream_t stream) {
    const Check check("ck_gemm_w4a16_prepacked");
    CK_TRY(check_gemm_w4a16_operands(check, x, dtype, w_prepacked, scales_prepacked,
                                     zeros_prepacked, group_size, mode, bias, activation, m, n, k,
                                     out, true));
    return run_gemm_w4a16(check,
                          gemm_w4a16_operands(x, dtype, w_prepacked, scales_prepacked,
                                              zeros_prepacked, group_size, bias, activation, m, n,
                                              k, out, true),
                          stream);
}

ck_status_t ck_import_gptq(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                           const int32_t* g_idx, ck_dtype_t dtype, int64_t n, int64_t k,
                           int64_t group_size, uint8_t* w_packed, void* scales_out,
                           uint8_t* zeros_out, int32_t* perm, ck_stream_t stream) {
    const Check check("ck_import_gptq");
    CK_TRY(check_import(check, qweight, qzeros, scales, dtype, n, k, group_size, w_packed,
                        scales_out, zeros_out));
    if (g_idx) {
        CK_TRY(check.not_null(perm, "perm"));
        CK_TRY(check.element_aligned(g_idx, CK_DTYPE_INT32, "g_idx"));
        CK_TRY(check.element_aligned(perm, CK_DTYPE_INT32, "perm"));
    } else if (perm) {
        return fail(CK_STATUS_INVALID_VALUE, check.fn(),
                    "perm must be NULL without g_idx (the columns keep their order)");
    }
    ck::Int4ImportArgs args = import_operands(qweight, qzeros, scales, dtype, n, k, group_size,
                                              w_packed, scales_out, zeros_out);
    args.g_idx = g_idx;
    args.perm = perm;
    return check.launch([&] { return ck::import_gptq(args, stream); });
}

ck_status_t ck_import_awq(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                          ck_dtype_t dtype, int64_t n, int64_t k, int64_t group_size,
                          uint8_t* w_packed, void* scales_out, uint8_t* zeros_out,
                          ck_stream_t stream) {
    const Check check("ck_import_awq");
    CK_TRY(check_import(check, qweight, qzeros, scales, dtype, n, k, group_size, w_packed,
                        scales_out, zeros_out));
    const ck::Int4ImportArgs args = import_operands(qweight, qzeros, scales, dtype, n, k,
                                                    group_size, w_packed, scales_out, zeros_out);
    return check.launch([&] { return ck::import_awq(args, stream); });
}

ck_status_t ck_permute_columns(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                               const int32_t* perm, void* out, ck_stream_t stream) {
    const Check check("ck_permute_columns");
    CK_TRY(check.not_null(x, "x"));
    CK_TRY(check.not_null(perm, "perm"));
    CK_TRY(check.not_null(out, "out"));
    CK_TRY(check.float_dtype(dtype, "dtype"));
    CK_TRY(check.matrix(rows, cols, dtype_size(dtype)));
    CK_TRY(check.element_aligned(x, dtype, "x"));
    CK_TRY(check.element_aligned(perm, CK_DTYPE_INT32, "perm"));
    CK_TRY(check.element_aligned(out, dtype, "out"));
    return check.launch([&] { return ck::permute_columns(x, dtype, rows, cols, perm, out, stream); });
}

ck_status_t ck_gemm_int4(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n, int64_t k,
                         int32_t* c, ck_stream_t stream) {
    const Check check("ck_gemm_int4");
    CK_TRY(check_gemm_int4_operands(check, a, b, m, n, k, c, CK_DTYPE_INT32));
    return run_gemm_int4(check,
                         int_gemm_operands(a, b, CK_LAYOUT_NK, m, n, k, c, CK_DTYPE_INT32), stream);
}

ck_status_t ck_gemm_int4_scaled(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n,
                                int64_t k, const float* scale_a, ck_granularity_t a_granularity,
                                const float* scale_b, ck_granularity_t b_granularity,
                                const void* bias, ck_activation_t activation, void* out,
                                ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_gemm_int4_scaled");
    CK_TRY(check_gemm_scaled_epilogue(check, scale_a, a_granularity, scale_b, b_granularity,
                                      activation, out_dtype));
    CK_TRY(check_gemm_int4_operands(check, a, b, m, n, k, out, out_dtype));
    CK_TRY(check_gemm_scaled_pointers(check, scale_a, scale_b, bias, out_dtype));
    ck::IntGemmArgs args = int_gemm_operands(a, b, CK_LAYOUT_NK, m, n, k, out, out_dtype);
    set_gemm_epilogue(args, scale_a, a_granularity, scale_b, b_granularity, bias, activation);
    return run_gemm_int4(check, args, stream);
}

}  // extern "C"
