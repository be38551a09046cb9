// benchmarks/bench_gemm.cuh - family "gemm": the INT8 GEMMs (ck_gemm_int8, ck_gemm_int8_scaled),
// the W4A16 GEMMs (ck_gemm_w4a16, ck_gemm_w4a16_prepacked), the INT4 x INT4 GEMMs (ck_gemm_int4,
// ck_gemm_int4_scaled) and the cuBLASLt linear layer (ck_linear), each beside what a user runs
// today, on the same run.
//
// Problems: the LLM weight shapes (K, N) of DESIGN.md section 4 times M tokens (--quick: one
// shape, three M; --size does not apply: the shapes are the models'). Rows of each (shape, M):
//   gemm_int8 int32                baseline "cuBLASLt int8": int8 x int8 -> int32, TN, a 32 MB
//                                  workspace, the fastest of cuBLASLt's top heuristics (timed)
//   gemm_int8 scaled fp16 (...)    baseline "cuBLASLt int8 + epilogue": the same call, then a
//                                  separate vectorized kernel int32 -> scales, bias, ReLU -> fp16
//   cuBLAS fp16 (reference)        cublasGemmEx fp16 TN, fp32 accumulation: the layer unquantized
//   gemm_int8 int32 [K,N] weight   a subset; baseline the same cuBLASLt int8 call on the [N, K]
//                                  weight (cuBLASLt's int8 tensor-core kernels take TN only)
//   linear <dtype> + bias + relu   a subset; baseline cublasGemmEx of that dtype, no epilogue
//   gemm_w4a16 fp16 g128           weight-only INT4 (ck_gemm_w4a16, symmetric, groups of 128,
//                                  the weight packed by ck_quantize_int4 from a random fp16 one)
//                                  at M = 1 and 16 on every shape, and M = 64 on one (that M runs
//                                  the reference kernel: small_m serves M <= 16); baseline
//                                  "cuBLAS fp16": cublasGemmEx on the fp16 [N, K] weight, same M.
//                                  Its bytes: packed weight + scales + x + out. Notes: the weight
//                                  stream (packed weight + scales) as a % of copy bandwidth, and
//                                  the speedup over cuBLAS fp16 against kW4A16SpeedupTarget.
//   gemm_w4a16_prepacked fp16 g128 / gemm_w4a16_prepacked fp16 asym g128
//                                  every (shape, M): ck_gemm_w4a16_prepacked (auto variant) on the
//                                  same kind of weight (symmetric; asymmetric, with zeros), put
//                                  through ck_w4a16_prepack once, outside timing.
//                                  Baseline "dequantize_int4 [asym] + cuBLAS fp16", the unfused
//                                  pipeline timed as one: ck_dequantize_int4 of the interchange
//                                  weight into one fp16 [N, K] buffer, then the cublasGemmEx of
//                                  "cuBLAS fp16 (reference)". Its bytes: prepacked weight +
//                                  scales (+ zeros) + x + out. Notes: the speedup over cuBLAS fp16
//                                  (the reference row's timing, not timed again) and, for small M,
//                                  the weight stream as a % of copy bandwidth.
//   gemm_int4 int32                every (shape, M): ck_gemm_int4 on random packed a [M, K / 2]
//                                  and b [N, K / 2]; baseline "cuBLASLt int8" (the timing of the
//                                  gemm_int8 int32 row's baseline, on the unpacked int8 operands
//                                  of the same sizes); note: the speedup over ck_gemm_int8.
//   gemm_int4 scaled fp16 (...)    at M = kInt4ScaledTokens: ck_gemm_int4_scaled with the
//                                  epilogue of the gemm_int8 scaled row; baseline "cuBLASLt int8 +
//                                  epilogue" (that row's baseline); note: vs ck_gemm_int8_scaled.
// A row whose kernel choice an environment variable forces (CK_GEMM_W4A16_KERNEL,
// CK_GEMM_INT4_KERNEL set to anything but "auto") says so in its note.
// Floors: `bytes` reads both operands (and scales, bias) once and writes the output once;
// flops = 2 M N K. For M <= kWeightStreamMaxM the product is a stream over the weight: the note
// gives N K weight bytes / time as a % of the copy bandwidth (target >= kWeightStreamTarget %).
// Buffers are rotated (Bench::rotation_copies) so that every call reads its weight from DRAM.
#pragma once

#include <cublasLt.h>

#include <map>
#include <memory>
#include <optional>

#include "bench.cuh"

namespace gemm_bench {

struct Shape {
    int64_t k, n;
    bool operator==(const Shape& o) const { return k == o.k && n == o.n; }
};

constexpr Shape kShapes[] = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 28672}};
constexpr int64_t kTokens[] = {1, 16, 64, 256, 1024, 4096};
constexpr Shape kQuickShape = {4096, 4096};
constexpr int64_t kQuickTokens[] = {1, 16, 256};

// The subsets: [K, N]-weight rows on the first two shapes at these M; linear rows on one shape.
constexpr int64_t kKnTokens[] = {1, 256, 4096};
constexpr Shape kLinearShape = {4096, 14336};
constexpr int64_t kLinearFp16Tokens[] = {16, 4096};  // plus kLinearAllDtypesTokens
constexpr int64_t kLinearAllDtypesTokens = 1024;     // fp16, bf16 and fp32
constexpr int64_t kQuickLinearAllDtypesTokens = 256;

constexpr int kWeightStreamMaxM = 16;       // up to here the weight stream is the whole cost
constexpr double kWeightStreamTarget = 85;  // % of the measured copy bandwidth

// The W4A16 rows: these M on every shape, plus kW4A16ReferenceTokens on kW4A16ReferenceShape; the
// speedup target over cuBLAS fp16 (DESIGN.md 5: the packed weight is ~4x fewer bytes) applies
// at M <= kWeightStreamMaxM on kW4A16SpeedupShape.
constexpr int64_t kW4A16Tokens[] = {1, 16};
constexpr Shape kW4A16ReferenceShape = {4096, 14336};
constexpr int64_t kW4A16ReferenceTokens = 64;
constexpr int64_t kW4A16GroupSize = 128;
constexpr Shape kW4A16SpeedupShape = {8192, 28672};
constexpr double kW4A16SpeedupTarget = 3.5;
// The prepacked W4A16 rows run on every (shape, M), in both modes, groups of kW4A16GroupSize.
constexpr ck_int4_mode_t kW4A16PrepackedModes[] = {CK_INT4_SYMMETRIC, CK_INT4_ASYMMETRIC};

// The INT4 x INT4 rows: int32 out on every (shape, M); the fused fp16 epilogue at one M.
constexpr int64_t kInt4ScaledTokens = 4096;
constexpr int64_t kQuickInt4ScaledTokens = 256;

constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr int kHeuristicCandidates = 4;  // cuBLASLt algorithms timed to pick its fastest
constexpr int kPickWarmup = 2;
constexpr int kPickReps = 5;

// Random data, never zeros: int8 codes in [-127, 127], scales that keep the fp16 outputs finite
// (|acc| ~ 127^2 sqrt(K) / 3, times two scales of ~5e-4).
constexpr float kInt8Max = 127;
constexpr float kScaleMin = 1e-4f, kScaleMax = 1e-3f;
constexpr float kFloatAbsMax = 1;

inline bool kn_rows_at(Shape s, int64_t m) {
    return (s == kShapes[0] || s == kShapes[1]) &&
           std::find(std::begin(kKnTokens), std::end(kKnTokens), m) != std::end(kKnTokens);
}

inline bool w4a16_row_at(Shape s, int64_t m) {
    return std::find(std::begin(kW4A16Tokens), std::end(kW4A16Tokens), m) !=
               std::end(kW4A16Tokens) ||
           (s == kW4A16ReferenceShape && m == kW4A16ReferenceTokens);
}

inline bool int4_scaled_row_at(int64_t m, bool quick) {
    return m == (quick ? kQuickInt4ScaledTokens : kInt4ScaledTokens);
}

// y[m, n] = x[m, k] w[n, k]^T in fp16 on cuBLAS (TN, float32 accumulation): the unquantized
// layer every weight-only family (block4, qkv, sparse) measures itself beside.
inline void cublas_fp16_linear(Bench& bench, const void* w, const void* x, void* y, int64_t m,
                               int64_t n, int64_t k) {
    const float alpha = 1.f, beta = 0.f;
    CK_BENCH_CHECK(cublasGemmEx(bench.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k),
                                &alpha, w, CUDA_R_16F, int(k), x, CUDA_R_16F, int(k), &beta, y,
                                CUDA_R_16F, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// A fp16 [n, k] weight as the library's prepacked symmetric INT4 of groups `group`
// (ck_quantize_int4, then ck_w4a16_prepack) into new buffers w_out and s_out; packed (n k / 2
// bytes) and scales (n k / group halves) are the caller's scratch.
inline void prepack_int4_fp16(const void* dense, int64_t n, int64_t k, int64_t group,
                              DeviceBuffer& packed, DeviceBuffer& scales, DeviceBuffer& w_out,
                              DeviceBuffer& s_out, cudaStream_t st) {
    w_out = DeviceBuffer(size_t(ck_w4a16_prepacked_bytes(n, k)));
    s_out = DeviceBuffer(sizeof(__half) * size_t(ck_w4a16_prepacked_groups(n, k, group)));
    CK_BENCH_CHECK(ck_quantize_int4(dense, CK_DTYPE_FP16, n, k, group, CK_INT4_SYMMETRIC,
                                    packed.as<uint8_t>(), scales.as(), nullptr, st));
    CK_BENCH_CHECK(ck_w4a16_prepack(packed.as<uint8_t>(), scales.as(), nullptr, CK_DTYPE_FP16, n,
                                    k, group, CK_INT4_SYMMETRIC, w_out.as<uint8_t>(), s_out.as(),
                                    nullptr, st));
}

// A fp16 GEMM row of the weight-only families (block4, qkv, sparse): 2 M N K flops, `bytes` its
// floor, `copies` the rotation copies of its inputs.
inline RowSpec weight_only_spec(const char* family, const std::string& kernel,
                                const std::string& shape, double bytes, int64_t m, int64_t n,
                                int64_t k, int copies) {
    RowSpec spec = row_spec(family, kernel, "fp16", shape);
    spec.bytes = bytes;
    spec.flops = 2.0 * double(m) * double(n) * double(k);
    spec.copies = copies;
    return spec;
}

// What the weight-only families block4 and sparse share: a problem of M tokens through an
// [N, K] fp16 layer, its names and byte counts, the first part of each rotation copy (x, out,
// the dense fp16 weight and its prepacked INT4, symmetric g128), and the rows every such family
// runs first: cuBLAS fp16 on the dense weight and the dense INT4 W4A16 GEMM. Derived::make_sets()
// makes the copies (once, on first use); its Set holds at least x, out, dense, int4_w, int4_s.
template <class Derived, class Set> class WeightOnlyProblem {
  public:
    WeightOnlyProblem(Bench& bench, const char* family, Shape shape, int64_t m)
        : bench_(bench), family_(family), k_(shape.k), n_(shape.n), m_(m),
          shape_name_("M=" + std::to_string(m) + " K=" + std::to_string(shape.k) +
                      " N=" + std::to_string(shape.n)) {}

  protected:
    static constexpr int64_t kInt4GroupSize = 128;

    double activation_bytes() const {
        return 2.0 * (double(m_) * double(k_) + double(m_) * double(n_));
    }
    double dense_weight_bytes() const { return 2.0 * double(n_) * double(k_); }
    double int4_weight_bytes() const {
        return double(ck_w4a16_prepacked_bytes(n_, k_)) +
               2.0 * double(ck_w4a16_prepacked_groups(n_, k_, kInt4GroupSize));
    }

    RowSpec spec_for(const std::string& kernel, double bytes) {
        return weight_only_spec(family_, kernel, shape_name_, bytes, m_, n_, k_,
                                int(sets().size()));
    }

    const std::vector<Set>& sets() {
        if (sets_.empty()) sets_ = static_cast<Derived*>(this)->make_sets();
        return sets_;
    }
    const Set& set(int i) { return sets()[size_t(i) % sets().size()]; }

    // A new copy's x and dense weight (uniform in +-kFloatAbsMax), out (random bytes), and the
    // weight's INT4 (prepack_int4_fp16 through the scratch packed and scales).
    Set new_copy(uint64_t seed, DeviceBuffer& packed, DeviceBuffer& scales, cudaStream_t st) {
        Set s;
        s.x = DeviceBuffer(sizeof(__half) * size_t(m_ * k_));
        s.out = DeviceBuffer(sizeof(__half) * size_t(m_ * n_));
        s.dense = DeviceBuffer(sizeof(__half) * size_t(n_ * k_));
        fill_uniform(s.x.as(), CK_DTYPE_FP16, m_ * k_, seed + 1, -kFloatAbsMax, kFloatAbsMax, st);
        fill_uniform(s.dense.as(), CK_DTYPE_FP16, n_ * k_, seed + 2, -kFloatAbsMax, kFloatAbsMax,
                     st);
        fill_random_bytes(s.out.as(), int64_t(s.out.bytes()), seed + 3, st);
        prepack_int4_fp16(s.dense.as(), n_, k_, kInt4GroupSize, packed, scales, s.int4_w,
                          s.int4_s, st);
        return s;
    }

    void stream_note(Row& row, double weight_bytes) const {
        Bench::append_note(row, "weight stream " +
                                    format("%.1f", bench_.percent_of_copy(weight_bytes,
                                                                          row.time.median_us)) +
                                    "% of copy BW");
    }

    // cuBLAS fp16 on the dense weight; nullptr where the filter leaves it out.
    Row* reference_row() {
        RowSpec spec =
            spec_for("cuBLAS fp16 (reference)", dense_weight_bytes() + activation_bytes());
        if (!bench_.wants(spec)) return nullptr;
        return bench_.run(spec, [this](int i) {
            const Set& s = set(i);
            cublas_fp16_linear(bench_, s.dense.as(), s.x.as(), s.out.as(), m_, n_, k_);
        });
    }

    // The dense INT4 W4A16 GEMM, baseline cuBLAS fp16; nullptr where the filter leaves it out.
    Row* int4_row(const Row* fp16) {
        RowSpec spec = spec_for("gemm_w4a16_prepacked fp16 g" + std::to_string(kInt4GroupSize),
                                int4_weight_bytes() + activation_bytes());
        if (!bench_.wants(spec)) return nullptr;
        Row* row = bench_.run(spec, [this](int i) {
            const Set& s = set(i);
            CK_BENCH_CHECK(ck_gemm_w4a16_prepacked(
                s.x.as(), CK_DTYPE_FP16, s.int4_w.template as<uint8_t>(), s.int4_s.as(), nullptr,
                kInt4GroupSize, CK_INT4_SYMMETRIC, nullptr, CK_ACTIVATION_NONE, m_, n_, k_,
                s.out.as(), bench_.stream()));
        });
        if (fp16) Bench::set_baseline(*row, "cuBLAS fp16", fp16->time);
        return row;
    }

    Bench& bench_;
    const char* family_;
    int64_t k_, n_, m_;
    std::string shape_name_;

  private:
    std::vector<Set> sets_;
};

inline const char* int4_mode_word(ck_int4_mode_t mode) {  // the row names' "asym " or nothing
    return mode == CK_INT4_ASYMMETRIC ? "asym " : "";
}

// The dtypes of the linear rows at (s, m); none for most problems.
inline std::vector<ck_dtype_t> linear_dtypes_at(Shape s, int64_t m, bool quick) {
    if (!(s == (quick ? kQuickShape : kLinearShape))) return {};
    if (m == (quick ? kQuickLinearAllDtypesTokens : kLinearAllDtypesTokens))
        return {CK_DTYPE_FP16, CK_DTYPE_BF16, CK_DTYPE_FP32};
    const bool fp16 = std::find(std::begin(kLinearFp16Tokens), std::end(kLinearFp16Tokens), m) !=
                      std::end(kLinearFp16Tokens);
    return fp16 ? std::vector<ck_dtype_t>{CK_DTYPE_FP16} : std::vector<ck_dtype_t>{};
}

inline cudaDataType_t cuda_type(ck_dtype_t dtype) {
    switch (dtype) {
        case CK_DTYPE_FP16: return CUDA_R_16F;
        case CK_DTYPE_BF16: return CUDA_R_16BF;
        default: return CUDA_R_32F;
    }
}

// ------------------------------------------------------------------------------------------------
// The unfused epilogue a user runs after cuBLASLt's int32 GEMM today:
//   out[r, c] = fp16(relu(float(acc[r, c]) * scale_a[r] * scale_b[c] + bias[c]))
// Memory-bound and written as such: a thread turns 8 consecutive columns into one 16-byte fp16
// store, from two 16-byte int32 loads (streaming: read once), two of scale_b and one of bias.
// One block row per matrix row. Needs n % 8 == 0 and 16-byte aligned buffers (cudaMalloc'd).
// ------------------------------------------------------------------------------------------------
constexpr int kEpilogueThreads = 256;
constexpr int kEpilogueCols = 8;

__global__ void __launch_bounds__(kEpilogueThreads)
    scale_bias_relu_fp16_kernel(const int32_t* __restrict__ acc, const float* __restrict__ scale_a,
                                const float* __restrict__ scale_b, const __half* __restrict__ bias,
                                __half* __restrict__ out, int64_t n) {
    const int64_t col = (int64_t(blockIdx.x) * kEpilogueThreads + threadIdx.x) * kEpilogueCols;
    if (col >= n) return;
    const int64_t offset = int64_t(blockIdx.y) * n + col;
    const float row_scale = scale_a[blockIdx.y];
    const int4 a0 = __ldcs(reinterpret_cast<const int4*>(acc + offset));
    const int4 a1 = __ldcs(reinterpret_cast<const int4*>(acc + offset) + 1);
    const float4 s0 = *reinterpret_cast<const float4*>(scale_b + col);
    const float4 s1 = *(reinterpret_cast<const float4*>(scale_b + col) + 1);
    const uint4 bias_raw = *reinterpret_cast<const uint4*>(bias + col);
    const int a[kEpilogueCols] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float s[kEpilogueCols] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    static_assert(kEpilogueCols == 8, "one 16-byte vector of fp16 per thread");
    *reinterpret_cast<uint4*>(out + offset) = pack_half8([&](int i) {
        const float2 bf = half8_pair(bias_raw, i);
        const float v0 = float(a[2 * i]) * row_scale * s[2 * i] + bf.x;
        const float v1 = float(a[2 * i + 1]) * row_scale * s[2 * i + 1] + bf.y;
        return make_float2(fmaxf(v0, 0.f), fmaxf(v1, 0.f));
    });
}

inline void scale_bias_relu_fp16(const int32_t* acc, const float* scale_a, const float* scale_b,
                                 const __half* bias, __half* out, int64_t m, int64_t n,
                                 cudaStream_t stream) {
    constexpr int64_t kMaxRows = 65535;  // grid.y
    if (n % kEpilogueCols != 0 || m > kMaxRows) {
        std::fprintf(stderr, "scale_bias_relu_fp16: needs n %% %d == 0 and m <= %lld\n",
                     kEpilogueCols, (long long)kMaxRows);
        std::exit(kExitFailure);
    }
    const int64_t chunks = n / kEpilogueCols;
    const dim3 grid(unsigned((chunks + kEpilogueThreads - 1) / kEpilogueThreads), unsigned(m));
    scale_bias_relu_fp16_kernel<<<grid, kEpilogueThreads, 0, stream>>>(acc, scale_a, scale_b, bias,
                                                                        out, n);
    CK_BENCH_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------------
// The heuristic's first `count` algorithms for one cuBLASLt matmul (op, layouts a, b, c = d) that
// fit in `workspace_bytes`; at least one, else the program stops (`what` names the GEMM).
inline std::vector<cublasLtMatmulAlgo_t> lt_candidates(cublasLtHandle_t lt,
                                                       cublasLtMatmulDesc_t op,
                                                       cublasLtMatrixLayout_t a,
                                                       cublasLtMatrixLayout_t b,
                                                       cublasLtMatrixLayout_t c,
                                                       size_t workspace_bytes, int count,
                                                       const char* what) {
    cublasLtMatmulPreference_t pref = nullptr;
    CK_BENCH_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_workspace = workspace_bytes;
    CK_BENCH_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof max_workspace));
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
    int found = 0;
    CK_BENCH_CHECK(
        cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, count, results.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    std::vector<cublasLtMatmulAlgo_t> algos;
    for (int i = 0; i < found; ++i) {
        const cublasLtMatmulHeuristicResult_t& r = results[size_t(i)];
        if (r.state == CUBLAS_STATUS_SUCCESS) algos.push_back(r.algo);
    }
    if (algos.empty()) {
        std::fprintf(stderr, "cuBLASLt has no %s algorithm for this problem\n", what);
        std::exit(kExitFailure);
    }
    return algos;
}

// The fastest of `algos`, each timed briefly (kPickWarmup, kPickReps) by launch(algo, i).
template <class Launch>
cublasLtMatmulAlgo_t fastest_lt_algo(const Bench& bench,
                                     const std::vector<cublasLtMatmulAlgo_t>& algos,
                                     Launch&& launch) {
    TimingConfig pick;
    pick.warmup = kPickWarmup;
    pick.reps = kPickReps;
    double best_us = 0;
    cublasLtMatmulAlgo_t best = algos.front();
    for (const cublasLtMatmulAlgo_t& algo : algos) {
        const Timing t = bench.time([&](int i) { launch(algo, i); }, pick);
        if (best_us == 0 || t.median_us < best_us) {
            best_us = t.median_us;
            best = algo;
        }
    }
    return best;
}

// ------------------------------------------------------------------------------------------------
// cuBLASLt's GEMM on an [N, K] row-major weight b and [M, K] activations a, row-major through
// column-major (as in kernels/linear.cu): d^T[N, M] = b[N, K] a^T, with A = b stored
// column-major [K, N] (transposed), B = a column-major [K, M], C = D = d column-major [N, M]:
// the "TN" GEMM, the only layout cuBLASLt's int8 and FP8 tensor-core kernels take in plain
// column-major order. kInt8: int8 -> int32; kFp8: E4M3 -> fp16 with float32 compute and
// per-tensor device scales (scale_a of a, scale_b of b), without fast accumulation.
// ------------------------------------------------------------------------------------------------
class LtTnGemm {
  public:
    struct Types {
        cublasComputeType_t compute;
        cudaDataType_t scale, operands, out;
        const char* name;
    };
    static constexpr Types kInt8{CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_32I, "int8"};
    static constexpr Types kFp8{CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_16F, "FP8"};

    LtTnGemm(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, const Types& types,
             const float* scale_a = nullptr, const float* scale_b = nullptr)
        : lt_(lt), types_(types) {
        const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
        CK_BENCH_CHECK(cublasLtMatmulDescCreate(&op_, types.compute, types.scale));
        CK_BENCH_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                      sizeof transpose));
        CK_BENCH_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &no_transpose, sizeof no_transpose));
        if (scale_a && scale_b) {  // Lt's A is the weight (scale_b), its B the activations
            CK_BENCH_CHECK(cublasLtMatmulDescSetAttribute(
                op_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_b, sizeof scale_b));
            CK_BENCH_CHECK(cublasLtMatmulDescSetAttribute(
                op_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_a, sizeof scale_a));
        }
        const cudaDataType_t ab = types.operands;
        CK_BENCH_CHECK(cublasLtMatrixLayoutCreate(&a_, ab, uint64_t(k), uint64_t(n), k));
        CK_BENCH_CHECK(cublasLtMatrixLayoutCreate(&b_, ab, uint64_t(k), uint64_t(m), k));
        CK_BENCH_CHECK(cublasLtMatrixLayoutCreate(&c_, types.out, uint64_t(n), uint64_t(m), n));
    }
    ~LtTnGemm() {
        cublasLtMatrixLayoutDestroy(c_);
        cublasLtMatrixLayoutDestroy(b_);
        cublasLtMatrixLayoutDestroy(a_);
        cublasLtMatmulDescDestroy(op_);
    }
    LtTnGemm(const LtTnGemm&) = delete;
    LtTnGemm& operator=(const LtTnGemm&) = delete;

    // The heuristic's first `count` algorithms that fit in `workspace_bytes` (at least one).
    std::vector<cublasLtMatmulAlgo_t> candidates(size_t workspace_bytes, int count) const {
        return lt_candidates(lt_, op_, a_, b_, c_, workspace_bytes, count, types_.name);
    }

    void launch(const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, void* d,
                void* workspace, size_t workspace_bytes, cudaStream_t stream) const {
        const int32_t one = 1, zero = 0;
        const float one_f = 1.f, zero_f = 0.f;
        const bool f32 = types_.scale == CUDA_R_32F;
        const void* alpha = f32 ? static_cast<const void*>(&one_f) : &one;
        const void* beta = f32 ? static_cast<const void*>(&zero_f) : &zero;
        CK_BENCH_CHECK(cublasLtMatmul(lt_, op_, alpha, b, a_, a, b_, beta, d, c_, d, c_, &algo,
                                      workspace, workspace_bytes, stream));
    }

  private:
    cublasLtHandle_t lt_;
    Types types_;
    cublasLtMatmulDesc_t op_ = nullptr;
    cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
};

// What the family shares across problems: the cuBLASLt handle and its workspace.
struct Context {
    Bench& bench;
    bool quick;
    cublasLtHandle_t lt = nullptr;
    DeviceBuffer workspace{kLtWorkspaceBytes};

    Context(Bench& b, bool q) : bench(b), quick(q) { CK_BENCH_CHECK(cublasLtCreate(&lt)); }
    ~Context() { cublasLtDestroy(lt); }
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
};

// One line of the summary table: the rows of one (shape, M), any of them possibly filtered out.
struct Summary {
    Shape shape;
    int64_t m;
    const Row* int32 = nullptr;
    const Row* fused = nullptr;
    const Row* w4a16 = nullptr;                      // ck_gemm_w4a16, where it runs
    const Row* w4a16_prepacked = nullptr;            // symmetric
    const Row* w4a16_prepacked_asym = nullptr;
    const Row* int4 = nullptr;
    const Row* int4_scaled = nullptr;
    double fp16_us = 0;  // cublasGemmEx fp16 (0: not measured)
    double int8_us = 0;  // ck_gemm_int8 int32, [N, K] weight (0: not measured)
};

// One copy of an integer GEMM problem's buffers: the INT8 problem's (int8 operands) or the
// INT4 x INT4 problem's (packed int4 operands, two codes a byte); the rest is the same for both.
struct IntGemmSet {
    DeviceBuffer a;        // [M, K] int8 or [M, K / 2] packed int4
    DeviceBuffer b;        // [N, K] int8 or [N, K / 2] packed int4; the [K, N]-weight int8 rows
                           // read the same bytes as [K, N]
    DeviceBuffer c;        // [M, N] int32
    DeviceBuffer scale_a;  // [M] float, per token (scaled rows only)
    DeviceBuffer scale_b;  // [N] float, per output channel (scaled rows only)
    DeviceBuffer bias;     // [N] fp16 (scaled rows only)
    DeviceBuffer out;      // [M, N] fp16 (scaled rows only)
};

// Which operands an IntGemmSet holds.
enum class IntOperands { kInt8, kPackedInt4 };

// One copy of a floating-point problem's buffers (cuBLAS reference and linear rows).
struct FloatSet {
    DeviceBuffer x;     // [M, K]
    DeviceBuffer w;     // [N, K]
    DeviceBuffer bias;  // [N]
    DeviceBuffer out;   // [M, N]
};

// One copy of the W4A16 problem's buffers (fp16 activations, a packed INT4 weight of one mode in
// the interchange format and prepacked).
struct W4A16Set {
    DeviceBuffer x;                 // [M, K] fp16
    DeviceBuffer w_packed;          // [N, K / 2] packed int4
    DeviceBuffer scales;            // [N, groups] fp16
    DeviceBuffer zeros;             // [N, groups] uint8 (asymmetric only)
    DeviceBuffer w_prepacked;       // ck_w4a16_prepacked_bytes(N, K)
    DeviceBuffer scales_prepacked;  // ck_w4a16_prepacked_groups(N, K, group) fp16
    DeviceBuffer zeros_prepacked;   // as many uint8 (asymmetric only)
    DeviceBuffer out;               // [M, N] fp16
};

// The rows of one (shape, M). Buffers are allocated on the first row the filter keeps.
class Problem {
  public:
    Problem(Context& ctx, Shape shape, int64_t m)
        : ctx_(ctx), bench_(ctx.bench), k_(shape.k), n_(shape.n), m_(m), shape_(shape),
          shape_name_("M=" + std::to_string(m) + " K=" + std::to_string(shape.k) +
                      " N=" + std::to_string(shape.n)) {}

    Summary run_all() {
        Summary summary{shape_, m_};
        summary.int32 = int32_row(CK_LAYOUT_NK);
        summary.fused = scaled_row();
        reference_row();
        if (kn_rows_at(shape_, m_)) int32_row(CK_LAYOUT_KN);
        if (kn_rows_at(shape_, m_) && m_ == kKnTokens[0]) int8_prepack_row();
        for (ck_dtype_t dtype : linear_dtypes_at(shape_, m_, ctx_.quick)) linear_row(dtype);
        if (w4a16_row_at(shape_, m_)) summary.w4a16 = w4a16_row();
        for (ck_int4_mode_t mode : kW4A16PrepackedModes) {
            const Row* row = w4a16_prepacked_row(mode);
            if (mode == CK_INT4_ASYMMETRIC) summary.w4a16_prepacked_asym = row;
            else summary.w4a16_prepacked = row;
        }
        summary.int4 = int4_row();
        if (int4_scaled_row_at(m_, ctx_.quick)) summary.int4_scaled = int4_scaled_row();
        if (gemm_ex_timings_.count(CK_DTYPE_FP16))
            summary.fp16_us = gemm_ex_timings_[CK_DTYPE_FP16].median_us;
        if (int8_timing_) summary.int8_us = int8_timing_->median_us;
        return summary;
    }

  private:
    double mnk() const { return double(m_) * double(n_) * double(k_); }
    double weight_elements() const { return double(n_) * double(k_); }
    double int8_input_bytes() const { return double(m_) * double(k_) + weight_elements(); }
    double int32_call_bytes() const { return int8_input_bytes() + 4.0 * double(m_) * double(n_); }
    double scaled_call_bytes() const {
        return int8_input_bytes() + 2.0 * double(m_) * double(n_) +
               sizeof(float) * double(m_ + n_) + sizeof(__half) * double(n_);
    }
    double float_call_bytes(ck_dtype_t dtype, bool bias) const {
        const double e = double(dtype_size(dtype));
        return e * (double(m_) * double(k_) + weight_elements() + double(m_) * double(n_) +
                    (bias ? double(n_) : 0.0));
    }

    double w4a16_weight_bytes() const {
        const double groups = double((k_ + kW4A16GroupSize - 1) / kW4A16GroupSize);
        return weight_elements() / 2 + sizeof(__half) * double(n_) * groups;
    }
    double w4a16_activation_bytes() const {  // x read + out written, fp16
        return sizeof(__half) * (double(m_) * double(k_) + double(m_) * double(n_));
    }
    double w4a16_call_bytes() const { return w4a16_weight_bytes() + w4a16_activation_bytes(); }
    // Bytes per scale (+ zero point) of a weight in `mode`.
    static double int4_meta_bytes(ck_int4_mode_t mode) {
        return sizeof(__half) + (mode == CK_INT4_ASYMMETRIC ? 1.0 : 0.0);
    }
    double w4a16_interchange_bytes(ck_int4_mode_t mode) const {
        const double groups = double(ck_int4_groups_per_row(k_, kW4A16GroupSize));
        return weight_elements() / 2 + int4_meta_bytes(mode) * double(n_) * groups;
    }
    // The prepacked weight + scales (+ zeros), as the library sizes them (padding included).
    double w4a16_prepacked_weight_bytes(ck_int4_mode_t mode) const {
        return double(ck_w4a16_prepacked_bytes(n_, k_)) +
               int4_meta_bytes(mode) * double(ck_w4a16_prepacked_groups(n_, k_, kW4A16GroupSize));
    }
    double w4a16_prepacked_call_bytes(ck_int4_mode_t mode) const {
        return w4a16_prepacked_weight_bytes(mode) + w4a16_activation_bytes();
    }

    double int4_input_bytes() const { return (double(m_) * double(k_) + weight_elements()) / 2; }
    double int4_call_bytes() const { return int4_input_bytes() + 4.0 * double(m_) * double(n_); }
    double int4_scaled_call_bytes() const {
        return int4_input_bytes() + 2.0 * double(m_) * double(n_) +
               sizeof(float) * double(m_ + n_) + sizeof(__half) * double(n_);
    }

    RowSpec spec_for(const std::string& kernel, ck_dtype_t dtype, double bytes,
                     const char* ops_unit) const {
        return spec_for(kernel, std::string(dtype_name(dtype)), bytes, ops_unit);
    }
    RowSpec spec_for(const std::string& kernel, const std::string& dtype, double bytes,
                     const char* ops_unit) const {
        RowSpec spec = row_spec("gemm", kernel, dtype, shape_name_);
        spec.bytes = bytes;
        spec.flops = 2.0 * mnk();
        spec.ops_unit = ops_unit;
        return spec;
    }

    // For M <= kWeightStreamMaxM: the weight stream's share of the copy bandwidth, ours and the
    // baseline's (the target applies to ours). with_baseline = false leaves the baseline out (where
    // it reads a different weight, e.g. int8 beside int4).
    void weight_stream_note(Row& row, double weight_bytes, bool with_target,
                            bool with_baseline = true) const {
        if (m_ > kWeightStreamMaxM) return;
        const double ours = bench_.percent_of_copy(weight_bytes, row.time.median_us);
        std::string note = "weight stream " + format("%.1f", ours) + "% of copy BW";
        if (with_target)
            note += std::string(" (target >= ") + format("%.0f", kWeightStreamTarget) + "%: " +
                    (ours >= kWeightStreamTarget ? "met" : "MISSED") + ")";
        if (with_baseline && row.has_baseline())
            note += "; baseline " +
                    format("%.1f", bench_.percent_of_copy(weight_bytes, row.baseline_us)) + "%";
        Bench::append_note(row, note);
    }

    // gemm_int8 int32 (layout NK) or its [K, N]-weight variant (layout KN), vs cuBLASLt int8.
    Row* int32_row(ck_layout_t layout) {
        const bool kn = layout == CK_LAYOUT_KN;
        RowSpec spec = spec_for(kn ? "gemm_int8 int32 [K,N] weight" : "gemm_int8 int32",
                                CK_DTYPE_INT8, int32_call_bytes(), "TOPS");
        if (!bench_.wants(spec)) return nullptr;
        allocate_int8();
        spec.copies = int(int8_sets_.size());
        Row* row = bench_.run(spec, [this, layout](int i) { int8_launch(int8_set(i), layout); });
        if (!kn) int8_timing_ = row->time;
        Bench::set_baseline(*row, "cuBLASLt int8", lt_int8_timing());
        if (kn) Bench::append_note(*row, "baseline on the [N,K] weight (cuBLASLt int8 is TN only)");
        weight_stream_note(*row, weight_elements(), /*with_target=*/true);
        return row;
    }

    // ck_int8_prepack of the [K, N] weight (the KN rows' b) into [N, K]: a one-time conversion
    // after which the [N, K] rows' kernels serve it; floor 2 K N bytes at the copy bandwidth.
    void int8_prepack_row() {
        RowSpec spec = row_spec("gemm", "int8_prepack [K,N] -> [N,K]", "int8",
                                "K=" + std::to_string(k_) + " N=" + std::to_string(n_));
        spec.bytes = 2.0 * double(k_) * double(n_);
        if (!bench_.wants(spec)) return;
        allocate_int8();
        spec.copies = int(int8_sets_.size());
        DeviceBuffer b_nk(size_t(k_) * size_t(n_));
        Row* row = bench_.run(spec, [this, &b_nk](int i) {
            CK_BENCH_CHECK(ck_int8_prepack(int8_set(i).b.as<int8_t>(), k_, n_, b_nk.as<int8_t>(),
                                           bench_.stream()));
        });
        Bench::append_note(*row, "one-time; the [N,K] weight then runs the gemm_int8 int32 rows");
    }

    // gemm_int8 scaled to fp16 with per-token x per-channel scales, bias and ReLU, vs cuBLASLt int8
    // followed by the separate epilogue kernel.
    Row* scaled_row() {
        RowSpec spec = spec_for("gemm_int8 scaled fp16 (per-token x per-channel + bias + relu)",
                                CK_DTYPE_INT8, scaled_call_bytes(), "TOPS");
        if (!bench_.wants(spec)) return nullptr;
        allocate_int8();
        spec.copies = int(int8_sets_.size());
        Row* row = bench_.run(spec, [this](int i) { int8_scaled_launch(int8_set(i)); });
        int8_scaled_timing_ = row->time;
        Bench::set_baseline(*row, "cuBLASLt int8 + epilogue", lt_epilogue_timing());
        weight_stream_note(*row, weight_elements(), /*with_target=*/true);
        return row;
    }

    // The unquantized layer on cuBLAS, for the reader: a row of its own, no baseline.
    void reference_row() {
        RowSpec spec = spec_for("cuBLAS fp16 (reference)", CK_DTYPE_FP16,
                                float_call_bytes(CK_DTYPE_FP16, false), "TFLOP/s");
        if (!bench_.wants(spec)) return;
        const std::vector<FloatSet>& sets = float_sets(CK_DTYPE_FP16);
        spec.copies = int(sets.size());
        Row* row = bench_.run(spec, [this, &sets](int i) {
            gemm_ex(CK_DTYPE_FP16, sets[size_t(i) % sets.size()]);
        });
        gemm_ex_timings_[CK_DTYPE_FP16] = row->time;
        weight_stream_note(*row, 2.0 * weight_elements(), /*with_target=*/false);
    }

    // ck_linear with bias and ReLU vs cublasGemmEx of the same dtype (no epilogue).
    void linear_row(ck_dtype_t dtype) {
        RowSpec spec = spec_for(std::string("linear ") + dtype_name(dtype) + " + bias + relu",
                                dtype, float_call_bytes(dtype, true), "TFLOP/s");
        if (!bench_.wants(spec)) return;
        const std::vector<FloatSet>& sets = float_sets(dtype);
        spec.copies = int(sets.size());
        Row* row = bench_.run(spec, [this, dtype, &sets](int i) {
            const FloatSet& s = sets[size_t(i) % sets.size()];
            CK_BENCH_CHECK(ck_linear(s.x.as(), s.w.as(), s.bias.as(), dtype, m_, n_, k_,
                                     CK_ACTIVATION_RELU, s.out.as(), bench_.stream()));
        });
        if (!gemm_ex_timings_.count(dtype)) {
            gemm_ex_timings_[dtype] = bench_.time(
                [this, dtype, &sets](int i) { gemm_ex(dtype, sets[size_t(i) % sets.size()]); });
        }
        Bench::set_baseline(*row, std::string("cuBLAS ") + dtype_name(dtype) + " GEMM",
                            gemm_ex_timings_[dtype]);
    }

    // ck_gemm_w4a16 (fp16, symmetric, groups of kW4A16GroupSize, no bias, no activation) vs
    // cublasGemmEx on the unquantized fp16 [N, K] weight at the same M.
    const Row* w4a16_row() {
        RowSpec spec = spec_for("gemm_w4a16 fp16 g" + std::to_string(kW4A16GroupSize),
                                CK_DTYPE_FP16, w4a16_call_bytes(), "TFLOP/s");
        if (!bench_.wants(spec)) return nullptr;
        const std::vector<W4A16Set>& sets = w4a16_sets(CK_INT4_SYMMETRIC);
        spec.copies = int(sets.size());
        Row* row = bench_.run(spec, [this, &sets](int i) {
            const W4A16Set& s = sets[size_t(i) % sets.size()];
            CK_BENCH_CHECK(ck_gemm_w4a16(s.x.as(), CK_DTYPE_FP16, s.w_packed.as<uint8_t>(),
                                         s.scales.as(), nullptr, kW4A16GroupSize,
                                         CK_INT4_SYMMETRIC, nullptr, CK_ACTIVATION_NONE, m_, n_,
                                         k_, s.out.as(), bench_.stream()));
        });
        Bench::set_baseline(*row, "cuBLAS fp16", fp16_timing());
        kernel_override_note(*row, "CK_GEMM_W4A16_KERNEL");
        if (m_ > kWeightStreamMaxM) {
            Bench::append_note(*row, "reference kernel (small_m serves M <= " +
                                         std::to_string(kWeightStreamMaxM) + ")");
            return row;
        }
        weight_stream_note(*row, w4a16_weight_bytes(), /*with_target=*/true);
        Bench::append_note(*row, speedup_vs_fp16_note(row->ratio()));
        return row;
    }

    // "speedup vs cuBLAS fp16 1.83x", with the DESIGN.md target where it applies.
    std::string speedup_vs_fp16_note(double speedup) const {
        std::string note = "speedup vs cuBLAS fp16 " + format("%.2f", speedup) + "x";
        if (shape_ == kW4A16SpeedupShape && m_ <= kWeightStreamMaxM)
            note += std::string(" (target >= ") + format("%.1f", kW4A16SpeedupTarget) + "x: " +
                    (speedup >= kW4A16SpeedupTarget ? "met" : "MISSED") + ")";
        return note;
    }

    // ck_gemm_w4a16_prepacked (fp16, groups of kW4A16GroupSize, no bias, no activation, the auto
    // variant) on a weight prepacked once, vs the unfused pipeline a user runs without it:
    // ck_dequantize_int4 of the interchange weight into an fp16 [N, K] buffer, then cublasGemmEx,
    // timed together. The note adds the speedup over cuBLAS fp16 alone (the reference row).
    const Row* w4a16_prepacked_row(ck_int4_mode_t mode) {
        const bool asym = mode == CK_INT4_ASYMMETRIC;
        RowSpec spec = spec_for(std::string("gemm_w4a16_prepacked fp16 ") + int4_mode_word(mode) +
                                    "g" + std::to_string(kW4A16GroupSize),
                                CK_DTYPE_FP16, w4a16_prepacked_call_bytes(mode), "TFLOP/s");
        if (!bench_.wants(spec)) return nullptr;
        const std::vector<W4A16Set>& sets = w4a16_sets(mode);
        spec.copies = int(sets.size());
        Row* row = bench_.run(spec, [this, mode, asym, &sets](int i) {
            const W4A16Set& s = sets[size_t(i) % sets.size()];
            CK_BENCH_CHECK(ck_gemm_w4a16_prepacked(
                s.x.as(), CK_DTYPE_FP16, s.w_prepacked.as<uint8_t>(), s.scales_prepacked.as(),
                asym ? s.zeros_prepacked.as<uint8_t>() : nullptr, kW4A16GroupSize, mode, nullptr,
                CK_ACTIVATION_NONE, m_, n_, k_, s.out.as(), bench_.stream()));
        });
        const Timing unfused = bench_.time([this, mode, asym, &sets](int i) {
            const W4A16Set& s = sets[size_t(i) % sets.size()];
            CK_BENCH_CHECK(ck_dequantize_int4(s.w_packed.as<uint8_t>(), s.scales.as(),
                                              asym ? s.zeros.as<uint8_t>() : nullptr, n_, k_,
                                              kW4A16GroupSize, mode, w4a16_dense_.as(),
                                              CK_DTYPE_FP16, bench_.stream()));
            gemm_ex(CK_DTYPE_FP16, s.x.as(), w4a16_dense_.as(), s.out.as());
        });
        const std::string pipeline =
            std::string("dequantize_int4 ") + int4_mode_word(mode) + "+ cuBLAS fp16";
        Bench::set_baseline(*row, pipeline, unfused);
        kernel_override_note(*row, "CK_GEMM_W4A16_KERNEL");
        weight_stream_note(*row, w4a16_prepacked_weight_bytes(mode), /*with_target=*/true,
                           /*with_baseline=*/false);
        Bench::append_note(*row, speedup_vs_fp16_note(fp16_timing().median_us /
                                                      row->time.median_us));
        return row;
    }

    // ck_gemm_int4 (packed int4 x packed int4 -> int32) vs cuBLASLt int8 -> int32 on int8 operands
    // of the same M, N, K (the gemm_int8 int32 row's baseline, timed once per problem); the note
    // compares with ck_gemm_int8 on those int8 operands.
    const Row* int4_row() {
        RowSpec spec = spec_for("gemm_int4 int32", "int4", int4_call_bytes(), "TOPS");
        if (!bench_.wants(spec)) return nullptr;
        allocate_int4();
        spec.copies = int(int4_sets_.size());
        Row* row = bench_.run(spec, [this](int i) {
            const IntGemmSet& s = int4_set(i);
            CK_BENCH_CHECK(ck_gemm_int4(s.a.as<uint8_t>(), s.b.as<uint8_t>(), m_, n_, k_,
                                        s.c.as<int32_t>(), bench_.stream()));
        });
        Bench::set_baseline(*row, "cuBLASLt int8", lt_int8_timing());
        kernel_override_note(*row, "CK_GEMM_INT4_KERNEL");
        Bench::append_note(*row, "vs gemm_int8 int32 " +
                                     format("%.2f", int8_timing().median_us / row->time.median_us) +
                                     "x");
        weight_stream_note(*row, weight_elements() / 2, /*with_target=*/true,
                           /*with_baseline=*/false);
        return row;
    }

    // ck_gemm_int4_scaled with the gemm_int8 scaled row's epilogue (per-token x per-channel scales,
    // bias, ReLU, fp16 out) vs cuBLASLt int8 + the separate epilogue kernel (that row's baseline).
    const Row* int4_scaled_row() {
        RowSpec spec = spec_for("gemm_int4 scaled fp16 (per-token x per-channel + bias + relu)",
                                "int4", int4_scaled_call_bytes(), "TOPS");
        if (!bench_.wants(spec)) return nullptr;
        allocate_int4();
        spec.copies = int(int4_sets_.size());
        Row* row = bench_.run(spec, [this](int i) {
            const IntGemmSet& s = int4_set(i);
            CK_BENCH_CHECK(ck_gemm_int4_scaled(
                s.a.as<uint8_t>(), s.b.as<uint8_t>(), m_, n_, k_, s.scale_a.as<float>(),
                CK_PER_ROW, s.scale_b.as<float>(), CK_PER_ROW, s.bias.as(), CK_ACTIVATION_RELU,
                s.out.as(), CK_DTYPE_FP16, bench_.stream()));
        });
        Bench::set_baseline(*row, "cuBLASLt int8 + epilogue", lt_epilogue_timing());
        kernel_override_note(*row, "CK_GEMM_INT4_KERNEL");
        Bench::append_note(*row, "vs gemm_int8 scaled fp16 " +
                                     format("%.2f", int8_scaled_timing().median_us /
                                                        row->time.median_us) +
                                     "x");
        weight_stream_note(*row, weight_elements() / 2, /*with_target=*/true,
                           /*with_baseline=*/false);
        return row;
    }

    // out = x w^T through cublasGemmEx, TN (see LtTnGemm for the row-major trick), fp32
    // accumulation; the bench's handle keeps the default math mode, so fp32 stays fp32 (no TF32).
    void gemm_ex(ck_dtype_t dtype, const void* x, const void* w, void* out) {
        const float alpha = 1.f, beta = 0.f;
        const cudaDataType_t t = cuda_type(dtype);
        CK_BENCH_CHECK(cublasGemmEx(bench_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, int(n_), int(m_),
                                    int(k_), &alpha, w, t, int(k_), x, t, int(k_), &beta, out, t,
                                    int(n_), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    void gemm_ex(ck_dtype_t dtype, const FloatSet& s) {
        gemm_ex(dtype, s.x.as(), s.w.as(), s.out.as());
    }

    // cublasGemmEx fp16: the reference row's timing, or timed here when the filter skipped it.
    Timing fp16_timing() {
        if (!gemm_ex_timings_.count(CK_DTYPE_FP16)) {
            const std::vector<FloatSet>& sets = float_sets(CK_DTYPE_FP16);
            gemm_ex_timings_[CK_DTYPE_FP16] = bench_.time(
                [this, &sets](int i) { gemm_ex(CK_DTYPE_FP16, sets[size_t(i) % sets.size()]); });
        }
        return gemm_ex_timings_[CK_DTYPE_FP16];
    }

    void int8_launch(const IntGemmSet& s, ck_layout_t layout) const {
        CK_BENCH_CHECK(ck_gemm_int8(s.a.as<int8_t>(), s.b.as<int8_t>(), layout, m_, n_, k_,
                                    s.c.as<int32_t>(), bench_.stream()));
    }

    void int8_scaled_launch(const IntGemmSet& s) const {
        CK_BENCH_CHECK(ck_gemm_int8_scaled(
            s.a.as<int8_t>(), s.b.as<int8_t>(), CK_LAYOUT_NK, m_, n_, k_, s.scale_a.as<float>(),
            CK_PER_ROW, s.scale_b.as<float>(), CK_PER_ROW, s.bias.as(), CK_ACTIVATION_RELU,
            s.out.as(), CK_DTYPE_FP16, bench_.stream()));
    }

    // ck_gemm_int8 ([N, K] weight) and ck_gemm_int8_scaled: their rows' timings, or timed here
    // when the filter skipped those rows.
    Timing int8_timing() {
        if (!int8_timing_) {
            allocate_int8();
            int8_timing_ = bench_.time([this](int i) { int8_launch(int8_set(i), CK_LAYOUT_NK); });
        }
        return *int8_timing_;
    }

    Timing int8_scaled_timing() {
        if (!int8_scaled_timing_) {
            allocate_int8();
            int8_scaled_timing_ = bench_.time([this](int i) { int8_scaled_launch(int8_set(i)); });
        }
        return *int8_scaled_timing_;
    }

    // cuBLASLt int8 followed by the separate epilogue kernel, timed once per problem.
    Timing lt_epilogue_timing() {
        if (lt_epilogue_timing_) return *lt_epilogue_timing_;
        pick_lt_algo();
        lt_epilogue_timing_ = bench_.time([this](int i) {
            const IntGemmSet& s = int8_set(i);
            lt_int8_launch(s);
            scale_bias_relu_fp16(s.c.as<int32_t>(), s.scale_a.as<float>(), s.scale_b.as<float>(),
                                 s.bias.as<__half>(), s.out.as<__half>(), m_, n_, bench_.stream());
        });
        return *lt_epilogue_timing_;
    }

    // The cuBLASLt int8 baseline: its fastest of kHeuristicCandidates algorithms (each timed
    // briefly on these buffers), then timed once in full and reused by every row that needs it.
    void lt_int8_launch(const IntGemmSet& s) const {
        lt_->launch(lt_algo_, s.a.as<int8_t>(), s.b.as<int8_t>(), s.c.as<int32_t>(),
                    ctx_.workspace.as(), ctx_.workspace.bytes(), bench_.stream());
    }

    Timing lt_int8_timing() {
        if (lt_timing_) return *lt_timing_;
        pick_lt_algo();
        lt_timing_ = bench_.time([this](int i) { lt_int8_launch(int8_set(i)); });
        return *lt_timing_;
    }

    // Picks lt_algo_ once per problem (needs the INT8 buffers).
    void pick_lt_algo() {
        if (lt_) return;
        allocate_int8();
        lt_ = std::make_unique<LtTnGemm>(ctx_.lt, m_, n_, k_, LtTnGemm::kInt8);
        lt_algo_ = fastest_lt_algo(
            bench_, lt_->candidates(kLtWorkspaceBytes, kHeuristicCandidates),
            [this](const cublasLtMatmulAlgo_t& algo, int i) {
                const IntGemmSet& s = int8_set(i);
                lt_->launch(algo, s.a.as<int8_t>(), s.b.as<int8_t>(), s.c.as<int32_t>(),
                            ctx_.workspace.as(), ctx_.workspace.bytes(), bench_.stream());
            });
    }

    const IntGemmSet& int8_set(int iteration) const {
        return int8_sets_[size_t(iteration) % int8_sets_.size()];
    }

    const IntGemmSet& int4_set(int iteration) const {
        return int4_sets_[size_t(iteration) % int4_sets_.size()];
    }

    void allocate_int8() { allocate_int_sets(int8_sets_, IntOperands::kInt8, /*first_seed=*/5000); }
    void allocate_int4() {
        allocate_int_sets(int4_sets_, IntOperands::kPackedInt4, /*first_seed=*/17000);
    }

    // Rotation copies of an integer GEMM problem, allocated on first use and sized by its
    // smallest call (the fused one: fp16 out). INT8 operands are codes in [-kInt8Max, kInt8Max];
    // any byte is a valid pair of int4 codes, so packed INT4 operands are random bytes.
    void allocate_int_sets(std::vector<IntGemmSet>& sets, IntOperands operands,
                           uint64_t first_seed) {
        if (!sets.empty()) return;
        const bool int4 = operands == IntOperands::kPackedInt4;
        const auto operand_bytes = [&](int64_t rows) {
            return size_t(int4 ? rows * k_ / 2 : rows * k_);
        };
        const double mn = double(m_) * double(n_);
        const double per_copy =
            (int4 ? int4_input_bytes() : int8_input_bytes()) + 6.0 * mn + 8.0 * double(m_ + n_);
        const int copies = bench_.rotation_copies(
            int4 ? int4_scaled_call_bytes() : scaled_call_bytes(), per_copy);
        cudaStream_t st = bench_.stream();
        const auto fill_operand = [&](DeviceBuffer& buf, uint64_t seed) {
            if (int4)
                fill_random_bytes(buf.as(), int64_t(buf.bytes()), seed, st);
            else
                fill_uniform(buf.as(), CK_DTYPE_INT8, int64_t(buf.bytes()), seed, -kInt8Max,
                             kInt8Max, st);
        };
        for (int c = 0; c < copies; ++c) {
            const uint64_t seed = first_seed + 100 * uint64_t(c);
            IntGemmSet s;
            s.a = DeviceBuffer(operand_bytes(m_));
            s.b = DeviceBuffer(operand_bytes(n_));
            s.c = DeviceBuffer(sizeof(int32_t) * size_t(m_ * n_));
            s.scale_a = DeviceBuffer(sizeof(float) * size_t(m_));
            s.scale_b = DeviceBuffer(sizeof(float) * size_t(n_));
            s.bias = DeviceBuffer(sizeof(__half) * size_t(n_));
            s.out = DeviceBuffer(sizeof(__half) * size_t(m_ * n_));
            fill_operand(s.a, seed + 1);
            fill_operand(s.b, seed + 2);
            fill_uniform(s.scale_a.as(), CK_DTYPE_FP32, m_, seed + 3, kScaleMin, kScaleMax, st);
            fill_uniform(s.scale_b.as(), CK_DTYPE_FP32, n_, seed + 4, kScaleMin, kScaleMax, st);
            fill_uniform(s.bias.as(), CK_DTYPE_FP16, n_, seed + 5, -kFloatAbsMax, kFloatAbsMax, st);
            fill_random_bytes(s.c.as(), int64_t(s.c.bytes()), seed + 6, st);
            fill_random_bytes(s.out.as(), int64_t(s.out.bytes()), seed + 7, st);
            sets.push_back(std::move(s));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
    }

    // Rotation copies of the W4A16 problem in `mode`, allocated on first use. Each weight is the
    // library's own format: ck_quantize_int4 of a random fp16 [N, K] weight (w4a16_dense_, refilled
    // per copy), then ck_w4a16_prepack of it. Sized by the smaller of the plain and prepacked
    // calls.
    const std::vector<W4A16Set>& w4a16_sets(ck_int4_mode_t mode) {
        std::vector<W4A16Set>& sets = w4a16_sets_[mode];
        if (!sets.empty()) return sets;
        const bool asym = mode == CK_INT4_ASYMMETRIC;
        const int64_t groups = ck_int4_groups_per_row(k_, kW4A16GroupSize);
        const int64_t prepacked_groups = ck_w4a16_prepacked_groups(n_, k_, kW4A16GroupSize);
        const int64_t prepacked_bytes = ck_w4a16_prepacked_bytes(n_, k_);
        if (groups <= 0 || prepacked_groups <= 0 || prepacked_bytes <= 0) {
            std::fprintf(stderr, "gemm: no W4A16 layout for N=%lld K=%lld\n", (long long)n_,
                         (long long)k_);
            std::exit(kExitFailure);
        }
        const double smallest_call =
            std::min(w4a16_call_bytes(), w4a16_prepacked_call_bytes(mode));
        const double per_copy = w4a16_interchange_bytes(mode) +
                                w4a16_prepacked_weight_bytes(mode) + w4a16_activation_bytes();
        if (w4a16_dense_.bytes() == 0)
            w4a16_dense_ = DeviceBuffer(sizeof(__half) * size_t(n_ * k_));
        const int copies = bench_.rotation_copies(smallest_call, per_copy);
        cudaStream_t st = bench_.stream();
        for (int c = 0; c < copies; ++c) {
            const uint64_t seed = 13000 + 10000 * uint64_t(mode) + 100 * uint64_t(c);
            W4A16Set s;
            s.x = DeviceBuffer(sizeof(__half) * size_t(m_ * k_));
            s.w_packed = DeviceBuffer(size_t(n_ * k_ / 2));
            s.scales = DeviceBuffer(sizeof(__half) * size_t(n_ * groups));
            s.w_prepacked = DeviceBuffer(size_t(prepacked_bytes));
            s.scales_prepacked = DeviceBuffer(sizeof(__half) * size_t(prepacked_groups));
            if (asym) {
                s.zeros = DeviceBuffer(size_t(n_ * groups));
                s.zeros_prepacked = DeviceBuffer(size_t(prepacked_groups));
            }
            s.out = DeviceBuffer(sizeof(__half) * size_t(m_ * n_));
            fill_uniform(s.x.as(), CK_DTYPE_FP16, m_ * k_, seed + 1, -kFloatAbsMax, kFloatAbsMax,
                         st);
            fill_uniform(w4a16_dense_.as(), CK_DTYPE_FP16, n_ * k_, seed + 2, -kFloatAbsMax,
                         kFloatAbsMax, st);
            CK_BENCH_CHECK(ck_quantize_int4(w4a16_dense_.as(), CK_DTYPE_FP16, n_, k_,
                                            kW4A16GroupSize, mode, s.w_packed.as<uint8_t>(),
                                            s.scales.as(), asym ? s.zeros.as<uint8_t>() : nullptr,
                                            st));
            CK_BENCH_CHECK(ck_w4a16_prepack(
                s.w_packed.as<uint8_t>(), s.scales.as(), asym ? s.zeros.as<uint8_t>() : nullptr,
                CK_DTYPE_FP16, n_, k_, kW4A16GroupSize, mode, s.w_prepacked.as<uint8_t>(),
                s.scales_prepacked.as(), asym ? s.zeros_prepacked.as<uint8_t>() : nullptr, st));
            fill_random_bytes(s.out.as(), int64_t(s.out.bytes()), seed + 3, st);
            sets.push_back(std::move(s));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
        return sets;
    }

    // The rotation copies of a floating-point problem in `dtype`, allocated on first use.
    const std::vector<FloatSet>& float_sets(ck_dtype_t dtype) {
        std::vector<FloatSet>& sets = float_sets_[dtype];
        if (!sets.empty()) return sets;
        const size_t e = dtype_size(dtype);
        const double per_copy = float_call_bytes(dtype, true);
        const int copies = bench_.rotation_copies(float_call_bytes(dtype, false), per_copy);
        cudaStream_t st = bench_.stream();
        for (int c = 0; c < copies; ++c) {
            const uint64_t seed = 9000 + 100 * uint64_t(c) + 10 * uint64_t(dtype);
            FloatSet s;
            s.x = DeviceBuffer(e * size_t(m_ * k_));
            s.w = DeviceBuffer(e * size_t(n_ * k_));
            s.bias = DeviceBuffer(e * size_t(n_));
            s.out = DeviceBuffer(e * size_t(m_ * n_));
            fill_uniform(s.x.as(), dtype, m_ * k_, seed + 1, -kFloatAbsMax, kFloatAbsMax, st);
            fill_uniform(s.w.as(), dtype, n_ * k_, seed + 2, -kFloatAbsMax, kFloatAbsMax, st);
            fill_uniform(s.bias.as(), dtype, n_, seed + 3, -kFloatAbsMax, kFloatAbsMax, st);
            fill_uniform(s.out.as(), dtype, m_ * n_, seed + 4, -kFloatAbsMax, kFloatAbsMax, st);
            sets.push_back(std::move(s));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
        return sets;
    }

    Context& ctx_;
    Bench& bench_;
    int64_t k_, n_, m_;
    Shape shape_;
    std::string shape_name_;
    std::vector<IntGemmSet> int8_sets_;
    std::map<ck_dtype_t, std::vector<FloatSet>> float_sets_;
    std::map<ck_int4_mode_t, std::vector<W4A16Set>> w4a16_sets_;
    // [N, K] fp16: the source of each W4A16 copy's weight, then the unfused pipeline's dequantized
    // weight (one buffer, allocated outside timing).
    DeviceBuffer w4a16_dense_;
    std::vector<IntGemmSet> int4_sets_;
    std::map<ck_dtype_t, Timing> gemm_ex_timings_;  // cublasGemmEx per dtype, timed once
    std::optional<Timing> int8_timing_;             // ck_gemm_int8, [N, K] weight
    std::optional<Timing> int8_scaled_timing_;      // ck_gemm_int8_scaled
    std::unique_ptr<LtTnGemm> lt_;
    cublasLtMatmulAlgo_t lt_algo_{};
    std::optional<Timing> lt_timing_;           // cuBLASLt int8
    std::optional<Timing> lt_epilogue_timing_;  // cuBLASLt int8 + the separate epilogue kernel
};

// Ours against the unfused baselines per (shape, M), and the weight stream for small M.
inline ExtraTable int8_summary_table(const std::vector<Summary>& summaries,
                                     const Bench& bench) {
    ExtraTable t;
    t.family = "gemm";
    t.title = "INT8 GEMM vs cuBLASLt (speedup = cuBLASLt time / ours; weight stream for M <= " +
              std::to_string(kWeightStreamMaxM) + ": N*K bytes / time, target >= " +
              format("%.0f", kWeightStreamTarget) + "% of copy BW)";
    t.headers = {"K x N", "M", "int32 us", "cuBLASLt us", "int32 speedup", "fused us",
                 "cuBLASLt+epilogue us", "fused speedup", "int32 weight % copy",
                 "fused weight % copy", "target"};
    auto us = [](const Row* r) { return r ? format("%.1f", r->time.median_us) : ""; };
    auto base_us = [](const Row* r) {
        return r && r->has_baseline() ? format("%.1f", r->baseline_us) : "";
    };
    auto speedup = [](const Row* r) {
        return r && r->has_baseline() ? format("%.2fx", r->ratio()) : "";
    };
    for (const Summary& s : summaries) {
        if (!s.int32 && !s.fused) continue;
        const double weight_bytes = double(s.shape.n) * double(s.shape.k);
        const bool small = s.m <= kWeightStreamMaxM;
        auto stream_pct = [&](const Row* r) {
            return bench.percent_of_copy(weight_bytes, r->time.median_us);
        };
        std::string int32_pct, fused_pct, verdict;
        if (small) {
            bool met = true;
            if (s.int32) {
                int32_pct = format("%.1f", stream_pct(s.int32));
                met = met && stream_pct(s.int32) >= kWeightStreamTarget;
            }
            if (s.fused) {
                fused_pct = format("%.1f", stream_pct(s.fused));
                met = met && stream_pct(s.fused) >= kWeightStreamTarget;
            }
            verdict = met ? "met" : "MISSED";
        }
        t.cells.push_back({shape_string(s.shape.k, s.shape.n), std::to_string(s.m), us(s.int32),
                           base_us(s.int32), speedup(s.int32), us(s.fused), base_us(s.fused),
                           speedup(s.fused), int32_pct, fused_pct, verdict});
    }
    return t;
}

inline std::string us_cell(const Row* r) { return r ? format("%.1f", r->time.median_us) : ""; }
inline std::string us_cell(double us) { return us > 0 ? format("%.1f", us) : ""; }
inline std::string baseline_us_cell(const Row* r) {
    return r && r->has_baseline() ? format("%.1f", r->baseline_us) : "";
}
inline std::string speedup_cell(const Row* r) {
    return r && r->has_baseline() ? format("%.2fx", r->ratio()) : "";
}
// reference_us / our time, e.g. cuBLAS fp16 over ours.
inline std::string speedup_cell(const Row* r, double reference_us) {
    return r && reference_us > 0 ? format("%.2fx", reference_us / r->time.median_us) : "";
}

// The prepacked W4A16 rows per (shape, M) beside cuBLAS fp16 and the unfused pipeline.
inline ExtraTable w4a16_summary_table(const std::vector<Summary>& summaries, const Bench& bench) {
    ExtraTable t;
    t.family = "gemm";
    t.title = "W4A16 prepacked (fp16, g" + std::to_string(kW4A16GroupSize) +
              ") vs cuBLAS fp16 and dequantize_int4 + cuBLAS fp16 (speedup = their time / ours; "
              "% copy: prepacked weight + scales (+ zeros) + x + out over the copy bandwidth)";
    t.headers = {"K x N", "M", "prepacked us", "% copy", "cuBLAS fp16 us", "vs cuBLAS fp16",
                 "dequant + cuBLAS us", "vs dequant + cuBLAS", "asym us", "asym % copy",
                 "asym vs dequant + cuBLAS", "gemm_w4a16 us"};
    auto pct = [&](const Row* r) {
        return r ? format("%.1f", bench.percent_of_copy(r->bytes, r->time.median_us)) : "";
    };
    for (const Summary& s : summaries) {
        const Row* sym = s.w4a16_prepacked;
        const Row* asym = s.w4a16_prepacked_asym;
        if (!sym && !asym) continue;
        t.cells.push_back({shape_string(s.shape.k, s.shape.n), std::to_string(s.m), us_cell(sym),
                           pct(sym), us_cell(s.fp16_us), speedup_cell(sym, s.fp16_us),
                           baseline_us_cell(sym), speedup_cell(sym), us_cell(asym), pct(asym),
                           speedup_cell(asym), us_cell(s.w4a16)});
    }
    return t;
}

// The INT4 x INT4 rows per (shape, M) beside cuBLASLt int8 and ck_gemm_int8.
inline ExtraTable int4_summary_table(const std::vector<Summary>& summaries) {
    ExtraTable t;
    t.family = "gemm";
    t.title = "INT4 x INT4 GEMM vs cuBLASLt int8 and gemm_int8 (int32 out; speedup = their time / "
              "ours)";
    t.headers = {"K x N", "M", "int4 us", "int4 TOPS", "cuBLASLt int8 us", "vs cuBLASLt int8",
                 "gemm_int8 us", "vs gemm_int8", "int4 scaled us", "vs cuBLASLt int8 + epilogue"};
    for (const Summary& s : summaries) {
        if (!s.int4 && !s.int4_scaled) continue;
        t.cells.push_back({shape_string(s.shape.k, s.shape.n), std::to_string(s.m), us_cell(s.int4),
                           s.int4 ? format("%.1f", s.int4->tera_ops()) : "",
                           baseline_us_cell(s.int4), speedup_cell(s.int4), us_cell(s.int8_us),
                           speedup_cell(s.int4, s.int8_us), us_cell(s.int4_scaled),
                           speedup_cell(s.int4_scaled)});
    }
    return t;
}

}  // namespace gemm_bench

inline void bench_gemm(Bench& bench, const Options& options) {
    using namespace gemm_bench;
    Context ctx(bench, options.quick);
    std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
    std::vector<int64_t> tokens(std::begin(kTokens), std::end(kTokens));
    if (options.quick) {
        shapes = {kQuickShape};
        tokens.assign(std::begin(kQuickTokens), std::end(kQuickTokens));
    }
    std::vector<Summary> summaries;
    for (const Shape& shape : shapes) {
        for (int64_t m : tokens) summaries.push_back(Problem(ctx, shape, m).run_all());
    }
    for (ExtraTable table : {int8_summary_table(summaries, bench),
                             w4a16_summary_table(summaries, bench),
                             int4_summary_table(summaries)}) {
        if (!table.cells.empty()) bench.add_table(std::move(table));
    }
}
