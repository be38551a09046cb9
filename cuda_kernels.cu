// cuda_kernels.cu - the exported C entry points, in the header's order. Each reads as: check the
// arguments -> gather them for the launcher -> choose the kernel variant -> launch (and map the
// errors). Validation happens entirely on the host, before any CUDA call, so a rejected call
// launches nothing and works without a GPU. The machinery every entry point shares (errors,
// checks, the variant selector) is in kernels/core/api.cuh; kernels live in kernels/ and trust
// their arguments. Before the entry points: each family's variant table and operand helpers.
#include "cuda_kernels.h"

#include <cstddef>
#include <cstring>

#include "kernels/core/api.cuh"
#include "kernels/attention/attention.cuh"
#include "kernels/attention/attention_decode.cuh"
#include "kernels/attention/kv_cache.cuh"
#include "kernels/gemm/gemm_block4.cuh"
#include "kernels/gemm/gemm_int4.cuh"
#include "kernels/gemm/gemm_int8.cuh"
#include "kernels/gemm/gemm_w4a16.cuh"
#include "kernels/gemm/linear.cuh"
#include "kernels/moe/moe.cuh"
#include "kernels/quantize/block4.cuh"
#include "kernels/quantize/int4_import.cuh"
#include "kernels/quantize/quantize.cuh"
#include "kernels/sparse/sparse_int4.cuh"

#include <cmath>

using ck::Check;
using ck::dtype_size;

namespace {

// ---------------------------------------------------------------------------------------------
// What the fast variants need of a call and a GPU.
// ---------------------------------------------------------------------------------------------
constexpr int64_t kSmallMMax = 16;  // the weight-streaming kernels serve m <= 16
constexpr int kMmaMinArch = 80;     // mma.sync with int8 operands, cp.async
// The rows' `needs` texts spell these out.
static_assert(kSmallMMax == 16 && kMmaMinArch == 80, "update the variants' needs texts");

template <class Args> bool mma_serves(const Args&, int cc) { return cc >= kMmaMinArch; }

template <class Args> bool small_m_serves(const Args& args, int cc) {
    return cc >= kMmaMinArch && args.m <= kSmallMMax;
}

// ---------------------------------------------------------------------------------------------
// Scale granularities (INT8, FP8, the integer GEMMs' scales)
// ---------------------------------------------------------------------------------------------
constexpr int kGranularities = 4;     // the values of ck_granularity_t
constexpr int kIntGranularities = 2;  // CK_PER_TENSOR and CK_PER_ROW: INT8 and the integer GEMMs
static_assert(CK_PER_BLOCK_128X128 == kGranularities - 1 && CK_PER_ROW == kIntGranularities - 1,
              "the block granularities follow the two that every scaled function takes");

// A ck_granularity_t among the first `count` values: CK_STATUS_INVALID_VALUE otherwise, for a
// value outside the enum and for one the function does not take (the block granularities, which
// INT8 and the integer GEMMs reject as they rejected any unknown value before FP8 added them).
ck_status_t check_granularity(const Check& check, ck_granularity_t granularity, int count,
                              const char* name) {
    CK_TRY(check.enum_value(granularity, kGranularities, name, "ck_granularity_t"));
    if (granularity < count) return CK_STATUS_SUCCESS;
    return check.fail(CK_STATUS_INVALID_VALUE,
                      "%s=%d (%s) is not supported here (use CK_PER_TENSOR or CK_PER_ROW; the "
                      "block granularities are FP8's)",
                      name, int(granularity),
                      granularity == CK_PER_BLOCK_1X128 ? "CK_PER_BLOCK_1X128"
                                                        : "CK_PER_BLOCK_128X128");
}

// The float32 scales of an FP8 [rows, cols] tensor (a valid matrix and granularity): their byte
// count fits in int64_t (a [rows, cols] matrix of 1- or 2-byte elements does not bound it).
ck_status_t check_fp8_scales(const Check& check, ck_granularity_t granularity, int64_t rows,
                             int64_t cols) {
    const ck::ScaleGrid grid = ck::fp8_scale_grid(rows, cols, granularity);
    int64_t bytes;
    if (__builtin_mul_overflow(grid.rows, grid.cols, &bytes) ||
        __builtin_mul_overflow(bytes, int64_t(sizeof(float)), &bytes))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "rows=%lld x cols=%lld: %lld x %lld float32 scales overflow a 64-bit "
                          "byte count",
                          (long long)rows, (long long)cols, (long long)grid.rows,
                          (long long)grid.cols);
    return CK_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Block 4-bit formats (NF4, MXFP4, NVFP4)
// ---------------------------------------------------------------------------------------------
// The element matrix of a block 4-bit call: its dtype (one of fp32, fp16, bf16) and its shape
// (the byte counts of x or out, and so of the packed codes, fit in int64_t).
ck_status_t check_block4_matrix(const Check& check, ck_dtype_t dtype, const char* dtype_arg,
                                int64_t rows, int64_t cols) {
    CK_TRY(check.float_dtype(dtype, dtype_arg));
    return check.matrix(rows, cols, dtype_size(dtype));
}

// The element matrix of an NF4 call (check_block4_matrix), its block size (bitsandbytes' sizes)
// and the byte count of its float32 absmax [rows, ceil(cols / blocksize)], which a [rows, 1]
// matrix of 2-byte elements does not bound.
ck_status_t check_nf4_matrix(const Check& check, ck_dtype_t dtype, const char* dtype_arg,
                             int64_t rows, int64_t cols, int64_t blocksize) {
    CK_TRY(check_block4_matrix(check, dtype, dtype_arg, rows, cols));
    if (!ck::nf4_blocksize_ok(blocksize))
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "blocksize=%lld is not supported (use 32, 64, 128, 256, 512, 1024, "
                          "2048 or 4096)",
                          (long long)blocksize);
    const int64_t blocks = cols / blocksize + (cols % blocksize != 0);
    int64_t bytes;
    if (__builtin_mul_overflow(rows, blocks, &bytes) ||
        __builtin_mul_overflow(bytes, int64_t(sizeof(float)), &bytes))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "rows=%lld x %lld blocks of float32 absmax overflow a 64-bit byte count",
                          (long long)rows, (long long)blocks);
    return CK_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Integer GEMMs (INT8 x INT8 and INT4 x INT4): operands, the scaled epilogue, variants.
// ---------------------------------------------------------------------------------------------
std::string int8_gemm_facts(const ck::IntGemmArgs& args) {
    return ck::formatted("m=%lld, n=%lld, b_layout=%s", (long long)args.m, (long long)args.n,
                         args.b_layout == CK_LAYOUT_NK ? "CK_LAYOUT_NK" : "CK_LAYOUT_KN");
}

std::string int4_gemm_facts(const ck::IntGemmArgs& args) {
    return ck::formatted("m=%lld, n=%lld, k=%lld", (long long)args.m, (long long)args.n,
                         (long long)args.k);
}

// The INT8 small-M kernel streams [N, K] weight rows; wgmma's TMA tiles read B as [N, K] too.
bool int8_small_m_serves(const ck::IntGemmArgs& args, int cc) {
    return small_m_serves(args, cc) && args.b_layout == CK_LAYOUT_NK;
}

bool int8_wgmma_serves(const ck::IntGemmArgs& args, int) {
    return args.b_layout == CK_LAYOUT_NK && ck::gemm_int8_sm90_available();
}

// Small M streams the weight (its bytes dominate); larger M runs tensor-core tiles, wgmma on
// Hopper; the dp4a reference kernel serves everything else.
const ck::Variant<ck::IntGemmArgs> kGemmInt8Rows[] = {
    {"small_m", ck::gemm_int8_small_m, int8_small_m_serves,
     "m <= 16, CK_LAYOUT_NK and compute capability 8.0 or newer"},
    {"wgmma", ck::gemm_int8_sm90, int8_wgmma_serves,
     "CK_LAYOUT_NK, a compute capability 9.0 GPU and a build with sm_90a"},
    {"mma", ck::gemm_int8_mma, mma_serves, "compute capability 8.0 or newer"},
    {"reference", ck::gemm_int8_reference, ck::any_call, "nothing"},
};
const auto kGemmInt8 = ck::variant_table("CK_GEMM_INT8_KERNEL", kGemmInt8Rows, int8_gemm_facts);

bool int4_wgmma_serves(const ck::IntGemmArgs& args, int) {
    return args.k <= ck::kInt4SM90MaxK && ck::gemm_int8_sm90_available();
}

// As INT8: the weight stream for M <= 16, wgmma on Hopper (its int8 pipeline, the codes unpacked
// in shared memory), mma.sync elsewhere.
const ck::Variant<ck::IntGemmArgs> kGemmInt4Rows[] = {
    {"small_m", ck::gemm_int4_small_m, small_m_serves,
     "m <= 16 and compute capability 8.0 or newer"},
    {"wgmma", ck::gemm_int4_sm90, int4_wgmma_serves,
     "k <= 131040, a compute capability 9.0 GPU and a build with sm_90a"},
    {"mma", ck::gemm_int4_mma, mma_serves, "compute capability 8.0 or newer"},
    {"reference", ck::gemm_int4_reference, ck::any_call, "nothing"},
};
const auto kGemmInt4 = ck::variant_table("CK_GEMM_INT4_KERNEL", kGemmInt4Rows, int4_gemm_facts);

// FP8 (E4M3 x E4M3, float32 sums, CK_LAYOUT_NK): the weight stream for M <= 16, wgmma on
// Hopper, the reference kernel elsewhere. The entry point refuses GPUs without FP8 tensor cores
// (before 8.9) first, so the INT8 rows' rules serve (their compute capabilities are met).
constexpr int kFp8MinArch = 89;

const ck::Variant<ck::IntGemmArgs> kGemmFp8Rows[] = {
    {"small_m", ck::gemm_fp8_small_m, small_m_serves, "m <= 16"},
    {"wgmma", ck::gemm_fp8_sm90, int8_wgmma_serves,
     "a compute capability 9.0 GPU and a build with sm_90a"},
    {"reference", ck::gemm_fp8_reference, ck::any_call, "nothing"},
};
const auto kGemmFp8 = ck::variant_table("CK_GEMM_FP8_KERNEL", kGemmFp8Rows, int4_gemm_facts);

// W4A8 (INT4 codes converted to E4M3 on their way to FP8 tensor cores): FP8's reference kernel
// and small-M stream, and its own wgmma kernel. At m <= 16 the stream leaves wide weights to
// wgmma, whose output tiles alone then fill most of the SMs (128 columns each): on the H100,
// N = 14336 and 28672 ran 1.2-1.4x faster there, N = 4096 1.1-1.6x slower (benchmarks/NOTES.md).
bool w4a8_small_m_declines(const ck::IntGemmArgs& args, int cc) {
    return int8_wgmma_serves(args, cc) && ck::ceil_div(args.n, 128) * 4 >= 3 * ck::sm_count();
}
const ck::Variant<ck::IntGemmArgs> kGemmW4A8Rows[] = {
    {"small_m", ck::gemm_w4a8_small_m, small_m_serves, "m <= 16", w4a8_small_m_declines},
    {"wgmma", ck::gemm_w4a8_sm90, int8_wgmma_serves,
     "a compute capability 9.0 GPU and a build with sm_90a"},
    {"reference", ck::gemm_w4a8_reference, ck::any_call, "nothing"},
};
const auto kGemmW4A8 =
    ck::variant_table("CK_GEMM_W4A8_KERNEL", kGemmW4A8Rows, int4_gemm_facts);

// What a family asks of K: rows of a and b are read in 16-byte vectors.
struct KRule {
    int64_t multiple;
    const char* why;
};
constexpr KRule kInt8K{16, "rows of a and b are read in 16-byte vectors"};
constexpr KRule kInt4K{32, "packed rows are read in 16-byte vectors"};

// The scaled epilogue as a caller passes it to ck_gemm_int8_scaled or ck_gemm_int4_scaled.
struct ScaledEpilogue {
    const float* scale_a;
    ck_granularity_t a_granularity;
    const float* scale_b;
    ck_granularity_t b_granularity;
    const void* bias;
    ck_activation_t activation;
};

// The operands of an integer GEMM call, and its epilogue when there is one (nullptr: the raw
// int32 accumulators).
ck::IntGemmArgs int_gemm_operands(const void* a, const void* b, ck_layout_t b_layout, int64_t m,
                                  int64_t n, int64_t k, void* out, ck_dtype_t out_dtype,
                                  const ScaledEpilogue* epilogue = nullptr) {
    ck::IntGemmArgs args{};
    args.a = a;
    args.b = b;
    args.b_layout = b_layout;
    args.m = m;
    args.n = n;
    args.k = k;
    args.out = out;
    args.out_dtype = out_dtype;
    args.activation = CK_ACTIVATION_NONE;
    if (epilogue) {
        args.scale_a = epilogue->scale_a;
        args.scale_a_per_row = epilogue->a_granularity == CK_PER_ROW;
        args.scale_b = epilogue->scale_b;
        args.scale_b_per_col = epilogue->b_granularity == CK_PER_ROW;
        args.bias = epilogue->bias;
        args.activation = epilogue->activation;
    }
    return args;
}

// Shape and pointer rules of both integer GEMMs' operands (see cuda_kernels.h). The INT4
// entry points pass CK_LAYOUT_NK, which the layout's checks let through.
ck_status_t check_int_gemm_operands(const Check& check, const ck::IntGemmArgs& args, KRule k_rule) {
    const char* out_name = args.out_dtype == CK_DTYPE_INT32 ? "c" : "out";
    CK_TRY(check.not_null({{args.a, "a"}, {args.b, "b"}, {args.out, out_name}}));
    CK_TRY(check.enum_value(args.b_layout, 2, "b_layout", "ck_layout_t"));
    CK_TRY(check.gemm_shape(args.m, args.n, args.k, dtype_size(args.out_dtype)));
    CK_TRY(check.multiple_of(args.k, k_rule.multiple, "k", k_rule.why));
    if (args.b_layout == CK_LAYOUT_KN)
        CK_TRY(check.multiple_of(args.n, 16, "n", "rows of a [K, N] b are read in 16-byte vectors"));
    CK_TRY(check.aligned(args.a, 16, "a", "16-byte vector loads"));
    CK_TRY(check.aligned(args.b, 16, "b", "16-byte vector loads"));
    return check.element_aligned(args.out, args.out_dtype, out_name);
}

// A scaled GEMM's arguments in the order the messages promise: the epilogue's pointers and enum
// values first, then the operands, then the epilogue's pointer alignment.
ck_status_t check_scaled_int_gemm(const Check& check, const ck::IntGemmArgs& args, KRule k_rule,
                                  const ScaledEpilogue& epilogue) {
    CK_TRY(check.not_null({{epilogue.scale_a, "scale_a"}, {epilogue.scale_b, "scale_b"}}));
    CK_TRY(check.float_dtype(args.out_dtype, "out_dtype"));
    CK_TRY(check_granularity(check, epilogue.a_granularity, kIntGranularities, "a_granularity"));
    CK_TRY(check_granularity(check, epilogue.b_granularity, kIntGranularities, "b_granularity"));
    CK_TRY(check.enum_value(epilogue.activation, 2, "activation", "ck_activation_t"));
    CK_TRY(check_int_gemm_operands(check, args, k_rule));
    CK_TRY(check.element_aligned({{epilogue.scale_a, CK_DTYPE_FP32, "scale_a"},
                                  {epilogue.scale_b, CK_DTYPE_FP32, "scale_b"}}));
    if (epilogue.bias) CK_TRY(check.element_aligned(epilogue.bias, args.out_dtype, "bias"));
    return CK_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// INT4 weights (W4A16 GEMMs, prepack, importers)
// ---------------------------------------------------------------------------------------------
// An INT4-quantized [rows, cols] matrix as ck_quantize_int4 writes it and ck_dequantize_int4
// reads it: the mode with its zero points, the floating-point type, the shape, the group size.
ck_status_t check_int4_matrix(const Check& check, ck_int4_mode_t mode, const void* zeros,
                              ck_dtype_t dtype, const char* dtype_arg, int64_t rows, int64_t cols,
                              int64_t group_size) {
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.float_dtype(dtype, dtype_arg));
    CK_TRY(check.matrix(rows, cols, dtype_size(dtype)));
    return check.group_size(group_size);
}

// The geometry that the arguments of every INT4 weight's launcher carry (GemmW4A16Args,
// W4A16PrepackArgs, Int4ImportArgs): element type, [n, k], and the group size as the kernels
// take it (CK_GROUP_ROW resolved to k) with the groups per row.
template <class Args>
void set_int4_weight_shape(Args& args, ck_dtype_t dtype, int64_t n, int64_t k, int64_t group_size) {
    args.dtype = dtype;
    args.n = n;
    args.k = k;
    args.group_size = group_size == CK_GROUP_ROW ? k : group_size;
    args.groups = ck::int4_groups_per_row(k, group_size);
}

// What the conversions of an INT4 weight (W4A16PrepackArgs: interchange -> prepacked,
// Int4ImportArgs: checkpoint -> interchange) share: the source's scales, the weight's geometry
// and where the converted weight goes. The caller adds the source's codes and zero points.
template <class Args>
Args int4_conversion(const void* scales, ck_dtype_t dtype, int64_t n, int64_t k, int64_t group_size,
                     uint8_t* w_out, void* scales_out, uint8_t* zeros_out) {
    Args args{};
    args.scales = scales;
    set_int4_weight_shape(args, dtype, n, k, group_size);
    args.w_out = w_out;
    args.scales_out = scales_out;
    args.zeros_out = zeros_out;
    return args;
}

// What both prepacks (ck_w4a16_prepack, ck_moe_prepack) check first: the pointers, the mode with
// its zero points in and out, the dtype.
ck_status_t check_prepack_pointers(const Check& check, const uint8_t* w_packed, const void* scales,
                                   const uint8_t* zeros, ck_dtype_t dtype, ck_int4_mode_t mode,
                                   const uint8_t* w_prepacked, const void* scales_prepacked,
                                   const uint8_t* zeros_prepacked) {
    CK_TRY(check.not_null({{w_packed, "w_packed"}, {scales, "scales"}, {w_prepacked, "w_prepacked"},
                           {scales_prepacked, "scales_prepacked"}}));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.zero_points(mode, zeros_prepacked, "zeros_prepacked"));
    return check.half_dtype(dtype, "dtype");
}

// N and K within the prepacked layout's limit, and the bytes and values of `experts` prepacked
// [n, k] weights representable in int64_t (ck_w4a16_prepack: one weight, not stacked).
ck_status_t check_prepacked_size(const Check& check, bool stacked, int64_t experts, int64_t n,
                                 int64_t k, int64_t group_size) {
    if (n > ck::kPackMaxDim || k > ck::kPackMaxDim)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "n=%lld, k=%lld: the prepacked layout holds N and K up to 2^40",
                          (long long)n, (long long)k);
    if (ck_moe_prepacked_bytes(experts, n, k) == 0 ||
        ck_moe_prepacked_groups(experts, n, k, group_size) == 0)
        return !stacked  // ck_w4a16_prepack: one weight, no experts argument
                   ? check.fail(CK_STATUS_INVALID_VALUE,
                                "n=%lld, k=%lld overflow a 64-bit byte count", (long long)n,
                                (long long)k)
                   : check.fail(CK_STATUS_INVALID_VALUE,
                                "experts=%lld, n=%lld, k=%lld overflow a 64-bit byte count",
                                (long long)experts, (long long)n, (long long)k);
    return CK_STATUS_SUCCESS;
}

// The alignments both prepacks (ck_w4a16_prepack, ck_moe_prepack: one [n, k] weight) require,
// checked last, and the conversion's arguments.
ck_status_t prepack_operands(const Check& check, const uint8_t* w_packed, const void* scales,
                             const uint8_t* zeros, ck_dtype_t dtype, int64_t n, int64_t k,
                             int64_t group_size, uint8_t* w_prepacked, void* scales_prepacked,
                             uint8_t* zeros_prepacked, ck::W4A16PrepackArgs& args) {
    CK_TRY(check.aligned(w_packed, 16, "w_packed", "16-byte vector loads"));
    CK_TRY(check.element_aligned(scales, dtype, "scales"));
    CK_TRY(check.aligned(w_prepacked, 16, "w_prepacked", "16-byte vector stores"));
    CK_TRY(check.aligned(scales_prepacked, 16, "scales_prepacked", "the GEMM's 16-byte copies"));
    if (zeros_prepacked)
        CK_TRY(check.aligned(zeros_prepacked, 16, "zeros_prepacked", "the GEMM's 16-byte copies"));
    args = int4_conversion<ck::W4A16PrepackArgs>(scales, dtype, n, k, group_size, w_prepacked,
                                                      scales_prepacked, zeros_prepacked);
    args.w = w_packed;
    args.zeros = zeros;
    return CK_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// W4A16 GEMMs: operands and variants. "small_m" streams the weight once in either layout;
// "tc" runs tensor-core tiles on a prepacked weight, "wgmma" Hopper's for M > 16;
// the reference kernel reads both layouts.
// ---------------------------------------------------------------------------------------------
std::string w4a16_facts(const ck::GemmW4A16Args& args) {
    return ck::formatted("m=%lld, n=%lld, %s weight", (long long)args.m, (long long)args.n,
                         args.prepacked ? "a prepacked" : "an interchange-format");
}

bool w4a16_tc_serves(const ck::GemmW4A16Args& args, int cc) {
    return cc >= kMmaMinArch && args.prepacked;
}

// The Hopper kernel: a prepacked weight, 32-bit TMA coordinates (m, k, n8 tiles).
bool w4a16_wgmma_serves(const ck::GemmW4A16Args& args, int) {
    return args.prepacked && args.m <= INT32_MAX && args.k <= INT32_MAX &&
           args.tiles8 <= INT32_MAX && ck::gemm_w4a16_wgmma_available();
}

// On a prepacked weight, "small_m" is that layout's streaming kernel (a deeper pipeline).
cudaError_t gemm_w4a16_streaming(const ck::GemmW4A16Args& args, cudaStream_t stream) {
    return args.prepacked ? ck::gemm_w4a16_prepacked_stream(args, stream)
                          : ck::gemm_w4a16_small_m(args, stream);
}

const ck::Variant<ck::GemmW4A16Args> kGemmW4A16Rows[] = {
    {"small_m", gemm_w4a16_streaming, small_m_serves,
     "m <= 16 and compute capability 8.0 or newer"},
    // Before "tc": on Hopper it is 1.3-1.8x tc at M = 256 ... 4096 on every layer shape, and
    // its 64-row blocks, split along K where the tiles alone leave SMs idle, beat tc at
    // M = 17 ... 64 (benchmarks/results). After "small_m", which streams M <= 16 faster.
    {"wgmma", ck::gemm_w4a16_prepacked_wgmma, w4a16_wgmma_serves,
     "a prepacked weight (ck_gemm_w4a16_prepacked), m, k and n / 8 below 2^31, a compute "
     "capability 9.0 GPU and a build with sm_90a"},
    {"tc", ck::gemm_w4a16_prepacked_tc, w4a16_tc_serves,
     "a prepacked weight (ck_gemm_w4a16_prepacked) and compute capability 8.0 or newer"},
    {"reference", ck::gemm_w4a16_reference, ck::any_call, "nothing"},
};
const auto kGemmW4A16 = ck::variant_table("CK_GEMM_W4A16_KERNEL", kGemmW4A16Rows, w4a16_facts);

ck::GemmW4A16Args gemm_w4a16_operands(const void* x, ck_dtype_t dtype, const uint8_t* w,
                                      const void* scales, const uint8_t* zeros, int64_t group_size,
                                      const void* bias, ck_activation_t activation, int64_t m,
                                      int64_t n, int64_t k, void* out, bool prepacked) {
    ck::GemmW4A16Args args{};
    args.x = x;
    args.w = w;
    args.scales = scales;
    args.zeros = zeros;
    set_int4_weight_shape(args, dtype, n, k, group_size);
    args.bias = bias;
    args.activation = activation;
    args.m = m;
    args.out = out;
    args.prepacked = prepacked;
    args.derive();
    return args;
}

// What both W4A16 GEMM entry points require of their operands (see cuda_kernels.h); a prepacked
// weight's scales and zeros must also be 16-byte aligned (the kernels copy them with cp.async).
// group_size and mode as the caller gave them.
ck_status_t check_gemm_w4a16_operands(const Check& check, const ck::GemmW4A16Args& args,
                                      int64_t group_size, ck_int4_mode_t mode) {
    const char* w_name = args.prepacked ? "w_prepacked" : "w_packed";
    const char* s_name = args.prepacked ? "scales_prepacked" : "scales";
    const char* z_name = args.prepacked ? "zeros_prepacked" : "zeros";
    CK_TRY(check.not_null(
        {{args.x, "x"}, {args.w, w_name}, {args.scales, s_name}, {args.out, "out"}}));
    CK_TRY(check.int4_mode(mode, args.zeros, z_name));
    CK_TRY(check.half_dtype(args.dtype, "dtype"));
    CK_TRY(check.enum_value(args.activation, 2, "activation", "ck_activation_t"));
    CK_TRY(check.gemm_shape(args.m, args.n, args.k, dtype_size(args.dtype)));
    CK_TRY(check.multiple_of(args.k, 32, "k", "a lane dequantizes 32 weights of a row from 16 bytes"));
    CK_TRY(check.group_size(group_size));
    CK_TRY(check.aligned(args.x, 16, "x", "16-byte vector loads"));
    CK_TRY(check.aligned(args.w, 16, w_name, "16-byte vector loads"));
    if (args.prepacked) {
        CK_TRY(check.aligned(args.scales, 16, s_name, "16-byte asynchronous copies"));
        if (args.zeros)
            CK_TRY(check.aligned(args.zeros, 16, z_name, "16-byte asynchronous copies"));
    } else {
        CK_TRY(check.element_aligned(args.scales, args.dtype, s_name));
    }
    if (args.bias) CK_TRY(check.element_aligned(args.bias, args.dtype, "bias"));
    return check.element_aligned(args.out, args.dtype, "out");
}

// ---------------------------------------------------------------------------------------------
// Block 4-bit weights (ck_block4_prepack, ck_gemm_block4_prepacked): operands and variants.
// ---------------------------------------------------------------------------------------------
constexpr int kBlock4Formats = 3;  // the values of ck_block4_format_t
static_assert(CK_BLOCK4_NVFP4 == kBlock4Formats - 1, "ck_block4_format_t's values are 0 .. 2");

const char* block4_format_name(ck_block4_format_t format) {
    switch (format) {
        case CK_BLOCK4_NF4: return "CK_BLOCK4_NF4";
        case CK_BLOCK4_MXFP4: return "CK_BLOCK4_MXFP4";
        default: return "CK_BLOCK4_NVFP4";
    }
}

// The format's block along K as the GEMM kernels read it: NF4 32, 64 or 128 (a 32-k slice lies
// in one block and the streaming kernel's group shift is 5, 6 or 7), MXFP4 32, NVFP4 16.
bool block4_blocksize_ok(ck_block4_format_t format, int64_t blocksize) {
    switch (format) {
        case CK_BLOCK4_NF4: return blocksize == 32 || blocksize == 64 || blocksize == 128;
        case CK_BLOCK4_MXFP4: return blocksize == ck::kMxfp4Block;
        default: return blocksize == ck::kNvfp4Block;
    }
}

// The blocksizes of block4_blocksize_ok, as the messages list them.
const char* block4_blocksizes(ck_block4_format_t format) {
    return format == CK_BLOCK4_NF4 ? "32, 64 or 128" : format == CK_BLOCK4_MXFP4 ? "32" : "16";
}

// What both block 4-bit entry points ask of the format and the [n, k] weight's geometry (the
// format already valid): K a multiple of 32 and of the blocksize, the prepacked layout's sizes.
ck_status_t check_block4_weight(const Check& check, ck_block4_format_t format, int64_t n,
                                int64_t k, int64_t blocksize) {
    CK_TRY(check.multiple_of(k, 32, "k", "a lane dequantizes 32 weights of a row from 16 bytes"));
    if (!block4_blocksize_ok(format, blocksize))
        return check.fail(CK_STATUS_UNSUPPORTED, "blocksize=%lld is not supported for %s (use %s)",
                          (long long)blocksize, block4_format_name(format),
                          block4_blocksizes(format));
    CK_TRY(check.multiple_of(k, blocksize, "k", "the last block of a row must be whole"));
    if (n > ck::kPackMaxDim || k > ck::kPackMaxDim || ck_w4a16_prepacked_bytes(n, k) == 0)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "n=%lld, k=%lld: the prepacked layout holds N and K up to 2^40",
                          (long long)n, (long long)k);
    return CK_STATUS_SUCCESS;
}

std::string block4_facts(const ck::GemmBlock4Args& args) {
    return ck::formatted("m=%lld, n=%lld", (long long)args.gemm.m, (long long)args.gemm.n);
}

bool block4_small_m_serves(const ck::GemmBlock4Args& args, int cc) {
    return small_m_serves(args.gemm, cc);
}

bool block4_wgmma_serves(const ck::GemmBlock4Args& args, int cc) {
    return w4a16_wgmma_serves(args.gemm, cc);
}

// The INT4 table's order: the weight stream for M <= 16, then the Hopper kernel for any M.
const ck::Variant<ck::GemmBlock4Args> kGemmBlock4Rows[] = {
    {"small_m", ck::gemm_block4_stream, block4_small_m_serves,
     "m <= 16 and compute capability 8.0 or newer"},
    {"wgmma", ck::gemm_block4_wgmma, block4_wgmma_serves,
     "m, k and n / 8 below 2^31, a compute capability 9.0 GPU and a build with sm_90a"},
    {"reference", ck::gemm_block4_reference, ck::any_call, "nothing"},
};
const auto kGemmBlock4 = ck::variant_table("CK_GEMM_BLOCK4_KERNEL", kGemmBlock4Rows, block4_facts);

// The two prepacks, checked in the order cuda_kernels.h gives, then launched; rope: the fused
// Q/K/V weight's rotary pairs (ck_qkv_prepack), or none.
ck_status_t w4a16_prepack_checked(const Check& check, const uint8_t* w_packed, const void* scales,
                                  const uint8_t* zeros, ck_dtype_t dtype, int64_t n, int64_t k,
                                  int64_t group_size, ck_int4_mode_t mode, uint8_t* w_prepacked,
                                  void* scales_prepacked, uint8_t* zeros_prepacked,
                                  const ck::RopePairs& rope, ck_stream_t stream) {
    CK_TRY(check_prepack_pointers(check, w_packed, scales, zeros, dtype, mode, w_prepacked,
                                  scales_prepacked, zeros_prepacked));
    CK_TRY(check.gemm_shape(1, n, k, 2));
    CK_TRY(check.multiple_of(k, 32, "k", "a lane dequantizes 32 weights of a row from 16 bytes"));
    CK_TRY(check.group_size(group_size));
    CK_TRY(check_prepacked_size(check, false, 1, n, k, group_size));
    ck::W4A16PrepackArgs args{};
    CK_TRY(prepack_operands(check, w_packed, scales, zeros, dtype, n, k, group_size, w_prepacked,
                            scales_prepacked, zeros_prepacked, args));
    args.rope = rope;
    return check.launch([&] { return ck::w4a16_prepack(args, stream); });
}

ck_status_t block4_prepack_checked(const Check& check, ck_block4_format_t format,
                                   const uint8_t* packed, const void* scales, int64_t n, int64_t k,
                                   int64_t blocksize, uint8_t* w_prepacked, void* scales_prepacked,
                                   const ck::RopePairs& rope, ck_stream_t stream) {
    CK_TRY(check.not_null({{packed, "packed"}, {scales, "scales"}, {w_prepacked, "w_prepacked"},
                           {scales_prepacked, "scales_prepacked"}}));
    CK_TRY(check.enum_value(format, kBlock4Formats, "format", "ck_block4_format_t"));
    CK_TRY(check.gemm_shape(1, n, k, 2));
    CK_TRY(check_block4_weight(check, format, n, k, blocksize));
    CK_TRY(check.aligned(packed, 16, "packed", "16-byte vector loads"));
    if (format == CK_BLOCK4_NF4) CK_TRY(check.element_aligned(scales, CK_DTYPE_FP32, "scales"));
    CK_TRY(check.aligned(w_prepacked, 16, "w_prepacked", "16-byte vector stores"));
    CK_TRY(check.aligned(scales_prepacked, 16, "scales_prepacked", "the GEMM's 16-byte copies"));
    ck::Block4PrepackArgs args{format, packed, scales, n, k, blocksize, w_prepacked, scales_prepacked, rope};
    return check.launch([&] { return ck::block4_prepack(args, stream); });
}

// ---------------------------------------------------------------------------------------------
// Fused Q/K/V projection: the layer description (the [prepack] fields of ck_qkv_params_t).
// ---------------------------------------------------------------------------------------------
constexpr int kWeight4Formats = 4;  // the values of ck_weight4_format_t
constexpr int kRopeStyles = 3;      // the values of ck_rope_style_t
static_assert(CK_WEIGHT4_NF4 - 1 == CK_BLOCK4_NF4 && CK_WEIGHT4_MXFP4 - 1 == CK_BLOCK4_MXFP4 &&
                  CK_WEIGHT4_NVFP4 - 1 == CK_BLOCK4_NVFP4 && CK_WEIGHT4_NVFP4 == kWeight4Formats - 1,
              "the block formats follow INT4 in ck_weight4_format_t's order");
ck_block4_format_t block4_of(ck_weight4_format_t format) { return ck_block4_format_t(format - 1); }

// Heads and head sizes the fused projection takes: at most 2^20 heads of at most 2^20 values.
constexpr int64_t kQkvMaxDim = int64_t(1) << 20;

// The struct and its [prepack] fields; n: the weight's rows (Hq + 2 Hkv) D.
ck_status_t check_qkv_layer(const Check& check, const ck_qkv_params_t* p, int64_t& n) {
    CK_TRY(check.not_null(p, "params"));
    CK_TRY(check.struct_size(p->struct_size, sizeof(ck_qkv_params_t), "ck_qkv_params_t"));
    CK_TRY(check.half_dtype(p->dtype, "params->dtype"));
    CK_TRY(check.enum_value(p->format, kWeight4Formats, "params->format", "ck_weight4_format_t"));
    CK_TRY(check.enum_value(p->rope_style, kRopeStyles, "params->rope_style", "ck_rope_style_t"));
    if (p->num_heads_kv < 1 || p->num_heads_kv > kQkvMaxDim || p->num_heads_q < p->num_heads_kv ||
        p->num_heads_q > kQkvMaxDim || p->num_heads_q % p->num_heads_kv)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->num_heads_q=%lld must be a multiple of params->num_heads_kv="
                          "%lld, both in [1, 2^20]", (long long)p->num_heads_q,
                          (long long)p->num_heads_kv);
    if (p->head_dim < 8 || p->head_dim > kQkvMaxDim || p->head_dim % 8)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->head_dim=%lld must be a multiple of 8 in [8, 2^20]",
                          (long long)p->head_dim);
    if (p->rope_style != CK_ROPE_NONE &&
        (p->rotary_dim < 2 || p->rotary_dim > p->head_dim || p->rotary_dim % 2))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->rotary_dim=%lld must be even and in [2, head_dim=%lld]",
                          (long long)p->rotary_dim, (long long)p->head_dim);
    n = (p->num_heads_q + 2 * p->num_heads_kv) * p->head_dim;  // < 2^42: no overflow
    if (p->hidden < 32 || p->hidden > ck::kPackMaxDim)
        return check.fail(CK_STATUS_INVALID_VALUE, "params->hidden=%lld must be in [32, 2^40]",
                          (long long)p->hidden);
    // The [N, H] weight, named by the fields that make it (the format's prepack would say n and
    // k): N within the prepacked layout, its bytes (4 per value, as the prepacks count them)
    // within int64_t, which also bounds its prepacked bytes and values.
    if (n > ck::kPackMaxDim)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "(params->num_heads_q=%lld + 2 x params->num_heads_kv=%lld) x "
                          "params->head_dim=%lld = %lld weight rows: the prepacked layout holds "
                          "N up to 2^40", (long long)p->num_heads_q, (long long)p->num_heads_kv,
                          (long long)p->head_dim, (long long)n);
    int64_t weight_bytes;
    if (__builtin_mul_overflow(n, p->hidden * 4, &weight_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "the [N, params->hidden=%lld] weight of params->num_heads_q=%lld, "
                          "params->num_heads_kv=%lld, params->head_dim=%lld overflows a 64-bit "
                          "byte count", (long long)p->hidden, (long long)p->num_heads_q,
                          (long long)p->num_heads_kv, (long long)p->head_dim);
    CK_TRY(check.multiple_of(p->hidden, 32, "params->hidden",
                             "a lane dequantizes 32 weights of a row from 16 bytes"));
    if (p->format == CK_WEIGHT4_INT4) {
        CK_TRY(check.enum_value(p->mode, 2, "params->mode", "ck_int4_mode_t"));
        CK_TRY(check.group_size(p->group_size));
        return check_prepacked_size(check, false, 1, n, p->hidden, p->group_size);
    }
    if (p->mode != CK_INT4_SYMMETRIC)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->mode=%d must be CK_INT4_SYMMETRIC (0) for a block format",
                          int(p->mode));
    // The block format's blocksize and whole blocks, named as the struct names them.
    const ck_block4_format_t format = block4_of(p->format);
    if (!block4_blocksize_ok(format, p->group_size))
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "params->group_size=%lld is not a blocksize of CK_WEIGHT4_%s (use %s)",
                          (long long)p->group_size,
                          block4_format_name(format) + sizeof("CK_BLOCK4_") - 1,  // "NF4", ...
                          block4_blocksizes(format));
    CK_TRY(check.multiple_of(p->hidden, p->group_size, "params->hidden",
                             "the last block of a row must be whole"));
    return check_block4_weight(check, format, n, p->hidden, p->group_size);
}

// The prepack's pairing of rotate-half rotations (w4a16_prepacked.cuh), or none.
ck::RopePairs qkv_rope_pairs(const ck_qkv_params_t& p) {
    if (p.rope_style != CK_ROPE_NEOX) return {};
    return {(p.num_heads_q + p.num_heads_kv) * p.head_dim, p.head_dim, p.rotary_dim};
}

// ---------------------------------------------------------------------------------------------
// Importers: the rules both checkpoint formats share (see cuda_kernels.h).
// ---------------------------------------------------------------------------------------------
ck::Int4ImportArgs import_operands(const int32_t* qweight, const int32_t* qzeros,
                                   const void* scales, const int32_t* g_idx, ck_dtype_t dtype,
                                   int64_t n, int64_t k, int64_t group_size, uint8_t* w_packed,
                                   void* scales_out, uint8_t* zeros_out, int32_t* perm) {
    auto args = int4_conversion<ck::Int4ImportArgs>(scales, dtype, n, k, group_size, w_packed,
                                                    scales_out, zeros_out);
    args.qweight = qweight;
    args.qzeros = qzeros;
    args.g_idx = g_idx;  // GPTQ's act order: nullptr both for groups of consecutive k
    args.perm = perm;
    return args;
}

// group_size as the caller gave it.
ck_status_t check_import(const Check& check, const ck::Int4ImportArgs& args, int64_t group_size) {
    CK_TRY(check.not_null({{args.qweight, "qweight"}, {args.qzeros, "qzeros"},
                           {args.scales, "scales"}, {args.w_out, "w_packed"},
                           {args.scales_out, "scales_out"}, {args.zeros_out, "zeros_out"}}));
    CK_TRY(check.half_dtype(args.dtype, "dtype"));
    CK_TRY(check.gemm_shape(1, args.n, args.k, 4));
    CK_TRY(check.multiple_of(args.n, 8, "n", "eight codes or zeros per int32 along N"));
    CK_TRY(check.multiple_of(args.k, 32, "k", "ck_gemm_w4a16 reads 32 codes of a row at a time"));
    CK_TRY(check.group_size(group_size));
    return check.element_aligned({{args.qweight, CK_DTYPE_INT32, "qweight"},
                                  {args.qzeros, CK_DTYPE_INT32, "qzeros"},
                                  {args.scales, args.dtype, "scales"},
                                  {args.scales_out, args.dtype, "scales_out"}});
}

// ---------------------------------------------------------------------------------------------
// Mixture of experts: the checks of the layer's parameters and the expert weights' geometry.
// ---------------------------------------------------------------------------------------------
ck_status_t check_moe_route_shape(const Check& check, int64_t tokens, int64_t experts,
                                  int64_t top_k) {
    if (tokens < 1)
        return check.fail(CK_STATUS_INVALID_VALUE, "tokens=%lld must be >= 1", (long long)tokens);
    if (experts < 1 || experts > ck::kMoeMaxExperts)
        return check.fail(CK_STATUS_INVALID_VALUE, "experts=%lld must be in [1, %lld]",
                          (long long)experts, (long long)ck::kMoeMaxExperts);
    if (top_k < 1 || top_k > std::min(experts, ck::kMoeMaxTopK))
        return check.fail(CK_STATUS_INVALID_VALUE, "top_k=%lld must be in [1, min(experts=%lld, %lld)]",
                          (long long)top_k, (long long)experts, (long long)ck::kMoeMaxTopK);
    if (tokens > (int64_t(1) << 40) / top_k)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "tokens=%lld x top_k=%lld: at most 2^40 (token, expert) pairs",
                          (long long)tokens, (long long)top_k);
    return CK_STATUS_SUCCESS;
}

// Everything ck_moe_workspace_size checks: the struct, the enums and the sizes (not pointers).
ck_status_t check_moe_sizes(const Check& check, const ck_moe_params_t* p) {
    CK_TRY(check.not_null(p, "params"));
    CK_TRY(check.struct_size(p->struct_size, sizeof(ck_moe_params_t), "ck_moe_params_t"));
    CK_TRY(check.half_dtype(p->dtype, "params->dtype"));
    CK_TRY(check.enum_value(p->mode, 2, "params->mode", "ck_int4_mode_t"));
    CK_TRY(check.enum_value(p->activation, 1, "params->activation", "ck_moe_activation_t"));
    CK_TRY(check_moe_route_shape(check, p->tokens, p->experts, p->top_k));
    auto feature_size = [&](int64_t v, const char* name) {
        if (v < 1 || v > (int64_t(1) << 24))
            return check.fail(CK_STATUS_INVALID_VALUE, "%s=%lld must be in [1, 2^24]", name,
                              (long long)v);
        return check.multiple_of(v, 32, name, "a lane dequantizes 32 weights of a row");
    };
    CK_TRY(feature_size(p->hidden, "params->hidden"));
    CK_TRY(feature_size(p->intermediate, "params->intermediate"));
    int64_t pair_bytes;  // the largest workspace region: pairs x max(hidden, 2 intermediate) x 4
    if (__builtin_mul_overflow(p->tokens * p->top_k, 8 * std::max(p->hidden, 2 * p->intermediate),
                               &pair_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "tokens=%lld x top_k=%lld rows of hidden=%lld / intermediate=%lld values "
                          "overflow a 64-bit byte count", (long long)p->tokens, (long long)p->top_k,
                          (long long)p->hidden, (long long)p->intermediate);
    CK_TRY(check.group_size(p->group_size));
    const ck::MoePlan plan = ck::moe_plan(p->tokens, p->hidden, p->intermediate, p->experts,
                                          p->top_k, p->dtype);
    const int64_t blocks = plan.max_blocks(ck::kMoeBlockRows);  // the most row blocks a path uses
    if (blocks > 65535)
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "tokens=%lld x top_k=%lld with %lld experts need %lld blocks of %d rows; "
                          "at most 65535 are supported", (long long)p->tokens, (long long)p->top_k,
                          (long long)p->experts, (long long)blocks, ck::kMoeBlockRows);
    if (ck_moe_prepacked_bytes(p->experts, 2 * p->intermediate, p->hidden) == 0 ||
        ck_moe_prepacked_bytes(p->experts, p->hidden, p->intermediate) == 0)
        return check.fail(CK_STATUS_INVALID_VALUE, "the expert weights' byte counts overflow");
    return CK_STATUS_SUCCESS;
}

// A params struct as the library reads it (the convention at the top of cuda_kernels.h): the
// caller's fields that its struct_size covers, this version's size or one of the `older` sizes
// of the struct's earlier versions, and the fields appended since then zero (their defaults).
template <typename P>
ck_status_t read_params(const Check& check, const P* given, const char* type,
                        std::initializer_list<size_t> older, P* params) {
    CK_TRY(check.not_null(given, "params"));
    CK_TRY(check.struct_size(given->struct_size, sizeof(P), type, older));
    *params = P{};
    std::memcpy(static_cast<void*>(params), given, given->struct_size);
    return CK_STATUS_SUCCESS;
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (an empty range shares none).
bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
    if (a_bytes <= 0 || b_bytes <= 0) return false;
    const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return x < y + uint64_t(b_bytes) && y < x + uint64_t(a_bytes);
}

ck_status_t check_moe_pointers(const Check& check, const ck_moe_params_t* p) {
    CK_TRY(check.not_null({{p->x, "params->x"}, {p->out, "params->out"}, {p->w13, "params->w13"},
                           {p->w13_scales, "params->w13_scales"}, {p->w2, "params->w2"},
                           {p->w2_scales, "params->w2_scales"}}));
    CK_TRY(check.zero_points(p->mode, p->w13_zeros, "params->w13_zeros"));
    CK_TRY(check.zero_points(p->mode, p->w2_zeros, "params->w2_zeros"));
    if (p->router_logits) {
        if (p->topk_ids || p->topk_weights)
            return check.fail(CK_STATUS_INVALID_VALUE,
                              "params->router_logits and params->topk_ids/topk_weights are both "
                              "given: pass one way of routing");
        CK_TRY(check.float_dtype(p->router_dtype, "params->router_dtype"));
        CK_TRY(check.element_aligned(p->router_logits, p->router_dtype, "params->router_logits"));
    } else {
        if (!p->topk_ids || !p->topk_weights)
            return check.fail(CK_STATUS_INVALID_VALUE,
                              "params->router_logits is NULL: params->topk_ids and "
                              "params->topk_weights must both be given");
        CK_TRY(check.element_aligned({{p->topk_ids, CK_DTYPE_INT32, "params->topk_ids"},
                                      {p->topk_weights, CK_DTYPE_FP32, "params->topk_weights"}}));
    }
    CK_TRY(check.aligned(p->x, 16, "params->x", "16-byte copies of activation rows"));
    CK_TRY(check.aligned(p->out, 16, "params->out", "the combine's vector stores"));
    CK_TRY(check.aligned(p->w13, 16, "params->w13", "16-byte weight copies"));
    CK_TRY(check.aligned(p->w2, 16, "params->w2", "16-byte weight copies"));
    CK_TRY(check.aligned(p->w13_scales, 16, "params->w13_scales", "the GEMM's 16-byte copies"));
    CK_TRY(check.aligned(p->w2_scales, 16, "params->w2_scales", "the GEMM's 16-byte copies"));
    if (p->w13_zeros) CK_TRY(check.aligned(p->w13_zeros, 16, "params->w13_zeros", "the GEMM's 16-byte copies"));
    if (p->w2_zeros) CK_TRY(check.aligned(p->w2_zeros, 16, "params->w2_zeros", "the GEMM's 16-byte copies"));
    const int64_t act_bytes = p->tokens * p->hidden * 2;
    if (overlaps(p->x, act_bytes, p->out, act_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE, "params->out overlaps params->x");
    return CK_STATUS_SUCCESS;
}

// The expert GEMMs: the weight-streaming kernel in blocks of 16 rows while an expert gets
// few rows (decode), the tensor-core kernel in blocks of 64 or 128 rows beyond, Hopper's
// wgmma kernel in blocks of 128 from 65 rows per expert.
constexpr int64_t kMoeStreamRows = 16;
static_assert(kMoeStreamRows == ck::kMoeBlockRows, "update the variants' needs texts");

std::string moe_facts(const ck::MoeExperts& a) {
    return ck::formatted("%lld pairs over %lld experts: %lld rows per expert",
                         (long long)a.plan.pairs, (long long)a.plan.experts,
                         (long long)a.plan.rows_per_expert());
}

bool moe_tc_serves(const ck::MoeExperts& a, int cc) {
    return cc >= kMmaMinArch && a.plan.rows_per_expert() > kMoeStreamRows;
}

// The Hopper path: more than 64 rows per expert (below, its 128-row blocks would be mostly
// padding, where tc takes 64), TMA's 32-bit coordinates over every expert's weight tiles.
constexpr int64_t kMoeWgmmaMinRows = 64;
static_assert(kMoeWgmmaMinRows == 64, "update the wgmma row's needs text");
bool moe_wgmma_serves(const ck::MoeExperts& a, int) {
    const ck::MoePlan& p = a.plan;
    return p.rows_per_expert() > kMoeWgmmaMinRows && ck::gemm_w4a16_wgmma_available() &&
           ck::ceil_div(2 * p.inter, int64_t(ck::kPackRows)) * p.experts <= INT32_MAX;
}

const ck::Variant<ck::MoeExperts> kMoeRows[] = {
    {"wgmma", ck::moe_experts_wgmma, moe_wgmma_serves,
     "more than 64 rows per expert, ceil(2 intermediate / 8) x experts below 2^31, a compute "
     "capability 9.0 GPU and a build with sm_90a"},
    {"tc", ck::moe_experts_tc, moe_tc_serves,
     "more than 16 rows per expert and compute capability 8.0 or newer"},
    {"stream", ck::moe_experts_stream, ck::any_call, "nothing"},
};
const auto kMoe = ck::variant_table("CK_MOE_KERNEL", kMoeRows, moe_facts);

// ---------------------------------------------------------------------------------------------
// Attention: every field of ck_attention_params_t, in the struct's order, defaults resolved.
// ---------------------------------------------------------------------------------------------
// A head dim the kernels specialize: >= 1 (else CK_STATUS_INVALID_VALUE), and 64 or 128 (else
// CK_STATUS_UNSUPPORTED).
ck_status_t check_attention_head_dim(const Check& check, int64_t head_dim) {
    if (head_dim < 1)
        return check.fail(CK_STATUS_INVALID_VALUE, "params->head_dim=%lld must be >= 1",
                          (long long)head_dim);
    if (!ck::attention_head_dim_ok(head_dim))
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "params->head_dim=%lld is not supported (use 64 or 128)",
                          (long long)head_dim);
    return CK_STATUS_SUCCESS;
}

// The rules prefill and decode share. Heads: Hq in [1, max_heads], Hkv in [1, Hq] dividing it,
// and a head dim the kernels specialize.
ck_status_t check_attention_heads(const Check& check, int64_t heads_q, int64_t heads_kv,
                                  int64_t head_dim, int64_t max_heads) {
    CK_TRY(check.in_range(heads_q, 1, max_heads, "params->num_heads_q"));
    CK_TRY(check.in_range(heads_kv, 1, heads_q, "params->num_heads_kv"));
    if (heads_q % heads_kv != 0)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->num_heads_q=%lld must be a multiple of "
                          "params->num_heads_kv=%lld (query head h reads kv head h / (Hq / Hkv))",
                          (long long)heads_q, (long long)heads_kv);
    return check_attention_head_dim(check, head_dim);
}

ck_status_t check_softmax_scale(const Check& check, float scale) {
    if (std::isfinite(scale)) return CK_STATUS_SUCCESS;
    return check.fail(CK_STATUS_INVALID_VALUE,
                      "params->softmax_scale=%g is not finite (0 selects 1 / sqrt(head_dim))",
                      double(scale));
}

// A GPU of compute capability min_cc or newer, for entry points without a kernel below it
// (`what`: the hardware they need): CK_STATUS_UNSUPPORTED otherwise.
ck_status_t check_gpu(const Check& check, int min_cc, const char* what) {
    int devices = 0;
    CK_TRY(check.device_count(&devices));
    const int cc = ck::compute_capability();
    if (cc < min_cc)
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "needs compute capability %d.%d or newer (%s); this GPU is %d.%d",
                          min_cc / 10, min_cc % 10, what, cc / 10, cc % 10);
    return CK_STATUS_SUCCESS;
}

// The attention kernels have no fallback below 8.0.
ck_status_t check_attention_gpu(const Check& check) {
    return check_gpu(check, kMmaMinArch, "mma.sync, cp.async");
}

// The reference's default, 1 / sqrt(D) in double rounded once to float32.
float softmax_scale_or_default(float scale, int64_t head_dim) {
    return scale != 0.f ? scale : float(1.0 / std::sqrt(double(head_dim)));
}

// q, k, v and out: the kernels copy head rows in 16-byte chunks.
ck_status_t check_head_rows_aligned(const Check& check,
                                    std::initializer_list<Check::Named> tensors) {
    for (const Check::Named& t : tensors)
        CK_TRY(check.aligned(t.p, 16, t.name, "16-byte copies of head rows"));
    return CK_STATUS_SUCCESS;
}

// out overlaps none of q, k, v; lse (where given) none of them nor out. k_name, v_name: the
// params' names of k and v.
struct AttentionBuffers {
    const void *q, *k, *v, *out, *lse;
};
ck_status_t check_attention_overlaps(const Check& check, const AttentionBuffers& b,
                                     int64_t q_bytes, int64_t kv_bytes, int64_t lse_bytes,
                                     const char* k_name, const char* v_name) {
    if (overlaps(b.out, q_bytes, b.q, q_bytes) || overlaps(b.out, q_bytes, b.k, kv_bytes) ||
        overlaps(b.out, q_bytes, b.v, kv_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE, "params->out overlaps params->q, %s or %s",
                          k_name, v_name);
    if (b.lse && (overlaps(b.lse, lse_bytes, b.q, q_bytes) ||
                  overlaps(b.lse, lse_bytes, b.k, kv_bytes) ||
                  overlaps(b.lse, lse_bytes, b.v, kv_bytes) ||
                  overlaps(b.lse, lse_bytes, b.out, q_bytes)))
        return check.fail(CK_STATUS_INVALID_VALUE, "params->lse overlaps params->q, %s, %s or out",
                          k_name, v_name);
    return CK_STATUS_SUCCESS;
}

ck_status_t check_attention_params(const Check& check, const ck_attention_params_t* p,
                                   ck::AttentionArgs* args) {
    CK_TRY(check.not_null(p, "params"));
    CK_TRY(check.struct_size(p->struct_size, sizeof(ck_attention_params_t),
                             "ck_attention_params_t"));
    CK_TRY(check.half_dtype(p->dtype, "params->dtype"));
    CK_TRY(check.not_null({{p->q, "params->q"}, {p->k, "params->k"}, {p->v, "params->v"},
                           {p->out, "params->out"}}));
    CK_TRY(check.in_range(p->total_q, 1, ck::kAttentionMaxTokens, "params->total_q"));
    CK_TRY(check.in_range(p->total_k, 0, ck::kAttentionMaxTokens, "params->total_k"));
    CK_TRY(check_attention_heads(check, p->num_heads_q, p->num_heads_kv, p->head_dim,
                                 ck::kAttentionMaxHeads));
    // Byte counts: below 2^31 tokens x 65535 heads x 128 x 2 bytes < 2^63, so none overflows.
    const bool varlen = p->cu_seqlens_q || p->cu_seqlens_k;
    if (varlen && (!p->cu_seqlens_q || !p->cu_seqlens_k))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->cu_seqlens_q and params->cu_seqlens_k: give both or neither "
                          "(one sequence)");
    CK_TRY(check.in_range(p->batch, varlen ? 1 : 0, varlen ? ck::kAttentionMaxBatch : 1,
                    "params->batch"));
    CK_TRY(check.in_range(p->max_seqlen_q, 0, p->total_q, "params->max_seqlen_q"));
    CK_TRY(check.in_range(p->max_seqlen_k, 0, p->total_k, "params->max_seqlen_k"));
    CK_TRY(check_softmax_scale(check, p->softmax_scale));
    if (p->causal != 0 && p->causal != 1)
        return check.fail(CK_STATUS_INVALID_VALUE, "params->causal=%d must be 0 or 1",
                          int(p->causal));
    CK_TRY(check_head_rows_aligned(check, {{p->q, "params->q"}, {p->k, "params->k"},
                                           {p->v, "params->v"}, {p->out, "params->out"}}));
    CK_TRY(check.element_aligned({{p->lse, CK_DTYPE_FP32, "params->lse"},
                                  {p->cu_seqlens_q, CK_DTYPE_INT32, "params->cu_seqlens_q"},
                                  {p->cu_seqlens_k, CK_DTYPE_INT32, "params->cu_seqlens_k"}}));
    const int64_t q_bytes = p->total_q * p->num_heads_q * p->head_dim * 2;
    const int64_t kv_bytes = p->total_k * p->num_heads_kv * p->head_dim * 2;
    const int64_t lse_bytes = p->total_q * p->num_heads_q * 4;
    CK_TRY(check_attention_overlaps(check, {p->q, p->k, p->v, p->out, p->lse}, q_bytes, kv_bytes,
                                    lse_bytes, "k", "v"));

    *args = ck::AttentionArgs{};
    args->dtype = p->dtype;
    args->q = p->q, args->k = p->k, args->v = p->v, args->out = p->out, args->lse = p->lse;
    args->total_q = p->total_q, args->total_k = p->total_k;
    args->num_heads_q = int(p->num_heads_q), args->num_heads_kv = int(p->num_heads_kv);
    args->head_dim = int(p->head_dim);
    args->batch = varlen ? int(p->batch) : 1;
    args->cu_seqlens_q = p->cu_seqlens_q, args->cu_seqlens_k = p->cu_seqlens_k;
    args->max_seqlen_q = varlen && p->max_seqlen_q > 0 ? p->max_seqlen_q : p->total_q;
    args->scale = softmax_scale_or_default(p->softmax_scale, p->head_dim);
    args->causal = p->causal != 0;
    return CK_STATUS_SUCCESS;
}

// What the rows' predicates look at: the keys (the wgmma row's shape rule).
std::string attention_facts(const ck::AttentionArgs& a) {
    return ck::formatted("total_k=%lld", (long long)a.total_k);
}

bool attention_wgmma_serves(const ck::AttentionArgs& a, int) {
    return ck::attention_wgmma_serves(a);
}

const ck::Variant<ck::AttentionArgs> kAttentionRows[] = {
    {"wgmma", ck::attention_forward_wgmma, attention_wgmma_serves,
     "keys (total_k >= 1), a compute capability 9.0 GPU and a build with sm_90a"},
    {"mma", ck::attention_forward, ck::any_call, "nothing"},
};
const auto kAttention = ck::variant_table("CK_ATTENTION_KERNEL", kAttentionRows, attention_facts);

// ---------------------------------------------------------------------------------------------
// KV cache append: every field of ck_kv_cache_append_params_t (the enums, the pointers, the
// sizes, then the alignments), then the overlaps of the outputs (the cache and, per token, the
// scales) with everything else.
// ---------------------------------------------------------------------------------------------
// Whether a format stores 8-bit codes with scales.
bool kv_quantized(ck_kv_format_t format) { return format != CK_KV_DTYPE; }

// kv_format, and for the quantized formats kv_scaling.
ck_status_t check_kv_format(const Check& check, ck_kv_format_t format, ck_kv_scaling_t scaling) {
    CK_TRY(check.enum_value(format, 3, "params->kv_format", "ck_kv_format_t"));
    if (kv_quantized(format))
        CK_TRY(check.enum_value(scaling, 2, "params->kv_scaling", "ck_kv_scaling_t"));
    return CK_STATUS_SUCCESS;
}

ck_status_t check_kv_append_params(const Check& check, const ck_kv_cache_append_params_t* given,
                                   ck::KvAppendArgs* a) {
    ck_kv_cache_append_params_t params;
    CK_TRY(read_params(check, given, "ck_kv_cache_append_params_t", {}, &params));
    const ck_kv_cache_append_params_t* p = &params;
    CK_TRY(check.half_dtype(p->dtype, "params->dtype"));
    CK_TRY(check_kv_format(check, p->kv_format, p->kv_scaling));
    const bool quantized = kv_quantized(p->kv_format);
    const bool per_token = quantized && p->kv_scaling == CK_KV_SCALE_PER_TOKEN;
    CK_TRY(check.not_null({{p->k, "params->k"}, {p->v, "params->v"},
                           {p->slot_mapping, "params->slot_mapping"},
                           {p->k_cache, "params->k_cache"}, {p->v_cache, "params->v_cache"}}));
    if (quantized)
        CK_TRY(check.not_null({{p->k_scale, "params->k_scale"}, {p->v_scale, "params->v_scale"}}));
    CK_TRY(check.in_range(p->num_tokens, 1, ck::kKvAppendMaxTokens, "params->num_tokens"));
    CK_TRY(check.in_range(p->num_heads_kv, 1, ck::kDecodeMaxHeads, "params->num_heads_kv"));
    CK_TRY(check_attention_head_dim(check, p->head_dim));
    // A slot of Hkv heads: at most 2^16 x 2^7 x 2 = 2^24 bytes (as the decode's cache rows).
    const int64_t token_bytes = p->num_heads_kv * p->head_dim * 2;
    const int64_t slot_bytes = p->num_heads_kv * p->head_dim * (quantized ? 1 : 2);
    int64_t cache_bytes = 0;
    if (p->num_slots < 1 || __builtin_mul_overflow(p->num_slots, slot_bytes, &cache_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->num_slots=%lld must be >= 1, with the cache's bytes (%lld "
                          "per slot) within int64_t", (long long)p->num_slots,
                          (long long)slot_bytes);
    CK_TRY(check_head_rows_aligned(check, {{p->k, "params->k"}, {p->v, "params->v"},
                                           {p->k_cache, "params->k_cache"},
                                           {p->v_cache, "params->v_cache"}}));
    CK_TRY(check.aligned(p->slot_mapping, 8, "params->slot_mapping", "int64 slots"));
    if (quantized)
        CK_TRY(check.element_aligned({{p->k_scale, CK_DTYPE_FP32, "params->k_scale"},
                                      {p->v_scale, CK_DTYPE_FP32, "params->v_scale"}}));

    // Outputs overlap nothing else: the cache, and the scales where they are written.
    const int64_t new_bytes = p->num_tokens * token_bytes;  // < 2^31 x 2^24
    const int64_t scale_bytes =
        !quantized ? 0 : per_token ? cache_bytes / p->head_dim * 4 : p->num_heads_kv * 4;
    struct Buffer {
        const void* p;
        int64_t bytes;
        const char* name;
        bool output;
    };
    const Buffer buffers[] = {{p->k, new_bytes, "params->k", false},
                              {p->v, new_bytes, "params->v", false},
                              {p->k_cache, cache_bytes, "params->k_cache", true},
                              {p->v_cache, cache_bytes, "params->v_cache", true},
                              {p->k_scale, scale_bytes, "params->k_scale", per_token},
                              {p->v_scale, scale_bytes, "params->v_scale", per_token}};
    for (const Buffer& out : buffers) {
        if (!out.output) continue;
        for (const Buffer& other : buffers)
            if (&other != &out && overlaps(out.p, out.bytes, other.p, other.bytes))
                return check.fail(CK_STATUS_INVALID_VALUE, "%s overlaps %s", out.name,
                                  other.name);
    }

    *a = ck::KvAppendArgs{};
    a->dtype = p->dtype, a->format = p->kv_format, a->per_token = per_token;
    a->k = p->k, a->v = p->v, a->slots = p->slot_mapping;
    a->k_cache = p->k_cache, a->v_cache = p->v_cache;
    if (quantized) a->k_scale = p->k_scale, a->v_scale = p->v_scale;
    a->tokens = p->num_tokens, a->num_slots = p->num_slots;
    a->num_heads_kv = int(p->num_heads_kv), a->head_dim = int(p->head_dim);
    return CK_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Attention decode: every field of ck_attention_decode_params_t, in the struct's order (the
// pointers only when `pointers`: ck_attention_decode_workspace_size reads none, block_table
// only as the flag of a paged cache), then the workspace.
// ---------------------------------------------------------------------------------------------
// The first version of ck_attention_decode_params_t ended at num_splits.
constexpr size_t kDecodeParamsV1 = offsetof(ck_attention_decode_params_t, kv_format);

struct DecodeCall {
    ck_attention_decode_params_t params;  // the caller's, fields past its struct_size zero
    ck::DecodeArgs args;
    int64_t q_bytes, cache_bytes, lse_bytes, scale_bytes;
    ck::DecodeWorkspace workspace;
};

ck_status_t check_decode_params(const Check& check, const ck_attention_decode_params_t* given,
                                bool pointers, DecodeCall* call) {
    CK_TRY(read_params(check, given, "ck_attention_decode_params_t", {kDecodeParamsV1},
                       &call->params));
    const ck_attention_decode_params_t* p = &call->params;
    CK_TRY(check.half_dtype(p->dtype, "params->dtype"));
    if (pointers)
        CK_TRY(check.not_null({{p->q, "params->q"}, {p->k_cache, "params->k_cache"},
                               {p->v_cache, "params->v_cache"},
                               {p->seqlens_k, "params->seqlens_k"}, {p->out, "params->out"}}));
    CK_TRY(check.in_range(p->batch, 1, ck::kDecodeMaxBatch, "params->batch"));
    CK_TRY(check.in_range(p->seqlen_q, 1, ck::kDecodeMaxQueries, "params->seqlen_q"));
    CK_TRY(check_attention_heads(check, p->num_heads_q, p->num_heads_kv, p->head_dim,
                                 ck::kDecodeMaxHeads));
    CK_TRY(check.in_range(p->max_seqlen_k, 1, ck::kDecodeMaxSeqlen, "params->max_seqlen_k"));
    CK_TRY(check_kv_format(check, p->kv_format, p->kv_scaling));
    const bool quantized = kv_quantized(p->kv_format);
    const bool per_token = quantized && p->kv_scaling == CK_KV_SCALE_PER_TOKEN;
    if (quantized && pointers)
        CK_TRY(check.not_null({{p->k_scale, "params->k_scale"}, {p->v_scale, "params->v_scale"}}));
    // A cache row of Hkv heads: at most 2^16 x 2^7 x 2 = 2^24 bytes, so the products below
    // overflow only through their other factor, which __builtin_mul_overflow catches.
    const int64_t row_bytes = p->num_heads_kv * p->head_dim * (quantized ? 1 : 2);
    const bool paged = p->block_table != nullptr;
    int64_t cache_bytes = 0;
    if (paged) {
        CK_TRY(check.in_range(p->num_pages, 1, INT32_MAX, "params->num_pages"));
        if (p->page_size < 1 || p->page_size > ck::kDecodeMaxPageSize ||
            (p->page_size & (p->page_size - 1)) != 0)
            return check.fail(CK_STATUS_INVALID_VALUE,
                              "params->page_size=%lld must be a power of two in [1, %lld]",
                              (long long)p->page_size, (long long)ck::kDecodeMaxPageSize);
        CK_TRY(check.in_range(p->max_blocks_per_seq, 1, INT32_MAX, "params->max_blocks_per_seq"));
        if (p->max_seqlen_k > p->max_blocks_per_seq * p->page_size)
            return check.fail(CK_STATUS_INVALID_VALUE,
                              "params->max_seqlen_k=%lld is more than params->max_blocks_per_seq="
                              "%lld x params->page_size=%lld keys",
                              (long long)p->max_seqlen_k, (long long)p->max_blocks_per_seq,
                              (long long)p->page_size);
        if (__builtin_mul_overflow(p->num_pages * p->page_size, row_bytes, &cache_bytes))
            return check.fail(CK_STATUS_INVALID_VALUE,
                              "params->num_pages=%lld pages of params->page_size=%lld keys "
                              "overflow a 64-bit byte count", (long long)p->num_pages,
                              (long long)p->page_size);
    } else if (__builtin_mul_overflow(p->batch * p->max_seqlen_k, row_bytes, &cache_bytes)) {
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->batch=%lld sequences of params->max_seqlen_k=%lld keys "
                          "overflow a 64-bit byte count", (long long)p->batch,
                          (long long)p->max_seqlen_k);
    }
    CK_TRY(check_softmax_scale(check, p->softmax_scale));
    CK_TRY(check.in_range(p->num_splits, 0, ck::kDecodeMaxSplits, "params->num_splits"));
    const int64_t q_bytes = p->batch * p->seqlen_q * p->num_heads_q * p->head_dim * 2;
    const int64_t lse_bytes = p->batch * p->seqlen_q * p->num_heads_q * 4;
    // Scales: one float32 per kv head, or per cache row (4 bytes per row_bytes >= 64 bytes of
    // the cache, whose count fits); none for a dtype cache (an empty range overlaps nothing).
    const int64_t scale_bytes =
        !quantized ? 0 : per_token ? cache_bytes / p->head_dim * 4 : p->num_heads_kv * 4;
    if (pointers) {
        CK_TRY(check_head_rows_aligned(check, {{p->q, "params->q"},
                                               {p->k_cache, "params->k_cache"},
                                               {p->v_cache, "params->v_cache"},
                                               {p->out, "params->out"}}));
        CK_TRY(check.element_aligned({{p->lse, CK_DTYPE_FP32, "params->lse"},
                                      {p->seqlens_k, CK_DTYPE_INT32, "params->seqlens_k"},
                                      {p->block_table, CK_DTYPE_INT32, "params->block_table"}}));
        if (quantized)
            CK_TRY(check.element_aligned({{p->k_scale, CK_DTYPE_FP32, "params->k_scale"},
                                          {p->v_scale, CK_DTYPE_FP32, "params->v_scale"}}));
        CK_TRY(check_attention_overlaps(check, {p->q, p->k_cache, p->v_cache, p->out, p->lse},
                                        q_bytes, cache_bytes, lse_bytes, "k_cache", "v_cache"));
        if (overlaps(p->out, q_bytes, p->k_scale, scale_bytes) ||
            overlaps(p->out, q_bytes, p->v_scale, scale_bytes) ||
            (p->lse && (overlaps(p->lse, lse_bytes, p->k_scale, scale_bytes) ||
                        overlaps(p->lse, lse_bytes, p->v_scale, scale_bytes))))
            return check.fail(CK_STATUS_INVALID_VALUE,
                              "params->out or lse overlaps params->k_scale or v_scale");
    }

    const int64_t splits =
        ck::decode_num_splits(p->batch, p->num_heads_q, p->num_heads_kv, p->seqlen_q,
                              p->max_seqlen_k, quantized, p->num_splits);
    call->q_bytes = q_bytes, call->cache_bytes = cache_bytes, call->lse_bytes = lse_bytes;
    call->scale_bytes = scale_bytes;
    call->workspace = ck::decode_workspace(splits, p->batch, p->seqlen_q, p->num_heads_q,
                                           p->head_dim);
    ck::DecodeArgs& a = call->args;
    a = ck::DecodeArgs{};
    a.dtype = p->dtype;
    a.q = p->q, a.k = p->k_cache, a.v = p->v_cache;
    a.seqlens_k = p->seqlens_k, a.block_table = p->block_table;
    a.out = p->out, a.lse = p->lse;
    a.batch = int(p->batch), a.seqlen_q = int(p->seqlen_q);
    a.num_heads_q = int(p->num_heads_q), a.num_heads_kv = int(p->num_heads_kv);
    a.head_dim = int(p->head_dim), a.max_seqlen_k = int(p->max_seqlen_k);
    if (paged) {
        a.num_pages = int(p->num_pages), a.max_blocks = int(p->max_blocks_per_seq);
        while ((int64_t(1) << a.page_shift) < p->page_size) ++a.page_shift;
    }
    a.splits = int(splits);
    a.scale = softmax_scale_or_default(p->softmax_scale, p->head_dim);
    a.kv_format = p->kv_format, a.per_token = per_token;
    if (quantized) a.k_scale = p->k_scale, a.v_scale = p->v_scale;
    return CK_STATUS_SUCCESS;
}

ck_status_t check_decode_workspace(const Check& check, void* workspace, size_t workspace_bytes,
                                   DecodeCall* call) {
    const ck_attention_decode_params_t* p = &call->params;
    const int64_t need = call->workspace.bytes;
    if (need == 0) return CK_STATUS_SUCCESS;  // one split: the workspace is not used
    CK_TRY(check.not_null(workspace, "workspace"));
    if (workspace_bytes < uint64_t(need))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "workspace_bytes=%zu is smaller than "
                          "ck_attention_decode_workspace_size's %lld",
                          workspace_bytes, (long long)need);
    CK_TRY(check.aligned(workspace, 256, "workspace", "its 256-byte aligned regions"));
    if (overlaps(workspace, need, p->q, call->q_bytes) ||
        overlaps(workspace, need, p->k_cache, call->cache_bytes) ||
        overlaps(workspace, need, p->v_cache, call->cache_bytes) ||
        overlaps(workspace, need, p->out, call->q_bytes) ||
        (p->lse && overlaps(workspace, need, p->lse, call->lse_bytes)) ||
        overlaps(workspace, need, p->k_scale, call->scale_bytes) ||
        overlaps(workspace, need, p->v_scale, call->scale_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "workspace overlaps params->q, k_cache, v_cache, out, lse, k_scale or "
                          "v_scale");
    uint8_t* ws = static_cast<uint8_t*>(workspace);
    call->args.partial_o = reinterpret_cast<float*>(ws);
    call->args.partial_lse = reinterpret_cast<float*>(ws + call->workspace.lse_offset);
    return CK_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Structured-sparse INT4 weights (2:4, 16:32): the weight's checks, the GEMMs' variants.
// ---------------------------------------------------------------------------------------------
constexpr int kSparsities = 2;  // the values of ck_sparsity_t
static_assert(CK_SPARSITY_16_32 == kSparsities - 1, "ck_sparsity_t's values are 0 .. 1");

// The [n, k] geometry every sparse call shares (the sparsity already valid): K >= 64, a
// multiple of 32 (one metadata word per 32 k) and of the group, group 64 or 128, the byte
// counts of an element_bytes-per-value dense [n, k] matrix representable.
ck_status_t check_sparse_weight(const Check& check, int64_t n, int64_t k, int64_t group_size,
                                size_t element_bytes) {
    CK_TRY(check.matrix(n, k, element_bytes, "n", "k"));
    if (!ck::sparse_group_ok(group_size))
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "group_size=%lld is not supported for sparse weights (use 64 or 128)",
                          (long long)group_size);
    CK_TRY(check.multiple_of(k, ck::kSparseWordK, "k", "one metadata word per 32 k of a row"));
    return check.multiple_of(k, group_size, "k", "the last group of a row must be whole");
}

// A weight in the sparse format, as the launchers take it.
ck::SparseWeight sparse_weight(ck_sparsity_t sparsity, ck_dtype_t dtype, int64_t n, int64_t k,
                               int64_t group_size, const uint8_t* codes, const uint32_t* meta,
                               const void* scales, const uint8_t* zeros) {
    return {sparsity == CK_SPARSITY_16_32, n, k, group_size, dtype, const_cast<uint8_t*>(codes),
            const_cast<uint32_t*>(meta), const_cast<void*>(scales), const_cast<uint8_t*>(zeros)};
}

// The codes and metadata of the format: 16-byte aligned (8-byte code stores per 32 k).
ck_status_t check_sparse_codes(const Check& check, const void* codes, const void* meta) {
    CK_TRY(check.aligned(codes, 16, "codes", "the kernels' 8- and 16-byte accesses"));
    return check.aligned(meta, 16, "meta", "the kernels' 16-byte accesses");
}

// What both sparse prepacks check last: the format's codes and metadata, the scales aligned to
// their dtype, and the outputs 16-byte aligned (vector stores here, the GEMMs' vector loads).
ck_status_t check_sparse_prepack_buffers(const Check& check, const void* codes, const void* meta,
                                         const void* scales, ck_dtype_t dtype,
                                         const void* w_prepacked, const void* scales_prepacked,
                                         const void* zeros_prepacked) {
    CK_TRY(check_sparse_codes(check, codes, meta));
    CK_TRY(check.element_aligned(scales, dtype, "scales"));
    CK_TRY(check.aligned(w_prepacked, 16, "w_prepacked", "16-byte vector stores"));
    CK_TRY(check.aligned(scales_prepacked, 16, "scales_prepacked", "the GEMMs' vector loads"));
    if (zeros_prepacked)
        CK_TRY(check.aligned(zeros_prepacked, 16, "zeros_prepacked", "the GEMMs' vector loads"));
    return CK_STATUS_SUCCESS;
}

std::string sparse_facts(const ck::SparseGemmArgs& args) {
    return ck::formatted("m=%lld, n=%lld, %s %s weight", (long long)args.m, (long long)args.n,
                         args.k1632 ? "a 16:32" : "a 2:4",
                         args.prepacked ? "prepacked" : "interchange-format");
}

bool sparse_wgmma_serves(const ck::SparseGemmArgs& args, int) {
    return args.prepacked && !args.k1632 && args.m > kSmallMMax && args.m <= INT32_MAX &&
           args.k <= INT32_MAX && ck::ceil_div(args.n, ck::kSparsePackRows) <= INT32_MAX &&
           ck::sparse_tiles_grid_fits(args.m, args.n) && ck::gemm_sparse_w4a16_wgmma_available();
}

// The stream kernel: M <= 16, and past 16 rows of x the grids that the tensor-core kernel at
// hand (wgmma on Hopper, else tiles) would leave short of blocks (asked only there: a decode
// call plans no tensor-core launch).
bool sparse_stream_serves(const ck::SparseGemmArgs& args, int cc) {
    if (cc < kMmaMinArch || !args.prepacked || args.k1632 ||
        !ck::sparse_stream_grid_fits(args.m, args.n))
        return false;
    if (args.m <= kSmallMMax) return true;
    return sparse_wgmma_serves(args, cc) ? !ck::sparse_wgmma_fills_gpu(args.m, args.n, args.k)
                                         : !ck::sparse_tiles_fill_gpu(args.m, args.n);
}

bool sparse_tiles_serves(const ck::SparseGemmArgs& args, int cc) {
    return cc >= kMmaMinArch && args.prepacked && !args.k1632 && args.m > kSmallMMax &&
           ck::sparse_tiles_grid_fits(args.m, args.n);
}

const ck::Variant<ck::SparseGemmArgs> kGemmSparseRows[] = {
    {"stream", ck::gemm_sparse_w4a16_stream, sparse_stream_serves,
     "a prepacked 2:4 weight (ck_gemm_sparse_w4a16_prepacked), n below 2^35, m <= 16 or a "
     "shape whose tensor-core blocks leave SMs idle (for m > 16: n at most 1048560), and "
     "compute capability 8.0 or newer"},
    {"wgmma", ck::gemm_sparse_w4a16_wgmma, sparse_wgmma_serves,
     "a prepacked 2:4 weight (ck_gemm_sparse_w4a16_prepacked), 16 < m < 2^31, k < 2^31, n "
     "below 2^35, a compute capability 9.0 GPU and a build with sm_90a"},
    {"tiles", ck::gemm_sparse_w4a16_tiles, sparse_tiles_serves,
     "a prepacked 2:4 weight (ck_gemm_sparse_w4a16_prepacked), m > 16, ceil(m / 64) x "
     "ceil(n / 128) tiles below 2^31 and compute capability 8.0 or newer"},
    {"reference", ck::gemm_sparse_w4a16_reference, ck::any_call, "nothing"},
};
const auto kGemmSparse = ck::variant_table("CK_GEMM_SPARSE_KERNEL", kGemmSparseRows, sparse_facts);

// What both sparse GEMM entry points check, in the header's order, and their launcher's call.
ck_status_t sparse_gemm_operands(const Check& check, const ck::SparseGemmArgs& args,
                                 ck_int4_mode_t mode, const char* w_name, const char* s_name,
                                 const char* z_name) {
    CK_TRY(check.not_null({{args.x, "x"}, {args.codes, w_name}, {args.scales, s_name},
                           {args.out, "out"}}));
    if (!args.prepacked) CK_TRY(check.not_null(args.meta, "meta"));
    CK_TRY(check.int4_mode(mode, args.zeros, z_name));
    CK_TRY(check.half_dtype(args.dtype, "dtype"));
    CK_TRY(check.enum_value(args.activation, 2, "activation", "ck_activation_t"));
    CK_TRY(check.gemm_shape(args.m, args.n, args.k, dtype_size(args.dtype)));
    CK_TRY(check_sparse_weight(check, args.n, args.k, args.group_size, dtype_size(args.dtype)));
    if (args.prepacked)
        CK_TRY(check.multiple_of(args.k, ck::kSparsePackK, "k",
                                 "the prepacked layout's 128-k chunks"));
    CK_TRY(check.aligned(args.x, 16, "x", "16-byte vector loads"));
    if (args.prepacked) {
        CK_TRY(check.aligned(args.codes, 16, w_name, "16-byte vector loads"));
        CK_TRY(check.aligned(args.scales, 4, s_name, "a lane's two scales in one 4-byte load"));
        if (args.zeros)
            CK_TRY(check.aligned(args.zeros, 4, z_name, "4-byte copies of the zero-point pairs"));
    } else {
        CK_TRY(check_sparse_codes(check, args.codes, args.meta));
        CK_TRY(check.element_aligned(args.scales, args.dtype, s_name));
    }
    if (args.bias) CK_TRY(check.element_aligned(args.bias, args.dtype, "bias"));
    return check.element_aligned(args.out, args.dtype, "out");
}

ck::SparseGemmArgs sparse_gemm_args(const void* x, ck_dtype_t dtype, bool k1632,
                                    const uint8_t* codes, const uint32_t* meta,
                                    const void* scales, const uint8_t* zeros, int64_t group_size,
                                    const void* bias, ck_activation_t activation, int64_t m,
                                    int64_t n, int64_t k, void* out, bool prepacked) {
    ck::SparseGemmArgs args{};
    args.x = x;
    args.dtype = dtype;
    args.k1632 = k1632;
    args.prepacked = prepacked;
    args.codes = codes;
    args.meta = meta;
    args.scales = scales;
    args.zeros = zeros;
    args.group_size = group_size;
    args.groups = ck::sparse_group_ok(group_size) && k > 0 ? k / group_size : 0;
    args.bias = bias;
    args.activation = activation;
    args.m = m;
    args.n = n;
    args.k = k;
    args.out = out;
    return args;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Exported functions, in the order of cuda_kernels.h
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

const char* ck_last_error_message(void) { return ck::last_error_message(); }

int ck_last_cuda_error(void) { return ck::last_cuda_error(); }

ck_status_t ck_device_count(int* count) {
    const Check check("ck_device_count");
    CK_TRY(check.not_null(count, "count"));
    return check.device_count(count);
}

ck_status_t ck_quantize_int8(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                             ck_granularity_t granularity, ck_scale_mode_t scale_mode,
                             float* scales, int8_t* q, ck_stream_t stream) {
    const Check check("ck_quantize_int8");
    CK_TRY(check.not_null({{x, "x"}, {scales, "scales"}, {q, "q"}}));
    CK_TRY(check.float_dtype(x_dtype, "x_dtype"));
    CK_TRY(check_granularity(check, granularity, kIntGranularities, "granularity"));
    CK_TRY(check.enum_value(scale_mode, 2, "scale_mode", "ck_scale_mode_t"));
    CK_TRY(check.matrix(rows, cols, dtype_size(x_dtype)));
    CK_TRY(check.row_scales(granularity, rows));
    CK_TRY(check.element_aligned({{x, x_dtype, "x"}, {scales, CK_DTYPE_FP32, "scales"}}));
    return check.launch([&] {
        return ck::quantize_int8(x, x_dtype, rows, cols, granularity, scale_mode, scales, q, stream);
    });
}

ck_status_t ck_dequantize_int8(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                               ck_granularity_t granularity, void* out, ck_dtype_t out_dtype,
                               ck_stream_t stream) {
    const Check check("ck_dequantize_int8");
    CK_TRY(check.not_null({{q, "q"}, {scales, "scales"}, {out, "out"}}));
    CK_TRY(check.float_dtype(out_dtype, "out_dtype"));
    CK_TRY(check_granularity(check, granularity, kIntGranularities, "granularity"));
    CK_TRY(check.matrix(rows, cols, dtype_size(out_dtype)));
    CK_TRY(check.row_scales(granularity, rows));
    CK_TRY(check.element_aligned({{scales, CK_DTYPE_FP32, "scales"}, {out, out_dtype, "out"}}));
    return check.launch([&] {
        return ck::dequantize_int8(q, scales, rows, cols, granularity, out, out_dtype, stream);
    });
}

ck_status_t ck_quantize_fp8(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                            ck_fp8_format_t format, ck_granularity_t granularity,
                            ck_scale_mode_t scale_mode, float* scales, uint8_t* q,
                            ck_stream_t stream) {
    const Check check("ck_quantize_fp8");
    CK_TRY(check.not_null({{x, "x"}, {scales, "scales"}, {q, "q"}}));
    CK_TRY(check.float_dtype(x_dtype, "x_dtype"));
    CK_TRY(check.enum_value(format, 2, "format", "ck_fp8_format_t"));
    CK_TRY(check_granularity(check, granularity, kGranularities, "granularity"));
    CK_TRY(check.enum_value(scale_mode, 2, "scale_mode", "ck_scale_mode_t"));
    CK_TRY(check.matrix(rows, cols, dtype_size(x_dtype)));
    CK_TRY(check_fp8_scales(check, granularity, rows, cols));
    CK_TRY(check.element_aligned({{x, x_dtype, "x"}, {scales, CK_DTYPE_FP32, "scales"}}));
    return check.launch([&] {
        return ck::quantize_fp8(x, x_dtype, rows, cols, format, granularity, scale_mode, scales,
                                q, stream);
    });
}

ck_status_t ck_dequantize_fp8(const uint8_t* q, ck_fp8_format_t format, const float* scales,
                              int64_t rows, int64_t cols, ck_granularity_t granularity, void* out,
                              ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_dequantize_fp8");
    CK_TRY(check.not_null({{q, "q"}, {scales, "scales"}, {out, "out"}}));
    CK_TRY(check.enum_value(format, 2, "format", "ck_fp8_format_t"));
    CK_TRY(check.float_dtype(out_dtype, "out_dtype"));
    CK_TRY(check_granularity(check, granularity, kGranularities, "granularity"));
    CK_TRY(check.matrix(rows, cols, dtype_size(out_dtype)));
    CK_TRY(check_fp8_scales(check, granularity, rows, cols));
    CK_TRY(check.element_aligned({{scales, CK_DTYPE_FP32, "scales"}, {out, out_dtype, "out"}}));
    return check.launch([&] {
        return ck::dequantize_fp8(q, format, scales, rows, cols, granularity, out, out_dtype,
                                  stream);
    });
}

int64_t ck_int4_groups_per_row(int64_t cols, int64_t group_size) {
    return ck::int4_groups_per_row(cols, group_size);
}

ck_status_t ck_quantize_int4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                             int64_t group_size, ck_int4_mode_t mode, uint8_t* q_packed,
                             void* scales, uint8_t* zeros, ck_stream_t stream) {
    const Check check("ck_quantize_int4");
    CK_TRY(check.not_null({{x, "x"}, {q_packed, "q_packed"}, {scales, "scales"}}));
    CK_TRY(check_int4_matrix(check, mode, zeros, x_dtype, "x_dtype", rows, cols, group_size));
    CK_TRY(check.element_aligned({{x, x_dtype, "x"}, {scales, x_dtype, "scales"}}));
    return check.launch([&] {
        return ck::quantize_int4(x, x_dtype, rows, cols, group_size, mode, q_packed, scales, zeros,
                                 stream);
    });
}

ck_status_t ck_dequantize_int4(const uint8_t* q_packed, const void* scales, const uint8_t* zeros,
                               int64_t rows, int64_t cols, int64_t group_size, ck_int4_mode_t mode,
                               void* out, ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_dequantize_int4");
    CK_TRY(check.not_null({{q_packed, "q_packed"}, {scales, "scales"}, {out, "out"}}));
    CK_TRY(check_int4_matrix(check, mode, zeros, out_dtype, "out_dtype", rows, cols, group_size));
    CK_TRY(check.element_aligned({{scales, out_dtype, "scales"}, {out, out_dtype, "out"}}));
    return check.launch([&] {
        return ck::dequantize_int4(q_packed, scales, zeros, rows, cols, group_size, mode, out,
                                   out_dtype, stream);
    });
}

ck_status_t ck_quantize_nf4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                            int64_t blocksize, uint8_t* packed, float* absmax, ck_stream_t stream) {
    const Check check("ck_quantize_nf4");
    CK_TRY(check.not_null({{x, "x"}, {packed, "packed"}, {absmax, "absmax"}}));
    CK_TRY(check_nf4_matrix(check, x_dtype, "x_dtype", rows, cols, blocksize));
    CK_TRY(check.element_aligned({{x, x_dtype, "x"}, {absmax, CK_DTYPE_FP32, "absmax"}}));
    return check.launch([&] {
        return ck::quantize_nf4(x, x_dtype, rows, cols, blocksize, packed, absmax, stream);
    });
}

ck_status_t ck_dequantize_nf4(const uint8_t* packed, const float* absmax, int64_t rows,
                              int64_t cols, int64_t blocksize, void* out, ck_dtype_t out_dtype,
                              ck_stream_t stream) {
    const Check check("ck_dequantize_nf4");
    CK_TRY(check.not_null({{packed, "packed"}, {absmax, "absmax"}, {out, "out"}}));
    CK_TRY(check_nf4_matrix(check, out_dtype, "out_dtype", rows, cols, blocksize));
    CK_TRY(check.element_aligned({{absmax, CK_DTYPE_FP32, "absmax"}, {out, out_dtype, "out"}}));
    return check.launch([&] {
        return ck::dequantize_nf4(packed, absmax, rows, cols, blocksize, out, out_dtype, stream);
    });
}

ck_status_t ck_quantize_mxfp4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                              uint8_t* packed, uint8_t* scales, ck_stream_t stream) {
    const Check check("ck_quantize_mxfp4");
    CK_TRY(check.not_null({{x, "x"}, {packed, "packed"}, {scales, "scales"}}));
    CK_TRY(check_block4_matrix(check, x_dtype, "x_dtype", rows, cols));
    CK_TRY(check.element_aligned(x, x_dtype, "x"));
    return check.launch([&] {
        return ck::quantize_mxfp4(x, x_dtype, rows, cols, packed, scales, stream);
    });
}

ck_status_t ck_dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                int64_t cols, void* out, ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_dequantize_mxfp4");
    CK_TRY(check.not_null({{packed, "packed"}, {scales, "scales"}, {out, "out"}}));
    CK_TRY(check_block4_matrix(check, out_dtype, "out_dtype", rows, cols));
    CK_TRY(check.element_aligned(out, out_dtype, "out"));
    return check.launch([&] {
        return ck::dequantize_mxfp4(packed, scales, rows, cols, out, out_dtype, stream);
    });
}

ck_status_t ck_quantize_nvfp4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                              ck_scale_mode_t scale_mode, float* global_scale, uint8_t* packed,
                              uint8_t* scales, ck_stream_t stream) {
    const Check check("ck_quantize_nvfp4");
    CK_TRY(check.not_null(
        {{x, "x"}, {global_scale, "global_scale"}, {packed, "packed"}, {scales, "scales"}}));
    CK_TRY(check.enum_value(scale_mode, 2, "scale_mode", "ck_scale_mode_t"));
    CK_TRY(check_block4_matrix(check, x_dtype, "x_dtype", rows, cols));
    CK_TRY(check.element_aligned({{x, x_dtype, "x"}, {global_scale, CK_DTYPE_FP32, "global_scale"}}));
    return check.launch([&] {
        return ck::quantize_nvfp4(x, x_dtype, rows, cols, scale_mode == CK_SCALE_DYNAMIC,
                                  global_scale, packed, scales, stream);
    });
}

ck_status_t ck_dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales,
                                const float* global_scale, int64_t rows, int64_t cols, void* out,
                                ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_dequantize_nvfp4");
    CK_TRY(check.not_null(
        {{packed, "packed"}, {scales, "scales"}, {global_scale, "global_scale"}, {out, "out"}}));
    CK_TRY(check_block4_matrix(check, out_dtype, "out_dtype", rows, cols));
    CK_TRY(check.element_aligned(
        {{global_scale, CK_DTYPE_FP32, "global_scale"}, {out, out_dtype, "out"}}));
    return check.launch([&] {
        return ck::dequantize_nvfp4(packed, scales, global_scale, rows, cols, out, out_dtype,
                                    stream);
    });
}

ck_status_t ck_gemm_int8(const int8_t* a, const int8_t* b, ck_layout_t b_layout, int64_t m, int64_t n,
                         int64_t k, int32_t* c, ck_stream_t stream) {
    const Check check("ck_gemm_int8");
    const ck::IntGemmArgs args = int_gemm_operands(a, b, b_layout, m, n, k, c, CK_DTYPE_INT32);
    CK_TRY(check_int_gemm_operands(check, args, kInt8K));
    return ck::run_variant(check, kGemmInt8, args, stream);
}

ck_status_t ck_gemm_int8_scaled(const int8_t* a, const int8_t* b, ck_layout_t b_layout, int64_t m,
                                int64_t n, int64_t k, const float* scale_a,
                                ck_granularity_t a_granularity, const float* scale_b,
                                ck_granularity_t b_granularity, const void* bias,
                                ck_activation_t activation, void* out, ck_dtype_t out_dtype,
                                ck_stream_t stream) {
    const Check check("ck_gemm_int8_scaled");
    const ScaledEpilogue epilogue{scale_a, a_granularity, scale_b, b_granularity, bias, activation};
    const auto args = int_gemm_operands(a, b, b_layout, m, n, k, out, out_dtype, &epilogue);
    CK_TRY(check_scaled_int_gemm(check, args, kInt8K, epilogue));
    return ck::run_variant(check, kGemmInt8, args, stream);
}

ck_status_t ck_gemm_fp8_scaled(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n,
                               int64_t k, const float* scale_a, ck_granularity_t a_granularity,
                               const float* scale_b, ck_granularity_t b_granularity,
                               const void* bias, ck_activation_t activation, void* out,
                               ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_gemm_fp8_scaled");
    // Block scales come as a pair (DeepSeek-V3's scheme); the rest is INT8's epilogue, whose
    // checks take them as per-tensor ones (two non-null, 4-byte aligned pointers).
    CK_TRY(check.enum_value(a_granularity, kGranularities, "a_granularity", "ck_granularity_t"));
    CK_TRY(check.enum_value(b_granularity, kGranularities, "b_granularity", "ck_granularity_t"));
    const bool a_block = a_granularity >= kIntGranularities;
    const bool b_block = b_granularity >= kIntGranularities;
    if ((a_block || b_block) &&
        (a_granularity != CK_PER_BLOCK_1X128 || b_granularity != CK_PER_BLOCK_128X128))
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "a_granularity=%d with b_granularity=%d: block scales are "
                          "a_granularity CK_PER_BLOCK_1X128 with b_granularity "
                          "CK_PER_BLOCK_128X128", int(a_granularity), int(b_granularity));
    const ScaledEpilogue epilogue{scale_a, a_block ? CK_PER_TENSOR : a_granularity, scale_b,
                                  b_block ? CK_PER_TENSOR : b_granularity, bias, activation};
    auto args = int_gemm_operands(a, b, CK_LAYOUT_NK, m, n, k, out, out_dtype, &epilogue);
    CK_TRY(check_scaled_int_gemm(check, args, kInt8K, epilogue));
    if (a_block) {
        args.block_scale_a = scale_a, args.block_scale_b = scale_b;
        args.scale_a = args.scale_b = nullptr;
    }
    CK_TRY(ck::check_variant_name(check, kGemmFp8));
    CK_TRY(check_gpu(check, kFp8MinArch, "FP8 tensor cores"));
    return ck::run_variant(check, kGemmFp8, args, stream);
}

ck_status_t ck_gemm_w4a8(const uint8_t* a, const float* scale_a, ck_granularity_t a_granularity,
                         const uint8_t* w_packed, const void* w_scales, ck_dtype_t scale_dtype,
                         int64_t group_size, const void* bias, ck_activation_t activation,
                         int64_t m, int64_t n, int64_t k, void* out, ck_dtype_t out_dtype,
                         ck_stream_t stream) {
    const Check check("ck_gemm_w4a8");
    CK_TRY(check.not_null({{a, "a"}, {scale_a, "scale_a"}, {w_packed, "w_packed"},
                           {w_scales, "w_scales"}, {out, "out"}}));
    CK_TRY(check.float_dtype(out_dtype, "out_dtype"));
    CK_TRY(check.half_dtype(scale_dtype, "scale_dtype"));
    CK_TRY(check_granularity(check, a_granularity, kIntGranularities, "a_granularity"));
    CK_TRY(check.enum_value(activation, 2, "activation", "ck_activation_t"));
    CK_TRY(check.group_size(group_size));
    if (group_size != ck::kFp8Block && group_size != CK_GROUP_ROW)
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "group_size=%lld is not supported (use 128 or CK_GROUP_ROW: a group's "
                          "scale applies to whole 128-wide k-blocks)", (long long)group_size);
    CK_TRY(check.gemm_shape(m, n, k, dtype_size(out_dtype)));
    CK_TRY(check.multiple_of(k, kInt4K.multiple, "k", kInt4K.why));
    CK_TRY(check.aligned(a, 16, "a", "16-byte vector loads"));
    CK_TRY(check.aligned(w_packed, 16, "w_packed", "16-byte vector loads"));
    CK_TRY(check.element_aligned({{scale_a, CK_DTYPE_FP32, "scale_a"},
                                  {w_scales, scale_dtype, "w_scales"},
                                  {out, out_dtype, "out"}}));
    if (bias) CK_TRY(check.element_aligned(bias, out_dtype, "bias"));
    const ScaledEpilogue epilogue{scale_a, a_granularity, nullptr, CK_PER_TENSOR, bias, activation};
    auto args = int_gemm_operands(a, w_packed, CK_LAYOUT_NK, m, n, k, out, out_dtype, &epilogue);
    args.group_scales = w_scales;
    args.group_scale_dtype = scale_dtype;
    args.groups = group_size == CK_GROUP_ROW ? 1 : ck::ceil_div(k, ck::kFp8Block);
    CK_TRY(ck::check_variant_name(check, kGemmW4A8));
    CK_TRY(check_gpu(check, kFp8MinArch, "FP8 tensor cores"));
    return ck::run_variant(check, kGemmW4A8, args, stream);
}

ck_status_t ck_int8_prepack(const int8_t* b_kn, int64_t k, int64_t n, int8_t* b_nk,
                            ck_stream_t stream) {
    const Check check("ck_int8_prepack");
    CK_TRY(check.not_null({{b_kn, "b_kn"}, {b_nk, "b_nk"}}));
    if (k < 1) return check.fail(CK_STATUS_INVALID_VALUE, "k=%lld must be >= 1", (long long)k);
    if (n < 1) return check.fail(CK_STATUS_INVALID_VALUE, "n=%lld must be >= 1", (long long)n);
    int64_t bytes;
    if (__builtin_mul_overflow(k, n, &bytes))
        return check.fail(CK_STATUS_INVALID_VALUE, "k=%lld x n=%lld overflows a 64-bit byte count",
                          (long long)k, (long long)n);
    CK_TRY(check.multiple_of(k, 16, "k", "rows of b_nk are written in 16-byte vectors"));
    CK_TRY(check.multiple_of(n, 16, "n", "rows of b_kn are read in 16-byte vectors"));
    CK_TRY(check.aligned(b_kn, 16, "b_kn", "16-byte vector loads"));
    CK_TRY(check.aligned(b_nk, 16, "b_nk", "16-byte vector stores"));
    if (overlaps(b_kn, bytes, b_nk, bytes))
        return check.fail(CK_STATUS_INVALID_VALUE, "b_nk overlaps b_kn");
    return check.launch([&] { return ck::int8_prepack(b_kn, k, n, b_nk, stream); });
}

ck_status_t ck_gemm_w4a16(const void* x, ck_dtype_t dtype, const uint8_t* w_packed,
                          const void* scales, const uint8_t* zeros, int64_t group_size,
                          ck_int4_mode_t mode, const void* bias, ck_activation_t activation,
                          int64_t m, int64_t n, int64_t k, void* out, ck_stream_t stream) {
    const Check check("ck_gemm_w4a16");
    const ck::GemmW4A16Args args = gemm_w4a16_operands(
        x, dtype, w_packed, scales, zeros, group_size, bias, activation, m, n, k, out, false);
    CK_TRY(check_gemm_w4a16_operands(check, args, group_size, mode));
    return ck::run_variant(check, kGemmW4A16, args, stream);
}

int64_t ck_w4a16_prepacked_bytes(int64_t n, int64_t k) {
    if (n < 1 || k < 32 || k % 32 || n > ck::kPackMaxDim || k > ck::kPackMaxDim) return 0;
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
    return w4a16_prepack_checked(Check("ck_w4a16_prepack"), w_packed, scales, zeros, dtype, n, k,
                                 group_size, mode, w_prepacked, scales_prepacked, zeros_prepacked,
                                 ck::RopePairs{}, stream);
}

ck_status_t ck_gemm_w4a16_prepacked(const void* x, ck_dtype_t dtype, const uint8_t* w_prepacked,
                                    const void* scales_prepacked, const uint8_t* zeros_prepacked,
                                    int64_t group_size, ck_int4_mode_t mode, const void* bias,
                                    ck_activation_t activation, int64_t m, int64_t n, int64_t k,
                                    void* out, ck_stream_t stream) {
    const Check check("ck_gemm_w4a16_prepacked");
    const ck::GemmW4A16Args args =
        gemm_w4a16_operands(x, dtype, w_prepacked, scales_prepacked, zeros_prepacked, group_size,
                            bias, activation, m, n, k, out, true);
    CK_TRY(check_gemm_w4a16_operands(check, args, group_size, mode));
    return ck::run_variant(check, kGemmW4A16, args, stream);
}

int64_t ck_block4_prepacked_scales_bytes(ck_block4_format_t format, int64_t n, int64_t k,
                                         int64_t blocksize) {
    if (format < 0 || format >= kBlock4Formats || !block4_blocksize_ok(format, blocksize)) return 0;
    if (ck_w4a16_prepacked_bytes(n, k) == 0 || k % blocksize) return 0;
    const int64_t units = k / ck::block4_unit_group(format, blocksize);
    int64_t bytes;
    if (__builtin_mul_overflow(ck::prepacked_rows(n), units * ck::block4_unit_bytes(format), &bytes))
        return 0;
    return bytes;
}

ck_status_t ck_block4_prepack(ck_block4_format_t format, const uint8_t* packed, const void* scales,
                              int64_t n, int64_t k, int64_t blocksize, uint8_t* w_prepacked,
                              void* scales_prepacked, ck_stream_t stream) {
    return block4_prepack_checked(Check("ck_block4_prepack"), format, packed, scales, n, k,
                                  blocksize, w_prepacked, scales_prepacked, ck::RopePairs{}, stream);
}

ck_status_t ck_gemm_block4_prepacked(const void* x, ck_dtype_t dtype, ck_block4_format_t format,
                                     const uint8_t* w_prepacked, const void* scales_prepacked,
                                     const float* global_scale, int64_t blocksize, const void* bias,
                                     ck_activation_t activation, int64_t m, int64_t n, int64_t k,
                                     void* out, ck_stream_t stream) {
    const Check check("ck_gemm_block4_prepacked");
    CK_TRY(check.not_null({{x, "x"}, {w_prepacked, "w_prepacked"},
                           {scales_prepacked, "scales_prepacked"}, {out, "out"}}));
    CK_TRY(check.enum_value(format, kBlock4Formats, "format", "ck_block4_format_t"));
    if (format == CK_BLOCK4_NVFP4) CK_TRY(check.not_null(global_scale, "global_scale"));
    else if (global_scale)
        return check.fail(CK_STATUS_INVALID_VALUE, "global_scale must be NULL for %s (NVFP4 only)",
                          block4_format_name(format));
    CK_TRY(check.half_dtype(dtype, "dtype"));
    CK_TRY(check.enum_value(activation, 2, "activation", "ck_activation_t"));
    CK_TRY(check.gemm_shape(m, n, k, dtype_size(dtype)));
    CK_TRY(check_block4_weight(check, format, n, k, blocksize));
    CK_TRY(check.aligned(x, 16, "x", "16-byte vector loads"));
    CK_TRY(check.aligned(w_prepacked, 16, "w_prepacked", "16-byte vector loads"));
    CK_TRY(check.aligned(scales_prepacked, 16, "scales_prepacked", "16-byte asynchronous copies"));
    if (global_scale) CK_TRY(check.element_aligned(global_scale, CK_DTYPE_FP32, "global_scale"));
    if (bias) CK_TRY(check.element_aligned(bias, dtype, "bias"));
    CK_TRY(check.element_aligned(out, dtype, "out"));

    ck::GemmBlock4Args args{};
    args.format = format;
    const int64_t unit_group = ck::block4_unit_group(format, blocksize);
    args.gemm = gemm_w4a16_operands(x, dtype, w_prepacked, scales_prepacked, nullptr, unit_group,
                                    bias, activation, m, n, k, out, true);
    args.gemm.groups = k / unit_group;  // K is a multiple of the unit group: no partial one
    args.gemm.derive();
    args.gemm.global_scale = global_scale;
    return ck::run_variant(check, kGemmBlock4, args, stream);
}

ck_status_t ck_qkv_prepack(const ck_qkv_params_t* params, const uint8_t* packed, const void* scales,
                           const uint8_t* zeros, uint8_t* w_prepacked, void* scales_prepacked,
                           uint8_t* zeros_prepacked, ck_stream_t stream) {
    const Check check("ck_qkv_prepack");
    int64_t n = 0;
    CK_TRY(check_qkv_layer(check, params, n));
    const ck_qkv_params_t& p = *params;
    if (p.format == CK_WEIGHT4_INT4)
        return w4a16_prepack_checked(check, packed, scales, zeros, p.dtype, n, p.hidden,
                                     p.group_size, p.mode, w_prepacked, scales_prepacked,
                                     zeros_prepacked, qkv_rope_pairs(p), stream);
    if (zeros || zeros_prepacked)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "zeros and zeros_prepacked must be NULL for a block format");
    return block4_prepack_checked(check, block4_of(p.format), packed, scales, n, p.hidden,
                                  p.group_size, w_prepacked, scales_prepacked, qkv_rope_pairs(p),
                                  stream);
}

ck_status_t ck_qkv_projection(const ck_qkv_params_t* params, ck_stream_t stream) {
    const Check check("ck_qkv_projection");
    int64_t n = 0;
    CK_TRY(check_qkv_layer(check, params, n));
    const ck_qkv_params_t& p = *params;
    CK_TRY(check.not_null({{p.x, "params->x"}, {p.w_prepacked, "params->w_prepacked"},
                           {p.scales_prepacked, "params->scales_prepacked"}, {p.q, "params->q"},
                           {p.k, "params->k"}, {p.v, "params->v"}}));
    const bool int4 = p.format == CK_WEIGHT4_INT4;
    if (int4) {
        CK_TRY(check.zero_points(p.mode, p.zeros_prepacked, "params->zeros_prepacked"));
    } else if (p.zeros_prepacked) {
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->zeros_prepacked must be NULL for a block format");
    }
    if (p.format == CK_WEIGHT4_NVFP4) CK_TRY(check.not_null(p.global_scale, "params->global_scale"));
    else if (p.global_scale)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "params->global_scale must be NULL (NVFP4 only)");
    CK_TRY(check.gemm_shape(p.tokens, n, p.hidden, dtype_size(p.dtype), "params->tokens"));
    const bool rope = p.rope_style != CK_ROPE_NONE;
    if (rope) {
        CK_TRY(check.not_null({{p.positions, "params->positions"}, {p.cos_sin, "params->cos_sin"}}));
        int64_t table_bytes;
        if (p.max_position < 1 ||
            __builtin_mul_overflow(p.max_position, p.rotary_dim * 4, &table_bytes))
            return check.fail(CK_STATUS_INVALID_VALUE,
                              "params->max_position=%lld must be >= 1, and the cos/sin table's "
                              "bytes representable in int64_t", (long long)p.max_position);
    }
    CK_TRY(check.aligned(p.x, 16, "params->x", "16-byte vector loads"));
    CK_TRY(check.aligned(p.w_prepacked, 16, "params->w_prepacked", "16-byte vector loads"));
    CK_TRY(check.aligned(p.scales_prepacked, 16, "params->scales_prepacked",
                         "16-byte asynchronous copies"));
    if (p.zeros_prepacked)
        CK_TRY(check.aligned(p.zeros_prepacked, 16, "params->zeros_prepacked",
                             "16-byte asynchronous copies"));
    if (rope)
        CK_TRY(check.element_aligned({{p.positions, CK_DTYPE_INT32, "params->positions"},
                                      {p.cos_sin, CK_DTYPE_FP32, "params->cos_sin"}}));
    CK_TRY(check.element_aligned({{p.global_scale, CK_DTYPE_FP32, "params->global_scale"},
                                  {p.bias, p.dtype, "params->bias"},
                                  {p.q, p.dtype, "params->q"},
                                  {p.k, p.dtype, "params->k"},
                                  {p.v, p.dtype, "params->v"}}));
    const int64_t es = int64_t(dtype_size(p.dtype));
    const int64_t q_bytes = p.tokens * p.num_heads_q * p.head_dim * es;
    const int64_t kv_bytes = p.tokens * p.num_heads_kv * p.head_dim * es;
    const int64_t x_bytes = p.tokens * p.hidden * es;
    if (overlaps(p.q, q_bytes, p.k, kv_bytes) || overlaps(p.q, q_bytes, p.v, kv_bytes) ||
        overlaps(p.k, kv_bytes, p.v, kv_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE, "params->q, k and v overlap");
    if (overlaps(p.x, x_bytes, p.q, q_bytes) || overlaps(p.x, x_bytes, p.k, kv_bytes) ||
        overlaps(p.x, x_bytes, p.v, kv_bytes))
        return check.fail(CK_STATUS_INVALID_VALUE, "params->q, k or v overlaps params->x");

    // One GEMM call on the format's kernels whose epilogue (QkvEpilogue) splits, adds the
    // bias and rotates; the GEMM's own output and bias are unused.
    const int64_t group = int4 ? p.group_size : ck::block4_unit_group(block4_of(p.format), p.group_size);
    ck::GemmW4A16Args g = gemm_w4a16_operands(p.x, p.dtype, p.w_prepacked, p.scales_prepacked,
                                              p.zeros_prepacked, group, nullptr,
                                              CK_ACTIVATION_NONE, p.tokens, n, p.hidden, p.q, true);
    if (!int4) {
        g.groups = p.hidden / group;  // K is a multiple of the unit group: no partial one
        g.derive();
        g.global_scale = p.global_scale;
    }
    ck::QkvOut& o = g.qkv;
    o.q = p.q;
    o.k = p.k;
    o.v = p.v;
    o.bias = p.bias;
    o.heads_q = p.num_heads_q;
    o.heads_kv = p.num_heads_kv;
    o.head_dim = p.head_dim;
    o.rope = p.rope_style;
    if (rope) {
        o.positions = p.positions;
        o.cos_sin = p.cos_sin;
        o.max_position = p.max_position;
        o.rotary_dim = p.rotary_dim;
    }
    const auto word_aligned = [](const void* a) { return reinterpret_cast<uintptr_t>(a) % 4 == 0; };
    o.pair_aligned = word_aligned(p.q) && word_aligned(p.k) && word_aligned(p.v);
    if (int4) return ck::run_variant(check, kGemmW4A16, g, stream);
    ck::GemmBlock4Args b{};
    b.format = block4_of(p.format);
    b.gemm = g;
    return ck::run_variant(check, kGemmBlock4, b, stream);
}

ck_status_t ck_import_gptq(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                           const int32_t* g_idx, ck_dtype_t dtype, int64_t n, int64_t k,
                           int64_t group_size, uint8_t* w_packed, void* scales_out,
                           uint8_t* zeros_out, int32_t* perm, ck_stream_t stream) {
    const Check check("ck_import_gptq");
    const ck::Int4ImportArgs args = import_operands(qweight, qzeros, scales, g_idx, dtype, n, k,
                                                    group_size, w_packed, scales_out, zeros_out,
                                                    perm);
    CK_TRY(check_import(check, args, group_size));
    if (g_idx) {
        CK_TRY(check.not_null(perm, "perm"));
        CK_TRY(check.element_aligned(
            {{g_idx, CK_DTYPE_INT32, "g_idx"}, {perm, CK_DTYPE_INT32, "perm"}}));
    } else if (perm) {
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "perm must be NULL without g_idx (the columns keep their order)");
    }
    return check.launch([&] { return ck::import_gptq(args, stream); });
}

ck_status_t ck_import_awq(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                          ck_dtype_t dtype, int64_t n, int64_t k, int64_t group_size,
                          uint8_t* w_packed, void* scales_out, uint8_t* zeros_out,
                          ck_stream_t stream) {
    const Check check("ck_import_awq");
    const ck::Int4ImportArgs args = import_operands(qweight, qzeros, scales, nullptr, dtype, n, k,
                                                    group_size, w_packed, scales_out, zeros_out,
                                                    nullptr);
    CK_TRY(check_import(check, args, group_size));
    return check.launch([&] { return ck::import_awq(args, stream); });
}

ck_status_t ck_permute_columns(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                               const int32_t* perm, void* out, ck_stream_t stream) {
    const Check check("ck_permute_columns");
    CK_TRY(check.not_null({{x, "x"}, {perm, "perm"}, {out, "out"}}));
    CK_TRY(check.float_dtype(dtype, "dtype"));
    CK_TRY(check.matrix(rows, cols, dtype_size(dtype)));
    if (cols > INT32_MAX)
        return check.fail(CK_STATUS_UNSUPPORTED,
                          "cols=%lld: perm's int32 indices address at most 2^31 - 1 columns",
                          (long long)cols);
    CK_TRY(check.element_aligned(
        {{x, dtype, "x"}, {perm, CK_DTYPE_INT32, "perm"}, {out, dtype, "out"}}));
    return check.launch([&] { return ck::permute_columns(x, dtype, rows, cols, perm, out, stream); });
}

ck_status_t ck_sparse_prune(const void* w, ck_dtype_t dtype, ck_sparsity_t sparsity, int64_t n,
                            int64_t k, void* out, ck_stream_t stream) {
    const Check check("ck_sparse_prune");
    CK_TRY(check.not_null({{w, "w"}, {out, "out"}}));
    CK_TRY(check.enum_value(sparsity, kSparsities, "sparsity", "ck_sparsity_t"));
    CK_TRY(check.float_dtype(dtype, "dtype"));
    CK_TRY(check.matrix(n, k, dtype_size(dtype), "n", "k"));
    CK_TRY(check.multiple_of(k, ck::kSparseWordK, "k", "the pattern's blocks of 32 k"));
    CK_TRY(check.element_aligned({{w, dtype, "w"}, {out, dtype, "out"}}));
    const ck::SparseWeight shape = sparse_weight(sparsity, dtype, n, k, 0, nullptr, nullptr,
                                                 nullptr, nullptr);
    return check.launch([&] { return ck::sparse_prune(w, shape, out, stream); });
}

ck_status_t ck_sparse_quantize_int4(const void* w, ck_dtype_t dtype, ck_sparsity_t sparsity,
                                    int64_t n, int64_t k, int64_t group_size, ck_int4_mode_t mode,
                                    uint8_t* codes, uint32_t* meta, void* scales, uint8_t* zeros,
                                    int32_t* violations, ck_stream_t stream) {
    const Check check("ck_sparse_quantize_int4");
    CK_TRY(check.not_null({{w, "w"}, {codes, "codes"}, {meta, "meta"}, {scales, "scales"}}));
    CK_TRY(check.enum_value(sparsity, kSparsities, "sparsity", "ck_sparsity_t"));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.float_dtype(dtype, "dtype"));
    CK_TRY(check_sparse_weight(check, n, k, group_size, dtype_size(dtype)));
    CK_TRY(check.element_aligned({{w, dtype, "w"}, {scales, dtype, "scales"}}));
    CK_TRY(check_sparse_codes(check, codes, meta));
    if (violations) CK_TRY(check.element_aligned(violations, CK_DTYPE_INT32, "violations"));
    const ck::SparseWeight out = sparse_weight(sparsity, dtype, n, k, group_size, codes, meta,
                                               scales, zeros);
    return check.launch([&] { return ck::sparse_quantize_int4(w, out, violations, stream); });
}

ck_status_t ck_sparse_1632_to_24(const uint32_t* masks, int64_t n, int64_t k, uint32_t* meta_24,
                                 int32_t* violations, ck_stream_t stream) {
    const Check check("ck_sparse_1632_to_24");
    CK_TRY(check.not_null({{masks, "masks"}, {meta_24, "meta_24"}}));
    CK_TRY(check.matrix(n, k, sizeof(uint32_t), "n", "k"));
    CK_TRY(check.multiple_of(k, ck::kSparseWordK, "k", "one mask word per 32 k of a row"));
    CK_TRY(check.aligned(masks, 16, "masks", "the kernels' 16-byte accesses"));
    CK_TRY(check.aligned(meta_24, 16, "meta_24", "the kernels' 16-byte accesses"));
    if (violations) CK_TRY(check.element_aligned(violations, CK_DTYPE_INT32, "violations"));
    return check.launch(
        [&] { return ck::sparse_1632_to_24(masks, n, k, meta_24, violations, stream); });
}

ck_status_t ck_sparse_dequantize_int4(const uint8_t* codes, const uint32_t* meta,
                                      const void* scales, const uint8_t* zeros,
                                      ck_sparsity_t sparsity, int64_t n, int64_t k,
                                      int64_t group_size, ck_int4_mode_t mode, void* out,
                                      ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_sparse_dequantize_int4");
    CK_TRY(check.not_null({{codes, "codes"}, {meta, "meta"}, {scales, "scales"}, {out, "out"}}));
    CK_TRY(check.enum_value(sparsity, kSparsities, "sparsity", "ck_sparsity_t"));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.float_dtype(out_dtype, "out_dtype"));
    CK_TRY(check_sparse_weight(check, n, k, group_size, dtype_size(out_dtype)));
    CK_TRY(check_sparse_codes(check, codes, meta));
    CK_TRY(check.element_aligned({{scales, out_dtype, "scales"}, {out, out_dtype, "out"}}));
    const ck::SparseWeight in = sparse_weight(sparsity, out_dtype, n, k, group_size, codes, meta,
                                              scales, zeros);
    return check.launch([&] { return ck::sparse_dequantize_int4(in, out, stream); });
}

ck_status_t ck_gemm_sparse_w4a16(const void* x, ck_dtype_t dtype, ck_sparsity_t sparsity,
                                 const uint8_t* codes, const uint32_t* meta, const void* scales,
                                 const uint8_t* zeros, int64_t group_size, ck_int4_mode_t mode,
                                 const void* bias, ck_activation_t activation, int64_t m,
                                 int64_t n, int64_t k, void* out, ck_stream_t stream) {
    const Check check("ck_gemm_sparse_w4a16");
    CK_TRY(check.enum_value(sparsity, kSparsities, "sparsity", "ck_sparsity_t"));
    const ck::SparseGemmArgs args =
        sparse_gemm_args(x, dtype, sparsity == CK_SPARSITY_16_32, codes, meta, scales, zeros,
                         group_size, bias, activation, m, n, k, out, false);
    CK_TRY(sparse_gemm_operands(check, args, mode, "codes", "scales", "zeros"));
    return ck::run_variant(check, kGemmSparse, args, stream);
}

int64_t ck_sparse_w4a16_prepacked_bytes(int64_t n, int64_t k) {
    if (n < 1 || k < ck::kSparsePackK || k % ck::kSparsePackK) return 0;
    int64_t bytes;
    if (n > INT64_MAX - ck::kSparsePackRows ||
        __builtin_mul_overflow(ck::sparse_prepacked_rows(n), k / 8 * 3, &bytes))
        return 0;
    return bytes;
}

int64_t ck_sparse_w4a16_prepacked_groups(int64_t n, int64_t k, int64_t group_size) {
    if (!ck::sparse_group_ok(group_size) || ck_sparse_w4a16_prepacked_bytes(n, k) == 0) return 0;
    int64_t values;
    if (__builtin_mul_overflow(ck::sparse_prepacked_rows(n), k / group_size, &values)) return 0;
    return values;
}

ck_status_t ck_sparse_w4a16_prepack(const uint8_t* codes, const uint32_t* meta,
                                    const void* scales, const uint8_t* zeros, ck_dtype_t dtype,
                                    int64_t n, int64_t k, int64_t group_size, ck_int4_mode_t mode,
                                    uint8_t* w_prepacked, void* scales_prepacked,
                                    uint8_t* zeros_prepacked, ck_stream_t stream) {
    const Check check("ck_sparse_w4a16_prepack");
    CK_TRY(check.not_null({{codes, "codes"}, {meta, "meta"}, {scales, "scales"},
                           {w_prepacked, "w_prepacked"}, {scales_prepacked, "scales_prepacked"}}));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.zero_points(mode, zeros_prepacked, "zeros_prepacked"));
    CK_TRY(check.half_dtype(dtype, "dtype"));
    CK_TRY(check_sparse_weight(check, n, k, group_size, dtype_size(dtype)));
    CK_TRY(check.multiple_of(k, ck::kSparsePackK, "k", "the prepacked layout's 128-k chunks"));
    if (ck_sparse_w4a16_prepacked_groups(n, k, group_size) == 0)
        return check.fail(CK_STATUS_INVALID_VALUE, "n=%lld, k=%lld overflow a 64-bit byte count",
                          (long long)n, (long long)k);
    CK_TRY(check_sparse_prepack_buffers(check, codes, meta, scales, dtype, w_prepacked,
                                        scales_prepacked, zeros_prepacked));
    ck::SparsePrepackArgs args{};
    args.in = sparse_weight(CK_SPARSITY_2_4, dtype, n, k, group_size, codes, meta, scales, zeros);
    args.w_out = w_prepacked;
    args.scales_out = scales_prepacked;
    args.zeros_out = zeros_prepacked;
    return check.launch([&] { return ck::sparse_w4a16_prepack(args, stream); });
}

ck_status_t ck_sparse_w4a16_prepack_dense(const uint8_t* codes, const uint32_t* meta,
                                          const void* scales, const uint8_t* zeros,
                                          ck_sparsity_t sparsity, ck_dtype_t dtype, int64_t n,
                                          int64_t k, int64_t group_size, ck_int4_mode_t mode,
                                          uint8_t* w_prepacked, void* scales_prepacked,
                                          uint8_t* zeros_prepacked, ck_stream_t stream) {
    const Check check("ck_sparse_w4a16_prepack_dense");
    CK_TRY(check.not_null({{codes, "codes"}, {meta, "meta"}, {scales, "scales"},
                           {w_prepacked, "w_prepacked"}, {scales_prepacked, "scales_prepacked"}}));
    CK_TRY(check.enum_value(sparsity, kSparsities, "sparsity", "ck_sparsity_t"));
    CK_TRY(check.int4_mode(mode, zeros));
    CK_TRY(check.zero_points(mode, zeros_prepacked, "zeros_prepacked"));
    CK_TRY(check.half_dtype(dtype, "dtype"));
    CK_TRY(check_sparse_weight(check, n, k, group_size, dtype_size(dtype)));
    CK_TRY(check_prepacked_size(check, false, 1, n, k, group_size));
    CK_TRY(check_sparse_prepack_buffers(check, codes, meta, scales, dtype, w_prepacked,
                                        scales_prepacked, zeros_prepacked));
    auto args = int4_conversion<ck::W4A16PrepackArgs>(scales, dtype, n, k, group_size,
                                                      w_prepacked, scales_prepacked,
                                                      zeros_prepacked);
    args.w = codes;
    args.zeros = zeros;
    args.sparse = {meta, sparsity == CK_SPARSITY_16_32, zeros, group_size};
    return check.launch([&] { return ck::w4a16_prepack(args, stream); });
}

ck_status_t ck_gemm_sparse_w4a16_prepacked(const void* x, ck_dtype_t dtype,
                                           const uint8_t* w_prepacked,
                                           const void* scales_prepacked,
                                           const uint8_t* zeros_prepacked, int64_t group_size,
                                           ck_int4_mode_t mode, const void* bias,
                                           ck_activation_t activation, int64_t m, int64_t n,
                                           int64_t k, void* out, ck_stream_t stream) {
    const Check check("ck_gemm_sparse_w4a16_prepacked");
    const ck::SparseGemmArgs args = sparse_gemm_args(
        x, dtype, false, w_prepacked, nullptr, scales_prepacked, zeros_prepacked, group_size, bias,
        activation, m, n, k, out, true);
    CK_TRY(sparse_gemm_operands(check, args, mode, "w_prepacked", "scales_prepacked",
                                "zeros_prepacked"));
    if (ck_sparse_w4a16_prepacked_groups(n, k, group_size) == 0)
        return check.fail(CK_STATUS_INVALID_VALUE, "n=%lld, k=%lld overflow a 64-bit byte count",
                          (long long)n, (long long)k);
    return ck::run_variant(check, kGemmSparse, args, stream);
}

ck_status_t ck_gemm_int4(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n, int64_t k,
                         int32_t* c, ck_stream_t stream) {
    const Check check("ck_gemm_int4");
    const ck::IntGemmArgs args = int_gemm_operands(a, b, CK_LAYOUT_NK, m, n, k, c, CK_DTYPE_INT32);
    CK_TRY(check_int_gemm_operands(check, args, kInt4K));
    return ck::run_variant(check, kGemmInt4, args, stream);
}

ck_status_t ck_gemm_int4_scaled(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n,
                                int64_t k, const float* scale_a, ck_granularity_t a_granularity,
                                const float* scale_b, ck_granularity_t b_granularity,
                                const void* bias, ck_activation_t activation, void* out,
                                ck_dtype_t out_dtype, ck_stream_t stream) {
    const Check check("ck_gemm_int4_scaled");
    const ScaledEpilogue epilogue{scale_a, a_granularity, scale_b, b_granularity, bias, activation};
    const auto args = int_gemm_operands(a, b, CK_LAYOUT_NK, m, n, k, out, out_dtype, &epilogue);
    CK_TRY(check_scaled_int_gemm(check, args, kInt4K, epilogue));
    return ck::run_variant(check, kGemmInt4, args, stream);
}

ck_status_t ck_linear(const void* x, const void* w, const void* bias, ck_dtype_t dtype, int64_t m,
                      int64_t n, int64_t k, ck_activation_t activation, void* out,
                      ck_stream_t stream) {
    const Check check("ck_linear");
    CK_TRY(check.not_null({{x, "x"}, {w, "w"}, {out, "out"}}));
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
    CK_TRY(check.device_count(&devices));
    cudaGetLastError();
    return CK_CUBLAS(check.fn(), ck::linear(x, w, bias, dtype, m, n, k, activation, out, stream));
}

ck_status_t ck_moe_route(const void* logits, ck_dtype_t logits_dtype, int64_t tokens,
                         int64_t experts, int64_t top_k, int renormalize, int32_t* topk_ids,
                         float* topk_weights, ck_stream_t stream) {
    const Check check("ck_moe_route");
    CK_TRY(check.not_null({{logits, "logits"}, {topk_ids, "topk_ids"}, {topk_weights, "topk_weights"}}));
    CK_TRY(check.float_dtype(logits_dtype, "logits_dtype"));
    CK_TRY(check_moe_route_shape(check, tokens, experts, top_k));
    CK_TRY(check.matrix(tokens, experts, 4));
    CK_TRY(check.element_aligned({{logits, logits_dtype, "logits"},
                                  {topk_ids, CK_DTYPE_INT32, "topk_ids"},
                                  {topk_weights, CK_DTYPE_FP32, "topk_weights"}}));
    const ck::MoeRouteArgs args{logits, logits_dtype, tokens, experts, top_k, renormalize != 0,
                                topk_ids, topk_weights};
    return check.launch([&] { return ck::moe_route(args, stream); });
}

int64_t ck_moe_prepacked_bytes(int64_t experts, int64_t n, int64_t k) {
    const int64_t one = ck_w4a16_prepacked_bytes(n, k);
    int64_t bytes;
    if (experts < 1 || one == 0 || __builtin_mul_overflow(experts, one, &bytes)) return 0;
    return bytes;
}

int64_t ck_moe_prepacked_groups(int64_t experts, int64_t n, int64_t k, int64_t group_size) {
    const int64_t one = ck_w4a16_prepacked_groups(n, k, group_size);
    int64_t values;
    if (experts < 1 || one == 0 || __builtin_mul_overflow(experts, one, &values)) return 0;
    return values;
}

ck_status_t ck_moe_prepack(const uint8_t* w_packed, const void* scales, const uint8_t* zeros,
                           ck_dtype_t dtype, int64_t experts, int64_t n, int64_t k,
                           int64_t group_size, ck_int4_mode_t mode, int gate_up,
                           uint8_t* w_prepacked, void* scales_prepacked, uint8_t* zeros_prepacked,
                           ck_stream_t stream) {
    const Check check("ck_moe_prepack");
    CK_TRY(check_prepack_pointers(check, w_packed, scales, zeros, dtype, mode, w_prepacked,
                                  scales_prepacked, zeros_prepacked));
    if (experts < 1 || experts > ck::kMoeMaxExperts)
        return check.fail(CK_STATUS_INVALID_VALUE, "experts=%lld must be in [1, %lld]",
                          (long long)experts, (long long)ck::kMoeMaxExperts);
    if (gate_up != 0 && gate_up != 1)
        return check.fail(CK_STATUS_INVALID_VALUE, "gate_up=%d must be 0 or 1", gate_up);
    CK_TRY(check.gemm_shape(experts, n, k, 2, "experts"));
    CK_TRY(check.multiple_of(k, 32, "k", "a lane dequantizes 32 weights of a row from 16 bytes"));
    if (gate_up)
        CK_TRY(check.multiple_of(n, 16, "n", "gate and up rows interleave in tiles of 8 rows"));
    CK_TRY(check.group_size(group_size));
    CK_TRY(check_prepacked_size(check, true, experts, n, k, group_size));
    ck::W4A16PrepackArgs args{};
    CK_TRY(prepack_operands(check, w_packed, scales, zeros, dtype, n, k, group_size, w_prepacked,
                            scales_prepacked, zeros_prepacked, args));
    args.interleave = gate_up ? n / 2 : 0;
    // One prepack per expert: experts' inputs and outputs are consecutive.
    const int64_t in_values = n * args.groups, out_bytes = ck_w4a16_prepacked_bytes(n, k);
    const int64_t out_values = ck_w4a16_prepacked_groups(n, k, group_size);
    const size_t elem = dtype_size(dtype);
    return check.launch([&] {
        for (int64_t e = 0; e < experts; ++e) {
            ck::W4A16PrepackArgs one = args;
            one.w = w_packed + e * n * (k / 2);
            one.scales = static_cast<const uint8_t*>(scales) + e * in_values * elem;
            one.zeros = zeros ? zeros + e * in_values : nullptr;
            one.w_out = w_prepacked + e * out_bytes;
            one.scales_out = static_cast<uint8_t*>(scales_prepacked) + e * out_values * elem;
            one.zeros_out = zeros_prepacked ? zeros_prepacked + e * out_values : nullptr;
            const cudaError_t err = ck::w4a16_prepack(one, stream);
            if (err != cudaSuccess) return err;
        }
        return cudaSuccess;
    });
}

ck_status_t ck_moe_workspace_size(const ck_moe_params_t* params, size_t* bytes) {
    const Check check("ck_moe_workspace_size");
    CK_TRY(check.not_null(bytes, "bytes"));
    *bytes = 0;
    CK_TRY(check_moe_sizes(check, params));
    *bytes = ck::moe_plan(params->tokens, params->hidden, params->intermediate, params->experts,
                          params->top_k, params->dtype).bytes;
    return CK_STATUS_SUCCESS;
}

ck_status_t ck_moe_forward(const ck_moe_params_t* params, void* workspace, size_t workspace_bytes,
                           ck_stream_t stream) {
    const Check check("ck_moe_forward");
    CK_TRY(check_moe_sizes(check, params));
    const ck_moe_params_t* p = params;
    CK_TRY(check_moe_pointers(check, p));
    const ck::MoePlan plan = ck::moe_plan(p->tokens, p->hidden, p->intermediate, p->experts,
                                          p->top_k, p->dtype);
    CK_TRY(check.not_null(workspace, "workspace"));
    if (workspace_bytes < plan.bytes)
        return check.fail(CK_STATUS_INVALID_VALUE,
                          "workspace_bytes=%zu is smaller than ck_moe_workspace_size's %zu",
                          workspace_bytes, plan.bytes);
    CK_TRY(check.aligned(workspace, 256, "workspace", "its 256-byte aligned regions"));
    if (overlaps(workspace, int64_t(plan.bytes), p->out, p->tokens * p->hidden * 2) ||
        overlaps(workspace, int64_t(plan.bytes), p->x, p->tokens * p->hidden * 2))
        return check.fail(CK_STATUS_INVALID_VALUE, "workspace overlaps params->x or params->out");

    uint8_t* ws = static_cast<uint8_t*>(workspace);
    const int32_t* ids = p->topk_ids;
    const float* weights = p->topk_weights;
    if (p->router_logits) {
        int32_t* routed_ids = reinterpret_cast<int32_t*>(ws + plan.ids);
        float* routed_weights = reinterpret_cast<float*>(ws + plan.weights);
        const ck::MoeRouteArgs route{p->router_logits, p->router_dtype, p->tokens, p->experts,
                                     p->top_k, p->renormalize != 0, routed_ids, routed_weights};
        // Choose the experts' variant first: a refused override launches nothing.
        const ck::Variant<ck::MoeExperts>* unused = nullptr;
        CK_TRY(ck::select_variant(check, kMoe, ck::MoeExperts{plan}, &unused));
        CK_TRY(check.launch([&] { return ck::moe_route(route, stream); }));
        ids = routed_ids, weights = routed_weights;
    }
    const ck::MoeExperts experts{plan, p->group_size, p->x, ids, weights, p->w13, p->w13_scales,
                                 p->w13_zeros, p->w2, p->w2_scales, p->w2_zeros, p->out, ws};
    return ck::run_variant(check, kMoe, experts, stream);
}

ck_status_t ck_attention_forward(const ck_attention_params_t* params, ck_stream_t stream) {
    const Check check("ck_attention_forward");
    ck::AttentionArgs args;
    CK_TRY(check_attention_params(check, params, &args));
    CK_TRY(ck::check_variant_name(check, kAttention));
    CK_TRY(check_attention_gpu(check));
    return ck::run_variant(check, kAttention, args, stream);
}

ck_status_t ck_kv_cache_append(const ck_kv_cache_append_params_t* params, ck_stream_t stream) {
    const Check check("ck_kv_cache_append");
    ck::KvAppendArgs args;
    CK_TRY(check_kv_append_params(check, params, &args));
    CK_TRY(check_attention_gpu(check));
    return check.launch([&] { return ck::kv_cache_append(args, stream); });
}

ck_status_t ck_attention_decode_workspace_size(const ck_attention_decode_params_t* params,
                                               size_t* bytes) {
    const Check check("ck_attention_decode_workspace_size");
    CK_TRY(check.not_null(bytes, "bytes"));
    *bytes = 0;
    DecodeCall call;
    CK_TRY(check_decode_params(check, params, /*pointers=*/false, &call));
    *bytes = size_t(call.workspace.bytes);
    return CK_STATUS_SUCCESS;
}

ck_status_t ck_attention_decode(const ck_attention_decode_params_t* params, void* workspace,
                                size_t workspace_bytes, ck_stream_t stream) {
    const Check check("ck_attention_decode");
    DecodeCall call;
    CK_TRY(check_decode_params(check, params, /*pointers=*/true, &call));
    CK_TRY(check_decode_workspace(check, workspace, workspace_bytes, &call));
    CK_TRY(check_attention_gpu(check));
    return check.launch([&] { return ck::attention_decode(call.args, stream); });
}

}  // extern "C"
