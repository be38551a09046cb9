// benchmarks/bench_fp8.cuh - family "fp8": the FP8 W8A8 GEMM (ck_gemm_fp8_scaled) beside
// cuBLASLt FP8, the library's INT8 GEMM and cuBLAS fp16, on the same run.
//
// Problems: DESIGN.md's four layer shapes (K, N) at M = 1 ... 4096 (--quick: one shape, three M).
// Operands: random E4M3 bytes with the top exponent bit cleared (|x| <= 1.875, no NaN). Rows of
// each (shape, M), fp16 out, no bias:
//   gemm_fp8 scaled fp16 (per-tensor)   one scale per operand, as cuBLASLt's call below;
//                                       baseline "cuBLASLt FP8 (per-tensor)": cublasLtMatmul
//                                       E4M3 x E4M3 -> fp16, TN, device scale pointers for A and
//                                       B, float32 compute without fast accumulation (its
//                                       default: sums promoted to float32, as the library
//                                       does), a 32 MB workspace, the fastest of cuBLASLt's
//                                       top heuristics (timed)
//   gemm_fp8 scaled fp16 (per-token x per-channel)
//                                       the same with M + N scales; baseline the same cuBLASLt
//                                       timing; notes: ck_gemm_int8_scaled on int8 operands of
//                                       the same sizes and epilogue (the ratio INT8 / FP8), and
//                                       cuBLAS fp16 (cublasGemmEx TN) on the layer unquantized
//   gemm_fp8 block-scaled fp16 (1x128 x 128x128)
//                                       DeepSeek-V3's block scales, applied to each 128-wide
//                                       k-block's sums in the main loop; baseline the same
//                                       cuBLASLt timing (per-tensor: the library's binary has no
//                                       block-scaled cuBLASLt call on Hopper)
//   gemm_w4a8 fp16 (g128, per-token)   W4A8 (ck_gemm_w4a8): the weight as packed symmetric INT4
//                                       (random codes) with fp16 scales per 128 k, a per-token
//                                       scale_a; baseline the same cuBLASLt timing; notes: the
//                                       per-token W8A8 row above (the ratio W4A8 / W8A8) and
//                                       ck_gemm_w4a16_prepacked (g128 symmetric, fp16 x) on the
//                                       same codes and scales
// Floors: bytes = M K + N K + 2 M N (+ the scales; W4A8: N K / 2 + the group scales); flops =
// 2 M N K, against the dense FP8 tensor-core peak (the INT8 one) at large M.
#pragma once

#include "bench_gemm.cuh"

namespace fp8_bench {

using gemm_bench::Shape;

constexpr Shape kShapes[] = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 28672}};
constexpr int64_t kTokens[] = {1, 16, 64, 256, 1024, 4096};
constexpr Shape kQuickShape = {4096, 4096};
constexpr int64_t kQuickTokens[] = {1, 16, 256};

// Random bytes -> E4M3 codes without the top exponent bit: exponents 0 ... 7 (|x| < 2), never
// the all-ones exponent of NaN.
__global__ void clear_top_exponent_bit(uint8_t* bytes, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        bytes[i] &= 0xBF;
}

inline void fill_e4m3(DeviceBuffer& buf, uint64_t seed, cudaStream_t st) {
    fill_random_bytes(buf.as(), int64_t(buf.bytes()), seed, st);
    clear_top_exponent_bit<<<264, 256, 0, st>>>(buf.as<uint8_t>(), int64_t(buf.bytes()));
    CK_BENCH_CHECK(cudaGetLastError());
}

struct Set {
    DeviceBuffer a, b;            // [M, K], [N, K] E4M3 (read as int8 by the INT8 row)
    DeviceBuffer scale_a, scale_b;  // [M], [N] float32 (their first value: the per-tensor ones)
    DeviceBuffer block_a, block_b;  // [M, K / 128], [N / 128, K / 128] float32 block scales
    DeviceBuffer out;             // [M, N] fp16
    DeviceBuffer x16, w16;        // [M, K], [N, K] fp16 (cuBLAS fp16)
    // W4A8 / W4A16: packed INT4 [N, K / 2], fp16 scales [N, K / 128], and their prepacked copy.
    DeviceBuffer w4, w4_scales, w4_prepacked, w4_prepacked_scales;
};

class Problem {
  public:
    Problem(gemm_bench::Context& ctx, Shape shape, int64_t m)
        : ctx_(ctx), bench_(ctx.bench), k_(shape.k), n_(shape.n), m_(m),
          shape_name_("M=" + std::to_string(m) + " K=" + std::to_string(shape.k) +
                      " N=" + std::to_string(shape.n)) {}

    void run_all() {
        const RowSpec tensor = spec("gemm_fp8 scaled fp16 (per-tensor)");
        const RowSpec rows = spec("gemm_fp8 scaled fp16 (per-token x per-channel)");
        const RowSpec blocks = spec("gemm_fp8 block-scaled fp16 (1x128 x 128x128)");
        const RowSpec w4a8 = w4a8_spec();
        if (!bench_.wants(tensor) && !bench_.wants(rows) && !bench_.wants(blocks) &&
            !bench_.wants(w4a8))
            return;
        const Timing lt = lt_timing();
        if (Row* row = bench_.run(with_copies(tensor), [this](int i) { launch(set(i), false); }))
            Bench::set_baseline(*row, "cuBLASLt FP8 (per-tensor)", lt);
        double w8a8_us = 0;  // the per-token row's time, for the W4A8 row's note
        if (Row* row = bench_.run(with_copies(rows), [this](int i) { launch(set(i), true); })) {
            Bench::set_baseline(*row, "cuBLASLt FP8 (per-tensor)", lt);
            w8a8_us = row->time.median_us;
            const Timing int8 = bench_.time([this](int i) {
                const Set& s = set(i);
                CK_BENCH_CHECK(ck_gemm_int8_scaled(
                    s.a.as<int8_t>(), s.b.as<int8_t>(), CK_LAYOUT_NK, m_, n_, k_,
                    s.scale_a.as<float>(), CK_PER_ROW, s.scale_b.as<float>(), CK_PER_ROW,
                    nullptr, CK_ACTIVATION_NONE, s.out.as(), CK_DTYPE_FP16, bench_.stream()));
            });
            const Timing fp16 = bench_.time([this](int i) {
                const Set& s = set(i);
                gemm_bench::cublas_fp16_linear(bench_, s.w16.as(), s.x16.as(), s.out.as(), m_, n_,
                                               k_);
            });
            Bench::append_note(*row, "gemm_int8 scaled " + format("%.1f", int8.median_us) +
                                         " us (" + format("%.2f", int8.median_us /
                                                                      row->time.median_us) +
                                         "x); cuBLAS fp16 " + format("%.1f", fp16.median_us) +
                                         " us");
        }
        if (Row* row = bench_.run(with_copies(blocks), [this](int i) {
                const Set& s = set(i);
                CK_BENCH_CHECK(ck_gemm_fp8_scaled(
                    s.a.as<uint8_t>(), s.b.as<uint8_t>(), m_, n_, k_, s.block_a.as<float>(),
                    CK_PER_BLOCK_1X128, s.block_b.as<float>(), CK_PER_BLOCK_128X128, nullptr,
                    CK_ACTIVATION_NONE, s.out.as(), CK_DTYPE_FP16, bench_.stream()));
            }))
            Bench::set_baseline(*row, "cuBLASLt FP8 (per-tensor)", lt);
        if (Row* row = bench_.run(with_copies(w4a8), [this](int i) {
                const Set& s = set(i);
                CK_BENCH_CHECK(ck_gemm_w4a8(s.a.as<uint8_t>(), s.scale_a.as<float>(), CK_PER_ROW,
                                            s.w4.as<uint8_t>(), s.w4_scales.as(), CK_DTYPE_FP16,
                                            128, nullptr, CK_ACTIVATION_NONE, m_, n_, k_,
                                            s.out.as(), CK_DTYPE_FP16, bench_.stream()));
            })) {
            Bench::set_baseline(*row, "cuBLASLt FP8 (per-tensor)", lt);
            const Timing w4a16 = bench_.time([this](int i) {
                const Set& s = set(i);
                CK_BENCH_CHECK(ck_gemm_w4a16_prepacked(
                    s.x16.as(), CK_DTYPE_FP16, s.w4_prepacked.as<uint8_t>(),
                    s.w4_prepacked_scales.as(), nullptr, 128, CK_INT4_SYMMETRIC, nullptr,
                    CK_ACTIVATION_NONE, m_, n_, k_, s.out.as(), bench_.stream()));
            });
            std::string note;
            if (w8a8_us > 0)
                note = "W8A8 FP8 (per-token) " + format("%.1f", w8a8_us) + " us (W4A8 " +
                       format("%.2f", w8a8_us / row->time.median_us) + "x); ";
            Bench::append_note(*row, note + "W4A16 prepacked " +
                                         format("%.1f", w4a16.median_us) + " us (W4A8 " +
                                         format("%.2f", w4a16.median_us / row->time.median_us) +
                                         "x)");
        }
    }

  private:
    RowSpec spec(const std::string& kernel) const {
        RowSpec s = row_spec("fp8", kernel, "e4m3", shape_name_);
        s.bytes = double(m_) * double(k_) + double(n_) * double(k_) +
                  2.0 * double(m_) * double(n_) + 4.0 * double(m_ + n_);
        s.flops = 2.0 * double(m_) * double(n_) * double(k_);
        return s;
    }
    RowSpec w4a8_spec() const {
        RowSpec s = row_spec("fp8", "gemm_w4a8 fp16 (g128, per-token)", "int4 x e4m3",
                             shape_name_);
        s.bytes = double(m_) * double(k_) + double(n_) * double(k_) / 2 +
                  2.0 * double(n_) * double((k_ + 127) / 128) + 2.0 * double(m_) * double(n_) +
                  4.0 * double(m_);
        s.flops = 2.0 * double(m_) * double(n_) * double(k_);
        return s;
    }
    RowSpec with_copies(RowSpec s) {
        s.copies = int(sets().size());
        return s;
    }

    void launch(const Set& s, bool per_row) const {
        const ck_granularity_t g = per_row ? CK_PER_ROW : CK_PER_TENSOR;
        CK_BENCH_CHECK(ck_gemm_fp8_scaled(s.a.as<uint8_t>(), s.b.as<uint8_t>(), m_, n_, k_,
                                          s.scale_a.as<float>(), g, s.scale_b.as<float>(), g,
                                          nullptr, CK_ACTIVATION_NONE, s.out.as(), CK_DTYPE_FP16,
                                          bench_.stream()));
    }

    // cuBLASLt's fastest of its top heuristics on these buffers, then timed in full.
    Timing lt_timing() {
        const Set& first = set(0);
        lt_ = std::make_unique<gemm_bench::LtTnGemm>(ctx_.lt, m_, n_, k_,
                                                     gemm_bench::LtTnGemm::kFp8,
                                                     first.scale_a.as<float>(),
                                                     first.scale_b.as<float>());
        lt_algo_ = gemm_bench::fastest_lt_algo(
            bench_,
            lt_->candidates(gemm_bench::kLtWorkspaceBytes, gemm_bench::kHeuristicCandidates),
            [this](const cublasLtMatmulAlgo_t& algo, int i) { lt_launch(algo, set(i)); });
        return bench_.time([this](int i) { lt_launch(lt_algo_, set(i)); });
    }
    void lt_launch(const cublasLtMatmulAlgo_t& algo, const Set& s) const {
        lt_->launch(algo, s.a.as(), s.b.as(), s.out.as(), ctx_.workspace.as(),
                    ctx_.workspace.bytes(), bench_.stream());
    }

    const std::vector<Set>& sets() {
        if (!sets_.empty()) return sets_;
        const double per_call = spec("").bytes;
        // + the fp16 operands, and the INT4 weight twice (packed and prepacked) with its scales
        const double per_copy = per_call + 2.0 * double(m_ + n_) * double(k_) +
                                double(n_) * double(k_) + 8.0 * double(n_) * double(k_ / 128 + 1);
        const int copies = bench_.rotation_copies(per_call, per_copy);
        cudaStream_t st = bench_.stream();
        for (int c = 0; c < copies; ++c) {
            const uint64_t seed = 31000 + 100 * uint64_t(c);
            Set s;
            s.a = DeviceBuffer(size_t(m_ * k_));
            s.b = DeviceBuffer(size_t(n_ * k_));
            s.scale_a = DeviceBuffer(sizeof(float) * size_t(m_));
            s.scale_b = DeviceBuffer(sizeof(float) * size_t(n_));
            const int64_t kb = (k_ + 127) / 128, nb = (n_ + 127) / 128;
            s.block_a = DeviceBuffer(sizeof(float) * size_t(m_ * kb));
            s.block_b = DeviceBuffer(sizeof(float) * size_t(nb * kb));
            fill_uniform(s.block_a.as(), CK_DTYPE_FP32, m_ * kb, seed + 8, 0.01f, 0.1f, st);
            fill_uniform(s.block_b.as(), CK_DTYPE_FP32, nb * kb, seed + 9, 0.01f, 0.1f, st);
            s.out = DeviceBuffer(sizeof(__half) * size_t(m_ * n_));
            s.x16 = DeviceBuffer(sizeof(__half) * size_t(m_ * k_));
            s.w16 = DeviceBuffer(sizeof(__half) * size_t(n_ * k_));
            fill_e4m3(s.a, seed + 1, st);
            fill_e4m3(s.b, seed + 2, st);
            fill_uniform(s.scale_a.as(), CK_DTYPE_FP32, m_, seed + 3, 0.01f, 0.1f, st);
            fill_uniform(s.scale_b.as(), CK_DTYPE_FP32, n_, seed + 4, 0.01f, 0.1f, st);
            fill_uniform(s.x16.as(), CK_DTYPE_FP16, m_ * k_, seed + 5, -1.f, 1.f, st);
            fill_uniform(s.w16.as(), CK_DTYPE_FP16, n_ * k_, seed + 6, -1.f, 1.f, st);
            fill_random_bytes(s.out.as(), int64_t(s.out.bytes()), seed + 7, st);
            s.w4 = DeviceBuffer(size_t(n_ * k_ / 2));
            s.w4_scales = DeviceBuffer(sizeof(__half) * size_t(n_ * kb));
            fill_random_bytes(s.w4.as(), int64_t(s.w4.bytes()), seed + 10, st);
            fill_uniform(s.w4_scales.as(), CK_DTYPE_FP16, n_ * kb, seed + 11, 0.01f, 0.1f, st);
            s.w4_prepacked = DeviceBuffer(size_t(ck_w4a16_prepacked_bytes(n_, k_)));
            s.w4_prepacked_scales =
                DeviceBuffer(sizeof(__half) * size_t(ck_w4a16_prepacked_groups(n_, k_, 128)));
            CK_BENCH_CHECK(ck_w4a16_prepack(s.w4.as<uint8_t>(), s.w4_scales.as(), nullptr,
                                            CK_DTYPE_FP16, n_, k_, 128, CK_INT4_SYMMETRIC,
                                            s.w4_prepacked.as<uint8_t>(),
                                            s.w4_prepacked_scales.as(), nullptr, st));
            sets_.push_back(std::move(s));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
        return sets_;
    }
    const Set& set(int i) { return sets()[size_t(i) % sets().size()]; }

    gemm_bench::Context& ctx_;
    Bench& bench_;
    int64_t k_, n_, m_;
    std::string shape_name_;
    std::vector<Set> sets_;
    std::unique_ptr<gemm_bench::LtTnGemm> lt_;
    cublasLtMatmulAlgo_t lt_algo_{};
};

}  // namespace fp8_bench

inline void bench_fp8(Bench& bench, const Options& options) {
    using namespace fp8_bench;
    gemm_bench::Context ctx(bench, options.quick);
    const bool quick = options.quick;
    for (const Shape& shape : kShapes) {
        if (quick && !(shape == kQuickShape)) continue;
        const auto run = [&](int64_t m) { Problem(ctx, shape, m).run_all(); };
        if (quick) for (int64_t m : kQuickTokens) run(m);
        else for (int64_t m : kTokens) run(m);
    }
}
