// api.cuh - what the entry points (cuda_kernels.cu) share and no kernel needs: the calling
// thread's error state behind ck_last_error_message(), the one path from a CUDA or cuBLAS error
// to a status, the host-side argument checks (Check), dtype names and sizes, and the selector of
// kernel variants behind the CK_GEMM_*_KERNEL overrides. Host code only; nothing here is exported.
// (The cached device queries it defines in api.cu, sm_count() and friends, are declared in
// common.cuh: the launchers use them too.)
#pragma once

#include <cublas_api.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "cuda_kernels.h"
#include "kernels/core/common.cuh"

namespace ck {

// ---------------------------------------------------------------------------------------------
// Errors. Every failure becomes a status plus a message "<fn>: <what exactly>" that the calling
// thread reads back with ck_last_error_message(); a CUDA failure also keeps its cudaError_t.
// ---------------------------------------------------------------------------------------------
const char* last_error_message();
int last_cuda_error();

// Records "<fn>: <printf-formatted message>" as the thread's last error; returns status.
ck_status_t fail(ck_status_t status, const char* fn, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// The one path from a cudaError_t to a status: records the CUDA error, its name and the place
// (`what` is the call that failed). CK_STATUS_NO_DEVICE where there is no device or driver.
ck_status_t cuda_status(cudaError_t err, const char* fn, const char* what, const char* file,
                        int line);

// The one path from a cublasStatus_t to a status.
ck_status_t cublas_status(cublasStatus_t st, const char* fn, const char* what, const char* file,
                          int line);

// Returns from the enclosing function with the status of `expr` unless it succeeded.
#define CK_TRY(expr)                                                    \
    do {                                                                \
        const ck_status_t ck_try_status_ = (expr);                      \
        if (ck_try_status_ != CK_STATUS_SUCCESS) return ck_try_status_; \
    } while (0)

#define CK_CUDA(fn, call) ::ck::cuda_status((call), fn, #call, __FILE__, __LINE__)
#define CK_CUBLAS(fn, call) ::ck::cublas_status((call), fn, #call, __FILE__, __LINE__)

// printf into a std::string (the facts of a call in a variant's refusal).
std::string formatted(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------
// "CK_DTYPE_FP16", or nullptr for a value that is not a ck_dtype_t.
const char* dtype_name(ck_dtype_t dtype);

// Bytes per element (0 for a value that is not a ck_dtype_t).
size_t dtype_size(ck_dtype_t dtype);

// ---------------------------------------------------------------------------------------------
// Validation: one small check per kind, each with a precise message naming the argument. An
// entry point constructs one Check (which clears the thread's last error) and runs its checks
// in the order its header comment promises; the first failure is the one reported.
// ---------------------------------------------------------------------------------------------
class Check {
  public:
    explicit Check(const char* fn);

    const char* fn() const { return fn_; }

    // Records "<fn>: <message>": for a rule that only one entry point has.
    ck_status_t fail(ck_status_t status, const char* fmt, ...) const
        __attribute__((format(printf, 3, 4)));

    ck_status_t not_null(const void* p, const char* name) const;

    // A params struct's struct_size: the size of `type` (its name) in this library, or one of
    // the `older` sizes of its earlier versions (whose appended fields the caller lacks).
    ck_status_t struct_size(size_t size, size_t expected, const char* type,
                            std::initializer_list<size_t> older = {}) const;

    // lo <= value <= hi.
    ck_status_t in_range(int64_t value, int64_t lo, int64_t hi, const char* name) const;

    // Several arguments of one kind, checked in the order given (the first failure is reported):
    // check.not_null({{x, "x"}, {out, "out"}}).
    struct Named {
        const void* p;
        const char* name;
    };
    ck_status_t not_null(std::initializer_list<Named> pointers) const;

    // 0 <= value < count: a valid value of the C enum `type` (its values are 0 .. count - 1).
    ck_status_t enum_value(int value, int count, const char* name, const char* type) const;

    // A floating-point element type: a known enum and one of fp32/fp16/bf16.
    ck_status_t float_dtype(ck_dtype_t dtype, const char* name) const;

    // A 16-bit floating-point element type (the W4A16 kernels' activations and scales).
    ck_status_t half_dtype(ck_dtype_t dtype, const char* name) const;

    // A valid ck_int4_mode_t, with zero points (the argument `name`) given exactly when the
    // mode has them.
    ck_status_t int4_mode(ck_int4_mode_t mode, const void* zeros,
                          const char* name = "zeros") const;

    // Zero points `zeros` (named `name`) given exactly when the (valid) mode has them.
    ck_status_t zero_points(ck_int4_mode_t mode, const void* zeros, const char* name) const;

    // rows, cols >= 1 and rows * cols * max_elem_bytes representable in int64_t.
    ck_status_t matrix(int64_t rows, int64_t cols, size_t max_elem_bytes,
                       const char* rows_name = "rows", const char* cols_name = "cols") const;

    // With CK_PER_ROW, the rows float32 scales' byte count representable in int64_t (a
    // [rows, cols] operand of 1- or 2-byte elements can fit where its rows * 4 bytes of scales
    // do not).
    ck_status_t row_scales(ck_granularity_t granularity, int64_t rows) const;

    // m, n, k >= 1 and every operand's byte count representable in int64_t. m_name: what the
    // messages call m ("experts" for the stacked weights of ck_moe_prepack).
    ck_status_t gemm_shape(int64_t m, int64_t n, int64_t k, size_t out_elem_bytes,
                           const char* m_name = "m") const;

    // 32, 64, 128 or CK_GROUP_ROW.
    ck_status_t group_size(int64_t group_size) const;

    // `why` says which access needs it ("rows of a and b are read in 16-byte vectors").
    ck_status_t multiple_of(int64_t value, int64_t divisor, const char* name,
                            const char* why) const;

    ck_status_t aligned(const void* p, size_t bytes, const char* name, const char* what) const;

    // Aligned to the size of one element of dtype (a valid ck_dtype_t).
    ck_status_t element_aligned(const void* p, ck_dtype_t dtype, const char* name) const;

    // The same, in order: check.element_aligned({{x, dtype, "x"}, {perm, CK_DTYPE_INT32, "perm"}}).
    struct Element {
        const void* p;
        ck_dtype_t dtype;
        const char* name;
    };
    ck_status_t element_aligned(std::initializer_list<Element> pointers) const;

    // *count = the number of visible CUDA devices; CK_STATUS_NO_DEVICE (with *count = 0) where
    // there is none or no driver. Libraries that would report a missing device as a generic
    // failure (cuBLASLt) are called only after this.
    ck_status_t device_count(int* count) const;

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

// ---------------------------------------------------------------------------------------------
// Kernel variants. A family (the INT8 GEMMs, the W4A16 GEMMs, ...) lists its variants as rows in
// order of preference, the last one serving every call (the fallback of every fast path); a call
// runs the first row that can serve it and does not decline it (a row may leave a call it could
// serve to a later row that measured faster on it). The family's environment variable
// (CK_GEMM_INT8_KERNEL, ...) forces a row by name instead: tests and benchmarks compare the
// variants that way. It is read on every call, so that a process can switch between calls;
// unset, "" and "auto" mean the automatic choice. Adding a family is a table of rows, a facts
// function and a VariantTable.
// ---------------------------------------------------------------------------------------------
template <class Args> struct Variant {
    const char* name;  // as the environment variable spells it
    cudaError_t (*launch)(const Args& args, cudaStream_t stream);
    // Can it serve this call on a GPU of compute capability cc (10 * major + minor)?
    bool (*serves)(const Args& args, int cc);
    const char* needs;  // what `serves` asks, completing "<name> needs ..."
    // In the automatic choice, does it leave this call (which it serves) to a later row? A
    // preference, never a capability: a forced row runs whatever it serves. nullptr: never.
    bool (*declines)(const Args& args, int cc) = nullptr;
};

// For the rows that serve every call (the reference kernels).
template <class Args> bool any_call(const Args&, int) { return true; }

template <class Args> struct VariantTable {
    const char* env;            // "CK_GEMM_INT8_KERNEL"
    const Variant<Args>* rows;  // in order of preference
    size_t count;
    // What the rows' predicates look at in a call, for a refusal: "m=17, b_layout=CK_LAYOUT_KN".
    std::string (*facts)(const Args& args);
};

template <class Args, size_t N>
constexpr VariantTable<Args> variant_table(const char* env, const Variant<Args> (&rows)[N],
                                           std::string (*facts)(const Args&)) {
    return {env, rows, N, facts};
}

// "auto, small_m, mma, reference": every value that the table's variable accepts.
template <class Args> std::string variant_names(const VariantTable<Args>& table) {
    std::string names = "auto";
    for (size_t i = 0; i < table.count; ++i) names += std::string(", ") + table.rows[i].name;
    return names;
}

// The value of `env` when it forces a variant; nullptr for the automatic choice.
const char* forced_variant(const char* env);

// CK_STATUS_INVALID_VALUE: "<env>=<value> is not one of <names>".
ck_status_t unknown_variant(const Check& check, const char* env, const char* value,
                            const std::string& names);

// CK_STATUS_UNSUPPORTED: "<env>=<name> needs <needs> (<facts>, GPU <major>.<minor>)".
ck_status_t variant_cannot_serve(const Check& check, const char* env, const char* name,
                                 const char* needs, const std::string& facts, int cc);

// The environment's forced variant (*row; nullptr for the automatic choice), or
// CK_STATUS_INVALID_VALUE for a name the table does not hold: "<env>=<value> is not one of
// <names>". Asks nothing of CUDA.
template <class Args>
ck_status_t forced_row(const Check& check, const VariantTable<Args>& table,
                       const Variant<Args>** row) {
    *row = nullptr;
    const char* forced = forced_variant(table.env);
    if (!forced) return CK_STATUS_SUCCESS;
    for (size_t i = 0; i < table.count; ++i)
        if (strcmp(table.rows[i].name, forced) == 0) {
            *row = &table.rows[i];
            return CK_STATUS_SUCCESS;
        }
    return unknown_variant(check, table.env, forced, variant_names(table));
}

// An unknown name in the table's override, refused as select_variant refuses it, for entry points
// that ask the GPU something before they choose: the name stays a host-side error, reported before
// any CUDA call (and on a machine without a GPU).
template <class Args>
ck_status_t check_variant_name(const Check& check, const VariantTable<Args>& table) {
    const Variant<Args>* row = nullptr;
    return forced_row(check, table, &row);
}

// The variant that runs this call: the one the environment forces, or the first that serves it.
// An unknown name is refused before any CUDA call; the rest asks only the cached
// compute_capability().
template <class Args>
ck_status_t select_variant(const Check& check, const VariantTable<Args>& table, const Args& args,
                           const Variant<Args>** chosen) {
    const Variant<Args>* row = nullptr;
    CK_TRY(forced_row(check, table, &row));
    if (row) {
        const int cc = compute_capability();
        if (!row->serves(args, cc))
            return variant_cannot_serve(check, table.env, row->name, row->needs,
                                        table.facts(args), cc);
    } else {
        const Variant<Args>* const end = table.rows + table.count;
        const int cc = compute_capability();
        row = table.rows;
        while (row != end &&
               (!row->serves(args, cc) || (row->declines && row->declines(args, cc))))
            ++row;
        if (row == end)  // a table whose last row does not serve every call
            return check.fail(CK_STATUS_INTERNAL_ERROR, "no %s variant serves this call (%s)",
                              table.env, table.facts(args).c_str());
    }
    *chosen = row;
    return CK_STATUS_SUCCESS;
}

// CK_STATUS_UNSUPPORTED: "the <name> kernel cannot launch this shape (<facts>): ...". For a
// launcher that returned cudaErrorInvalidConfiguration: its grid would exceed what one launch
// holds (grid_fits), a limit of the shape, not a failure of the GPU.
ck_status_t grid_too_large(const Check& check, const char* name, const std::string& facts);

// Selects the variant for this call and launches it.
template <class Args>
ck_status_t run_variant(const Check& check, const VariantTable<Args>& table, const Args& args,
                        cudaStream_t stream) {
    const Variant<Args>* variant = nullptr;
    CK_TRY(select_variant(check, table, args, &variant));
    cudaGetLastError();  // as Check::launch: report this call's errors only
    const cudaError_t err = variant->launch(args, stream);
    if (err == cudaErrorInvalidConfiguration) {
        cudaGetLastError();  // the launch API leaves it pending too
        return grid_too_large(check, variant->name, table.facts(args));
    }
    return cuda_status(err, check.fn(), "kernel launch", __FILE__, __LINE__);
}

}  // namespace ck
