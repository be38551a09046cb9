// cuda_kernels.cu - the exported C entry points: validate -> pick a kernel variant -> launch ->
// map errors. Validation happens entirely on the host, before any CUDA call, so a rejected call
// launches nothing and works without a GPU. Kernels live in kernels/ and trust their arguments.
#include <cstdarg>
#include <cstdio>
#include <string>

#include "cuda_kernels.h"
#include "kernels/common.cuh"
#include "kernels/quantize.cuh"

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

#define CK_TRY(expr)                                   \
    do {                                               \
        const ck_status_t ck_try_status_ = (expr);     \
        if (ck_try_status_ != CK_STATUS_SUCCESS) return ck_try_status_; \
    } while (0)

#define CK_CUDA(fn, call) cuda_status((call), fn, #call, __FILE__, __LINE__)

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

  private:
    const char* fn_;
};

}  // namespace

namespace ck {

int sm_count() {
    constexpr int kMaxDevices = 64;
    static int cache[kMaxDevices] = {};  // 0: not read yet; a race only repeats the same query
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 0;
    if (cache[device] == 0) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
        cache[device] = n;
    }
    return cache[device];
}

}  // namespace ck

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

}  // extern "C"
