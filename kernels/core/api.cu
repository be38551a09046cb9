// api.cu - the entry points' shared machinery (api.cuh): the per-thread error state, the checks,
// dtype names and sizes, the variant selector's messages, and the cached device queries that the
// launchers use too (declared in common.cuh).
#include "kernels/core/api.cuh"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace ck {

// ---------------------------------------------------------------------------------------------
// The per-thread error state behind ck_last_error_message() / ck_last_cuda_error().
// ---------------------------------------------------------------------------------------------
namespace {

thread_local std::string t_message;
thread_local int t_cuda_error = 0;

ck_status_t vfail(ck_status_t status, const char* fn, const char* fmt, va_list args) {
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, args);
    t_message = std::string(fn) + ": " + buf;
    return status;
}

bool is_no_device(cudaError_t err) {
    return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
           err == cudaErrorCallRequiresNewerDriver;
}

}  // namespace

const char* last_error_message() { return t_message.c_str(); }

int last_cuda_error() { return t_cuda_error; }

ck_status_t fail(ck_status_t status, const char* fn, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vfail(status, fn, fmt, args);
    va_end(args);
    return status;
}

ck_status_t cuda_status(cudaError_t err, const char* fn, const char* what, const char* file,
                        int line) {
    if (err == cudaSuccess) return CK_STATUS_SUCCESS;
    cudaGetLastError();  // clear a non-sticky error so that it is not reported twice
    const ck_status_t status = is_no_device(err) ? CK_STATUS_NO_DEVICE : CK_STATUS_CUDA_ERROR;
    fail(status, fn, "%s failed: %s (%s) at %s:%d", what, cudaGetErrorName(err),
         cudaGetErrorString(err), file, line);
    t_cuda_error = int(err);
    return status;
}

ck_status_t cublas_status(cublasStatus_t st, const char* fn, const char* what, const char* file,
                          int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_CUBLAS_ERROR, fn, "%s failed: %s (%s) at %s:%d", what,
                cublasGetStatusName(st), cublasGetStatusString(st), file, line);
}

std::string formatted(const char* fmt, ...) {
    char buf[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    return buf;
}

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------
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
// Validation
// ---------------------------------------------------------------------------------------------
Check::Check(const char* fn) : fn_(fn) {
    t_message.clear();
    t_cuda_error = 0;
}

ck_status_t Check::fail(ck_status_t status, const char* fmt, ...) const {
    va_list args;
    va_start(args, fmt);
    vfail(status, fn_, fmt, args);
    va_end(args);
    return status;
}

ck_status_t Check::not_null(const void* p, const char* name) const {
    if (p) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_INVALID_VALUE, "%s is NULL", name);
}

ck_status_t Check::struct_size(size_t size, size_t expected, const char* type,
                               std::initializer_list<size_t> older) const {
    if (size == expected) return CK_STATUS_SUCCESS;
    for (size_t known : older)
        if (size == known) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_INVALID_VALUE,
                "params->struct_size=%zu is not a known size of %s (this library: %zu%s)", size,
                type, expected, older.size() ? ", or an earlier version's" : "");
}

ck_status_t Check::in_range(int64_t value, int64_t lo, int64_t hi, const char* name) const {
    if (value >= lo && value <= hi) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_INVALID_VALUE, "%s=%lld must be in [%lld, %lld]", name, (long long)value,
                (long long)lo, (long long)hi);
}

ck_status_t Check::not_null(std::initializer_list<Named> pointers) const {
    for (const Named& p : pointers) CK_TRY(not_null(p.p, p.name));
    return CK_STATUS_SUCCESS;
}

ck_status_t Check::enum_value(int value, int count, const char* name, const char* type) const {
    if (value >= 0 && value < count) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_INVALID_VALUE, "%s=%d is not a valid %s", name, value, type);
}

ck_status_t Check::float_dtype(ck_dtype_t dtype, const char* name) const {
    if (!dtype_name(dtype))
        return fail(CK_STATUS_INVALID_VALUE, "%s=%d is not a valid ck_dtype_t", name, int(dtype));
    if (dtype == CK_DTYPE_FP32 || dtype == CK_DTYPE_FP16 || dtype == CK_DTYPE_BF16)
        return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_UNSUPPORTED,
                "%s=%s is not supported here (use CK_DTYPE_FP32, CK_DTYPE_FP16 or CK_DTYPE_BF16)",
                name, dtype_name(dtype));
}

ck_status_t Check::half_dtype(ck_dtype_t dtype, const char* name) const {
    CK_TRY(float_dtype(dtype, name));
    if (dtype != CK_DTYPE_FP32) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_UNSUPPORTED,
                "%s=CK_DTYPE_FP32 is not supported (use CK_DTYPE_FP16 or CK_DTYPE_BF16)", name);
}

ck_status_t Check::int4_mode(ck_int4_mode_t mode, const void* zeros, const char* name) const {
    CK_TRY(enum_value(mode, 2, "mode", "ck_int4_mode_t"));
    return zero_points(mode, zeros, name);
}

ck_status_t Check::zero_points(ck_int4_mode_t mode, const void* zeros, const char* name) const {
    if (mode == CK_INT4_ASYMMETRIC) return not_null(zeros, name);
    if (!zeros) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_INVALID_VALUE,
                "%s must be NULL for CK_INT4_SYMMETRIC (it has no zero points)", name);
}

ck_status_t Check::matrix(int64_t rows, int64_t cols, size_t max_elem_bytes,
                          const char* rows_name, const char* cols_name) const {
    if (rows < 1)
        return fail(CK_STATUS_INVALID_VALUE, "%s=%lld must be >= 1", rows_name, (long long)rows);
    if (cols < 1)
        return fail(CK_STATUS_INVALID_VALUE, "%s=%lld must be >= 1", cols_name, (long long)cols);
    int64_t elems, bytes;
    if (__builtin_mul_overflow(rows, cols, &elems) ||
        __builtin_mul_overflow(elems, int64_t(max_elem_bytes), &bytes))
        return fail(CK_STATUS_INVALID_VALUE, "%s=%lld x %s=%lld overflows a 64-bit byte count",
                    rows_name, (long long)rows, cols_name, (long long)cols);
    return CK_STATUS_SUCCESS;
}

ck_status_t Check::row_scales(ck_granularity_t granularity, int64_t rows) const {
    if (granularity != CK_PER_ROW || rows <= INT64_MAX / int64_t(sizeof(float)))
        return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_INVALID_VALUE,
                "rows=%lld float32 scales (CK_PER_ROW) overflow a 64-bit byte count",
                (long long)rows);
}

ck_status_t Check::gemm_shape(int64_t m, int64_t n, int64_t k, size_t out_elem_bytes,
                              const char* m_name) const {
    if (m < 1) return fail(CK_STATUS_INVALID_VALUE, "%s=%lld must be >= 1", m_name, (long long)m);
    if (n < 1) return fail(CK_STATUS_INVALID_VALUE, "n=%lld must be >= 1", (long long)n);
    if (k < 1) return fail(CK_STATUS_INVALID_VALUE, "k=%lld must be >= 1", (long long)k);
    // Each operand's elements counted at the larger of the output's size and 4 bytes.
    const int64_t elem_bytes = int64_t(std::max<size_t>(out_elem_bytes, 4));
    const int64_t pairs[3][2] = {{m, k}, {n, k}, {m, n}};
    for (const auto& p : pairs) {
        int64_t elems, bytes;
        if (__builtin_mul_overflow(p[0], p[1], &elems) ||
            __builtin_mul_overflow(elems, elem_bytes, &bytes))
            return fail(CK_STATUS_INVALID_VALUE,
                        "%s=%lld, n=%lld, k=%lld overflow a 64-bit byte count", m_name,
                        (long long)m, (long long)n, (long long)k);
    }
    return CK_STATUS_SUCCESS;
}

ck_status_t Check::group_size(int64_t group_size) const {
    if (group_size == 32 || group_size == 64 || group_size == 128 || group_size == CK_GROUP_ROW)
        return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_UNSUPPORTED,
                "group_size=%lld is not supported (use 32, 64, 128 or -1 for a whole row)",
                (long long)group_size);
}

ck_status_t Check::multiple_of(int64_t value, int64_t divisor, const char* name,
                               const char* why) const {
    if (value % divisor == 0) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_UNSUPPORTED, "%s=%lld must be a multiple of %lld (%s)", name,
                (long long)value, (long long)divisor, why);
}

ck_status_t Check::aligned(const void* p, size_t bytes, const char* name, const char* what) const {
    if (is_aligned(p, bytes)) return CK_STATUS_SUCCESS;
    return fail(CK_STATUS_MISALIGNED, "%s=%p is not aligned to %zu bytes (%s)", name, p, bytes,
                what);
}

ck_status_t Check::element_aligned(const void* p, ck_dtype_t dtype, const char* name) const {
    return aligned(p, dtype_size(dtype), name, dtype_name(dtype));
}

ck_status_t Check::element_aligned(std::initializer_list<Element> pointers) const {
    for (const Element& p : pointers) CK_TRY(element_aligned(p.p, p.dtype, p.name));
    return CK_STATUS_SUCCESS;
}

ck_status_t Check::device_count(int* count) const {
    *count = 0;
    int n = 0;
    CK_TRY(CK_CUDA(fn_, cudaGetDeviceCount(&n)));
    if (n == 0) return fail(CK_STATUS_NO_DEVICE, "no CUDA device is visible");
    *count = n;
    return CK_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Kernel variants
// ---------------------------------------------------------------------------------------------
const char* forced_variant(const char* env) {
    const char* value = getenv(env);
    if (!value || !*value || !strcmp(value, "auto")) return nullptr;
    return value;
}

ck_status_t unknown_variant(const Check& check, const char* env, const char* value,
                            const std::string& names) {
    return check.fail(CK_STATUS_INVALID_VALUE, "%s=%s is not one of %s", env, value,
                      names.c_str());
}

ck_status_t variant_cannot_serve(const Check& check, const char* env, const char* name,
                                 const char* needs, const std::string& facts, int cc) {
    return check.fail(CK_STATUS_UNSUPPORTED, "%s=%s needs %s (%s, GPU %d.%d)", env, name, needs,
                      facts.c_str(), cc / 10, cc % 10);
}

ck_status_t grid_too_large(const Check& check, const char* name, const std::string& facts) {
    return check.fail(CK_STATUS_UNSUPPORTED,
                      "the %s kernel cannot launch this shape (%s): it needs more thread blocks "
                      "than one launch holds (2^31 - 1)", name, facts.c_str());
}

// ---------------------------------------------------------------------------------------------
// Device queries (declared in common.cuh)
// ---------------------------------------------------------------------------------------------
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

int forced_plan_value(const char* name, std::initializer_list<int> allowed) {
    const char* text = std::getenv(name);
    if (!text) return 0;
    for (int v : allowed)
        if (std::strcmp(text, std::to_string(v).c_str()) == 0) return v;
    return 0;
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
