// benchmarks/bench_sparse.cuh - family "sparse": the W4A16 GEMM on structured-sparse INT4
// weights (ck_gemm_sparse_w4a16_prepacked on 2:4; on 16:32 ck_gemm_w4a16_prepacked after
// ck_sparse_w4a16_prepack_dense, and ck_gemm_sparse_w4a16) beside the dense prepacked INT4 GEMM
// and cuBLAS fp16, on the same run.
//
// Problems: DESIGN.md's four layer shapes (K, N) at M = 1 ... 4096, and the shapes of the
// sparse seed (1024^2, 5120^2, 16384^2, 20480 x 5120, 5120 x 20480) at M = 1, 16, 256. Rows of
// each (shape, M), fp16 activations, symmetric INT4 groups of 128, no bias, no activation:
//   cuBLAS fp16 (reference)          cublasGemmEx fp16 TN on the dense [N, K] weight
//   gemm_w4a16_prepacked fp16 g128   the library's dense INT4 weight; baseline cuBLAS fp16
//   gemm_sparse 2:4 fp16 g128        a random fp16 weight put through ck_sparse_prune (2:4),
//                                    ck_sparse_quantize_int4 and ck_sparse_w4a16_prepack once,
//                                    outside timing; baseline cuBLAS fp16; notes: the weight
//                                    stream as a % of copy bandwidth, the time against the
//                                    dense INT4 row
//   gemm_sparse 16:32 dense fp16 g128  a 16:32 weight (prune, quantize) prepacked as a dense
//                                    INT4 weight (ck_sparse_w4a16_prepack_dense), multiplied by
//                                    ck_gemm_w4a16_prepacked; notes: against the 2:4 row
//   gemm_sparse 16:32 fp16 g128      the same 16:32 weight on the interchange layout (the tiled
//                                    reference kernel), at M = 1
// Floors: the weight's bytes over the copy bandwidth (2:4 prepacked and 16:32 interchange: 3/8
// byte per weight + 2 / 128 of scales; 16:32 dense: the dense INT4 weight's 1/2 byte), and
// 2 M N K flops over the dense fp16 tensor-core peak (the sparse tensor cores do half of those
// products).
// The 2:4 fp16 baseline of cuSPARSELt is not in this binary (the library does not link it):
// benchmarks/bench_sparse_torch.py times torch's to_sparse_semi_structured on the same GPU.
#pragma once

#include "bench_gemm.cuh"

namespace sparse_bench {

using gemm_bench::Shape;

constexpr Shape kLayerShapes[] = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 28672}};
constexpr int64_t kLayerTokens[] = {1, 16, 64, 256, 1024, 4096};
constexpr Shape kSeedShapes[] = {{1024, 1024}, {5120, 5120}, {16384, 16384}, {20480, 5120},
                                 {5120, 20480}};
constexpr int64_t kSeedTokens[] = {1, 16, 256};
constexpr int64_t kReferenceMaxM = 1;   // the 16:32 rows (tiled reference kernel)
constexpr int64_t kGroupSize = 128;

struct Set {
    DeviceBuffer x, out;            // [M, K], [M, N] fp16
    DeviceBuffer dense;             // [N, K] fp16, cuBLAS's weight
    DeviceBuffer int4_w, int4_s;    // dense INT4, prepacked
    DeviceBuffer sp_w, sp_s;        // 2:4, prepacked
    DeviceBuffer c_codes, c_meta, c_s;  // 16:32, interchange
    DeviceBuffer c_w, c_ws;         // 16:32, prepacked dense
};

class Problem : public gemm_bench::WeightOnlyProblem<Problem, Set> {
  public:
    Problem(Bench& bench, Shape shape, int64_t m) : WeightOnlyProblem(bench, "sparse", shape, m) {}

    void run_all() {
        const Row* fp16 = reference_row();
        const Row* int4 = int4_row(fp16);
        const Row* sparse24 = sparse24_row(fp16, int4);
        sparse1632_dense_row(fp16, int4, sparse24);
        if (m_ <= kReferenceMaxM) sparse1632_row(fp16, int4);
    }

  private:
    friend WeightOnlyProblem;

    double sparse_weight_bytes() const {
        return double(ck_sparse_w4a16_prepacked_bytes(n_, k_)) +
               2.0 * double(ck_sparse_w4a16_prepacked_groups(n_, k_, kGroupSize));
    }

    void notes(Row& row, const Row* fp16, const Row* int4, double weight_bytes) const {
        if (fp16) Bench::set_baseline(row, "cuBLAS fp16", fp16->time);
        stream_note(row, weight_bytes);
        if (int4)
            Bench::append_note(row, "vs dense INT4 " +
                                        format("%.2f", int4->time.median_us / row.time.median_us) +
                                        "x");
    }

    const Row* sparse24_row(const Row* fp16, const Row* int4) {
        RowSpec spec = spec_for("gemm_sparse 2:4 fp16 g128",
                                sparse_weight_bytes() + activation_bytes());
        if (!bench_.wants(spec)) return nullptr;
        Row* row = bench_.run(spec, [this](int i) {
            const Set& s = set(i);
            CK_BENCH_CHECK(ck_gemm_sparse_w4a16_prepacked(
                s.x.as(), CK_DTYPE_FP16, s.sp_w.as<uint8_t>(), s.sp_s.as(), nullptr, kGroupSize,
                CK_INT4_SYMMETRIC, nullptr, CK_ACTIVATION_NONE, m_, n_, k_, s.out.as(),
                bench_.stream()));
        });
        notes(*row, fp16, int4, sparse_weight_bytes());
        kernel_override_note(*row, "CK_GEMM_SPARSE_KERNEL");
        return row;
    }

    void sparse1632_dense_row(const Row* fp16, const Row* int4, const Row* sparse24) {
        RowSpec spec = spec_for("gemm_sparse 16:32 dense fp16 g128",
                                int4_weight_bytes() + activation_bytes());
        if (!bench_.wants(spec)) return;
        Row* row = bench_.run(spec, [this](int i) {
            const Set& s = set(i);
            CK_BENCH_CHECK(ck_gemm_w4a16_prepacked(
                s.x.as(), CK_DTYPE_FP16, s.c_w.as<uint8_t>(), s.c_ws.as(), nullptr, kGroupSize,
                CK_INT4_SYMMETRIC, nullptr, CK_ACTIVATION_NONE, m_, n_, k_, s.out.as(),
                bench_.stream()));
        });
        notes(*row, fp16, int4, int4_weight_bytes());
        if (sparse24)
            Bench::append_note(*row, "vs 2:4 " + format("%.2f", sparse24->time.median_us /
                                                                    row->time.median_us) + "x");
        kernel_override_note(*row, "CK_GEMM_W4A16_KERNEL");
    }

    void sparse1632_row(const Row* fp16, const Row* int4) {
        const double bytes = double(n_) * double(k_) * 3.0 / 8.0 +
                             2.0 * double(n_) * double(k_ / kGroupSize);
        RowSpec spec = spec_for("gemm_sparse 16:32 fp16 g128", bytes + activation_bytes());
        if (!bench_.wants(spec)) return;
        Row* row = bench_.run(spec, [this](int i) {
            const Set& s = set(i);
            CK_BENCH_CHECK(ck_gemm_sparse_w4a16(
                s.x.as(), CK_DTYPE_FP16, CK_SPARSITY_16_32, s.c_codes.as<uint8_t>(),
                s.c_meta.as<uint32_t>(), s.c_s.as(), nullptr, kGroupSize, CK_INT4_SYMMETRIC,
                nullptr, CK_ACTIVATION_NONE, m_, n_, k_, s.out.as(), bench_.stream()));
        });
        notes(*row, fp16, int4, bytes);
    }

    // The rotation copies: every weight is the library's own quantization of a random fp16
    // [N, K] weight (pruned to each pattern first).
    std::vector<Set> make_sets() {
        const double per_copy = dense_weight_bytes() + activation_bytes() +
                                2 * int4_weight_bytes() + 2 * sparse_weight_bytes();
        const int copies = bench_.rotation_copies(sparse_weight_bytes() + activation_bytes(),
                                                  per_copy);
        cudaStream_t st = bench_.stream();
        DeviceBuffer pruned(sizeof(__half) * size_t(n_ * k_));
        DeviceBuffer packed(size_t(n_ * k_ / 2));
        DeviceBuffer codes(size_t(n_ * k_ / 4)), meta(size_t(n_ * k_ / 8));
        DeviceBuffer scales(sizeof(__half) * size_t(n_ * (k_ / kGroupSize)));
        std::vector<Set> sets;
        for (int c = 0; c < copies; ++c) {
            Set s = new_copy(47000 + 100 * uint64_t(c), packed, scales, st);
            // 2:4: prune, quantize, prepack.
            CK_BENCH_CHECK(ck_sparse_prune(s.dense.as(), CK_DTYPE_FP16, CK_SPARSITY_2_4, n_, k_,
                                           pruned.as(), st));
            CK_BENCH_CHECK(ck_sparse_quantize_int4(
                pruned.as(), CK_DTYPE_FP16, CK_SPARSITY_2_4, n_, k_, kGroupSize,
                CK_INT4_SYMMETRIC, codes.as<uint8_t>(), meta.as<uint32_t>(), scales.as(),
                nullptr, nullptr, st));
            s.sp_w = DeviceBuffer(size_t(ck_sparse_w4a16_prepacked_bytes(n_, k_)));
            s.sp_s = DeviceBuffer(sizeof(__half) *
                                  size_t(ck_sparse_w4a16_prepacked_groups(n_, k_, kGroupSize)));
            CK_BENCH_CHECK(ck_sparse_w4a16_prepack(
                codes.as<uint8_t>(), meta.as<uint32_t>(), scales.as(), nullptr, CK_DTYPE_FP16,
                n_, k_, kGroupSize, CK_INT4_SYMMETRIC, s.sp_w.as<uint8_t>(), s.sp_s.as(),
                nullptr, st));
            // 16:32: prune, quantize (the interchange layout), prepack dense.
            CK_BENCH_CHECK(ck_sparse_prune(s.dense.as(), CK_DTYPE_FP16, CK_SPARSITY_16_32, n_,
                                           k_, pruned.as(), st));
            s.c_codes = DeviceBuffer(codes.bytes());
            s.c_meta = DeviceBuffer(meta.bytes());
            s.c_s = DeviceBuffer(scales.bytes());
            CK_BENCH_CHECK(ck_sparse_quantize_int4(
                pruned.as(), CK_DTYPE_FP16, CK_SPARSITY_16_32, n_, k_, kGroupSize,
                CK_INT4_SYMMETRIC, s.c_codes.as<uint8_t>(), s.c_meta.as<uint32_t>(), s.c_s.as(),
                nullptr, nullptr, st));
            s.c_w = DeviceBuffer(size_t(ck_w4a16_prepacked_bytes(n_, k_)));
            s.c_ws = DeviceBuffer(sizeof(__half) *
                                  size_t(ck_w4a16_prepacked_groups(n_, k_, kGroupSize)));
            CK_BENCH_CHECK(ck_sparse_w4a16_prepack_dense(
                s.c_codes.as<uint8_t>(), s.c_meta.as<uint32_t>(), s.c_s.as(), nullptr,
                CK_SPARSITY_16_32, CK_DTYPE_FP16, n_, k_, kGroupSize, CK_INT4_SYMMETRIC,
                s.c_w.as<uint8_t>(), s.c_ws.as(), nullptr, st));
            sets.push_back(std::move(s));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
        return sets;
    }
};

}  // namespace sparse_bench

inline void bench_sparse(Bench& bench, const Options&) {
    using namespace sparse_bench;
    for (const Shape& shape : kLayerShapes)
        for (int64_t m : kLayerTokens) Problem(bench, shape, m).run_all();
    for (const Shape& shape : kSeedShapes)
        for (int64_t m : kSeedTokens) Problem(bench, shape, m).run_all();
}
